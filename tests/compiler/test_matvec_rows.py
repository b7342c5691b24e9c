"""Matrix-vector products `y[i] += W[i, k] * v[k]` built with W's rows on the partitions (build_matvec.py: v
broadcast into PSUM once, VectorE multiply, ScalarE sum along the free axis; no transposes), checked against NumPy
(W @ v) on the NKI interpreter for f32, f16 and bf16, with M and K not multiples of 128 (a remainder tile of rows,
a ragged last PSUM bank of v), the vector 1-D and as [K, 1]."""
from __future__ import annotations

import re

import pytest

import test_matmul_batched

from compiler_helpers import assert_matches
from test_conv_padded import inputs_for, rounded, run
from tilec.compiler.api import compile_loaded
from tilec.compiler.wrap import unwrap
from tilec.lang import api as lang
from tilec.compiler import build_matvec
from kernel_numbers import numbered

# the matrix-vector program of test_matmul_batched.py, its sizes as format fields
MATVEC = test_matmul_batched.MATVEC.replace("default M = 300, K = 520", "default M = {M}, K = {K}")
assert "{M}" in MATVEC

MATVEC_2D = """\
kernel mv2(Wt: {dt}[M, K], v: {dt}[K, 1]) -> y
  default M = {M}, K = {K}
  y: {dt}[M, 1]
  for i in 0..M, j in 0..1:
    y[i, j] = 0
    for k in 0..K:
      y[i, j] += Wt[i, k] * v[k, j]
"""


def rows_path(source: str) -> bool:
    return "_bcast" in source and "nc_transpose" not in source


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_matrix_vector_rows_on_partitions(dt):
    prog, c, inputs, out = run(MATVEC.format(dt=dt, M=300, K=1100))
    assert rows_path(numbered(c.source))
    x = rounded(inputs, dt)
    assert_matches(prog, "y", out["y"], x["Wt"] @ x["v"])


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_matrix_vector_with_a_column_vector(dt):
    prog, c, inputs, out = run(MATVEC_2D.format(dt=dt, M=200, K=700))
    assert rows_path(numbered(c.source))
    x = rounded(inputs, dt)
    assert_matches(prog, "y", out["y"], x["Wt"] @ x["v"])


def test_single_partial_tile_of_rows():
    prog, c, inputs, out = run(MATVEC.format(dt="f32", M=40, K=600))
    x = rounded(inputs, "f32")
    assert_matches(prog, "y", out["y"], x["Wt"] @ x["v"])


def test_vector_too_long_for_psum_keeps_the_transposes():
    prog, c, inputs, out = run(MATVEC.format(dt="f32", M=130, K=4100))
    assert not rows_path(numbered(c.source))
    x = rounded(inputs, "f32")
    assert_matches(prog, "y", out["y"], x["Wt"] @ x["v"])


def test_estimate_prefers_the_rows_for_fp32_and_large_matrices():
    pe, ve = build_matvec.estimates(1000, 2048, True)
    assert ve < pe


def test_tile_directive_sets_the_rows_per_tile():
    prog, c, inputs, out = run(MATVEC.format(dt="f32", M=320, K=600), "tile y.i, 64\n")
    assert rows_path(numbered(c.source)) and "(64, 600)" in numbered(c.source)
    x = rounded(inputs, "f32")
    assert_matches(prog, "y", out["y"], x["Wt"] @ x["v"])


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_long_rows_share_the_multiply_with_gpsimd(dt):
    """K = 1100: GpSimdE multiplies the last columns of every tile from an SBUF copy of v (the split falls inside
    the second PSUM bank of v), VectorE the first ones; M = 300 has a remainder tile with its own rows buffer."""
    prog, c, inputs, out = run(MATVEC.format(dt=dt, M=300, K=1100))
    g = build_matvec.gpsimd_columns(1100, [(0, 512), (512, 512), (1024, 76)])
    assert 512 < 1100 - g < 1024 and g % build_matvec.MATVEC_SPLIT_STEP == 0
    # v whole in SBUF: the last tile's column pieces (build_matvec.last_pieces) each give GpSimdE a share
    assert build_matvec.last_pieces(1100) > 1 and "v_sbuf = nl.ndarray((128, 1100)" in numbered(c.source)
    assert f"v_sbuf[0:100, {1100 - g}:1100]" in numbered(c.source) and "engine=nisa.gpsimd_engine" in numbered(c.source)
    assert c.source.index("Wt_tile_rows = nl.ndarray") < c.source.index("for i_t in")  # declared once
    x = rounded(inputs, dt)
    assert_matches(prog, "y", out["y"], x["Wt"] @ x["v"])


