"""Mixed-tap folding (conv_mixed.py): a conv whose C x taps does not fit 128 and whose C leaves whole copies nothing
to fold (2 C > 128) folds its (tap, channel) rows into contraction tiles of 128, a tap's channels straddling two
tiles. Checked on the plan, the kernel's text (matmuls per out-channel part) and against a NumPy float64 conv on the
interpreter in f32, f16 and bf16, padded and unpadded, stride 1 and 2, batch 1 and 2, both NKI dialects."""
from __future__ import annotations

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

PADDED = """kernel padded(X: f32[N, C, H, W], Wt: f32[K, C, {r}, {r}]) -> Y
  default N = 1, C = 67, H = 12, W = 10, K = 129
  let Ho = (H + 2*{p} - {r}) / {s} + 1, Wo = (W + 2*{p} - {r}) / {s} + 1
  Y: f32[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..{r}, s in 0..{r}:
      Y[n, k, y, x] += (X[n, c, {s}*y + r - {p}, {s}*x + s - {p}] ?? 0) * Wt[k, c, r, s]
"""

# (window, stride, padding, sizes); the numeric test forces the mixed form where the cost rule would not choose it
# (a stride-2 band's copies move twice the bytes per output row), so every case runs it
CASES = {
    "same3x3": (3, 1, 1, {}),
    "same3x3_k64_batch2": (3, 1, 1, {"N": 2, "K": 64, "C": 100}),
    "valid3x3": (3, 1, 0, {"C": 90}),
    "stride2": (3, 2, 1, {"H": 13, "W": 11}),
    "two_by_two": (2, 1, 0, {"C": 70, "K": 20}),
    "wide_k": (3, 1, 1, {"K": 520, "H": 6, "W": 8}),  # 5 out-channel tiles: mixed in 16 bits too
}


def program_of(name: str, dtype: str = "f32"):
    r, s, p, sizes = CASES[name]
    return lang.load(PADDED.format(r=r, s=s, p=p).replace("f32[", f"{dtype}["), sizes)


def test_tiles_and_segments() -> None:
    """67 channels x 9 taps = 603 rows in 5 tiles; copy 1's rows 67..133 straddle tiles 0 and 1."""
    assert conv_mixed.tiles(67, 9) == 5 and conv_mixed.tiles(64, 9) == 5 and conv_mixed.tiles(127, 4) == 4


def test_matmuls_per_part() -> None:
    """One matmul per contraction tile of the 128-channel part (5 per band, not 9); the one-channel remainder's
    taps spread over the output partitions instead (conv_spread: 2 matmuls, not 5)."""
    src = unwrap(compile_loaded(program_of("same3x3")).source)
    assert src.count("nc_matmul(") == 5 + 2
    assert "src=X_band_flat[" in src  # the copies made on chip from one load of the band


def test_chosen_where_it_saves() -> None:
    """The cost rule: f32 67 -> 129 channels folds (5 tiles for 9 taps, 2 out-channel parts); at stride 2 the
    copies move twice the bytes per output row for half the columns, so it does not; a 16-bit conv with 5
    out-channel tiles does."""
    def mixed(name: str, dtype: str = "f32") -> bool:
        return "src=X_band_flat[" in unwrap(compile_loaded(program_of(name, dtype)).source)
    assert mixed("same3x3") and not mixed("stride2") and mixed("wide_k", "bf16")


def test_16_bit_keeps_a_matmul_per_tap() -> None:
    """bf16 conv_odd's shape: 4 fewer matmuls per out-channel tile at the 16-bit rate save less than the band
    copies' DMA costs, so each tap keeps its matmul (a loop over the tap rows per tap column, reading one band of
    X's own columns: build_conv_cols)."""
    src = unwrap(compile_loaded(lang.load(PADDED.format(r=3, s=1, p=1).replace("f32[", "bf16["),
                                          {"H": 28, "W": 28})).source)
    # (its two peeled bands built one ahead of the other have names of their own: X_band0, X_band1, conv_spread.ahead)
    assert "src=X_band_flat[" not in src and "X_band0[:, r:r + ROWS, 0:27]" in src


def test_not_for_foldable_channels() -> None:
    """64 channels fold two whole copies per matmul (conv_fold): no mixed tiles."""
    src = unwrap(compile_loaded(lang.load(PADDED.format(r=3, s=1, p=1), {"C": 64})).source)
    assert "src=X_band_flat[" not in src


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_mixed_taps_match_numpy(name: str, dtype: str, nki: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conv_mixed, "saves", lambda *args: True)
    r, stride, pad, _ = CASES[name]
    program = program_of(name, dtype)
    src = unwrap(compile_loaded(program, nki=nki).source)
    assert "src=X_band_flat[" in src  # the mixed form is what is checked
    rng = np.random.default_rng(13)
    given = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(NP[dtype]) for t in program.inputs}
    x, w = (given[k].astype(np.float64) for k in ("X", "Wt"))
    want = conv(np.pad(x, [(0, 0), (0, 0), (pad, pad), (pad, pad)]), w, stride=stride)
    got = np.asarray(compile_loaded(program, nki=nki).run(**given)["Y"], np.float64)
    assert got.shape == want.shape
    rounded = want.astype(NP[dtype]).astype(np.float64)
    assert max_error(got, rounded) <= tolerance(dtype, x.shape[1] * r * r, float(np.abs(want).max()), None)


@pytest.mark.parametrize("directives", ["tile Y.k, 43", "hoist Wt, Y.k", "reorder Y, k, n, y",
                                        "split Y.y, 4", "tile Y.x, 5"])
def test_directives_keep_mixed_taps_right(directives: str) -> None:
    """A schedule's directives over the mixed form (out-channel tiles without a remainder, weights per tile, the
    parts outermost so each makes its band, smaller bands and column tiles) against NumPy."""
    text = PADDED.format(r=3, s=1, p=1) + f"  schedule:\n    {directives}\n"
    program = lang.load(text, {"N": 2})
    compiled = compile_loaded(program)
    assert "src=X_band_flat[" in unwrap(compiled.source)
    rng = np.random.default_rng(17)
    given = {t.name: rng.random(t.shape, dtype=np.float32) - 0.5 for t in program.inputs}
    x, w = (given[k].astype(np.float64) for k in ("X", "Wt"))
    want = conv(np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)]), w)
    got = np.asarray(compiled.run(**given)["Y"], np.float64)
    assert max_error(got, want) <= tolerance("f32", x.shape[1] * 9, float(np.abs(want).max()), None)
