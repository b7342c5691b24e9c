"""A plain fp32 matmul whose stationary is tall (an NHWC 1x1 conv: a linear layer over the flattened pixels; a linear
layer over many rows): its rows are transposed per row tile by DMA transposes from HBM, TensorE runs the matmuls only
(rows_dma.py). 16-bit stationaries and matmuls whose moving operand's load outweighs the saving keep TensorE's
transposes. Each kernel's output on the interpreter is compared with NumPy."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import EXAMPLES
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

NHWC = """kernel pw(X: DT[N, H, W, C], Wt: DT[C, K], b: DT[K]) -> Y
  default N = 2, H = 14, W = 14, C = 128, K = 256
  Y: DT[N, H, W, K]
  for n in 0..N, h in 0..H, w in 0..W, k in 0..K:
    Y[n, h, w, k] = b[k]
    for c in 0..C:
      Y[n, h, w, k] += X[n, h, w, c] * Wt[c, k]
"""
NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}


def run(text: str, dtype: str, sizes=None, nki: str | None = None):
    c = compile_loaded(lang.load(text.replace("DT", dtype), sizes), nki=nki, target="trn2")
    given = {n: np.asarray(v, NP[dtype]) for n, v in lang.random_inputs(c.program, seed=11).items()}
    got = np.asarray(c.run(**given)["Y"], np.float64)
    return c, got, {n: v.astype(np.float64) for n, v in given.items()}


def conv(a) -> np.ndarray:
    return np.einsum("nhwc,ck->nhwk", a["X"], a["Wt"]) + a["b"]


def close(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    """f32: sums of C products in fp32; bf16: the output rounded once (one ulp of the largest value)."""
    tol = 2.0**-7 if dtype == "bf16" else 1e-5
    assert np.abs(got - want).max() <= tol * np.abs(want).max()


@pytest.mark.parametrize("sizes,nki", [(None, None), (None, "0.1"), ({"N": 1, "H": 20, "W": 20, "C": 200, "K": 96},
                                                                     None)])
def test_an_nhwc_1x1_conv_transposes_its_pixels_by_dma(sizes, nki) -> None:
    """392 pixels (3 tiles of 128 and 8), and 400 pixels with 200 in-channels (two contraction tiles of 100)."""
    c, got, a = run(NHWC, "f32", sizes, nki)
    assert "dma_transpose" in c.source and "nc_transpose" not in c.source
    close(got, conv(a), "f32")


def test_bf16_keeps_tensor_engine_transposes() -> None:
    c, got, a = run(NHWC, "bf16")
    assert "dma_transpose" not in c.source and "nc_transpose" in c.source
    close(got, conv(a), "bf16")


def test_a_matmul_whose_moving_operand_is_big_keeps_tensor_engine_transposes() -> None:
    """examples/matmul.tl (512 x 1024 by 1024 x 768): B's 3 MiB would load before A's first DMA transposes."""
    c = compile_loaded(lang.load(str(EXAMPLES / "matmul.tl")), target="trn2")
    assert "dma_transpose" not in c.source
