"""Region dependences between instructions: true (read after write), anti (write after read), output (write after
write).

Per buffer id, the tracker keeps the recent writers and readers as boxes [p0, p1) x [lo, hi) with the time their
instruction ends. An instruction may start only after
    every earlier writer overlapping one of its reads or writes has ended (true, output dependence), and
    every earlier reader overlapping one of its writes has ended (anti dependence).

HBM rule. By default (`HBM_DEPS`, "range") an HBM access is the one byte range [lo, hi) its access pattern spans,
so two DMAs writing disjoint but interleaved rows of one tensor wait for each other. Whether neuronxcc orders such
DMAs is not documented (docs/notes/model8.md lists what was searched); benchmarks/trn2_hbm_order.py is the hardware
measurement that decides it. `by_pattern=True` (environment TILEC_MODEL_HBM_DEPS=pattern, or `estimate(...,
hbm_rule="pattern")`) is the other outcome, for what-if runs: two HBM accesses conflict only if their access patterns
(Access.pattern) share an element, by tilec.patterns.common_element, the rule the interpreter's race check uses.

The lists stay short by three rules:
  * a new write drops the writers and readers it covers completely: it ends after all of them (it waited for them),
    so anyone who would have waited for them now waits for it, at least as long (under the pattern rule a write
    covers only what its own elements cover: a dense pattern its whole range, a strided one only its own pattern);
  * a reader with the same box as a kept one only raises that entry's end;
  * (exact) when a list grows past `COMPACT_AT` entries, the entries that can no longer delay anyone are dropped:
    those ending no later than the buffer's frontier, the earliest time any later instruction touching the buffer
    can be given as its floor (the schedule's `frontier(buffer)`: its engine's clock for a compute instruction, its
    trigger stream's latest trigger for a DMA; docs/notes/model14.md). `ready` takes the latest end above the floor,
    so an entry ending by the floor changes nothing. One thing does see dropped entries: whether a DMA depends on
    nothing at all (it then leads its stream, schedule.py). The dropped boxes are kept, without times, as the
    buffer's `ghosts`, which `touched` consults; they are coalesced into exact unions (one bounding box only past
    `MAX_GHOSTS` boxes that do not union, which can only make a DMA wait in its stream's order).
  * Only if a list is still longer than `MAX_ENTRIES` after that (more accesses in flight than that, a buffer whose
    later users' clocks lag, or a tracker without a frontier), its oldest half (by end time) is merged into exact
    unions or one bounding box with the latest end, which can only add waits. At 48 and at 256 entries the merge made
    disjoint later stores wait (docs/notes/dw18.md; tests/perf/test_deps_frontier.py); with the frontier the lists
    stay short (no families.py, core.py or calibration kernel reaches 4096, or a merge at all), so the cap costs no
    model time (docs/notes/model14.md). `approximations` counts the merges and ghost bounding boxes.
"""
from __future__ import annotations

import functools
from typing import Callable

from tilec import patterns
from tilec.perf.params import WhatIf
from tilec.trace import Access

MAX_ENTRIES = 4096  # past this (after dropping what the frontier allows) a list is merged: a sound approximation
COMPACT_AT = 64  # a list is compacted when it grows past this, then past twice what was left (amortised)
MAX_GHOSTS = 256
HBM_DEPS = WhatIf("HBM dependence rule", "TILEC_MODEL_HBM_DEPS", ("range", "pattern"), "range")

Boxes = dict  # (p0, p1, lo, hi, pattern) -> end time of the latest instruction with that box; pattern () = the box


hbm_rule = HBM_DEPS.pick


