"""The loop-nest builder of standalone window pools (element-wise nests and transposes are scheduled by rules.py)."""
from __future__ import annotations

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh, hbm_view
from tilec.compiler.build_util import a, loop, pool_epilogue, sl, term
from tilec.compiler.expr_instrs import ExprCompiler  # noqa: F401  (build_rowchain imports it from here)
from tilec.compiler.ir import Act, Alloc, Buf, Dma, Stmt, View, full, whole
from tilec.compiler.rules_pool import build_window_pool
from tilec.compiler.schedule import PoolPlan
from tilec.compiler.ops import PoolOp

Built = tuple[list[tuple[str, int]], list[Stmt]]

# ---- standalone pool -----------------------------------------------------------------------------------------------


def build_pool(op: PoolOp, plan: PoolPlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    if op.window is not None:  # overlapping, strided or padded windows: the window-pool rule
        return build_window_pool(op, plan, hbm, fresh)
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
