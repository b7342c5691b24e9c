"""Numerical check of a tuned kernel: run it on the interpreter and compare with the reference evaluator.

Tolerances, relative to the largest reference magnitude of each output: fp32 1e-4 (both sides accumulate in fp32,
only the summation order differs); fp16 1e-2 and bf16 4e-2 (the kernel and the reference round the same fp32 sums
to the output dtype, so they differ by about one unit in the last place, 2^-11 and 2^-8, plus summation order).
A wrong tile, tap or offset gives errors of the order of the values themselves, far above these.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilec.tune.evaluate import Job, compile_job, first_line, kernel_inputs

TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 4e-2}


@dataclass(frozen=True)
class Verdict:
    ok: bool
    max_error: float  # largest |kernel - reference| / max(1, max |reference|) over the outputs
    message: str = ""
    source: str = ""  # the kernel module text that was checked


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    got64, want64 = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got64.shape != want64.shape:
        return float("inf")
    scale = max(1.0, float(np.max(np.abs(want64))) if want64.size else 1.0)
    return float(np.max(np.abs(got64 - want64))) / scale if want64.size else 0.0


def verify(job: Job, schedule: str, seed: int = 0) -> Verdict:
    """Compile `schedule`, run it on the interpreter, compare every output with `tilec.lang.api.evaluate`."""
    from tilec.lang.api import evaluate
    try:
        compiled = compile_job(job, schedule or None)
        inputs = kernel_inputs(compiled, seed)
        outputs, _ = compiled.run_traced(**inputs)
        reference = evaluate(compiled.program, inputs)
    except Exception as err:  # any failure means "not verified"; the message says why
        return Verdict(False, float("inf"), f"{type(err).__name__}: {first_line(err)}")
    worst, bad = 0.0, []
    for name in compiled.program.kernel.outputs:
        want = reference[name]
        err = relative_error(outputs[name], want) if name in outputs else float("inf")
        worst = max(worst, err)
        if not err <= TOLERANCE.get(np.dtype(want.dtype).name, 1e-4):
            bad.append(f"{name}: error {err:.3g}")
    return Verdict(not bad, worst, "; ".join(bad), compiled.source)
