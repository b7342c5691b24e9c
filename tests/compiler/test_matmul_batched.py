"""Batched matmuls `C[n, i, j] += A[n, i, k] * B[n, k, j]` (the stationary operand has the batch index too: one
matrix per batch index, prepared inside the batch loop) and matrix-vector products with a 1-D vector
`y[i] += W[i, k] * v[k]` (a moving operand of one column), checked against NumPy (np.einsum / @) on the NKI
interpreter for f32, f16 and bf16 at sizes of several tiles."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, inputs_for
from test_conv_padded import rounded, run
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang
from kernel_numbers import numbered

BMM = """\
kernel bmm(A: {dt}[N, M, K], B: {dt}[N, K, P]) -> C
  default N = 3, M = 160, K = 300, P = 96
  C: {dt}[N, M, P]
  for n in 0..N, i in 0..M, j in 0..P:
    C[n, i, j] = 0
    for k in 0..K:
      C[n, i, j] += A[n, i, k] * B[n, k, j]
"""

BMM_T = """\
kernel bmmt(A: {dt}[N, K, M], B: {dt}[N, K, P]) -> C
  default N = 2, M = 136, K = 200, P = 600
  C: {dt}[N, M, P]
  for n in 0..N, i in 0..M, j in 0..P:
    C[n, i, j] = 0
    for k in 0..K:
      C[n, i, j] += A[n, k, i] * B[n, k, j]
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_batched_matmul(dt):
    prog, c, inputs, out = run(BMM.format(dt=dt))
    assert "A_T" in numbered(c.source)  # one transposed matrix per batch index, inside the batch loop
    x = rounded(inputs, dt)
    assert_matches(prog, "C", out["C"], np.einsum("nik,nkj->nij", x["A"], x["B"]))


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_batched_transposed_stationary(dt):
    prog, c, inputs, out = run(BMM_T.format(dt=dt))
    x = rounded(inputs, dt)
    assert_matches(prog, "C", out["C"], np.einsum("nki,nkj->nij", x["A"], x["B"]))


def test_batched_matmul_cannot_hoist_its_matrices_to_the_root():
    with pytest.raises(TilecError) as e:
        run(BMM.format(dt="f32"), "hoist A, root\n")
    assert "one matrix per batch index" in str(e.value) and "drop `hoist A, root`" in (e.value.hint or "")


MATVEC = """\
kernel mv(Wt: {dt}[M, K], v: {dt}[K]) -> y
  default M = 300, K = 520
  y: {dt}[M]
  for i in 0..M:
    y[i] = 0
    for k in 0..K:
      y[i] += Wt[i, k] * v[k]
"""

VECMAT = """\
kernel vm(v: {dt}[K], Wt: {dt}[K, M], b: {dt}[M]) -> y
  default M = 200, K = 260
  y: {dt}[M]
  for i in 0..M:
    y[i] = b[i]
    for k in 0..K:
      y[i] += Wt[k, i] * v[k]
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_matrix_vector_with_a_1d_vector(dt):
    prog, c, inputs, out = run(MATVEC.format(dt=dt))
    x = rounded(inputs, dt)
    assert_matches(prog, "y", out["y"], x["Wt"] @ x["v"])


def test_vector_matrix_with_bias():
    prog, c, inputs, out = run(VECMAT.format(dt="f32"))
    x = rounded(inputs, "f32")
    assert_matches(prog, "y", out["y"], x["v"] @ x["Wt"] + x["b"])


STATIONARY_BATCH = """\
kernel rows(A: f32[N, M, K], B: f32[K, P]) -> C
  default N = 3, M = 70, K = 136, P = 40
  C: f32[N, M, P]
  for n in 0..N, i in 0..M, j in 0..P:
    C[n, i, j] = 0
    for k in 0..K:
      C[n, i, j] += A[n, i, k] * B[k, j]
