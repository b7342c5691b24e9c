"""Row phases of a convolution (build_conv's ConvPlan.pair = 2, 32 or 64 output channels): the stationary's two
column halves compute two parts of the output rows, so each matmul fills twice the output partitions. Row pairs
(C <= 64, fp32) put the even and odd output rows there (copy 1 of the band one row down: the input rows between serve
both); band halves (2 R C <= 128: first layers, the stem) the two halves of a row band (a band copy per tap row, tap
column and half). Also the eviction of row pairs into a paired on-chip image (conv_chain.OnChip.paired).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tilec.compiler import conv_fold, conv_weights, ir
from tilec.compiler.build_util import a, hbm_view, identity, loop, sl, term
from tilec.compiler.ir import DTYPE_BYTES, Act, Alloc, Buf, Dma, Matmul, Reshape, Stmt, View, full, whole
from tilec.compiler.schedule import MOVING_FMAX, PMAX
from tilec.target import compiled

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder
    from tilec.compiler.schedule import ConvPlan


def pair_groups(r: int, s: int) -> list[tuple[int, int]]:
    """Row pairs: (u, s) per matmul, u = 0, 2, .. up to R. Copy j of the band (X shifted by j rows) read from band row
    u feeds the even output rows with tap row u + j and the odd ones with tap row u + j - 1, so R + 1 input row
    offsets cover both phases in ceil((R + 1) / 2) matmuls per column tap (3x3: 6 matmuls per 2 output rows)."""
    return [(u, j) for j in range(s) for u in range(0, r + 1, 2)]


def pair_blocks(u: int, r: int) -> list[tuple[int, int, int]]:
    """(copy j, row phase h, tap row) of the stationary blocks a row pair based at u fills (the others stay 0)."""
    return [(j, h, u + j - h) for j in range(2) for h in range(2) if 0 <= u + j - h < r]


def weights_paired(b: _ConvBuilder, wt: Buf) -> list[Stmt]:
    """The stationary of each row pair (u, s): block (copy j, phase h), rows j*C + c and columns h*K + k, holds
    W[k, c, u + j - h, s] (zero where that is no tap). W's rows are loaded onto both partition halves, gathered
    per block on chip and transposed on TensorE once per pair (a [2K, 2C] -> [2C, 2K] transpose). Band halves:
    group g's block (copy (c, h, r), half h) holds W[k, :, r, g * M + c] and the transposed columns interleave
    (column 2k + h)."""
    op, line, C, K = b.op, b.L["update"], b.C, b.K
    parts = b.copy_parts(len(b.shifts))  # the contraction rows: the band copies (and the zero gaps between)
    rows = Buf(b.fresh(f"{op.w}_rows"), "sbuf", wt.dtype, (2 * K, C, b.R, b.S))
    width = len(b.shifts) * conv_fold.gathered(b) if b.halves else parts  # (halves: whole copies, [copies, Q])
    raw = Buf(b.fresh(f"{op.w}_taps"), "sbuf", wt.dtype, (2 * K, b.n_groups, width))
    tp = Buf(b.fresh(f"{op.w}_tp"), "psum", wt.dtype, (parts, 2 * K))
    whole_w = (full(C), full(b.R), full(b.S))
    out: list[Stmt] = [Alloc(rows, line=line)]
    out += [Dma(View(rows, (sl(h * K, K),) + whole_w), conv_weights.w_view(b, (full(K),) + whole_w), line)
            for h in range(2)]
    if not b.halves and (DTYPE_BYTES[wt.dtype] < 4 or chained(b)):
        return out + _pair_stationaries(b, wt, rows, tp)
    out.append(Alloc(raw, zero=True, line=line))
    if b.halves:
        out += gather_halves(b, rows, raw)
        blocks = []
    else:
        blocks = [(g, j, h, r, s) for g, (u, s) in enumerate(b.pairs) for j, h, r in pair_blocks(u, b.R)]
    # the gathers take VectorE, ScalarE and GpSimdE in turn (an exact copy: fp32 holds every f16/bf16 value): the
    # first matmuls wait for them (conv3x3same 2.70x -> 2.42x, the stem's 98 blocks 5.5x -> 4.7x at batch 1 with
    # two engines; with GpSimdE too, conv3x3same f32 batch 1 39.5 -> 38.2 us)
    for i, (g, j, h, r, s) in enumerate(blocks):
        half = h ^ b.swap  # (a chain's producer may put the odd rows on the first half: chip_halves)
        dst = View(raw, (sl(half * K, K), a(g), sl(b.copy_at(j), C)))
        src = View(rows, (sl(half * K, K), full(C), a(r), a(s)))
        out.append(Act(dst, src, "copy", None, 1.0, line) if i % 3 == 1 else
                   ir.Copy(dst, src, line, "gpsimd" if i % 3 == 2 else ""))
    if b.at:  # copies spread over the DMA engines (conv_fold.spread): the rows moved to their partitions
        raw, moves = conv_fold.spread_weights(b, raw)
        out += moves
        width = parts
    gv = b.fresh("tap_g")
    if not b.halves and b.n_groups % 2 == 0:  # two pairs per iteration: one eviction on VectorE, one on ScalarE
        pair: list[Stmt] = []
        for e in range(2):
            ge = a(term(gv, 2), e)
            evict = View(wt, (full(parts), ge, full(2 * K)))
            pair += [Alloc(tp, line=line),
                     ir.Transpose(whole(tp), View(raw, (full(2 * K), ge, full(parts))), "pe", line),
                     Act(evict, whole(tp), "copy", None, 1.0, line) if e else ir.Copy(evict, whole(tp), line)]
        return out + loop(gv, b.n_groups // 2, pair, note="row pairs, two at a time", line=line)
    cols = sl(0, parts) if width > parts else full(parts)
    body: list[Stmt] = [Alloc(tp, line=line),
                        ir.Transpose(whole(tp), View(raw, (full(2 * K), a(gv), cols)), "pe", line)]
    if b.halves and not (b.dst_chip is not None and b.dst_chip.phases):
        # band halves interleave the halves' output channels (stationary column 2k + h: a band's two parts are one
        # DMA to HBM); a phased image on chip keeps them in halves, h*K + k (stem_chain.py's pool reads halves)
        body += [ir.Copy(View(wt, (full(parts), a(gv), sl(h, K, 2))), View(tp, (full(parts), sl(h * K, K))), line)
                 for h in range(2)]
    else:
        body.append(ir.Copy(View(wt, (full(parts), a(gv), full(2 * K))), whole(tp), line))
    return out + loop(gv, b.n_groups, body, note="tap columns" if b.halves else "row pairs", line=line)


def chained(b: _ConvBuilder) -> bool:
    """A conv of a chain kept on chip (conv_chain.py): both convs' weights are prepared before the first matmul,
    so their gathers queue on VectorE and ScalarE one behind the other. Four copies per weight instead of 18 [64 x 64]
    gathers take fp32 too (the ResNet block f32 at batch 1: the second weights' transposes ended 1.4 us earlier and the
    first matmul ran at 19.3 us instead of 20.7; 50.24 -> 48.24 us run, 312.56 -> 310.56 at batch 8). A lone conv
    keeps the gathers: there the TensorE warm-up throttle, not the gathers, paces the start (conv3x3same f32 26.50 ->
    26.51)."""
    return b.src_chip is not None or b.dst_chip is not None


def _pair_stationaries(b: _ConvBuilder, wt: Buf, rows: Buf, tp: Buf) -> list[Stmt]:
    """16-bit row pairs' blocks gathered as [2K, 2C, U, S] (U = the pair offsets u = 0, 2, ..): block (j, h) of
    pair (u, s) holds tap row u + j - h, so at a fixed block position the pairs take W's rows j - h, j - h + 2, ..
    for every s: one copy per block position (4 instead of 24 [64 x 64] gathers: the weights are ready at 15.2 us
    instead of 16.1 in bf16 conv3x3same at batch 1, which with the edge bands' zero rows took it 25.9 -> 24.7 us),
    then one TensorE transpose per pair (group g = s * U + u / 2, b.pairs' order). Its source is strided (U * S
    elements), which doubles a transpose's streaming: cheap in 16 bits, but fp32 transposes take 4.7 times as long
    and the early TensorE work meets the warm-up throttle (conv3x3same f32 batch 1 39.2 -> 41.1 us in session 10,
    26.50 -> 26.51 now), so a lone fp32 conv keeps one gather per block (`chained`: a chain's convs take the copies)."""
    op, line, C, K, R, S = b.op, b.L["update"], b.C, b.K, b.R, b.S
    U = len(range(0, R + 1, 2))
    raw = Buf(b.fresh(f"{op.w}_taps"), "sbuf", wt.dtype, (2 * K, 2 * C, U, S))
    moves: list[tuple[View, View, int]] = []  # (block, W's rows, tap rows)
    for j in range(2):
        for h in range(2):
            lo, hi = -((j - h) // 2), (R - 1 + h - j) // 2  # the u / 2 whose tap row u + j - h is one of W's
            if hi < lo:
                continue
            half = h ^ b.swap  # (a chain's producer may put the odd rows on the first half: chip_halves)
            moves.append((View(raw, (sl(half * K, K), sl(j * C, C), sl(lo, hi - lo + 1), full(S))),
                          View(rows, (sl(half * K, K), full(C), sl(2 * lo + j - h, hi - lo + 1, 2), full(S))),
                          hi - lo + 1))
    # 16-bit: the larger block positions (two tap rows) on VectorE, the one-row ones on ScalarE, which copies at
    # about half VectorE's rate there (VectorE's performance mode): the gathers end together (bf16 conv3x3same batch
    # 1: the first transpose at 13.99 us, 14.15 when the engines alternated). fp32 has no performance mode and
    # ScalarE copies faster than VectorE: the engines alternate (resnet_block f32 batch 1 48.44 us sorted, 48.24)
    if DTYPE_BYTES[wt.dtype] < 4:
        moves.sort(key=lambda m: -m[2])
        vector = (len(moves) + 1) // 2
        order = [i < vector for i in range(len(moves))]
    else:
        order = [i % 2 == 0 for i in range(len(moves))]
    out: list[Stmt] = [Alloc(raw, zero=True, line=line)]
    out += [ir.Copy(d, s, line) if v else Act(d, s, "copy", None, 1.0, line) for v, (d, s, _) in zip(order, moves)]
    # the evictions alternate between VectorE and ScalarE (u even / odd): TensorE runs the transposes and then the
    # first matmul in program order, and VectorE evicting all of them (0.17 us each) paced it (bf16 conv3x3same
    # batch 1: the first matmul at 14.95 us, 14.60 with the two engines)
    sv = b.fresh("tap_s")
    body: list[Stmt] = []
    for u in range(U):
        evict = View(wt, (full(2 * C), a(term(sv, U), u), full(2 * K)))
        body += [Alloc(tp, line=line),
                 ir.Transpose(whole(tp), View(raw, (full(2 * K), full(2 * C), a(u), a(sv))), "pe", line),
                 Act(evict, whole(tp), "copy", None, 1.0, line) if u % 2 else ir.Copy(evict, whole(tp), line)]
    return out + loop(sv, S, body, note="row pairs: tap columns (both tap row offsets)", line=line)


PHASES_MIN_BYTES = 4  # operand bytes from which phased halves may pay (fp32: TensorE-bound; tests lower it)


def phases_pay(b: _ConvBuilder) -> bool:
    """Whether band halves take the output rows' phases instead: part h of the band is its output rows 2i + h,
    whose input rows (2i + h) * sy + r are the copies at row offsets h * sy + r, so R + sy row copies per column
    copy serve both parts where halves take 2R (the stem: 9 instead of 14; a 3x3 first layer: 4 instead of 6). The
    freed partitions take more tap columns per matmul (the stem in fp32: 2 matmuls per group instead of 3) or move
    fewer bytes (conv_c3: two thirds of the loads). The cost is the store: a partition then holds every other
    output row, one DMA descriptor per row instead of one run per partition. That pays with fp32 operands (4-byte
    rows of 448-896 B: families conv_c3 f32 1.80x/1.66x -> 1.73x/1.52x, the stem 3.70x/3.20x -> 3.05x/2.72x), not
    in 16 bits (rows of half the bytes for as many descriptors: conv_c3 bf16 1.95x/1.47x -> 2.17x/1.69x, the stem
    2.56x -> 3.16x at batch 8). Also unit dilation, windows not apart (sy < R), and no chain or residual (their
    layouts follow the band halves). A zero-padded read phases too: conv_halo zeroes each copy's rows outside X at
    the phases' row step (the padded stem of stem_maxpool: 3 -> 2 matmuls per group, TensorE busy 38.0 -> 25.3 us
    at batch 1; families f32 5.50x/4.00x -> 5.26x/3.77x)."""
    on_chip = b.dst_chip is not None and b.dst_chip.phases  # (stem_chain.py: no store, 16-bit phases too)
    if DTYPE_BYTES[b.hbm[b.op.x].dtype] < PHASES_MIN_BYTES and not on_chip or b.dy != 1 or b.sy >= b.R \
            or b.op.residual or b.src_chip is not None or b.Ho % 2 \
            or b.dst_chip is not None and not b.dst_chip.phases:  # (stem_chain.py's image is phased)
        return False
    return True  # (padded bands: conv_halo.folded_boxes clips each copy at the phases' step)


def columns_per_copy(b: _ConvBuilder, plan: ConvPlan) -> int:
    """Band halves' M, the tap columns folded into the copies: the most that fit 128 partitions, unless fewer
    balance TensorE against the DMAs better. Per band, M copies per tap row and half cost their loads (M x 2R x C
    rows of the band's width), and each matmul group ceil(S / M) matmuls; with 16-bit operands TensorE has time to
    spare and fewer copies shorten the loads (conv_c3 f16: M = 2, batch 8 257 -> 228 us; the stem f16 150 -> 120).
    The rates are the compiled target's (tilec.target.compiled(); fp32 matmuls at a quarter rate, nki-spec §2.4)."""
    nr = b.R + b.sy if b.phased else 2 * b.R  # row copies per column copy
    top = min(b.S, PMAX // (nr * b.C))
    x_bytes, y_bytes = DTYPE_BYTES[b.hbm[b.op.x].dtype], DTYPE_BYTES[b.hbm[b.op.out].dtype]
    t = compiled()
    bw = t.dma_engines * t.dma_engine_bw
    store = b.K * plan.band * b.Wo * y_bytes

    def band_ns(m: int) -> float:
        return max(pe_ns(b, plan, m), (m * nr * b.C * (plan.band // 2) * b.in_cols() * x_bytes + store) / bw)
    if b.phased and b.dst_chip is not None and b.N > 1 and b.NB > 1 and plan.x_bufs != 1:  # the stem -> pool chain
        from tilec.compiler import stem_chain  # (late: stem_chain imports build_conv, which imports this module)
        return stem_chain.columns_per_copy(b, plan, top)
    return min(range(top, 0, -1), key=band_ns)  # (the largest M of the best)


def pe_ns(b: _ConvBuilder, plan: ConvPlan, m: int) -> float:
    """TensorE's time per band of band halves with M = m: ceil(S / m) matmuls a group (fp32 at a quarter rate)."""
    groups = plan.band // (2 * plan.rows) * -(-b.Wo // plan.tile_x)
    factor = 4 if DTYPE_BYTES[b.hbm[b.op.x].dtype] == 4 else 1
    return groups * -(-b.S // m) * (plan.rows * plan.tile_x + 9) * factor / compiled().tensor_ghz


def gather_halves(b: _ConvBuilder, rows: Buf, raw: Buf) -> list[Stmt]:
    """The band halves' stationary blocks, one gather per (group, tap column, half): its R copies (h, r, c),
    consecutive, hold W[k, :, r, g * M + c] for every tap row r. W's rows are first put tap-major ([2K, R, S, C],
    a copy per channel), so each gather moves an [K, R, C] block (the stem: 3 + 14 copies instead of 98 blocks)."""
    op, line, C, K, R, S = b.op, b.L["update"], b.C, b.K, b.R, b.S
    tapmajor = Buf(b.fresh(f"{op.w}_rsc"), "sbuf", rows.dtype, (2 * K, R, S, C))
    slots = Buf(b.fresh(f"{op.w}_copies"), "sbuf", raw.dtype, (2 * K, b.n_groups, len(b.shifts), conv_fold.gathered(b)))
    out: list[Stmt] = [Alloc(tapmajor, line=line)]
    moves: list[tuple[View, View]] = [(View(tapmajor, (full(2 * K), full(R), full(S), a(ch))),
                                       View(rows, (full(2 * K), a(ch), full(R), full(S)))) for ch in range(C)]
    out += _alternate(moves, line)
    out.append(Reshape(slots, raw, line))
    gathers = []
    for g, (_, s0) in enumerate(b.pairs):
        for c in range(b.M):
            if c + s0 >= S:
                continue
            for h in range(2):
                # copies (h, r, c), r = 0..R-1, are j0..j0+R-1 (phases: copy (r', c) serves both halves' rows)
                half, j0 = h ^ b.swap, c * b.NR + h * b.hstep
                gathers.append((View(slots, (sl(half * K, K), a(g), sl(j0, R), sl(0, C))),
                                View(tapmajor, (sl(half * K, K), full(R), a(c + s0), full(C)))))
    return out + _alternate(gathers, line)


def _alternate(moves: list[tuple[View, View]], line: int) -> list[Stmt]:
    """Copies alternating between VectorE and ScalarE (exact: fp32 holds every f16/bf16 value)."""
    return [Act(dst, src, "copy", None, 1.0, line) if i % 2 else ir.Copy(dst, src, line)
            for i, (dst, src) in enumerate(moves)]


def matmuls_paired(b: _ConvBuilder, accv: View, wt: Buf) -> list[Stmt]:
    """One matmul per row pair (u, s): the band copies read from row u of the group's row pairs, every other row
    (the even output rows' rows; the odd ones read the same data one row up through their blocks)."""
    p, V, C = b.p, b.var, b.C
    out: list[Stmt] = []
    order = list(enumerate(b.pairs))
    if b.col0 != b.ox:  # the accumulator's first matmul writes every column (NKI 0.6: the others add to it)
        order.sort(key=lambda gs: tap_columns(b, gs[1][1]) != (0, b.Wo))
    for g, (u, s) in order:
        copies = 2 if any(j == 1 for j, _, _ in pair_blocks(u, b.R)) else 1  # a copy with no tap stays out
        parts = sl(0, copies * C)
        rows = sl(a(term(V["g"], 2 * b.g_rows), u + 2 * b.g0), p.rows, 2)  # (g0: conv_split's first pair)
        if b.src_chip is not None:  # a paired image holds only the rows the pairs read: index b / 2
            assert b.src_chip.paired and u % 2 == 0
            rows = sl(a(term(V["g"], b.g_rows), u // 2 + b.g0).plus(b.y_at(p.band // 2)), p.rows)
        cols = sl(a(b.step(V["x"], p.tile_x, b.cn["x"], b.sx), s * b.dx), p.tile_x, b.sx,
                  b.cn["x"] if b.sx == 1 else "")
        acc = accv
        if b.col0 != b.ox:  # a band of X's own columns: the tap's output columns that read inside X
            first, n = tap_columns(b, s)
            if n == 0:
                continue
            cols = sl(first * b.sx + s * b.dx + b.ox, n, b.sx)
            acc = View(accv.buf, accv.idx[:-1] + (sl(first, n),))
        out.append(Matmul(acc, View(wt, (parts, a(g), full(b.PK))),
                          View(b.x_band_buf(), (parts, a(0), rows, cols)), b.L["update"]))
    return out


def tap_columns(b: _ConvBuilder, s: int) -> tuple[int, int]:
    """(first output column, count) whose input column under tap column s lies inside X (a padded read reaches
    past X's edges with its outer taps: 3x3 "same" tap 0 reads X's column -1 for output column 0)."""
    first = s * b.dx + b.ox  # the input column of output column 0
    lo = max(0, -(first // b.sx))  # ceil(-first / sx)
    hi = min(b.Wo - 1, (b.W - 1 - first) // b.sx)
    return lo, max(0, hi - lo + 1)


def matmul_halves(b: _ConvBuilder, accv: View, wt: Buf) -> list[Stmt]:
    """A matmul per M tap columns for the group's rows of both band halves: every copy read at the group's
    rows, g * M tap columns to the right."""
    p, V = b.p, b.var
    rows = sl(a(term(V["g"], p.rows, b.cn["rows"])), p.rows, 1, b.cn["rows"])  # copies hold strided rows
    out: list[Stmt] = []
    for g, (_, s0) in enumerate(b.pairs):
        parts = sl(0, b.copy_parts(min(b.M, b.S - s0) * b.NR))
        cols = sl(a(b.step(V["x"], p.tile_x, b.cn["x"], b.sx), s0 * b.dx), p.tile_x, b.sx,
                  b.cn["x"] if b.sx == 1 else "")
        out.append(Matmul(accv, View(wt, (parts, a(g), full(b.PK))),
                          View(b.x_band_buf(), (parts, a(0), rows, cols)), b.L["update"]))
    return out


def rows_view(b: _ConvBuilder, pairs: Buf) -> View:
    """The band's rows of an output-shaped tensor seen as [N, K, rows / 2, 2, columns] (`pairs`), in the order of
    a row-pair band on chip: phase h, channel k, pair i, column (partition h*K + k holds rows 2i + h), so one DMA
    moves both phases (a permuted view: ir.View.perm)."""
    region = (a(b.var["n"]), full(b.K), sl(b.y_at(b.p.band // 2), b.p.band // 2), full(2), full(b.Wo))
    return View(pairs, region, perm=(2, 0, 1, 3))


def halves_region(b: _ConvBuilder) -> tuple:
    """The output band of band halves in the [N, K, bands, 2, BAND / 2, columns] view of an output tensor."""
    return (a(b.var["n"]), full(b.K), b.y_at(1), full(2), full(b.p.band // 2), full(b.Wo))


def phases_region(b: _ConvBuilder) -> tuple:
    """The output band of phased band halves in the [N, K, Ho / 2, 2, columns] view of an output tensor, as
    (channel, phase, pair, column): partition 2k + h holds rows 2i + h of the band (a permuted view)."""
    return (a(b.var["n"]), full(b.K), sl(b.y_at(b.p.band // 2), b.p.band // 2), full(2), full(b.Wo))


def chip_halves(b: _ConvBuilder) -> list[tuple[View, ir.Sl]]:
    """Row pairs into a paired image (conv_chain.OnChip.paired): (destination, acc partitions) per partition
    half. Half p holds output rows of phase p ^ swap (2i + h, i the pair), which go to copy p of the image at
    its index (2i + h - row0 - p) / 2: one eviction when the halves line up (row0 even), else one per half."""
    chip, p, V = b.dst_chip, b.p, b.var
    assert chip is not None and b.pair == 2
    cols = sl(a(term(V["x"], p.tile_x, b.cn["x"]), -chip.col0), p.tile_x)
    first = a(term(V["g"], p.rows, b.cn["rows"])).plus(b.y_at(p.band // 2))  # the group's first pair
    if not b.swap:
        return [(View(chip.buf, (full(b.PK), a(0), sl(first.plus(-chip.row0 // 2), p.rows), cols)),
                 full(b.PK))]
    out = []
    for half in range(2):
        h = half ^ 1
        at = first.plus((h - chip.row0 - half) // 2)
        out.append((View(chip.buf, (sl(half * b.K, b.K), a(0), sl(at, p.rows), cols)),
                    sl(half * b.K, b.K)))
    return out


def regroups(b: _ConvBuilder) -> bool:
    """16-bit row pairs stored from HBM-bound bands may be regrouped on TensorE before their store (regroup_store):
    a plain conv (no pool, no on-chip output), 2K = the partitions, whole-width bands of a multiple of 4 rows that
    tile the output exactly, a quarter band's rows within one matmul's moving columns. A conv with a residual only
    at batch 1, where its last band's store is the kernel's tail: the ResNet block bf16 batch 1 16.53 -> 15.43 us
    (the second band's store waits behind the first band's, then moves 128 runs instead of 1,792). From batch 2
    on the block is TensorE-bound and 4 more matmuls per image would only add to it: only its last image, built
    apart from the image loop, is regrouped (conv_chain.peels_last)."""
    op = b.op
    return (b.pair == 2 and not b.phased and not b.halves and b.dst_chip is None and not op.w_batch
            and (op.residual is None or b.N == 1 or b.peel_last) and op.pool is None
            and DTYPE_BYTES[b.hbm[op.out].dtype] == 2
            and 2 * b.K == PMAX and b.NXB == 1 and b.BX == b.Wo and b.wy == b.wx == 1
            and b.p.band % 4 == 0 and b.Ho == b.NB * b.p.band and b.NB >= 2
            and b.p.band // 4 * b.Wo <= MOVING_FMAX and any(_peeled_odd(b, i) for i in range(b.NB)))


def _peeled_odd(b: _ConvBuilder, band: int) -> bool:
    """An odd band peeled off the band loop for its halo (the bottom band of a padded 2-band image), or because it
    reads its residual from the producer's band copies (conv_chain.skip_from_bands: every band peeled)."""
    return band % 2 == 1 and (b.band_clip(band) != (0, 0) or b.skip_bands is not None)


def regroup_band(b: _ConvBuilder) -> bool:
    """Whether the band being built is regrouped: the odd bands peeled for their halo (band 1 of a 2-band image). A
    row-pair band's store moves rows of W elements (partition h*K + k holds rows 2i + h): 2 x 64 x 14 runs of 112 B
    per bf16 band at W = 56, descriptor-bound (1.66 us on the 16 DMA engines against 0.55 for its bytes), and it
    shares the engines with the next bands' two X copies (1.14 us): the bf16 batch is DMA-bound at 2.8 us per band
    against TensorE's 2.0. Regrouped, the store is 128 runs of half a band (0.56 us) for 4 selection matmuls (0.67
    us of TensorE) and 2 evictions. Every band regrouped makes TensorE the bound at ~2.9 us per band (conv15.md:
    50.2 -> 55.5 us); one band in two balances the two (conv3x3same bf16 batch 8: 50.20 -> 44.42 us run, batch 4
    27.84 -> 25.59, batch 1 11.65 -> 11.47; batch 2 16.13 -> 16.18 is the one size measured slower)."""
    var, first = b.yb
    return var is None and _peeled_odd(b, first) and regroups(b) and (b.last_image or not b.peel_last)


def regroup_prelude(b: _ConvBuilder) -> list[Stmt]:
    """The HBM view of regroup_store's halves; the selection stationaries, [2K, 3, 2K], built in
    b.regroup_setup, which the prelude places after the weights: block d moves partition p to p + (1 - d) * K
    (d = 1: the identity; 0: the first K partitions up by K; 2: the last K down by K), so block 1 + h - q of
    phase h's K partitions moves partition h*K + k to q*K + k. Built before the weights, the identity's
    affine_select and the memsets held GpSimdE and VectorE while the weights' gathers waited: TensorE's first
    transpose, which starts its warm-up throttle, ran 1 us later (conv3x3same bf16 batch 1)."""
    line, K = b.line, b.K
    dt = b.hbm[b.op.out].dtype
    ident, out = identity(b.fresh("ident"), dt, line)
    sel = Buf(b.fresh(f"{b.op.out}_select"), "sbuf", dt, (2 * K, 3, 2 * K))
    b.regroup_sel = sel
    hshape = (b.N, K, b.NB, 2, b.p.band // 2, b.Wo)
    b.o6, s6 = hbm_view(b.hbm[b.op.out], hshape, b.fresh(f"{b.op.out}_halves"), line)
    moves = [(View(sel, (full(2 * K), a(1), full(2 * K))), whole(ident)),
             (View(sel, (sl(0, K), a(0), sl(K, K))), View(ident, (sl(0, K), sl(0, K)))),
             (View(sel, (sl(K, K), a(2), sl(0, K))), View(ident, (sl(K, K), sl(K, K))))]
    b.regroup_setup = out + [Alloc(sel, zero=True, line=line)] + [ir.Copy(d, s, line) for d, s in moves]
    return s6


def regroup_store(b: _ConvBuilder, ob: Buf) -> list[Stmt]:
    """The row-pair band ob (partition h*K + k, pair i: row 2i + h) regrouped on TensorE into halves of the band
    (partition q*K + k, row t of half q: row q * BAND / 2 + t) and stored in one DMA of 2K runs of BAND / 2 whole
    rows. Pairs q * BAND / 4 .. of phase h's K partitions go to partitions q*K + k of phase h's PSUM tiles (one
    per evicting engine; selection matmuls, exact: one product of 1 per element), evicted into rows t = 2i + h of
    the halves. Half q outside the phases: where a band's half is one accumulation group (conv3x3same: 7 pairs),
    the first half's matmuls wait only for the first group's eviction and TensorE runs them while the second group
    is evicted (bf16 batch 8: 45.59 -> 44.42 us run, against the phases outside). How the halves move depends on
    the batch: _regroup_all, _regroup_crossing."""
    line, K, W, dt = b.line, b.K, b.Wo, b.hbm[b.op.out].dtype
    quarter = b.p.band // 4  # the pairs of a half band
    rows = Buf(b.fresh(f"{b.op.out}_rows"), "sbuf", dt, (2 * K, quarter, 2, W))
    # the first quarter // 2 pairs of both phases on VectorE, the rest on ScalarE: two disjoint runs of the rows
    # tile, so the engines evict side by side (one engine per phase interleaves their rows, whose writes then
    # overlap as ranges and the dependence tracker ordered them; bf16 conv3x3same batch 1: the store 0.29 us
    # sooner than with both phases on VectorE). Each engine's pairs of a phase have a PSUM tile (a bank) of their
    # own, made by a matmul of their own: VectorE and ScalarE reading one PSUM bank at once collide (ARCH3,
    # tilec/target.py Exclusion; model, bf16 conv3x3same batch 1: 23.56 -> 23.39 us, batch 8: 56.51 -> 56.40 us)
    cut = regroup_cut(b)
    parts = [(lo, n, scalar) for lo, n, scalar in ((0, cut, False), (cut, quarter - cut, True)) if n]
    accs = {(h, lo): Buf(b.fresh(f"{b.op.out}_phase{h}{'_act' if scalar else ''}"), "psum", "f32", (2 * K, n, W))
            for lo, n, scalar in parts for h in range(2)}
    moves = (_regroup_all if b.N == 1 or b.last_image else _regroup_crossing)(b, ob, rows, parts, accs)
    region = (a(b.var["n"]), full(K), b.y_at(1), full(2), full(b.p.band // 2), full(W))
    return [Alloc(rows, line=line)] + moves + [Dma(View(b.o6, region, perm=(1, 0, 2, 3)), whole(rows), line)]


_Parts = list[tuple[int, int, bool]]


def regroup_cut(b: _ConvBuilder) -> int:
    """The pairs of a half band regroup_store moves in its first part (VectorE's), the rest in the second
    (ScalarE's); conv_split.half_groups cuts the band's second group there."""
    return b.p.band // 4 // 2


def _evict(dst: View, src: View, scalar: bool, line: int) -> Stmt:
    return Act(dst, src, "copy", None, 1.0, line) if scalar else ir.Copy(dst, src, line)


def _regroup_all(b: _ConvBuilder, ob: Buf, rows: Buf, parts: _Parts, accs: dict[tuple[int, int], Buf]) -> list[Stmt]:
    """Batch 1: every element through TensorE, both halves of a phase summed into its PSUM tiles, then evicted
    whole. The regroup is the kernel's tail, where TensorE is idle and the evicting engines are not (the halves
    left on their partitions copied on VectorE or GpSimdE, as _regroup_crossing does: bf16 conv3x3same batch 1
    23.39 -> 23.4 / 23.53 us, the ResNet block 28.43 -> 28.59)."""
    line, K, W, quarter, sel = b.line, b.K, b.Wo, b.p.band // 4, b.regroup_sel
    assert sel is not None
    qv = b.fresh("half")
    moves: list[Stmt] = [Matmul(whole(accs[h, lo]), View(sel, (sl(h * K, K), a(term(qv, -1), 1 + h), full(2 * K))),
                                View(ob, (sl(h * K, K), sl(a(term(qv, quarter), lo), n), full(W))), line)
                         for lo, n, _ in parts for h in range(2)]
    evict = [_evict(View(rows, (full(2 * K), sl(lo, n), a(h), full(W))), whole(accs[h, lo]), scalar, line)
             for lo, n, scalar in parts for h in range(2)]
    return [Alloc(acc, zero=True, line=line) for acc in accs.values()] + loop(
        qv, 2, moves, note="halves of the band", line=line) + evict


def _regroup_crossing(b: _ConvBuilder, ob: Buf, rows: Buf, parts: _Parts,
                      accs: dict[tuple[int, int], Buf]) -> list[Stmt]:
    """Batch > 1, where TensorE is the bound: only phase h of half 1 - h changes partitions. Half h of phase h
    stays on its partitions and VectorE copies it; TensorE moves the other half only, 2 selection matmuls of a
    half band instead of 4 (bf16 conv3x3same batch 8: 56.40 -> 55.20 us; on GpSimdE the copies delayed the next
    image's zero halo rows, and TensorE with them: 58.0). Phase 1 first: its half 0 waits only for the band's
    first accumulation group. Each phase's PSUM tiles are written by one matmul and evicted on the moved half."""
    line, K, W, quarter, sel = b.line, b.K, b.Wo, b.p.band // 4, b.regroup_sel
    assert sel is not None
    moves: list[Stmt] = [Matmul(whole(accs[h, lo]), View(sel, (sl(h * K, K), a(2 * h), full(2 * K))),
                                View(ob, (sl(h * K, K), sl((1 - h) * quarter + lo, n), full(W))), line, start=True)
                         for h in (1, 0) for lo, n, _ in parts]
    stay: list[Stmt] = [ir.Copy(View(rows, (sl(h * K, K), full(quarter), a(h), full(W))),
                                View(ob, (sl(h * K, K), sl(h * quarter, quarter), full(W))), line) for h in range(2)]
    moved = [(sl((1 - h) * K, K), lo, n, h, scalar) for lo, n, scalar in parts for h in range(2)]
    evict = [_evict(View(rows, (q, sl(lo, n), a(h), full(W))), View(accs[h, lo], (q, full(n), full(W))), scalar, line)
             for q, lo, n, h, scalar in moved]
    return [Alloc(acc, line=line) for acc in accs.values()] + moves + stay + evict
