"""The copies a buffer refilled whole by DMA gets (schedule.load_copies): at most `load_versions`, and only as many as
fit in the usable SBUF beside the kernel's other allocations; and the what-if rule that bounds loop tiles' rotation
buffers the same way (TILEC_MODEL_SBUF_ROTATION=fit). Hand-made traces, the arithmetic done by hand."""
from __future__ import annotations

import dataclasses

import pytest

from tilec.errors import TilecError
from tilec.perf.api import estimate
from tilec.perf.params import TRN1, TRN2, Param
from tilec.perf.schedule import load_copies, sbuf_footprint, sbuf_plan
from tilec.perf.tracebuild import TraceBuilder

KIB = 1024


def refilled(row_bytes: int, loads: int, other_bytes: int = 0, reader_free: int = 8192) -> TraceBuilder:
    """`loads` row loads into one buffer declared once (row_bytes per partition), each read by a long VectorE op
    writing a second buffer; `other_bytes` per partition of another buffer live throughout."""
    b = TraceBuilder("k")
    x = b.buffer("x", "hbm", 1, 128 * row_bytes * loads)
    row = b.buffer("row", "sbuf", 128, row_bytes)
    out = b.buffer("out", "sbuf", 128, 64)
    if other_bytes:
        other = b.buffer("other", "sbuf", 128, other_bytes)
        b.compute("gpsimd", "memset", reads=[], writes=[b.at(other)], partitions=128, free=1, line=2)
    for i in range(loads):
        b.dma(dst=b.at(row), src=b.at(x, lo=i * 128 * row_bytes, hi=(i + 1) * 128 * row_bytes), partitions=128,
              nbytes=128 * row_bytes, line=3)
        b.compute("vector", "tensor_scalar", reads=[b.at(row)], writes=[b.at(out)], partitions=128,
                  free=reader_free, line=4)
    if other_bytes:
        b.compute("gpsimd", "tensor_scalar", reads=[b.at(other)], writes=[b.at(out)], partitions=128, free=1, line=5)
    return at_lines(b)


def at_lines(b: TraceBuilder, lines: dict[str, int] | None = None) -> TraceBuilder:
    """Give each buffer its own allocation site (a source line; `lines` by name, else its id), as a kernel's are."""
    lines = lines or {}
    b.trace.allocs[:] = [dataclasses.replace(a, file="k.py", line=lines.get(a.name, a.buffer)) for a in b.trace.allocs]
    return b


def buffer_id(b: TraceBuilder, name: str) -> int:
    return next(a.buffer for a in b.trace.allocs if a.name == name)


def test_small_buffer_gets_every_copy():
    b = refilled(4 * KIB, 20)
    assert load_copies(b.trace, 16, 2, 224 * KIB) == {buffer_id(b, "row"): 16}


def test_copies_never_exceed_the_loads():
    b = refilled(4 * KIB, 3)
    assert load_copies(b.trace, 16, 2, 224 * KIB) == {buffer_id(b, "row"): 3}


def test_copies_are_bounded_by_what_fits():
    # 224 KiB usable: other 100 KiB + out 64 B leave 124 KiB - 64 B: the row's own copy and 2 more of 40 KiB
    b = refilled(40 * KIB, 10, other_bytes=100 * KIB)
    assert load_copies(b.trace, 16, 2, 224 * KIB) == {buffer_id(b, "row"): 3}
    # trn1's usable 176 KiB leaves room for the row's own copy only: 100 + 40 + 40 > 176
    assert load_copies(b.trace, 16, 2, 176 * KIB) == {buffer_id(b, "row"): 1}


def test_two_refilled_buffers_share_the_room_evenly():
    b = TraceBuilder("k")
    x = b.buffer("x", "hbm", 1, 1 << 24)
    p = b.buffer("p", "sbuf", 128, 30 * KIB)
    q = b.buffer("q", "sbuf", 128, 30 * KIB)
    for i in range(8):
        for buf in (p, q):
            b.dma(dst=b.at(buf), src=b.at(x, lo=i * 4096, hi=i * 4096 + 4096), partitions=128, nbytes=1 << 20,
                  line=3)
            b.compute("vector", "tensor_scalar", reads=[b.at(buf)], writes=[b.at(buf)], partitions=128, free=64,
                      line=4)
    at_lines(b)
    # 224 KiB / 30 KiB = 7 copies in all: granted in turn, p (allocated first) gets the odd one
    assert load_copies(b.trace, 16, 2, 224 * KIB) == {p: 4, q: 3}


def test_rotating_loop_tiles_count_their_rotation_buffers():
    b = TraceBuilder("k")
    x = b.buffer("x", "hbm", 1, 1 << 24)
    row = b.buffer("row", "sbuf", 128, 40 * KIB)
    for i in range(6):
        t = b.buffer("t", "sbuf", 128, 50 * KIB)  # one source line: a loop tile rotating through 2 buffers
        b.dma(dst=b.at(row), src=b.at(x, lo=i * 4096, hi=i * 4096 + 4096), partitions=128, nbytes=1 << 20, line=3)
        b.compute("vector", "tensor_copy", reads=[b.at(row)], writes=[b.at(t)], partitions=128, free=64, line=4)
    at_lines(b, {"t": 9})
    spans = sbuf_footprint(b.trace, 2)
    assert (spans[0][2], spans[1][2]) == (40 * KIB, 100 * KIB)  # the row once; the loop tile's 2 buffers
    # 224 - 100 (the tile's rotation) = 124 KiB for the row: 3 copies of 40 KiB
    assert load_copies(b.trace, 16, 2, 224 * KIB) == {row: 3}