"""


def test_batch_of_the_stationary_only_is_one_matmul_over_merged_rows():
    """Once a located error; since lang15 A[n, i, k] with B[k, j] shared by every n is A seen as [N * M, K]."""
    prog, c, inputs, out = run(STATIONARY_BATCH)
    x = rounded(inputs, "f32")
    assert "K=210" in c.stages["select"]
    assert_matches(prog, "C", out["C"], np.einsum("nik,kj->nij", x["A"], x["B"]))


def test_batch_of_the_stationary_only_over_part_of_its_dimension_is_a_located_error():
    text = STATIONARY_BATCH.replace("for n in 0..N, i in 0..M", "for n in 0..N, i in 0..M - 1").replace(
        "C: f32[N, M, P]", "C: f32[N, M - 1, P]")
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(text))
    assert e.value.span is not None and e.value.span.line in (5, 7)


BMM_BT = """\
kernel bmmbt(A: {dt}[N, M, K], B: {dt}[N, P, K]) -> C
  default N = {n}, M = {m}, K = {k}, P = {p}
  C: {dt}[N, M, P]
  for n in 0..N, i in 0..M, j in 0..P:
    C[n, i, j] = 0
    for k in 0..K:
      C[n, i, j] += A[n, i, k] * B[n, j, k]
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_batched_matmul_rows_loaded_once_and_a_band_per_batch_index(dt):
    """Whole row tiles and a remainder (M = 263: two tiles of 128 and one of 7): A's rows go through one buffer
    declared before the nest, the output of all row tiles of a batch index through one band with a slot per tile.
    fp32: the model prefers DMA transposes straight from HBM (conv_weights.rows_by_dma), so no rows buffer."""
    prog, c, inputs, out = run(BMM.format(dt=dt).replace("M = 160", "M = 263").replace("N = 3", "N = 2"))
    if dt == "f32":
        assert "A_tile_rows" not in numbered(c.source) and "nisa.dma_transpose(" in numbered(c.source)
    else:
        assert c.source.index("A_tile_rows = nl.ndarray") < c.source.index("for n in")  # declared once, before the nest
    # the row tiles' slots of the batch index's band (tile 0 peeled: conv_batched.lead_tile; one more whole tile; the
    # 7-row remainder)
    assert all(f"C_band[{p}, {t}]" in numbered(c.source) for p, t in ((":", 0), (":", 1), ("0:7", 2)))
    x = rounded(inputs, dt)
    assert_matches(prog, "C", out["C"], np.einsum("nik,nkj->nij", x["A"], x["B"]))


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_batched_a_b_transposed_groups_its_transposes(dt):
    """A B^T with whole contraction tiles (K = 384, P = 200: a ragged j block): B's three transposed tiles share one
    PSUM tile, evicted by two copies (tiles 0..1 on VectorE, tile 2 on ScalarE); fp32 too, since its transposes run
    at transpose mode's fp32 rate (half an fp32 matmul's factor, ARCH3). 16-bit at batch 8 (DMA-bound); fp32 split
    into column bands (`split C.j`): else fp32 (TensorE-bound) and 16-bit at batch 1 or 2 (B's TensorE chain
    before the first matmul) take B's transposes by DMA (conv_band.x_by_dma, test_bmm_dma_rows.py)."""
    prog, c, inputs, out = run(BMM_BT.format(dt=dt, n=2 if dt == "f32" else 8, m=256, k=384, p=200),
                               "split C.j, 100\n" if dt == "f32" else None)
    assert "B_tp = nl.ndarray((128, 3," in numbered(c.source)
    assert "op=nl.copy, data=B_tp[:, 2]" in numbered(c.source)  # the activation (ScalarE) evicting tile 2
    x = rounded(inputs, dt)
    assert_matches(prog, "C", out["C"], np.einsum("nik,njk->nij", x["A"], x["B"]))


def test_batched_a_b_transposed_with_narrow_contraction_tiles_keeps_one_copy_per_tile():
    """K = 300 is planned as 3 tiles of 100 (not whole 128-partition tiles): one PSUM tile and copy per tile."""
    prog, c, inputs, out = run(BMM_BT.format(dt="bf16", n=2, m=40, k=300, p=72))
    assert "B_tp = nl.ndarray((100, 72)" in numbered(c.source)
    x = rounded(inputs, "bf16")
    assert_matches(prog, "C", out["C"], np.einsum("nik,njk->nij", x["A"], x["B"]))


@pytest.mark.parametrize("dt", ["f16", "bf16"])  # fp32 transposes A by DMA (rows_by_dma, test_bmm_dma_rows.py)
def test_batched_matmul_evicts_transposed_pairs_on_two_engines(dt):
    """K = 512 (four whole contraction tiles): A's blocks are transposed two at a time into one PSUM tile, the
    first evicted by VectorE (tensor_copy), the second by ScalarE (activation copy); the remainder tile of M = 263
    (7 rows) keeps a PSUM tile and a VectorE copy per block."""
    prog, c, inputs, out = run(BMM.format(dt=dt).replace("M = 160, K = 300", "M = 263, K = 512"))
    assert "A_pair_tp = nl.ndarray((128, 2, 128)" in numbered(c.source)
    assert "op=nl.copy, data=A_pair_tp[:, 1]" in numbered(c.source)  # the activation (ScalarE) evicting the second
    x = rounded(inputs, dt)
    assert_matches(prog, "C", out["C"], np.einsum("nik,nkj->nij", x["A"], x["B"]))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt, k, g", [("f16", 1024, 4), ("bf16", 1024, 4), ("bf16", 768, 3)])
