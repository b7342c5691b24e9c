"""Shared helpers for compiler tests: compile a .tl example (optionally in another dtype), run it on the NKI
interpreter, compare with LANG's reference evaluator (an independent NumPy implementation of the program)."""
from __future__ import annotations

import pathlib

import numpy as np

from tilec.compiler.api import Compiled, compile_loaded
from tilec.lang import api as lang

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def program(name: str, sizes: dict[str, int] | None = None, dtype: str = "f32"):
    path = EXAMPLES / f"{name}.tl"
    if dtype == "f32":
        return lang.load(str(path), sizes)
    return lang.load(path.read_text().replace("f32", dtype), sizes)


def compile_example(name: str, sizes=None, dtype: str = "f32", schedule: str | None = None) -> Compiled:
    prog = program(name, sizes, dtype)
    directives = lang.parse_schedule(schedule, "<test schedule>") if schedule is not None else None
    return compile_loaded(prog, directives)


def inputs_for(prog, seed: int = 42) -> dict[str, np.ndarray]:
    """Uniform [0, 1) inputs, as the assignment's harness (np.random.rand): with signed inputs the sums cancel and
    np.allclose's relative tolerance would judge summation order, not correctness."""
    rng = np.random.default_rng(seed)
    return {t.name: rng.random(t.shape, dtype=np.float32) for t in prog.inputs}


# fp16/bf16: inputs and the output are rounded to 16 bits (ulp 2^-10 resp. 2^-7 relative) while the kernel
# accumulates in fp32 PSUM, the reference in fp32 with rounding only at the end; the difference is a few output ulps.
RTOL = {"f32": 1e-5, "f16": 4e-3, "bf16": 3e-2}
ATOL = {"f32": 1e-8, "f16": 1e-3, "bf16": 1e-2}


def check_against_reference(c: Compiled, seed: int = 42, traced: bool = False):
    prog = c.program
    inputs = inputs_for(prog, seed)
    ref = lang.evaluate(prog, inputs)
    if traced:
        out, trace = c.run_traced(**inputs)
    else:
        out, trace = c.run(**inputs), None
    dtype = prog.tensors[prog.kernel.outputs[0]].dtype
    for name, expect in ref.items():
        got = np.asarray(out[name], np.float32)
        want = np.asarray(expect, np.float32)
        assert got.shape == want.shape
        assert np.allclose(got, want, rtol=RTOL[dtype], atol=ATOL[dtype]), \
            f"{name}: max abs error {np.abs(got - want).max()}"
    return trace
