"""Column chains near the floor (session 22, build_colchain): an extreme the kernel only stores is turned from the
chunks' reduced columns into rows and stored (no spread to every partition), after the chain's other statistics;
the chunks of a sub-block are of one width when it splits so; a sum's scaled eviction read only by an activation of
it is that activation reading PSUM (`rsqrt(var + e)`). Values against NumPy formulas at small shapes, f32 and bf16,
both NKI dialects; the structure on the kernel's text."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_formula_matches
from test_cols21_batched import STANDARDIZE_MID
from user20_formulas import channel_layernorm, channel_max_mean
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_MEAN = (ROOT / "tests" / "programs" / "user20" / "channel_max_mean.tl").read_text()
CHANNEL_LAYERNORM = (ROOT / "tests" / "programs" / "user20" / "channel_layernorm.tl").read_text()

# a max from 0 (relu'd: the start applied to the stored rows), a min, and a variance whose centring is computed in
# place in the block after the extremes' folds (they are issued before it, not after the chain's other statistics)
EXTREMES = """  mx: f32[A, C]
  mn: f32[A, C]
  for a in 0..A, c in 0..C:
    mx[a, c] = 0
    for b in 0..B:
      mx[a, c] max= X[a, b, c]
  for a in 0..A, c in 0..C:
    mn[a, c] = inf
    for b in 0..B:
      mn[a, c] min= X[a, b, c]
"""
EXTREMES_AND_VARIANCE = STANDARDIZE_MID.split("  for a in 0..A, b in 0..B")[0].replace("-> Y", "-> mx, mn, v") \
    .replace("  Y: f32[A, B, C]\n", EXTREMES)
# the same statistics over the rows of a matrix (a chain without a batch index)
COLUMN_MAX_MEAN = """kernel k(X: f32[M, N]) -> mx, mu
  default M = 256, N = 300
  mx: f32[N]
  mu: f32[N]
  for j in 0..N:
    mx[j] = -inf
    for i in 0..M:
      mx[j] max= X[i, j]
  for j in 0..N:
    mu[j] = 0
    for i in 0..M:
      mu[j] += X[i, j] / M
"""
# a variance the kernel stores and the user reads: its eviction stays (two readers)
LAYERNORM_STORED_VAR = CHANNEL_LAYERNORM.replace("-> Y", "-> Y, var")


def _extremes_and_variance(x):
    X = x["X"]
    return {"mx": np.maximum(X.max(axis=1), 0.0), "mn": X.min(axis=1), "v": X.var(axis=1)}


def _column_max_mean(x):
    return {"mx": x["X"].max(axis=0), "mu": x["X"].mean(axis=0)}


def _layernorm_and_var(x):
    return {**channel_layernorm(x), "var": x["X"].var(axis=1)}


CASES = {  # name: (program, sizes, formula)
    # one sub-block of 300 columns: 3 chunks of 100, reduced in one instruction
    "max_mean_equal_chunks": (MAX_MEAN, dict(N=4, C=256, H=10, W=30), channel_max_mean),
    # 257 columns (prime): chunks of 128, 128, 1; the last chunk's unused rows are zeroed before the transpose
    "max_mean_narrower_chunk": (MAX_MEAN, dict(N=2, C=128, H=1, W=257), channel_max_mean),
    # fewer rows than partitions: one tile of 96 partitions
    "max_mean_96": (MAX_MEAN, dict(N=2, C=96, H=4, W=6), channel_max_mean),
    # 7 rows: 43 chunks of 7 columns, more rows to turn than the chunks' PSUM tile has partitions
    "max_mean_7_rows": (MAX_MEAN, dict(N=2, C=7, H=10, W=30), channel_max_mean),
    "extremes_and_variance": (EXTREMES_AND_VARIANCE, dict(A=4, B=256, C=200), _extremes_and_variance),
    "column_max_mean": (COLUMN_MAX_MEAN, dict(M=256, N=300), _column_max_mean),
    "layernorm_stored_var": (LAYERNORM_STORED_VAR, dict(N=2, C=128, H=4, W=6), _layernorm_and_var),
    # 4 batches pipelined, two row tiles: the variance, its rsqrt from PSUM and the output in the second stage
    "layernorm_staged": (CHANNEL_LAYERNORM, dict(N=4, C=256, H=2, W=10), channel_layernorm),
}


def compiled(name: str, dtype: str = "f32", nki: str = "0.6"):
    text, sizes, _ = CASES[name]
    return compile_loaded(lang.load(text.replace("f32", dtype), sizes), nki=nki)


def chained(source: str) -> bool:
    return "every row kept in SBUF (X read once)" in " ".join(source.replace("#", " ").split())


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_chains_match_numpy(name, dtype):
    c = compiled(name, dtype)
    assert chained(c.source)
    assert_formula_matches(c, CASES[name][2], f"{name} {dtype}")


@pytest.mark.parametrize("name", ["max_mean_narrower_chunk", "extremes_and_variance", "layernorm_staged"])
def test_the_older_dialect_matches_numpy(name):
    assert_formula_matches(compiled(name, nki="0.1"), CASES[name][2], f"{name} 0.1")


def test_a_stored_extreme_is_not_spread():
    """Mx is stored from its chunks' rows (one transpose of the reduced columns, into the PSUM tile of the chunks its
    reduce has read), with no spread (an activation of the ones scaled by a column) and no copy of a whole broadcast
    row; the 300 columns are 3 chunks of 100."""
    src = compiled("max_mean_equal_chunks").source
    assert "Mx_spread" not in src and "Mx_b" not in src
    assert "nisa.nc_transpose(dst=Mx_T[0:3, 0, 0:100], data=Mx_col)" in src
    assert "tensor_reduce(dst=Mx_col, op=nl.maximum, data=Mx_T," in src  # one reduce of the three chunks
    assert "dst=Mx_col[" not in src and "dst=Mx_col_2[" not in src
    assert "memset(dst=Mx_col" not in src  # (no narrower chunk)


def test_rsqrt_reads_the_variance_in_psum():
    """rsqrt(var + e) is the variance's eviction: one activation from the accumulator with the 1/C scale; a
    variance the kernel also stores keeps its SBUF row."""
    src = compiled("layernorm_stored_var").source
    assert "op=nl.rsqrt, data=var_b" in src
    text, sizes, _ = CASES["layernorm_stored_var"]
    src = compile_loaded(lang.load(CHANNEL_LAYERNORM, sizes), nki="0.6").source
    assert "var_b" not in src
    assert "op=nl.rsqrt, data=var_acc" in src and "scale=0.0078125" in src


def test_the_second_stages():
    """A batched standardisation's last statistic, and a stored extreme's rows, each in a static loop of one where
    the software-pipelined batches split (the next batch's first work is issued before them); a softmax over the
    middle axis (a max, then a sum) keeps its split at the output."""
    from tilec.compiler.build_colchain import LAST_NOTE, STORED_NOTE
    sizes = dict(N=4, C=128, H=4, W=6)
    layernorm = compile_loaded(lang.load(CHANNEL_LAYERNORM, sizes), nki="0.6").source
    assert LAST_NOTE in layernorm and "software-pipelined" in layernorm
    max_mean = compile_loaded(lang.load(MAX_MEAN, sizes), nki="0.6").source
    assert STORED_NOTE in max_mean and "software-pipelined" in max_mean
    softmax = (ROOT / "tests" / "programs" / "gaps15" / "softmax_mid.tl").read_text()
    assert LAST_NOTE not in compile_loaded(lang.load(softmax, dict(A=4, B=256, C=192)), nki="0.6").source
