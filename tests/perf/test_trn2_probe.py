"""benchmarks/trn2_probe.py, the hardware loop the Trn2 probes share, run here against stand-ins for the device:
a NumPy kernel module and a fake `neuronxcc.nki` whose benchmark reports fixed latencies. It checks that a wrong
result is counted, every kernel is timed and printed, and only the kernels asked for are profiled."""
from __future__ import annotations

import pathlib
import sys
import types

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))

import trn2_probe as probe  # noqa: E402

LATENCY = {"double": 7.5, "wrong": 3.0}  # µs p50 the fake benchmark reports per kernel


def _kernels() -> types.SimpleNamespace:
    def double(x):
        return 2 * x

    def wrong(x):
        return 2 * x + 1

    return types.SimpleNamespace(double=double, wrong=wrong)


def _check(name: str, result: object) -> str:
    return "ok" if np.array_equal(np.asarray(result), 2 * np.arange(4.0)) else "WRONG"


@pytest.fixture
def fake_nki(monkeypatch):
    """neuronxcc.nki with benchmark (fixed latencies by kernel name) and profile (records its folders)."""
    profiled: list[str] = []

    def benchmark(warmup: int, iters: int):
        def wrap(kernel):
            class Bench:
                def __call__(self, *args):
                    lat = LATENCY[kernel.__name__]
                    self.benchmark_result = types.SimpleNamespace(nc_latency=types.SimpleNamespace(
                        get_latency_percentile=lambda p: lat if p == 50 else 2 * lat))
            return Bench()
        return wrap

    def profile(working_directory: str, **kw):
        profiled.append(pathlib.Path(working_directory).name)
        return lambda kernel: kernel

    nki = types.ModuleType("neuronxcc.nki")
    nki.benchmark, nki.profile = benchmark, profile
    pkg = types.ModuleType("neuronxcc")
    pkg.nki = nki
    monkeypatch.setitem(sys.modules, "neuronxcc", pkg)
    monkeypatch.setitem(sys.modules, "neuronxcc.nki", nki)
    return profiled


def test_nki01_counts_wrong_results_times_and_profiles_only_the_named(fake_nki, tmp_path, capsys):
    bad, p50 = probe.time_nki01(_kernels(), ["double", "wrong"], (np.arange(4.0),), _check, iters=3,
                                profile=str(tmp_path), profiled=lambda name: name == "double")
    assert bad == 1 and p50 == LATENCY
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows == [["double", "ok", "7.5", "15.0"], ["wrong", "WRONG", "3.0", "6.0"]]
    assert fake_nki == ["double"] and (tmp_path / "double").is_dir() and not (tmp_path / "wrong").exists()


def test_nki06_counts_wrong_results_and_reports_medians(capsys):
    bad, median = probe.time_nki06(_kernels(), ["wrong", "double"], (np.arange(4.0),), _check, iters=5, width=8)
    assert bad == 1 and set(median) == {"wrong", "double"} and all(t > 0 for t in median.values())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["kernel", "result", "median", "us"]
    assert [line.split()[:2] for line in lines[1:]] == [["wrong", "WRONG"], ["double", "ok"]]


def test_load_module_sets_the_size_globals(tmp_path):
    path = tmp_path / "kernels.py"
    path.write_text("REPS = 1\n\ndef reps():\n    return REPS\n")
    module = probe.load_module(path, REPS=9)
    assert module.reps() == 9


def test_chosen_kernels_default_to_all_and_refuse_unknown_names(capsys):
    import argparse

    ap = argparse.ArgumentParser(prog="probe")
    assert probe.chosen(ap, None, ("a", "b")) == ["a", "b"] and probe.chosen(ap, "b", ("a", "b")) == ["b"]
    with pytest.raises(SystemExit):
        probe.chosen(ap, "a,c", ("a", "b"))
    assert "unknown kernels c; choose from a, b" in capsys.readouterr().err
