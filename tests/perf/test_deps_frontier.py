"""The dependence tracker's exact compaction (tilec/perf/deps.py): entries ending by their buffer's frontier are
dropped, the rest kept; the schedule must equal the one an unbounded tracker (nothing dropped, nothing merged) gives,
on hand-made traces that exercise each part of the rule and on compiled kernels whose lists grow long."""
from __future__ import annotations

import dataclasses
import pathlib

import pytest

from tilec.compiler.api import compile_file
from tilec.lang import api as lang
from tilec.perf import deps
from tilec.perf.api import estimate
from tilec.perf.params import TRN2, Param
from tilec.perf.tracebuild import TraceBuilder

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROUND = dataclasses.replace(TRN2, dma_desc_ns=Param(0.0, "test"), dma_latency_ns=Param(1000.0, "test"),
                            startup_ns=Param(0.0, "test"), dma_engine_bw=Param(1.0, "test"),
                            dma_write_ack_ns=Param(0.0, "test"))


@pytest.fixture
def trackers(monkeypatch):
    """Every DepTracker the schedule builds in this test, to look at its lists afterwards."""
    made: list[deps.DepTracker] = []

    class Kept(deps.DepTracker):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr("tilec.perf.schedule.DepTracker", Kept)
    return made


def schedules(trace, monkeypatch, **kw):
    """(the schedule as the model computes it, the schedule of an unbounded tracker)."""
    tight = estimate(trace, **kw)._schedule
    with monkeypatch.context() as m:
        m.setattr(deps, "MAX_ENTRIES", 10 ** 9)
        m.setattr(deps, "COMPACT_AT", 10 ** 9)
        exact = estimate(trace, **kw)._schedule
    return tight, exact


def same(a, b) -> bool:
    return (a.start, a.end, a.trigger, a.lane) == (b.start, b.end, b.trigger, b.lane)


