"""Short rows (several rows per partition) of reductions along the trailing dimensions, and of the fused row chains
(build_rowchain.py): rows grouped G per partition, one tensor_reduce over the last axis of a (P, TILE_G, F) tile.

Every other row reduction (`s[i] += A[i, j]`, max=, min=; a scale, an initial value, a reduced expression, a
narrower output) is scheduled by the level-A rule rules.reduce and lowered by lower_tiles.
"""
from __future__ import annotations

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh, hbm_view
from tilec.compiler.build_longrows import across_partitions, build_few_long_rows, few_rows_tile
from tilec.compiler.expr_instrs import ExprCompiler
from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.ir import Alloc, Binary, Buf, Dma, Reduce, Scalar, Stmt, View, full, whole
from tilec.compiler.ops import ColumnReduceOp, EltwiseOp, ReduceOp
from tilec.compiler.schedule import PMAX, ReducePlan, best_divisor
from tilec.errors import InternalError

Built = tuple[list[tuple[str, int]], list[Stmt]]
_IDENTITY = {"add": 0.0, "maximum": float("-inf"), "minimum": float("inf")}


def build_reduce(op: ReduceOp, plan: ReducePlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    """A row reduction the reduce rule leaves here: short rows, one long row (build_long_row), a few long rows
    (build_longrows)."""
    TF = long_row(op.dim("R"), op.dim("F"), hbm[op.src].dtype, op.expr is None, isinstance(op.init, str))
    if TF is not None:
        return build_long_row(op, TF, hbm, fresh)
    TF = few_rows_tile(op, hbm[op.src].dtype) if type(op) is ReduceOp else None
    if TF is not None:
        return build_few_long_rows(op, TF, hbm, fresh)
    grouped = short_rows([op], plan)
    if grouped is None:
        raise InternalError(f"no schedule for the reduction {op.name}: rules.reduce does not apply and its rows "
                            f"are not short")
    return build_short_rows([op], hbm, lambda _: fresh, {op.out}, grouped)


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
    free = RESIDENT_FREE if resident(reds, G * F) else GROUP_FREE
    cap = max(1, min(free // F, -(-G // MIN_TILES)))
    GB = best_divisor(G, cap)
    return P, G, G if 2 * GB <= cap and G * F <= free else GB  # G with no divisor near cap: one tile


def resident(reds: list, per_partition: int) -> bool:
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
            in_sbuf = resident([op for op in ops if type(op) is ReduceOp], G * F)
            for name in names:
                src_v = view(name, (P, G, F), fresh)
                if in_sbuf:  # every tile's load its own region: no load waits for a reduce to free a buffer
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


# ---- one long row: its elements over the partitions ----------------------------------------------------------------

LONG_ROW = 128 * 128  # elements: one row at least this long is reduced on 128 partitions, not on one
LONG_TILE_BYTES = 16 * 1024  # per partition of a loaded tile of the row (several in flight)


def long_row(R: int, F: int, dtype: str, plain_src: bool, init_tensor: bool) -> int | None:
    """TILE_F of a reduction of one row (`s[z] += u[z, i]`, z of one iteration: reduce_split's total of a dot
    product, a global sum) long enough to split over the partitions, or None. On one partition the row's load is
    one DMA queue and its reduce one lane (gaps15's dot_product of 1M elements at 271x the floor on the model).
    Taken when R = 1, F >= LONG_ROW splits into P runs of whole tiles, the source is reduced as it is and the initial
    value is a constant."""
    P = PMAX
    if R != 1 or not plain_src or init_tensor or F < LONG_ROW or F % P:
        return None
    G = F // P
    return best_divisor(G, LONG_TILE_BYTES // ir.DTYPE_BYTES[dtype])


def build_long_row(op: ReduceOp, TF: int, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    """`s[z] = c; s[z] OP= u[z, i]` over one row of F = P * G elements: the row seen as (P, G) (partition p holds
    elements p * G ..), reduced per partition into an f32 column tile by tile, then across the partitions:

        col[p] = identity;  for ft: tile = u_v[:, ft*TILE_F:+TILE_F]; part[p] = OP over tile[p, :]; col OP= part
        add:      total[0, 0] = col[P, 1].T @ ones[P, 1]         (TensorE, into PSUM)
        max/min:  row[0, p] = col[p, 0] (TensorE transpose into PSUM); total = OP over row
        total = total * k OP c;  s = total"""
    P = PMAX
    F = op.dim("F")
    G = F // P
    ln, line = op.update_line, op.line
    src_v, st = hbm_view(hbm[op.src], (P, G), fresh(f"{op.src}_v"), line)
    out_v, st2 = hbm_view(hbm[op.out], (1, 1), fresh(f"{op.out}_v"), line)
    dtype = hbm[op.src].dtype
    red = ", ".join(v for role, v in op.vars if role.startswith("r"))
    col = Buf(fresh(f"{op.out}_col"), "sbuf", "f32", (P, 1))
    prep: list[Stmt] = [Alloc(col, zero=True, line=ln)]
    if op.op != "add":
        prep.append(Scalar(whole(col), whole(col), "add", _IDENTITY[op.op], ln))
    tile = Buf(fresh(f"{op.src}_tile"), "sbuf", dtype, (P, TF))
    part = Buf(fresh(f"{op.out}_part"), "sbuf", "f32", (P, 1))
    step: list[Stmt] = [Alloc(tile, line=ln), Dma(whole(tile), View(src_v, (full(P), sl(a(term("ft", TF, "TILE_F")),
                                                                                       TF))), ln),
                        Alloc(part, line=ln), Reduce(whole(part), whole(tile), op.op, ln),
                        Binary(whole(col), whole(col), whole(part), op.op, ln)]
    body = prep + loop("ft", G // TF, step, note=f"for {red} (TILE_P partitions x tiles of TILE_F)",
                       line=op.line_of("r0"))
    body += across_partitions(op, col, fresh, hbm, out_v)
    how = "ones matmul" if op.op == "add" else "transpose"
    what = f"{op.out} = {_WORD[op.op]} over {red} of {op.src} (the row over the partitions, then " \
           f"across them: {how})"
    return [("TILE_P", P), ("TILE_F", TF)], st + st2 + [ir.Block(what, tuple(body), line)]


_WORD = {"add": "sum", "maximum": "max", "minimum": "min"}
