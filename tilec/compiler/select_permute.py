"""Permutes of any rank as chains of steps the compiler schedules directly (issue 13: N-D permutes).

A step is one of
    runs   a swap of two runs of dimensions after leading batch dimensions (`[b, i.., j..] -> [b, j.., i..]`): X seen
           as [B, M, N], blocks transposed on TensorE (or by DMA transposes) by rules.transpose;
    pair   a swap of two single dimensions around dimensions that stay (`[a, b, c] -> [c, b, a]`): 2-D transposes
           of strided slices, rules.transpose;
    dma    any permute that keeps the last dimension: per iteration of some outer loops, one HBM -> HBM DMA copies a
           slice whose other dimensions come in the same order on both sides (rules.copy).
A swap of runs is always one step (today's transposes). Anything else is the cheapest chain of steps through HBM
intermediates in the source's dtype (exact: a permute only moves values), e.g.

    Y[n, w, h, c] = X[n, c, h, w]     ->   X[n, c, h, w] -> T[n, h, w, c]    runs: [c] and [h, w] swap
    (NCHW -> NWHC)                          T[n, h, w, c] -> Y[n, w, h, c]    dma: per (w, n), [h, c] slices

A step's estimated time (step_us) is its passes over the data at the DMA byte floor, plus a fixed time per step
and per strided slice, calibrated on the model (f32): a swap of runs is one pass, more when its blocks are small
(min(M, N, 128) wide); a DMA step moves bytes once (HBM -> HBM) but pays per contiguous run when runs are short and
runs on the engines of its partitions only (8 per engine, 16 engines); a pair swap pays short rows and its slices.
Dimensions of extent 1 move nothing and are left out of the run lengths. Measured (model µs, start-up included,
each plan forced; re-measured with the model's fp32 transpose-mode rate, the chosen plan unchanged in each case):
`Y[b, a, c] = X[a, b, c]` 256x256xC: dma 71 at C = 4, 87 at C = 64, pair 17 at C = 1, 474 at C = 4, the chosen
chain 42 at C = 4; `Y[b, c, a, d] = X[a, b, c, d]` 64x32x28x28 (112-byte runs): dma 299, runs + runs 198 (bf16 290,
148); NCHW -> NWHC 2x256x28x28: pair 97, runs + dma 46 (the other runs + dma 43); [S, N, H, D] -> [N, H, S, D]
512x1x8x64: dma 18.2, runs + runs 35.1. A swap of runs alone is DMA-bound on the model (B x 512 x N, f32: 1.0 pass
of the floor at N = 512, 2.4 at 64, 9.7 at 16; bf16 1.1, 3.9, 15.9: its small blocks cost the same time as f32's,
twice the passes). Below ~10 µs of data the estimate can miss by the start-up noise (`Y[c, b, a] = X[a, b,
c]` 200x3x150: the chosen dma + runs 20.4, pair 19.3).
"""
from __future__ import annotations

import functools
import heapq
import itertools
import math

from tilec.target import compiled, invariant

MAX_RANK = 5  # 120 orders: the search takes ~0.1 s (rank 6: ~1.8 s); at rank 6 it is narrowed (_dma_targets)
NARROWED_RANK = 6  # the narrowed search: ~0.4 s at rank 6 (rank 7: up to ~9 s); beyond it short_chains
# passes of a swap of runs in 128 x 128 blocks (smaller blocks cost in proportion): its DMAs' (fitted on the model);
# the engines' passes (engine_passes, from the model's constants) count when they are more
TRANSPOSE_COST = 1.1
DMA_COST = 0.6  # passes of an HBM -> HBM DMA with long runs (the model counts its bytes once)
DMA_RUN = 256  # bytes x passes: a DMA of shorter runs is descriptor-bound, its cost grows as 1 / run
STEP_PASSES = 0.5  # passes a step costs beyond its data (its HBM intermediate): 4 cheap steps lose to 2 dearer
STEP_US = 2.5  # µs each step takes whatever its size: a load -> transpose -> store chain's latencies
SLICE_US = 0.6  # µs per strided 2-D slice of a pair swap (one per combination of the staying dimensions)
PMAX, DMA_ENGINES = invariant("pmax"), invariant("dma_engines")  # (every generation's: 128 partitions, 16 DMA queues)

Order = tuple[str, ...]


def one_step(src: Order, out: Order) -> str:
    """"runs" (a swap of two runs after a batch), "pair" (two single dimensions swap around staying ones), "dma" (any
    other permute keeping the last dimension), or "" (the permute needs a chain)."""
    kinds = step_kinds(src, out)
    return kinds[0] if kinds else ""