def interleaved_burst(n: int) -> TraceBuilder:
    """VectorE computes one tile; then n stores of its partition rows, each 64 B into its own chunk of y: the even
    chunks first, then the odd ones, all ready at once. No store overlaps another."""
    b = TraceBuilder("k")
    t = b.buffer("t", "sbuf", 128, 16 * n)
    y = b.buffer("y", "hbm", 1, 128 * n)
    b.compute("vector", "memset", reads=[], writes=[b.at(t)], partitions=128, free=16 * n, line=1)
    order = list(range(0, n, 2)) + list(range(1, n, 2))
    for k, j in enumerate(order):
        p = k % 128
        b.dma(dst=b.at(y, lo=64 * j, hi=64 * j + 64), src=b.at(t, p, p + 1, 64 * (k // 128), 64 * (k // 128) + 64),
              partitions=1, nbytes=64, line=2)
    return b


def test_a_burst_past_the_old_cap_is_exact(monkeypatch, trackers):
    """600 stores in flight at once: the frontier (the stream's latest trigger) cannot drop them, so only the cap
    bounds the list. At the old cap of 256 the oldest half became one bounding box (the even chunks do not touch,
    so they have no exact union) that every odd chunk overlapped: the odd stores waited for the box's end. The cap
    is now past any burst in the benchmarks, and the schedule is the unbounded tracker's."""
    b = interleaved_burst(600)
    tight, exact = schedules(b.trace, monkeypatch, params=ROUND)
    assert same(tight, exact)
    assert all(t.approximations == 0 for t in trackers)
    with monkeypatch.context() as m:
        m.setattr(deps, "MAX_ENTRIES", 256)
        old = estimate(b.trace, params=ROUND)._schedule
    assert max(old.end) > max(exact.end)  # the old cap's false waits (what this test guards against)


def steady_stores(n: int) -> TraceBuilder:
    """n iterations of: VectorE writes a row tile (1 µs-ish), a store copies it into y, odd chunks after even ones
    in each pair of iterations: y's writer list would grow to n without the compaction."""
    b = TraceBuilder("k")
    y = b.buffer("y", "hbm", 1, 256 * n)
    x = b.buffer("x", "sbuf", 128, 512)
    for i in range(n):
        t = b.buffer(f"t{i}", "sbuf", 1, 512)
        b.compute("vector", "tensor_copy", reads=[b.at(x, 0, 1)], writes=[b.at(t)], partitions=1, free=512, line=1)
        j = 2 * (i // 2) + (1 - i % 2)
        b.dma(dst=b.at(y, lo=256 * j, hi=256 * j + 256), src=b.at(t, 0, 1, 0, 64), partitions=1, nbytes=256,
              line=2)
    return b


def test_steady_state_lists_stay_short(monkeypatch, trackers):
    """2,000 stores paced by VectorE: each store's entry is dropped once the stream's triggers have passed its end,
    so y's writer list stays near the compaction threshold and nothing is merged; same schedule as unbounded."""
    b = steady_stores(2000)
    tight, exact = schedules(b.trace, monkeypatch, params=ROUND)
    assert same(tight, exact)
    tracker = trackers[0]
    assert tracker.approximations == 0
    assert max(len(w) for w in tracker.writers.values()) <= 2 * deps.COMPACT_AT
    assert sum(len(g) for g in tracker.ghosts.values()) > 0  # entries were dropped (and kept as ghosts)


def only_a_dropped_writer() -> TraceBuilder:
    """VectorE writes a[0:1] first, then b, which a store copies out (a DMA that depends on VectorE: it sets the
    'dma vector' stream's trigger clock), then 80 more writes to other rows of a, enough to compact a's list
    (their ends are all later). The last store reads a[0:1] only: the one writer it depends on has been dropped."""
    b = TraceBuilder("k")
    a = b.buffer("a", "sbuf", 128, 64)
    bb = b.buffer("b", "sbuf", 128, 64)
    y = b.buffer("y", "hbm", 1, 1 << 16)
    b.compute("vector", "memset", reads=[], writes=[b.at(a, 0, 1)], partitions=1, free=64, line=1)
    b.compute("vector", "memset", reads=[], writes=[b.at(bb)], partitions=128, free=64, line=2)
    b.dma(dst=b.at(y, lo=0, hi=32768), src=b.at(bb), partitions=128, nbytes=32768, line=3)
    for r in range(1, 81):
        b.compute("vector", "memset", reads=[], writes=[b.at(a, r, r + 1, 0, 1)], partitions=1, free=1, line=4)
    b.dma(dst=b.at(y, lo=40000, hi=40256), src=b.at(a, 0, 1), partitions=1, nbytes=256, line=5)
    return b


def test_a_dma_depending_only_on_a_dropped_entry_does_not_lead(monkeypatch, trackers):
    """Whether a DMA depends on anything decides whether it leads its stream (schedule.py); the dropped writer of
    a[0:1] is kept as a ghost, so the last store still waits for its stream's previous trigger as it would with
    every entry kept (without the ghost it would trigger at 0)."""
    b = only_a_dropped_writer()
    tight, exact = schedules(b.trace, monkeypatch, params=ROUND)
    assert trackers[0].ghosts  # the entry was dropped
    assert same(tight, exact)
    last = len(b.trace.instrs) - 1
    assert tight.trigger[last] == tight.trigger[2] > 0.0


def compiled(name: str, sizes: dict[str, int]):
    c = compile_file(str(ROOT / "benchmarks" / "families" / name), sizes)
    return c.run_traced(numerics=False, **lang.random_inputs(c.program, seed=0))[1]


@pytest.mark.parametrize("name, sizes", [("depthwise3x3.tl", {"H": 60}), ("depthwise_mult3x3.tl", {"N": 2, "H": 59})])
def test_compiled_kernels_match_the_unbounded_tracker(name, sizes, monkeypatch, trackers):
    """Kernels with hundreds of stores into one output (the old cap of 256 merged their lists): the compacted
    tracker drops entries and gives the unbounded tracker's schedule, with no merge. (depthwise3x3 at H = 60: 58
    output rows in 3 blocks of 20, 18: one store per (row block, channel), 432; at the default 56 rows its 4 blocks
    of 14 are one store per group since dw21; likewise depthwise_mult3x3 at H = 59, 512 stores.)"""
    trace = compiled(name, sizes)
    tight, exact = schedules(trace, monkeypatch)
    assert same(tight, exact)
    assert trackers[0].approximations == 0
    assert any(trackers[0].ghosts.values())
