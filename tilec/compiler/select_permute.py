"""Permutes of any rank as chains of the steps the transpose rule compiles (issue 13: N-D permutes).

One step is what rules.transpose schedules directly: a swap of two runs of dimensions after leading batch
dimensions (`[b, i.., j..] -> [b, j.., i..]`: X seen as [B, M, N], blocks transposed on TensorE or by DMA), or a
swap of two single dimensions around dimensions that stay in place (`[a, b, c] -> [c, b, a]`: strided 2-D slices).
Any other permutation, e.g. a 3-cycle that keeps the last dimension (`Y[b, c, a, d] = X[a, b, c, d]`), becomes the
cheapest chain of steps through HBM intermediates in the source's dtype (exact: a permute only moves values):

    Y[b, c, a, d] = X[a, b, c, d]     ->   X[a, b, c, d] -> T[b, c, d, a]    (runs [a] and [b, c, d] swap)
                                            T[b, c, d, a] -> Y[b, c, a, d]    (after batch b, c: [d] and [a] swap)

A step's cost is one pass over the data, more when its blocks are small (a swap of runs of M and N elements moves
min(M, N, 128)-wide blocks); a swap around staying dimensions counts two (its slices are strided, so its DMAs move
short rows). The search is a shortest path over the orders (rank <= MAX_RANK).
"""
from __future__ import annotations

import heapq
import itertools
import math

MAX_RANK = 6  # 720 orders: the search stays instant; beyond it a permute is written as several statements

Order = tuple[str, ...]


def one_step(src: Order, out: Order) -> str:
    """"runs" (a swap of two runs after a batch), "pair" (two single dimensions swap around staying ones), or ""."""
    if sorted(src) != sorted(out) or src == out:
        return ""
    k = next(i for i, (x, y) in enumerate(zip(src, out)) if x != y)
    rest, want = src[k:], out[k:]
    if any(rest[c:] + rest[:c] == want for c in range(1, len(rest))):
        return "runs"
    return "pair" if sum(x != y for x, y in zip(src, out)) == 2 else ""


def _cost(m: int, n: int) -> float:
    """One pass over the data, plus what small blocks cost (a block is min(M, 128) x min(N, 128))."""
    return 1 + 8 / min(m, n, 128)


def _moves(s: Order, ext: dict[str, int]):
    """(cost, next order) for every one-step permute of `s`."""
    n = len(s)
    size = lambda vs: math.prod(ext[v] for v in vs)  # noqa: E731
    for k in range(n - 1):  # a batch of k leading dimensions, then two runs swapped
        for c in range(1, n - k):
            yield _cost(size(s[k:k + c]), size(s[k + c:])), s[:k] + s[k + c:] + s[k:k + c]
    for i in range(n):
        for j in range(i + 1, n):
            t = list(s)
            t[i], t[j] = t[j], t[i]
            if one_step(s, tuple(t)) == "pair":
                yield 1 + _cost(ext[s[i]], ext[s[j]]), tuple(t)


def chain(src: Order, out: Order, ext: dict[str, int]) -> list[Order] | None:
    """The orders from `src` to `out` (both included) of the cheapest chain of one-step permutes (`ext`: each
    dimension's extent); None when the rank is above MAX_RANK."""
    if len(src) > MAX_RANK:
        return None
    best: dict[Order, float] = {src: 0}
    heap: list[tuple[float, int, list[Order]]] = [(0, 0, [src])]
    while heap:
        cost, _, path = heapq.heappop(heap)
        here = path[-1]
        if here == out:
            return path
        if cost > best.get(here, cost):
            continue
        for step, nxt in _moves(here, ext):
            if cost + step < best.get(nxt, cost + step + 1):
                best[nxt] = cost + step
                heapq.heappush(heap, (cost + step, len(path), path + [nxt]))
    return None


def dma_runs(src: Order, out: Order, ext: dict[str, int]) -> tuple[Order, Order] | None:
    """(outer, inner) when the permute keeps its last dimension: the dimensions `inner` come in the same order on
    both sides (the largest such set, in elements), so for each iteration of `outer` one DMA copies X's slice to
    Y's slice of the same shape, in chunks of the last dimension; None when the last dimension moves."""
    if src[-1] != out[-1] or sorted(src) != sorted(out):
        return None
    best: Order = (src[-1],)
    for r in range(2, len(src) + 1):
        for inner in itertools.combinations(src, r):  # in src's order
            if inner[-1] == src[-1] and tuple(v for v in out if v in inner) == inner and \
                    math.prod(ext[v] for v in inner) > math.prod(ext[v] for v in best):
                best = inner
    return tuple(v for v in out if v not in best), best


DMA_CHUNK_BYTES = 256  # a permute whose two sides share runs this long moves by DMA; shorter runs by transposes
PAIR_CHUNK_BYTES = 8  # ... unless the transposes would need a swap around staying dimensions (strided slices)
# (model, f32, `Y[b, a, c] = X[a, b, c]` 256x256xC: DMA 71-87 µs for C = 1..64; the swap of a and b around c
# 17 µs at C = 1, 474 at C = 4, 7356 at C = 64. `Y[b, c, a, d] = X[a, b, c, d]` 64x32x28x28, 112-byte runs:
# DMA 299 µs, two transposes 206. [S, N, H, D] -> [N, H, S, D], 512x1x8x64: DMA 18.2 µs, two transposes 37.2.)


def dma_permute(src: Order, out: Order, ext: dict[str, int], itemsize: int) -> bool:
    """Whether the permute moves by HBM -> HBM DMAs (rules.copy) rather than transposes: it keeps its last
    dimension, is no swap of two runs (one transpose pass), and the runs the two sides share at their ends are
    long (DMA_CHUNK_BYTES), or the transposes would include a swap around staying dimensions."""
    if dma_runs(src, out, ext) is None or one_step(src, out) == "runs":
        return False
    common = 0
    while common < len(src) and src[len(src) - 1 - common] == out[len(out) - 1 - common]:
        common += 1
    run = math.prod(ext[v] for v in src[len(src) - common:]) * itemsize
    if run >= DMA_CHUNK_BYTES:
        return True
    path = [src, out] if one_step(src, out) else chain(src, out, ext) or []
    return run >= PAIR_CHUNK_BYTES and any(one_step(a, b) == "pair" for a, b in zip(path, path[1:]))
