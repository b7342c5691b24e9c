"""The tuner's model evaluation runs the interpreter trace-only (numerics=False) on zero inputs: its latency must be
exactly what a full-numerics run on random inputs gives the performance model, and a rejected schedule must fail the
same way."""
from __future__ import annotations

import pathlib
import random

import numpy as np
import pytest

import tilec.nki.api
from tilec.perf.api import estimate
from tilec.errors import KernelError, TilecError
from tilec.tune.evaluate import Job, compile_job, first_line, kernel_inputs, model_outcome, placeholder_inputs
from tilec.tune.knobs import build_space

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONV = Job.of(str(ROOT / "examples" / "conv_bias_maxpool.tl"), {"N": 1, "H": 20, "W": 34})


def full_numerics_us(job: Job, schedule: str | None) -> float:
    compiled = compile_job(job, schedule)
    _, trace = compiled.run_traced(**kernel_inputs(compiled))
    return float(estimate(trace, job.target).total_us)


def schedules(job: Job, n: int) -> list[str | None]:
    """The default schedule (None) and n random legal points of the job's space."""
    space = build_space(job)
    rng = random.Random(3)
    out: list[str | None] = [None]
    while len(out) < n + 1:
        point = space.random_point(rng)
        if space.check(point) is None and space.render(point) not in out:
            out.append(space.render(point))
    return out


@pytest.mark.parametrize("job", [CONV, Job.of(str(ROOT / "examples" / "transpose.tl"), {"M": 256, "N": 384})],
                         ids=["conv", "transpose"])
def test_model_outcome_equals_the_full_numerics_estimate(job: Job) -> None:
    for schedule in schedules(job, 3):
        outcome = model_outcome(job, schedule)
        if outcome.ok:
            assert outcome.us == full_numerics_us(job, schedule), schedule
        else:  # the full run must reject it too, and for the same reason
            with pytest.raises((TilecError, KernelError)) as info:
                full_numerics_us(job, schedule)
            assert first_line(info.value) == outcome.error, schedule


def test_model_outcome_runs_trace_only(monkeypatch) -> None:
    seen = []
    real = tilec.nki.api.simulate_traced

    def spy(*args, **kwargs):
        seen.append(kwargs.get("numerics", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(tilec.nki.api, "simulate_traced", spy)
    assert model_outcome(CONV, None).ok
    assert seen == [False]


def test_placeholder_inputs_have_the_kernel_inputs_shapes_and_dtypes(tmp_path: pathlib.Path) -> None:
    text = (ROOT / "examples" / "conv_bias_maxpool.tl").read_text().replace("f32", "f16")
    path = tmp_path / "conv_f16.tl"  # a program whose inputs are not float32
    path.write_text(text)
    compiled = compile_job(Job.of(str(path), {"N": 1, "H": 20, "W": 34}), None)
    real, zeros = kernel_inputs(compiled), placeholder_inputs(compiled)
    assert sorted(zeros) == sorted(real)
    for name, arr in real.items():
        assert (zeros[name].shape, zeros[name].dtype) == (arr.shape, arr.dtype) and arr.dtype == np.float16
