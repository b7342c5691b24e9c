"""A batched matmul's first out-channel tile peeled (conv_batched.lead_tile): tile 0's stationary loads are issued
with the moving band's (one loop over the contraction tiles when both are DMAs, else A's first) instead of after
the whole band, the other tiles loop from tile 1, and a ragged plan's partial tile reads the band loaded with tile 0.
Every case is checked against NumPy's einsum on the interpreter in both NKI dialects."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import assert_matches, inputs_for
from tilec.compiler.api import compile_file
from tilec.compiler.wrap import unwrap
from kernel_numbers import numbered

FORMS = {  # (operands, product, einsum)
    "ab": ("A: {dt}[N, M, K], B: {dt}[N, K, P]", "A[n, i, k] * B[n, k, j]", "nik,nkj->nij"),
    "abt": ("A: {dt}[N, M, K], B: {dt}[N, P, K]", "A[n, i, k] * B[n, j, k]", "nik,njk->nij"),
    "atb": ("A: {dt}[N, K, M], B: {dt}[N, K, P]", "A[n, k, i] * B[n, k, j]", "nki,nkj->nij"),
}
PROGRAM = """\
kernel bm({args}) -> C
  C: {dt}[N, M, P]
  for n in 0..N, i in 0..M, j in 0..P:
    C[n, i, j] = 0
    for k in 0..K:
      C[n, i, j] += {product}
"""


def compiled(tmp_path, form: str, dt: str, sizes: dict[str, int], nki: str):
    args, product, _ = FORMS[form]
    path = tmp_path / f"bm_{form}.tl"
    path.write_text(PROGRAM.format(args=args.format(dt=dt), dt=dt, product=product))
    return compile_file(str(path), sizes, nki=nki)


def check(c, form: str, dt: str) -> None:
    inputs = inputs_for(c.program, seed=11)
    out = c.run(**inputs)
    store = np.float32 if dt == "f32" else ml_dtypes.bfloat16
    a, b = (np.asarray(inputs[n].astype(store), np.float64) for n in ("A", "B"))
    assert_matches(c.program, "C", out["C"], np.einsum(FORMS[form][2], a, b))


def lines_of(source: str, block: str) -> list[str]:
    """The kernel lines of the first block whose comment header contains `block`, up to the next header or the
    accumulator's allocation (the peeled tile's matmuls)."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if "# ----" in line and block in line)
    end = next((i for i in range(start + 1, len(lines)) if "# ----" in lines[i] or "C_acc" in lines[i]), len(lines))
    return lines[start:end]


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("form", ["ab", "abt"])
def test_tile0_and_band_in_one_loop(tmp_path, form, nki):
    """fp32, batch 2 (A and B^T both transposed by DMA): one loop over the contraction tiles loads tile 0's A and
    B's band tile by tile, before any matmul; tile 1 is a tile of its own (two whole tiles: the loop from tile 1 has
    one iteration)."""
    c = compiled(tmp_path, form, "f32", dict(N=2, M=256, K=384, P=256), nki)
    source = unwrap(numbered(c.source))
    lead = lines_of(source, "tile 0, interleaved with")
    loops = [line for line in lead if line.lstrip().startswith("for ")]
    assert len(loops) == 1 and "and that tile of B" in loops[0], lead
    moves = [line for line in lead if "dma_transpose(" in line or "dma_copy(" in line]
    assert len(moves) == 2 and "A_v[" in moves[0] and "B" in moves[1], lead  # A's tile k, then B's
    assert source.count("dma_transpose(") == (2 if form == "ab" else 3)  # A tile 0, A tile 1 (+ B^T's band)
    check(c, form, "f32")


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("form", ["ab", "abt", "atb"])
def test_ragged_rows_read_the_band_of_tile_0(tmp_path, form, dt, nki):
    """M = 263 (two whole tiles and 7 rows), K = 320 (tiles as planned), P = 200: the band is loaded once per batch
    index, by the peeled tile 0, and the partial tile reads it; bf16 A B^T (B's band transposed on TensorE at this
    size, conv_band.x_by_dma: not peeled) keeps a band for the whole tiles and one for the partial tile."""
    c = compiled(tmp_path, form, dt, dict(N=2, M=263, K=320, P=200), nki)
    source = unwrap(numbered(c.source))
    band = [line for line in source.splitlines() if "B_band = nl.ndarray" in line or "B_band = nl.zeros" in line]
    peeled = (form, dt) != ("abt", "bf16")
    assert ("tile 0, interleaved with" in source) == peeled and len(band) == (1 if peeled else 2), source
    check(c, form, dt)


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_one_tile_of_rows(tmp_path, dt, nki):
    """M = 72: one (ragged) tile, no loop over tiles after the peeled one."""
    c = compiled(tmp_path, "ab", dt, dict(N=3, M=72, K=160, P=144), nki)
    check(c, "ab", dt)