def test_batched_a_b_transposed_16_bit_groups_a_on_vectore(dt, k, g, nki):
    """16-bit A B^T with whole contraction tiles (K = 1024: eight, in groups of four; K = 768: six, in groups of
    three): A's blocks share a PSUM tile (within a bank) and both parts are evicted by VectorE, so ScalarE (B's
    second halves, C's evictions) is not the busiest engine; M = 263 leaves a 7-row remainder tile (one PSUM tile and
    copy per block), P = 200 a ragged j block."""
    prog = lang.load(BMM_BT.format(dt=dt, n=2, m=263, k=k, p=200))
    c = compile_loaded(prog, nki=nki)
    assert f"A_group_tp = nl.ndarray((128, {g}, 128)" in numbered(c.source) and "A_pair_tp" not in numbered(c.source)
    src = numbered(c.source)[numbered(c.source).index("A_group_tp = nl.ndarray"):]
    src = src[:src.index("C_acc")]
    assert src.count("tensor_copy(") == 2 and "activation(" not in src  # two VectorE copies per group
    inputs = inputs_for(prog)
    out = c.run(**inputs)
    x = rounded(inputs, dt)
    assert_matches(prog, "C", out["C"], np.einsum("nik,njk->nij", x["A"], x["B"]))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_batched_a_b_transposed_fp32_transposes_a_by_dma(nki):
    """fp32 A B^T is TensorE-bound: A's transposes leave TensorE for the DMA engines (conv_weights.rows_by_dma; on
    TensorE they were in pairs on two engines: grouping them by four made the matmuls wait for the whole group)."""
    prog = lang.load(BMM_BT.format(dt="f32", n=2, m=263, k=512, p=200))
    c = compile_loaded(prog, nki=nki)
    assert "dma_transpose(" in c.source and "A_pair_tp" not in c.source and "A_group_tp" not in c.source
    inputs = inputs_for(prog)
    out = c.run(**inputs)
    x = rounded(inputs, "f32")
    assert_matches(prog, "C", out["C"], np.einsum("nik,njk->nij", x["A"], x["B"]))


BATCHED_MATVEC = """
kernel bmv(A: f32[B, M, K], x: f32[B, K]) -> y
  default B = 3, M = 136, K = 200
  y: f32[B, M]
  for b in 0..B, m in 0..M:
    y[b, m] = 0
    for k in 0..K:
      y[b, m] += A[b, m, k] * x[b, k]
"""

BATCHED_MATVEC_AS_BMM = """
kernel bmv(A: f32[B, M, K], x: f32[B, K, 1]) -> y
  default B = 3, M = 136, K = 200
  y: f32[B, M, 1]
  for b in 0..B, m in 0..M, z in 0..1:
    y[b, m, z] = 0
    for k in 0..K:
      y[b, m, z] += A[b, m, k] * x[b, k, z]
"""


def test_a_batched_matvec_compiles_as_written_and_as_the_batched_matmul_form() -> None:
    """Refused until user20 (the selector reads x[b, k] as a depthwise window); matvec_split rewrites it to the
    batched matmul form (x as [B, K, 1]), which the user may also write: both match NumPy."""
    from tilec.tolerance import max_error

    for text, spec in ((BATCHED_MATVEC, "bmk,bk->bm"), (BATCHED_MATVEC_AS_BMM, "bmk,bkz->bmz")):
        c = compile_loaded(lang.load(text), target="trn2")
        inputs = lang.random_inputs(c.program, seed=5)
        a, x = (np.asarray(inputs[k], np.float64) for k in ("A", "x"))
        want = np.einsum(spec, a, x)
        assert max_error(np.asarray(c.run(**inputs)["y"], np.float64), want) <= 1e-5 * np.abs(want).max()
    assert "x_col" in compile_loaded(lang.load(BATCHED_MATVEC), target="trn2").stages["select"]


BATCHED_VECMAT = """\
kernel masked_sum(X: f32[B, S, D], m: f32[B, S]) -> y
  default B = 3, S = 200, D = 96
  y: f32[B, D]
  for b in 0..B, d in 0..D:
    y[b, d] = 0
    for s in 0..S:
      y[b, d] += m[b, s] * X[b, s, d]
"""


