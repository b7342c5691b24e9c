"""audit15: the tuner on issue 10's row chains. The tuner's first candidate is "the compiler's default schedule
written out" (space.default_point()); for a conv it is the same kernel (tests/tune/test_tune_programs.py). For a
row chain (softmax, rmsnorm: several statements fused into one pass over row tiles) the written-out directives name
one statement each, and a directive on one statement builds it alone: the chain is broken, the kernel is 3x slower,
and `tilec tune` reported that slower kernel as "the default" and wrote it out as the winner. Fixed (session 15):
the tuner offers no knobs on the statements of a fused row chain (tilec/tune/knobs.py space_of), so its default point
is the compiler's kernel."""
from __future__ import annotations

import pathlib

import pytest

from tilec.compiler.api import compile_file
from tilec.lang import api as lang
from tilec.perf.api import estimate
from tilec.tune.api import tune
from tilec.tune.evaluate import Job, compile_job
from tilec.tune.knobs import build_space

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAINS = [
    (ROOT / "benchmarks" / "core" / "softmax.tl", dict(M=256, N=1024)),
    (ROOT / "benchmarks" / "core" / "rmsnorm.tl", dict(M=256, N=1024)),
    (ROOT / "tests" / "programs" / "audit15" / "logsumexp_rows.tl", dict(M=256, N=1024)),
    (ROOT / "tests" / "programs" / "audit15" / "rowrange_bf16.tl", dict(M=256, N=1024)),
]
IDS = [p.stem for p, _ in CHAINS]


@pytest.mark.parametrize("path,sizes", CHAINS, ids=IDS)
def test_the_tuners_default_point_is_the_compilers_default_kernel(path, sizes) -> None:
    job = Job.of(str(path), sizes)
    space = build_space(job)
    assert compile_job(job, space.render(space.default_point())).source == compile_job(job, None).source


def test_tune_never_returns_a_kernel_slower_than_the_compilers_default() -> None:
    path, sizes = CHAINS[0]
    result = tune(str(path), sizes, budget=3, progress=False, use_cache=False, jobs=1)
    compiled = compile_file(str(path), sizes)
    _, trace = compiled.run_traced(numerics=False, **lang.random_inputs(compiled.program, seed=0))
    default_us = estimate(trace).total_ns / 1000
    assert result.best_us <= default_us * 1.001, (result.best_us, default_us)
