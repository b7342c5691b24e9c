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
    assert ("dma_transpose(" in source) == (dt == "f32")
    inputs = inputs_for(c.program, seed=5)
    out = c.run(**inputs)
    store = np.float32 if dt == "f32" else ml_dtypes.bfloat16  # the inputs as the kernel's HBM holds them
    a, b = (np.asarray(inputs[n].astype(store), np.float64) for n in ("A", "B"))
    want = np.einsum("nik,nkj->nij", a, b) if form == "ab" else np.einsum("nik,njk->nij", a, b)
    assert_matches(c.program, "C", out["C"], want)
