"""The hardware probes of session 21, here on the interpreter and the model: benchmarks/trn2_onezero.py (the fp32
ones/zeros matmul hint) and benchmarks/trn2_dma_transpose.py (fp32 DMA transposes against copies). Every kernel's
output is checked against NumPy, and the model's readings are the Params each probe is meant to settle."""
from __future__ import annotations

import importlib
import pathlib
import sys

import pytest

from tilec.perf.params import TRN2


def _bench(name: str = "trn2_onezero"):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def _rows(bench, out: str) -> dict[str, list[str]]:
    lines = out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[2:2 + len(bench.NAMES)]}
    assert set(rows) == set(bench.NAMES) and all(r[1] == "ok" for r in rows.values())
    return rows


def test_the_probe_checks_its_kernels_and_reads_the_model(capsys):
    bench = _bench()
    assert bench.main(["--reps", "32", "--free", "512"]) == 0
    rows = _rows(bench, capsys.readouterr().out)
    read = bench.ratios(bench.probe.per_rep({k: float(r[2]) for k, r in rows.items()}, 32))
    # (each matmul also pays the model's fixed cycles, so the ratios sit a little under the Params)
    assert read["speed-up"] == pytest.approx(TRN2.onezero_fp32_speedup.value, rel=0.1)
    assert read["fp32 factor"] == pytest.approx(TRN2.mm_fp32_factor.value, rel=0.1)
    assert read["bf16 hint"] == pytest.approx(1.0)


def test_a_wrong_sum_is_reported():
    bench = _bench()
    x = bench.inputs(16)[0]
    assert bench._check("fp32", bench.expected("fp32", x), (x,)) == "ok"
    assert bench._check("fp32", bench.expected("fp32", x) + 1, (x,)) == "WRONG"
    assert bench._check("bf16", bench.expected("fp32", x), (x,)) == "WRONG"  # (bf16 rounds x first)


def test_the_dma_transpose_probe_checks_its_kernels_and_reads_the_model(capsys):
    bench = _bench("trn2_dma_transpose")
    assert bench.main(["--reps", "32"]) == 0
    rows = _rows(bench, capsys.readouterr().out)
    read = bench.factors(bench.probe.per_rep({k: float(r[2]) for k, r in rows.items()}, 32))
    assert read["sbuf factor"] == pytest.approx(TRN2.dma_transpose_sbuf_factor.value, rel=0.1)
    assert read["hbm factor"] == pytest.approx(TRN2.dma_transpose_factor.value, rel=0.1)
    x = bench.inputs()
    assert bench._check("transpose_sbuf", x[0], x) == "WRONG" and bench._check("copy_hbm", x[0], x) == "ok"
