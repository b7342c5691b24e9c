"""A ragged K's one-channel remainder, its taps spread over the output partitions: K = 129 (conv_odd) leaves one
out-channel for a second part, whose matmuls each stream the whole band for one column of the stationary (fp32
conv_odd: 5 mixed tiles x 392 columns per band, as long as the 128-channel part's; bf16: 9 taps x 392). Instead:

1. one matmul over the band (mixed taps: the base band of C partitions, X with its halo columns, so a tap's shift is
   a flat offset; a plain band of X's own columns: a matmul group's rows and the R - 1 below) with the channel's
   weights as a stationary of one column per tap: S[j, f] = sum_c W[c, tap j] * band[c, f], every position f of
   the band, the taps on the partitions of the result;
2. S evicted to SBUF and each tap's sums moved to their shifted place by an SBUF -> SBUF DMA: T[j, f] = S[j, f +
   shift_j], so T holds, at the output's positions, what the tap's matmul would add (a plain band: only the
   output columns the tap column reaches, into a zeroed T);
3. one matmul summing the taps: a stationary column of ones over T's partitions, read at the output's rows and
   columns.

Two moving passes instead of one per contraction tile or tap: fp32 conv_odd 480 + 392 columns against 5 x 392 per
band, bf16 448 + 392 against 9 x 392 per group. 16-bit sums are split into a high and a low half (split), so stage
2 runs at the 16-bit rate without rounding the taps' partial sums. Functions of the builder `b`, as conv_mixed.py.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tilec.compiler import conv_weights, ir
from tilec.compiler.build_util import a, sl
from tilec.compiler.ir import DTYPE_BYTES, Alloc, Buf, Dma, Matmul, Reshape, Stmt, View, full, whole
from tilec.compiler.schedule import PMAX, PSUM_BANK

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder


def spreads(b: _ConvBuilder, ks: int) -> bool:
    """Whether the out-channel part of `ks` channels is built spread: the one-channel remainder of mixed taps, one
    matmul group and one column tile per band (stage 1 covers the whole band), stride 1, resident weights, the band
    made once before the parts (the parts innermost: the remainder reads the base band the shared band made), the
    band's flat run within one PSUM bank of fp32, and two moving passes shorter than the tiles' passes."""
    p = b.p
    flat, out = b.in_rows() * b.in_cols(), p.rows * p.tile_x
    rate = 4 if DTYPE_BYTES[b.hbm[b.op.x].dtype] == 4 else 1  # fp32 matmuls at a quarter rate (nki-spec §2.3)
    return (b.mixed > 0 and ks == 1 and b.KR == 1 and len(b.shifts) <= PMAX and b.sy == b.sx == 1 and b.G == 1
            and b.XT == 1 and b.NXB == 1 and b.dup == 1 and b.pair == 1 and b.src_chip is None
            and b.op.w_relu is None and p.hoist_w == "root" and p.order[-1] == "k"
            and flat * 4 <= PSUM_BANK and flat * rate + out * 4 < b.mixed * out * rate)


def spreads_plain(b: _ConvBuilder, ks: int) -> bool:
    """Whether a plain conv's one-channel remainder is built spread: a band of X's own columns (build_conv_cols)
    of one in-channel tile, one column tile, stride and dilation 1, resident weights, the band made once before the
    parts (nest), each group's input rows within one PSUM bank of fp32, and its two moving passes (stage 2 at the
    16-bit rate on the sums' high and low halves, below; fp32 at the quarter rate) shorter than the taps' passes."""
    from tilec.compiler import build_conv_cols
    p = b.p
    flat, out = (p.rows + b.R - 1) * p.tile_x, p.rows * p.tile_x  # (both stages at X's rate: split halves)
    return (ks == 1 and b.KR == 1 and not b.mixed and b.fold == 1 and b.pair == 1 and build_conv_cols.applies(b)
            and b.col0 == 0 and b.op.w_layout == "kc" and b.CT == 1 and not b.CR
            and b.sy == b.sx == b.dy == b.dx == 1 and b.XT == 1 and b.dup == 1 and b.op.w_relu is None
            and not b.stack and PMAX // (b.R * b.S) >= 2 and p.hoist_w == "root" and p.order[-1] == "k"
            and flat * 4 <= PSUM_BANK and p.tile_x == b.W and flat + out < b.R * b.S * out
            and b.W >= b.S)  # (narrower, the band's columns hold no left/right taps: W = 1 summed them all, fuzz 480)


def evicts_on_vector(b: _ConvBuilder) -> bool:
    """The 128-channel parts of a conv whose 16-bit remainder is spread over a plain band evicted by VectorE, not
    ScalarE: a store issues on the stream of the engine that produced its band (perf/schedule.py, dma_streams), and
    ScalarE's stream also carries the taps' high halves' shifting DMAs (taps_plain), which then queued behind the
    128-channel band's store on each DMA engine and held up stage 2 (bf16 conv_odd b8 48.94 -> 48.05 us)."""
    return spreads_plain(b, b.KR) and split(b)


