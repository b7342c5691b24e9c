"""Loop-nest builder for reductions along the trailing dimensions (`s[i] += A[i, j]`, max=, min=).

The source is seen as [R, F] (kept indices flattened onto rows, reduced ones onto the free dimension), the output
as [R, 1]. Per partition tile of TILE_P rows: one fp32 (TILE_P, 1) accumulator column; per free tile of TILE_F
elements: load, tensor_reduce on VectorE into a (TILE_P, 1) column, combine it into the accumulator (tensor_tensor);
then the constant factor and the initial value once, a cast to the output dtype, one store.

A reduction of one tensor into an fp32 output from its identity, a whole row in one free tile, is scheduled by
rules.reduce on level A instead (the same kernel); this builder keeps several free tiles, scales, other initial
values, reduced expressions, narrower outputs and short rows.
"""
from __future__ import annotations

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh, hbm_view
from tilec.compiler.expr_instrs import ExprCompiler
from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.exprs import fmt_expr
from tilec.compiler.ir import Alloc, Binary, Buf, Dma, Reduce, Scalar, Stmt, View, full, whole
from tilec.compiler.ops import ColumnReduceOp, EltwiseOp, ReduceOp
from tilec.compiler.schedule import PMAX, ReducePlan, best_divisor

Built = tuple[list[tuple[str, int]], list[Stmt]]
_IDENTITY = {"add": 0.0, "maximum": float("-inf"), "minimum": float("inf")}


