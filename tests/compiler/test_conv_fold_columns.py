"""Folded taps of a padded read with X's own columns in the band (conv_fold.column_groups): the tap groups are formed
from taps that reach the same output columns, the copy shifted by a column is loaded as one flat run per partition,
and a group whose taps reach past X's edge accumulates into the output columns it reaches only. Checked on the plans,
on the kernels' text and against a NumPy float64 conv on the interpreter in f32, f16 and bf16, both NKI dialects."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from numpy_refs import conv
from tilec.compiler.api import compile_loaded
from tilec.compiler.wrap import unwrap
from tilec.lang import api as lang
from tilec.tolerance import max_error, tolerance

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}

PADDED = """kernel padded(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3]) -> Y
  default N = 1, C = 64, H = 30, W = 34, K = 129
  let Ho = (H + 2*1 - 3) / {s} + 1, Wo = (W + 2*1 - 3) / {s} + 1
  Y: f32[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, {s}*y + r - 1, {s}*x + s - 1] ?? 0) * Wt[k, c, r, s]
"""

# (stride, sizes): even and odd widths at stride 2 (an odd W's last tap column reaches past X: 2 partial groups)
CASES = {
    "s2_even": (2, {}),
    "s2_odd_width": (2, {"W": 33, "H": 31}),
    "s2_batch2": (2, {"N": 2}),
}


def src_of(stride: int, sizes: dict[str, int], nki: str = "0.6") -> str:
    return unwrap(compile_loaded(lang.load(PADDED.format(s=stride), sizes), nki=nki).source)


def test_stride2_groups_reach_the_same_columns() -> None:
    src = src_of(2, {})
    assert "X_band_flat" in src  # copy 1 (one column over) loaded flat
    assert "dst=Y_acc[:, :, 1:17]" in src  # tap column 0 misses output column 0 (X column -1)
    # 2 out-channel tiles x 5 groups: 6 as with halo columns, the lone taps then paired down the rows (conv_vpair)
    assert src.count("nc_matmul(") == 2 * 5


def test_stride1_keeps_halo_columns() -> None:
    """3x3 same: tap columns 0 and 2 each miss an edge column, so groups of equal reach would be 9, not 6: the band
    keeps its halo columns and the row-major groups."""
    src = src_of(1, {"H": 20, "W": 20})
    assert "X_band_flat" not in src and "Y_acc[:, :, 1:" not in src


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_fold_columns_match_numpy(name: str, dtype: str, nki: str) -> None:
    stride, sizes = CASES[name]
    program = lang.load(PADDED.format(s=stride).replace("f32[", f"{dtype}["), sizes)
    rng = np.random.default_rng(11)
    given = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(NP[dtype]) for t in program.inputs}
    x, w = (given[k].astype(np.float64) for k in ("X", "Wt"))
    want = conv(np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)]), w, stride=stride)
    got = np.asarray(compile_loaded(program, nki=nki).run(**given)["Y"], np.float64)
    assert got.shape == want.shape
    rounded = want.astype(NP[dtype]).astype(np.float64)
    assert max_error(got, rounded) <= tolerance(dtype, x.shape[1] * 9, float(np.abs(want).max()), None)
