"""Region dependences between instructions: true (read after write), anti (write after read), output (write after write).

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

Box = list  # [p0, p1, lo, hi, end]


class DepTracker:
    def __init__(self, written: set[int] | None = None) -> None:
        """`written`: the buffers some instruction writes (None: all). Readers of the others need no tracking."""
        self.writers: dict[int, list[Box]] = {}
        self.readers: dict[int, list[Box]] = {}
        self.written = written

    def ready(self, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> float:
        """Earliest start allowed by the data dependences (0 if none)."""
        t = 0.0
        writers, readers = self.writers, self.readers
        for a in reads:
            t = _latest(writers.get(a.buffer), a, t)
        for a in writes:
            t = _latest(writers.get(a.buffer), a, t)
            t = _latest(readers.get(a.buffer), a, t)
        return t

    def record(self, reads: tuple[Access, ...], writes: tuple[Access, ...], end: float) -> None:
        written = self.written
        for a in reads:
            if written is None or a.buffer in written:
                _add_reader(self.readers.setdefault(a.buffer, []), a, end)
        for a in writes:
            p0, p1, lo, hi = a.p0, a.p1, a.lo, a.hi
            w = self.writers.setdefault(a.buffer, [])
            if w:
                w[:] = [b for b in w if not (p0 <= b[0] and b[1] <= p1 and lo <= b[2] and b[3] <= hi)]
            r = self.readers.get(a.buffer)
            if r:
                r[:] = [b for b in r if not (p0 <= b[0] and b[1] <= p1 and lo <= b[2] and b[3] <= hi)]
            w.append([p0, p1, lo, hi, end])
            if len(w) > MAX_ENTRIES:
                _merge_oldest(w)


def _latest(boxes: list[Box] | None, a: Access, t: float) -> float:
    if boxes:
        p0, p1, lo, hi = a.p0, a.p1, a.lo, a.hi
        for b in boxes:
            if b[4] > t and b[0] < p1 and p0 < b[1] and b[2] < hi and lo < b[3]:
                t = b[4]
    return t


def _add_reader(boxes: list[Box], a: Access, end: float) -> None:
    for b in boxes:
        if b[0] == a.p0 and b[1] == a.p1 and b[2] == a.lo and b[3] == a.hi:
            if end > b[4]:
                b[4] = end
            return
    boxes.append([a.p0, a.p1, a.lo, a.hi, end])
    if len(boxes) > MAX_ENTRIES:
        _merge_oldest(boxes)


def _merge_oldest(boxes: list[Box]) -> None:
    """Replace the older half (by end time) by its bounding box, ending at the latest of their ends."""
    boxes.sort(key=lambda b: b[4])
    half = len(boxes) // 2
    old = boxes[:half]
    merged = [min(b[0] for b in old), max(b[1] for b in old), min(b[2] for b in old), max(b[3] for b in old),
              old[-1][4]]
    boxes[:] = [merged] + boxes[half:]
