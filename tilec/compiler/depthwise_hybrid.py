"""The depthwise kernel's TensorE + vector-engine hybrid for a grouped conv of Cg == Kg channels per group (2..8):
partition (slot, m, g) computes output channel g*Kg + m; its band holds the group's input channels rotated by m
(band slot j = input channel (m + j) % Kg, so slot 0 over all partitions is every input channel once); TensorE
takes whole window positions (r, s) as block-diagonal matmuls of slot 0, the vector engines the other positions
channel by channel; one store per output channel. These are the parts of `DepthwiseBuilder` (depthwise_kernel.py)
only the hybrid uses: its taps, weights, block-diagonal matrices and stores."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tilec.compiler import ir
from tilec.compiler.build_util import a, loop, sl
from tilec.compiler.ir import Act, Alloc, Binary, Buf, Dma, Scalar, Stmt, View, full

if TYPE_CHECKING:
    from tilec.compiler.depthwise_kernel import DepthwiseBuilder


def positions(b: DepthwiseBuilder, pe: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """(TensorE's positions as (-1, r, s), the vector engines' taps (j, r, s) of the other positions, j the band
    slot): TensorE takes the positions whose taps skip halo columns first, so the vector sums' first taps can
    write every output column."""
    pos = [(r, s) for r in range(b.R) for s in range(b.S)]
    pos = sorted(pos, key=lambda p: b.tap_cols(p[1])[1] == b.Wo)  # stable: clipped positions first
    # TensorE's first matmul starts the PSUM sum (accumulate=False writes only its own columns): a whole one first
    head = sorted(pos[:pe], key=lambda p: b.tap_cols(p[1])[1] != b.Wo)
    return [(-1, r, s) for r, s in head], [(j, r, s) for r, s in pos[pe:] for j in range(b.HY)]

def pe_starts_whole(b: DepthwiseBuilder) -> bool:
    """Whether TensorE's first tap writes every output column of the PSUM sum (else the hybrid cannot start
    it: a clipped first matmul would leave columns that later matmuls accumulate onto uninitialised)."""
    head = positions(b, b.pe_taps)[0]
    return not head or b.tap_cols(head[0][2])[1] == b.Wo

def rotated(b: DepthwiseBuilder, m: int) -> list[tuple[int, int, int]]:
    """(first band slot, first input channel of the group, count): band slot j of output m holds input channel
    (m + j) % Kg, two runs of consecutive channels."""
    kg = b.HY
    return [(0, m, kg - m)] + ([(kg - m, 0, m)] if m else [])

def stores(b: DepthwiseBuilder, ob: Buf, c0: ir.Aff, n0: ir.Aff, images: int, y0: int, y1: int) -> list[Stmt]:
    """One store per slot (image): partition (slot, m, g) -> Y[n, g*Kg + m], output rows y0..y1. The HBM side is
    Y's channels of the slot's groups as (g, m), permuted to (m, g) (ir.View.perm: the DMA's access pattern walks
    m outside g), so the slot's kg * ng partitions are one DMA writing one contiguous range of Y when it stores
    every row (grouped3x3 f32: 379 -> 125 DMAs at batch 1, 2955 -> 923 at 8; the model's latency is the same),
    where a store per output channel paid one DMA's fixed cost each (nki-spec §2.5)."""
    line, lay, ng, kg = b.L["update"], b.lay, b.NG, b.HY
    rows = full(b.Ho) if (y0, y1) == (0, b.Ho) else sl(y0, y1 - y0)
    return [Dma(View(b.o4, (n0.plus(i), sl(c0, ng), full(kg), rows, full(b.Wo)), (1, 0, 2, 3)),
                View(ob, (sl(j * lay.cg, kg * ng), rows, full(b.Wo))), line)
            for j, (i, _) in enumerate(b.slots(images))]

def weights(b: DepthwiseBuilder, gi: ir.Aff, g0: ir.Aff) -> list[Stmt]:
    """w_all[(slot, m, g), group, j, r, s] = W[g*Kg + m, (m + j) % Kg, r, s] (the vector taps' columns), the bias
    b_all[(slot, m, g), group] = B[g*Kg + m], and for TensorE's taps w_pe[(slot, m', g), group, m, r, s] =
    W[g*Kg + m, m', r, s] (the block-diagonal matrices' scale columns)."""
    op, line, lay, ng, kg = b.op, b.line, b.lay, b.NG, b.HY
    slots = min(lay.k, b.N) * lay.nb
    rs = (full(b.R), full(b.S))
    out: list[Stmt] = []
    for j in range(slots):
        for m in range(kg):
            p = sl(j * lay.cg + m * ng, ng)
            for j0, ch0, cnt in rotated(b, m):
                out.append(Dma(View(b.w_all, (p, gi, sl(j0, cnt)) + rs),
                               View(b.w4, (sl(g0, ng), a(m), sl(ch0, cnt)) + rs), line))
            if op.bias:
                out.append(Dma(View(b.b_all, (p, sl(gi, 1))), View(b.b2, (sl(g0, ng), sl(m, 1))), line))
            if b.pe_taps:
                out.append(Dma(View(b.w_pe, (p, gi, full(kg)) + rs),
                               View(b.w4, (sl(g0, ng), full(kg), a(m)) + rs), line))
    return out

def diagonals(b: DepthwiseBuilder, taps: list[tuple[int, int, int]], parts: int, scalar: bool | None) -> list[Stmt]:
    """d_all[(slot, m', g), group, i, (slot, m, g)] = W[g*Kg + m, m', tap i]: a block of ng columns per (slot, m)
    is the slot's stacked identity (ones at rows (slot, m', g) of column g, every m') scaled per partition."""
    line, lay, ng, kg = b.line, b.lay, b.NG, b.HY
    slots = parts // lay.cg
    stack = Buf(b.fresh("ident_stack"), "sbuf", "f32", (parts, slots, ng))
    out: list[Stmt] = [Alloc(stack, line=line)]
    for j in range(slots):
        dst = View(stack, (full(parts), a(j), full(ng)))
        out.append(ir.Copy(dst, View(b.ident, (sl(0, parts), sl(j * lay.cg, ng))), line))
        for m in range(1, kg):
            out.append(Binary(dst, dst, View(b.ident, (sl(0, parts), sl(j * lay.cg + m * ng, ng))), "add",
                              line))
    body: list[Stmt] = []
    gi = a(b.gw)
    k = 0
    for i, (_, r, s) in enumerate(taps):
        for j in range(slots):
            for m in range(kg):
                dst = View(b.d_all, (sl(0, parts), gi, a(i), sl(j * lay.cg + m * ng, ng)))
                src = View(stack, (full(parts), a(j), full(ng)))
                w = View(b.w_pe, (sl(0, parts), gi, a(m), a(r), sl(s, 1)))
                on_scalar = k % 2 == 1 if scalar is None else scalar
                body.append(Act(dst, src, "copy", None, w, line) if on_scalar else
                            Scalar(dst, src, "multiply", w, line))
                k += 1
    out.append(Alloc(b.d_all, line=line))
    return out + loop(b.gw, b.G, body, note=f"for {b.names['k']} (groups of {b.cn['cg']} channels)",
                      line=line)
