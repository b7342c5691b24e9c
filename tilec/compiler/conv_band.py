"""A convolution's input band (a matmul's moving operand), built for build_conv._ConvBuilder: the band's loads
(one DMA per in-channel tile, a padded read's halo zeroed, band copies and flat loads for folded taps), and a batched
A B^T's moving operand transposed on TensorE, grouped per PSUM bank, or by the DMA engines (x_by_dma, from the
model's DMA-engine time: dma_engine_ns). Functions of the builder `b`, as conv_pairs.py and conv_weights.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tilec.compiler import conv_batched, conv_fold, conv_halo, conv_spread, conv_vpair, conv_weights, ir
from tilec.compiler.build_util import a, loop, prep_notes, sl, term
from tilec.compiler.ir import DTYPE_BYTES, Alloc, Buf, Dma, Stmt, View, full, whole
from tilec.compiler.schedule import MOVING_FMAX, PMAX, PSUM_BANK, best_divisor

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder
    from tilec.perf.costs import Costs


def dma_engine_ns(costs: Costs, parts: int, descriptors: int, nbytes: int, factor: float = 1.0) -> float:
    """A DMA's time on the whole set of DMA engines by the performance model's formula (the engines of its on-chip
    partitions, each busy Costs.dma_transfer_ns / factor), times the share of the engines it occupies: what it takes
    from the queues' throughput. `costs`: build_matvec.model_costs()."""
    engines = min(costs.n_dma, -(-parts // costs.ppe))
    return costs.dma_transfer_ns(max(descriptors, parts), nbytes, engines) / factor * engines / costs.n_dma


def x_band(b: _ConvBuilder) -> list[Stmt]:
    """The input band: one DMA per in-channel tile; a padded read's halo (rows or columns outside X) is zeroed
    by allocating the band with nl.zeros and loading only the interior."""
    p, line, V = b.p, b.L["update"], b.var
    if b.op.x_transposed:
        return x_transposed_by_dma(b) if x_by_dma(b) else x_transposed(b)
    xb = b.x_band_buf()
    if conv_batched.partition_major(b):  # a batched mat-vec's vector: one contiguous run per partition, its
        return conv_batched.partition_major_loads(b, None, xb, line)  # sum's order permuted as the stationary's
    if b.x_rows_v is not None:  # or rows, turned on TensorE
        return conv_batched.vector_rows_load(b, xb, line)
    rows, cols = b.in_rows(), b.in_cols()
    ct = V["c"]
    top, bottom = b.band_clip(b.yb[1]) if b.yb[0] is None else (0, 0)
    left, right = b.clip(b.col0, cols, b.W) if b.NXB == 1 else (0, 0)  # (col0: X's column at band column 0)
    n_rows, n_cols = rows - top - bottom, cols - left - right
    band_x = b.step(V["xb"], b.BX, b.cn["band_x"], b.sx)
    src_cols = full(cols) if cols == b.W and b.col0 == 0 else \
        sl(a(band_x, b.ox + left) if b.NXB > 1 else a(b.col0 + left), n_cols)
    dst_rows = full(rows) if (top, bottom) == (0, 0) else sl(top, n_rows)
    dst_cols = full(cols) if (left, right) == (0, 0) else sl(left, n_cols)
    src_rows = sl(b.y_at(p.band * b.sy, b.cn["band"] if b.sy == 1 else "").plus(b.oy + top),
                  n_rows)

    def body(cv: str | None, cs: int) -> list[Stmt]:
        return [Dma(View(xb, (b.part(cs, p.tile_c), b.tile_index(cv, b.CT), dst_rows, dst_cols)),
                    View(b.x4, (a(V["n"]), sl(b.c_start(cv), cs), src_rows, src_cols)), line)]
    if b.fold > 1:
        return conv_fold.x_band_folded(b, xb) + conv_vpair.band(b, xb)
    if b.stack:  # group h's rows onto partitions [64h, 64h + C): the two loads reach all 16 DMA engines
        loads: list[Stmt] = [
            Dma(View(xb, (sl(h * PMAX // 2, b.C), a(0), full(rows), full(cols))),
                View(b.x4, (a(V["n"]), full(b.C), sl(src_rows.start.plus(h * p.rows * b.sy), rows), src_cols)), line)
            for h in range(2)]
        return [Alloc(xb, line=line)] + loads
    halo = (top, bottom, left, right) != (0, 0, 0, 0)
    alloc: list[Stmt] = []
    if p.x_bufs != 1:  # the halo alone zeroed when the zero tiles serve the band, else the whole band
        alloc = (conv_halo.zeroed(b, xb, b.yb[1], b.yb[0] is None) if halo else None) or \
            [Alloc(xb, zero=halo, line=line)]
    spread = conv_spread.taps_plain(b, xb) if conv_spread.spreads_plain(b, b.KR) else []  # (stage 1: conv_spread)
    if b.op.w_layout == "dw" and not b.band_shared:  # depthwise: the out-channel tile's own channels only (each
        return alloc + body(b.kv, b.ks) + spread  # tile loaded all of them: Mamba's conv1d at C 1536, 9x the floor)
    return alloc + b.over_c(ct, body, line) + spread


def x_transposed(b: _ConvBuilder) -> list[Stmt]:
    """A matmul's moving operand stored [j, k] (A B^T): its rows are loaded onto the partitions in blocks of up
    to 128 and each (k-tile, j-block) is transposed on TensorE into the [k, j] band the matmuls read."""
    p, line, V, op = b.p, b.L["update"], b.var, b.op
    xb = b.x_band_buf()
    cols = b.in_cols()
    jb = best_divisor(cols, PMAX)  # columns of the band per transposed block
    dt = b.hbm[op.x].dtype
    raw = b.x_rows or Buf(b.fresh(f"{op.x}_rows"), "sbuf", dt, (jb, b.C))
    jv = b.fresh(f"{dict(op.vars).get('x', 'x')}_blk")
    first = a(b.step(V["xb"], b.BX, b.cn["band_x"], 1), term(jv, jb))
    load: list[Stmt] = [] if b.x_rows else [Alloc(raw, line=line)]
    load.append(Dma(whole(raw), View(b.x4, (a(V["n"]), sl(first, jb), full(b.C))), line))
    g = tp_group(b, jb, dt)
    if g > 1:  # g contraction tiles transposed into one PSUM tile, evicted by two copies
        body = load + x_transposed_grouped(b, raw, jv, jb, g)
        alloc = [Alloc(xb, line=line)] if p.x_bufs != 1 else []
        return alloc + prep_notes(loop(jv, cols // jb, body, note=f"{b.T['x']} (blocks of {jb})", line=line),
                                  f"transpose {op.x}")
    tp = Buf(b.fresh(f"{op.x}_tp"), "psum", dt, (p.tile_c, jb))

    def block(cv: str | None, cs: int) -> list[Stmt]:
        tpv = View(tp, (b.part(cs, p.tile_c), full(jb)))
        return [Alloc(tp, line=line),
                ir.Transpose(tpv, View(raw, (full(jb), sl(b.c_start(cv), cs))), "pe", line),
                ir.Copy(View(xb, (b.part(cs, p.tile_c), b.tile_index(cv, b.CT), full(1),
                                  sl(a(term(jv, jb)), jb))), tpv, line)]
    body = load + b.over_c(V["c"], block, line)
    alloc = [Alloc(xb, line=line)] if p.x_bufs != 1 else []
    return alloc + prep_notes(loop(jv, cols // jb, body, note=f"{b.T['x']} (blocks of {jb})", line=line),
                              f"transpose {op.x}")


def x_by_dma(b: _ConvBuilder) -> bool:
    """A batched A B^T's moving operand (B stored [j, k]) transposed by the DMA engines straight from HBM into
    its band, one dma_transpose per contraction tile, instead of loaded in row blocks and transposed on TensorE,
    when the model's estimate of the busier of TensorE and the DMA queues per batch index says so. The
    stationary's choice (conv_weights.rows_by_dma) is taken as made; the rates are the model's own, read as
    rows_by_dma reads them (build_matvec.model_constants): a DMA's engine time by the model's formula
    (dma_engine_ns: descriptors and bytes; a dma_transpose's descriptors are B's rows, at
    `dma_transpose_factor` of a copy [ARCH3]), a PE transpose at transpose mode's rate, a matmul at the dtype's
    factor. fp32: TensorE-bound (its matmuls alone are ~1.2x the DMA floor), so B's 8 PE transposes per batch
    index move to the DMA queues (bmm_bt f32 batch 8 60.1 -> 52.3 us with lead_tile); 16-bit: DMA-bound (a
    transpose's rows of 256 B are twice the descriptors of a copy's), they stay on TensorE. The first batch
    index also counts what the DMA path takes off its critical path: B's chain of row loads, PE transposes and
    evictions before the first matmul, against the band's longer DMA time (bmm_bt batch 1 f32 22.8 -> 21.8 us,
    bf16 18.9 -> 18.1). Checked against the model with each path forced (28 shapes, batch 1-8, f32 and bf16,
    docs/notes/lin14.md): the choice is never the slower path; it leaves some 16-bit gains of 0.4-0.8 us
    (batch 2 and 4) untaken.
    Not for a ragged contraction: its last tile's transpose would sit on the few DMA engines of its
    partitions, one descriptor per row of B (K = 257: 26.2 -> 27.3 us)."""
    op, p = b.op, b.p
    dt = b.hbm[op.x].dtype
    if not (op.x_transposed and op.w_batch and b.src_chip is None and b.NXB == 1 and b.R == b.S == 1
            and not b.CR and DTYPE_BYTES[dt] in (2, 4)):
        return False
    from tilec.compiler.build_matvec import model_constants, model_costs  # late: the model reads kernels
    prm, costs = model_constants(), model_costs()
    item, w_item, o_item = (DTYPE_BYTES[b.hbm[name].dtype] for name in (op.x, op.w, op.out))
    f, ft = (prm["fp32_matmul"], prm["fp32_transpose"]) if item == 4 else (1.0, 1.0)
    ghz, fixed, factor = prm["tensor_ghz"], prm["mm_fixed_cycles"], prm["dma_transpose_factor"]
    cols, tk, tc = b.in_cols(), p.tile_k, p.tile_c
    jb = best_divisor(cols, PMAX)  # the TensorE path's row blocks
    tiles = b.KTB * b.CT  # (out-channel tile, contraction tile) pairs per batch index
    matmuls = tiles * -(-cols // MOVING_FMAX) * (min(cols, MOVING_FMAX) + fixed) * f / ghz
    a_dma = conv_weights.rows_by_dma(b)
    a_pe = 0.0 if a_dma else tiles * (tk + fixed) * ft / ghz
    b_pe = b.CT * (cols // jb) * (jb + fixed) * ft / ghz
    a_load = tiles * dma_engine_ns(costs, tc, tk, tk * tc * w_item, factor) if a_dma else \
        b.KTB * dma_engine_ns(costs, tk, tk, tk * b.C * w_item)
    store = b.KTB * dma_engine_ns(costs, tk, tk, tk * cols * o_item)
    b_rows = cols // jb * dma_engine_ns(costs, jb, jb, jb * b.C * item)
    b_transposed = b.CT * dma_engine_ns(costs, tc, cols, cols * tc * item, factor)
    pe = max(matmuls + a_pe + b_pe, a_load + store + b_rows)
    dma = max(matmuls + a_pe, a_load + store + b_transposed)
    # the first batch index: the band's DMA takes longer by the difference of the two loads, and B's PE
    # transposes and their evictions (half the band's columns on VectorE, ScalarE taking the other half at about
    # its pace, plus an instruction's static cost per row block) leave the path to the first matmul, when A is
    # transposed by DMA too (lead_tile zips the two) or A has at most two tiles (with A on TensorE, A's later
    # tiles load behind the whole band: bf16 1 x 512 x 512 x 512, four tiles, 23.2 -> 23.7 us by DMA), and when
    # the band's extra DMA time is under one DMA latency: a larger band's DMA transposes delay everything behind
    # them more than its chain did (bf16 1 x 512 x 1024 x 512: 26.8 -> 28.4 us; 2 x 128 x 640 x 512: 23.2 ->
    # 23.6; below it, bf16 batch 1 gains 0.5-1.0 us in the shapes tried, benchmarks/families' bmm_bt 0.76).
    # The steady-state difference counts for every batch index: lead_tile's zipped loads start the first one
    # as early as the TensorE path would
    evict = (b.CT * cols / 2 + cols // jb * prm["vector_static_cycles"]) / prm["vector_ghz"]
    extra = b_transposed - b_rows
    chain = (a_dma or b.KTB <= 2) and extra < prm["dma_latency_ns"]
    first = (b_pe + evict if chain else 0.0) - extra
    return b.N * (pe - dma) + first > 0


def x_transposed_by_dma(b: _ConvBuilder) -> list[Stmt]:
    """The band of a batched A B^T's moving operand written by one dma_transpose per contraction tile: B's rows
    (every column of the band) x the tile's contraction columns in HBM -> the tile's [k, j] slice (x_by_dma)."""
    p, line, V, op = b.p, b.L["update"], b.var, b.op
    xb, cols = b.x_band_buf(), b.in_cols()

    def tile(cv: str | None, cs: int) -> list[Stmt]:
        return [ir.Transpose(View(xb, (b.part(cs, p.tile_c), b.tile_index(cv, b.CT), a(0), full(cols))),
                             View(b.x4, (a(V["n"]), full(cols), sl(b.c_start(cv), cs))), "dma", line)]
    alloc = [Alloc(xb, line=line)] if p.x_bufs != 1 else []
    return alloc + prep_notes(b.over_c(V["c"], tile, line), f"transpose {op.x} by DMA")


def tp_group(b: _ConvBuilder, jb: int, dt: str) -> int:
    """Contraction tiles of a batched A B^T's moving operand transposed into one PSUM tile (a bank holds
    PSUM_BANK bytes per partition) and evicted by two copies: a copy of 128 columns is mostly the engine's fixed
    cost (~100 of its ~164 cycles at 16-bit), so per-block evictions made VectorE the bound (bmm_bt f16 batch 8:
    41.0 -> 37.9 us; fp32, with the transposes at transpose mode's fp32 rate (ARCH3): 72.60 -> 67.97 us). 1: one
    block per PSUM tile (a ragged contraction, a plain matmul, a single tile)."""
    if not b.op.w_batch or b.CR or b.p.tile_c != PMAX:
        return 1
    return best_divisor(b.CT, PSUM_BANK // (jb * DTYPE_BYTES[dt]))


def x_transposed_grouped(b: _ConvBuilder, raw: Buf, jv: str, jb: int, g: int) -> list[Stmt]:
    """The j-block's contraction tiles in groups of g: g PE transposes into the tiles of one PSUM tile, then two
    copies into the band, the first half on VectorE and the rest on ScalarE (VectorE alone held up the
    evictions of A's transposes behind it: bmm_bt f16 batch 8 35.70 -> 34.5 us)."""
    p, line, op = b.p, b.L["update"], b.op
    tp = Buf(b.fresh(f"{op.x}_tp"), "psum", raw.dtype, (p.tile_c, g, jb))
    cname = dict(op.vars).get("c", "c")
    gv, tv = b.fresh(f"{cname}_grp"), b.fresh(f"{cname}_in")
    first = a(term(gv, g * p.tile_c), term(tv, p.tile_c, b.cn["c"]))
    block = ir.Transpose(View(tp, (full(p.tile_c), a(tv), full(jb))),
                         View(raw, (full(jb), sl(first, p.tile_c, 1, b.cn["c"]))), "pe", line)
    h = (g + 1) // 2  # the first h tiles evicted by VectorE, the rest by ScalarE (A's odd tiles' engine too)

    def part(lo: int, n: int) -> tuple[View, View]:
        return (View(b.x_band_buf(), (full(p.tile_c), sl(a(term(gv, g), lo), n), full(1),
                                         sl(a(term(jv, jb)), jb))),
                View(tp, (full(p.tile_c), sl(lo, n), full(jb))))
    evict: list[Stmt] = [ir.Copy(*part(0, h), line), ir.Act(*part(h, g - h), "copy", line=line)]
    note = f"{b.T['c']} (groups of {g} tiles of {b.cn['c']})"
    body = [Alloc(tp, line=line)] + loop(tv, g, [block], note=f"{b.T['c']} (tiles of the group)",
                                         line=line) + evict
    return loop(gv, b.CT // g, body, note=note, line=line)