def test_a_batched_vector_times_matrix_compiles() -> None:
    """A masked sum over the sequence, `y[b, d] += m[b, s] X[b, s, d]` (the vector against the matrix's middle
    index), was refused with a hint to declare m as [B, S, 1]; matvec_split takes it as it takes A[b, m, k] x[b, k]."""
    c = compile_loaded(lang.load(BATCHED_VECMAT), target="trn2")
    inputs = lang.random_inputs(c.program, seed=6)
    x, m = (np.asarray(inputs[k], np.float64) for k in ("X", "m"))
    want = np.einsum("bsd,bs->bd", x, m)
    got = np.asarray(c.run(**inputs)["y"], np.float64)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    assert "m_col" in c.stages["select"]


MASKED_MEAN = """\
kernel masked_mean(X: f32[B, S, D], m: f32[B, S], cnt: f32[B]) -> y
  default B = 3, S = 200, D = 96
  y: f32[B, D]
  for b in 0..B, d in 0..D:
    y[b, d] = 0
    for s in 0..S:
      y[b, d] += X[b, s, d] * m[b, s] / cnt[b] * 0.5
"""


def test_masked_mean_pooling_takes_the_vector_as_an_expression() -> None:
    """The factors other than the matrix (`m[b, s] / cnt[b]`, reading only b and s) are the vector, computed once
    into the [B, S, 1] column the batched matmul reads."""
    c = compile_loaded(lang.load(MASKED_MEAN), target="trn2")
    inputs = lang.random_inputs(c.program, seed=7)
    inputs["cnt"] = inputs["cnt"] + 1  # (a count: away from 0)
    x, m, cnt = (np.asarray(inputs[k], np.float64) for k in ("X", "m", "cnt"))
    want = np.einsum("bsd,bs->bd", x, m) / cnt[:, None] * 0.5
    got = np.asarray(c.run(**inputs)["y"], np.float64)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("d", [384, 320])
def test_masked_mean_loads_each_batch_index_matrix_whole(d: int) -> None:
    """A batched matrix-vector product's stationary (X[b], contraction-major) is loaded whole per batch index, rows
    of D elements instead of one out-channel tile's 128 (512-byte runs in f32: the DMA queues' descriptors, not its
    bytes, bounded masked mean pooling), a ragged last tile (320 = 2 x 128 + 64) included."""
    c = compile_loaded(lang.load(MASKED_MEAN.replace("D = 96", f"D = {d}")), target="trn2")
    assert f"X_T = nl.ndarray((100, 2, {d})" in numbered(c.source)  # S = 200: two tiles of 100 rows
    inputs = lang.random_inputs(c.program, seed=8)
    inputs["cnt"] = inputs["cnt"] + 1
    x, m, cnt = (np.asarray(inputs[k], np.float64) for k in ("X", "m", "cnt"))
    want = np.einsum("bsd,bs->bd", x, m) / cnt[:, None] * 0.5
    got = np.asarray(c.run(**inputs)["y"], np.float64)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("dt, count", [("bf16", "bf16"), ("f16", "f16"), ("bf16", "f32")])
def test_a_16_bit_masked_mean_carries_its_computed_vector_in_the_matrix_dtype(dt: str, count: str) -> None:
    """`y[b, d] += X[b, s, d] * m[b, s] / cnt[b]` with X and y 16-bit was refused (the f32 vector beside a 16-bit
    matrix fell to the broadcast-reduction split, which no rule maps): the vector m / cnt is computed into a column
    of X's dtype, the rounding the tolerance allows for a computed factor beside a 16-bit read in a 16-bit sum
    (tolerance.rounded_operand), and TensorE multiplies two 16-bit operands. The outputs are turned into rows on
    TensorE (3 whole tiles of 128) and stored as such. An f32 count (the statement read as f32, lang/widen.py)
    gives the same kernel: the widened X is X."""
    src = MASKED_MEAN.replace("f32", dt).replace(f"cnt: {dt}", f"cnt: {count}").replace("D = 96", "D = 384")
    c = compile_loaded(lang.load(src), target="trn2")
    kernel = numbered(c.source)
    name = {"bf16": "bfloat16", "f16": "float16"}[dt]
    assert f"m_col = nl.ndarray((3, 200, 1), dtype=nl.{name}" in kernel and "nc_transpose" in kernel
    inputs = lang.random_inputs(c.program, seed=9)
    inputs["cnt"] = inputs["cnt"] + 1
    x = rounded(inputs, dt)
    cnt = np.asarray(inputs["cnt"], np.float64) if count == "f32" else x["cnt"]
    want = np.einsum("bsd,bs->bd", x["X"], x["m"]) / cnt[:, None] * 0.5
    assert_matches(c.program, "y", c.run(**inputs)["y"], want)
