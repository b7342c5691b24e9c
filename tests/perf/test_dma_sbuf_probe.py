"""benchmarks/trn2_dma_sbuf.py, the Trn2 measurement of an SBUF -> SBUF DMA's charge and the HWDGE issue cost
(docs/notes/model14.md). Here: every kernel copies exactly on the interpreter, and the model's readings are the ones
the probe's docstring names: an on-chip copy costs its bytes once (copies - loads = one load of x and its latency),
and issuing a DMA costs its trigger stream nothing per DMA whatever the descriptor mode."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

from tilec.perf.params import TRN2


def bench_module():
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "trn2_dma_sbuf.py"
    spec = importlib.util.spec_from_file_location("trn2_dma_sbuf", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_probe_copies_exactly_and_shows_the_models_readings(capsys):
    assert bench_module().main(["--total", "1024", "--reps", "8", "--small", "64"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {r[0]: r for r in (line.split() for line in lines[2:6])}
    assert set(rows) == {"loads", "copies", "small_hwdge", "small_static"} and all(r[1] == "ok" for r in rows.values())
    one_load = 128 * 1024 * 4 / (16 * TRN2.dma_engine_bw.value) / 1000  # x over the 16 engines, µs
    extra = float(rows["copies"][3]) - float(rows["loads"][3])
    assert one_load < extra < one_load + 2 * TRN2.dma_latency_ns.value / 1000  # bytes once, not 8 more loads
    assert rows["small_hwdge"][3] == rows["small_static"][3]
    assert lines[-1] == "(small_hwdge - small_static) per small DMA: 0 ns"


def test_small_must_divide_total():
    with pytest.raises(SystemExit):
        bench_module().main(["--total", "1024", "--small", "100"])