def step_kinds(src: Order, out: Order) -> list[str]:
    """The kinds of step that do the permute at once: a swap of runs only as such; a pair swap that keeps the last
    dimension is also a DMA step."""
    if sorted(src) != sorted(out) or src == out:
        return []
    k = next(i for i, (x, y) in enumerate(zip(src, out)) if x != y)
    rest, want = src[k:], out[k:]
    if any(rest[c:] + rest[:c] == want for c in range(1, len(rest))):
        return ["runs"]
    dma = ["dma"] if src[-1] == out[-1] else []
    return (["pair"] if sum(x != y for x, y in zip(src, out)) == 2 else []) + dma


def _run_bytes(kind: str, src: Order, out: Order, ext: dict[str, int], itemsize: int) -> int:
    """Bytes of the contiguous runs a step moves: a DMA, the dimensions (of extent > 1) both sides end with in
    common, else single elements; a pair swap, rows of min(extent, 128) when it swaps the last dimension, else
    single elements (its 2-D slices are strided)."""
    s, t = [v for v in src if ext[v] > 1], [v for v in out if ext[v] > 1]
    common = 0
    while common < min(len(s), len(t)) and s[len(s) - 1 - common] == t[len(t) - 1 - common]:
        common += 1
    if common and kind == "pair":  # the swapped dimensions are strided: single elements
        return itemsize
    if common:
        return itemsize * math.prod(ext[v] for v in s[len(s) - common:])
    if kind == "dma" or not s:
        return itemsize
    return itemsize * min(ext[s[-1]], ext[t[-1]], PMAX)


