"""A strided slice of the last dimension, `Y[b, i, j] = X[b, i, s * j + c]` (s >= 2: every s-th element from c),
built on level B with every DMA moving one contiguous run per partition. As an HBM -> HBM DMA with a step each
element is a descriptor of its own (4 or 2 bytes: gaps15's strided_slice_offset 8 x 1024 x 2048 f32 at 27x the
floor on the model); here

    partitions   the rows (every dimension but the last, fused) in P blocks of G consecutive rows (P the largest
                 divisor of the rows up to 128, at least 64 of them): partition p holds rows p * G .. p * G + G - 1,
                 contiguous in X and in Y
    per step     TILE_G rows of X loaded whole into a load tile; the every-s-th elements copied on chip into a tile
                 of whole result rows (the columns shared by VectorE, GpSimdE and ScalarE in proportion to their
                 clocks); the tile stored whole

None when the copy is not of that form (an outer dimension shifted or cropped, a fill, rows that do not split
into 64 to 128 blocks of whole rows, a tile that does not fit STEP_BYTES): the copy rule's HBM -> HBM DMA takes it."""
from __future__ import annotations

import math

from tilec.compiler import ir
from tilec.compiler.build_util import a, hbm_view, loop, sl, term
from tilec.compiler.ir import Aff, Term
from tilec.compiler.nest import Access, Assign, Loop
from tilec.target import Target

STEP_BYTES = 48 * 1024  # SBUF per partition of one step's load and result tiles (two steps in flight fit easily)
MIN_RUN_BYTES = 512  # per partition: shorter loads (few, short rows) leave the HBM -> HBM DMA as good


def strided_rows(found: tuple[list[Loop], Assign, Access], hbm: dict, fresh, target: Target) -> tuple[list, list] | None:
    """`found`: the nest's one copy, as rules_transpose._one_copy finds it (its loops, statement and read)."""
    chain, stmt, src = found
    loops = [lp.var for lp in chain]
    D = len(loops)
    X, Y = hbm[src.buf], hbm[stmt.dst.buf]
    if src.fill is not None or len(src.index) != D or len(stmt.dst.index) != D or len(X.shape) != D:
        return None
    if any(i != Aff((Term(v),)) for i, v in zip(stmt.dst.index, loops)) or \
            any(i != Aff((Term(v),)) for i, v in zip(src.index[:-1], loops[:-1])):
        return None
    last = src.index[-1]
    if len(last.terms) != 1 or last.terms[0].var != loops[-1] or last.terms[0].coef < 2:
        return None
    s, c = last.terms[0].coef, last.const
    ext = [lp.extent for lp in chain]
    if tuple(ext) != Y.shape or X.shape[:-1] != Y.shape[:-1]:
        return None
    Wx, Wy = X.shape[-1], Y.shape[-1]
    if c < 0 or c + s * (Wy - 1) >= Wx:
        return None
    R = math.prod(ext[:-1])
    P = max(d for d in range(1, min(target.pmax, R) + 1) if R % d == 0)  # 600 rows: 120 partitions of 5 rows
    if P < min(R, target.pmax // 2):
        return None  # (a prime count of rows would take one partition)
    G = R // P
    xb, yb = ir.DTYPE_BYTES[X.dtype], ir.DTYPE_BYTES[Y.dtype]
    per_row = Wx * xb + Wy * yb
    fits = [d for d in range(1, G + 1) if G % d == 0 and d * per_row <= STEP_BYTES]
    if not fits or G * Wx * xb < MIN_RUN_BYTES:
        return None
    gt = max(fits)
    line = stmt.line
    xv, s1 = hbm_view(X, (P, G, Wx), fresh(f"{X.name}_v"), line)
    yv, s2 = hbm_view(Y, (P, G, Wy), fresh(f"{Y.name}_v"), line)
    consts: list[tuple[str, int]] = []
    name = ""
    if 1 < gt < G:
        name = "TILE_G"
        consts.append((name, gt))
    tv = fresh("g_t")
    load = ir.Buf(fresh(f"{X.name}_rows"), "sbuf", X.dtype, (P, gt, Wx))
    tile = ir.Buf(fresh(f"{Y.name}_tile"), "sbuf", Y.dtype, (P, gt, Wy))
    rows = sl(a(term(tv, gt, name)), gt, name=name)
    body: list = [ir.Alloc(load, line=line), ir.Alloc(tile, line=line),
                  ir.Dma(ir.whole(load), ir.View(xv, (ir.full(P), rows, ir.full(Wx))), line)]
    # the columns in proportion to the engines' clocks (every copy streams one element per cycle on the model)
    clocks = [("vector", target.vector_ghz), ("gpsimd", target.gpsimd_ghz), ("scalar", target.scalar_ghz)]
    total = sum(g for _, g in clocks)
    cuts = [0]
    for n, (_, g) in enumerate(clocks):
        cuts.append(Wy if n == len(clocks) - 1 else cuts[-1] + round(Wy * g / total))
    for (eng, _), lo, hi in zip(clocks, cuts, cuts[1:]):
        if hi <= lo:
            continue
        dst = ir.View(tile, (ir.full(P), ir.full(gt), sl(lo, hi - lo)))
        srcv = ir.View(load, (ir.full(P), ir.full(gt), sl(c + s * lo, hi - lo, s)))
        body.append(ir.Act(dst, srcv, "copy", line=line) if eng == "scalar" else
                    ir.Copy(dst, srcv, line, engine="gpsimd" if eng == "gpsimd" else ""))
    body.append(ir.Dma(ir.View(yv, (ir.full(P), rows, ir.full(Wy))), ir.whole(tile), line))
    main = loop(tv, G // gt, body, note=f"rows of {X.name}, {P} partitions of {G} consecutive rows each"
                + (f", in steps of {name}" if name else ""), line=chain[0].line)
    label = (f"{Y.name} = {X.name}'s rows, one element in {s} from {c}, in SBUF: rows loaded whole, the elements "
             "picked by on-chip copies, the result rows stored whole")
    return consts, s1 + s2 + [ir.Block(label, tuple(main), line)]
