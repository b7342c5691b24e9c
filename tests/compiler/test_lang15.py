"""lang15: forms a new user writes that audit13 found refused (tests/fuzz/regressions/audit13_*.tl), each compiled
now and checked against an independent NumPy formula on tilec's NKI interpreter in f32 and bf16 and in both NKI
dialects; the forms still refused give a located TilecError that says what to write instead."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.compiler.codegen import NKI_VERSIONS
from tilec.errors import TilecError
from tilec.lang import api as lang
from tilec.tolerance import max_error, program_budget, scale_of, tolerance

NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
CASES = [(dt, nki) for dt in NP for nki in NKI_VERSIONS]


def check(src: str, dtype: str, nki: str, formula, seed: int = 15):
    """Compile `src` with its tensors in `dtype` for NKI `nki`, run it on signed inputs exact in `dtype` and compare
    each output with `formula(inputs in float64, rounding to dtype)` within the project's tolerance policy; returns
    the compiled kernel."""
    prog = lang.load(src.replace("f32[", f"{dtype}["))
    c = compile_loaded(prog, None, nki)
    rng = np.random.default_rng(seed)
    given = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(NP[dtype]) for t in prog.inputs}
    exact = {k: v.astype(np.float64) for k, v in given.items()}
    q = lambda v: np.asarray(v).astype(NP[dtype]).astype(np.float64)  # noqa: E731  a store in `dtype`
    want = formula(exact, q)
    got = c.run(**given)
    assert set(got) == set(want)
    for name, expected in want.items():
        assert np.shape(got[name]) == expected.shape, name
        acc_len, inter = program_budget(prog).get(name, (1, None))
        tol = tolerance(dtype, acc_len, scale_of(expected), inter)
        err = max_error(np.asarray(got[name], np.float64), q(expected))
        assert err <= tol, f"{name} ({dtype}, NKI {nki}): max |kernel - NumPy| {err:.3g} > tolerance {tol:.3g}"
    return c


def refusal(src: str) -> TilecError:
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load(src))
    assert err.value.span is not None and err.value.hint
    return err.value


# ---- a size read as a value (audit13_size_in_value) -----------------------------------------------------------------

MEAN = """\
kernel mean_hw(X: f32[N, C, H, W]) -> Y
  default N = 2, C = 136, H = 7, W = 5
  S: f32[N, C]
  Y: f32[N, C]
  for n in 0..N, c in 0..C:
    S[n, c] = 0
    for i in 0..H, j in 0..W:
      S[n, c] += X[n, c, i, j]
  for n in 0..N, c in 0..C:
    Y[n, c] = S[n, c] / (H * W) + 0.5 * H
"""


@pytest.mark.parametrize("dtype, nki", CASES)
def test_a_size_in_an_element_wise_value_is_its_number(dtype, nki):
    check(MEAN, dtype, nki, lambda a, q: {"Y": q(a["X"].sum(axis=(2, 3))) / 35 + 3.5})


# ---- batched matmuls with several batch indices (audit13_batched4d_matmul) -------------------------------------------

SCORES = """\
kernel scores(Q: f32[B, G, S, D], Kt: f32[B, G, T, D]) -> P
  default B = 2, G = 3, S = 130, T = 200, D = 72
  P: f32[B, G, S, T]
  for b in 0..B, h in 0..G, i in 0..S, j in 0..T:
    P[b, h, i, j] = 0
    for d in 0..D:
      P[b, h, i, j] += Q[b, h, i, d] * Kt[b, h, j, d]
"""

PV = """\
kernel pv(Pm: f32[A, B, G, S, T], V: f32[A, B, G, T, D]) -> O
  default A = 2, B = 1, G = 3, S = 140, T = 150, D = 64
  O: f32[A, B, G, S, D]
  for a in 0..A, b in 0..B, h in 0..G, i in 0..S, d in 0..D:
    O[a, b, h, i, d] = 0
    for j in 0..T:
      O[a, b, h, i, d] += Pm[a, b, h, i, j] * V[a, b, h, j, d]
"""


@pytest.mark.parametrize("dtype, nki", CASES)
def test_attention_scores_with_two_batch_indices_is_one_batched_matmul(dtype, nki):
    c = check(SCORES, dtype, nki, lambda a, q: {"P": np.einsum("bhid,bhjd->bhij", a["Q"], a["Kt"])})
    assert "reshape((6, " in c.source  # the batch (b, h) is one batch of B * G: the tensors seen as [6, ..]


@pytest.mark.parametrize("dtype, nki", CASES)
def test_three_batch_indices(dtype, nki):
    check(PV, dtype, nki, lambda a, q: {"O": np.einsum("abhij,abhjd->abhid", a["Pm"], a["V"])})


def test_batch_indices_over_part_of_a_dimension_are_a_located_refusal():
    err = refusal(SCORES.replace("for b in 0..B, h in 0..G", "for b in 0..B, h in 0..G - 1"))
    assert "runs over part of dimension 1 of" in err.message and "whole dimension" in err.message


def test_a_batch_index_after_the_rows_is_a_located_refusal_that_says_the_order():
    src = SCORES.replace("P[b, h, i, j] =", "P[b, i, h, j] =").replace("P[b, h, i, j] +=", "P[b, i, h, j] +=") \
        .replace("P: f32[B, G, S, T]", "P: f32[B, S, G, T]").replace("for b in 0..B, h in 0..G, i in 0..S",
                                                                     "for b in 0..B, i in 0..S, h in 0..G")
    err = refusal(src)
    assert "stationary" in err.message and "then permute it" in err.hint
