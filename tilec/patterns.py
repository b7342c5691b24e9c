"""Which elements an access pattern touches, and whether two patterns of one buffer share an element.

An access pattern is (element offset, shape, strides) over a buffer's flat storage, as NKI tensor views and DMA
descriptors describe it. One rule for both sides of the trace contract (tilec/trace.py): the interpreter's race check
(tilec/nki/races.py) and the performance model's per-pattern dependence rule (tilec/perf/deps.py) decide "the same
location" with `common_element`, so they cannot disagree. The tests are exact: a lattice test when the two patterns
have one geometry, a per-storage-dimension progression test when each walks whole storage dimensions, else the
intersection of the materialised element sets.
"""
from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=1 << 10)
def storage_dims(shape: tuple) -> tuple:
    """(size, stride) of each dimension of a buffer's storage, outermost first."""
    out, acc = [], 1
    for n in reversed(shape):
        out.append((int(n), acc))
        acc *= int(n)
    return tuple(reversed(out))


def canonical(shape: tuple, strides: tuple) -> tuple[tuple, tuple]:
    """The same element set with unit dimensions dropped and contiguous neighbours merged, so that two views of one
    access (a squeezed and an unsqueezed one, say) record the same pattern."""
    dims: list[list[int]] = []
    for n, s in zip(shape, strides):
        if n == 1:
            continue
        if dims and dims[-1][1] == n * s:  # the outer dimension steps exactly over this one: merge them
            dims[-1] = [dims[-1][0] * n, s]
        else:
            dims.append([int(n), int(s)])
    return tuple(d[0] for d in dims), tuple(d[1] for d in dims)


def meet(a: tuple, b: tuple, dims: tuple = ()) -> bool:
    """Whether two access patterns (element offset, shape, strides) of one buffer touch a common element."""
    return common_element(a[0], a[1], a[2], b[0], b[1], b[2], dims) is not None


def common_element(oa: int, sha: tuple, sta: tuple, ob: int, shb: tuple, stb: tuple, dims: tuple = ()) -> int | None:
    """The flat offset of an element both access patterns (element offset, shape, strides) touch, or None. `dims`:
    the storage's (size, stride) per dimension (`storage_dims`), or () if unknown."""
    if sha == shb and sta == stb:
        rel = _same_geometry(ob - oa, sha, sta)
        if rel is not _NOT_NESTED:
            return None if rel is None else oa + rel
    ba, bb = _box(oa, sha, sta, dims), _box(ob, shb, stb, dims)
    if ba is not None and bb is not None:
        return _box_meet(ba, bb, dims)
    ea, eb = _elements(oa, sha, sta), _elements(ob, shb, stb)
    both = np.intersect1d(ea, eb)
    return int(both[0]) if both.size else None


_NOT_NESTED = -1  # (a common element's offset relative to the first pattern is never negative)


@functools.lru_cache(maxsize=1 << 16)
def _same_geometry(d: int, shape: tuple, strides: tuple) -> int | None:
    """Offset, relative to the first, of an element two patterns of one geometry `d` elements apart share; None if
    they share none; _NOT_NESTED if the lattice test does not apply. Cached: a loop nest checks the same few
    (distance, geometry) pairs over and over."""
    dims = sorted(((s, n) for n, s in zip(shape, strides) if n > 1 and s != 0), reverse=True)
    if not _nested(dims):
        return _NOT_NESTED
    ks = _lattice(d, dims)
    return None if ks is None else sum(max(k, 0) * s for k, (s, _) in zip(ks, dims))


def _nested(dims: list) -> bool:
    """Each stride exceeds the span of all smaller-stride dims: coordinates decompose uniquely."""
    span = 0
    for s, n in reversed(dims):
        if s <= span:
            return False
        span += (n - 1) * s
    return True


def _lattice(d: int, dims: list) -> list | None:
    """Coefficients k with |k_j| < n_j and sum k_j s_j == d, or None (dims sorted by stride, descending)."""
    if not dims:
        return [] if d == 0 else None
    (s, n), rest = dims[0], dims[1:]
    span = sum((m - 1) * t for t, m in rest)
    for k in {d // s, -((-d) // s)}:
        if abs(k) < n and abs(d - k * s) <= span:
            tail = _lattice(d - k * s, rest)
            if tail is not None:
                return [k] + tail
    return None


@functools.lru_cache(maxsize=1 << 16)
def _box(off: int, shape: tuple, strides: tuple, dims: tuple) -> tuple | None:
    """The access as one arithmetic progression (start, step, count) per storage dimension, when each of its
    dimensions walks exactly one storage dimension without leaving it (tiles of a block-dimension buffer, slices of
    a tile: the common case); None otherwise. Two such accesses meet iff they meet in every storage dimension,
    which is cheap where materialising both element sets of differently shaped accesses is not."""
    if not dims or off < 0:
        return None
    start, rest = [], off
    for n, s in dims:
        start.append(rest // s % n)
        rest -= (rest // s % n) * s
    if rest or off >= dims[0][0] * dims[0][1]:
        return None
    prog = [(x, 0, 1) for x in start]
    for n, s in zip(shape, strides):
        if n == 1 or s == 0:
            continue
        d = next((i for i, (_, ds) in enumerate(dims) if s % ds == 0 and s // ds < dims[i][0]), None)
        if d is None or s < 0 or prog[d][2] != 1:
            return None
        k = s // dims[d][1]
        if start[d] + (n - 1) * k >= dims[d][0]:
            return None
        prog[d] = (start[d], k, n)
    return tuple(prog)


def _box_meet(ba: tuple, bb: tuple, dims: tuple) -> int | None:
    """A flat element both boxes contain, or None."""
    flat = 0
    for (a0, ka, na), (b0, kb, nb), (_, s) in zip(ba, bb, dims):
        x = _progressions_meet(a0, ka, na, b0, kb, nb)
        if x is None:
            return None
        flat += x * s
    return flat


def _progressions_meet(a0: int, ka: int, na: int, b0: int, kb: int, nb: int) -> int | None:
    """The smallest common value of {a0 + ka*i, i < na} and {b0 + kb*j, j < nb}, or None."""
    if max(ka, 1) == 1 and max(kb, 1) == 1:
        lo, hi = max(a0, b0), min(a0 + na - 1, b0 + nb - 1)
        return lo if lo <= hi else None
    common = np.intersect1d(a0 + ka * np.arange(na), b0 + kb * np.arange(nb))
    return int(common[0]) if common.size else None


def _elements(off: int, shape: tuple, strides: tuple) -> np.ndarray:
    out = np.array([off], dtype=np.int64)
    for n, s in zip(shape, strides):
        if n > 1 and s != 0:
            out = (out[:, None] + s * np.arange(n, dtype=np.int64)[None, :]).ravel()
    return np.unique(out)
