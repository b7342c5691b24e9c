"""Issue 10's "Done when", second clause, for the proof set itself: every program of benchmarks/core/ (whose model
times against the floor benchmarks/core.py prints) compiles with its default schedule at sizes over one tile
(ragged edges), runs on tilec's NKI interpreter and matches a NumPy formula written here in float64, never tilec's
own evaluator; bf16 programs within the project's tolerance for their intermediates' dtype (tilec/tolerance.py)."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_formula_matches
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

CORE = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "core"
ROWS = dict(M=300, N=200)
MIDDLE = dict(A=3, B=200, C=150)


def _softmax(a):
    e = np.exp(a["X"] - a["X"].max(axis=1, keepdims=True))
    return {"Y": e / e.sum(axis=1, keepdims=True)}


def _layernorm(a):
    d = a["X"] - a["X"].mean(axis=1, keepdims=True)
    return {"Y": d / np.sqrt((d * d).mean(axis=1, keepdims=True) + 1e-5) * a["g"] + a["b"]}


def _rmsnorm(a):
    return {"Y": a["X"] / np.sqrt((a["X"] ** 2).mean(axis=1, keepdims=True) + 1e-6) * a["g"]}


FORMULAS = {  # program: (sizes, formula of the float64 inputs)
    "softmax": (ROWS, _softmax),
    "layernorm": (ROWS, _layernorm),
    "rmsnorm": (ROWS, _rmsnorm),
    "broadcast": (ROWS, lambda a: {"Y": 2 * a["X"] + a["b"] - 0.5 * a["c"][:, None]}),
    "batched_transpose": (dict(B=2, M=130, N=150), lambda a: {"Y": a["X"].transpose(0, 2, 1)}),
    "column_sum": (ROWS, lambda a: {"s": a["X"].sum(axis=0)}),
    "column_max": (ROWS, lambda a: {"s": a["X"].max(axis=0)}),
    "middle_mean": (MIDDLE, lambda a: {"Y": a["X"].mean(axis=1)}),
    "middle_min": (MIDDLE, lambda a: {"Y": np.minimum(a["Y0"], a["X"].min(axis=1))}),
    "nchw_to_nhwc": (dict(N=2, C=130, H=3, W=5), lambda a: {"Y": a["X"].transpose(0, 2, 3, 1)}),
    "row_ssd": (ROWS, lambda a: {"s": ((a["A"] - a["B"]) ** 2).sum(axis=1)}),
    "column_ssd": (ROWS, lambda a: {"s": ((a["A"] - a["B"]) ** 2).sum(axis=0)}),
    "column_sumsq": (ROWS, lambda a: {"s": (a["A"] ** 2).sum(axis=0)}),
}
SUFFIX = {"f32": "", "bf16": "_bf16"}
CASES = [(name, dtype) for name in FORMULAS for dtype in SUFFIX if (CORE / f"{name}{SUFFIX[dtype]}.tl").exists()]


def test_every_core_program_has_a_formula():
    assert {p.stem.removesuffix("_bf16") for p in CORE.glob("*.tl")} == set(FORMULAS)


@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{d}" for n, d in CASES])
def test_core_program_matches_numpy(name, dtype):
    sizes, formula = FORMULAS[name]
    path = CORE / f"{name}{SUFFIX[dtype]}.tl"
    c = compile_loaded(lang.load(path, sizes), nki="0.6")
    assert_formula_matches(c, formula, f"{path.name} {sizes}")
