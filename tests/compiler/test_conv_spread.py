"""A conv's one-channel out-channel remainder (K = 128 m + 1, conv_odd's 129) with its taps spread over the output
partitions (conv_spread.py): stage 1 sums every tap over the band on its own partition, the sums are shifted by DMA
and a ones column adds them. Mixed taps (fp32 conv_odd: the base band's flat run) and plain bands of X's own
columns (16-bit conv_odd: the taps' sums split into high and low halves). Checked on the kernel's text and against a
NumPy float64 conv on the interpreter, f32 and bf16, at small shapes."""
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

PROGRAM = """kernel spread(X: f32[N, C, H, W], Wt: f32[K, C, {r}, {r}], b: f32[K]) -> Y
  default N = 1, C = 67, H = 10, W = 12, K = 129
  let Ho = H + 2*{p} - {r} + 1, Wo = W + 2*{p} - {r} + 1
  Y: f32[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = b[k]
    for c in 0..C, r in 0..{r}, s in 0..{r}:
      Y[n, k, y, x] += (X[n, c, y + r - {p}, x + s - {p}] ?? 0) * Wt[k, c, r, s]
"""

# (window, padding, sizes, the remainder's form in f32, in bf16: spread over mixed tiles or a plain band, or None)
CASES = {
    "same3x3": (3, 1, {}, "mixed", "plain"),
    "batch2": (3, 1, {"N": 2, "C": 100}, "plain", "plain"),
    "k257": (3, 1, {"K": 257, "H": 6}, "mixed", "plain"),  # the remainder after two whole tiles
    "same5x5": (5, 2, {"H": 8, "W": 9}, "plain", "plain"),  # 25 taps, 5 partitions apart
    "k130": (3, 1, {"K": 130}, None, None),  # a remainder of two channels: its taps' own passes
    "ahead": (3, 1, {"H": 20, "W": 28}, "mixed", "plain"),  # two peeled bands: band 1's stage 1 ahead (bf16)
}


def program_of(name: str, dtype: str):
    r, p, sizes, _, _ = CASES[name]
    return lang.load(PROGRAM.format(r=r, p=p).replace("f32[", f"{dtype}["), sizes)


@pytest.fixture(scope="module")
def compiled():
    cache: dict[tuple[str, str], object] = {}

    def get(name: str, dtype: str):
        if (name, dtype) not in cache:
            cache[name, dtype] = compile_loaded(program_of(name, dtype))
        return cache[name, dtype]
    return get


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_remainder_spread_where_it_pays(name: str, dtype: str, compiled) -> None:
    """The remainder's taps spread (their sums' tile `taps_shifted`, one ones matmul) exactly where stated: a
    one-channel remainder, over mixed tiles (their base band) or a plain band; 16-bit sums split into halves."""
    src = unwrap(compiled(name, dtype).source)
    form = CASES[name][3 if dtype == "f32" else 4]
    assert ("taps_shifted" in src) == (form is not None)
    assert ("src=X_band_flat[" in src) == (form == "mixed" or name == "k130" and dtype == "f32")
    assert ("taps_lo" in src) == (form == "plain" and dtype == "bf16")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_spread_matches_numpy(name: str, dtype: str, compiled) -> None:
    r, pad, _, _, _ = CASES[name]
    program = program_of(name, dtype)
    rng = np.random.default_rng(24)
    given = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(NP[dtype]) for t in program.inputs}
    x, w, bias = (given[k].astype(np.float64) for k in ("X", "Wt", "b"))
    want = conv(np.pad(x, [(0, 0), (0, 0), (pad, pad), (pad, pad)]), w) + bias[None, :, None, None]
    got = np.asarray(compiled(name, dtype).run(**given)["Y"], np.float64)
    assert got.shape == want.shape
    rounded = want.astype(NP[dtype]).astype(np.float64)
    assert max_error(got, rounded) <= tolerance(dtype, x.shape[1] * r * r + 1, float(np.abs(want).max()), None)


def test_next_band_stage1_ahead(compiled) -> None:
    """Two peeled bands of a plain band's spread remainder (conv_spread.ahead): band 1's load and stage 1 come right
    after band 0's stage 1, before band 0's 128-channel matmuls, each band under its own names."""
    calls = re.findall(r"nc_matmul\(([^()]*)\)", unwrap(compiled("ahead", "bf16").source))
    args = [[x.strip().split("=")[-1] for x in re.sub(r"\[[^\]]*\]", "", c).split(",")] for c in calls]
    moving = [a[2] if "moving=" in c else a[1] for a, c in zip(args, calls)]  # (either dialect)
    assert moving[:3] == ["X_band0", "X_band1", "X_band0"]
    assert "Wt_spread" in calls[1]
    assert moving.index("taps_shifted0") < moving.index("X_band1", 2) < moving.index("taps_shifted1")


NOBIAS = PROGRAM.replace(", b: f32[K]", "").replace("Y[n, k, y, x] = b[k]", "Y[n, k, y, x] = 0")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_parts_evicted_on_vector(dtype: str) -> None:
    """Without a bias, a 16-bit spread remainder's 128-channel parts are evicted by VectorE (tensor_copy), so their
    stores leave on another trigger stream than the taps' high halves' shifts (conv_spread.evicts_on_vector); fp32
    keeps ScalarE. Checked against NumPy at batch 2 (the band loop)."""
    program = lang.load(NOBIAS.format(r=3, p=1).replace("f32[", f"{dtype}["), {"N": 2, "H": 8, "W": 12})
    c = compile_loaded(program)
    src = unwrap(c.source)
    evictions = [ln for ln in src.split("\n") if "Y_acc" in ln and ("tensor_copy" in ln or "activation" in ln)]
    assert len(evictions) == 2 and ("tensor_copy" in evictions[0]) == (dtype == "bf16")
    assert "activation" in evictions[1]  # the remainder's (one partition) stays on ScalarE
    assert ("taps_lo" in src) == (dtype == "bf16")  # (spread over a plain band: both dtypes)
    rng = np.random.default_rng(22)
    given = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(NP[dtype]) for t in program.inputs}
    x, w = (given[k].astype(np.float64) for k in ("X", "Wt"))
    want = conv(np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)]), w)
    got = np.asarray(c.run(**given)["Y"], np.float64)
    rounded = want.astype(NP[dtype]).astype(np.float64)
    assert max_error(got, rounded) <= tolerance(dtype, x.shape[1] * 9, float(np.abs(want).max()), None)
