"""Sibling fusion (siblings.py): element-wise statements over one domain that read the same source built in one
nest, each tile of every operand loaded once; with whole rows in one load, k rows per partition and the fp32
products shared with GpSimdE (build_halo.rows_per_partition). Each program is checked against a NumPy formula of
its inputs (f32 and bf16, ragged and packed rows); fusion that would change a value is not made."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_formula_matches
from tilec.compiler.api import compile_loaded
from tilec.compiler.build_halo import rows_per_partition
from tilec.lang import api as lang
from user20_formulas import FORMULAS

ROPE = (pathlib.Path(__file__).parents[1] / "programs" / "user20" / "rope.tl").read_text()

# the second statement reads what the first writes (same source, same domain): fused, its tiles would be
# computed in a different order than Z's, so it is not a sibling
CHAINED = """kernel k(X: f32[M, N]) -> Y
  default M = {M}, N = {N}
  Z: f32[M, N - 2]
  Y: f32[M, N - 2]
  for i in 0..M, j in 0..N - 2:
    Z[i, j] = X[i, j + 1] - X[i, j]
  for i in 0..M, j in 0..N - 2:
    Y[i, j] = Z[i, j] * X[i, j + 2] + X[i, j]
"""

# two outputs from the same shifted source, with an unrelated statement between them (passed over)
BESIDE = """kernel k(X: f32[M, N], W: f32[M, N - 2], V: f32[M, 8]) -> Y, Z, U
  default M = {M}, N = {N}
  Y: f32[M, N - 2]
  Z: f32[M, N - 2]
  U: f32[M, 8]
  for i in 0..M, j in 0..N - 2:
    Y[i, j] = X[i, j + 2] * W[i, j] - X[i, j]
  for i in 0..M, c in 0..8:
    U[i, c] = V[i, c] * 2
  for i in 0..M, j in 0..N - 2:
    Z[i, j] = X[i, j + 1] + W[i, j] * X[i, j]
"""

# the statement between writes what the second reads: the second cannot move above it
BEHIND = """kernel k(X: f32[M, N], V: f32[M, N - 2]) -> Y, Z
  default M = {M}, N = {N}
  W: f32[M, N - 2]
  Y: f32[M, N - 2]
  Z: f32[M, N - 2]
  for i in 0..M, j in 0..N - 2:
    Y[i, j] = X[i, j + 2] - X[i, j]
  for i in 0..M, j in 0..N - 2:
    W[i, j] = exp(V[i, j])
  for i in 0..M, j in 0..N - 2:
    Z[i, j] = X[i, j + 1] * W[i, j] + X[i, j]
