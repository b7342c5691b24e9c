"""Loop-nest builders for element-wise expressions, 2-D transposes and standalone window pools."""
from __future__ import annotations

from tilec.compiler import ir
from tilec.compiler.build_conv import hbm_view
from tilec.compiler.build_util import a, loop, pool_epilogue, sl, term
from tilec.compiler.exprs import const_value
from tilec.compiler.ir import Act, Alloc, Binary, Buf, Dma, Scalar, Stmt, View, full, whole
from tilec.compiler.schedule import EltwisePlan, PoolPlan, TransposePlan
from tilec.compiler.select import EltwiseOp, PoolOp, TransposeOp
from tilec.errors import TilecError
from tilec.lang import syntax as sx

Built = tuple[list[tuple[str, int]], list[Stmt]]

# ---- element-wise --------------------------------------------------------------------------------------------------


def build_eltwise(op: EltwiseOp, plan: EltwisePlan, hbm: dict[str, Buf]) -> Built:
    """All tensors flattened to [parts, free]; each tile: load inputs, evaluate the expression, store."""
    line, P, F = op.line, plan.parts, op.size // plan.parts
    views, stmts = {}, []
    for name in (*op.inputs, op.out):
        views[name], st = hbm_view(hbm[name], (P, F), f"{name}_v", line)
        stmts += st
    t = "t"
    body: list[Stmt] = []
    tiles = {}
    for name in op.inputs:
        tile = Buf(f"{name}_tile", "sbuf", hbm[name].dtype, (P, plan.free))
        tiles[name] = whole(tile)
        body += [Alloc(tile, line=line),
                 Dma(whole(tile), View(views[name], (full(P), sl(a(term(t, plan.free, "TILE_F")), plan.free))), line)]
    out = Buf(f"{op.out}_tile", "sbuf", hbm[op.out].dtype, (P, plan.free))
    body.append(Alloc(out, line=line))
    body += _ExprCompiler(tiles, (P, plan.free), line, op).emit(op.expr, whole(out))
    body.append(Dma(View(views[op.out], (full(P), sl(a(term(t, plan.free, "TILE_F")), plan.free))), whole(out), line))
    nest = loop(t, F // plan.free, body, note=f"for {', '.join(v for _, v in op.vars)} (tiles of TILE_F)", line=line)
    return [("TILE_F", plan.free)], stmts + [ir.Block(f"{op.out} = element-wise, {P} partitions", tuple(nest), line)]


_BIN = {"+": "add", "-": "subtract", "*": "multiply"}


class _ExprCompiler:
    """Evaluate an element-wise expression tree into tensor_tensor / tensor_scalar / activation instructions."""

    def __init__(self, tiles: dict[str, View], shape: tuple[int, int], line: int, op: EltwiseOp) -> None:
        self.tiles, self.shape, self.line, self.op, self.n = tiles, shape, line, op, 0

    def emit(self, e: sx.Expr, dst: View) -> list[Stmt]:
        stmts, val = self.value(e, dst)
        if val != dst:
            stmts.append(ir.Copy(dst, val, self.line))
        return stmts

    def temp(self) -> tuple[list[Stmt], View]:
        self.n += 1
        buf = Buf(f"tmp{self.n}", "sbuf", "f32", self.shape)
        return [Alloc(buf, line=self.line)], whole(buf)

    def value(self, e: sx.Expr, dst: View | None) -> tuple[list[Stmt], View]:
        if isinstance(e, sx.Access):
            return [], self.tiles[e.tensor]
        c = const_value(e)
        if c is not None:
            raise TilecError("an element-wise result must read at least one tensor", e.span)
        if isinstance(e, sx.Neg):
            return self.scalar(e.x, "multiply", -1.0, dst)
        if isinstance(e, sx.Call) and e.fn in ("relu", "exp"):
            pre, x = self.value(e.args[0], None)
            out, d = self.target(dst)
            return pre + out + [Act(d, x, e.fn, None, 1.0, self.line)], d
        if isinstance(e, sx.Call):
            return self.binary(e.args[0], e.args[1], "maximum" if e.fn == "max" else "minimum", dst)
        rc, lc = const_value(e.rhs), const_value(e.lhs)
        if e.op == "/" and rc is not None:
            return self.scalar(e.lhs, "multiply", 1.0 / rc, dst)
        if rc is not None:
            return self.scalar(e.lhs, _BIN[e.op], rc if e.op != "-" else -rc, dst, "add" if e.op == "-" else None)
        if lc is not None and e.op in "+*":
            return self.scalar(e.rhs, _BIN[e.op], lc, dst)
        if lc is not None and e.op == "-":
            stmts, neg = self.scalar(e.rhs, "multiply", -1.0, None)
            out, d = self.target(dst)
            return stmts + out + [Scalar(d, neg, "add", lc, self.line)], d
        return self.binary(e.lhs, e.rhs, _BIN[e.op], dst)

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
        return p1 + p2 + out + [Binary(d, v1, v2, op, self.line)], d


# ---- transpose -----------------------------------------------------------------------------------------------------


def build_transpose(op: TransposeOp, plan: TransposePlan, hbm: dict[str, Buf]) -> Built:
    """Super-tiles of (BI x BJ) blocks: BI row-strip loads, BI*BJ block transposes, BJ column-strip stores."""
    line, T, BI, BJ = op.line, plan.tile, plan.bi, plan.bj
    M, N = op.dim("M"), op.dim("N")
    src, dst = hbm[op.src], hbm[op.out]
    dt = src.dtype
    a_sb = Buf(f"{op.src}_strip", "sbuf", dt, (T, BI, BJ * T))
    o_sb = Buf(f"{op.out}_strip", "sbuf", hbm[op.out].dtype, (T, BJ, BI * T))
    i0 = lambda blk: a(term("bi", BI * T), term(blk, T, "TILE"))  # noqa: E731
    j0 = lambda blk: a(term("bj", BJ * T), term(blk, T, "TILE"))  # noqa: E731
    load = loop("ai", BI, [Dma(View(a_sb, (full(T), a("ai"), full(BJ * T))),
                               View(src, (sl(i0("ai"), T), sl(a(term("bj", BJ * T)), BJ * T))), line)])
    if plan.method == "dma":
        block = [ir.Transpose(View(o_sb, (full(T), a("bj2"), sl(a(term("ai", T, "TILE")), T))),
                              View(src, (sl(i0("ai"), T), sl(j0("bj2"), T))), "dma", line)]
        load = []
    else:
        tp = Buf(f"{op.out}_tp", "psum", dt, (T, T))  # transpose mode keeps the input dtype in PSUM
        block = [Alloc(tp, line=line),
                 ir.Transpose(whole(tp), View(a_sb, (full(T), a("ai"), sl(a(term("bj2", T, "TILE")), T))), "pe",
                              line),
                 ir.Copy(View(o_sb, (full(T), a("bj2"), sl(a(term("ai", T, "TILE")), T))), whole(tp), line)]
    blocks = loop("ai", BI, loop("bj2", BJ, block))
    store = loop("bj2", BJ, [Dma(View(dst, (sl(j0("bj2"), T), sl(a(term("bi", BI * T)), BI * T))),
                                 View(o_sb, (full(T), a("bj2"), full(BI * T))), line)])
    body = ([Alloc(a_sb, line=line)] if load else []) + load + [Alloc(o_sb, line=line)] + blocks + store
    nest = loop("bi", M // (BI * T), loop("bj", N // (BJ * T), body, note="for j (strips of BJ blocks)", line=line),
                note="for i (strips of BI blocks)", line=line)
    consts = [("TILE", T)]
    return consts, [ir.Block(f"{op.out} = transpose of {op.src} by {T}x{T} blocks", tuple(nest), line)]


# ---- standalone pool -----------------------------------------------------------------------------------------------


def build_pool(op: PoolOp, plan: PoolPlan, hbm: dict[str, Buf]) -> Built:
    line, pool = op.line, op.pool
    B, H, W = op.dim("B"), op.dim("H"), op.dim("W")
    Ho, Wo = H // pool.wy, W // pool.wx
    P, OB = plan.tile_b, plan.band
    x3, s1 = hbm_view(hbm[op.src], (B, H, W), f"{op.src}_v", line)
    o3, s2 = hbm_view(hbm[op.out], (B, Ho, Wo), f"{op.out}_v", line)
    xb = Buf(f"{op.src}_band", "sbuf", hbm[op.src].dtype, (P, OB * pool.wy, W))
    ob = Buf(f"{op.out}_band", "sbuf", hbm[op.out].dtype, (P, OB, Wo))
    body: list[Stmt] = [Alloc(xb, line=line),
                        Dma(whole(xb), View(x3, (sl(a(term("pb", P, "TILE_P")), P),
                                                 sl(a(term("yb", OB * pool.wy)), OB * pool.wy), full(W))), line),
                        Alloc(ob, line=line)]
    src = whole(xb)
    if op.relu:
        rb = Buf(f"{op.src}_relu", "sbuf", "f32", xb.shape)
        body += [Alloc(rb, line=line), Act(whole(rb), src, "relu", None, 1.0, line)]
        src = whole(rb)
    body += pool_epilogue(src, whole(ob), pool.wy, pool.wx, pool.op, pool.scale, f"{op.out}_pool", line)
    body.append(Dma(View(o3, (sl(a(term("pb", P, "TILE_P")), P), sl(a(term("yb", OB)), OB), full(Wo))), whole(ob),
                    line))
    nest = loop("pb", B // P, loop("yb", Ho // OB, body, note="for i (bands of BAND rows)", line=line),
                note="for channels (tiles of TILE_P)", line=line)
    return [("TILE_P", P), ("BAND", OB)], s1 + s2 + [ir.Block(f"{op.out} = {pool.op} pool of {op.src}", tuple(nest),
                                                               line)]