def load_read_pairs(est) -> list[tuple[int, int]]:
    """(load k + 1, reader of load k) instruction indices."""
    instrs = est._trace.instrs
    loads = [i for i, ins in enumerate(instrs) if ins.engine == "dma"]
    reads = [i for i, ins in enumerate(instrs) if ins.engine == "vector"]
    return list(zip(loads[1:], reads))


def test_without_room_the_next_load_waits_for_the_readers():
    """One copy: each load is a write after the previous row's read, so loads and reads alternate; with room for
    more copies the next load runs during the read. The model applies the bound itself."""
    roomy = estimate(refilled(40 * KIB, 10).trace)
    tight_trace = refilled(40 * KIB, 10, other_bytes=150 * KIB).trace
    tight = estimate(tight_trace)
    assert load_copies(tight_trace, 16, 2, 224 * KIB) == {2: 1}
    s, r = tight._schedule, roomy._schedule
    assert all(s.start[load] >= s.end[read] for load, read in load_read_pairs(tight))
    assert all(r.start[load] < r.end[read] for load, read in load_read_pairs(roomy))
    # per row: load 14.2 us + read 8.6 us one after the other, against the load alone
    assert tight.total_ns > roomy.total_ns + 9 * 8000


def test_the_usable_sbuf_comes_from_the_target():
    assert TRN2.sbuf_usable_bytes.value == 224 * KIB and TRN1.sbuf_usable_bytes.value == 176 * KIB
    small = dataclasses.replace(TRN2, sbuf_usable_bytes=Param(60 * KIB, "test"))  # one copy of the 40 KiB row
    b = refilled(40 * KIB, 10)
    assert estimate(b.trace, params=small).total_ns > estimate(b.trace).total_ns


def rotating(tile_bytes: int, iterations: int = 6) -> TraceBuilder:
    """A loop tile (one source line) loaded and read by VectorE each iteration, written back to HBM."""
    b = TraceBuilder("k")
    x = b.buffer("x", "hbm", 1, 1 << 26)
    y = b.buffer("y", "hbm", 1, 1 << 26)
    for i in range(iterations):
        t = b.buffer("t", "sbuf", 128, tile_bytes)
        b.dma(dst=b.at(t), src=b.at(x, lo=i * 4096, hi=i * 4096 + 4096), partitions=128, nbytes=128 * tile_bytes,
              line=3)
        b.compute("vector", "tensor_scalar", reads=[b.at(t)], writes=[b.at(t)], partitions=128, free=4096, line=4)
        b.dma(dst=b.at(y, lo=i * 4096, hi=i * 4096 + 4096), src=b.at(t), partitions=128, nbytes=128 * tile_bytes,
              line=5)
    return at_lines(b, {"t": 9})


def test_rotation_buffers_are_bounded_only_under_the_fit_rule():
    """150 KiB tiles: two rotation buffers (300 KiB) overflow 224 KiB. "free" (the what-if) rotates through two
    anyway; "fit" (the default) gives the site one, so each load waits for the previous tile's store."""
    trace = rotating(150 * KIB).trace
    assert sbuf_plan(trace, 2, 16, 224 * KIB, bound_rotation=False)[0] == {("k.py", 9): 2}
    assert sbuf_plan(trace, 2, 16, 224 * KIB, bound_rotation=True)[0] == {("k.py", 9): 1}
    assert sbuf_plan(rotating(100 * KIB).trace, 2, 16, 224 * KIB, bound_rotation=True)[0] == {("k.py", 9): 2}
    free, fit = (estimate(trace, sbuf_rotation=r) for r in ("free", "fit"))
    assert fit.total_ns > free.total_ns
    s = fit._schedule
    loads = [i for i, ins in enumerate(trace.instrs) if ins.engine == "dma" and ins.line == 3]
    stores = [i for i, ins in enumerate(trace.instrs) if ins.engine == "dma" and ins.line == 5]
    assert all(s.start[load] >= s.end[store] for load, store in zip(loads[1:], stores))
    small = rotating(100 * KIB).trace
    assert estimate(small, sbuf_rotation="fit").total_ns == estimate(small, sbuf_rotation="free").total_ns


def test_the_default_rotation_rule_is_fit():
    """Without a rule named, a site whose two buffers overflow SBUF gets one (the "fit" rule, params.sbuf_rotation)."""
    trace = rotating(150 * KIB).trace
    assert estimate(trace).total_ns == estimate(trace, sbuf_rotation="fit").total_ns
    assert estimate(trace).total_ns > estimate(trace, sbuf_rotation="free").total_ns


def test_an_unknown_rotation_rule_is_a_user_error():
    with pytest.raises(TilecError, match="unknown SBUF rotation rule 'some'"):
        estimate(rotating(1024).trace, sbuf_rotation="some")