def build_reduce(op: ReduceOp, plan: ReducePlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    grouped = short_rows([op], plan)
    if grouped is not None:
        return build_short_rows([op], hbm, lambda _: fresh, {op.out}, grouped)
    line, TP, TF = op.line, plan.parts, plan.free
    R, F = op.dim("R"), op.dim("F")
    src_v: dict[str, Buf] = {}  # [R, F] views of what is read: the source, or each input of the expression
    stmts: list[Stmt] = []
    for name in op.inputs or (op.src,):
        src_v[name], st = hbm_view(hbm[name], (R, F), fresh(f"{name}_v"), line)
        stmts += st
    out_v, st = hbm_view(hbm[op.out], (R, 1), fresh(f"{op.out}_v"), line)
    stmts += st
    init_v = None
    if isinstance(op.init, str):
        init_v, st = hbm_view(hbm[op.init], (R, 1), fresh(f"{op.init}_v"), line)
        stmts += st
    rows = sl(a(term("pt", TP, "TILE_P")), TP)
    acc = Buf(fresh(f"{op.out}_acc"), "sbuf", "f32", (TP, 1))
    tiles = F // TF
    body = _accumulate(op, plan, hbm, fresh, acc, src_v, rows) if tiles > 1 else \
        _single(op, plan, hbm, fresh, acc, src_v, rows)
    body += _finish(op, hbm, fresh, acc, init_v, rows, TP)
    body.append(Dma(View(out_v, (rows, full(1))), whole(result_tile(op, hbm, fresh, acc, body)), line))
    var = ", ".join(v for role, v in op.vars if role.startswith("k"))
    nest = loop("pt", R // TP, body, note=f"for {var} (tiles of TILE_P)", line=op.line_of("k0"))
    what = f"{op.out} = {op.op} over the last dims of {op.src if op.expr is None else fmt_expr(op.expr)}"
    return [("TILE_P", TP), ("TILE_F", TF)], stmts + [ir.Block(what, tuple(nest), line)]


def _load(op: ReduceOp, plan: ReducePlan, hbm: dict[str, Buf], fresh: Fresh, views: dict[str, Buf], rows
          ) -> tuple[list, Buf]:
    """One [TILE_P, TILE_F] tile of what is reduced: the source loaded, or the expression of the loaded inputs."""
    cols = sl(a(term("ft", plan.free, "TILE_F")), plan.free)
    out, tiles = [], {}
    for name in (op.src,) if op.expr is None else op.inputs:
        tile = Buf(fresh(f"{name}_tile"), "sbuf", hbm[name].dtype, (plan.parts, plan.free))
        out += [Alloc(tile, line=op.update_line), Dma(whole(tile), View(views[name], (rows, cols)), op.update_line)]
        tiles[name] = whole(tile)
    if op.expr is None:
        return out, tiles[op.src].buf
    value = Buf(fresh(f"{op.out}_terms"), "sbuf", "f32", (plan.parts, plan.free))
    out.append(Alloc(value, line=op.update_line))
    out += ExprCompiler(tiles, value.shape, op.update_line, fresh, set()).emit(op.expr, whole(value))
    return out, value


def _single(op: ReduceOp, plan: ReducePlan, hbm, fresh: Fresh, acc: Buf, src_v: dict[str, Buf], rows
            ) -> list[Stmt]:
    """One free tile: its tensor_reduce is the whole row's value."""
    load, tile = _load(op, plan, hbm, fresh, src_v, rows)
    return loop("ft", 1, load + [Alloc(acc, line=op.update_line),  # extent 1: the free index becomes 0
                                 Reduce(whole(acc), whole(tile), op.op, op.update_line)])


def _accumulate(op: ReduceOp, plan: ReducePlan, hbm, fresh: Fresh, acc: Buf, src_v: dict[str, Buf], rows
                ) -> list[Stmt]:
    """Several free tiles: the accumulator starts at the op's identity; each tile's column folds into it."""
    ln = op.update_line
    start: list[Stmt] = [Alloc(acc, zero=True, line=ln)]
    if _IDENTITY[op.op]:  # max/min: zeros + (-)inf
        start.append(Scalar(whole(acc), whole(acc), "add", _IDENTITY[op.op], ln))
    load, tile = _load(op, plan, hbm, fresh, src_v, rows)
    part = Buf(fresh(f"{op.out}_part"), "sbuf", "f32", (plan.parts, 1))
    step = load + [Alloc(part, line=ln), Reduce(whole(part), whole(tile), op.op, ln),
                   Binary(whole(acc), whole(acc), whole(part), op.op, ln)]
    var = ", ".join(v for role, v in op.vars if role.startswith("r"))
    return start + loop("ft", op.dim("F") // plan.free, step, note=f"for {var} (tiles of TILE_F)",
                        line=op.line_of("r0"))


def _finish(op: ReduceOp, hbm, fresh: Fresh, acc: Buf, init_v: Buf | None, rows, TP: int) -> list[Stmt]:
    """The constant factor (a mean), then the initial value, once per row tile (the sum starts from it)."""
    init: tuple[list[Stmt], View] | None = None
    if init_v is not None:
        col = Buf(fresh(f"{op.init}_col"), "sbuf", hbm[op.init].dtype, (TP, 1))
        load: list[Stmt] = [Alloc(col, line=op.line), Dma(whole(col), View(init_v, (rows, full(1))), op.line)]
        init = (load, whole(col))
    return _scale_and_init(op, whole(acc), init, op.update_line)


def _scale_and_init(op: ReduceOp, acc: View, init: tuple[list[Stmt], View] | None, ln: int) -> list[Stmt]:
    """On the reduced values `acc`: the constant factor, then the initial value, a constant or a column tensor
    (`init`: the statements loading it, and its view)."""
    out: list[Stmt] = []
    if op.scale != 1.0:
        out.append(Scalar(acc, acc, "multiply", op.scale, ln))
    if init is not None:
        out += init[0] + [Binary(acc, acc, init[1], op.op, op.line)]
    elif op.init != _IDENTITY[op.op]:
        assert not isinstance(op.init, str)  # a tensor initial value comes as `init`
        out.append(Scalar(acc, acc, op.op, op.init, op.line))
    return out


def result_tile(op: ReduceOp | ColumnReduceOp, hbm: dict[str, Buf], fresh: Fresh, acc: Buf, body: list[Stmt]) -> Buf:
    """The accumulator, or (for a narrower output dtype) its cast into a tile of that dtype, appended to body."""
    if hbm[op.out].dtype == acc.dtype:
        return acc
    res = Buf(fresh(f"{op.out}_tile"), "sbuf", hbm[op.out].dtype, acc.shape)
    body += [Alloc(res, line=op.update_line), ir.Copy(whole(res), whole(acc), op.update_line)]
    return res


# ---- short rows: several rows per partition ---------------------------------------------------------------------

SHORT_ROW = 128  # elements: a row this short makes a (TILE_P, F) tile too small to hide a DMA's fixed latency
GROUP_FREE = 1568  # elements per partition of one grouped tile (6 KiB of fp32): large DMAs, still several in flight
MAX_GROUP = 4096  # rows per partition: a (P, G) fp32 result tile stays within 16 KiB per partition
MIN_TILES = 2  # ...and at least two tiles, so the second tile's load overlaps the first tile's reduce
RESIDENT_BYTES = 64 * 1024  # per partition: inputs this small stay in SBUF whole, each tile loaded into its own part
RESIDENT_FREE = 784  # elements per partition of a tile of a resident input: its loads never wait, so smaller tiles
#                      only shorten the last tile's reduce (global avg pool 2048x7x7 batch 8: 12.7 -> 11.9 us)


def short_rows(ops: list, plan: ReducePlan | None = None) -> tuple[int, int, int] | None:
    """(partitions P, rows per partition G, rows per tile GB) when the ops (one reduction, or a fused chain of
    reductions and element-wise ops of their columns) reduce rows short enough that one row per partition wastes
    the DMAs: R = P * G rows, row p * G + g on partition p, so each partition reads G * F contiguous elements and
    a tensor_reduce over the last axis of a (P, GB, F) tile leaves a (P, GB) tile of results. None otherwise
    (a directive's plan other than the default, or a full-size element-wise op in the chain)."""
    reds = [op for op in ops if type(op) is ReduceOp]
    if not reds:
        return None
    if any(type(op) is not ReduceOp and (not isinstance(op, EltwiseOp) or op.layout or op.copy or op.rows)
           for op in ops):
        return None
    R, F = reds[0].dim("R"), reds[0].dim("F")
    if not 1 < F <= SHORT_ROW or any((op.dim("R"), op.dim("F")) != (R, F) for op in reds):
        return None
    P = best_divisor(R, PMAX)
    if plan is not None and (plan.parts, plan.free) != (P, F):
        return None
    G = R // P
    if G == 1 or G > MAX_GROUP:
        return None
    free = RESIDENT_FREE if _resident(reds, G * F) else GROUP_FREE
    cap = max(1, min(free // F, -(-G // MIN_TILES)))
    GB = best_divisor(G, cap)
    return P, G, G if 2 * GB <= cap and G * F <= free else GB  # G with no divisor near cap: one tile


def _resident(reds: list, per_partition: int) -> bool:
    """Whether the reduced inputs stay whole in SBUF (each tile loaded into its own part, so the loads stream back
    to back and never wait for a reduce to free a rotating buffer): at most RESIDENT_BYTES per partition, counting
    every input as fp32."""
    inputs = {n for op in reds for n in (op.inputs or (op.src,))}
    return 4 * per_partition * len(inputs) <= RESIDENT_BYTES


def build_short_rows(ops: list, hbm: dict[str, Buf], fresh_for, keep: set[str], shape: tuple[int, int, int]
                     ) -> Built:
    """Rows grouped G per partition (short_rows). Inside the loop, per tile of TILE_G rows per partition, only a
    load (one DMA of (P, TILE_G, F) per reduced tensor) and one tensor_reduce into a (P, TILE_G) slice of a (P, G)
    result tile: no load waits behind a store on its trigger stream, and the next tile's load overlaps this tile's
    reduce. After the loop, on whole (P, G) tiles: the constant factors and initial values (column inputs loaded
    once), the chain's element-wise ops, the casts to narrow dtypes, one store per kept output."""
    P, G, GB = shape
    first = next(op for op in ops if type(op) is ReduceOp)
    line = ops[0].line
    before: list[Stmt] = []  # reshaped views, column loads and the result tiles
    after: list[Stmt] = []  # the stores
    body: list[Stmt] = []
    cols = sl(a(term("gt", GB, "TILE_G")), GB)
    whole_t: dict[str, Buf] = {}  # tensor -> its (P, G) tile: a loaded column input or a result

    def view(name: str, shp: tuple[int, ...], fresh: Fresh) -> Buf:
        v, st = hbm_view(hbm[name], shp, fresh(f"{name}_v"), line)
        before.extend(st)
        return v

    def column(name: str, fresh: Fresh) -> View:
        """A column tensor read by the ops, whole: a result of the chain, or loaded (as fp32) once."""
        if name not in whole_t:
            tile = Buf(fresh(f"{name}_tile"), "sbuf", "f32", (P, G))
            before.extend([Alloc(tile, line=line), Dma(whole(tile), whole(view(name, (P, G), fresh)), line)])
            whole_t[name] = tile
        return whole(whole_t[name])

    readers = {n for op in ops for n in _column_reads(op)}
    finish: list[Stmt] = []  # after the loop, on whole (P, G) tiles: one instruction per step, not one per tile
    for op in ops:
        fresh = fresh_for(op)
        ln = getattr(op, "update_line", 0) or op.line
        res = Buf(fresh(f"{op.out}_col"), "sbuf", "f32", (P, G))
        before.append(Alloc(res, line=ln))
        if type(op) is ReduceOp:
            F = op.dim("F")
            loaded: dict[str, View] = {}
            names = op.inputs or (op.src,)
            resident = _resident([op for op in ops if type(op) is ReduceOp], G * F)
            for name in names:
                src_v = view(name, (P, G, F), fresh)
                if resident:  # every tile's load its own region: no load waits for a reduce to free a buffer
                    tile = Buf(fresh(f"{name}_all"), "sbuf", hbm[name].dtype, (P, G, F))
                    before.append(Alloc(tile, line=ln))
                    dst = View(tile, (full(P), cols, full(F)))
                else:
                    tile = Buf(fresh(f"{name}_tile"), "sbuf", hbm[name].dtype, (P, GB, F))
                    body.append(Alloc(tile, line=ln))
                    dst = whole(tile)
                body.append(Dma(dst, View(src_v, (full(P), cols, full(F))), ln))
                loaded[name] = dst
            src = loaded[op.src]
            if op.expr is not None:  # the element-wise expression of the loaded tiles, then its reduction
                src = whole(Buf(fresh(f"{op.out}_terms"), "sbuf", "f32", (P, GB, F)))
                body.append(Alloc(src.buf, line=ln))
                body += ExprCompiler(loaded, src.shape(), ln, fresh, set()).emit(op.expr, src)
            body.append(Reduce(View(res, (full(P), cols)), src, op.op, ln))
            init_col: tuple[list[Stmt], View] | None = ([], column(op.init, fresh)) if isinstance(op.init, str) \
                else None
            finish += _scale_and_init(op, whole(res), init_col, ln)
        else:
            tiles = {n: column(n, fresh) for n in _column_reads(op)}
            finish += ExprCompiler(tiles, (P, G), op.line, fresh, set()).emit(op.expr, whole(res))
        whole_t[op.out] = res
        dt = hbm[op.out].dtype
        if dt != "f32" and (op.out in keep or op.out in readers):
            narrow = Buf(fresh(f"{op.out}_tile"), "sbuf", dt, (P, G))  # the value the program rounds to its dtype
            finish += [Alloc(narrow, line=op.line), ir.Copy(whole(narrow), whole(res), op.line)]
            whole_t[op.out] = narrow
        if op.out in keep:
            after.append(Dma(whole(view(op.out, (P, G), fresh)), whole(whole_t[op.out]), op.line))
    outs = ", ".join(op.out for op in ops)
    nest = loop("gt", G // GB, body, note=f"for the rows, TILE_G at a time on each partition ({G} per partition)",
                line=first.line_of("k0"))
    block = ir.Block(f"{outs}: short rows, {G} per partition (row p * {G} + g on partition p)",
                     tuple(before + nest + finish + after), line)
    return [("TILE_G", GB)], [block]


def _column_reads(op) -> list[str]:
    if type(op) is ReduceOp:
        return [op.init] if isinstance(op.init, str) else []
    return list(dict.fromkeys(list(op.inputs) + list(op.columns)))
