"""The fused conv2d + bias + maxpool kernel (benchmarks/kernels/conv2d.py) against an independent NumPy
convolution, in fp32, fp16 and bf16, both pool sizes; its instruction structure matches calibration.md row 9."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tilec.nki import api

from nki_testutil import kernel


def conv_ref(x: np.ndarray, w: np.ndarray, bias: np.ndarray, pool: int) -> np.ndarray:
    """float64 conv2d (stride 1, no padding) + bias + max_pool2d(pool, stride=pool), as the assignment's harness."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    b, _, h, wd = x.shape
    co, _, kh, kw = w.shape
    ho, wo = h - kh + 1, wd - kw + 1
    out = np.zeros((b, co, ho, wo))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("oc,bchw->bohw", w64[:, :, i, j], x64[:, :, i:i + ho, j:j + wo], optimize=True)
    out += bias.astype(np.float64)[None, :, None, None]
    if pool > 1:
        out = out.reshape(b, co, ho // pool, pool, wo // pool, pool).max(axis=(3, 5))
    return out


# The kernel accumulates exact products in fp32 (2304 terms, each < 1), adds the bias in fp32 and rounds once to
# the output dtype; max pooling is exact. So the error is half an ulp of the output dtype (relative 2^-11 fp16,
# 2^-8 bf16) plus fp32 accumulation error (relative ~1e-6).
RTOL = {np.float32: 1e-5, np.float16: 2.0**-11 + 1e-5, ml_dtypes.bfloat16: 2.0**-8 + 1e-5}


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("cin,cout,pool", [(128, 128, 1), (256, 128, 2), (128, 256, 2), (256, 256, 1)])
def test_conv_small_image(cin: int, cout: int, pool: int, dtype: object) -> None:
    rng = np.random.default_rng(42)
    x = rng.random((2, cin, 32, 16), dtype=np.float32).astype(dtype)
    w = rng.random((cout, cin, 3, 3), dtype=np.float32).astype(dtype)
    bias = rng.random(cout, dtype=np.float32).astype(dtype)
    out = kernel("conv2d.py", "fused_conv2d_maxpool")(x, w, bias, pool_size=pool)
    assert out.dtype == np.dtype(dtype) and out.shape == (2, cout, 30 // pool, 14 // pool)
    np.testing.assert_allclose(out.astype(np.float64), conv_ref(x, w, bias, pool), rtol=RTOL[dtype], atol=0)


def test_conv_instruction_structure() -> None:
    """One matmul per (out-channel tile, output row, in-channel tile, tap), moving operand 128 x out_width."""
    rng = np.random.default_rng(0)
    x = rng.random((1, 256, 10, 20), dtype=np.float32).astype(np.float16)
    w = rng.random((256, 256, 3, 3), dtype=np.float32).astype(np.float16)
    bias = np.zeros(256, np.float16)
    _, trace = api.simulate_traced(kernel("conv2d.py", "fused_conv2d_maxpool"), x, w, bias, pool_size=1)
    mm = [i for i in trace.instrs if i.op == "nc_matmul"]
    assert len(mm) == 2 * 8 * 2 * 9  # co tiles * output rows * ci tiles * taps
    assert {(i.k, i.m, i.free, i.accumulate) for i in mm} == {(128, 128, 18, True)}
    assert sum(i.op == "nc_transpose" for i in trace.instrs) == 2 * 2 * 9  # weights transposed once
    first_mm = min(i.seq for i in mm)
    assert max(i.seq for i in trace.instrs if i.op == "nc_transpose") < first_mm


@pytest.mark.large
def test_conv_large_image_fp32_bias_pool() -> None:
    rng = np.random.default_rng(42)
    x = rng.random((1, 256, 224, 224), dtype=np.float32)
    w = rng.random((256, 256, 3, 3), dtype=np.float32)
    bias = rng.random(256, dtype=np.float32)
    out = kernel("conv2d.py", "fused_conv2d_maxpool")(x, w, bias, pool_size=2)
    ref = conv_ref(x, w, bias, 2)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=1e-5, atol=0)