def split(b: _ConvBuilder) -> bool:
    """Stage 2 reads 16-bit sums as a high and a low half (hi = the sum rounded, lo = the rest rounded: their sum
    is the fp32 sum to ~2^-16), so it runs at the 16-bit rate and rounds nothing the unspread matmuls would not."""
    return DTYPE_BYTES[b.hbm[b.op.x].dtype] < 4


def spacing(b: _ConvBuilder) -> int:
    """Partitions between the taps' rows of T: each tap's shifted sums (and their low half, `step // 2` further)
    on partitions of their own DMA engines (the model's: the engines of a DMA's destination partitions, 8 each), so
    the taps' shifts run side by side instead of one after another on the first two engines (bf16 conv_odd: 18
    DMAs of 14 rows per group, 3.6 us; fp32 conv_odd b8 118.9 -> see the note). The rows between stay zero."""
    return min(8, PMAX // (len(b.shifts) if b.mixed else b.R * b.S))


def taps_of(b: _ConvBuilder) -> list[tuple[int, int]]:
    return [(r, s) for r in range(b.R) for s in range(b.S)]


def weights(b: _ConvBuilder) -> list[Stmt]:
    """The remainder channel's weights as a [C, taps] stationary (column j: tap j) and the ones column that sums
    the taps (a zeroed tile plus 1, one row per row of T). Taps in W's own order (r, then s) come in one DMA of one
    descriptor per channel (W[k] is [C, R, S] in HBM): one DMA per tap queued 9 x 67 descriptors ahead of the first
    band's load (bf16 conv_odd batch 1: the band waited ~1 us)."""
    line, taps = b.L["update"], len(b.shifts) if b.mixed else b.R * b.S
    w = b.hbm[b.op.w]
    step = spacing(b)
    b.spread_w = Buf(b.fresh(f"{b.op.w}_spread"), "sbuf", w.dtype, (b.C, taps))
    ones_type = b.hbm[b.op.x].dtype if not b.mixed and split(b) else "f32"
    b.spread_ones = Buf(b.fresh("tap_ones"), "sbuf", ones_type, (step * taps, 1))
    order = b.groups[0] if b.mixed else taps_of(b)
    out: list[Stmt] = [Alloc(b.spread_w, line=line)]
    if list(order) == taps_of(b):
        rs = Buf(b.fresh(f"{b.op.w}_spread_rs"), "sbuf", w.dtype, (b.C, b.R, b.S))
        out += [Reshape(rs, b.spread_w, line),
                Dma(whole(rs), conv_weights.w_view(b, (b.k_start(None), full(b.C), full(b.R), full(b.S))), line)]
    else:
        kslice = sl(b.k_start(None), 1)
        out += [Dma(View(b.spread_w, (full(b.C), sl(j, 1))),
                    replace(conv_weights.w_view(b, (kslice, full(b.C), a(r), a(s))), perm=(1, 0)), line)
                for j, (r, s) in enumerate(order)]
    ones = View(b.spread_ones, (full(step * taps), full(1)))
    return out + [Alloc(b.spread_ones, zero=True, line=line), ir.Scalar(ones, ones, "add", 1.0, line)]


def taps_plain(b: _ConvBuilder, xb: Buf) -> list[Stmt]:
    """A plain band's stage 1 per matmul group (its rows and the R - 1 below, X's own columns), evicted (split
    into high and low halves for 16-bit X), and each tap's sums moved by DMA to its shifted place in the group's
    slot of T, only the output columns the tap column reaches (conv_pairs.tap_columns): T is zeroed first, so a
    column a tap does not reach, and the partitions between the taps, add nothing."""
    from tilec.compiler.build_util import loop
    from tilec.compiler.conv_pairs import tap_columns
    p, line, C = b.p, b.L["update"], b.C
    step, rows, cols = spacing(b), p.rows, p.tile_x
    parts_t = step * b.R * b.S
    in_rows = rows + b.R - 1
    halves = 2 if split(b) else 1
    tdt = b.hbm[b.op.x].dtype if halves == 2 else "f32"
    gv = b.fresh("y_g")
    n_taps, tag = b.R * b.S, str(b.yb[1]) if b.band_tag else ""  # (a band built ahead: names of its own)
    s_ps = Buf(b.fresh(f"taps_acc{tag}"), "psum", "f32", (n_taps, in_rows, cols))
    sums = [Buf(b.fresh(f"taps_{h}{tag}"), "sbuf", tdt, (n_taps, in_rows, cols)) for h in ("hi", "lo")[:halves]]
    b.spread_t = Buf(b.fresh(f"taps_shifted{tag}"), "sbuf", tdt, (parts_t, b.G, rows, cols))
    first = b.step(gv, p.rows, b.cn["rows"], 1)
    whole_s = (full(n_taps), full(in_rows), full(cols))
    body: list[Stmt] = [Alloc(s_ps, zero=True, line=line),
                        Matmul(View(s_ps, whole_s), View(b.spread_w, (full(C), full(n_taps))),
                               View(xb, (full(C), a(0), sl(a(first), in_rows), full(cols))), line)]
    body += [Alloc(buf, line=line) for buf in sums]
    # hi on ScalarE, lo on VectorE: group g + 1's hi runs beside group g's lo (both on VectorE left TensorE waiting
    # 0.5 us per band for the last group's shifts, bf16 conv_odd batch 8)
    body.append(ir.Act(View(sums[0], whole_s), View(s_ps, whole_s), "copy", None, 1.0, line))
    if halves == 2:  # lo = the fp32 sum - hi, rounded
        body.append(ir.Binary(View(sums[1], whole_s), View(s_ps, whole_s), View(sums[0], whole_s), "subtract",
                              line))
    for j, (r, s) in enumerate(taps_of(b)):
        x0, n = tap_columns(b, s)
        for h, buf in enumerate(sums):
            body.append(Dma(View(b.spread_t, (sl(j * step + h * (step // 2), 1), a(gv), full(rows), sl(x0, n))),
                            View(buf, (sl(j, 1), sl(r, rows), sl(x0 + s + b.ox, n))), line))
    return [Alloc(b.spread_t, zero=True, line=line)] + loop(gv, b.G, body, note="the remainder's taps", line=line)


def matmul_plain(b: _ConvBuilder, accv: View) -> list[Stmt]:
    """Stage 2 of a plain band's group: the ones column over its slot of T."""
    n = b.spread_ones.shape[0]
    return [Matmul(accv, View(b.spread_ones, (full(n), full(1))),
                   View(b.spread_t, (full(n), a(b.var["g"]), full(b.p.rows), full(b.p.tile_x))), b.L["update"])]


def taps(b: _ConvBuilder) -> list[Stmt]:
    """Stage 1 (the taps' sums on their partitions), its eviction and the taps' shifts, made with the band before
    the out-channel parts (conv_mixed.x_band): TensorE runs in order, so the 128-channel part's matmuls come
    between stage 1 and stage 2 and the eviction and the shifts' DMAs run under them (placed beside stage 2, they
    held TensorE for a DMA latency every band: fp32 conv_odd batch 8 135.2 -> 160.8 us)."""
    line, n_taps, C = b.L["update"], len(b.shifts), b.C
    n_rows, n_cols = b.in_rows(), b.in_cols()
    flat = n_rows * n_cols
    dtype = "f32"  # the taps' partial sums kept in fp32 (stage 2 reads them with the fp32 ones)
    s_ps = Buf(b.fresh("taps_acc"), "psum", "f32", (n_taps, flat))
    s_sb = Buf(b.fresh("taps_sb"), "sbuf", dtype, (n_taps, flat))
    step = spacing(b)
    b.spread_t = Buf(b.fresh("taps_shifted"), "sbuf", dtype, (step * n_taps, n_rows, n_cols))
    t_flat = Buf(b.fresh("taps_shifted_flat"), "sbuf", dtype, (step * n_taps, flat))
    out: list[Stmt] = [Alloc(s_ps, zero=True, line=line),
                       Matmul(View(s_ps, (full(n_taps), full(flat))), View(b.spread_w, (full(C), full(n_taps))),
                              b.base_flat, line),
                       Alloc(s_sb, line=line), ir.Copy(View(s_sb, (full(n_taps), full(flat))),
                                                       View(s_ps, (full(n_taps), full(flat))), line),
                       Alloc(b.spread_t, zero=step > 1, line=line), Reshape(t_flat, b.spread_t, line)]
    for j, (r0, s0) in enumerate(b.shifts):
        shift = r0 * n_cols + s0
        out.append(Dma(View(t_flat, (sl(j * step, 1), sl(0, flat - shift))),
                       View(s_sb, (sl(j, 1), sl(shift, flat - shift))), line))
    return out


def matmul(b: _ConvBuilder, accv: View, rows, cols) -> list[Stmt]:
    """Stage 2: the ones column sums the shifted taps into accv, at the band copies' rows and columns."""
    n = b.spread_ones.shape[0]
    return [Matmul(accv, View(b.spread_ones, (full(n), full(1))), View(b.spread_t, (full(n), rows, cols)),
                   b.L["update"])]


def ahead(parts: list[list[Stmt]]) -> list[Stmt]:
    """Peeled bands (conv_odd at batch 1: two) with band i + 1's block, its load and stage 1, placed right after
    band i's block. TensorE runs in program order: band i + 1's stage 1 came after band i's 128-channel matmuls
    and stage 2, so its eviction and 18 shifting DMAs (a DMA latency) ran after them too and the last band's
    stage 2 waited 1.37 us for them (bf16 conv_odd b1); a band ahead, they run under band i's matmuls. The
    bands' buffers then live at once, so each has its own names (build_conv.band_tag)."""
    if not all(p and isinstance(p[0], ir.Block) for p in parts):
        return [s for p in parts for s in p]
    out = [parts[0][0]]
    for i, p in enumerate(parts):
        out += ([parts[i + 1][0]] if i + 1 < len(parts) else []) + list(p[1:])
    return out
