"""A plain convolution (one matmul per tap) of a padded read with X's own columns in its band (build_conv_cols): the
band's rows load as one run per channel, and a tap column reaching past X's edge accumulates into the output columns
it reaches only, after a tap column reaching all of them. Checked on the kernels' text and against a NumPy float64
conv on the interpreter (small shapes; f32, bf16; ragged channel tiles, two in-channel tiles, stride, dilation)."""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from numpy_refs import conv
from tilec.compiler.api import compile_loaded
from tilec.compiler.wrap import unwrap
from tilec.lang import api as lang
from tilec.tolerance import max_error, tolerance

NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}

PADDED = """kernel padded(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3]) -> Y
  default N = 1, C = 67, H = 10, W = 12, K = 129
  let Ho = (H + 2*{p} - {d}*2 - 1) / {s} + 1, Wo = (W + 2*{p} - {d}*2 - 1) / {s} + 1
  Y: f32[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, {s}*y + {d}*r - {p}, {s}*x + {d}*s - {p}] ?? 0) * Wt[k, c, r, s]
"""

# (stride, dilation, padding, sizes)
CASES = {
    "same_ragged_k": (1, 1, 1, {}),
    "two_c_tiles": (1, 1, 1, {"C": 130, "K": 64, "W": 11}),
    "stride2_odd_width": (2, 1, 1, {"W": 13, "H": 11}),
    "dilated": (1, 2, 2, {"K": 32}),
    "batch2": (1, 1, 1, {"N": 2, "K": 48}),
}


def program(name: str, dtype: str):
    s, d, p, sizes = CASES[name]
    return lang.load(PADDED.format(s=s, d=d, p=p).replace("f32[", f"{dtype}["), sizes)


def test_band_rows_load_as_one_run() -> None:
    """bf16 67 channels (no mixed taps: their copies cost more than they save in 16 bits): the band holds X's 12
    columns (no halo columns), loaded whole; tap column 1 reaches every output column and runs first, tap column 0
    misses output column 0 and tap column 2 the last one."""
    src = unwrap(compile_loaded(program("same_ragged_k", "bf16"), nki="0.6").source)
    assert "X_band = nl.ndarray((TILE_C, BAND - 1 + 2 + 1, SIZE_W)" in src  # 12 columns, not 14
    loads = [ln for ln in src.splitlines() if "src=X[" in ln]
    assert loads and all(ln.rstrip().split("src=X[")[1].split("]")[0].count(",") <= 2 for ln in loads)  # no column slice
    first = src.index("stationary=Wt_T[:, r, 1,")
    assert first < src.index("dst=Y_acc[:, :, 1:12]") and first < src.index("dst=Y_acc[:, :, 0:11]")
    # the 128-channel part: 3 tap columns x a loop of 3 rows; the one-channel remainder's taps spread (conv_spread:
    # one matmul summing the taps over the band, one summing their shifted sums)
    assert src.count("nc_matmul(") == 3 + 2


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_own_columns_match_numpy(name: str, dtype: str) -> None:
    s, d, p, _ = CASES[name]
    prog = program(name, dtype)
    rng = np.random.default_rng(7)
    given = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(NP[dtype]) for t in prog.inputs}
    x, w = (given[k].astype(np.float64) for k in ("X", "Wt"))
    # a dilated window as a conv with the dilated (zero-stuffed) kernel
    wd = np.zeros(w.shape[:2] + (2 * d + 1, 2 * d + 1))
    wd[:, :, ::d, ::d] = w
    want = conv(np.pad(x, [(0, 0), (0, 0), (p, p), (p, p)]), wd, stride=s)
    kernel = compile_loaded(prog, nki="0.6")
    # every case takes the band of X's own columns (a clipped tap column), but f32 67 -> 129 (mixed taps fold)
    # (an f32 last band may be built as two groups, Y_acc_head and Y_acc_tail: conv_split)
    clipped = re.search(r"dst=Y_acc(?:_head|_tail)?\[[^\]]*, 0:\d+\]", unwrap(kernel.source)) is not None
    assert clipped == ((name, dtype) != ("same_ragged_k", "f32"))
    got = np.asarray(kernel.run(**given)["Y"], np.float64)
    assert got.shape == want.shape
    rounded = want.astype(NP[dtype]).astype(np.float64)
    assert max_error(got, rounded) <= tolerance(dtype, x.shape[1] * 9, float(np.abs(want).max()), None)
