"""The window pools' choices from the model's costs (rules_pool.py): whether the pass along x reads X through
PSUM or TensorE sums its taps (`psum_choice`), the whole rows TensorE sums (`peeled_whole`), and the per-band
estimates behind them."""

from __future__ import annotations

from dataclasses import dataclass

from tilec.compiler import build_util
from tilec.compiler import pool_knobs as knobs
from tilec.compiler.ir import DTYPE_BYTES, whole
from tilec.compiler.ops import PoolOp
from tilec.compiler.pool_doubling import combines
from tilec.compiler.pool_segments import border_copies, border_pairs, eviction_runs, pad_runs, segments
from tilec.compiler.schedule import PMAX, PoolPlan, best_divisor, divisors, window_pool_plan
from tilec.target import compiled


@dataclass(frozen=True)
class PsumChoice:
    rows: int  # input rows per PSUM chunk (one bank)
    y_share: float | None  # VectorE's part of the pass along y (None: the SBUF form's share)
    taps: bool  # TensorE sums the pass along x's taps (16-bit sums) rather than copying X for VectorE
    whole: int = 0  # with the taps: output rows per band TensorE sums whole (`full_rows`), off the pass along y


def psum_choice(op: PoolOp, band: int, bands: int, x: str, out: str,
                tiles: int = knobs.PEEL_TILES, peeled: bool = True) -> PsumChoice | None:
    """How the pass along x of a pool computed in `bands` bands of `band` output rows uses PSUM, or None. TensorE,
    idle in a pool, either copies each chunk of a band's input rows there with an identity matmul (VectorE's
    tensor_tensor then streams 1 cycle per element instead of 2, but GpSimdE, which cannot read PSUM, leaves that
    pass to VectorE and takes more of the pass along y), or, for a sum of 16-bit data, sums the taps there itself
    (one accumulating identity matmul per tap: 16-bit matmuls stream 2.4 columns per ns, faster than any other
    engine) for ScalarE to evict, leaving VectorE and GpSimdE only the pass along y: chosen when the model's costs
    (psum_costs, taps_costs) make the bands' busiest engine faster that way by more than the identity matrix's
    set-up (identity_ns). `tiles`: partition tiles; with fewer than PEEL_TILES (no peeled first tile beside
    TensorE's warm-up throttle) the taps' whole rows are picked with the throttle's hold counted (`throttled`);
    `peeled` False: the pool could not peel its first tile (its buffers did not fit), so every tile runs the taps and
    the band's own estimate picks the whole rows (peeled_whole's peeled tile is not there)."""
    w = op.window
    assert w is not None
    W, Wo = op.dim("W"), w.out[1]
    if op.relu or (op.pool.wx, w.stride[1], w.offset[1], Wo) == (1, 1, 0, W) or knobs.PSUM == "off":
        return None
    chunk = min(compiled().psum_bank_bytes // 4, compiled().moving_fmax) // W
    if chunk < 1:
        return None
    rows = (band - 1) * w.stride[0] + op.pool.wy
    tmp = "f32" if op.pool.op == "add" else x
    y_pass = (op.pool.wy, w.stride[0], w.offset[0]) != (1, 1, 0)
    edges = border_copies(segments(Wo, w.offset[1], w.stride[1], op.pool.wx, W), op.pool.wx)
    sbuf, psum, share = psum_costs(x, tmp, out, rows, band, Wo, W, op.pool.wx, op.pool.wy if y_pass else 1, chunk,
                                   edges)
    setup = identity_ns(2 if x in ("f16", "bf16") else 4)  # the identity's on-chip build, paid once
    segs = segments(Wo, w.offset[1], w.stride[1], op.pool.wx, W)
    reach = [sum(g.size for g in segs if t in g.taps) for t in range(op.pool.wx)]
    taps = None
    if x in ("f16", "bf16") and op.pool.op == "add" and any(r == Wo for r in reach) and knobs.TAPS != "off":
        # (count_include_pad=False: the columns' counts in the evictions, the rows' on VectorE in the pass along y)
        chunk_t = min(compiled().psum_bank_bytes // 4, compiled().moving_fmax) // Wo
        runs = len(eviction_runs(segs, op.pool.wx, w.count == "inside"))
        ysegs = segments(w.out[0], w.offset[0], w.stride[0], op.pool.wy, op.dim("H")) if y_pass else []
        ends = [g for g in ysegs if len(g.taps) < op.pool.wy]
        counts = len(ends) if w.count == "inside" else 0  # (at most, per band)
        if counts == 2 and knobs.PAIR_ENDS and all(g.size == 1 for g in ends) and \
                len(ends[0].taps) == len(ends[1].taps):
            counts = 1  # the two ends of a padding of one: scaled by one instruction (counted_pass)
        if chunk_t >= 1:
            wy, taken = op.pool.wy if y_pass else 1, [r for r in reach if r]
            costs = [taps_costs(rows, band, Wo, taken, wy, chunk_t, runs, counts, k)
                     for k in range(min(band, chunk_t) + 1 if wy > 1 and knobs.FULL_ROWS is None else 1)]
            # the fewest whole rows within WHOLE_SLACK of the best (each row of them adds wy matmuls per tap)
            whole = next(k for k, c in enumerate(costs) if c <= min(costs) * (1 + knobs.WHOLE_SLACK))
            fewest = whole  # (the taps against the SBUF form below: with the band's estimate of `whole` rows)
            if tiles >= knobs.PEEL_TILES and len(costs) > 1 and knobs.WHOLE_PEELED and peeled:
                fewest = peeled_whole(op, rows, band, bands // tiles, bands, Wo, taken, wy, chunk_t, runs, counts,
                                      sbuf, len(costs))
            if tiles < knobs.PEEL_TILES:  # nothing peeled runs beside TensorE's warm-up throttle: with few bands its
                # hold can end the kernel (measured, bf16 avgpool 3x3 s1 batch 1: whole rows 3 -> 0, 8.52 -> 8.15 us)
                totals = [max(bands * c, throttled(bands * taps_costs(rows, band, Wo, taken, wy, chunk_t, runs,
                                                                       counts, k, "tensor")))
                          for k, c in enumerate(costs)]
                fewest = next(k for k, c in enumerate(totals) if c <= min(totals) * (1 + knobs.WHOLE_SLACK))
            # (chosen or not with the costs of `whole` rows)
            taps = chunk_t, costs[whole], fewest if knobs.FULL_ROWS is None else knobs.FULL_ROWS
    # (the set-up counted twice for the taps: they leave the pass along x to TensorE, so until the identity is
    # there, no engine starts a band; the copies' pass along x waits for it too, but VectorE starts the rest.
    # Both forms also expose one band's time: their engines work in a chain, TensorE -> VectorE -> GpSimdE, which
    # fills at the first band and drains at the last, where the SBUF form splits each pass between two engines)
    if taps is not None and (taps[1] < psum or knobs.TAPS == "on") and (
            bands * (sbuf - taps[1]) > 2 * setup + taps[1] or knobs.PSUM == "on"):
        return PsumChoice(taps[0], None, True, taps[2])
    return PsumChoice(chunk, share, False) if bands * (sbuf - psum) > setup + psum or knobs.PSUM == "on" else None


def peeled_whole(op: PoolOp, rows: int, band: int, per: int, bands: int, wo: int, reach: list[int], wy: int,
                 chunk: int, runs: int, counts: int, sbuf: float, most: int) -> int:
    """The whole rows per band (`full_rows`) of a pool whose first partition tile is peeled (PEEL_TILES): that tile's
    `per` bands run in the SBUF form on VectorE and GpSimdE (`sbuf` ns each, psum_costs) while TensorE starts the
    others' taps, so the vector engines' pass along y of the other bands comes after them; TensorE's taps, ahead of
    the chain, leave the last band's pass along y after them; ScalarE evicts. The fewest rows whose kernel-long
    busiest engine is within WHOLE_SLACK of the best. A band's estimate alone (taps_costs) balances TensorE against
    the vector engines and misses the peeled tile's head start (measured, bf16 avgpool 3x3 s1 batch 8, 28 x 28:
    3 whole rows 43.44 us, 4 42.67, 5 41.98, 6 43.39). The taps' input rows: those inside X (the padding is not
    loaded), averaged over a tile's bands."""
    w = op.window
    assert w is not None
    H, sy, oy = op.dim("H"), w.stride[0], w.offset[0]
    inside = sum(max(0, min(H, b * band * sy + oy + rows) - max(0, b * band * sy + oy)) for b in range(per))
    loaded = max(1, round(inside / per))
    rest = bands - per  # the bands through TensorE's taps
    totals = []
    for k in range(most):
        tensor = taps_costs(loaded, band, wo, reach, wy, chunk, runs, counts, k, "tensor")
        scalar = taps_costs(loaded, band, wo, reach, wy, chunk, runs, counts, k, "scalar")
        vector = taps_costs(loaded, band, wo, reach, wy, chunk, runs, counts, k, "vector")
        totals.append(max(rest * tensor + vector, rest * scalar, per * sbuf + rest * vector))
    return next(k for k, c in enumerate(totals) if c <= min(totals) * (1 + knobs.WHOLE_SLACK))


def throttled(busy: float) -> float:
    """When TensorE finishes `busy` ns of back-to-back work under Trn2's warm-up throttle as the model applies it
    (tilec/perf/throttle.py: at most start_fraction of the first ramp_ns busy, then full speed)."""
    from tilec.perf.params import target_params
    prm = {name: value for name, value, _ in target_params(compiled().name).table()}
    f0, ramp = prm["throttle_start_fraction"], prm["throttle_ramp_ns"]
    if f0 >= 1.0 or ramp <= 0.0 or busy <= f0 * ramp:
        return busy
    return ramp + busy - f0 * ramp


def taps_costs(rows: int, n: int, wo: int, reach: list[int], wy: int, chunk: int, runs: int = 1,
               counts: int = 0, whole: int = 0, engine: str = "") -> float:
    """A band's busiest engine (ns) when TensorE sums the pass along x's taps (16-bit moving data; reach: the
    outputs each tap reaches) over chunks of `chunk` input rows, ScalarE evicts each chunk in `runs` runs of columns
    (count_include_pad=False: one per column count; and copies the pass along y's two border rows), VectorE and
    GpSimdE share the pass along y's wy - 1 combines of n x wo elements from SBUF (fp32: 2 cycles per element on
    both) and VectorE scales `counts` runs of border rows (count_include_pad=False), from the model's costs
    (tilec/perf/costs.py, params.py); whole: output rows TensorE sums whole instead (`full_rows`: wy matmuls per
    tap, one more eviction per run, those rows off the pass along y)."""
    from tilec.perf.params import target_params
    prm = {name: value for name, value, _ in target_params(compiled().name).table()}
    mn, sv, ss = prm["min_ii_cycles"], prm["vector_static_cycles"], prm["scalar_static_cycles"]
    chunks = [min(chunk, rows - r0) for r0 in range(0, rows, chunk)]
    tensor = sum(max(prm["mm_min_cycles"], c * r) + prm["mm_fixed_cycles"] for c in chunks for r in reach)
    tensor += wy * sum(max(prm["mm_min_cycles"], whole * r) + prm["mm_fixed_cycles"] for r in reach) if whole else 0
    scalar = sum(max(mn, c * wo) + ss + (runs - 1) * (max(mn, c) + ss) for c in chunks) + \
        (2 * (max(mn, wo) + ss) if wy > 1 and not counts else 0) + \
        (max(mn, whole * wo) + ss + (runs - 1) * (max(mn, whole) + ss) if whole else 0)
    vghz, gghz = prm["vector_ghz"], prm["gpsimd_ghz"]
    vector = combines(wy) * ((n - whole) * wo / (vghz / 2 + gghz / 2) + sv / vghz) + \
        counts * (max(mn, wo) + sv) / vghz
    times = {"tensor": tensor / prm["tensor_ghz"], "scalar": scalar / prm["scalar_ghz"], "vector": vector}
    return times[engine] if engine else max(times.values())


def vector_share(src: str, dst: str) -> float:
    """The part of a pass VectorE takes so that it and GpSimdE finish together: tensor_tensor streams 2 cycles per
    element on both, 1 on VectorE when every operand is 16-bit (the model's costs, tilec/perf/costs.py)."""
    half = src in ("f16", "bf16") and dst in ("f16", "bf16")
    return compiled().vector_part(1 if half else 2, 2)


def reduce_costs(op: PoolOp, x: str, tmp: str, out: str, rows: int, n: int, wo: int,
                 xsegs: list, y_pass: bool) -> tuple[float, float, int, float]:
    """A band's two passes from SBUF (rows x wo outputs along x, n x wo along y) as the busiest engine's time (ns)
    in two forms, from the model's costs (tilec/perf/costs.py, params.py), each at its best cut of the pass along
    x's input rows (VectorE the first ones, GpSimdE's tensor_tensor combines the others) and of the pass along y's
    output rows: (the tensor_tensor form: VectorE combines its rows too; the window form: VectorE's rows as one
    tensor_reduce per segment of outputs over a window access pattern (VectorE only [NISA]: N_in cycles, N_in / 2
    for bf16 -> bf16 add and max, N_in the elements read, each window's taps); the window form's cut of the pass
    along x, and VectorE's part of the pass along y). Each instruction pays its engine's static cycles; an engine's
    part of the pass along y starts when the rows of the pass along x it reads are done (`_split`)."""
    from tilec.perf.params import target_params  # the performance model's own constants, late: perf reads kernels
    prm = {name: value for name, value, _ in target_params(compiled().name).table()}
    wx, wy = op.pool.wx, op.pool.wy if y_pass else 1
    vghz, sv = prm["vector_ghz"], prm["vector_static_cycles"]
    cx = 1 if x in knobs.HALF and tmp in knobs.HALF else 2  # VectorE cycles per element of a combine
    fast = x == tmp == "bf16" and op.pool.op in ("add", "maximum")
    taps = sum(g.size * len(g.taps) for g in xsegs if len(g.taps) > 1)
    many = sum(len(g.taps) > 1 for g in xsegs) - len(border_pairs(xsegs))  # (a pair of borders: one reduce)
    sy = op.window.stride[0] if op.window is not None else 1
    combined = sum(g.size * combines(len(g.taps)) for g in xsegs)  # per row: each output's combines
    tt = _split(prm, rows, n, wo, wx, wy, sy, tmp, out, lambda cut: (cx * cut * combined + (wx - 1) * sv) / vghz)
    red = _split(prm, rows, n, wo, wx, wy, sy, tmp, out,
                 lambda cut: (cut * taps * (0.5 if fast else 1) + many * sv) / vghz)
    return tt[0], red[0], red[1], red[2] / n


def tensor_rows_costs(x: str, k: int, wo: int, spans: list[int], scaled: int) -> tuple[float, float]:
    """(TensorE ns, ScalarE ns) of a sum's pass along x over k input rows on TensorE (`TensorPasses.tensor_rows`):
    per chunk of rows (one PSUM bank), one identity matmul per tap over the outputs it reaches (spans: their
    counts), fp32 moving data at mm_fp32_factor; ScalarE evicts each chunk and scales the band's `scaled` outputs
    by 1 / count (the model's costs, tilec/perf/costs.py, params.py)."""
    from tilec.perf.params import target_params
    prm = {name: value for name, value, _ in target_params(compiled().name).table()}
    chunk = max(1, min(compiled().psum_bank_bytes // 4, compiled().moving_fmax) // wo)
    chunks = [min(chunk, k - r0) for r0 in range(0, k, chunk)]
    factor = prm["mm_fp32_factor"] if x == "f32" else 1.0
    tensor = sum(max(prm["mm_min_cycles"], c * size) + prm["mm_fixed_cycles"] for c in chunks for size in spans)
    mn, ss = prm["min_ii_cycles"], prm["scalar_static_cycles"]
    scalar = sum(max(mn, c * wo) + ss for c in chunks) + (max(mn, scaled) + ss if scaled else 0)
    return tensor * factor / prm["tensor_ghz"], scalar / prm["scalar_ghz"]


def held(tensor: float, others: float) -> float:
    """TensorE's time for `tensor` ns of work in a band whose other engines take `others` ns: Trn2's throttle
    holds it at throttle_start_fraction of its rate while its utilization over the trailing window is below
    throttle_min_utilization (tilec/perf/throttle.py), which a TensorE busy for a small part of each band is."""
    from tilec.perf.params import target_params
    prm = {name: value for name, value, _ in target_params(compiled().name).table()}
    f0, low = prm["throttle_start_fraction"], prm["throttle_min_utilization"]
    if f0 >= 1.0 or tensor >= low * max(tensor, others):
        return tensor
    return tensor / f0


def _split(prm: dict, rows: int, n: int, wo: int, wx: int, wy: int, sy: int, tmp: str, out: str,
           vec_x_ns) -> tuple[float, int, int]:
    """(time, VectorE's input rows of the pass along x, its output rows of the pass along y) of the best cuts, with
    VectorE's part of the pass along x costing vec_x_ns(rows), GpSimdE's 2 cycles per element."""
    gghz, vghz = prm["gpsimd_ghz"], prm["vector_ghz"]
    sv, sg = prm["vector_static_cycles"], prm["gpsimd_static_cycles"]
    cy = 1 if tmp in knobs.HALF and out in knobs.HALF else 2
    best = (float("inf"), rows, 0)
    kx, ky = combines(wx), combines(wy)  # (out of the loops: the estimate runs for every candidate plan)
    for cut in range(1, rows + 1):  # input rows of the pass along x on VectorE
        vec_x = vec_x_ns(cut)
        gps_x = kx * (2 * (rows - cut) * wo + sg) / gghz if cut < rows else 0
        for rv in range(n + 1) if wy > 1 else [0]:  # output rows of the pass along y on VectorE
            # each engine's pass along y starts when the rows it reads are done: VectorE's (0..rv) need GpSimdE's
            # rows of the pass along x if they read past the cut, GpSimdE's (rv..n) VectorE's if they read before it
            v0 = max(vec_x, gps_x) if rv and (rv - 1) * sy + wy > cut else vec_x
            g0 = max(gps_x, vec_x) if rv < n and rv * sy < cut else gps_x
            vec = v0 + (ky * (cy * rv * wo + sv) / vghz if rv else 0)
            gps = g0 + (ky * (2 * (n - rv) * wo + sg) / gghz if rv < n else 0)
            best = min(best, (max(vec, gps), cut, rv))
    return best


def identity_ns(itemsize: int) -> float:
    """The set-up of the identity matrix in the model (build_util.identity_ns: built on chip)."""
    return build_util.identity_ns(itemsize)


def psum_costs(x: str, tmp: str, out: str, rows: int, n: int, wo: int, w: int, wx: int, wy: int,
               chunk: int, edges: int = 2) -> tuple[float, float, float]:
    """A band's two passes (wx - 1 combines of rows x wo elements along x, wy - 1 of n x wo along y, and a border
    copy at each end of each pass) as the busiest engine's time (ns) in both forms, from the model's costs
    (tilec/perf/costs.py, params.py): (both passes shared between VectorE and GpSimdE from SBUF; the pass along x
    on VectorE from PSUM after TensorE's copies, per chunk of rows; VectorE's part of the pass along y in that form,
    the rest on GpSimdE; edges: the pass along x's border copies per chunk, on VectorE from PSUM, those of the pass
    along y on ScalarE). tensor_tensor streams 2 cycles per element on both engines, 1 on VectorE with a PSUM
    input or all 16-bit data, each instruction pays its engine's static cycles; a fp32 matmul costs mm_fp32_factor
    times its columns."""
    from tilec.perf.params import target_params  # the performance model's own constants, late: perf reads kernels
    prm = {name: value for name, value, _ in target_params(compiled().name).table()}
    half = ("f16", "bf16")
    vghz, gghz, mn = prm["vector_ghz"], prm["gpsimd_ghz"], prm["min_ii_cycles"]
    sv, sg = prm["vector_static_cycles"], prm["gpsimd_static_cycles"]
    cx = 1 if x in half and tmp in half else 2  # VectorE cycles per element of a pass from SBUF
    cy = 1 if tmp in half and out in half else 2
    work_x, work_y = combines(wx) * rows * wo, combines(wy) * n * wo
    rate_x, rate_y = vghz / cx + gghz / 2, vghz / cy + gghz / 2
    sbuf = work_x / rate_x + work_y / rate_y + (combines(wx) + combines(wy)) * sv / vghz  # (border copies on ScalarE)
    chunks = [min(chunk, rows - r0) for r0 in range(0, rows, chunk)]
    vec_x = sum((wx - 1) * (c * wo + sv) + edges * (max(mn, c) + sv) for c in chunks) / vghz
    best = (float("inf"), 0)
    for rv in range(n + 1):  # output rows of the pass along y on VectorE
        vec = vec_x + (combines(wy) * (cy * rv * wo + sv) / vghz if rv else 0)
        gps = combines(wy) * (2 * (n - rv) * wo + sg) / gghz if rv < n and wy > 1 else 0
        best = min(best, (max(vec, gps), rv))
    factor = prm["mm_fp32_factor"] if x == "f32" else 1.0
    mm = sum(max(prm["mm_min_cycles"], c * w) + prm["mm_fixed_cycles"] for c in chunks) * factor / prm["tensor_ghz"]
    return sbuf, max(best[0], mm), best[1] / n


def across_blocks(op: PoolOp, x: str, out: str) -> PoolPlan | None:
    """Blocks of output rows over several partition tiles of channel rows: when n*c (more than 64) leaves
    partitions of its tiles empty (192 rows: two tiles of 96), tiles of t channel rows with G = 128 // t blocks
    each fill all 128 (192: three tiles of 64 x 2 blocks of 14 rows), for fewer elements per partition (each
    block reads only its halo rows beyond its own) in more instructions. Chosen when `forms_ns` estimates the
    kernel faster that way (knob ACROSS "on": the best of them whatever the one block's estimate); never when the
    pool's one-block form runs through PSUM (TensorE's copies or taps: psum_choice), which the blocks do not
    have. None: the plan of one block (schedule.window_pool_plan)."""
    w, B = op.window, op.dim("B")
    assert w is not None
    parts = best_divisor(B, PMAX)
    if B <= PMAX // 2 or parts == PMAX or w.count != "window" or knobs.ACROSS == "off" or op.relu:
        return None
    one = window_pool_plan(op)
    ob = min(one.band, w.out[0])
    if psum_choice(op, ob, B // parts * -(-w.out[0] // ob), x, out, tiles=B // parts) is not None:
        return None
    best, chosen = forms_ns(op, x, out, one) if knobs.ACROSS == "auto" else float("inf"), None
    for t in divisors(B):
        g = min(PMAX // t, max(1, w.out[0] // 4))  # (blocks of at least 4 rows, as window_pool_plan's)
        if not PMAX // 8 <= t <= PMAX // 2 or g < 2 or t * g <= parts or (g > 2 and w.out[0] % g):
            # no more partitions than the one block's tiles, or smaller tiles: more instructions; blocks unevenly
            # spaced (the last redoes rows of the one before) store one DMA per block, which the model orders one
            # DMA latency apart (their HBM byte ranges interleave: pool_window.block_stores), in every tile
            # (measured, avg 2x2 s1 f32, 2 x 112 channels of 59 x 15, tiles of 32 in 4 blocks of 15 rows: 8.38 ->
            # 34.03 us)
            continue
        plan = PoolPlan(t, band_rows(op, -(-w.out[0] // g)), g, across=True)
        ns = forms_ns(op, x, out, plan)
        if ns < best:
            best, chosen = ns, plan
    return chosen


def band_rows(op: PoolOp, rows: int) -> int:
    """Output rows per band of `rows` output rows per block (window_pool_plan's ~16 KiB of input rows)."""
    assert op.window is not None
    return min(rows, max(1, 16384 // (op.window.stride[0] * op.dim("W") * 4)))


def forms_ns(op: PoolOp, x: str, out: str, plan: PoolPlan) -> float:
    """A pool's time (ns) in `plan` from the model's costs, its bands (every tile's) one after another: a band's
    busiest vector engine (reduce_costs, the cheaper of its two forms: each instruction pays its static cycles, so
    more tiles cost more of them) after its load, at the DMA engines' bandwidth; two input buffers, so the load of
    band i waits for band i - 2's passes and then a DMA latency (the model's semaphore-to-start latency, which
    small bands do not hide); then the last band's store. With one block a band loads only its rows inside X;
    blocks load their whole windows (the rows outside X hold the identity: `pad_ops` more DMAs or ScalarE copies
    before the passes, each counted at ScalarE's fixed cost: in the model such a DMA of 64 rows took 0.11 us, a
    ScalarE copy 0.14)."""
    from tilec.perf.params import target_params
    prm = {name: value for name, value, _ in target_params(compiled().name).table()}
    w = op.window
    assert w is not None
    (sy, sx), (oy, ox) = w.stride, w.offset
    H, W, (Ho, Wo) = op.dim("H"), op.dim("W"), w.out
    G = plan.row_blocks(op)
    Rb, tmp = -(-Ho // G), "f32" if op.pool.op == "add" else x
    xsegs = segments(Wo, ox, sx, op.pool.wx, W)
    y_pass = (op.pool.wy, sy, oy) != (1, 1, 0)
    band, bw = min(plan.band, Rb), prm["dma_engines"] * prm["dma_engine_bw"] / (plan.tile_b * G)  # (per partition)
    bands = []
    for o0 in range(0, Rb, band):
        n = min(band, Rb - o0)
        first = o0 * sy + oy
        rows = (n - 1) * sy + op.pool.wy
        if G == 1:
            rows = min(first + rows, H) - max(first, 0)
        tt, red, _, _ = reduce_costs(op, x, tmp, out, rows, n, Wo, xsegs, y_pass)
        pads = pad_ops(op, [min(g * Rb, Ho - Rb) * sy + first for g in range(G)], rows) if G > 1 else 0
        bands.append((rows * W * DTYPE_BYTES[x] / bw + pads * (prm["min_ii_cycles"] + prm["scalar_static_cycles"]) /
                      prm["scalar_ghz"], min(tt, red) if knobs.REDUCE != "off" else tt,
                      n * Wo * DTYPE_BYTES[out] / bw))
    done: list[float] = []  # each band's passes' end
    queue = 0.0  # the loads' DMA queue
    for i, (load, passes, _) in enumerate(bands * (op.dim("B") // plan.tile_b)):
        queue = max(queue, done[i - 2] + prm["dma_latency_ns"] if i >= 2 else 0.0) + load
        done.append(max(queue, done[-1] if done else 0.0) + passes)
    return done[-1] + bands[-1][2]


def pad_ops(op: PoolOp, starts: list[int], rows: int) -> int:
    """The instructions that fill a band's rows outside X in blocks whose windows start at input rows `starts`
    (pool_window.block_loads): for a max or min a DMA per run of rows of X copied there (`pad_runs`), for a sum a
    ScalarE copy of a zeroed tile per run of such rows (`zero_rows`)."""
    w, H = op.window, op.dim("H")
    assert w is not None
    if op.pool.op == "add":
        return sum((s < 0) + (s + rows > H) for s in starts)
    return sum(len(pad_runs(s, rows, H, op.pool.wy, w.stride[0], w.offset[0], w.out[0])) for s in starts)