"""


def _beside(a):
    x, w = a["X"], a["W"]
    return {"Y": x[:, 2:] * w - x[:, :-2], "Z": x[:, 1:-1] + w * x[:, :-2], "U": a["V"] * 2}


def _chained(a):
    x = a["X"]
    z = x[:, 1:-1] - x[:, :-2]
    return {"Y": z * x[:, 2:] + x[:, :-2]}


def _compiled(text: str, sizes: dict[str, int], dtype: str):
    return compile_loaded(lang.load(text.replace("f32", dtype).format(**sizes) if "{" in text else
                                    text.replace("f32", dtype), sizes), nki="0.6")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("sizes", [dict(S=300, Dh=8), dict(S=2048, Dh=8), dict(S=2048, Dh=80)],
                         ids=["ragged", "packed", "wide"])
def test_rope_halves_in_one_nest_match_numpy(sizes, dtype):
    """300 rows: three row tiles (the last ragged) with both halves in each; 2048 rows: 2 rows per partition; Dh 80:
    shifts 80 apart (over MAX_HALO) with the tile the whole row (build_halo.too_wide)."""
    c = _compiled(ROPE, sizes, dtype)
    assert_formula_matches(c, FORMULAS["rope"], f"rope {sizes} {dtype}")
    src = c.source
    assert "Y_part, Y_part2 = element-wise" in src  # one nest for both halves
    assert len([ln for ln in src.splitlines() if "dma_copy" in ln and "src=X" in ln]) <= 4  # X loaded once a tile
    # both halves stored straight into Y (a ragged last tile is a second block: store_regions then keeps them)
    assert ("buffer=nl.hbm)" not in src) == (sizes["S"] == 2048)
    assert ("2 rows per partition" in src) == (sizes["S"] == 2048)
    assert "dst=X_at" not in src  # no shifted copy through HBM


def test_packed_fp32_products_are_shared_with_gpsimd():
    src = _compiled(ROPE, dict(S=2048, Dh=8), "f32").source
    assert "engine=nisa.engine.gpsimd" in src


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_sibling_past_an_unrelated_statement_matches_numpy(dtype):
    c = _compiled(BESIDE, dict(M=200, N=40), dtype)
    assert_formula_matches(c, _beside, f"beside {dtype}")
    assert "Y, Z = element-wise" in c.source


def test_a_sibling_reading_what_a_statement_between_writes_is_not_fused():
    c = _compiled(BEHIND, dict(M=200, N=40), "f32")

    def want(a):
        x, w = a["X"], np.exp(a["V"])
        return {"Y": x[:, 2:] - x[:, :-2], "Z": x[:, 1:-1] * w + x[:, :-2]}
    assert_formula_matches(c, want, "behind")
    assert "Y, Z = element-wise" not in c.source


def test_a_statement_reading_its_siblings_result_is_not_fused():
    c = _compiled(CHAINED, dict(M=200, N=40), "f32")
    assert_formula_matches(c, _chained, "chained")
    assert "Z, Y = element-wise" not in c.source


BATCHED_DIFF = """kernel k(X: f32[B, M, N]) -> Y
  default B = {B}, M = {M}, N = {N}
  Y: f32[B, M, N - 1]
  for b in 0..B, i in 0..M, j in 0..N - 1:
    Y[b, i, j] = X[b, i, j + 1] - X[b, i, j]
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_packed_halo_nest_alone_matches_numpy(dtype):
    """One statement (no sibling) over a 3-D source of 2 x 1024 rows: 2 rows per partition, X's rows seen
    [B * M / 2, 2, N] (leading dimensions flattened, then split)."""
    c = _compiled(BATCHED_DIFF, dict(B=2, M=1024, N=9), dtype)
    assert_formula_matches(c, lambda a: {"Y": a["X"][:, :, 1:] - a["X"][:, :, :-1]}, f"batched diff {dtype}")
    assert "2 rows per partition" in c.source


@pytest.mark.parametrize("rows,width,want", [(4096, 128, 4), (2048, 16, 2), (300, 16, 1), (4096, 0, 1),
                                             (1024, 128, 1), (8192, 4096, 1)])
def test_rows_per_partition(rows, width, want):
    """Whole tiles only, at least 8 of them, within 16 KiB a partition; column tiles (width 0) keep one row."""
    assert rows_per_partition(rows, width, 4, 128) == want


def test_rope_model_time_within_1_6x_of_the_floor():
    """gaps15's realistic rope (4096 x 64 f32): 2.80x of the DMA floor with each half its own nest (X, Cs and Sn
    read twice, VectorE-bound at 64 columns an instruction); one nest, 4 rows per partition, GpSimdE beside
    VectorE: 1.50x on the model."""
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks"))
    from families import floor_us, model_us
    from tilec.target import target
    path = pathlib.Path(__file__).parents[1] / "programs" / "user20" / "rope.tl"
    sizes = {"S": 4096, "Dh": 64}
    floor, _ = floor_us(lang.load(path, sizes), target("trn2"))
    latency, startup = model_us(path, sizes, target("trn2"))
    assert isinstance(latency, float) and (latency - startup) / floor < 1.6
    assert np.isfinite(floor)