def step_cost(kind: str, src: Order, out: Order, ext: dict[str, int], itemsize: int) -> float:
    """The cost of one step in passes over the data (see the module's measurements)."""
    if kind == "runs":
        k = next(i for i, (x, y) in enumerate(zip(src, out)) if x != y)
        c = next(c for c in range(1, len(src) - k) if src[k + c:] + src[k:k + c] == out[k:])
        m, n = math.prod(ext[v] for v in src[k:k + c]), math.prod(ext[v] for v in src[k + c:])
        return max(TRANSPOSE_COST * PMAX / min(m, n, PMAX), engine_passes(m, n, itemsize))
    run = _run_bytes(kind, src, out, ext, itemsize)
    if kind == "dma":  # the engines of its partitions (8 each, of 16) share the work
        runs = dma_runs(src, out, ext)
        assert runs is not None
        per_engine = PMAX // DMA_ENGINES
        engines = min(DMA_ENGINES, -(-_divisor(ext[runs[1][0]], PMAX) // per_engine))
        return max(DMA_COST, DMA_RUN / run) * DMA_ENGINES / engines
    return 2 * TRANSPOSE_COST + DMA_RUN / run  # pair: short strided rows, then transposes


def engine_passes(m: int, n: int, itemsize: int) -> float:
    """Passes over the data that TensorE and VectorE need for a swap of runs [B, M, N] -> [B, N, M] by blocks of
    bm x bn (min(extent, 128)), from the performance model's constants: per block one PE transpose (an fp32 one at
    the model's fp32 transpose rate: transpose mode's on trn2, the matmul factor without it) and one eviction from
    PSUM on VectorE (16-bit at its PSUM performance mode), against the block's share of the DMA byte floor. On trn2
    these stay under TRANSPOSE_COST's DMA passes (a 128 x 128 fp32 block: TensorE 134 ns, VectorE 237 ns, the DMA
    floor 356 ns; 16-bit: 57, 171 and 178 ns): a swap of runs is DMA-bound on the model (TensorE busy 15-29 %)."""
    from tilec.perf.params import target_params  # (late: perf reads kernels)
    bm, bn = min(m, PMAX), min(n, PMAX)
    model = target_params(compiled().name)  # the current target's model (a test may swap it): the memo's key
    key = (id(model), bm, bn, itemsize)
    if key not in _PASSES or _PASSES[key][0] is not model:
        _PASSES[key] = (model, _engine_passes(bm, bn, itemsize))
    return _PASSES[key][1]


_PASSES: dict[tuple[int, int, int, int], tuple[object, float]] = {}  # engine_passes' memo: a 6-D chain search asks
# for the same few block sizes ~9,000 times (5 of its 13 s were the model's constants read again each time)


def _engine_passes(bm: int, bn: int, itemsize: int) -> float:
    from tilec.compiler.build_matvec import model_constants  # the model's own constants (late: perf reads kernels)
    prm = model_constants()
    fp32 = itemsize == 4
    pe = (max(bm, min(prm["mm_min_cycles"], bn)) + prm["mm_fixed_cycles"]) * (prm["fp32_transpose"] if fp32 else 1.0)
    evict = (max(prm["min_ii_cycles"], bm / (1.0 if fp32 else prm["perf_mode_half"])) + prm["vector_static_cycles"])
    floor = 2 * bm * bn * itemsize / (prm["dma_engines"] * prm["dma_engine_bw"])
    return max(pe / prm["tensor_ghz"], evict / prm["vector_ghz"]) / floor


def step_us(kind: str, src: Order, out: Order, ext: dict[str, int], itemsize: int) -> float:
    """A step's estimated time: its passes over the data at the DMA byte floor (read and write at the default
    target's DMA bandwidth), its fixed latency, and a pair swap's slices."""
    floor = 2 * math.prod(ext.values()) * itemsize / (compiled().dma_engines * compiled().dma_engine_bw * 1000)
    slices = math.prod(ext[v] for v, w in zip(src, out) if v == w) if kind == "pair" else 0
    return (step_cost(kind, src, out, ext, itemsize) + STEP_PASSES) * floor + STEP_US + slices * SLICE_US


def chain_floor_us(ext: dict[str, int], itemsize: int) -> float:
    """Less than step_us gives any chain of two or more steps: each step at least its fixed time and the cheapest
    step's passes (a DMA step's with long runs, DMA_COST)."""
    floor = 2 * math.prod(ext.values()) * itemsize / (compiled().dma_engines * compiled().dma_engine_bw * 1000)
    return 2 * ((min(DMA_COST, TRANSPOSE_COST) + STEP_PASSES) * floor + STEP_US)


def _runs_swaps(s: Order):
    """Every order one swap of runs away from `s`: a batch of k leading dimensions, then two runs swapped."""
    n = len(s)
    for k in range(n - 1):
        for c in range(1, n - k):
            yield s[:k] + s[k + c:] + s[k:k + c]


def _moves(s: Order, dma: set[Order] | None = None):
    """Every order one step away from `s`; with `dma`, the DMA steps (which may put every dimension but the last in
    any order: (n - 1)! of them) only to those orders."""
    n = len(s)
    yield from _runs_swaps(s)
    for i, j in itertools.combinations(range(n), 2):
        swapped = list(s)
        swapped[i], swapped[j] = swapped[j], swapped[i]
        yield tuple(swapped)
    if dma is not None:
        yield from (t for t in dma if t[-1] == s[-1])
        return
    for kept in itertools.permutations(s[:-1]):  # the last dimension stays: one DMA step
        yield kept + s[-1:]


def _dma_targets(out: Order) -> set[Order]:
    """The narrowed search's DMA targets: `out` and the orders one swap of runs from it (a chain's last steps), and
    each of those with any one dimension moved last (a DMA keeps its last dimension). On every permute of 5 and 6
    dimensions tried (reversals and random orders, extents 2-64) the narrowed search's chain costs what the full
    search's does (one 6-D case 2 % more) in a quarter of the time."""
    near = {out} | set(_runs_swaps(out))
    return near | {tuple(x for x in t if x != v) + (v,) for t in near for v in t}


Step = tuple[str, Order]  # (kind, the order after the step)


def chain(src: Order, out: Order, ext: dict[str, int], itemsize: int = 4) -> list[Step] | None:
    """The steps from `src` to `out` of the cheapest chain (`ext`: each dimension's extent); two DMA steps never
    follow each other (they are one). Above MAX_RANK the DMA steps are narrowed (_dma_targets); None above
    NARROWED_RANK."""
    if len(src) > NARROWED_RANK:
        return None
    dma = _dma_targets(out) if len(src) > MAX_RANK else None
    best: dict[tuple[Order, bool], float] = {(src, False): 0}
    heap: list[tuple[float, int, list[Step]]] = [(0, 0, [("", src)])]
    while heap:
        cost, _, path = heapq.heappop(heap)
        last, here = path[-1]
        if here == out:
            return path[1:]
        if cost > best.get((here, last == "dma"), cost):
            continue
        for nxt in sorted(set(_moves(here, dma))):
            for kind in step_kinds(here, nxt):
                if kind == "dma" and last == "dma":
                    continue
                total = cost + step_us(kind, here, nxt, ext, itemsize)
                if total < best.get((nxt, kind == "dma"), math.inf):
                    best[(nxt, kind == "dma")] = total
                    heapq.heappush(heap, (total, len(path), path + [(kind, nxt)]))
    return None


def short_chains(src: Order, out: Order) -> list[list[Step]]:
    """Chains of at most two steps that do any permute, of any rank: a swap of runs that puts `out`'s last
    dimension last, then a DMA step; or a DMA step to an order from which one swap of runs gives `out` (a DMA step
    between equal orders left out)."""
    n = len(src)
    found: list[list[Step]] = []
    x = src.index(out[-1])
    for k in range(x + 1):  # runs src[k..x] and src[x+1..] swap after the batch src[:k]
        mid = src[:k] + src[x + 1:] + src[k:x + 1]
        if mid != src:
            found.append([("runs", mid)] + ([("dma", out)] if mid != out else []))
    c = n - 1 - out.index(src[-1])  # out ends with c dimensions after src's last one
    for k in range(n - c if c else 0):
        mid = out[:k] + out[n - c:] + out[k:n - c]
        if mid != out:
            found.append(([("dma", mid)] if mid != src else []) + [("runs", out)])
    return [ch for ch in found if all(kind in step_kinds(a, b) for (kind, b), a in zip(ch, [src] + [o for _, o in ch]))]


def plan(src: Order, out: Order, ext: dict[str, int], itemsize: int) -> list[Step] | None:
    """The permute's steps: a swap of runs is always one (today's transposes), anything else the cheapest chain
    (possibly of one step); above NARROWED_RANK (where even the narrowed search takes seconds) the cheapest of the
    one-step permute and short_chains' chains by the same estimate (step_us): at rank 5 and 6 these cost up to 4x
    the searched chain, so a permute of 7 or more dimensions compiles but is not the fastest chain."""
    kind = one_step(src, out)
    if kind == "runs":
        return [(kind, out)]
    # plain numbers, the same costs: the search's arithmetic on named sizes (named.py, which records each product's
    # text) took 100 of a 6-D pixel shuffle's 107 s of compilation (user20; 12 s with ints, on a loaded machine)
    ext = {d: int(n) for d, n in ext.items()}
    if len(src) <= NARROWED_RANK:
        return chain(src, out, ext, itemsize)
    chains = ([[(kind, out)]] if kind else []) + short_chains(src, out)

    def total(ch: list[Step]) -> float:
        return sum(step_us(k, a, b, ext, itemsize) for (k, b), a in zip(ch, [src] + [o for _, o in ch]))
    return min(chains, key=total) if chains else None


def dma_runs(src: Order, out: Order, ext: dict[str, int], pmax: int = PMAX) -> tuple[Order, Order] | None:
    """(outer, inner) of a DMA step (the last dimension stays); see _dma_runs."""
    return _dma_runs(src, out, tuple(sorted(ext.items())), pmax)


@functools.lru_cache(maxsize=4096)  # the chain search asks for each DMA step several times (4 of a 6-D search's 13 s)
def _dma_runs(src: Order, out: Order, extents: tuple[tuple[str, int], ...], pmax: int) -> tuple[Order, Order] | None:
    """(outer, inner) of a DMA step (the last dimension stays): for each iteration of `outer` one DMA per block of
    partitions copies X's slice over `inner` to Y's slice of the same shape. `inner` comes in the same order on both
    sides (the largest such set, in elements) and starts at its loop with the largest divisor <= pmax, not the last
    (whose elements are the contiguous runs): the partitions spread a DMA over the engines. None when the last
    dimension moves."""
    ext = dict(extents)
    if src[-1] != out[-1] or sorted(src) != sorted(out):
        return None
    best: Order = (src[-1],)
    most, at = ext[src[-1]], {v: i for i, v in enumerate(out)}
    for r in range(1, len(src)):
        for head in itertools.combinations(src[:-1], r):  # in src's order, then the last dimension
            inner = head + src[-1:]
            if all(at[x] < at[y] for x, y in zip(inner, inner[1:])) and math.prod(ext[v] for v in inner) > most:
                best, most = inner, math.prod(ext[v] for v in inner)
    part = max(best[:-1] or best, key=lambda v: (_divisor(ext[v], pmax), -best.index(v)))
    inner = best[best.index(part):]
    return tuple(v for v in out if v not in inner), inner


def _divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)
