"""benchmarks/trn2_dma_desc.py, the Trn2 measurement of what a small DMA costs the DMA engines (the model's 14 ns per
descriptor against nki-spec's ~105 ns fit to the DMA efficiency figure: docs/notes/fid14.md). Here: every kernel
copies x exactly on the interpreter, and the model's three readings show in the time per small DMA."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest


def bench_module():
    """benchmarks/trn2_dma_desc.py as a module (it puts benchmarks/ on sys.path itself, for trn2_probe)."""
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "trn2_dma_desc.py"
    spec = importlib.util.spec_from_file_location("trn2_dma_desc", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("nki06", [False, True])
def test_the_probe_copies_exactly_and_separates_the_readings(capsys, nki06):
    bench = bench_module()
    assert bench.main(["--total", "256", "--free", "8,256"] + (["--nki06"] if nki06 else [])) == 0
    lines = capsys.readouterr().out.splitlines()[2:]
    rows = {(int(r[0]), r[1]): r for r in (line.split() for line in lines)}
    assert len(rows) == 6 and all(r[2] == "ok" for r in rows.values())
    # 32 B per partition: 8 rows per engine per DMA, so 8 x dma_desc_ns of descriptors beyond the 1.4 ns of bytes
    # each (hypot), i.e. ~112 ns under the table's 14 ns and ~840 under 105 ns
    per = {k: float(rows[32, "rows128"][i]) for k, i in (("model", 4), ("row105", 6), ("dma840", 8))}
    assert per["model"] == pytest.approx(8 * 14, rel=0.15)
    assert per["row105"] == pytest.approx(8 * 105, rel=0.15)
    assert per["dma840"] == pytest.approx(840 + 8 * 14, rel=0.15)
    # one DMA of the whole row: nothing beyond `whole`
    assert float(rows[1024, "rows128"][3]) == pytest.approx(float(rows[1024, "whole"][3]))


def test_free_must_divide_total():
    with pytest.raises(SystemExit):
        bench_module().main(["--total", "256", "--free", "100"])
