"""Stacked bands (schedule.stacks, build_conv): a 1x1 conv of at most 64 input channels loads its band's two matmul
groups onto the two partition halves (so the loads reach all 16 DMA engines) and holds its stationary on both
halves. Checked on the kernel text and against a NumPy float64 conv on the interpreter in f32, f16 and bf16, strided
and not, at batch 1 and 2, with fewer than 64 channels and K < 128 (some sizes and dtypes stay unstacked: a group's rows
under 2 KiB per partition keep one band, schedule._default_conv); a case the rule does not take (128 channels)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from numpy_refs import conv
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from tilec.tolerance import max_error, tolerance

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}

POINT = """kernel p(X: f32[N, C, H, W], Wt: f32[K, C]) -> Y
  default N = 1, C = 64, H = 56, W = 56, K = 128
  Y: f32[N, K, H / S, W / S]
  for n in 0..N, k in 0..K, y in 0..H / S, x in 0..W / S:
    Y[n, k, y, x] = 0
    for c in 0..C:
      Y[n, k, y, x] += X[n, c, S*y, S*x] * Wt[k, c]
"""


def program(dtype: str, sizes: dict[str, int], stride: int):
    text = POINT.replace("S*", f"{stride}*").replace("/ S", f"/ {stride}").replace("f32[", f"{dtype}[")
    return lang.load(text, sizes)


@pytest.mark.parametrize("stride, sizes", [(2, {"N": 2}), (2, {"N": 1}), (1, {"N": 2, "H": 32, "W": 32})])
def test_stacked_kernel(stride: int, sizes: dict[str, int]) -> None:
    source = compile_loaded(program("f32", sizes, stride)).source
    # both halves of the band loaded, the stationary and the moving operand read at partition 64 * group
    assert "X_band[0:64]" in source and "X_band[64:128]" in source
    assert "Wt_T[y_g * 64:y_g * 64 + TILE_C]" in source


def test_not_stacked_for_128_channels() -> None:
    source = compile_loaded(program("f32", {"N": 2, "C": 128}, 2)).source
    assert "X_band[64:128]" not in source


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("sizes", [{"N": 1}, {"N": 2, "H": 32, "W": 32}, {"N": 2, "C": 40, "K": 96, "W": 40}])
def test_stacked_matches_numpy(dtype: str, stride: int, sizes: dict[str, int]) -> None:
    prog = program(dtype, sizes, stride)
    rng = np.random.default_rng(13)
    given = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(NP[dtype]) for t in prog.inputs}
    x, w = given["X"].astype(np.float64), given["Wt"].astype(np.float64)
    want = conv(x[..., ::stride, ::stride], w[:, :, None, None])
    got = np.asarray(compile_loaded(prog).run(**given)["Y"], np.float64)
    assert got.shape == want.shape
    rounded = want.astype(NP[dtype]).astype(np.float64)
    assert max_error(got, rounded) <= tolerance(dtype, w.shape[1], float(np.abs(want).max()), None)
