"""The DMA issue order (params.DMA_QUEUE): "engine" (the default) lets a DMA's trigger wait only for its dependences
and the previous trigger of its stream, and each DMA engine run its queue's transfers in order; "stream" (the old
rule) starts a DMA no earlier than the previous DMA of its stream started on any engine. Hand-made traces with round
numbers (1 B/ns per engine, no descriptor cost, 1000 ns latency, no start-up, no write acknowledgement) whose
timelines were worked out by hand, one compiled kernel, and the dependence tracker's compaction."""
from __future__ import annotations

import dataclasses
import pathlib

import pytest

from tilec.errors import TilecError
from tilec.perf import deps
from tilec.perf.api import estimate
from tilec.perf.params import TRN2, Param
from tilec.perf.tracebuild import TraceBuilder

ROUND = dataclasses.replace(TRN2, dma_desc_ns=Param(0.0, "test"), dma_latency_ns=Param(1000.0, "test"),
                            startup_ns=Param(0.0, "test"), dma_engine_bw=Param(1.0, "test"),
                            dma_write_ack_ns=Param(0.0, "test"))
ROOT = pathlib.Path(__file__).resolve().parents[2]


def stores_behind_a_long_load() -> TraceBuilder:
    """D0 loads s (128 partitions, 1024 B per engine); D1 loads 8000 B into big on engine 0 (both depend on nothing:
    they lead their streams). D2-D4, D6 store rows of s (1024 B each, engines 0, 1, 1, 2), D5 stores D1's rows (8000 B,
    engine 0): all on the stream of the engine that wrote their source ("dma"), in this program order."""
    b = TraceBuilder("k")
    x = b.buffer("x", "hbm", 1, 100000)
    y = b.buffer("y", "hbm", 1, 30000)
    s = b.buffer("s", "sbuf", 128, 128)
    big = b.buffer("big", "sbuf", 128, 8000)
    b.dma(dst=b.at(s), src=b.at(x, lo=0, hi=16384), partitions=128, nbytes=16384, line=1)  # D0
    b.dma(dst=b.at(big, 0, 8, 0, 1000), src=b.at(x, lo=16384, hi=24384), partitions=8, nbytes=8000, line=2)  # D1
    b.dma(dst=b.at(y, lo=0, hi=1024), src=b.at(s, 0, 8), partitions=8, nbytes=1024, line=3)  # D2
    b.dma(dst=b.at(y, lo=1024, hi=2048), src=b.at(s, 8, 16), partitions=8, nbytes=1024, line=4)  # D3
    b.dma(dst=b.at(y, lo=2048, hi=3072), src=b.at(s, 8, 16), partitions=8, nbytes=1024, line=5)  # D4
    b.dma(dst=b.at(y, lo=3072, hi=11072), src=b.at(big, 0, 8, 0, 1000), partitions=8, nbytes=8000, line=6)  # D5
    b.dma(dst=b.at(y, lo=20000, hi=21024), src=b.at(s, 16, 24), partitions=8, nbytes=1024, line=7)  # D6
    return b


def timeline(rule: str) -> list[tuple[float, float, float]]:
    s = estimate(stores_behind_a_long_load().trace, params=ROUND, dma_queue=rule)._schedule
    return [(round(s.trigger[i]), round(s.start[i]), round(s.end[i])) for i in range(len(s.start))]


def test_engine_rule_timeline_by_hand():
    """D0 leads: triggered at 0, moves from 1000 (latency) to 2024 on every engine. D1 leads too; engine 0 is busy
    until 2024, so it moves 2024-10024. D2 (needs s: 2024) triggers at 2024 and could start at 3024, but engine 0
    is D1's until 10024: 10024-11048. D3 triggers at 2024 too (the stream's previous trigger) and its engine 1 is
    free: 3024-4048, while D2 still waits; the old rule kept it behind D2. D4, the same engine and queue as D3, runs
    after it: 4048-5072. D5 needs big (10024): trigger 10024, engine 0 after D2: 11048-19048. D6 needs only s, but
    its trigger comes after D5's on the stream (10024): 11024-12048 on engine 2."""
    assert timeline("engine") == [(0, 1000, 2024), (0, 2024, 10024), (2024, 10024, 11048), (2024, 3024, 4048),
                                  (2024, 4048, 5072), (10024, 11048, 19048), (10024, 11024, 12048)]


def test_stream_rule_timeline_by_hand():
    """The old rule: D3 may not start before D2 started (10024) although its engine is idle, D4 follows on engine 1
    (11048-12072), D5 starts with engine 0 free at 11048, and D6 not before D5's start: 11048."""
    got = timeline("stream")
    assert [(s, e) for _, s, e in got] == [(1000, 2024), (2024, 10024), (10024, 11048), (10024, 11048),
                                           (11048, 12072), (11048, 19048), (11048, 12072)]


