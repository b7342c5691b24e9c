"""Numerical check of a tuned kernel: run it on the interpreter and compare with the reference evaluator.

Tolerances: `tilec.tolerance.mismatches` (one policy for the CLI, the tuner and the fuzzer: from each output's
accumulation length, dtype and largest magnitude). A wrong tile, tap or offset gives errors of the order of the
values themselves, far above it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilec.tune.evaluate import Job, compile_job, first_line, kernel_inputs

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
    from tilec.tolerance import mismatches, scale_of

    rel = {name: relative_error(outputs[name], reference[name]) if name in outputs else float("inf")
           for name in compiled.program.kernel.outputs}
    worst = max(rel.values(), default=0.0)
    bad = [f"{m.name}: error {rel[m.name]:.3g} (tolerance {m.tolerance / max(1.0, scale_of(reference[m.name])):.3g})"
           for m in mismatches(compiled.program, outputs, reference, inputs)]
    return Verdict(not bad, worst, "; ".join(bad), compiled.source)
