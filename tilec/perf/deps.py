"""Region dependences between instructions: true (read after write), anti (write after read), output (write after
write).

Per buffer id, the tracker keeps the recent writers and readers as boxes [p0, p1) x [lo, hi) with the time their
instruction ends. An instruction may start only after
    every earlier writer overlapping one of its reads or writes has ended (true, output dependence), and
    every earlier reader overlapping one of its writes has ended (anti dependence).

The lists stay short by two sound simplifications:
  * a new write drops the writers and readers it covers completely: it ends after all of them (it waited for them),
    so anyone who would have waited for them now waits for it, at least as long;
  * a reader with the same box as a kept one only raises that entry's end; when a list grows past `MAX_ENTRIES`,
    its oldest half (by end time) is merged into one bounding box with the latest end, which can only add waits.
"""
from __future__ import annotations

from tilec.trace import Access

MAX_ENTRIES = 48

Boxes = dict  # (p0, p1, lo, hi) -> end time of the latest instruction with that box


class DepTracker:
    def __init__(self, written: set[int] | None = None) -> None:
        """`written`: the buffers some instruction writes (None: all). Readers of the others need no tracking."""
        self.writers: dict[int, Boxes] = {}
        self.readers: dict[int, Boxes] = {}
        self.w_end: dict[int, float] = {}  # per buffer, an upper bound of its writers' ends (never lowered)
        self.r_end: dict[int, float] = {}
        self.written = written

    def ready(self, reads: tuple[Access, ...], writes: tuple[Access, ...], floor: float = 0.0) -> float:
        """Earliest start >= floor allowed by the data dependences. A buffer whose entries all end by the current
        bound is skipped without looking at its boxes (the common case: an engine's own earlier work)."""
        t = floor
        writers, readers, w_end, r_end = self.writers, self.readers, self.w_end, self.r_end
        for a in reads:
            if w_end.get(a.buffer, 0.0) > t:
                t = _latest(writers[a.buffer], a, t)
        for a in writes:
            if w_end.get(a.buffer, 0.0) > t:
                t = _latest(writers[a.buffer], a, t)
            if r_end.get(a.buffer, 0.0) > t:
                t = _latest(readers[a.buffer], a, t)
        return t

    def record(self, reads: tuple[Access, ...], writes: tuple[Access, ...], end: float) -> None:
        written, readers, writers = self.written, self.readers, self.writers
        for a in reads:
            if written is None or a.buffer in written:
                boxes = readers.get(a.buffer)
                if boxes is None:
                    boxes = readers[a.buffer] = {}
                key = (a.p0, a.p1, a.lo, a.hi)
                if boxes.get(key, -1.0) < end:
                    boxes[key] = end
                    if self.r_end.get(a.buffer, 0.0) < end:
                        self.r_end[a.buffer] = end
                    if len(boxes) > MAX_ENTRIES:
                        _merge_oldest(boxes)
        for a in writes:
            p0, p1, lo, hi = a.p0, a.p1, a.lo, a.hi
            w = writers.get(a.buffer)
            if w is None:
                w = writers[a.buffer] = {}
            elif w:
                _drop_covered(w, p0, p1, lo, hi)
            r = readers.get(a.buffer)
            if r:
                _drop_covered(r, p0, p1, lo, hi)
            w[(p0, p1, lo, hi)] = end
            if self.w_end.get(a.buffer, 0.0) < end:
                self.w_end[a.buffer] = end
            if len(w) > MAX_ENTRIES:
                _merge_oldest(w)


def _latest(boxes: Boxes, a: Access, t: float) -> float:
    p0, p1, lo, hi = a.p0, a.p1, a.lo, a.hi
    for (b0, b1, blo, bhi), end in boxes.items():
        if end > t and b0 < p1 and p0 < b1 and blo < hi and lo < bhi:
            t = end
    return t


def _drop_covered(boxes: Boxes, p0: int, p1: int, lo: int, hi: int) -> None:
    covered = [k for k in boxes if p0 <= k[0] and k[1] <= p1 and lo <= k[2] and k[3] <= hi]
    for k in covered:
        del boxes[k]


def _merge_oldest(boxes: Boxes) -> None:
    """Replace the older half (by end time) by its bounding box, ending at the latest of their ends."""
    ordered = sorted(boxes.items(), key=lambda kv: kv[1])
    old = ordered[:len(ordered) // 2]
    merged = (min(k[0] for k, _ in old), max(k[1] for k, _ in old), min(k[2] for k, _ in old),
              max(k[3] for k, _ in old))
    for k, _ in old:
        del boxes[k]
    boxes[merged] = max(boxes.get(merged, 0.0), old[-1][1])
