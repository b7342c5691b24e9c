"""Odd channel counts (issue 13: C = 67, K = 129) take 128-channel tiles plus a remainder tile when that is fewer tiles
than the largest divisor's (129 = 128 + 1: 2 out-channel tiles, not 3 of 43): one moving pass per tile and tap, so
the plan with fewer tiles streams fewer columns. Checked against a NumPy conv in f32, f16 and bf16, and in both NKI
dialects."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import compile_and_run
from tilec.compiler.schedule import conv_channel_tile
from tilec.compiler.wrap import unwrap
from tilec.tolerance import max_error, tolerance

CONV = """kernel odd(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3]) -> Y
  default N = 2, C = 67, H = 9, W = 11, K = 129
  Y: f32[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[k, c, r, s]
"""


def conv_same(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """NumPy 3x3 conv, zero padding 1, in float64."""
    xp = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)])
    H, W = x.shape[2:]
    return sum(np.einsum("nchw,kc->nkhw", xp[:, :, r:r + H, s:s + W], w[:, :, r, s])
               for r in range(3) for s in range(3))


def test_channel_tile_prefers_fewer_tiles() -> None:
    assert conv_channel_tile(129) == 128  # 2 tiles (128 + 1), not 3 of 43
    assert conv_channel_tile(257) == 128  # 3 tiles, not 257 of 1
    assert conv_channel_tile(192) == 96  # 2 tiles either way: the even split stays
    assert conv_channel_tile(67) == 67 and conv_channel_tile(64) == 64


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_k129_ragged_matches_numpy(dtype: str, nki: str) -> None:
    prog, c, inputs, out = compile_and_run(CONV.replace("f32", dtype), nki)
    src = unwrap(c.source)
    assert "Y[n, 128:129]" in src and "TILE_K = 43" not in src  # the remainder tile: out-channel 128 alone
    want = conv_same(np.asarray(inputs["X"], np.float64), np.asarray(inputs["Wt"], np.float64))
    got = np.asarray(out["Y"], np.float64)
    assert got.shape == want.shape
    assert max_error(got, want) <= tolerance(dtype, 67 * 9, float(np.abs(want).max()), None)