def test_short_rows_keep_the_multiply_on_vectore():
    assert build_matvec.gpsimd_columns(100, [(0, 100)]) == 0
    prog, c, inputs, out = run(MATVEC.format(dt="f32", M=300, K=100))
    assert "gpsimd" not in numbered(c.source)
    x = rounded(inputs, "f32")
    assert_matches(prog, "y", out["y"], x["Wt"] @ x["v"])


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_16_bit_whole_blocks_transpose_in_groups(dt):
    """16-bit W with K a multiple of 128 (K = 1024: 8 blocks, groups of 4): the blocks are transposed on TensorE
    four to a group, two into a PSUM tile evicted by VectorE and two into one evicted by ScalarE (two banks: the
    engines must not read one PSUM bank together, ARCH3), and the matmuls accumulate the tile's outputs; M = 263
    leaves a remainder tile of 7 rows. NKI 0.6 and 0.1."""
    assert build_matvec.grouped_is_faster(263, 1024, 128, dt)
    for nki in ("0.6", "0.1"):
        prog = lang.load(MATVEC.format(dt=dt, M=263, K=1024))
        c = compile_loaded(prog, nki=nki)
        inputs = inputs_for(prog)
        out = c.run(**inputs)
        src = unwrap(numbered(c.source))  # a statement per line
        assert "Wt_tp = nl.ndarray((128, 2, 128)" in src and "Wt_tp_act = nl.ndarray((128, 2, 128)" in src
        copies = [line for line in src.splitlines() if "tensor_copy" in line and "Wt_T[" in line]
        acts = [line for line in src.splitlines() if "activation" in line and "Wt_T[" in line]
        assert copies and all("Wt_tp" in line and "Wt_tp_act" not in line for line in copies)
        assert acts and all("Wt_tp_act" in line for line in acts) and "v_cols" in src
        x = rounded(inputs, dt)
        assert_matches(prog, "y", out["y"], x["Wt"] @ x["v"])


def test_16_bit_column_vector_and_fp32_choices():
    # fp32: transposes at transpose mode's rate, but every block's eviction and one-column matmul at 4.7x
    assert not build_matvec.grouped_is_faster(1000, 2048, 125, "f32")
    assert not build_matvec.grouped_is_faster(300, 1100, 100, "f16")  # a partial block: the rows path
    prog, c, inputs, out = run(MATVEC_2D.format(dt="bf16", M=200, K=512))
    assert "nc_transpose" in numbered(c.source)
    x = rounded(inputs, "bf16")
    assert_matches(prog, "y", out["y"], x["Wt"] @ x["v"])


def test_path_choice_reads_the_models_transpose_rate(monkeypatch):
    """The estimates price an fp32 PE transpose at the performance model's rate (transpose mode on trn2: the matmul
    factor over transpose_fp32_speedup), not at a constant of their own: without transpose mode the transpose path
    costs more TensorE time by exactly its 128 x 16 blocks' transposes at the full fp32 factor."""
    import dataclasses

    from tilec.perf import params
    prm = build_matvec.model_constants()
    assert prm["fp32_transpose"] == prm["mm_fp32_factor"] / prm["transpose_fp32_speedup"] < prm["fp32_matmul"]
    base_pe, base_rows = build_matvec.estimates(1000, 2048, True)
    slow = dataclasses.replace(params.TRN2, transpose_fp32_speedup=params.Param(1, "no transpose mode"))
    monkeypatch.setitem(params.TARGETS, "trn2", slow)
    pe, rows = build_matvec.estimates(1000, 2048, True)
    extra = 8 * 16 * (128 + prm["mm_fixed_cycles"]) * (prm["mm_fp32_factor"] - prm["fp32_transpose"])
    assert rows == base_rows and pe == pytest.approx(base_pe + extra / prm["tensor_ghz"])


SCALED = """\
kernel mvs(Wt: {dt}[M, K], v: {dt}[K], b: {dt}[M]) -> y
  default M = {M}, K = {K}
  y: {dt}[M]
  for i in 0..M:
    y[i] = b[i]
    for k in 0..K:
      y[i] += 0.5 * Wt[i, k] * v[k]
"""


@pytest.mark.parametrize("dt, M, K", [("f32", 256, 1024), ("bf16", 130, 1100), ("f32", 100, 2048)])
def test_last_tile_in_column_pieces(dt, M, K):
    """The last tile of rows is loaded, multiplied and summed in column pieces (a peeled whole tile at M = 256, the
    remainder tile at M = 130, the only tile at M = 100), its partial sums added by one reduction; the first half
    of the pieces summed on ScalarE, the rest on VectorE. Each piece's multiply is shared with GpSimdE."""
    pieces = build_matvec.last_pieces(K)
    assert pieces > 1
    ranges = build_matvec.piece_ranges(K, 128, pieces)
    assert ranges[0][0] == 0 and ranges[-1][2] == K and all(r[2] == s[0] for r, s in zip(ranges, ranges[1:]))
    prog, c, inputs, out = run(MATVEC.format(dt=dt, M=M, K=K))
    src = numbered(c.source)
    assert rows_path(src) and re.search(rf"y_parts = nl.ndarray\(\(\d+, {pieces}\)", src)
    assert src.count("reduce_res=y_parts") == pieces - pieces // 2 and src.count("tensor_reduce(") == pieces // 2 + 1
    x = rounded(inputs, dt)
    assert_matches(prog, "y", out["y"], x["Wt"] @ x["v"])


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_last_tile_pieces_with_a_factor_and_an_initial_value(dt):
    """A constant factor scales every piece's sum on ScalarE (none goes to VectorE's reduction, which has no
    scale); the initial value b[i] is added once, after the pieces are summed."""
    prog, c, inputs, out = run(SCALED.format(dt=dt, M=150, K=1100))
    src = numbered(c.source)
    assert "y_parts" in src and src.count("scale=0.5") >= 3 and src.count("tensor_reduce(") == 1
    x = rounded(inputs, dt)
    assert_matches(prog, "y", out["y"], 0.5 * (x["Wt"] @ x["v"]) + x["b"])
