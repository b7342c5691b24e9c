"""A single image's conv whose default plan would load it as one band is split into two bands (schedule.two_bands),
so the second band's load overlaps the first band's matmuls; each band must still hold one whole matmul group.
Checked on the plans (the kernel's schedule header) and against a NumPy float64 conv on the interpreter in f32,
f16 and bf16, for a folded strided conv (C = 64: two taps per matmul), an unfolded odd-channel conv and a strided
1x1 conv, at sizes over one tile (K = 129: two out-channel tiles; 576 output columns: two matmul groups)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from numpy_refs import conv
from tilec.compiler.api import compile_loaded
from tilec.compiler.schedule import two_bands
from tilec.lang import api as lang
from tilec.tolerance import max_error, tolerance

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}

STRIDED = """kernel s2(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3]) -> Y
  default N = 1, C = 64, H = 48, W = 48, K = 129
  let Ho = (H + 2*1 - 3) / 2 + 1, Wo = (W + 2*1 - 3) / 2 + 1
  Y: f32[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, 2*y + r - 1, 2*x + s - 1] ?? 0) * Wt[k, c, r, s]
"""

ODD = """kernel odd(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3]) -> Y
  default N = 1, C = 67, H = 24, W = 24, K = 129
  Y: f32[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[k, c, r, s]
"""

POINT = """kernel p2(X: f32[N, C, H, W], Wt: f32[K, C]) -> Y
  default N = 1, C = 160, H = 48, W = 48, K = 129
  Y: f32[N, K, H / 2, W / 2]
  for n in 0..N, k in 0..K, y in 0..H / 2, x in 0..W / 2:
    Y[n, k, y, x] = 0
    for c in 0..C:
      Y[n, k, y, x] += X[n, c, 2*y, 2*x] * Wt[k, c]
"""


def pad(x: np.ndarray) -> np.ndarray:
    return np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)])


CASES = {
    "strided": (STRIDED, lambda x, w: conv(pad(x), w, stride=2), 64 * 9),
    "odd": (ODD, lambda x, w: conv(pad(x), w), 67 * 9),
    "point": (POINT, lambda x, w: conv(x[..., ::2, ::2], w[:, :, None, None]), 160),
}


def test_rule() -> None:
    assert two_bands(28, 28, 18, 1) == 14  # 28 rows of 28 columns: matmul groups of 14 rows, one per band
    assert two_bands(24, 24, 21, 1) == 12
    assert two_bands(15, 15, 36, 1) == 15  # one matmul group holds the image: not split
    assert two_bands(28, 14, 18, 1) == 14  # already several bands
    assert two_bands(28, 28, 18, 2) == 14  # a fused 2x2 pool: bands of whole windows
    assert two_bands(10, 10, 5, 2) == 2  # 5-row halves would split a window: five bands of one 2-row group


@pytest.mark.parametrize("name", sorted(CASES))
def test_single_image_has_two_bands_from_batch_two_one(name: str) -> None:
    text = CASES[name][0]
    one = compile_loaded(lang.load(text, {})).source
    two = compile_loaded(lang.load(text, {"N": 2})).source
    assert "split Y.y, 12" in one  # 24 output rows in two bands
    if name == "point":  # a 1x1 conv loads a band per matmul group at any batch (schedule._default_conv, small20)
        assert "split Y.y, 12" in two
    elif name == "strided":  # a strided folded conv loads 4x the bytes it stores per row: two bands at any batch
        assert "split Y.y, 12" in two
    elif name == "odd":  # f32 67 channels fold taps into mixed tiles (conv_mixed), whose bands halve at any batch
        assert "split Y.y, 12" in two and "src=X_band_flat[" in two
    else:
        assert "split Y.y, 24" in two  # the next image overlaps: one band per image, as before


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("n", [1, 2])
def test_two_bands_match_numpy(name: str, dtype: str, n: int) -> None:
    text, formula, acc_len = CASES[name]
    program = lang.load(text.replace("f32[", f"{dtype}["), {"N": n})
    rng = np.random.default_rng(20)
    given = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(NP[dtype]) for t in program.inputs}
    want = formula(given["X"].astype(np.float64), given["Wt"].astype(np.float64))
    got = np.asarray(compile_loaded(program).run(**given)["Y"], np.float64)
    assert got.shape == want.shape
    rounded = want.astype(NP[dtype]).astype(np.float64)
    assert max_error(got, rounded) <= tolerance(dtype, acc_len, float(np.abs(want).max()), None)