def test_tiny_dma_loop_is_the_same_under_both_rules():
    """load, load, add, store per iteration (calibration rows 1, 2, 4): the next iteration's loads trigger after
    this iteration's store trigger, which waits for the add, so both rules give one latency + transfer + add per
    iteration."""
    b = TraceBuilder("k")
    x = b.buffer("x", "hbm", 1, 4096)
    y = b.buffer("y", "hbm", 1, 4096)
    for i in range(8):
        t = b.buffer(f"t{i}", "sbuf", 128, 4)
        u = b.buffer(f"u{i}", "sbuf", 128, 4)
        b.dma(dst=b.at(t), src=b.at(x, lo=512 * i, hi=512 * (i + 1)), partitions=128, nbytes=512, line=1)
        b.dma(dst=b.at(u), src=b.at(x, lo=512 * i, hi=512 * (i + 1)), partitions=128, nbytes=512, line=2)
        b.compute("vector", "tensor_tensor", reads=[b.at(t), b.at(u)], writes=[b.at(t)], partitions=128, free=1,
                  line=3)
        b.dma(dst=b.at(y, lo=512 * i, hi=512 * (i + 1)), src=b.at(t), partitions=128, nbytes=512, line=4)
    engine, stream = (estimate(b.trace, dma_queue=r) for r in ("engine", "stream"))
    assert engine.total_ns == stream.total_ns
    assert engine._schedule.start == stream._schedule.start


def test_default_and_unknown_rule(monkeypatch):
    b = stores_behind_a_long_load()
    monkeypatch.delenv("TILEC_MODEL_DMA_QUEUE", raising=False)
    assert estimate(b.trace, params=ROUND)._schedule.start == estimate(b.trace, params=ROUND,
                                                                       dma_queue="engine")._schedule.start
    monkeypatch.setenv("TILEC_MODEL_DMA_QUEUE", "stream")
    assert estimate(b.trace, params=ROUND)._schedule.start == estimate(b.trace, params=ROUND,
                                                                       dma_queue="stream")._schedule.start
    with pytest.raises(TilecError, match="TILEC_MODEL_DMA_QUEUE"):
        estimate(b.trace, dma_queue="fifo")


def band_major(bands: int, per_band: int) -> TraceBuilder:
    """A tile of `bands` x 8 partitions filled band after band, `per_band` small DMAs of 32 B per partition each,
    then stored whole: no load depends on another."""
    b = TraceBuilder("k")
    x = b.buffer("x", "hbm", 1, 1 << 20)
    t = b.buffer("t", "sbuf", 8 * bands, 32 * per_band)
    out = b.buffer("out", "hbm", 1, 1 << 20)
    for g in range(bands):
        for j in range(per_band):
            lo = 32 * (g * per_band + j) * 8
            b.dma(dst=b.at(t, 8 * g, 8 * g + 8, 32 * j, 32 * j + 32), src=b.at(x, lo=lo, hi=lo + 256), partitions=8,
                  nbytes=256, line=1)
    b.dma(dst=b.at(out, lo=0, hi=8 * bands * 32 * per_band), src=b.at(t), partitions=8 * bands,
          nbytes=8 * bands * 32 * per_band, line=2)
    return b


def test_band_major_loads_are_independent(monkeypatch):
    """More writes to one tile than the tracker keeps (deps.MAX_ENTRIES): its compaction must not turn them into
    false dependences. Every load depends on nothing, so each band's loads start at start-up on their own engine
    and the store waits only for the last of them, whatever the tracker's size."""
    b = band_major(4, 40)
    tight = estimate(b.trace, params=ROUND)._schedule
    monkeypatch.setattr(deps, "MAX_ENTRIES", 10_000)
    exact = estimate(b.trace, params=ROUND)._schedule
    assert tight.start == exact.start
    loads = range(160)
    assert all(tight.trigger[i] == 0 for i in loads)
    assert [tight.start[40 * g] for g in range(4)] == [1000] * 4  # each band's first load on its own engine
    assert tight.start[160] == max(tight.end[i] for i in loads) + 1000


def test_compaction_unions_are_exact():
    """deps._unions joins touching column ranges of one band, then touching bands of one column range; boxes that
    do not tile a rectangle stay apart."""
    entries = [((0, 8, 0, 32, ()), 5.0), ((0, 8, 32, 64, ()), 7.0), ((8, 16, 0, 64, ()), 6.0),
               ((16, 24, 128, 160, ()), 1.0)]
    assert sorted(deps._unions(entries)) == [((0, 16, 0, 64, ()), 7.0), ((16, 24, 128, 160, ()), 1.0)]


@pytest.mark.parametrize("dtype", ["bf16"])
def test_compiled_grouped_conv(dtype):
    """benchmarks/families/grouped3x3.tl at batch 1 (compiled, traced): under "engine" every DMA starts no earlier
    than its trigger plus the latency, each stream's triggers issue in program order, some DMA starts before the
    previous DMA of its stream started (what "stream" forbade), and the kernel is faster than under "stream"."""
    from tilec.compiler.api import compile_loaded
    from tilec.lang import api as lang

    text = (ROOT / "benchmarks" / "families" / "grouped3x3.tl").read_text().replace("f32[", f"{dtype}[")
    compiled = compile_loaded(lang.load(text, {"N": 1}))
    _, trace = compiled.run_traced(numerics=False, **lang.random_inputs(compiled.program, seed=0))
    engine, stream = (estimate(trace, dma_queue=r) for r in ("engine", "stream"))
    s = engine._schedule
    latency = engine.params.dma_latency_ns.value
    last: dict[str, int] = {}
    overtakes = 0
    for i, ins in enumerate(trace.instrs):
        if ins.engine != "dma":
            continue
        assert s.start[i] >= s.trigger[i] + latency - 1e-6
        if s.trigger[i] > 0:  # not a DMA leading its stream
            j = last.get(s.lane[i])
            if j is not None:
                assert s.trigger[i] >= s.trigger[j]
                overtakes += s.start[i] < s.start[j]
            last[s.lane[i]] = i
    assert overtakes > 0
    assert engine.total_ns < stream.total_ns
