"""Issue 10's program kinds as a new user writes them next to benchmarks/core/ (tests/programs/audit15/): each
compiles with its default schedule at sizes over one tile (a dimension over the 128 partitions, odd edges), runs on
tilec's NKI interpreter and matches a NumPy formula written here in float64, never tilec's own evaluator.

The programs the compiler refuses today are strict xfails naming the gap (docs/notes/audit15.md); the model time of
every program at its realistic default sizes is benchmarks/audit15.py."""
from __future__ import annotations

import math
import pathlib
from typing import Callable

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang
from tilec.tolerance import max_error, program_budget, scale_of, tolerance

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "programs" / "audit15"
NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
Arrays = dict[str, np.ndarray]
Formula = Callable[[Arrays], Arrays]

_erf = np.vectorize(math.erf)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def lse(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1)
    return m + np.log(np.exp(x - m[..., None]).sum(axis=-1))


def softmax_t(x: np.ndarray, t: float) -> np.ndarray:
    e = np.exp(t * (x - x.max(axis=-1, keepdims=True)))
    return e / e.sum(axis=-1, keepdims=True)


def rmsnorm_gated(a: Arrays) -> Arrays:
    x = a["X"]
    return {"Y": x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * a["g"] * sigmoid(a["Z"])}


def standardize(x: np.ndarray, axis: int, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean(axis=axis, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=axis, keepdims=True) + eps)


def funcs_mix(a: Arrays) -> Arrays:
    A, B = a["A"], a["B"]
    top = np.sqrt(np.abs(A) + 1) + np.log(np.abs(B) + 0.5) * gelu(A) - np.tanh(B)
    return {"Y": top / (sigmoid(A) + 1 / np.sqrt(np.abs(B) + 1)) + 1 / (2 + A)}


def gelu_tanh(a: Arrays) -> Arrays:
    x = a["X"]
    return {"Y": 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))}


def bcast3d(a: Arrays) -> Arrays:
    return {"Y": 0.5 * a["X"] - 2 * a["a"][:, None, None] + 3 * a["b"][None, :, None] - 0.25 * a["c"] + 1}


# name -> (sizes over one tile, formula(inputs in float64) -> {output: expected}, reason if the compiler refuses it)
CASES: dict[str, tuple[dict[str, int], Formula, str | None]] = {
    "logsumexp_rows": (dict(M=300, N=700), lambda a: {"Y": lse(a["X"])}, None),
    "softmax_heads": (dict(B=2, H=3, S=130, T=300), lambda a: {"Y": softmax_t(a["X"], 0.125)}, None),
    "rmsnorm_gated": (dict(M=300, N=600), rmsnorm_gated, None),
    "layernorm_nogain": (dict(M=300, N=700), lambda a: {"Y": standardize(a["X"], 1)}, None),
    "groupnorm": (dict(N=2, G=5, L=1000), lambda a: {"Y": standardize(a["X"], 2) * a["g"][:, None]}, None),
    "gelu_tanh": (dict(M=300, N=700), gelu_tanh, None),
    "funcs_mix": (dict(M=300, N=700), funcs_mix, None),
    "softplus": (dict(M=300, N=700), lambda a: {"Y": np.log1p(np.exp(a["beta"] * a["X"])) / a["beta"]}, None),
    "column_standardize": (dict(M=300, N=700), lambda a: {"Y": standardize(a["X"], 0)}, None),
    "channel_max": (dict(N=2, C=200, H=9, W=11), lambda a: {"Y": a["X"].max(axis=1)}, None),
    "height_mean": (dict(N=2, C=200, H=9, W=11), lambda a: {"Y": a["X"].mean(axis=2)}, None),
    "batch_mse": (dict(B=3, M=200, N=300), lambda a: {"s": ((a["A"] - a["P"]) ** 2).mean(axis=(1, 2))}, None),
    "column_l1": (dict(M=300, N=700), lambda a: {"s": np.abs(a["X"] - a["c"]).sum(axis=0)}, None),
    "middle_ssd": (dict(A=3, B=200, C=300), lambda a: {"s": ((a["X"] - a["Y0"]) ** 2).sum(axis=1)}, None),
    "keys_transpose": (dict(B=2, H=3, S=200, D=72), lambda a: {"Y": a["K"].transpose(0, 1, 3, 2)}, None),
    "cyclic_permute": (dict(A=5, B=130, C=200), lambda a: {"Y": a["X"].transpose(2, 0, 1)}, None),
    "nhwc_to_nchw_scale": (dict(N=2, H=5, W=7, C=200),
                           lambda a: {"Y": a["s"][:, None, None] * a["X"].transpose(0, 3, 1, 2) - 1.5}, None),
    "bcast3d": (dict(A=3, B=200, C=300), bcast3d, None),
    "bcast_clamp": (dict(M=300, N=700),
                    lambda a: {"Y": np.clip(3 * a["X"] + 0.5 * a["b"] - a["c"][:, None] / 4, -1, 1)}, None),
    "swish_bcast": (dict(M=300, N=700), lambda a: {"Y": a["X"] * sigmoid(a["beta"] * a["X"])}, None),
    "rowrange_bf16": (dict(M=300, N=700), lambda a: {"r": a["X"].max(axis=1) - a["X"].min(axis=1)}, None),
}

