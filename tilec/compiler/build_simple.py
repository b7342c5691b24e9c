"""Loop-nest builders for 2-D transposes and standalone window pools (element-wise nests are scheduled by rules.py)."""
from __future__ import annotations

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh, hbm_view
from tilec.compiler.build_util import a, loop, pool_epilogue, sl, term
from tilec.compiler.expr_instrs import ExprCompiler  # noqa: F401  (build_rowchain imports it from here)
from tilec.compiler.ir import Act, Alloc, Buf, Dma, Stmt, View, full, whole
from tilec.compiler.schedule import PoolPlan, TransposePlan
from tilec.compiler.ops import PoolOp, TransposeOp

Built = tuple[list[tuple[str, int]], list[Stmt]]

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
        block: list[Stmt] = [ir.Transpose(View(o_sb, (full(TJ), a("bj2"), sl(a(term("ai", TI, ci)), TI))),
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
