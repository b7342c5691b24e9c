"""Filter taps folded into the contraction partitions (few input channels: C = 3 uses 3 of 128): copy j of the input
band, on partitions [j*C, (j+1)*C), holds X shifted by tap delta j, so one matmul covers a group of taps (the C = 3
first layer: 9 taps in one matmul over 27 partitions instead of 9 over 3). Also the eviction into a folded on-chip
image (conv_chain.OnChip.copies), where a chain's producer writes each copy itself.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tilec.compiler import conv_mixed, conv_weights, ir
from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.ir import Aff, Alloc, Buf, Dma, Matmul, Reshape, Stmt, Term, View, full
from tilec.compiler.schedule import PMAX

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder


def fold_groups(r: int, s: int, fold: int) -> list[list[tuple[int, int]]]:
    """Tap groups for `fold` taps per matmul: the deltas are the first `fold` taps (row-major); each group is a
    base tap plus the longest prefix of the deltas that lands on taps not yet covered (3x3 taps 2 at a time:
    [(r, 0), (r, 1)], [(r, 2)] for each r; 9 at a time: one group)."""
    taps = [(i, j) for i in range(r) for j in range(s)]
    deltas = taps[:fold]
    covered: set[tuple[int, int]] = set()
    groups = []
    for base in taps:
        if base in covered:
            continue
        group = []
        for dr, ds in deltas:
            tap = (base[0] + dr, base[1] + ds)
            if tap[0] >= r or tap[1] >= s or tap in covered:
                break
            group.append(tap)
        covered.update(group)
        groups.append(group)
    return groups


def column_groups(b: _ConvBuilder) -> list[list[tuple[int, int]]]:
    """Tap groups for a band of X's own columns (no halo columns): copy j holds X shifted by delta j (the first
    `fold` taps, as fold_groups), and a group's taps must reach the same output columns (conv_pairs.tap_columns),
    since its matmul reads every copy at the same columns and a copy's columns past X's edge hold the next row's
    elements, not zeros. Bases reaching every output column come first (the accumulator's first matmul writes all
    of them): 3x3 stride 2 pad 1 gives [(r, 1), (r, 2)] for each r, then [(r, 0)] on output columns 1.. alone."""
    from tilec.compiler.conv_pairs import tap_columns
    taps = [(i, j) for i in range(b.R) for j in range(b.S)]
    deltas = taps[:b.fold]
    reach = {s: tap_columns(b, s) for s in range(b.S)}
    covered: set[tuple[int, int]] = set()
    groups = []
    for base in sorted(taps, key=lambda t: reach[t[1]] != (0, b.Wo)):
        if base in covered or reach[base[1]][1] == 0:
            continue
        group = []
        for dr, ds in deltas:
            tap = (base[0] + dr, base[1] + ds)
            if tap[0] >= b.R or tap[1] >= b.S or tap in covered or reach[tap[1]] != reach[base[1]]:
                break
            group.append(tap)
        covered.update(group)
        groups.append(group)
    return groups


def weights_folded(b: _ConvBuilder, wt: Buf, kv: str | None, ks: int, local: bool) -> list[Stmt]:
    """The stationary block of each tap group: rows j*C + c hold W[k, c, tap j of the group]; k-major weights
    are gathered per tap into rows [k, j*C + c] and transposed on TensorE once per group."""
    if b.mixed:  # the copies cut into contraction tiles of 128
        return conv_mixed.weights(b, wt, kv, ks, local)
    op, p, line, C = b.op, b.p, b.L["update"], b.C
    kslice = sl(b.k_start(kv), ks)
    kdst = b.part(ks, p.tile_k) if local else kslice
    if op.w_layout == "ck":
        return [Dma(View(wt, (sl(j * C, C), a(g), kdst)), conv_weights.w_view(b, (full(C), kslice, a(r), a(s))), line)
                for g, taps in enumerate(b.groups) for j, (r, s) in enumerate(taps)]
    rows = Buf(b.fresh(f"{op.w}_rows"), "sbuf", wt.dtype, (p.tile_k, C, b.R, b.S))
    raw = Buf(b.fresh(f"{op.w}_taps"), "sbuf", wt.dtype, (p.tile_k, len(b.groups), b.fold * C))
    tp = Buf(b.fresh(f"{op.w}_tp"), "psum", wt.dtype, (b.fold * C, p.tile_k))
    kp = b.part(ks, p.tile_k)
    # W's rows in one contiguous DMA, regrouped by tap on chip; zeroed: a last group of fewer taps transposes
    # zeros into its unused rows (one loop over the groups)
    whole_w = (full(C), full(b.R), full(b.S))
    # a grouped conv's rows placed block-diagonally (zeros outside each out-channel's group), then folded alike
    load: list[Stmt] = conv_weights.weights_grouped(b, rows, kv, ks) if op.groups > 1 else \
        [Alloc(rows, line=line), Dma(View(rows, (kp,) + whole_w), conv_weights.w_view(b, (kslice,) + whole_w), line)]
    # a chain producer's stationary duplicated per copy (b.dup) copies all fold * C rows: keep the loop, which
    # writes every row (test_conv_onchip's folded-taps case read the rows a short group left unwritten)
    if op.groups == 1 and b.dup == 1:
        return load + [Alloc(raw, line=line)] + weights_by_group(b, wt, (rows, raw, tp), kp, kdst)
    out: list[Stmt] = load + [Alloc(raw, zero=len(b.groups[-1]) < b.fold, line=line)]
    out += [ir.Copy(View(raw, (kp, a(g), sl(j * C, C))), View(rows, (kp, full(C), a(r), a(s))), line)
            for g, taps in enumerate(b.groups) for j, (r, s) in enumerate(taps)]
    gv = b.fresh("tap_g")
    tpv = View(tp, (full(b.fold * C), kp))
    body: list[Stmt] = [Alloc(tp, line=line),
                        ir.Transpose(tpv, View(raw, (kp, a(gv), full(b.fold * C))), "pe", line),
                        ir.Copy(View(wt, (full(b.fold * C), a(gv), kdst)), tpv, line)]
    return out + loop(gv, len(b.groups), body, note="tap groups", line=line)


def weights_by_group(b: _ConvBuilder, wt: Buf, bufs: tuple[Buf, Buf, Buf], kp: ir.Sl, kdst: ir.Sl) -> list[Stmt]:
    """Each group's gathers, its transpose and its eviction in turn (unrolled), the copies alternating VectorE and
    ScalarE (exact: fp32 holds every f16/bf16 value), a group of fewer taps transposing only its own rows (no
    memset of the gathered rows): the first group's stationary is ready after its own gathers, not after every
    gather behind a memset (conv3x3s2 f32 batch 1: the first matmul waited for a 0.9 us memset and 9 gathers)."""
    rows, raw, tp = bufs
    line, C = b.L["update"], b.C
    moves: list[tuple[View, View]] = []
    out: list[Stmt] = []
    for g, taps in enumerate(b.groups):
        n = len(taps) * C
        for j, (r, s) in enumerate(taps):
            moves.append((View(raw, (kp, a(g), sl(j * C, C))), View(rows, (kp, full(C), a(r), a(s)))))
            out.append(_copy(moves[-1], len(moves), line))
        tpv = View(tp, (sl(0, n), kp))
        moves.append((View(wt, (sl(0, n), a(g), kdst)), tpv))
        out += [Alloc(tp, line=line), ir.Transpose(tpv, View(raw, (kp, a(g), sl(0, n))), "pe", line),
                _copy(moves[-1], len(moves), line)]
    return out


def _copy(move: tuple[View, View], i: int, line: int) -> Stmt:
    """A copy on VectorE or, every other one, on ScalarE (an activation copy)."""
    dst, src = move
    return ir.Act(dst, src, "copy", None, 1.0, line) if i % 2 == 0 else ir.Copy(dst, src, line)


def x_band_folded(b: _ConvBuilder, xb: Buf) -> list[Stmt]:
    """Copy j of the band (partitions j*C..) holds X shifted by tap delta j (the first group's taps): the rows
    and columns it needs, [0, band - delta), clipped to X (the rest of a padded read's halo stays zero)."""
    if b.mixed:
        return conv_mixed.x_band(b, xb)
    p, line, V, C = b.p, b.L["update"], b.var, b.C
    rows, cols = b.in_rows(), b.in_cols()
    start = b.y_at(p.band * b.sy, b.cn["band"] if b.sy == 1 else "").plus(b.oy)
    band = b.yb[1] * p.band * b.sy + b.oy  # a peeled band's first input row (static)
    out: list[Stmt] = []
    halo = False
    # copy row t holds X row r0 + step * t of the band (phased halves: the even output rows' input rows)
    step = 2 * b.sy if b.phased else b.sy if b.halves else 1
    flat = FlatLoads(b, xb, start) if step == 1 and flat_rows(b) else None
    for j, (r0, c0) in copy_order(b):
        need = b.copy_rows() if b.halves else rows - r0  # the rows of X this copy holds
        top, bottom = clip_rows(b, band + r0, need, step) if b.yb[0] is None else (0, 0)
        left, right = b.clip(b.col0 + c0, cols - c0, b.W)
        n_rows, n_cols = need - top - bottom, cols - c0 - left - right
        halo = halo or (top, bottom, left, right) != (0, 0, 0, 0)
        if n_rows <= 0 or n_cols <= 0:
            continue
        if flat is not None and c0 > 0 and (left, right) == (0, 0) and n_cols == b.W - c0:
            out += flat.load(j, r0 + top, c0, n_rows, top)
            continue
        for c, n in engine_pieces(b, j):
            out.append(Dma(View(xb, (sl(b.copy_at(j) + c, n), a(0), sl(top, n_rows), sl(left, n_cols))),
                           View(b.x4, (a(V["n"]), sl(c, n) if n < C else full(C),
                                          sl(start.plus(r0 + top * step), n_rows, step),
                                          sl(b.col0 + c0 + left, n_cols))), line))
    if b.zero_rows is not None:  # halo rows (no halo columns): copied from the zero tile before the loads
        own = copy_halo_spans(b, b.yb[1])
        spans = [(0, b.zero_rows.shape[0], first, count) for first, count in halo_spans(b, b.yb[1])] \
            if own is None else own
        zeros: list[Stmt] = [ir.Copy(View(xb, (sl(p0, n), a(0), sl(first, count), full(cols))),
                                     View(b.zero_rows, (sl(p0, n), sl(0, count), full(cols))),
                                     line, "gpsimd") for p0, n, first, count in spans if b.yb[0] is None]
        return [Alloc(xb, line=line)] + zeros + out
    from tilec.compiler import conv_halo  # (conv_halo reads this module's clip_rows)
    if p.x_bufs != 1 and b.slots == 1:  # the halo alone zeroed when the zero tiles serve the band
        return ((conv_halo.zeroed(b, xb, b.yb[1], b.yb[0] is None) if halo else None)
                or [Alloc(xb, zero=halo, line=line)]) + out
    if b.slots > 1 and halo:  # a band slot: its halo copied from the zero tiles (conv_halo.slots_serve)
        return (conv_halo.zeroed(b, xb, b.yb[1], b.yb[0] is None) or []) + out
    return out


def spread(b: _ConvBuilder) -> tuple[int, ...]:
    """First partitions of band halves' copies packed C apart (Q = C) spread over every DMA engine (8 partitions
    each, DMAINTRO): each engine holds at most its share of the copies' partitions, rounded up, a copy straddling
    two engines counted on both (its load is cut at the boundary: engine_pieces). The f32 stem's 36 copies of 3
    channels: 108 partitions on engines 0-13, 9 partitions' bytes on some engines (a straddling load's bytes are
    shared evenly) -> at most 7 on each of the 16 (stem7x7s2 f32 batch 8: 261.38 -> 227.47 us run). () when nothing
    is gained."""
    from tilec.target import invariant
    n_dma, C, copies = invariant("dma_engines"), b.C, len(b.shifts)
    ppe = PMAX // n_dma
    cap = -(-(copies * C) // n_dma)
    if not b.halves or b.mixed or C > cap or cap >= ppe or -(-(copies * C) // ppe) >= n_dma:
        return ()
    return place(copies, C, [cap] * n_dma)


def place(copies: int, C: int, caps: list[int]) -> tuple[int, ...]:
    """First partitions of `copies` copies of C partitions, each as low as it goes without DMA engine e holding
    more than caps[e] of their partitions (8 partitions an engine; a copy straddling two counts on both), () when
    they do not fit the 128 partitions."""
    ppe = PMAX // len(caps)
    held, out, p = [0] * len(caps), [], 0
    for _ in range(copies):
        while p + C <= PMAX and any(held[e] + n > caps[e] for e, n in _per_engine(p, C, ppe)):
            p += 1
        if p + C > PMAX:
            return ()
        for e, n in _per_engine(p, C, ppe):
            held[e] += n
        out.append(p)
        p += C
    return tuple(out)


def _per_engine(p0: int, n: int, ppe: int) -> list[tuple[int, int]]:
    """(engine, partitions) of the partitions [p0, p0 + n)."""
    cuts = [p0] + list(range((p0 // ppe + 1) * ppe, p0 + n, ppe)) + [p0 + n]
    return [(lo // ppe, hi - lo) for lo, hi in zip(cuts, cuts[1:])]


def engine_pieces(b: _ConvBuilder, j: int) -> list[tuple[int, int]]:
    """(first channel, channels) of copy j's loads: spread copies (spread) one load per DMA engine they touch, so
    each engine moves its own partitions' bytes; else one load."""
    from tilec.target import invariant
    if not b.at:
        return [(0, b.C)]
    pieces, c = [], 0
    for _, n in _per_engine(b.copy_at(j), b.C, PMAX // invariant("dma_engines")):
        pieces.append((c, n))
        c += n
    return pieces


def spread_weights(b: _ConvBuilder, raw: Buf) -> tuple[Buf, list[Stmt]]:
    """The gathered stationary rows (copy j at j * C: conv_pairs.gather_halves, `gathered`) moved to the spread
    copies' columns (copy_at(j)) of a zeroed buffer, one copy per run of copies that stay C apart, alternating
    VectorE and ScalarE."""
    C, Q, line = b.C, gathered(b), b.L["update"]
    wide = Buf(b.fresh(f"{raw.name}_spread"), "sbuf", raw.dtype, raw.shape[:2] + (b.copy_parts(len(b.shifts)),))
    runs: list[list[int]] = []
    for j in range(len(b.shifts)):
        if runs and b.copy_at(j) == b.copy_at(runs[-1][-1]) + C:
            runs[-1].append(j)
        else:
            runs.append([j])
    out: list[Stmt] = [Alloc(wide, zero=True, line=line)]
    for i, run in enumerate(runs):
        n = len(run) * C
        dst = View(wide, (full(raw.shape[0]), full(raw.shape[1]), sl(b.copy_at(run[0]), n)))
        src = View(raw, (full(raw.shape[0]), full(raw.shape[1]), sl(run[0] * Q, n)))
        out.append(ir.Act(dst, src, "copy", None, 1.0, line) if i % 2 else ir.Copy(dst, src, line))
    return wide, out


def gathered(b: _ConvBuilder) -> int:
    """Columns between band halves' copies in their gathered stationary rows: Q, or C when spread_weights moves
    them to their partitions (the moves then take runs of copies, not one copy each: the stem chain's 27 placed
    copies in 12 moves, not 27)."""
    return b.C if b.at else b.Q


def flat_rows(b: _ConvBuilder) -> bool:
    """Whether the band's copies hold whole rows of X with nothing around them (no padded read, no column band,
    one channel tile): a copy shifted by c0 columns is then X's run from row r0, column c0 on, read flat, if the
    band's rows fit one access-pattern dimension (target.ap_dim_max, a uint16 size, on every target)."""
    from tilec.target import TARGETS
    return (b.src_chip is None and not b.op.x_transposed and b.col0 == 0 and b.NXB == 1
            and b.in_cols() == b.W and b.CTB == 1
            and b.in_rows() * b.W <= min(t.ap_dim_max for t in TARGETS.values()))


class FlatLoads:
    """The loads of the copies shifted by c0 > 0 columns, as one contiguous run per partition (one DMA descriptor)
    instead of one per row: with whole rows of X, copy row t, column x (< W - c0) holds X row r0 + t, column c0 + x,
    which is element (r0 + t) * W + c0 + x of the flattened image, and element t * W + x of the flattened copy. So
    the copy's n rows are the n * W - c0 elements of X from row r0, column c0 on. Its last c0 columns of each row
    but the last then hold the next row's first columns instead of nothing: no tap reads them (a copy's column x
    is read for X column c0 + x < W only). The 16-bit conv_c3 band copy: 48 descriptors of 450 B -> 3 of 7,230 B."""

    def __init__(self, b: _ConvBuilder, xb: Buf, start: Aff) -> None:
        self.b, self.xb, self.start = b, xb, start
        self.views: list[Stmt] = []  # the two flat views, made before the band's first flat load
        self.xf = Buf(b.fresh(f"{xb.name}_flat"), "sbuf", xb.dtype, (xb.shape[0], xb.shape[2] * xb.shape[3]))
        self.x3 = Buf(b.fresh(f"{b.op.x}_flat"), "hbm", b.x4.dtype, (b.N, b.C, b.H * b.W))

    def load(self, j: int, r0: int, c0: int, n_rows: int, top: int = 0) -> list[Stmt]:
        """Copy j's rows top.. (its first `top` rows lie above X: halo, zeroed apart), X's rows from r0 on."""
        b, line, W = self.b, self.b.L["update"], self.b.W
        out: list[Stmt] = []
        if not self.views:
            self.views = [Reshape(self.xf, self.xb, line), Reshape(self.x3, b.x4, line)]
            out += self.views
        first = Aff(tuple(Term(t.var, t.coef * W) for t in self.start.terms), (self.start.const + r0) * W + c0)
        n = n_rows * W - c0
        out.append(Dma(View(self.xf, (sl(b.copy_at(j), b.C), sl(top * W, n))),
                       View(self.x3, (a(b.var["n"]), full(b.C), sl(first, n))), line))
        return out


def halo_spans(b: _ConvBuilder, index: int) -> list[tuple[int, int]]:
    """(first row, count) of the band buffer to zero for band `index` of a band without halo columns (row pairs
    over X's own columns): the rows some copy holds outside X, above and below, each span over every copy's
    partitions (an engine access of C partitions may not start at partition C when C is not 64 or 32: the
    loads come after the copy and rewrite what another copy holds there). The copies run on GpSimdE, idle
    while VectorE prepares the weights."""
    band = index * b.p.band * b.sy + b.oy
    spans = []
    tops, bottoms = [], []
    for r0, _ in b.shifts:
        need = b.in_rows() - r0
        top, bottom = clip_rows(b, band + r0, need, 1)
        tops.append(min(top, need))
        if bottom and top < need:
            bottoms.append((need - bottom, need))
    if max(tops):
        spans.append((0, max(tops)))
    if bottoms:
        lo, hi = min(f for f, _ in bottoms), max(e for _, e in bottoms)
        spans.append((lo, hi - lo))
    return spans


def copy_halo_spans(b: _ConvBuilder, index: int) -> list[tuple[int, int, int, int]] | None:
    """(first partition, partitions, first row, rows) of each copy's own halo rows in band `index`, when every copy
    may be reached on its own (C = 32 or 64 partitions, Q = C apart: aligned starts, nki-spec §1.6), else None.
    A copy whose rows all lie inside X is then left alone, so its load does not wait for a zero copy (row pairs'
    copy 1 in the first band: bf16 conv3x3same's first matmul waited 0.4 us for it)."""
    if b.C not in (32, 64) or b.Q != b.C:
        return None
    band = index * b.p.band * b.sy + b.oy
    out = []
    for j, (r0, _) in enumerate(b.shifts):
        need = b.in_rows() - r0
        top, bottom = clip_rows(b, band + r0, need, 1)
        top = min(top, need)
        if top:
            out.append((j * b.Q, b.C, 0, top))
        if bottom and top < need:
            out.append((j * b.Q, b.C, need - bottom, bottom))
    return out


def clip_rows(b: _ConvBuilder, first: int, count: int, step: int) -> tuple[int, int]:
    """(rows before X, rows after X) of the rows first + step * t, t < count: a copy's halo rows."""
    inside = [t for t in range(count) if 0 <= first + step * t < b.H]
    return (inside[0], count - 1 - inside[-1]) if inside else (count, 0)


def copy_order(b: _ConvBuilder) -> list[tuple[int, tuple[int, int]]]:
    """The band copies (j, tap delta) in the order their loads are issued: round robin over the DMA engines
    their partitions belong to (8 partitions each), so consecutive loads of a few partitions run side by side
    instead of queueing behind each other on one engine."""
    copies = list(enumerate(b.shifts))
    engine = lambda j: b.copy_at(j) // 8  # noqa: E731
    rank = {j: sum(1 for i, _ in copies[:j] if engine(i) == engine(j)) for j, _ in copies}
    return sorted(copies, key=lambda c: (rank[c[0]], engine(c[0])))


def matmuls_folded(b: _ConvBuilder, accv: View, wt: Buf, kidx) -> list[Stmt]:
    """One matmul per tap group: its base tap shifts every copy of the band (copy j then reads tap base + j)."""
    if b.mixed:
        return conv_mixed.matmuls(b, accv, wt, kidx)
    from tilec.compiler.conv_pairs import tap_columns
    p, V, C, sy, sx = b.p, b.var, b.C, b.sy, b.sx
    out: list[Stmt] = []
    for g, taps in enumerate(b.groups):
        br, bs = taps[0]
        parts = sl(0, len(taps) * C)
        first = a(b.step(V["g"], p.rows, b.cn["rows"], sy), br * b.dy, b.g0 * sy)  # (g0: conv_split)
        if b.src_chip is not None:  # the image in SBUF is read at the band's rows
            first = first.plus(b.y_at(p.band * sy, b.cn["band"] if sy == 1 else ""))
        rows = sl(first, p.rows, sy, b.cn["rows"] if sy == 1 else "")
        cols = sl(a(b.step(V["x"], p.tile_x, b.cn["x"], sx), bs * b.dx), p.tile_x, sx,
                  b.cn["x"] if sx == 1 else "")
        acc = accv
        if b.col0 != b.ox:  # a band of X's own columns (column_groups): the output columns the group reaches
            x0, n = tap_columns(b, bs)
            cols = sl(x0 * sx + bs * b.dx + b.ox, n, sx)
            acc = View(accv.buf, accv.idx[:-1] + (sl(x0, n),))
        out.append(Matmul(acc, View(wt, (parts, a(g), kidx)), View(b.x_band_buf(), (parts, a(0), rows, cols)),
                          b.L["update"]))
    return out


def chip_copies(b: _ConvBuilder, acc: View) -> list[tuple[View, View, ir.Sl]]:
    """A folded image (conv_chain.OnChip.copies): (destination, accumulator part, its partitions) per copy j,
    which holds T shifted by (dr, dc): output row y, column x at (y - row0 - dr, x - col0 - dc); a column that
    would land left of the image is left out (one column tile per row, so the clip is static)."""
    chip, p, V = b.dst_chip, b.p, b.var
    assert chip is not None and b.pair == 1 and b.KT == 1 and not b.KR
    first = a(term(V["g"], p.rows, b.cn["rows"])).plus(b.y_at(p.band, b.cn["band"]))
    out = []
    for j, (dr, dc) in enumerate(chip.copies):
        kp = sl(j * b.K, b.K)
        skip = max(0, chip.col0 + dc) if b.XT == 1 else 0
        assert b.XT == 1 or chip.col0 + dc <= 0
        if skip >= p.tile_x:  # every column lands left of the copy (it holds only halo: stays zero)
            continue
        cols = sl(a(term(V["x"], p.tile_x, b.cn["x"]), skip - chip.col0 - dc), p.tile_x - skip)
        dst = View(chip.buf, (kp, a(0), sl(first.plus(-chip.row0 - dr), p.rows), cols))
        out.append((dst, View(acc.buf, (kp, full(p.rows), sl(skip, p.tile_x - skip))), kp))
    return out
