"""A zero-padded conv's input band zeroes only its halo (conv_halo): GpSimdE copies from two small zero tiles write
the rows and columns outside X, and the band's loads no longer wait for a memset of the whole band. A small band
(where the copies would take GpSimdE longer than the memset) keeps the zeroed allocation. Checked on the kernels'
text and against a NumPy float64 conv on the interpreter in f32, f16 and bf16 (folded taps with per-copy halos;
two contraction tiles; batch 1 with peeled halo bands and batch 2 with the band loop), in both NKI dialects.
(The folded stride-2 bands hold X's own columns, conv_fold.column_groups: their halo rows come from the zero tile
of build_conv's zero_rows.)"""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from numpy_refs import conv
from tilec.compiler import conv_mixed
from tilec.compiler.api import compile_loaded
from tilec.compiler.wrap import unwrap
from tilec.lang import api as lang
from tilec.tolerance import max_error, tolerance

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}

PADDED = """kernel padded(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3]) -> Y
  default N = 1, C = 64, H = 48, W = 48, K = 129
  let Ho = (H + 2*1 - 3) / {s} + 1, Wo = (W + 2*1 - 3) / {s} + 1
  Y: f32[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, {s}*y + r - 1, {s}*x + s - 1] ?? 0) * Wt[k, c, r, s]
"""

# (stride, sizes): folded taps (C = 64, two per matmul) at stride 2; two contraction tiles of 80 at stride 1
CASES = {
    "folded_s2": (2, {"C": 64}),
    "folded_s2_batch2": (2, {"C": 64, "N": 2}),
    "tiles_s1": (1, {"C": 160, "H": 40, "W": 40}),
    "tiles_s1_batch2": (1, {"C": 160, "H": 40, "W": 40, "N": 2}),
}


def source(text: str, sizes: dict[str, int], nki: str = "0.6") -> str:
    return unwrap(compile_loaded(lang.load(text, sizes), nki=nki).source)


@pytest.mark.parametrize("name", sorted(CASES))
def test_halo_copies_replace_the_band_memset(name: str) -> None:
    stride, sizes = CASES[name]
    src = source(PADDED.format(s=stride), sizes)
    assert re.search(r"memset\(dst=X_band", src) is None  # no band is zeroed whole
    assert "src=X_zero_rows" in src
    # folded taps at stride 2 (conv_fold.column_groups) and plain bands (build_conv_cols) hold X's own columns:
    # halo rows only
    assert "src=X_zero_cols" not in src


def test_small_band_keeps_its_memset(monkeypatch: pytest.MonkeyPatch) -> None:
    """9 x 11 image, 67 channels: a band of 11 x 13 elements is cheaper to memset than to patch in 4 copies (the
    plain band: f32 67 channels would fold its taps into mixed tiles, conv_mixed, which has its own halo)."""
    monkeypatch.setattr(conv_mixed, "saves", lambda *args: False)
    src = source(PADDED.format(s=1), {"C": 67, "H": 9, "W": 11})
    assert re.search(r"memset\(dst=X_band", src) and "X_zero" not in src


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_halo_copies_match_numpy(name: str, dtype: str, nki: str) -> None:
    stride, sizes = CASES[name]
    program = lang.load(PADDED.format(s=stride).replace("f32[", f"{dtype}["), sizes)
    rng = np.random.default_rng(7)
    given = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(NP[dtype]) for t in program.inputs}
    x, w = (given[k].astype(np.float64) for k in ("X", "Wt"))
    want = conv(np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)]), w, stride=stride)
    got = np.asarray(compile_loaded(program, nki=nki).run(**given)["Y"], np.float64)
    assert got.shape == want.shape
    rounded = want.astype(NP[dtype]).astype(np.float64)
    assert max_error(got, rounded) <= tolerance(dtype, x.shape[1] * 9, float(np.abs(want).max()), None)
