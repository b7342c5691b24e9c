"""Transposed convolutions, kernel 2 stride 2 (tconv_split.py): the three spellings (floor division and remainder,
a stride-2 store of taps, a 6-D output view) compile to one matmul over Wt's (k, a, b) rows and a permute; against
NumPy's ConvTranspose2d, f32 and bf16, at shapes of several partition tiles (C = 130, 4K = 160)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import assert_matches, run_in_own_dtypes
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

HEAD = """\
kernel tc(X: {d}[N, C, H, W], Wt: {d}[C, K, 2, 2], bias: f32[K]) -> Y
  default N = 2, C = 130, H = 6, W = 5, K = 40
"""
SPELLINGS = {
    "floor": """\
  Y: {d}[N, K, 2 * H, 2 * W]
  for n in 0..N, k in 0..K, y in 0..2 * H, x in 0..2 * W:
    Y[n, k, y, x] = bias[k]
    for c in 0..C:
      Y[n, k, y, x] += X[n, c, y / 2, x / 2] * Wt[c, k, y % 2, x % 2]
""",
    "strided": """\
  Y: {d}[N, K, 2 * H, 2 * W]
  for n in 0..N, k in 0..K, y in 0..H, a in 0..2, x in 0..W, b in 0..2:
    Y[n, k, 2 * y + a, 2 * x + b] = bias[k]
    for c in 0..C:
      Y[n, k, 2 * y + a, 2 * x + b] += X[n, c, y, x] * Wt[c, k, a, b]
""",
    "view": """\
  Y: {d}[N, K, H, 2, W, 2]
  for n in 0..N, k in 0..K, y in 0..H, a in 0..2, x in 0..W, b in 0..2:
    Y[n, k, y, a, x, b] = bias[k]
    for c in 0..C:
      Y[n, k, y, a, x, b] += X[n, c, y, x] * Wt[c, k, a, b]
""",
}


def _reference(a: dict) -> np.ndarray:
    """torch.nn.ConvTranspose2d(C, K, 2, stride=2): output pixel (2y + a, 2x + b) = sum_c X[c, y, x] Wt[c, k, a, b]."""
    t = np.einsum("ncyx,ckab->nkyaxb", a["X"], a["Wt"]) + a["bias"][None, :, None, None, None, None]
    n, k, h, _, w, _ = t.shape
    return t.reshape(n, k, 2 * h, 2 * w)


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_transposed_conv_matches_numpy(spelling: str, dtype: str) -> None:
    text = (HEAD + SPELLINGS[spelling]).format(d=dtype)
    prog, out, a = run_in_own_dtypes(text, 3)
    got = np.asarray(out["Y"], np.float32).reshape(_reference(a).shape)
    assert_matches(prog, "Y", got, _reference(a))


def test_the_spellings_are_one_kernel() -> None:
    """One kernel whichever spelling: a matmul per tap and contraction tile (4 taps x 2 tiles of C = 130, for each of
    the two images of a pair, N = 2) evicted into Y's layout in SBUF (build_tconv.py), no HBM temporary between the
    matmul and the permute."""
    kernels = {s: compile_loaded(lang.load((HEAD + t).format(d="f32"))).source for s, t in SPELLINGS.items()}
    calls = {s: re.findall(r"\b(?:nisa|nl)\.\w+", k) for s, k in kernels.items()}  # (loop names differ: y_q, y)
    assert calls["floor"] == calls["strided"] == calls["view"]
    assert kernels["floor"].count("nc_matmul(") == 16
    assert "Y_t = nl.ndarray" not in kernels["floor"]


def test_without_a_batch_the_weights_are_still_the_stationary() -> None:
    """X[c, y, x] ends in output variables too; the rows are Wt's (k, a, b), whose first comes first in Y."""
    text = """\
kernel tc(X: bf16[C, H, W], Wt: bf16[C, K, 2, 2]) -> Y
  default C = 64, H = 5, W = 6, K = 48
  Y: bf16[K, 2 * H, 2 * W]
  for k in 0..K, y in 0..2 * H, x in 0..2 * W:
    Y[k, y, x] = 0
    for c in 0..C:
      Y[k, y, x] += X[c, y / 2, x / 2] * Wt[c, k, y % 2, x % 2]
"""
    prog, out, a = run_in_own_dtypes(text, 5)
    a = {"X": a["X"][None], "Wt": a["Wt"], "bias": np.zeros(48)}
    assert_matches(prog, "Y", np.asarray(out["Y"], np.float32), _reference(a)[0])


def test_a_phase_form_without_one_tap_per_offset_is_a_located_refusal() -> None:
    """`Wt[c, k, t + a, u + b]` with input (y + a - t, x + b - u): at input offset 0 phase 0 reads tap 0 and phase 1
    tap 2, not one shift of the phase, so tconv_pad.py leaves it; the refusal names the transposed conv and the
    forms that compile."""
    from tilec.errors import TilecError
    text = """\
kernel dc(X: f32[N, C, H, W], Wt: f32[C, K, 3, 3]) -> Y
  default N = 1, C = 16, H = 4, W = 4, K = 8
  Y: f32[N, K, 2 * H, 2 * W]
  for n in 0..N, k in 0..K, y in 0..H, a in 0..2, x in 0..W, b in 0..2:
    Y[n, k, 2 * y + a, 2 * x + b] = 0
    for c in 0..C, t in 0..2, u in 0..2:
      Y[n, k, 2 * y + a, 2 * x + b] += (X[n, c, y + a - t, x + b - u] ?? 0) * Wt[c, k, t + a, u + b]
"""
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(text))
    assert e.value.span is not None and e.value.span.line == 7
    assert "transposed convolution in a form not compiled" in str(e.value)
    assert "2 * t + 1 - a" in (e.value.hint or "")
