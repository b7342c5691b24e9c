"""Loop-carried dependence detection for `nl.affine_range` loops (a check AWS's simulator does not make).

Every read and write inside an affine loop of a buffer allocated outside it is logged with the iteration number as
an affine access pattern (offset, shape, strides in elements). When the loop ends, two accesses from different
iterations conflict if they touch a common element and at least one writes, except two PSUM matmul accumulations
(`acc += nc_matmul(...)`), which the hardware performs in any order. The search is a sort-and-sweep over flat
bounding intervals (vectorised), then an exact test on the few overlapping pairs (tilec.patterns.common_element: an
O(depth) lattice test when the two patterns have the same geometry, else per storage dimension or an intersection of
the materialised element sets; the performance model's per-pattern HBM rule uses the same test). Accesses then move to
the enclosing affine loop, tagged with its iteration, unless the buffer is private to that loop's body.
"""
from __future__ import annotations

import numpy as np

from tilec import patterns
from tilec.nki import rules

READ, WRITE, ACC = 0, 1, 2
_MAX_PAIRS = 4_000_000


class AccessLog:
    __slots__ = ("frame", "iteration", "by_buf", "written", "info")

    def __init__(self, frame: object) -> None:
        self.frame = frame
        self.iteration = -1
        self.by_buf: dict[int, list] = {}
        self.written: set[int] = set()
        self.info: dict[int, object] = {}  # buffer id -> Buffer (for its scope, name, shape)

    def add(self, buf: object, off: int, shape: tuple, strides: tuple, kind: int, where: tuple) -> None:
        recs = self.by_buf.get(buf.id)
        if recs is None:
            recs = self.by_buf[buf.id] = []
            self.info[buf.id] = _BufRef(buf)
        recs.append((self.iteration, kind, off, shape, strides, where))
        if kind:
            self.written.add(buf.id)


class _BufRef:
    """What the check needs of a buffer, without keeping its storage alive."""

    __slots__ = ("name", "memory", "shape", "scope")

    def __init__(self, buf: object) -> None:
        self.name, self.memory, self.shape, self.scope = buf.name, buf.memory, buf.shape, buf.scope


def close(run: object, frame: object) -> None:
    log = frame.log
    if frame.trip > 1:
        for bid in log.written:
            try:
                _check_buffer(log.by_buf[bid], log.info[bid], frame)
            except rules.LoopCarriedDependenceError as err:
                if not run.trace.skip_middle_end:
                    raise
                _carried(run, err)
    parent = run.cur_log()
    if parent is None:
        return
    for bid, recs in log.by_buf.items():
        ref = log.info[bid]
        if parent.frame.id in ref.scope:
            continue  # allocated inside the parent's body: private to one parent iteration
        it = parent.iteration
        out = parent.by_buf.get(bid)
        if out is None:
            out = parent.by_buf[bid] = []
            parent.info[bid] = ref
        out.extend((it,) + r[1:] for r in recs)
        if bid in log.written:
            parent.written.add(bid)


def _extent(off: int, shape: tuple, strides: tuple) -> tuple[int, int]:
    lo = hi = off
    for n, s in zip(shape, strides):
        e = (n - 1) * s
        if e < 0:
            lo += e
        else:
            hi += e
    return lo, hi


def _check_buffer(recs: list, ref: _BufRef, frame: object) -> None:
    kinds = {r[1] for r in recs}
    if kinds == {ACC} or len({r[0] for r in recs}) < 2:
        return
    n = len(recs)
    lo, hi = np.empty(n, np.int64), np.empty(n, np.int64)
    for i, r in enumerate(recs):
        lo[i], hi[i] = _extent(r[2], r[3], r[4])
    it = np.fromiter((r[0] for r in recs), np.int64, n)
    kind = np.fromiter((r[1] for r in recs), np.int64, n)
    dims = patterns.storage_dims(tuple(ref.shape))
    for a, b in _candidate_pairs(lo, hi, it, kind):
        common = _common_element(recs[a], recs[b], dims)
        if common is not None:
            _raise(recs[a], recs[b], common, ref, frame)


def _candidate_pairs(lo: np.ndarray, hi: np.ndarray, it: np.ndarray, kind: np.ndarray):
    """Pairs (a, b) whose flat intervals overlap, from different iterations, that would conflict if they meet."""
    order = np.argsort(lo, kind="stable")
    lo_s, hi_s = lo[order], hi[order]
    n = len(order)
    ends = np.searchsorted(lo_s, hi_s, side="right")
    counts = np.maximum(ends - np.arange(1, n + 1), 0)
    total = int(counts.sum())
    if total == 0:
        return
    for start in range(0, n, max(1, n * _MAX_PAIRS // max(total, 1))):
        stop = min(n, start + max(1, n * _MAX_PAIRS // max(total, 1)))
        c = counts[start:stop]
        first = np.repeat(np.arange(start, stop), c)
        step = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c) + 1
        a, b = order[first], order[first + step]
        ka, kb = kind[a], kind[b]
        keep = (it[a] != it[b]) & ~((ka == READ) & (kb == READ)) & ~((ka == ACC) & (kb == ACC))
        for x, y in zip(a[keep].tolist(), b[keep].tolist()):
            yield x, y


def _common_element(ra: tuple, rb: tuple, dims: tuple = ()) -> int | None:
    (_, _, oa, sha, sta, _), (_, _, ob, shb, stb, _) = ra, rb
    return patterns.common_element(oa, sha, sta, ob, shb, stb, dims)


def _raise(ra: tuple, rb: tuple, element: int, ref: _BufRef, frame: object) -> None:
    first, second = sorted((ra, rb), key=lambda r: r[0])
    verb = {READ: "reads", WRITE: "writes", ACC: "accumulates into"}
    index = tuple(int(i) for i in np.unravel_index(element, ref.shape)) if ref.shape else ()
    both_write = first[1] != READ and second[1] != READ
    rule = "err_unexpected_output_dependencies" if both_write else "loop_carried_dependence"
    message = (f"loop-carried dependence in affine_range loop: iteration {second[0]} {verb[second[1]]} "
               f"element {list(index)} of tile '{ref.name}' ({ref.memory}, shape {tuple(ref.shape)}), which "
               f"iteration {first[0]} {verb[first[1]]}")
    detail = (f"loop at {frame.where[0]}:{frame.where[1]}; accesses at line {first[5][1]} (iteration {first[0]}) "
              f"and line {second[5][1]} (iteration {second[0]})")
    raise rules.LoopCarriedDependenceError(
        message, rule, second[5], detail,
        hint="iterations of an affine_range loop may run in any order or overlap on hardware; use "
             "nl.sequential_range for loops with carried dependences, or give each iteration its own tile")


def _carried(run: object, err: rules.LoopCarriedDependenceError) -> None:
    """Under skip_middle_end_transformations SDK 2.21 ran affine_range iterations in order, like sequential_range
    (the course README; fidelity-cases/affine_carried.py), and the interpreter runs them in order too: the carried
    value is the sequential one. Without the decorator the compiler may reorder, so the race stays an error."""
    rules.later_release(run, err.message + " (kept in order by skip_middle_end_transformations)", err.rule,
                        err.where, "without skip_middle_end_transformations, and in NKI 0.2+ (Neuron SDK 2.27) "
                        "where the decorator is gone, only nl.sequential_range keeps the order", err.detail,
                        hint="use nl.sequential_range for loops with carried dependences",
                        error=rules.LoopCarriedDependenceError)
