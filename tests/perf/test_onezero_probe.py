"""benchmarks/trn2_onezero.py, the hardware probe of the fp32 ones/zeros matmul hint: every kernel sums x's columns
as NumPy does on the interpreter, and the model's readings are the Params the probe is meant to settle."""
from __future__ import annotations

import pathlib
import sys

import pytest

from tilec.perf.params import TRN2


def _bench():
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import trn2_onezero as bench
    finally:
        sys.path.pop(0)
    return bench


def test_the_probe_checks_its_kernels_and_reads_the_model(capsys):
    bench = _bench()
    assert bench.main(["--reps", "32", "--free", "512"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[2:2 + len(bench.NAMES)]}
    assert set(rows) == set(bench.NAMES) and all(r[1] == "ok" for r in rows.values())
    read = bench.ratios(bench.per_matmul({k: float(r[2]) for k, r in rows.items()}, 32))
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