# inputs drawn from [-0.5, 0.5) unless named here: a softplus slope away from 0 (it divides by it)
RANGES: dict[tuple[str, str], tuple[float, float]] = {("softplus", "beta"): (0.5, 1.5)}


def inputs(name: str, program, seed: int = 15) -> tuple[Arrays, Arrays]:
    rng = np.random.default_rng(seed)
    given: Arrays = {}
    for t in program.inputs:
        lo, hi = RANGES.get((name, t.name), (-0.5, 0.5))
        given[t.name] = (lo + (hi - lo) * rng.random(t.shape)).astype(np.float32).astype(NP[t.dtype])
    return given, {k: v.astype(np.float64) for k, v in given.items()}


def test_every_program_has_a_case() -> None:
    assert set(CASES) == {p.stem for p in PROGRAMS.glob("*.tl")}


def _cases() -> list:
    out = []
    for name in sorted(CASES):
        reason = CASES[name][2]
        marks = [pytest.mark.xfail(strict=True, raises=TilecError, reason=reason)] if reason else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.parametrize("target", ["trn2", "trn1"])
@pytest.mark.parametrize("name", _cases())
def test_program_matches_numpy(name: str, target: str) -> None:
    sizes, formula, _ = CASES[name]
    program = lang.load(PROGRAMS / f"{name}.tl", sizes)
    assert any(max(t.shape) > 128 for t in program.tensors.values())  # not one tile
    compiled = compile_loaded(program, None, None, target)
    given, exact = inputs(name, program)
    want = formula(exact)
    got = compiled.run(**given)
    assert set(got) == set(want)
    assert not beyond_tolerance(name, program, got, exact)


def beyond_tolerance(name: str, program, got: Arrays, exact: Arrays) -> list[str]:
    """The outputs of a run of CASES[name]'s program that differ from its NumPy formula (on the float64 inputs
    `exact`, rounded as the store rounds) beyond the project's tolerance (tilec/tolerance.py), a message each; also
    read by test_audit15_directives and benchmarks/directive_matrix.py."""
    bad = []
    for out, expected in CASES[name][1](exact).items():
        dtype = program.tensors[out].dtype
        expected = np.asarray(expected).astype(NP[dtype]).astype(np.float64)  # the store's rounding
        assert np.isfinite(expected).all(), f"{name}.{out}: the formula is not finite on these inputs"
        acc_len, inter = program_budget(program).get(out, (1, None))
        tol = tolerance(dtype, acc_len, scale_of(expected), inter)
        err = max_error(np.asarray(got[out], np.float64), expected)  # inf when the shapes differ
        if not err <= tol:
            bad.append(f"{name}.{out}: max |kernel - NumPy| {err:.3g} > tolerance {tol:.3g}")
    return bad
