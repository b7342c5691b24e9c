"""Transposed convolutions whose kernel is larger than their stride (tconv_pad.py): DCGAN's 4x4 stride 2 padding 1
and a 3x3 stride 2 padding 1 with output_padding 1, in their phase form, against NumPy's ConvTranspose2d definition
(each input pixel's taps scattered onto the output, the padding cropped), f32, f16 and bf16, at shapes of several
partition tiles."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, run_in_own_dtypes
from test_families_dtypes import tconv_padded  # the NumPy definition (ConvTranspose2d, stride 2, padding 1)

TEXT = """\
kernel dc(X: {d}[N, C, H, W], Wt: {d}[C, K, {R}, {R}], b: {d}[K]) -> Y
  default N = {N}, C = {C}, H = {H}, W = {W}, K = {K}
  Y: {d}[N, K, 2 * H, 2 * W]
  for n in 0..N, k in 0..K, y in 0..H, i in 0..2, x in 0..W, j in 0..2:
    Y[n, k, 2 * y + i, 2 * x + j] = b[k]
    for c in 0..C, t in 0..2, u in 0..2:
      Y[n, k, 2 * y + i, 2 * x + j] += (X[n, c, y + i - t, x + j - u] ?? 0) * {w}
"""
W4 = "Wt[c, k, 2 * t + 1 - i, 2 * u + 1 - j]"
W3 = "(Wt[c, k, 2 * t + 1 - i, 2 * u + 1 - j] ?? 0)"  # tap 3 of phase 0 is outside a 3x3 kernel
CASES = {  # name: (dtype, R, N, C, H, W, K)
    "k4_f32": ("f32", 4, 2, 130, 3, 4, 24),
    "k4_bf16": ("bf16", 4, 1, 40, 4, 5, 16),
    "k3_f16": ("f16", 3, 1, 24, 5, 3, 12),
    "k3_f32": ("f32", 3, 2, 16, 3, 3, 32),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_numpy(case: str) -> None:
    d, R, n, c, h, w, k = CASES[case]
    text = TEXT.format(d=d, R=R, N=n, C=c, H=h, W=w, K=k, w=W4 if R == 4 else W3)
    prog, out, a = run_in_own_dtypes(text, 7)
    assert_matches(prog, "Y", np.asarray(out["Y"], np.float32), tconv_padded(a, R))


@pytest.mark.parametrize("case", sorted(CASES))
def test_built_on_chip(case: str) -> None:
    """build_tconv fuses the rewrite's parts: no tap matrix, padded copy or sum goes through HBM."""
    from tilec.compiler.api import compile_loaded
    from tilec.lang import api as lang
    d, R, n, c, h, w, k = CASES[case]
    source = compile_loaded(lang.load(TEXT.format(d=d, R=R, N=n, C=c, H=h, W=w, K=k, w=W4 if R == 4 else W3))).source
    assert "buffer=nl.hbm" not in source
