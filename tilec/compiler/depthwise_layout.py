"""The depthwise kernel's choices before any code (see build_depthwise.py for the kernel): which convs it takes
(`multiplier`, `fan_in`, `hybrid`, `fast_path`), how a chunk's taps are split over the engines (`choose_routes`,
`hybrid_routes`: the performance model's own instruction costs) and the layout of (slot, channel) pairs on the
partitions (`rank_layouts`), with the budgets and depths the builder shares."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from tilec.compiler.ir import Buf
from tilec.compiler.ops import ConvOp
from tilec.compiler.schedule import PMAX, ConvPlan, default_plan
from tilec.target import compiled, invariant, target as get_target


PSUM_FP32 = invariant("psum_fmax")  # fp32 elements per partition in one PSUM bank: a chunk's accumulator
STORE_CHAIN_NS = 2000.0  # the last stores after the last taps: a DMA latency (~1.15 us) + transfer
SBUF_BUDGET = 96 * 1024  # bytes per partition for the band and the output band (two of each in flight)
DIAG_BUDGET = 48 * 1024  # bytes per partition for TensorE's diagonal weights (all taps of all groups, at most)
LAYOUT_TRIES = 8  # candidate layouts (best estimate first) tried against the SBUF and PSUM budgets
SBUF_SHARE = 0.5  # of the kernel's SBUF budget: the peak of a kernel adds its ops' top-level buffers
HYBRID_SBUF_SHARE = 0.6  # the hybrid's band holds Kg channels per partition: a 56x56 f32 band of 4 is 53 KiB
STORE_SPLIT = 3  # the hybrid stores the rows evicted before its last STORE_SPLIT chunks' taps, then the rest
DEPTH = 2  # chunks whose taps are issued before a chunk's final add and eviction
DEPTH_BATCH = 3  # the same with several images (not the hybrid): depthwise3x3 b8 f32 200.2 -> 195.7 us, bf16 100.4
# -> 96.5; at batch 1 one more chunk in flight delays the first eviction (depthwise_mult3x3 f32 31.8 -> 32.1)
PRODUCTS = 4  # product buffers per chunk tag (the hybrid's, and the fallback when more do not fit SBUF)
PRODUCTS_MORE = 12  # tried first by the standalone kernel and the MobileNet block (`build_depthwise.decide`,
# `build_mbblock.choose`): a ScalarE/VectorE product waits for the add that read its buffer PRODUCTS products before;
# f32 b8 depthwise3x3 194.3 -> 190.4 us (5 products a chunk: 5 buffers or more), grouped_kg1 (23 products a chunk)
# b8 191.0 -> 173.4 (5: 183.8, 6: 177.3, 8: 174.7, 16: 173.4), b1 34.3 -> 30.9 (8: 31.8), the block f32 b1
# 49.5 -> 49.0. The hybrid keeps 4 (grouped3x3's band leaves no room for 5 in its SBUF share)
PRODUCT_TRIES = (PRODUCTS_MORE, PRODUCTS)  # the product buffer counts a layout is tried with, in order
DTYPE = {"f32": 4, "f16": 2, "bf16": 2}


@dataclass(frozen=True)
class Layout:
    cg: int  # channels per group (the partitions of one slot)
    nb: int  # row blocks per image
    rb: int  # output rows per block
    k: int  # images per tile
    rc: int  # output rows per chunk (one PSUM accumulator)
    products: int = PRODUCTS  # product buffers per chunk tag (each rotates through them)


@dataclass(frozen=True)
class Routes:
    """How the taps are computed, in issue order: pe taps as matmuls of a diagonal weight matrix on TensorE
    (accumulating into the PSUM sum and starting it), else `first` starts the PSUM sum ("s": ScalarE product, "v":
    VectorE product); then v taps (VectorE product and add), sv taps (ScalarE product, VectorE add), g taps (ScalarE
    product, GpSimdE add; the first one starts the GpSimdE sum)."""
    pe: int
    first: str
    sv: int
    v: int
    g: int
    ns: float  # busiest engine's time per chunk (model estimate)
    scalar_evict: bool = False  # relu6 evicted by ScalarE's relu, then VectorE's clamp of the 16-bit result in SBUF


MULTIPLIER_MAX = 4  # a channel multiplier up to this many outputs per input channel takes the depthwise kernel


def multiplier(op: ConvOp) -> int:
    """Output channels per input channel: 1 for a depthwise conv (`dw` weights), M for a grouped conv of one input
    channel per group (`Y[n, c*M + m] += X[n, c] * W[c*M + m]`: depthwise with a channel multiplier), 0 otherwise
    (one group is a dense contraction: a matmul or a conv of one input channel keeps the general path)."""
    if op.w_layout == "dw":
        return 1
    c, k = op.dim("C"), op.dim("K")
    if op.w_layout == "kc" and op.groups == c > 1 and k % c == 0 and k // c <= MULTIPLIER_MAX \
            and not op.x_transposed:
        return k // c
    return 0


FAN_IN_MAX = 8  # a grouped conv of one output channel per group and up to this many inputs takes the depthwise kernel


def fan_in(op: ConvOp) -> int:
    """Input channels summed per output channel inside its partition: Cg for a grouped conv whose groups have one
    output channel (`Y[n, g] += X[n, g*Cg + c] * W[g, c]`: the taps run over (c, r, s)), 1 for a depthwise conv and
    for one group (a dense contraction with one output, e.g. a matrix-vector product, keeps the general path)."""
    c, k = op.dim("C"), op.dim("K")
    if op.w_layout == "kc" and op.groups == k > 1 and c % k == 0 and 1 < c // k <= FAN_IN_MAX \
            and not op.x_transposed:
        return c // k
    return 1


HYBRID_SIZES = (2, 8)  # channels per group (in and out, equal) of a grouped conv the TensorE + vector hybrid takes


def hybrid(op: ConvOp) -> int:
    """Kg for a grouped conv of several groups of Cg == Kg channels (in and out, 2..8): the hybrid kernel, where
    TensorE takes some taps (r, s) of all of a group's input channels as block-diagonal matmuls and the vector
    engines the other taps of each input channel; 0 otherwise."""
    if op.w_layout != "kc" or op.groups <= 1 or op.x_transposed or multiplier(op) or fan_in(op) > 1:
        return 0
    c, k, g = op.dim("C"), op.dim("K"), op.groups
    if c % g or k % g or c // g != k // g:
        return 0
    return k // g if HYBRID_SIZES[0] <= k // g <= HYBRID_SIZES[1] else 0


def hybrid_routes(positions: int, kg: int, n: int, clamp: bool, fp32: bool) -> Routes:
    """The hybrid's split of a chunk of n elements per partition: pe of the window's positions (r, s) on TensorE
    (one block-diagonal matmul each, all kg input channels of a group at once), the kg channel-taps of every other
    position on the vector engines (`choose_routes`, without TensorE); the smallest busiest-engine time."""
    return _hybrid_routes(compiled().name, positions, kg, n, clamp, fp32)


@functools.lru_cache(maxsize=None)  # keyed by the target too: its clocks and costs decide
def _hybrid_routes(target: str, positions: int, kg: int, n: int, clamp: bool, fp32: bool) -> Routes:
    del target  # (the key; choose_routes reads compiled() itself)
    best: Routes | None = None
    for pe in range(positions):  # all positions on TensorE is the grouped builder's matmul kernel
        if pe == 0:
            rt = choose_routes(kg * positions, n, clamp)
        else:  # the matmuls start the PSUM sum: the vector taps' split counts one product more (a bound)
            vt = choose_routes(kg * (positions - pe) + 1, n, clamp)
            rt = Routes(pe, "", vt.sv, vt.v, vt.g, max(vt.ns, pe * _matmul_ns(n, fp32)))
        if best is None or rt.ns < best.ns:
            best = rt
    assert best is not None
    return best


def fast_path(op: ConvOp, plan: ConvPlan, hbm: dict[str, Buf]) -> bool:
    """The slot layout serves the default schedule of a plain depthwise conv (with bias, relu, relu6), with a
    channel multiplier too; a user's schedule, a fused pool or residual keep the general path that follows the
    plan."""
    if not (multiplier(op) or fan_in(op) > 1) or op.pool or op.residual or op.w_batch or op.bias_role != "k":
        return False
    if op.dim("Wo") > PSUM_FP32 or op.dim("Ho") * op.dim("Wo") == 0:
        return False
    dtypes = {name: buf.dtype for name, buf in hbm.items()}
    return plan == default_plan(op, dtypes)


def choose_routes(taps: int, n: int, clamp: bool, pe: bool = False, fp32: bool = True,
                  extra: tuple[float, float, float] = (0.0, 0.0, 0.0), drain: float = 0.0,
                  vector_evict: bool = False, split_evict: bool = False) -> Routes:
    """The split of the taps over the engines with the smallest busiest-engine time per chunk of n elements per
    partition (the model's costs, spec §2.4); `pe`: TensorE may take taps (diagonal matmuls; fp32 at the model's
    fp32 factor); `extra`: ns per chunk TensorE, ScalarE and VectorE spend on other work (a fused block's 1x1
    convs and their evictions); `drain`: the share of chunks whose chain runs alone (1 / chunks per pipeline: the
    last one's). A chunk's ScalarE products feed VectorE's adds, whose final add feeds ScalarE's eviction: one
    engine waits for the other along that chain, hidden behind the next chunks' taps except at a pipeline's end,
    so the choice weighs busiest + drain * (chain - busiest). `vector_evict`: VectorE evicts with the clamp (one
    tensor_scalar, counted by `clamp`), ScalarE not at all (the MobileNet block's relu6). `split_evict` (a 16-bit
    relu6 output, with `vector_evict`): the eviction may instead be ScalarE's relu into the 16-bit output and
    VectorE's min(., 6) on it in SBUF, which runs in VectorE's 4x mode (ARCH3: 16-bit SBUF in and out, contiguous)
    where the clamp from fp32 PSUM runs at 1x; chosen when it lowers the busiest engine (`Routes.scalar_evict`)."""
    return _choose_routes(compiled().name, taps, n, clamp, pe, fp32, extra, drain, vector_evict, split_evict)


@functools.lru_cache(maxsize=None)  # keyed by the target: its clocks and costs decide
def _choose_routes(target: str, taps: int, n: int, clamp: bool, pe: bool, fp32: bool,
                   extra: tuple[float, float, float], drain: float, vector_evict: bool, split_evict: bool) -> Routes:
    from tilec.perf.params import target_params  # the performance model's own constants, late: perf reads kernels
    prm = {name: value for name, value, _ in target_params(target).table()}
    # VectorE's and GpSimdE's taps overlap only where the two may touch SBUF side by side (not NC-v2: their
    # instructions serialise, so their times add up, tilec.target.Target.vector_gpsimd_split)
    both = max if get_target(target).vector_gpsimd_split else lambda a, b: a + b
    mn = prm["min_ii_cycles"]
    act = (max(mn, n) + prm["scalar_static_cycles"]) / prm["scalar_ghz"]
    vec = (max(mn, n) + prm["vector_static_cycles"]) / prm["vector_ghz"]
    gps = (max(mn, 2 * n) + prm["gpsimd_static_cycles"]) / prm["gpsimd_ghz"]
    mm = (max(prm["mm_min_cycles"], n) + prm["mm_fixed_cycles"]) * (prm["mm_fp32_factor"] if fp32 else 1) \
        / prm["tensor_ghz"]
    vmin = (max(mn, n / prm["perf_mode_copy"]) + prm["vector_static_cycles"]) / prm["vector_ghz"]

    def cost(k: int, first: str, sv: int, v: int, g: int, ev: bool) -> tuple[float, float]:
        """(busiest engine + the drain's share of the chain, busiest engine) of a split; `ev`: ScalarE's relu and
        VectorE's 4x clamp evict instead of VectorE's clamp."""
        on_scalar = not vector_evict or ev  # ScalarE evicts
        scalar = act * (sv + g + (first == "s") + on_scalar) + extra[1]
        vector = vec * (sv + 2 * v + (first == "v") + (g > 0) + (clamp and not ev)) + ev * vmin + extra[2]
        gpsimd = gps * max(0, g - 1)
        busiest = max(scalar, both(vector, gpsimd), mm * k + extra[0])
        # ScalarE's products, then VectorE's adds (and GpSimdE's, in parallel), then the eviction
        chain = act * (sv + g + (first == "s")) + both(vector, gpsimd) + on_scalar * act
        return busiest + drain * max(0.0, chain - busiest), busiest

    best: tuple[float, int, Routes] | None = None
    step = max(1, taps // 12)  # big windows (11x11) search a coarser grid: the search is cubic in the taps
    for k in range(0, taps + 1 if pe else 1, step):
        for first in ("s", "v") if k == 0 else ("",):
            rest = taps - k - (k == 0)  # the taps after the one that starts the PSUM sum
            for g in range(0, rest + 1, step):
                for v in range(0, rest - g + 1, step):
                    sv = rest - g - v
                    c, busiest = cost(k, first, sv, v, g, False)
                    instrs = 2 * taps - k - (first == "s") - (g > 0)
                    key = (c, instrs, Routes(k, first, sv, v, g, busiest))
                    if best is None or key[:2] < best[:2]:
                        best = key
    assert best is not None
    rt = best[2]
    if split_evict and vector_evict:  # the eviction's engines for the taps' split (the taps never move for it)
        c, busiest = cost(rt.pe, rt.first, rt.sv, rt.v, rt.g, True)
        if c < best[0]:
            return replace(rt, ns=busiest, scalar_evict=True)
    return rt


def choose_layout(op: ConvOp, elem: int, clamp: bool = False, pe: bool = False) -> Layout | None:
    ranked = rank_layouts(op, elem, clamp, pe)
    return ranked[0] if ranked else None


def _matmul_ns(n: int, fp32: bool) -> float:
    """The model's time of one matmul streaming n columns (spec §2.4, tilec/perf/params.py)."""
    from tilec.perf.params import target_params
    prm = {name: value for name, value, _ in target_params(compiled().name).table()}
    return (max(prm["mm_min_cycles"], n) + prm["mm_fixed_cycles"]) * (prm["mm_fp32_factor"] if fp32 else 1) \
        / prm["tensor_ghz"]


def rank_layouts(op: ConvOp, elem: int, clamp: bool = False, pe: bool = False) -> list[Layout]:
    """The layouts, best estimate first (`layout_estimates`)."""
    return [lay for _, lay in layout_estimates(op, elem, clamp, pe)]


def layout_estimates(op: ConvOp, elem: int, clamp: bool = False, pe: bool = False) -> list[tuple[float, Layout]]:
    """(estimated ns, layout), smallest first: per tile, its chunks' busiest engine plus one chunk of pipeline
    fill, or its DMA time, whichever is longer, plus the first band's load and the last tile's stores; none when not
    even one output row per partition fits SBUF."""
    n_img, c, ho, wo = op.dim("N"), op.dim("C") // fan_in(op), op.dim("Ho"), op.dim("Wo")
    sy, dy, sx, dx = op.stride[0], op.dilation[0], op.stride[1], op.dilation[1]
    taps = op.dim("R") * op.dim("S") * fan_in(op)
    ic = (wo - 1) * sx + (op.dim("S") - 1) * dx + 1
    rc_max = PSUM_FP32 // wo
    t = compiled()
    from tilec.perf.params import target_params  # the model's own constants, late (as choose_routes)
    desc_ns = next(value for name, value, _ in target_params(t.name).table() if name == "dma_desc_ns")
    found: list[tuple[float, int, Layout]] = []
    for nb in range(1, min(ho, PMAX) + 1):
        rb = -(-ho // nb)
        if -(-ho // rb) != nb:
            continue  # the same blocks as a smaller nb
        ir_rows = (rb - 1) * sy + (op.dim("R") - 1) * dy + 1
        if 2 * (ir_rows * ic * elem * fan_in(op) + max(1, multiplier(op)) * rb * wo * 4) > SBUF_BUDGET:
            continue
        # a tile: its PSUM-sized chunks after one chunk of filling the engines' pipeline, or its loads and stores
        # (the bytes of a DMA engine's 8 partitions at its bandwidth), whichever is longer; the last tile's stores
        # (one DMA latency and transfer) come after everything
        ppe = PMAX // t.dma_engines
        load_ns = ppe * ir_rows * ic * fan_in(op) * elem / t.dma_engine_bw  # a band: 8 partitions per DMA engine
        store_ns = ppe * rb * wo * elem / t.dma_engine_bw  # one output channel of each partition
        dma_ns = load_ns + max(1, multiplier(op)) * store_ns
        # a fan-in's TensorE taps come before a chunk's other taps (they lead by one chunk): the first chunk's
        # matmuls fill the pipeline (once: later tiles overlap), smaller chunks fill it sooner
        least = -(-rb // rc_max)  # chunks per block, at the least (balanced sizes for a fan-in: no 1-row chunk)
        for rc in sorted({min(rb, rc_max)} | ({-(-rb // m) for m in (least, least + 1, 2 * least)}
                                               if fan_in(op) > 1 else set())):
            rows = [rc] * (rb // rc) + ([rb % rc] if rb % rc else [])
            routes = [choose_routes(taps, r * wo, clamp, pe, elem == 4) for r in rows]
            times = [rt.ns for rt in routes]
            fill = routes[0].pe * _matmul_ns(rows[0] * wo, elem == 4) if fan_in(op) > 1 else 0.0
            for cg in range(1, min(c, PMAX // nb) + 1):
                k = max(1, min(n_img, PMAX // (nb * cg)))
                tiles = -(-c // cg) * -(-n_img // k)
                # row blocks of a group not a multiple of 8 channels: one store after another on one DMA engine
                serial = nb * cg * max(1, multiplier(op)) * rb * wo * elem / t.dma_engine_bw \
                    if nb > 1 and cg % (PMAX // t.dma_engines) else 0.0
                # with row blocks, one store per (slot, channel, output of a multiplier): their descriptors are
                # issued one after another (two each: SBUF and HBM side)
                issue = k * nb * cg * max(1, multiplier(op)) * 2 * desc_ns if nb > 1 else 0.0
                tile_ns = max(max(1, multiplier(op)) * sum(times) + max(times), dma_ns, serial, issue)
                # before the first taps: the first band's load; after the last: the last tile's stores
                edges = load_ns + store_ns + STORE_CHAIN_NS
                found.append((tiles * tile_ns + fill + edges, nb, Layout(cg, nb, rb, k, rc)))
    found.sort(key=lambda f: f[:2])
    return [(f[0], f[2]) for f in found]
