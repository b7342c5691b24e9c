"""Loop-nest builders for element-wise expressions, 2-D transposes and standalone window pools."""
from __future__ import annotations

import math

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh, hbm_view
from tilec.compiler.build_util import a, broadcast_row, loop, ones_row, pool_epilogue, sl, term
from tilec.compiler.exprs import const_value, fmt_expr
from tilec.compiler.ir import Act, Alloc, Binary, Buf, Dma, Scalar, Stmt, View, full, whole
from tilec.compiler.schedule import EltwisePlan, PoolPlan, TransposePlan
from tilec.compiler.ops import EltwiseOp, PoolOp, TransposeOp
from tilec.compiler.select_eltwise import column_only
from tilec.errors import TilecError
from tilec.lang import syntax as sx
from tilec.lang.functions import FUNCTIONS

Built = tuple[list[tuple[str, int]], list[Stmt]]

# ---- element-wise --------------------------------------------------------------------------------------------------


def build_eltwise(op: EltwiseOp, plan: EltwisePlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    """All tensors flattened to [parts, free]; each tile: load inputs, evaluate the expression, store."""
    if op.layout:
        return _build_broadcast(op, plan, hbm, fresh)
    line, P, F = op.line, plan.parts, op.size // plan.parts
    views, stmts = {}, []
    for name in (*op.inputs, op.out):
        views[name], st = hbm_view(hbm[name], (P, F), fresh(f"{name}_v"), line)
        stmts += st
    at = lambda name: View(views[name], (full(P), sl(a(term("t", plan.free, "TILE_F")), plan.free)))  # noqa: E731
    body = _eltwise_tile(op, plan, hbm, fresh, at, {})
    nest = loop("t", F // plan.free, body, note=f"for {', '.join(v for _, v in op.vars)} (tiles of TILE_F)",
                line=op.line_of("d0"))
    return [("TILE_F", plan.free)], stmts + [ir.Block(f"{op.out} = element-wise, {P} partitions", tuple(nest), line)]


def _eltwise_tile(op: EltwiseOp, plan: EltwisePlan, hbm: dict[str, Buf], fresh: Fresh, at, columns: dict,
                  pre: tuple[list[Stmt], dict] = ([], {}), fold: bool = False) -> list[Stmt]:
    """One tile: load each full-size input (`at(name)`: its HBM view), evaluate, store the result. `pre`: statements
    that make more full-size tiles (broadcast rows) and those tiles by tensor name."""
    line, shape = op.line, (plan.parts, plan.free)
    body: list[Stmt] = list(pre[0])
    tiles = {**columns, **pre[1]}
    for name in op.inputs:
        tile = Buf(fresh(f"{name}_tile"), "sbuf", hbm[name].dtype, shape)
        tiles[name] = whole(tile)
        body += [Alloc(tile, line=line), Dma(whole(tile), at(name), line)]
    out = Buf(fresh(f"{op.out}_tile"), "sbuf", hbm[op.out].dtype, shape)
    body.append(Alloc(out, line=line))
    body += ExprCompiler(tiles, shape, line, fresh, set(columns), fold=fold).emit(op.expr, whole(out))
    return body + [Dma(at(op.out), whole(out), line)]


def _build_broadcast(op: EltwiseOp, plan: EltwisePlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    """The output as [O, P, F]: partition tiles of P outermost (each loads its (TILE_P, 1) columns once), then the
    outer index, then free tiles. `Y[n, k, y, x] = conv[n, k, y, x] + b[k]`: O = n, P = k, F = (y, x)."""
    line, TP, TF = op.line, plan.parts, plan.free
    O, P, F = op.dim("O"), op.dim("P"), op.dim("F")
    views, stmts = {}, []
    for name in (*op.inputs, op.out):
        views[name], st = hbm_view(hbm[name], (O, P, F), fresh(f"{name}_v"), line)
        stmts += st
    st, loads, cols = _column_loads(op, plan, hbm, fresh)
    stmts += st
    ones, row_views = {}, {}
    for name in op.rows:  # nc_matmul wants both operands fp32 or neither: a ones row in each row operand's dtype
        dt = hbm[name].dtype
        if dt not in ones:
            ones[dt], made = ones_row(fresh(f"ones_{dt}"), dt, TP, line)
            stmts += made
        row_views[name], st = hbm_view(hbm[name], (1, F), fresh(f"{name}_v"), line)
        stmts += st
    at = lambda name: View(views[name], (a("o"), sl(a(term("pt", TP, "TILE_P")), TP),  # noqa: E731
                                         sl(a(term("t", TF, "TILE_F")), TF)))
    whole_rows = op.rows and F // TF > 1 and F * 4 * len(op.rows) <= WHOLE_ROWS_BYTES
    if whole_rows:  # every row copied to the partitions once, before the nest; each free tile reads its slice
        made, tiles = _whole_row_tiles(op, plan, hbm, fresh, ones, row_views)
        stmts += made
        pre: tuple[list[Stmt], dict] = ([], tiles)
    else:
        pre = _row_tiles(op, plan, hbm, fresh, ones, row_views) if op.rows else ([], {})
    first, last = op.run
    names = [v for _, v in op.vars]
    # with whole broadcast rows, VectorE carries their tensor_tensor work: column terms go to ScalarE (bias/scale)
    tile = loop("t", F // TF, _eltwise_tile(op, plan, hbm, fresh, at, cols, pre, fold=bool(whole_rows and cols)),
                note=f"for {', '.join(names[last:])} (tiles of TILE_F)", line=op.line_of(f"d{last}"))
    outer = loop("o", O, tile, note=f"for {', '.join(names[:first])}", line=op.line_of("d0"))
    nest = loop("pt", P // TP, loads + outer, note=f"for {', '.join(names[first:last])} (tiles of TILE_P)",
                line=op.line_of(f"d{first}"))
    what = ", ".join(op.columns + op.rows)
    block = ir.Block(f"{op.out} = element-wise, broadcasting {what}", tuple(nest), line)
    return [("TILE_P", TP), ("TILE_F", TF)], stmts + [block]


def _column_loads(op: EltwiseOp, plan: EltwisePlan, hbm: dict[str, Buf], fresh: Fresh
                  ) -> tuple[list[Stmt], list[Stmt], dict[str, View]]:
    """HBM views of the column operands (before the nest), their (TILE_P, 1) loads (once per partition tile), and
    the column tiles by tensor name."""
    line, TP = op.line, plan.parts
    views, loads, cols = [], [], {}
    for name in op.columns:
        col_v, st = hbm_view(hbm[name], (op.dim("P"), 1), fresh(f"{name}_v"), line)
        # a tensor_scalar operand tile is fp32 [ISA6 tensor_scalar]: the load's DMA converts (src -> fp32 -> dst
        # [ISA6 dma_copy]), once per partition tile, at no engine instruction
        col = Buf(fresh(f"{name}_col"), "sbuf", "f32", (TP, 1))
        views += st
        loads += [Alloc(col, line=line), Dma(whole(col), View(col_v, (sl(a(term("pt", TP, "TILE_P")), TP), full(1))),
                                             line)]
        cols[name] = whole(col)
    return views, loads, cols


WHOLE_ROWS_BYTES = 32 * 1024  # SBUF per partition the broadcast rows may take when copied once for the whole nest


def _whole_row_tiles(op: EltwiseOp, plan: EltwisePlan, hbm: dict[str, Buf], fresh: Fresh, ones: dict[str, Buf],
                     views: dict[str, Buf]) -> tuple[list[Stmt], dict]:
    """Each row operand s[F] copied to every partition once (ones[1, P].T @ s, one PSUM bank of TILE_F columns at a
    time), so the partition tiles reuse it instead of broadcasting it again per tile; the nest reads the slice of
    its free tile."""
    line, TP, TF, F = op.line, plan.parts, plan.free, op.dim("F")
    stmts: list[Stmt] = []
    tiles = {}
    for name in op.rows:
        row = Buf(fresh(f"{name}_row"), "sbuf", hbm[name].dtype, (1, F))
        acc = Buf(fresh(f"{name}_bcast"), "psum", "f32", (TP, TF))
        tile = Buf(fresh(f"{name}_tile"), "sbuf", "f32", (TP, F))
        cols = sl(a(term("c", TF, "TILE_F")), TF)
        body = broadcast_row(acc, ones[row.dtype], View(row, (full(1), cols)), line) + \
            [ir.Copy(View(tile, (full(TP), cols)), whole(acc), line)]
        stmts += [Alloc(row, line=line), Dma(whole(row), whole(views[name]), line), Alloc(tile, line=line)]
        stmts += loop("c", F // TF, body, note="for the free tiles of the row", line=line)
        tiles[name] = View(tile, (full(TP), sl(a(term("t", TF, "TILE_F")), TF)))
    return stmts, tiles


def _row_tiles(op: EltwiseOp, plan: EltwisePlan, hbm: dict[str, Buf], fresh: Fresh, ones: dict[str, Buf],
               views: dict[str, Buf]) -> tuple[list[Stmt], dict]:
    """Each row operand s[free] copied to every partition of a full tile: ones[1, P].T @ s[1, TILE_F] on TensorE.
    Each is a hoistable block: it depends only on the free tile, so with one free tile it leaves the whole nest."""
    line, TP, TF = op.line, plan.parts, plan.free
    stmts, tiles = [], {}
    for name in op.rows:
        row = Buf(fresh(f"{name}_row"), "sbuf", hbm[name].dtype, (1, TF))
        acc = Buf(fresh(f"{name}_bcast"), "psum", "f32", (TP, TF))
        tile = Buf(fresh(f"{name}_tile"), "sbuf", "f32", (TP, TF))
        src = View(views[name], (full(1), sl(a(term("t", TF, "TILE_F")), TF)))
        body = [Alloc(row, line=line), Dma(whole(row), src, line),
                *broadcast_row(acc, ones[row.dtype], whole(row), line),
                Alloc(tile, line=line), ir.Copy(whole(tile), whole(acc), line)]
        stmts.append(ir.Block(f"row {name}: copied to every partition", tuple(body), line, hoist=True))
        tiles[name] = whole(tile)
    return stmts, tiles


_BIN = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide"}


class ExprCompiler:
    """Evaluate an element-wise expression tree into tensor_tensor / tensor_scalar / activation instructions."""

    def __init__(self, tiles: dict[str, View], shape: tuple[int, int], line: int, fresh: Fresh,
                 columns: set[str], fold: bool = False, prefix: str = "tmp") -> None:
        self.tiles, self.shape, self.line, self.fresh, self.n = tiles, shape, line, fresh, 0
        # fold: an activation of `x + col`, `x - col` or `x * c` is one ScalarE instruction FN(x * scale + bias)
        # (the row chains use it: it takes a VectorE pass off the busiest engine)
        self.fold, self.prefix = fold, prefix
        self.cur = shape  # the shape of a temporary: (P, 1) while computing an expression of columns only
        self.columns = columns  # tensors whose tile is a (P, 1) column: tensor_scalar operands
        self.done: dict[str, View] = {}  # subexpression (printed) -> the temporary holding its value

    def emit(self, e: sx.Expr, dst: View) -> list[Stmt]:
        stmts, val = self.value(e, dst)
        if val != dst:
            stmts.append(ir.Copy(dst, val, self.line))
        return stmts

    def temp(self) -> tuple[list[Stmt], View]:
        self.n += 1
        buf = Buf(self.fresh(f"{self.prefix}{self.n}"), "sbuf", "f32", self.cur)
        return [Alloc(buf, line=self.line)], whole(buf)

    def value(self, e: sx.Expr, dst: View | None) -> tuple[list[Stmt], View]:
        if isinstance(e, sx.Access):
            return [], self.tiles[e.tensor]
        key = fmt_expr(e)
        if dst is None and key in self.done:  # a subexpression seen before (an inlined temporary read twice)
            return [], self.done[key]
        # instructions carry the line of the statement their expression was written in (a fused chain spans several)
        outer, self.line = self.line, getattr(getattr(e, "span", None), "line", 0) or self.line
        shape = self.cur
        if dst is None and self.is_column(e):
            self.cur = (self.shape[0], 1)
        stmts, view = self.compute(e, dst)
        self.line, self.cur = outer, shape
        self.done[key] = view
        return stmts, view

    def compute(self, e: sx.Expr, dst: View | None) -> tuple[list[Stmt], View]:
        c = const_value(e)
        if c is not None:  # a constant-only statement (`Y[i] = 2`): a zeroed tile plus the constant (a fill)
            self.n += 1
            zero = Buf(self.fresh(f"{self.prefix}{self.n}"), "sbuf", "f32", self.cur)
            out, d = self.target(dst)
            return [Alloc(zero, zero=True, line=self.line)] + out + [Scalar(d, whole(zero), "add", c, self.line)], d
        if isinstance(e, sx.Neg):
            return self.scalar(e.x, "multiply", -1.0, dst)
        if isinstance(e, sx.Call) and FUNCTIONS[e.fn].instr == "cast":
            return self.convert(e)
        if isinstance(e, sx.Call) and FUNCTIONS[e.fn].instr == "activation":
            return self.activation(e.fn, e.args[0], dst)
        if isinstance(e, sx.Call):  # a two-operand ALU function (max, min)
            op = FUNCTIONS[e.fn].nki
            for x, c in ((e.args[0], const_value(e.args[1])), (e.args[1], const_value(e.args[0]))):
                if c is not None:
                    return self.scalar(x, op, c, dst)
            return self.binary(e.args[0], e.args[1], op, dst)
        if self.fold and (on_act := self.on_scalar_engine(e, dst)) is not None:
            return on_act
        rc, lc = const_value(e.rhs), const_value(e.lhs)
        if e.op == "/" and rc is not None:  # x * (1/3) is not x / 3 in fp32: multiply only by an exact inverse
            exact = math.frexp(abs(rc))[0] == 0.5  # a power of two
            return self.scalar(e.lhs, "multiply", 1.0 / rc, dst) if exact else self.scalar(e.lhs, "divide", rc, dst)
        if rc is not None:
            return self.scalar(e.lhs, _BIN[e.op], rc if e.op != "-" else -rc, dst, "add" if e.op == "-" else None)
        if lc is not None and e.op in "+*":
            return self.scalar(e.rhs, _BIN[e.op], lc, dst)
        if lc is not None and e.op == "-":  # c - x: one tensor_scalar with the operands reversed
            pre, v = self.value(e.rhs, None)
            out, d = self.target(dst)
            return pre + out + [Scalar(d, v, "subtract", lc, self.line, reverse=True)], d
        if lc is not None and e.op == "/":  # c / x: the reciprocal activation, scaled
            if lc == 1.0:
                return self.activation("reciprocal", e.rhs, dst)
            pre, v = self.activation("reciprocal", e.rhs, None)
            out, d = self.target(dst)
            return pre + out + [Scalar(d, v, "multiply", lc, self.line)], d
        return self.binary(e.lhs, e.rhs, _BIN[e.op], dst)

    def activation(self, fn: str, x: sx.Expr, dst: View | None) -> tuple[list[Stmt], View]:
        folded = self.affine(x) if self.fold else None
        if folded is not None:
            pre, v, scale, bias = folded
            out, d = self.target(dst)
            return pre + out + [Act(d, v, fn, bias, scale, self.line)], d
        pre, v = self.value(x, None)
        out, d = self.target(dst)
        return pre + out + [Act(d, v, fn, None, 1.0, self.line)], d

    def on_scalar_engine(self, e: sx.BinOp, dst: View | None) -> tuple[list[Stmt], View] | None:
        """A full tile plus/minus, times or over a column, as one ScalarE copy FN(x * scale + bias): the VectorE
        passes of a row chain (its reductions) then overlap it."""
        if e.op == "*" and fmt_expr(e.lhs) == fmt_expr(e.rhs) and not self.is_column(e):  # x * x: ScalarE's square
            pre, v = self.value(e.lhs, None)
            out, d = self.target(dst)
            return pre + out + [Act(d, v, "square", None, 1.0, self.line)], d
        if self.is_column(e) or e.op not in "+-*/":
            return None
        col, x = (e.rhs, e.lhs) if self.is_column(e.rhs) else (e.lhs, e.rhs) if e.op in "+*" else (None, None)
        if col is None or not self.is_column(col) or self.is_column(x):
            return None
        if e.op in "+-":
            folded = self.affine(e)
            if folded is None:
                return None
            pre, v, scale, bias = folded
            out, d = self.target(dst)
            return pre + out + [Act(d, v, "copy", bias, scale, self.line)], d
        pre, v = self.value(x, None)
        pc, c = self.value(col, None)
        if e.op == "/":  # x / col = x * (1 / col): the reciprocal of the (P, 1) column, then the scale
            shape, self.cur = self.cur, (self.shape[0], 1)
            more, inv = self.temp()
            self.cur = shape
            pc = pc + more + [Act(inv, c, "reciprocal", None, 1.0, self.line)]
            c = inv
        out, d = self.target(dst)
        return pre + pc + out + [Act(d, v, "copy", None, c, self.line)], d

    def affine(self, e: sx.Expr) -> tuple[list[Stmt], View, float, View | None] | None:
        """`x + col`, `col + x`, `x - col` -> (x, scale 1, bias +-col); `x * c`, `c * x` -> (x, scale c, no bias)."""
        if not isinstance(e, sx.BinOp) or self.is_column(e):
            return None
        if e.op == "*":
            for x, c in ((e.lhs, const_value(e.rhs)), (e.rhs, const_value(e.lhs))):
                if c is not None:
                    pre, v = self.value(x, None)
                    return pre, v, c, None
            return None
        if e.op not in "+-":
            return None
        for x, col, sign in ((e.lhs, e.rhs, 1.0 if e.op == "+" else -1.0), (e.rhs, e.lhs, 1.0)):
            if self.is_column(col) and not self.is_column(x) and not (e.op == "-" and col is e.lhs):
                pre, v = self.value(x, None)
                pc, c = self.value(col, None)
                if sign < 0:  # the bias adds: negate the (P, 1) column first (one tiny instruction)
                    shape, self.cur = self.cur, (self.shape[0], 1)
                    more, neg = self.temp()
                    self.cur = shape
                    pc = pc + more + [Scalar(neg, c, "multiply", -1.0, self.line)]
                    c = neg
                return pre + pc, v, 1.0, c
        return None

    def convert(self, e: sx.Call) -> tuple[list[Stmt], View]:
        """f16(x), bf16(x): x rounded to that dtype (a tensor_copy into a tile of it; later instructions read it
        back as fp32). f32(x) is x: the engines compute in fp32."""
        pre, x = self.value(e.args[0], None)
        if e.fn == "f32":
            return pre, x
        if isinstance(e.args[0], sx.Access) and e.args[0].tensor in self.columns:
            raise TilecError(f"converting the broadcast operand `{fmt_expr(e.args[0])}` to {e.fn} is not supported "
                             f"inside an element-wise statement", e.span, f"declare {e.args[0].tensor} as {e.fn}")
        self.n += 1
        buf = Buf(self.fresh(f"tmp{self.n}"), "sbuf", e.fn, self.shape)
        return pre + [Alloc(buf, line=self.line), ir.Copy(whole(buf), x, self.line)], whole(buf)

    def target(self, dst: View | None) -> tuple[list[Stmt], View]:
        return ([], dst) if dst is not None else self.temp()

    def scalar(self, x: sx.Expr, op: str, value: float, dst, override: str | None = None):
        pre, v = self.value(x, None)
        out, d = self.target(dst)
        return pre + out + [Scalar(d, v, override or op, value, self.line)], d

    def binary(self, x: sx.Expr, y: sx.Expr, op: str, dst):
        p1, v1 = self.value(x, None)
        p2, v2 = self.value(y, None)
        out, d = self.target(dst)
        if self.is_column(y):  # a per-partition scalar: tensor_scalar with a (P, 1) operand
            return p1 + p2 + out + [Scalar(d, v1, op, v2, self.line)], d
        if self.is_column(x):
            return p1 + p2 + out + [Scalar(d, v2, op, v1, self.line, reverse=op in ("subtract", "divide"))], d
        return p1 + p2 + out + [Binary(d, v1, v2, op, self.line)], d

    def is_column(self, e: sx.Expr) -> bool:
        return column_only(e, self.columns)


# ---- transpose -----------------------------------------------------------------------------------------------------


def build_transpose(op: TransposeOp, plan: TransposePlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    """Super-tiles of (BI x BJ) blocks of TI x TJ: BI row-strip loads, BI*BJ block transposes, BJ column-strip
    stores. Square blocks use one constant TILE; rectangular ones TILE_I (rows of X) and TILE_J. A ragged plan
    (sizes with no large divisor, e.g. 521 x 257) covers X with up to four regions: the multiples of 128 in
    128 x 128 blocks, the remaining rows and columns in one block each across. A batched or N-D permute (dims B, M,
    N) sees X as [B, M, N] and Y as [B, N, M] and repeats that per batch."""
    M, N, B, line = op.dim("M"), op.dim("N"), dict(op.dims).get("B", 1), op.line
    src, dst, views = hbm[op.src], hbm[op.out], []
    batched = B > 1 or src.shape != (M, N)
    if batched:
        src, st1 = hbm_view(hbm[op.src], (B, M, N), fresh(f"{op.src}_v"), line)
        dst, st2 = hbm_view(hbm[op.out], (B, N, M), fresh(f"{op.out}_v"), line)
        views = st1 + st2
    bufs = (src, dst, batched)
    if not plan.ragged:
        TI, TJ = plan.tile, plan.tj
        names = ("TILE", "TILE") if TI == TJ else ("TILE_I", "TILE_J")
        stmts = _transpose_region(op, plan, bufs, fresh, (0, M, TI, plan.bi), (0, N, TJ, plan.bj), names, "")
        label = f"{op.out} = transpose of {op.src} by {TI}x{TJ} blocks"
    else:
        ni, nj = ("TILE", "TILE") if plan.tile == plan.tj else ("TILE_I", "TILE_J")
        rows = _ragged_parts(M, plan.tile, plan.bi)
        cols = _ragged_parts(N, plan.tj, plan.bj)
        stmts = []
        for ri, r in enumerate(rows):
            for ci, c in enumerate(cols):
                tag = "" if ri == ci == 0 else f"_{'ab'[ri]}{'ab'[ci]}"
                part = f"rows {r[0]}..{r[0] + r[1]} x columns {c[0]}..{c[0] + c[1]} by {r[2]}x{c[2]} blocks"
                names = (ni if r[2] == plan.tile and ri == 0 else "", nj if c[2] == plan.tj and ci == 0 else "")
                region = _transpose_region(op, plan, bufs, fresh, r, c, names, tag)
                stmts.append(ir.Block(part, tuple(region), line))
        label = f"{op.out} = transpose of {op.src}, ragged ({M}x{N})"
    if batched:
        v = dict(op.vars)
        stmts = loop("bt", B, stmts, note=f"for {v['b']} (batch)" if "b" in v else "", line=op.line_of("b"))
    consts = [("TILE", plan.tile)] if plan.tile == plan.tj else [("TILE_I", plan.tile), ("TILE_J", plan.tj)]
    return consts, views + [ir.Block(label, tuple(stmts), line)]


def _ragged_parts(extent: int, tile: int, per_strip: int) -> list[tuple[int, int, int, int]]:
    """(start, size, block, blocks per strip) of the whole blocks, then of the remainder (one block)."""
    whole_ = extent - extent % tile
    parts = [(0, whole_, tile, per_strip)] if whole_ else []
    return parts + ([(whole_, extent % tile, extent % tile, 1)] if extent % tile else [])


def _transpose_region(op: TransposeOp, plan: TransposePlan, bufs: tuple[Buf, Buf, bool], fresh: Fresh,
                      rows: tuple[int, int, int, int], cols: tuple[int, int, int, int], names: tuple[str, str],
                      tag: str) -> list[Stmt]:
    """The nest for source rows [r0, r0 + M) and columns [c0, c0 + N), in TI x TJ blocks, BI x BJ per strip
    (`bufs`: the source and destination as 2-D or, batched, 3-D HBM tensors indexed by the batch loop `bt`)."""
    (r0, M, TI, BI), (c0, N, TJ, BJ) = rows, cols
    ci, cj = names
    line = op.line
    v, li, lj = dict(op.vars), op.line_of("i"), op.line_of("j")  # each loop carries its own `for` line
    src, dst, batched = bufs
    at = lambda buf, *idx: View(buf, ((a("bt"),) if batched else ()) + idx)  # noqa: E731
    dt = src.dtype
    a_sb = Buf(fresh(f"{op.src}_strip{tag}"), "sbuf", dt, (TI, BI, BJ * TJ))
    # a DMA transpose copies without casting (src.dtype == dst.dtype [ISA6 dma_transpose]): its strip keeps the
    # source dtype and the store's dma_copy converts (src -> fp32 -> dst [ISA6 dma_copy]); the PE path converts
    # on the PSUM -> SBUF copy
    o_sb = Buf(fresh(f"{op.out}_strip{tag}"), "sbuf", dt if plan.method == "dma" else dst.dtype, (TJ, BJ, BI * TI))
    i0 = lambda blk: a(term("bi", BI * TI), term(blk, TI, ci), r0)  # noqa: E731
    j0 = lambda blk: a(term("bj", BJ * TJ), term(blk, TJ, cj), c0)  # noqa: E731
    load = loop("ai", BI, [Dma(View(a_sb, (full(TI), a("ai"), full(BJ * TJ))),
                               at(src, sl(i0("ai"), TI), sl(a(term("bj", BJ * TJ), c0), BJ * TJ)), line)],
                note=f"for {v['i']} (blocks of {ci or TI})", line=li)
    if plan.method == "dma":
        block = [ir.Transpose(View(o_sb, (full(TJ), a("bj2"), sl(a(term("ai", TI, ci)), TI))),
                              at(src, sl(i0("ai"), TI), sl(j0("bj2"), TJ)), "dma", line)]
        load = []
    else:
        tp = Buf(fresh(f"{op.out}_tp{tag}"), "psum", dt, (TJ, TI))  # transpose mode keeps the input dtype in PSUM
        block = [Alloc(tp, line=line),
                 ir.Transpose(whole(tp), View(a_sb, (full(TI), a("ai"), sl(a(term("bj2", TJ, cj)), TJ))), "pe",
                              line),
                 ir.Copy(View(o_sb, (full(TJ), a("bj2"), sl(a(term("ai", TI, ci)), TI))), whole(tp), line)]
    blocks = loop("ai", BI, loop("bj2", BJ, block, note=f"for {v['j']} (blocks of {cj or TJ})", line=lj),
                  note=f"for {v['i']} (blocks of {ci or TI})", line=li)
    store = loop("bj2", BJ, [Dma(at(dst, sl(j0("bj2"), TJ), sl(a(term("bi", BI * TI), r0), BI * TI)),
                                 View(o_sb, (full(TJ), a("bj2"), full(BI * TI))), line)],
                 note=f"for {v['j']} (blocks of {cj or TJ})", line=lj)
    body = ([Alloc(a_sb, line=line)] if load else []) + load + [Alloc(o_sb, line=line)] + blocks + store
    return loop("bi", M // (BI * TI), loop("bj", N // (BJ * TJ), body, note=f"for {v['j']} (strips of BJ blocks)",
                                           line=lj), note=f"for {v['i']} (strips of BI blocks)", line=li)


# ---- standalone pool -----------------------------------------------------------------------------------------------


def build_pool(op: PoolOp, plan: PoolPlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    line, pool = op.line, op.pool
    B, H, W = op.dim("B"), op.dim("H"), op.dim("W")
    Ho, Wo = H // pool.wy, W // pool.wx
    P, OB = plan.tile_b, plan.band
    x3, s1 = hbm_view(hbm[op.src], (B, H, W), fresh(f"{op.src}_v"), line)
    o3, s2 = hbm_view(hbm[op.out], (B, Ho, Wo), fresh(f"{op.out}_v"), line)
    xb = Buf(fresh(f"{op.src}_band"), "sbuf", hbm[op.src].dtype, (P, OB * pool.wy, W))
    ob = Buf(fresh(f"{op.out}_band"), "sbuf", hbm[op.out].dtype, (P, OB, Wo))
    body: list[Stmt] = [Alloc(xb, line=line),
                        Dma(whole(xb), View(x3, (sl(a(term("pb", P, "TILE_P")), P),
                                                 sl(a(term("yb", OB * pool.wy)), OB * pool.wy), full(W))), line),
                        Alloc(ob, line=line)]
    src = whole(xb)
    if op.relu:
        rb = Buf(fresh(f"{op.src}_relu"), "sbuf", "f32", xb.shape)
        body += [Alloc(rb, line=line), Act(whole(rb), src, "relu", None, 1.0, line)]
        src = whole(rb)
    body += pool_epilogue(src, whole(ob), pool.wy, pool.wx, pool.op, pool.scale,
                           lambda axis: fresh(f"{op.out}_pool_{axis}"), line)
    body.append(Dma(View(o3, (sl(a(term("pb", P, "TILE_P")), P), sl(a(term("yb", OB)), OB), full(Wo))), whole(ob),
                    line))
    v = dict(op.vars)  # each loop carries its own `for` line
    nest = loop("pb", B // P, loop("yb", Ho // OB, body, note=f"for {v['i']} (bands of BAND rows)",
                                   line=op.line_of("i")),
                note=f"for {v['b']} (channel rows, tiles of TILE_P)", line=op.line_of("b"))
    return [("TILE_P", P), ("BAND", OB)], s1 + s2 + [ir.Block(f"{op.out} = {pool.op} pool of {op.src}", tuple(nest),
                                                               line)]
