"""A DMA whose trigger engine the kernel names (NKI 0.6 `dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.sync`):
the model issues it on that engine's trigger stream, one issue per Target.hwdge_issue_ns ("each HWDGE DMA instruction
takes about 600 ns to issue", nki-spec §2.5), instead of the stream of the engine that first reads what it loads
(schedule.dma_streams). A loop whose loads VectorE reads and whose stores VectorE feeds then no longer triggers the
next tile's load behind this tile's store."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tilec  # noqa: F401  (serves `import nki` from tilec's interpreter)
import nki
import nki.isa as nisa
import nki.language as nl
from tilec.nki import api
from tilec.perf.api import estimate
from tilec.perf.params import TRN2, Param
from tilec.perf.tracebuild import TraceBuilder
from tilec.target import TARGETS

ROUND = dataclasses.replace(TRN2, dma_desc_ns=Param(0.0, "test"), dma_latency_ns=Param(1000.0, "test"),
                            startup_ns=Param(0.0, "test"), dma_engine_bw=Param(1.0, "test"),
                            dma_write_ack_ns=Param(0.0, "test"))
ISSUE = TARGETS["trn2"].hwdge_issue_ns


def loop(trigger: str | None, n: int = 4) -> TraceBuilder:
    """n iterations of: load a tile (128 partitions x 64 B), scale it on VectorE, store the result."""
    b = TraceBuilder("k")
    x = b.buffer("x", "hbm", 1, 8192 * n)
    y = b.buffer("y", "hbm", 1, 8192 * n)
    attrs = (("trigger", trigger),) if trigger else ()
    ts = [b.buffer(f"t{i}", "sbuf", 128, 64) for i in range(2)]  # two buffers each, used in turn: a load of tile i
    us = [b.buffer(f"u{i}", "sbuf", 128, 64) for i in range(2)]  # waits for tile i - 2's scale to have read it
    for i in range(n):
        t, u = ts[i % 2], us[i % 2]
        b.dma(dst=b.at(t), src=b.at(x, lo=8192 * i, hi=8192 * (i + 1)), partitions=128, nbytes=8192, line=1,
              attrs=attrs)
        b.compute("vector", "tensor_scalar", reads=[b.at(t)], writes=[b.at(u)], partitions=128, free=16, line=2)
        b.dma(dst=b.at(y, lo=8192 * i, hi=8192 * (i + 1)), src=b.at(u), partitions=128, nbytes=8192, line=3)
    return b


def test_named_loads_go_on_the_sync_stream_one_issue_apart():
    s = estimate(loop("sync").trace, params=ROUND)._schedule
    loads = [3 * i for i in range(4)]
    assert [s.lane[i] for i in loads] == ["dma sync"] * 4
    assert [round(s.trigger[i]) for i in loads] == [round(ISSUE * i) for i in range(4)]
    assert all(s.lane[3 * i + 2] == "dma vector" for i in range(4))  # the stores keep VectorE's stream


def copied(x, engine):
    """x through SBUF, loaded by a DMA whose trigger names `engine` (a module-level kernel: the interpreter reads its
    source)."""
    y = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x, dge_mode=nisa.dge_mode.hwdge, engine=getattr(nisa.engine, engine))
    nisa.dma_copy(dst=y, src=t)
    return y


@pytest.mark.parametrize("engine", ["sync", "scalar"])
def test_the_interpreter_records_the_named_trigger(engine: str):
    """An NKI 0.6 kernel naming the trigger: the copy is exact and the trace carries the engine."""
    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    out, trace = api.simulate_traced(nki.jit(copied), x, engine)
    assert np.array_equal(np.asarray(out), x)
    assert [ins.attr("trigger") for ins in trace.instrs if ins.engine == "dma"] == [engine, None]
