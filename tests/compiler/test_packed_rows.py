"""Short rows broadcast over many rows (packed_rows.py, rows21): the output and its full operands viewed [M / k, k,
row], the rows replicated k times first; the kernel keeps its signature and matches NumPy in f32 and bf16. Small
multi-tile shapes (the model's sizes are in benchmarks/gaps15.py's bn_nhwc row)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, run_signed
from kernel_numbers import numbered
from tilec.compiler.rewrites import source_rewrites
from tilec.lang import api as lang

BIAS = """kernel bias(X: f32[M, C], g: f32[C], b: f32[C]) -> Y
  default M = 1024, C = 32
  Y: f32[M, C]
  for i in 0..M, c in 0..C:
    Y[i, c] = X[i, c] * g[c] + b[c]
"""

BN_NHWC = """kernel bn(X: f32[N, H, W, C], g: f32[C], b: f32[C]) -> Y
  default N = 4, H = 16, W = 16, C = 16
  Y: f32[N, H, W, C]
  for n in 0..N, h in 0..H, w in 0..W, c in 0..C:
    Y[n, h, w, c] = min(max(X[n, h, w, c] * g[c] + b[c], 0), 6)
"""

# rows of two trailing indices and a shorter one (widened to both: one row of W * C per replica)
POS = """kernel pos(X: f32[B, W, C], P: f32[W, C], s: f32[C]) -> Y
  default B = 1024, W = 4, C = 8
  Y: f32[B, W, C]
  for n in 0..B, w in 0..W, c in 0..C:
    Y[n, w, c] = (X[n, w, c] + P[w, c]) * s[c]
"""

CASES = {
    "bias": (BIAS, lambda a: a["X"] * a["g"] + a["b"], (512, 2, 32)),
    "bn": (BN_NHWC, lambda a: np.clip(a["X"] * a["g"] + a["b"], 0, 6), (512, 2, 16)),
    "pos": (POS, lambda a: (a["X"] + a["P"]) * a["s"], (512, 2, 4, 8)),
}


@pytest.mark.parametrize("name,dtype", [(n, dt) for n in CASES for dt in ("f32", "bf16")])
def test_short_rows_match_numpy(name, dtype):
    src, formula, _ = CASES[name]
    prog, c, out, a = run_signed(src, dtype, seed=3)
    assert_matches(prog, "Y", out["Y"], formula(a))
    assert "_rep" in c.source  # the rows went through their replicas: the rewrite ran


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_is_viewed_with_k_rows_a_partition(name):
    """The rewritten program's Y is [M / k, k, row]: the most rows (k * row within a tile of 1024 elements) leaving an
    even number of whole partition tiles; the signature keeps Y's shape."""
    src, _, shape = CASES[name]
    prog = lang.load(src)
    out = source_rewrites(prog)
    assert out.tensors["Y"].shape == shape
    assert out.views["Y"] == prog.tensors["Y"].shape


def test_tiles_are_k_rows_wide():
    """M = 1024: k = 2 leaves 4 partition tiles (an even number, >= 4), 4 would leave 2."""
    from tilec.compiler.api import compile_loaded
    text = numbered(compile_loaded(lang.load(BIAS)).source)
    assert "nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)" in text  # 2 rows of 32 on a partition
    assert "nl.ndarray((128, 32)" not in text


@pytest.mark.parametrize("src", [
    BIAS.replace("default M = 1024", "default M = 256"),  # too few rows for an even number (>= 4) of tiles
    BIAS.replace("C = 32", "C = 768").replace("M = 1024", "M = 2048"),  # rows of more than half a tile
    BIAS.replace("+ b[c]", "+ b[i]").replace("b: f32[C]", "b: f32[M]"),  # a column too
    BIAS.replace("-> Y", "-> Y, Z").replace("  Y: f32[M, C]\n", "  Y: f32[M, C]\n  Z: f32[M, C]\n")
    + "  for i in 0..M, c in 0..C:\n    Z[i, c] = X[i, c] + 1\n",  # X read by another nest
])
def test_left_as_written(src):
    """(A schedule no longer leaves the nest as written: directives name the packed loops, and one naming a loop
    the rewrite replaced is refused at its line, test_explain_roundtrip.)"""
    prog = lang.load(src)
    assert source_rewrites(prog).tensors["Y"].shape == prog.tensors["Y"].shape


def test_a_loop_variable_read_as_a_value_is_left_as_written():
    prog = lang.load(BIAS.replace("* g[c] + b[c]", "* g[c] + c"))
    assert source_rewrites(prog).tensors["Y"].shape == prog.tensors["Y"].shape