class DepTracker:
    def __init__(self, written: set[int] | None = None, by_pattern: bool = False,
                 frontier: Callable[[int, bool], float] | None = None) -> None:
        """`written`: the buffers some instruction writes (None: all). Readers of the others need no tracking.
        `by_pattern`: HBM accesses conflict only where their access patterns share an element (module docstring).
        `frontier(buffer, writers)`: a time no later instruction touching `buffer` (writing it, for the readers'
        list: `writers` False) can be given as its floor; None: nothing is dropped, long lists are merged."""
        self.by_pattern = by_pattern
        self.writers: dict[int, Boxes] = {}
        self.readers: dict[int, Boxes] = {}
        self.w_end: dict[int, float] = {}  # per buffer, an upper bound of its writers' ends (never lowered)
        self.r_end: dict[int, float] = {}
        self.written = written
        self.frontier = frontier
        self.limit: dict[tuple[bool, int], int] = {}  # (writers?, buffer) -> the length that triggers a compaction
        self.ghosts: dict[tuple[bool, int], list] = {}  # (writers?, buffer) -> dropped boxes (p0, p1, lo, hi)
        self.approximations = 0  # lists merged and ghosts boxed (the sound, inexact fallbacks)

    def ready(self, reads: tuple[Access, ...], writes: tuple[Access, ...], floor: float = 0.0) -> float:
        """Earliest start >= floor allowed by the data dependences. A buffer whose entries all end by the current
        bound is skipped without looking at its boxes (the common case: an engine's own earlier work)."""
        t = floor
        writers, readers, w_end, r_end = self.writers, self.readers, self.w_end, self.r_end
        pat = self._pattern
        for a in reads:
            if w_end.get(a.buffer, 0.0) > t:
                t = _latest(writers[a.buffer], a, t, pat(a))
        for a in writes:
            if w_end.get(a.buffer, 0.0) > t:
                t = _latest(writers[a.buffer], a, t, pat(a))
            if r_end.get(a.buffer, 0.0) > t:
                t = _latest(readers[a.buffer], a, t, pat(a))
        return t

    def _pattern(self, a: Access) -> tuple:
        return a.pattern if self.by_pattern and a.memory == "hbm" else ()

    def record(self, reads: tuple[Access, ...], writes: tuple[Access, ...], end: float) -> None:
        written, readers, writers = self.written, self.readers, self.writers
        for a in reads:
            if written is None or a.buffer in written:
                boxes = readers.get(a.buffer)
                if boxes is None:
                    boxes = readers[a.buffer] = {}
                key = (a.p0, a.p1, a.lo, a.hi, self._pattern(a))
                if boxes.get(key, -1.0) < end:
                    boxes[key] = end
                    if self.r_end.get(a.buffer, 0.0) < end:
                        self.r_end[a.buffer] = end
                    if len(boxes) > self.limit.get((False, a.buffer), COMPACT_AT):
                        self._compact(boxes, False, a.buffer)
        for a in writes:
            p0, p1, lo, hi, pat = a.p0, a.p1, a.lo, a.hi, self._pattern(a)
            w = writers.get(a.buffer)
            if w is None:
                w = writers[a.buffer] = {}
            elif w:
                _drop_covered(w, p0, p1, lo, hi, pat)
            r = readers.get(a.buffer)
            if r:
                _drop_covered(r, p0, p1, lo, hi, pat)
            w[(p0, p1, lo, hi, pat)] = end
            if self.w_end.get(a.buffer, 0.0) < end:
                self.w_end[a.buffer] = end
            if len(w) > self.limit.get((True, a.buffer), COMPACT_AT):
                self._compact(w, True, a.buffer)

    def _compact(self, boxes: Boxes, writers: bool, buffer: int) -> None:
        """Drop the entries ending by the buffer's frontier (their boxes become ghosts); merge only if still too
        many. The next compaction comes when the list has doubled (at most at MAX_ENTRIES)."""
        if self.frontier is not None:
            f = self.frontier(buffer, writers)
            gone = [k for k, end in boxes.items() if end <= f]
            if gone:
                ghosts = self.ghosts.setdefault((writers, buffer), [])
                for k in gone:
                    if boxes.pop(k) > 0.0:  # an entry ending at 0 never made anyone wait
                        ghosts.append(k[:4])
                if len(ghosts) > MAX_GHOSTS:
                    joined = _coalesce(ghosts)
                    self.approximations += joined is None
                    ghosts[:] = joined or [_bounding(ghosts)]
        if len(boxes) > MAX_ENTRIES:
            _merge_oldest(boxes)
            self.approximations += 1
        self.limit[(writers, buffer)] = min(max(COMPACT_AT, 2 * len(boxes)), MAX_ENTRIES)

    def touched(self, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> bool:
        """Whether a dropped entry conflicts with these accesses (a read with a dropped writer, a write with a
        dropped writer or reader): with `ready`, whether the instruction depends on anything at all."""
        ghosts = self.ghosts
        if not ghosts:
            return False
        for a, lists in [(a, (True,)) for a in reads] + [(a, (True, False)) for a in writes]:
            for kind in lists:
                for b0, b1, blo, bhi in ghosts.get((kind, a.buffer), ()):
                    if b0 < a.p1 and a.p0 < b1 and blo < a.hi and a.lo < bhi:
                        return True
        return False


def _latest(boxes: Boxes, a: Access, t: float, pat: tuple) -> float:
    p0, p1, lo, hi = a.p0, a.p1, a.lo, a.hi
    for (b0, b1, blo, bhi, bpat), end in boxes.items():
        if end > t and b0 < p1 and p0 < b1 and blo < hi and lo < bhi and (not pat or not bpat or _meet(pat, bpat)):
            t = end
    return t


@functools.lru_cache(maxsize=1 << 16)
def _meet(a: tuple, b: tuple) -> bool:
    """Whether two HBM access patterns (itemsize, offset, shape, strides, storage dims) share an element."""
    if a[0] != b[0] or a[4] != b[4]:  # other element sizes or storage shapes (views of one tensor): the byte ranges
        return True  #                  overlap, which is all that is known
    return patterns.meet(a[1:4], b[1:4], a[4])


def _dense(pat: tuple) -> bool:
    """Whether an access pattern touches every element between its first and last (a contiguous block)."""
    dims = sorted((s, n) for n, s in zip(pat[2], pat[3]) if n > 1)
    span = 1
    for s, n in dims:
        if s != span:
            return False
        span *= n
    return True


def _drop_covered(boxes: Boxes, p0: int, p1: int, lo: int, hi: int, pat: tuple = ()) -> None:
    if pat and not _dense(pat):  # a strided write covers only entries with its own pattern
        covered = [k for k in boxes if k[4] == pat]
    else:
        covered = [k for k in boxes if p0 <= k[0] and k[1] <= p1 and lo <= k[2] and k[3] <= hi]
    for k in covered:
        del boxes[k]


def _merge_oldest(boxes: Boxes) -> None:
    """Replace the older half (by end time) by fewer boxes ending at the latest of their ends: their exact unions
    where they tile rectangles (boxes of one partition band with touching column ranges, then such rows of one column
    range with touching partition bands), if that at least halves them; else their one bounding box.

    Exact unions first, because one bounding box over bands written one after the other (a tile filled by many small
    DMAs, all of partitions 0-7's columns, then all of partitions 8-15's ...) covers columns the next band has not
    written yet: every later write there would wait for the box's latest end, a false output dependence that chains
    independent DMAs (docs/notes/fid15.md: 432 us instead of 46 us for 4,096 DMAs of 8 rows in that order)."""
    ordered = sorted(boxes.items(), key=lambda kv: kv[1])
    old = ordered[:len(ordered) // 2]
    for k, _ in old:
        del boxes[k]
    merged = _unions(old) if all(not k[4] for k, _ in old) else []
    if not merged or len(merged) > len(old) // 2:
        merged = [((min(k[0] for k, _ in old), max(k[1] for k, _ in old), min(k[2] for k, _ in old),
                    max(k[3] for k, _ in old), ()), old[-1][1])]  # the bounding box: its pattern is unknown
    for k, end in merged:
        boxes[k] = max(boxes.get(k, 0.0), end)


def _coalesce(boxes: list) -> list | None:
    """Fewer boxes covering exactly the same cells (their unions), or None if that does not halve them."""
    joined = [k[:4] for k, _ in _unions([((*k, ()), 0.0) for k in boxes])]
    return joined if len(joined) <= MAX_GHOSTS // 2 else None


def _bounding(boxes: list) -> tuple[int, int, int, int]:
    """One box covering them all (a superset: only ever more conflicts)."""
    return min(k[0] for k in boxes), max(k[1] for k in boxes), min(k[2] for k in boxes), max(k[3] for k in boxes)


def _unions(entries: list) -> list:
    """Coalesce boxes (pattern-free) whose union is a box: along the columns within a partition band, then along the
    partitions within a column range. Each result ends at the latest end of the boxes it covers."""
    def run(items: list, same: tuple[int, int], lo: int, hi: int) -> list:
        """Join boxes equal in fields `same` whose [lo, hi) fields touch or overlap."""
        out: list = []
        for k, end in sorted(items, key=lambda kv: (kv[0][same[0]], kv[0][same[1]], kv[0][lo])):
            last = out[-1][0] if out else None
            if last is not None and all(last[f] == k[f] for f in same) and k[lo] <= last[hi]:
                joined = list(last)
                joined[hi] = max(last[hi], k[hi])
                out[-1] = (tuple(joined), max(out[-1][1], end))
            else:
                out.append((k, end))
        return out

    rows = run([(k[:4], end) for k, end in entries], (0, 1), 2, 3)  # columns within a partition band
    rects = run(rows, (2, 3), 0, 1)  # partition bands within a column range
    return [((*k, ()), end) for k, end in rects]
