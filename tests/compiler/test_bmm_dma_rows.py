"""Batched matmuls whose stationary rows the DMA engines transpose (conv_weights.rows_by_dma: the model's estimate
says so for fp32, where TensorE is the bound; 16-bit keeps TensorE transposes, the DMA queues being the bound),
A B and A B^T, against NumPy's einsum on the interpreter in both NKI dialects, at sizes of several tiles."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import assert_matches, inputs_for
from test_matmul_batched import BMM, BMM_BT
from tilec.compiler.api import compile_file
from tilec.compiler.wrap import unwrap

SIZES = dict(N=2, M=256, K=384, P=256)  # two output-row tiles, three contraction tiles per batch index


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("form", ["ab", "abt"])
def test_rows_by_dma_transpose(tmp_path, form, dt, nki):
    path = tmp_path / "bmm.tl"
    text = BMM.format(dt=dt) if form == "ab" else BMM_BT.format(dt=dt, n=1, m=1, k=1, p=1)
    path.write_text(text)
    c = compile_file(str(path), SIZES, nki=nki)
    source = unwrap(c.source)
    a_by_dma = [line for line in source.splitlines() if "dma_transpose(" in line and "A_v[" in line]
    assert bool(a_by_dma) == (dt == "f32")  # A's rows (B^T's band has its own choice: test_bt_band_* below)
    inputs = inputs_for(c.program, seed=5)
    out = c.run(**inputs)
    store = np.float32 if dt == "f32" else ml_dtypes.bfloat16  # the inputs as the kernel's HBM holds them
    a, b = (np.asarray(inputs[n].astype(store), np.float64) for n in ("A", "B"))
    want = np.einsum("nik,nkj->nij", a, b) if form == "ab" else np.einsum("nik,njk->nij", a, b)
    assert_matches(c.program, "C", out["C"], want)


def _bmm_bt(tmp_path, dt: str, sizes: dict[str, int], nki: str):
    path = tmp_path / "bmm_bt.tl"
    path.write_text(BMM_BT.format(dt=dt, n=1, m=1, k=1, p=1))
    return compile_file(str(path), sizes, nki=nki)


def _check_bt(c, dt: str, seed: int) -> None:
    inputs = inputs_for(c.program, seed=seed)
    out = c.run(**inputs)
    store = np.float32 if dt == "f32" else ml_dtypes.bfloat16
    a, b = (np.asarray(inputs[n].astype(store), np.float64) for n in ("A", "B"))
    assert_matches(c.program, "C", out["C"], np.einsum("nik,njk->nij", a, b))


def _b_transposes(source: str) -> list[str]:
    """B's dma_transposes in either dialect (0.6: dst=/src= keywords; 0.1: the source as the argument)."""
    return [line for line in source.splitlines() if "dma_transpose(" in line and ("src=B[" in line or
                                                                                   "dma_transpose(B[" in line)]


# B^T's band by DMA (conv_band.x_by_dma): whole tiles; ragged rows (M = 263: a remainder tile of 7 rows of A) and
# columns (P = 200, no 128-row block of B)
@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("sizes", [SIZES, dict(N=3, M=263, K=512, P=200)], ids=["tiles", "ragged"])
def test_bt_band_by_dma_transpose(tmp_path, sizes, nki):
    c = _bmm_bt(tmp_path, "f32", sizes, nki)
    source = unwrap(c.source)
    # one per contraction tile, in one loop over them: the band is loaded once per batch index (the remainder row
    # tile of M = 263 reads the band loaded with tile 0, conv_batched.lead_tile)
    assert len(_b_transposes(source)) == 1, source
    assert "B_block_rows" not in source and "B_tp" not in source  # no TensorE transposes of B left
    _check_bt(c, "f32", seed=7)


@pytest.mark.parametrize("dt,sizes", [("bf16", dict(N=1, M=512, K=512, P=512)), ("bf16", dict(SIZES, N=8)),
                                      ("f32", dict(N=3, M=200, K=257, P=130))], ids=["bf16_batch1", "bf16", "ragged_k"])
def test_bt_band_stays_on_tensor_engine(tmp_path, dt, sizes):
    """16-bit (DMA-bound; at batch 1 A's later tiles would load behind the whole band) and a ragged contraction
    (its last tile's transpose would use one DMA engine) keep B's transposes on TensorE."""
    c = _bmm_bt(tmp_path, dt, sizes, "0.6")
    source = unwrap(c.source)
    assert not _b_transposes(source) and "B_tp" in source
    _check_bt(c, dt, seed=8)
