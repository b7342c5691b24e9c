"""benchmarks/trn2_sbuf_deps.py, the Trn2 measurement of how the NKI compiler finds dependences between two engines'
writes to one SBUF tile (the docs do not say: docs/notes/fid12.md). Here: every kernel matches NumPy on the
interpreter, and the model's byte-box rule (tilec/perf/deps.py) shows in its overlaps: interleaved strided columns
one after the other, disjoint halves and separate tiles side by side, a true dependence one after the other."""
from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest


def bench_module():
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import trn2_sbuf_deps as bench
    finally:
        sys.path.pop(0)
    return bench


@pytest.mark.parametrize("nki06", [False, True])
def test_the_probe_matches_numpy_and_shows_the_model_rule(capsys, nki06):
    bench = bench_module()
    assert bench.main(["--reps", "8", "--free", "256"] + (["--nki06"] if nki06 else [])) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[2:2 + len(bench.NAMES)]}
    assert set(rows) == set(bench.NAMES) and all(r[1] == "ok" for r in rows.values())
    ov = bench.overlaps({k: float(r[2]) for k, r in rows.items()})
    assert ov["interleaved"] == pytest.approx(0, abs=0.05) and ov["same"] == pytest.approx(0, abs=0.05)
    assert ov["halves"] == pytest.approx(1, abs=0.05)
    assert ov["tiles"] == pytest.approx(1, abs=0.15)  # its two loads and stores cost a little more


def test_the_expected_results_are_written_out_by_hand():
    """The NumPy reference of the probe, on a 1 x 4 toy: interleaved adds to even and odd columns, halves to the
    halves, same twice to the first half."""
    bench = bench_module()
    x = np.array([[1, 2, 3, 4]] * 128, np.float32)
    c = np.array([[10, 100]] * 128, np.float32)
    assert bench.expected("interleaved", x, c, 2)[0].tolist() == [21, 202, 23, 204]
    assert bench.expected("halves", x, c, 2)[0].tolist() == [21, 22, 203, 204]
    assert bench.expected("same", x, c, 2)[0].tolist() == [221, 222, 3, 4]
    assert bench.expected("vector_i", x, c, 2)[0].tolist() == [1, 202, 3, 204]
    assert bench.expected("none", x, c, 2)[0].tolist() == [1, 2, 3, 4]
