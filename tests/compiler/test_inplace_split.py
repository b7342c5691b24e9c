"""gaps15: an output finished in place after a contraction (`O += P V` then `O = O / z`, `C = C * 0.5 + b[j]`)
compiles through a new tensor for the sum (inplace_split.py) and matches NumPy formulas in both NKI dialects; the
eviction's own relu in place is compiled as before."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run, conv_valid
from tilec.compiler.inplace_split import split_in_place_epilogues
from tilec.lang import api as lang

PROGRAMS = pathlib.Path(__file__).parents[1] / "programs" / "gaps15"


def _attention(a):
    s = a["Q"] @ a["K"].T
    e = np.exp((s - s.max(1, keepdims=True)) * 0.125)
    return e @ a["V"] / e.sum(1, keepdims=True)


SCALED = """\
kernel mm(A: f32[M, K], B: f32[K, N], b: f32[N]) -> C
  default M = 200, K = 130, N = 260
  C: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += A[i, k] * B[k, j]
  for i in 0..M, j in 0..N:
    C[i, j] = C[i, j] * 0.5 + b[j]
"""

CONV_SCALED = """\
kernel cnn(X: f32[N, C, H, W], Wt: f32[K, C, R, R], b: f32[K]) -> conv
  default N = 1, C = 128, H = 10, W = 10, K = 128, R = 3
  let Ho = H - R + 1, Wo = W - R + 1
  conv: f32[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    conv[n, k, y, x] = b[k]
    for c in 0..C, r in 0..R, s in 0..R:
      conv[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    conv[n, k, y, x] = 2 * conv[n, k, y, x]
"""  # refused before gaps15 (test_relu_in_nest's conv_output_scaled_next_nest)


def _conv_scaled(a):
    return 2 * (conv_valid(a["X"], a["Wt"]) + a["b"][None, :, None, None])


CASES = {
    "conv_scaled_next_nest": (CONV_SCALED, "conv", _conv_scaled),
    "attn_full": ((PROGRAMS / "attn_full.tl").read_text(), "O", _attention),
    "scaled_matmul": (SCALED, "C", lambda a: (a["A"] @ a["B"]) * 0.5 + a["b"]),
}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_an_output_finished_in_place_after_a_contraction_matches_numpy(name, nki):
    text, out, formula = CASES[name]
    prog, c, inputs, got = compile_and_run(text, nki)
    assert_matches(prog, out, got[out], formula({k: np.asarray(v, np.float64) for k, v in inputs.items()}))


def test_a_relu_in_place_is_left_to_the_eviction():
    prog = lang.load(SCALED.replace("C[i, j] * 0.5 + b[j]", "relu(C[i, j])"))
    assert split_in_place_epilogues(prog) is prog


def test_the_sum_goes_to_a_new_tensor_of_the_outputs_dtype():
    prog = split_in_place_epilogues(lang.load(SCALED.replace("f32", "bf16")))
    assert prog.tensors["C_acc"].dtype == "bf16" and prog.tensors["C_acc"].kind == "temp"
