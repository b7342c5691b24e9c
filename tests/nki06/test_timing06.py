"""Timing NKI 0.6 kernels: tilec's model through its own API (0.6 has no nki.benchmark), trace-only runs of the
checked-in 0.6 kernels equal their full runs, and the tuner's hardware evaluator times 0.6 kernels through
NKI_ARTIFACTS_DIR + nrtpy benchmark(mode="device"), exercised with a fake subprocess runner."""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import subprocess

import numpy as np
import pytest

import tilec  # noqa: F401
from tilec.compiler.api import compile_file
from tilec.errors import TilecError
from tilec.nki import api
from tilec.nki.top06 import estimate as estimate06
from tilec.perf.api import estimate
from tilec.trace import Instr
from tilec.tune import hardware06
from tilec.tune.evaluate import HardwareEvaluator, Job, kernel_inputs

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMALL = ["avgpool", "linear", "matmul", "rowsum", "transpose", "vector_add", "conv_relu"]


@pytest.mark.parametrize("stem", SMALL)
def test_checked_in_06_kernel_trace_only_equals_full_run(stem):
    compiled = compile_file(ROOT / "examples" / f"{stem}.tl", nki="0.6")
    fn = api.load_kernel_file(ROOT / "generated" / "nki06" / f"{stem}.py", compiled.kernel_name)
    args = [kernel_inputs(compiled)[p.name] for p in compiled.program.kernel.params]
    _, full = api.simulate_traced(fn, *[a.copy() for a in args])
    _, only = api.simulate_traced(fn, *[a.copy() for a in args], numerics=False)
    assert len(full.instrs) == len(only.instrs) > 0
    for a, b in zip(full.instrs, only.instrs):
        for f in dataclasses.fields(Instr):
            assert getattr(a, f.name) == getattr(b, f.name), (a.seq, f.name)
    assert full.allocs == only.allocs
    assert estimate06(fn, *args).total_us == estimate(full).total_us  # tilec's nki.benchmark stand-in


def _fake_runner(calls, mean_ms=0.0421, neff=True):
    def run(cmd, env=None, **kwargs):
        calls.append((cmd, env))
        if "NrtpyModel" in cmd[2]:  # step 2: the nrtpy timing script in the nrtpy venv
            assert cmd[0] == "/opt/nrtpy/bin/python" and cmd[3].endswith(".neff") and cmd[5:] == ["3", "7"]
            stats = {"mean_ms": mean_ms, "min_ms": mean_ms, "max_ms": mean_ms, "std_dev_ms": 0.0}
            return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps(stats) + "\n", stderr="")
        # step 1: compile and run the kernel standalone with the real nki; NKI_ARTIFACTS_DIR keeps the NEFF
        kernel = pathlib.Path(cmd[3]).read_text()
        assert "import nki\n" in kernel and "neuronxcc" not in kernel
        assert "TILEC_NKI" not in env
        if neff:
            (pathlib.Path(env["NKI_ARTIFACTS_DIR"]) / "sub").mkdir()
            (pathlib.Path(env["NKI_ARTIFACTS_DIR"]) / "sub" / "kernel.neff").write_bytes(b"NEFF")
        with np.load(cmd[5]) as arrays:
            assert arrays.files == ["A", "B"]
        return subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")
    return run


def test_nrtpy_benchmark_route_with_a_fake(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEC_NRTPY_PYTHON", "/opt/nrtpy/bin/python")
    job = Job.of(str(ROOT / "examples" / "matmul.tl"), None)
    assert job.nki == "0.6"
    calls = []
    us = hardware06.nrtpy_benchmark(job, "", warmup=3, iters=7, run=_fake_runner(calls), workdir=str(tmp_path))
    assert math.isclose(us, 42.1) and len(calls) == 2
    with pytest.raises(TilecError, match="no NEFF"):
        hardware06.nrtpy_benchmark(job, "", 3, 7, run=_fake_runner([], neff=False), workdir=str(tmp_path / "x"))


class _Screen:
    name = "model"

    def evaluate(self, job, schedules):
        return []


def test_hardware_evaluator_times_06_kernels_through_nrtpy(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEC_NRTPY_PYTHON", "/opt/nrtpy/bin/python")
    job = Job.of(str(ROOT / "examples" / "matmul.tl"), None)
    means = iter([0.05, 0.03])
    runs = []

    def bench(job, schedule):  # the evaluator's default for 0.6, with the fake runner injected
        return hardware06.nrtpy_benchmark(job, schedule, 3, 7, run=_fake_runner(runs, next(means)),
                                          workdir=str(tmp_path / str(len(runs))))
    hw = HardwareEvaluator(top_k=2, benchmark=bench, screen=_Screen(), nki="0.6")
    out = hw.select(job, [("", 10.0), ("tile C.j, 256", 11.0)])
    assert [(m.schedule, round(m.p99_us, 6)) for m in out] == [("tile C.j, 256", 30.0), ("", 50.0)]
    assert len(runs) == 4


def test_hardware_evaluator_without_nki_and_nrtpy_says_what_to_do(monkeypatch):
    monkeypatch.delenv("TILEC_NRTPY_PYTHON", raising=False)
    with pytest.raises(TilecError, match="AWS nki with nrtpy"):
        HardwareEvaluator(nki="0.6")