def test_sixteen_bit_a_first(tmp_path):
    """bf16 A B: A's rows (loaded whole, transposed on TensorE) are not a loop of DMAs, so every tile's A loads go
    before the band's, in the same block (conv_batched.tiles_together: two whole tiles)."""
    c = compiled(tmp_path, "ab", "bf16", dict(N=2, M=256, K=512, P=256), "0.6")
    lead = lines_of(unwrap(numbered(c.source)), "for every out-channel tile")
    a_loads = [i for i, line in enumerate(lead) if "dma_copy(" in line and "A" in line.split("src=")[1]]
    first_b = next(i for i, line in enumerate(lead) if "dma_copy(" in line and "B" in line.split("src=")[1])
    assert len(a_loads) == 2 and a_loads[-1] < first_b, lead
    check(c, "ab", "bf16")


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("form, m", [("ab", 256), ("abt", 256), ("ab", 384), ("ab", 512)])
def test_sixteen_bit_tiles_together(tmp_path, form, m, nki):
    """bf16 A B and A B^T at batch 1 with 2 to 4 whole out-channel tiles: every tile's stationary first, then one
    loop over the contraction tiles with each tile's matmul into its own PSUM accumulator, then the evictions
    (alternately ScalarE and VectorE) and stores."""
    c = compiled(tmp_path, form, "bf16", dict(N=1, M=m, K=256, P=128), nki)
    source = unwrap(numbered(c.source))
    tiles = m // 128
    assert all(f"C_acc_{t}" in source for t in range(1, tiles)) and f"C_acc_{tiles}" not in source
    assert "weights A for every out-channel tile" in source and "for i_t in" not in source
    check(c, form, "bf16")


@pytest.mark.parametrize("dt, m", [("bf16", 640), ("f32", 256)], ids=["five", "fp32"])
def test_tiles_one_by_one_otherwise(tmp_path, dt, m):
    """Five tiles (more accumulators than MAX_TOGETHER) or an fp32 stationary by DMA transposes (zipped with the
    band): the tiles go one by one, as before."""
    c = compiled(tmp_path, "ab", dt, dict(N=1, M=m, K=256, P=128), "0.6")
    assert "C_acc_1" not in unwrap(numbered(c.source))
    check(c, "ab", dt)


def test_band_transposed_on_tensor_engine_is_not_peeled(tmp_path):
    """bf16 A B^T at batch 8: B's band is transposed on TensorE (its chain leads, not A's loads): the tile loop is as
    before."""
    c = compiled(tmp_path, "abt", "bf16", dict(N=8, M=256, K=512, P=256), "0.6")
    source = unwrap(numbered(c.source))
    assert "interleaved with" not in source and "for i_t in range(2)" in source
    check(c, "abt", "bf16")


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("m", [256, 131], ids=["tiles", "ragged"])
def test_at_b_stationary_of_the_batch_index(tmp_path, m, nki):
    """bf16 A^T B from batch 2 on, at most two out-channel tiles (conv_batched.w_per_image): A[n] loaded whole, rows of
    M elements, with B's band in one loop before the tile loop; M = 131: the 3-row partial tile reads it too."""
    c = compiled(tmp_path, "atb", "bf16", dict(N=2, M=m, K=384, P=256), nki)
    source = unwrap(numbered(c.source))
    lead = lines_of(source, "of this batch index, every out-channel tile, interleaved with")
    assert any(f"A_T = nl.ndarray((128, 3, {m})" in line for line in lead), lead
    assert sum("A_T = nl.ndarray" in line for line in source.splitlines()) == 1  # no per-tile stationary left
    check(c, "atb", "bf16")


@pytest.mark.parametrize("dt,n,m", [("f32", 2, 256), ("bf16", 1, 256), ("bf16", 2, 384)],
                         ids=["f32", "batch1", "three_tiles"])
def test_at_b_stationary_per_tile(tmp_path, dt, n, m):
    """fp32 (rows of a tile are 512 B already), batch 1 and three tiles (tile 0 would wait for every tile's columns)
    keep A per out-channel tile."""
    c = compiled(tmp_path, "atb", dt, dict(N=n, M=m, K=384, P=256), "0.6")
    assert "of this batch index" not in numbered(c.source)
    check(c, "atb", dt)
