"""A convolution's stationary operand and bias prepared before (or per out-channel tile inside) its nest: W loaded
k-major and transposed per (c-tile, tap) on TensorE, contraction-major W loaded as it is, grouped convs' rows placed
block-diagonally, depthwise columns; the bias as one column per out-channel tile, or a matmul's row bias copied to
every partition. Folded taps and row pairs prepare theirs in conv_fold.py and conv_pairs.py.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Sequence

from tilec.compiler import conv_batched, conv_fold, conv_pairs, conv_spread, ir, rows_dma
from tilec.compiler.build_util import a, broadcast_row, hbm_view, loop, ones_row, prep_notes, sl, term
from tilec.compiler.ir import DTYPE_BYTES, Alloc, Buf, Dma, Stmt, View, full, whole
from tilec.compiler.schedule import MOVING_FMAX, PMAX, PSUM_BANK, best_divisor

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder


def weights(b: _ConvBuilder, local: bool) -> list[Stmt]:
    """The stationary operand prepared (weights_once); for a folded image's producer, its K output-channel
    columns copied once per further copy of the image (one k-tile: conv_chain checks it)."""
    out = rectified(b, local, weights_once(b, local))
    if b.dup == 1:
        return out
    wt, K, line = b.wt_buf(local), b.K, b.L["update"]
    at = wt.shape.index(K * b.dup, 2)  # the out-channel dimension (last for kc, after the tiles for ck)
    for j in range(1, b.dup):
        def cols(start: int) -> View:
            return View(wt, tuple(sl(start, K) if i == at else full(n) for i, n in enumerate(wt.shape)))
        out.append(ir.Copy(cols(j * K), cols(0), line))
    return out


def rectified(b: _ConvBuilder, local: bool, prepared: list[Stmt]) -> list[Stmt]:
    """`relu(A[i, k]) * B[k, j]` (ConvOp.w_relu): `prepared` (the stationary's preparation) with the regions written
    into the stationary rectified in place after their writes (relu on ScalarE, then relu6's upper bound on VectorE;
    relu and the minimum commute with the PE transposes). Only the written regions: a ragged contraction tile, a
    one-column stationary or a short last tap group leaves parts of the buffer unwritten, which a whole-buffer pass
    read (fuzz seed 93, l38). A run of writes that tile one region (a folded group's taps, partitions j*C..) is
    rectified once, from its first partition; each loop iteration's region is rectified in the loop, overlapping
    the next iteration's load."""
    op = b.op
    if op.w_relu is None or transposed_rows(b):  # rectified by the transposes' evictions (evict_transposed)
        return prepared
    wt, line, upper = b.wt_buf(local), b.L["update"], op.w_relu

    def rectify(regions: list[View]) -> list[Stmt]:
        out: list[Stmt] = []
        for v in _merged(regions):
            out.append(ir.Act(v, v, "relu", line=line))
            if not math.isinf(upper):
                out.append(ir.Scalar(v, v, "minimum", upper, line))
        return out

    def after_writes(body: Sequence[Stmt]) -> list[Stmt]:
        out: list[Stmt] = []
        run: list[View] = []  # the regions of wt written by the statements just before
        for s in body:
            dst = getattr(s, "dst", None)
            if isinstance(dst, View) and dst.buf == wt:
                out.append(s)
                run.append(dst)
                continue
            out += rectify(run)
            run = []
            if isinstance(s, (ir.Loop, ir.Block)):
                s = dataclasses.replace(s, body=tuple(after_writes(s.body)))
            out.append(s)
        return out + rectify(run)
    return after_writes(prepared)


def _merged(regions: list[View]) -> list[View]:
    """Views of one buffer with adjacent ones joined where they differ in one static slice and abut (partitions
    0..C and C..2C): the union as one view."""
    out: list[View] = []
    for v in regions:
        out.append(v)
        while len(out) > 1 and (joined := _join(out[-2], out[-1])) is not None:
            out[-2:] = [joined]
    return out


def _join(u: View, v: View) -> View | None:
    diff = [d for d, (x, y) in enumerate(zip(u.idx, v.idx)) if x != y]
    if u.buf != v.buf or len(u.idx) != len(v.idx):
        return None
    if not diff:
        return u
    if len(diff) > 1:
        return None
    d = diff[0]
    x, y = u.idx[d], v.idx[d]

    # static slices of step 1 that abut (elements never join: the view would change its rank)
    if not (isinstance(x, ir.Sl) and isinstance(y, ir.Sl)) or x.start.terms or y.start.terms or x.step != 1 \
            or y.step != 1 or x.start.const + x.size != y.start.const:
        return None
    return View(u.buf, u.idx[:d] + (ir.Sl(x.start, x.size + y.size),) + u.idx[d + 1:])


def transposed_rows(b: _ConvBuilder) -> bool:
    """The stationary is loaded k-major and transposed block by block on TensorE (weights_once's last path)."""
    return b.op.w_layout == "kc" and b.pair == 1 and b.fold == 1


def evict_transposed(b: _ConvBuilder, dst: View, src: View, scalar: bool = False) -> list[Stmt]:
    """A transposed block PSUM -> SBUF: a copy (VectorE, or ScalarE when `scalar`), or with ConvOp.w_relu the relu
    itself on the same engine (max(x, 0) on VectorE; relu6's bound after it on VectorE): the stationary's relu costs
    no pass of its own."""
    op, line = b.op, b.L["update"]
    if op.w_relu is None:
        return [ir.Act(dst, src, "copy", line=line) if scalar else ir.Copy(dst, src, line)]
    clamp: list[Stmt] = [ir.Scalar(dst, dst, "minimum", op.w_relu, line)] if not math.isinf(op.w_relu) else []
    return [ir.Act(dst, src, "relu", line=line) if scalar else ir.Scalar(dst, src, "maximum", 0.0, line)] + clamp


def weights_once(b: _ConvBuilder, local: bool) -> list[Stmt]:
    """Load W k-major and transpose each (c-tile, tap) block on TensorE; `local`: only the current out-channel
    part (b.kv, b.ks), into a buffer of one out-channel tile."""
    op, p, line, V = b.op, b.p, b.L["update"], b.var
    wt = b.wt_buf(local)
    out: list[Stmt] = [Alloc(wt, line=line)]
    if op.w_layout == "dw":
        def load(kv: str | None, ks: int) -> list[Stmt]:
            ti = a(0) if local else b.tile_index(kv, b.KT)
            return [Dma(View(wt, (b.part(ks, p.tile_k), ti, full(b.R), full(b.S))),
                        w_view(b, (sl(b.k_start(kv), ks), full(b.R), full(b.S))), line)]
        if local:
            return out + prep_notes(load(b.kv, b.ks), f"prepare {op.w}")
        return out + prep_notes(b.over_k(V["kw"], load, f"{b.T['k']} (tiles of {b.cn['k']})", line),
                                f"prepare {op.w}")
    if b.stack:
        return out + prep_notes(weights_stacked(b, wt), f"prepare {op.w}")
    if b.pair > 1:
        return out + prep_notes(conv_pairs.weights_paired(b, wt), f"prepare {op.w}")
    if b.fold > 1:
        if local:
            return out + prep_notes(conv_fold.weights_folded(b, wt, b.kv, b.ks, True), f"prepare {op.w}")
        return out + prep_notes(b.over_k(V["kw"], lambda kv, ks: conv_fold.weights_folded(b, wt, kv, ks, False),
                                            f"{b.T['k']} (tiles of {b.cn['k']})", line), f"prepare {op.w}")
    r, s = V["r"], V["s"]
    pt = b.part
    if op.w_layout == "ck":
        kslice = sl(b.k_start(b.kv), b.ks) if local else full(b.K)
        kdst = pt(b.ks, p.tile_k) if local else full(b.K)

        def load_c(cv: str | None, cs: int) -> list[Stmt]:
            return [Dma(View(wt, (pt(cs, p.tile_c), b.tile_index(cv, b.CT), kdst, full(b.R),
                                  full(b.S))),
                        w_view(b, (sl(b.c_start(cv), cs), kslice, full(b.R), full(b.S))), line)]
        if not local and conv_batched.partition_major(b):  # (wt declared once, before the nest: build_conv)
            return prep_notes(conv_batched.partition_major_loads(b, wt, None, line), f"prepare {op.w}")
        return out + prep_notes(b.over_c(V["c"], load_c, line), f"prepare {op.w}")
    per_c = p.w_split == "c"  # one DMA per (k-tile, c-tile) block: the first transposes wait for less data
    raw = Buf(b.fresh(f"{op.w}_rows"), "sbuf", wt.dtype, (p.tile_k, p.tile_c if per_c else b.C,
                                                             b.R, b.S))
    once = b.w_rows if local and b.kv is not None else None  # a batched matmul's rows buffer, declared once
    # a PE transpose is an identity matmul in transpose mode: bit-exact, the PSUM tile keeps the input dtype
    tp = Buf(b.fresh(f"{op.w}_tp"), "psum", wt.dtype, (p.tile_c, p.tile_k))

    # (a plain fp32 matmul's rows: rows_dma.py; a mat-vec's whole batch index: conv_batched.kc_by_dma)
    by_dma = local and (rows_by_dma(b) or rows_dma.by_dma(b)) or not local and conv_batched.kc_by_dma(b)

    if not local and conv_batched.kc_whole(b):  # (wt declared once, before the nest: build_conv)
        return prep_notes(conv_batched.kc_whole_load(b, wt, line), f"prepare {op.w}")

    def per_k(kv: str | None, ks: int) -> list[Stmt]:
        if kv is None and not local and conv_spread.spreads_plain(b, ks):  # its taps on the output partitions
            return conv_spread.weights(b)
        if by_dma:  # one DMA transpose per contraction tile, HBM rows -> the stationary's columns
            kd = pt(ks, p.tile_k) if local else sl(b.k_start(kv), ks)
            return b.over_c(V["c"], lambda cv, cs: [ir.Transpose(
                View(wt, (pt(cs, p.tile_c), b.tile_index(cv, b.CT), a(0), a(0), kd)),
                w_view(b, (sl(b.k_start(kv), ks), sl(b.c_start(cv), cs), a(0), a(0))), "dma", line)], line)

        def load(cv: str | None, cs: int) -> list[Stmt]:
            if op.groups > 1:
                return weights_grouped(b, raw, kv, ks)
            csrc = sl(b.c_start(cv), cs) if per_c else full(b.C)
            if once is not None:
                return [Dma(whole(once), w_view(b, (sl(b.k_start(kv), ks), full(b.C), full(b.R), full(b.S))), line)]
            return [Alloc(raw, line=line),
                    Dma(View(raw, (pt(ks, p.tile_k), pt(cs, p.tile_c) if per_c else full(b.C), full(b.R),
                                   full(b.S))),
                        w_view(b, (sl(b.k_start(kv), ks), csrc, full(b.R), full(b.S))), line)]
        kdst = pt(ks, p.tile_k) if local else sl(b.k_start(kv), ks)
        tapm = tap_major(b, raw) if once is None else None

        def block(src_c: ir.Sl, cs: int) -> View:
            """The rows of the transpose of tap (r, s), in-channels src_c: strided in the loaded rows, contiguous in
            their tap-major copy."""
            if tapm is not None:
                return View(tapm, (pt(ks, p.tile_k), a(r), a(s), pt(cs, p.tile_c)))
            return View(once or raw, (pt(ks, p.tile_k), src_c, a(r), a(s)))

        def taps(cv: str | None, cs: int) -> list[Stmt]:
            tpv = View(tp, (pt(cs, p.tile_c), pt(ks, p.tile_k)))
            src_c = pt(cs, p.tile_c) if per_c else sl(b.c_start(cv), cs)
            first = (load(cv, cs) if per_c else []) + (relayout(b, tapm, raw, ks, src_c, cs) if tapm else [])
            if tapm is not None and taps_by_dma(b):  # each tap's block transposed SBUF -> SBUF by the DMA engines
                dst = View(wt, (pt(cs, p.tile_c), b.tile_index(cv, b.CT), a(r), a(s), kdst))
                return first + loop(r, b.R, loop(s, b.S, [ir.Transpose(dst, block(src_c, cs), "dma", line)],
                                                 note=b.T["s"], line=line), note=b.T["r"], line=line)
            if b.S > 1 and b.S * p.tile_k * DTYPE_BYTES[wt.dtype] <= PSUM_BANK:
                # a tap row's S blocks transposed into one PSUM tile and evicted by one copy: a copy of 128 columns
                # is mostly the engine's fixed cost, and VectorE evicting every block paced the transposes (families
                # dilated3x3 bf16 batch 1: 36 evictions of 0.17 us, the first matmul at 21.2 us)
                row = Buf(b.fresh(f"{op.w}_tp"), "psum", wt.dtype, (p.tile_c, b.S, p.tile_k))
                body: list[Stmt] = [Alloc(row, line=line)]
                body += loop(s, b.S, [ir.Transpose(View(row, (pt(cs, p.tile_c), a(s), pt(ks, p.tile_k))),
                                                   block(src_c, cs), "pe", line)], note=b.T["s"], line=line)
                body += evict_transposed(b, View(wt, (pt(cs, p.tile_c), b.tile_index(cv, b.CT), a(r), full(b.S),
                                                      kdst)), View(row, (pt(cs, p.tile_c), full(b.S),
                                                                          pt(ks, p.tile_k))), tapm is not None)
                return first + loop(r, b.R, body, note=b.T["r"], line=line)
            tap: list[Stmt] = [Alloc(tp, line=line), ir.Transpose(tpv, block(src_c, cs), "pe", line),
                               *evict_transposed(b, View(wt, (pt(cs, p.tile_c), b.tile_index(cv, b.CT), a(r), a(s),
                                                               kdst)), tpv, tapm is not None)]
            per_tap = loop(r, b.R, loop(s, b.S, tap, note=b.T["s"], line=line), note=b.T["r"],
                           line=line)
            return first + per_tap
        if once is not None and b.R == b.S == 1 and not b.CR and b.CT % 2 == 0 and b.CT > 2:
            return load(None, 0) + rows_two_engines(b, once, wt, kdst)
        return ([] if per_c else load(None, 0)) + b.over_c(V["c"], taps, line)
    if local:
        return out + prep_notes(per_k(b.kv, b.ks), f"prepare {op.w}")
    return out + prep_notes(b.over_k(V["kw"], per_k, f"{b.T['k']} (tiles of {b.cn['k']})", line),
                            f"prepare {op.w}")


def weights_stacked(b: _ConvBuilder, wt: Buf) -> list[Stmt]:
    """Stacked bands' stationary (build_conv: a 1x1 conv, one tile of K and C): W's rows loaded into both column
    parts of one [K, 64 + C] tile (columns 0.. and 64..) and transposed once, so W^T sits on partitions 0..C and
    again on 64..64 + C (the gap zeroed when C < 64: the transpose reads it, no matmul does). The second
    half is a VectorE copy on the same partitions, not a second DMA: a DMA queued before the band's loads delayed
    them (bf16 batch 1: the first matmul 0.12 us later)."""
    line, C, K = b.L["update"], b.C, b.K
    H = PMAX // 2
    raw = Buf(b.fresh(f"{b.op.w}_rows"), "sbuf", wt.dtype, (K, H + C))
    tp = Buf(b.fresh(f"{b.op.w}_tp"), "psum", wt.dtype, (H + C, K))
    loads: list[Stmt] = [Dma(View(raw, (full(K), sl(0, C))), w_view(b, (full(K), full(C), a(0), a(0))), line),
                         ir.Copy(View(raw, (full(K), sl(H, C))), View(raw, (full(K), sl(0, C))), line)]
    return [Alloc(raw, zero=C < H, line=line)] + loads + [
        Alloc(tp, line=line), ir.Transpose(whole(tp), whole(raw), "pe", line),
        *evict_transposed(b, View(wt, (full(H + C), a(0), a(0), a(0), full(K))), whole(tp))]


TAP_MAJOR_BYTES = 8 * 1024  # per partition at most for the tap-major copy of one in-channel tile (two in flight)


def tap_major(b: _ConvBuilder, raw: Buf) -> Buf | None:
    """A tap-major copy [k, R, S, c] of one in-channel tile of fp32 weight rows [k, C, R, S] (loaded k-major:
    contiguous in HBM), from which each tap's transpose reads its in-channels contiguously. A PE transpose streams
    its source like a matmul's moving operand, and a source stride of R * S elements (36 B in fp32, over the SBUF
    stride limit) doubles that streaming (costs.py, ARCH2's stride penalty); fp32 transposes run at a quarter rate
    besides, so the strided transposes were TensorE's first microseconds: families dilated3x3 f32 batch 1 spent
    9.3 us on 36 of them before its first matmul (73.84 -> 69.58 us with the copies; conv_relu_conv 41.34 -> 39.33,
    conv_residual 22.93 -> 21.66). The copies run on GpSimdE and VectorE beside the transposes, whose evictions move
    to ScalarE. None for 16-bit weights (their transposes are cheap: dilated3x3 bf16 batch 1 21.83 -> 23.50 with
    copies of whole rows), grouped convs (rows gathered per group), 1x1 filters (nothing strided), or copies over
    TAP_MAJOR_BYTES (large filters: SBUF)."""
    if b.op.groups > 1 or b.R * b.S == 1 or DTYPE_BYTES[raw.dtype] < 4 or \
            b.R * b.S * b.p.tile_c * DTYPE_BYTES[raw.dtype] > TAP_MAJOR_BYTES:
        return None
    return Buf(b.fresh(f"{b.op.w}_taps"), "sbuf", raw.dtype, (raw.shape[0], b.R, b.S, b.p.tile_c))


def relayout(b: _ConvBuilder, tapm: Buf, raw: Buf, ks: int, src_c: ir.Sl, cs: int) -> list[Stmt]:
    """raw's rows of one in-channel tile (src_c, cs channels; the ks out-channels of this tile) copied into tapm
    tap by tap, GpSimdE and VectorE in turn."""
    line, pk, pc = b.L["update"], b.part(ks, b.p.tile_k), b.part(cs, b.p.tile_c)
    taps = [(r, s) for r in range(b.R) for s in range(b.S)]
    out: list[Stmt] = [Alloc(tapm, line=line)]
    return out + [ir.Copy(View(tapm, (pk, a(r), a(s), pc)), View(raw, (pk, src_c, a(r), a(s))), line,
                          "gpsimd" if i % 2 == 0 else "") for i, (r, s) in enumerate(taps)]


def rows_by_dma(b: _ConvBuilder) -> bool:
    """A batched matmul's stationary rows transposed by the DMA engines straight from HBM (one dma_transpose per
    contraction tile) instead of loaded and transposed on TensorE, when the model's estimate of the busiest of
    TensorE and the DMA queues per (batch index, out-channel tile) says so. The model's own rates (one fact, one
    place: build_matvec.model_constants): a dma_transpose at `dma_transpose_factor` of a copy's throughput [ARCH3],
    a PE transpose at transpose mode's rate. fp32 A B: TensorE-bound (matmuls at 4.7x plus the transposes), so
    the DMA path pays (bmm f32 batch 8 47.9 -> 40.1 us); 16-bit: DMA-bound, it does not (18.7 -> 22.3 us)."""
    op, p = b.op, b.p
    if not (_rows_loaded_once(b) and b.R == b.S == 1 and not b.CR and op.w_relu is None and b.dup == 1):
        return False
    from tilec.compiler.build_matvec import model_constants  # late: the model reads kernels
    prm = model_constants()
    item = DTYPE_BYTES[b.hbm[op.w].dtype]
    fp32 = item == 4
    f, ft = (prm["fp32_matmul"], prm["fp32_transpose"]) if fp32 else (1.0, 1.0)
    ghz, fixed = prm["tensor_ghz"], prm["mm_fixed_cycles"]
    cols = b.Ho * b.Wo  # the moving operand's columns per batch index
    # the model's matmul: max(min(64, stationary columns), moving columns) cycles + fixed (perf/costs.py), so a
    # mat-vec's one-column matmul costs its 64-cycle minimum, not one cycle
    n_mov = max(min(prm["mm_min_cycles"], p.tile_k), min(cols, MOVING_FMAX))
    matmuls = b.CT * -(-cols // MOVING_FMAX) * (n_mov + fixed) * f / ghz
    transposes = b.CT * (p.tile_k + fixed) * ft / ghz
    bw = prm["dma_engines"] * prm["dma_engine_bw"]  # bytes per ns
    rows = p.tile_k * b.C * item
    rest = (b.C * b.H * b.W * item) / max(b.KT, 1) + p.tile_k * cols * DTYPE_BYTES[b.hbm[op.out].dtype]
    pe = max(matmuls + transposes, (rows + rest) / bw, matvec_evictions(b, prm, item))
    dma = max(matmuls, (rows / prm["dma_transpose_factor"] + rest) / bw)
    return dma < pe


def matvec_evictions(b: _ConvBuilder, prm: dict[str, float], item: int) -> float:
    """ns of VectorE per out-channel tile copying a batched mat-vec's PE-transposed stationary out of PSUM (one
    copy of tile_k columns per contraction tile, the model's cost: max(64, N / perf) cycles, perf 2 for 16-bit
    from PSUM [ARCH3], plus the static overhead [ARCH2]). With one-column matmuls nothing hides them: they set
    the pace (decode attention bf16 4 x 8 x 2048 x 128: 171 ns a tile, 219.4 -> 150.4 us by DMA transposes).
    0 for other matmuls, whose 512-column matmuls outlast the copies (and rows_two_engines shares them out)."""
    if b.Ho * b.Wo != 1:
        return 0.0
    n = b.p.tile_k / (prm["perf_mode_half"] if item == 2 else 1)
    return b.CT * (max(prm["min_ii_cycles"], n) + prm["vector_static_cycles"]) / prm["vector_ghz"]


def taps_by_dma(b: _ConvBuilder) -> bool:
    """A chain's second conv (its input image on chip: conv_chain) transposes its weights' tap blocks by DMA (SBUF ->
    SBUF, dma_transpose: bit-exact for 2- and 4-byte dtypes, up to 50 % of a copy's throughput SBUF -> SBUF [ARCH3])
    instead of on TensorE: its weights are needed only when the first conv's matmuls are done, so the DMA engines
    prepare them meanwhile, and TensorE, the bound of these kernels, starts the first conv's matmuls after the first
    weights' transposes alone. fp32 only: its PE transposes cost the fp32 transpose factor (conv_relu_conv f32
    batch 1: 9 of them, 1.2 us; 16-bit transposes are 2.35 times cheaper and the DMA queues busier). Plain
    k-major weights (not row pairs or folded taps, whose stationaries are gathered blocks), no relu on the
    weights (its eviction applies it). Batch 1 only: from batch 2 on the weights' preparation is amortised and
    the transposes share the DMA queues with the first image's band loads (conv_relu_conv f32 batch 8 251.53 ->
    251.67 us with them)."""
    return (b.src_chip is not None and b.N == 1 and transposed_rows(b) and b.op.groups == 1 and b.op.w_relu is None
            and DTYPE_BYTES[b.hbm[b.op.w].dtype] == 4 and b.dup == 1)


def _rows_loaded_once(b: _ConvBuilder) -> bool:
    op, p = b.op, b.p
    return bool(op.w_batch and p.hoist_w == "k" and op.w_layout == "kc" and op.groups == 1 and b.fold == 1
                and b.pair == 1 and p.w_split != "c" and b.KT > 0)


def rows_once(b: _ConvBuilder) -> Buf | None:
    """A batched matmul's buffer for the rows of its stationary matrix (one out-channel tile, every contraction
    column), declared once before the nest and refilled whole by one DMA per (batch index, tile) instead of one
    buffer per iteration: each refill is a new value the allocator places in a fresh copy, so the next tile's rows
    load while this tile's transposes still read (perf model: `load_versions`); tiles in a loop body rotate through
    two copies and their load waits one DMA latency after the transposes two tiles back. None when the stationary
    is not loaded that way (contraction-major, grouped, folded, split per contraction tile)."""
    op, p = b.op, b.p
    if not _rows_loaded_once(b) or rows_by_dma(b):
        return None
    return Buf(b.fresh(f"{op.w}_tile_rows"), "sbuf", b.hbm[op.w].dtype, (p.tile_k, b.C, b.R, b.S))


# A B^T at 16 bits: A's contraction tiles per PSUM tile (within a bank), evicted by VectorE alone (rows_two_engines)
BT_A_GROUP = 4


def rows_two_engines(b: _ConvBuilder, rows: Buf, wt: Buf, kdst) -> list[Stmt]:
    """A batched matmul's stationary rows (one out-channel tile) transposed g contraction tiles at a time into one
    PSUM tile and evicted by two copies. A B and fp32: pairs, the first evicted by VectorE, the second by ScalarE:
    VectorE alone evicting every block paced the transposes through the two-deep PSUM rotation (grouping fp32 by
    four: bmm f32 batch 8 60.9 -> 62.4 us, TensorE is the bound and its matmuls then wait for the whole group).
    A B^T at 16 bits: groups of BT_A_GROUP, both halves evicted by VectorE: there ScalarE also evicts half of B's
    transposed blocks and every C tile, and A's odd blocks made it the busiest engine per batch index (ScalarE
    1.95 us, VectorE 1.16 us on the model's rates; grouped 1.19 / 1.42 us): bmm_bt bf16 batch 8 34.5 -> 33.6 us."""
    op, p, line = b.op, b.p, b.L["update"]
    dt = wt.dtype
    g = 2
    if op.x_transposed and DTYPE_BYTES[dt] == 2:
        g = best_divisor(b.CT, min(BT_A_GROUP, PSUM_BANK // (p.tile_k * DTYPE_BYTES[dt])))
    scalar = g == 2  # the second copy on ScalarE
    tp = Buf(b.fresh(f"{op.w}_{'pair' if g == 2 else 'group'}_tp"), "psum", dt, (p.tile_c, g, p.tile_k))
    cname = dict(op.vars).get("c", "c")
    hv = b.fresh(f"{cname}_{'pair' if g == 2 else 'grp'}")
    body: list[Stmt] = [Alloc(tp, line=line)]
    jv = b.fresh(f"{cname}_in") if g > 2 else None
    if jv is None:
        for j in range(2):
            first = a(term(hv, 2 * p.tile_c), j * p.tile_c)
            src = View(rows, (full(p.tile_k), sl(first, p.tile_c, 1, b.cn["c"]), a(0), a(0)))
            body.append(ir.Transpose(View(tp, (full(p.tile_c), a(j), full(p.tile_k))), src, "pe", line))
    else:
        first = a(term(hv, g * p.tile_c), term(jv, p.tile_c, b.cn["c"]))
        src = View(rows, (full(p.tile_k), sl(first, p.tile_c, 1, b.cn["c"]), a(0), a(0)))
        body += loop(jv, g, [ir.Transpose(View(tp, (full(p.tile_c), a(jv), full(p.tile_k))), src, "pe", line)],
                     note=f"{b.T['c']} (tiles of the group)", line=line)
    h = g // 2
    for j, (lo, n) in enumerate(((0, h), (h, g - h))):
        dst = View(wt, (full(p.tile_c), sl(a(term(hv, g), lo), n), a(0), a(0), kdst))
        src_tp = View(tp, (full(p.tile_c), sl(lo, n), full(p.tile_k)))
        if n == 1:  # a pair: one tile per copy, indexed as before
            dst = View(wt, (full(p.tile_c), a(term(hv, g), lo), a(0), a(0), kdst))
            src_tp = View(tp, (full(p.tile_c), a(lo), full(p.tile_k)))
        body += evict_transposed(b, dst, src_tp, scalar=scalar and j == 1)
    what = "pairs of tiles" if g == 2 else f"groups of {g} tiles"
    return loop(hv, b.CT // g, body, note=f"{b.T['c']} ({what} of {b.cn['c']})", line=line)


def weights_grouped(b: _ConvBuilder, raw: Buf, kv: str | None, ks: int) -> list[Stmt]:
    """A grouped convolution's rows of W for one out-channel tile, placed block-diagonally: the rows of group j
    of the tile (partitions j*Kg..) hold W[k, 0..Cg] at the group's input channels, zeros elsewhere, so the
    per-tap PE transposes give a stationary that covers all the tile's groups in one matmul."""
    line, kg, cg = b.L["update"], b.KG, b.C // b.op.groups
    jv = b.fresh("grp")
    # the tile's first group: k_start / Kg, times Cg input channels per group
    first = a(term(kv, b.p.tile_k // kg * cg)) if kv else a(b.KT * b.p.tile_k // kg * cg)
    rows = (sl(a(term(jv, kg)), kg), sl(first.plus(a(term(jv, cg))), cg), full(b.R), full(b.S))
    load = Dma(View(raw, rows), w_view(b, (sl(b.k_start(kv).plus(a(term(jv, kg))), kg), full(cg),
                                               full(b.R), full(b.S))), line)
    return [Alloc(raw, zero=True, line=line)] + loop(jv, ks // kg, [load], note="groups of the tile", line=line)


def w_view(b: _ConvBuilder, idx: tuple) -> View:
    """A region of the stationary operand in HBM (of the current batch index's matrix when batched)."""
    return View(b.w4, ((a(b.var["n"]),) if b.op.w_batch else ()) + idx)


def bias(b: _ConvBuilder) -> list[Stmt]:
    assert b.op.bias is not None  # built only for an op with a bias
    stmts, b.bias_col = column(b, b.op.bias)
    return stmts


def column(b: _ConvBuilder, name: str) -> tuple[list[Stmt], Buf]:
    """A vector v[k] as fp32 columns, one per out-channel tile, on the partitions of the eviction's out channels
    (a bias, or an operand of a fused epilogue: conv_epilogue.epilogue_columns)."""
    p, line = b.p, b.line
    b2, st = hbm_view(b.hbm[name], (b.K, 1), b.fresh(f"{name}_v"), line)
    col = Buf(b.fresh(f"{name}_col"), "sbuf", "f32", (b.PK, b.KTB))
    if b.halves:  # b[k] on partitions 2k and 2k + 1: b twice side by side, moved to the partitions in order
        pairs = Buf(b.fresh(f"{name}_twice"), "sbuf", "f32", (b.K, 2))
        return st + [Alloc(pairs, line=line), Alloc(col, line=line)] + \
            [Dma(View(pairs, (full(b.K), sl(h, 1))), whole(b2), line) for h in range(2)] + \
            [Dma(whole(col), whole(pairs), line)], col
    if b.pair > 1:  # one copy per row phase (the output band's partition halves)
        return st + [Alloc(col, line=line)] + [Dma(View(col, (sl(h * b.K, b.K), full(1))), whole(b2), line)
                                               for h in range(2)], col

    def body(kv: str | None, ks: int) -> list[Stmt]:
        if b.dup > 1:  # a folded image's producer: b on each copy's partitions
            return [Dma(View(col, (sl(j * b.K, b.K), full(1))), whole(b2), line) for j in range(b.dup)]
        return [Dma(View(col, (b.part(ks, p.tile_k), sl(b.tile_index(kv, b.KT), 1))),
                    View(b2, (sl(b.k_start(kv), ks), full(1))), line)]
    note = f"{b.T['k']} (tiles of {b.cn['k']})"
    return st + [Alloc(col, line=line)] + prep_notes(b.over_k(b.var["kb"], body, note, line),
                                                     f"load {name} as columns"), col


def bias_row(b: _ConvBuilder) -> list[Stmt]:
    """A matmul's row bias b[x] on every partition (row_broadcast), before the nest, instead of a K=1 matmul per
    output tile inside the accumulation."""
    assert b.op.bias is not None
    stmts, b.bias_bc = row_broadcast(b, b.op.bias, b.fresh(f"ones_{b.hbm[b.op.bias].dtype}"))
    return stmts


def row_broadcast(b: _ConvBuilder, name: str, ones_name: str) -> tuple[list[Stmt], Buf]:
    """v[x] on every partition as fp32: bc[p, x] = v[x], one broadcast matmul per column tile (TILE_X moving
    columns, contraction 1) from a row of ones, made once before the nest (a row bias, or a row a fused epilogue
    adds or multiplies: conv_epilogue.epilogue_columns)."""
    p, line = b.p, b.line
    dt = b.hbm[name].dtype
    row_v, st = hbm_view(b.hbm[name], (1, b.Wo), b.fresh(f"{name}_v"), line)
    row = Buf(b.fresh(f"{name}_row"), "sbuf", dt, (1, b.Wo))
    ones, made = ones_row(ones_name, dt, p.tile_k, line)
    bc = Buf(b.fresh(f"{name}_bc"), "sbuf", "f32", (p.tile_k, b.Wo))
    acc = Buf(b.fresh(f"{name}_bcast"), "psum", "f32", (p.tile_k, p.tile_x))
    xt = b.var["x"]
    cols = sl(a(term(xt, p.tile_x, b.cn["x"])), p.tile_x)
    body = broadcast_row(acc, ones, View(row, (full(1), cols)), line) + \
        [ir.Copy(View(bc, (full(p.tile_k), cols)), whole(acc), line)]
    note = f"{b.T['x']} (tiles of {b.cn['x']})"
    return st + made + [Alloc(row, line=line), Dma(whole(row), whole(row_v), line), Alloc(bc, line=line)] + \
        prep_notes(loop(xt, b.Wo // p.tile_x, body, note=note, line=line), f"broadcast {name}"), bc
