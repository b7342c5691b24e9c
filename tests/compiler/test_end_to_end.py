"""Every example compiled from .tl with the default schedule, run on the NKI interpreter, equal to the reference.

fp32 compares with np.allclose defaults; fp16/bf16 tolerances are justified in compiler_helpers.RTOL.
"""
from __future__ import annotations

import itertools

import pytest

from compiler_helpers import ROOT, check_against_reference, compile_example


@pytest.mark.parametrize("n", [25600, 256000])
def test_vector_add(n):
    check_against_reference(compile_example("vector_add", {"L": n}))


@pytest.mark.parametrize("m,n", [(1024, 1024), (384, 1280)])
def test_transpose(m, n):
    check_against_reference(compile_example("transpose", {"M": m, "N": n}))


@pytest.mark.large
def test_transpose_4096():
    check_against_reference(compile_example("transpose", {"M": 4096, "N": 4096}))


def test_transpose_dma_method():
    check_against_reference(compile_example("transpose", {"M": 256, "N": 384}, schedule="method Y, dma\n"))


def test_matmul_512x1024x768():
    check_against_reference(compile_example("matmul", {"M": 512, "K": 1024, "N": 768}))


def test_matmul_too_big_for_resident_operands():
    """Weights prepared per out-channel tile and column bands of B: the default schedule when nothing fits."""
    c = compile_example("matmul", {"M": 1024, "K": 4096, "N": 1024})
    assert "hoist A, C.i" in c.stages["schedule"] and "split C.j" in c.stages["schedule"]
    check_against_reference(c)


@pytest.mark.parametrize("c,k", list(itertools.product([128, 256], [128, 256])))
def test_conv2d_small_image_batch4(c, k):
    """The assignment's four small-image correctness cases: batch 4, 3x3, 32x16 image."""
    check_against_reference(compile_example("conv2d", {"N": 4, "C": c, "K": k, "H": 32, "W": 16}))


def test_conv_bias_maxpool_small():
    check_against_reference(compile_example("conv_bias_maxpool", {"N": 4, "H": 32, "W": 16}))


def test_conv_bias_relu_maxpool_fused():
    c = compile_example("conv_relu", {"N": 2, "C": 128, "K": 128, "H": 18, "W": 18})
    assert "nl.relu" in c.source and "nl.maximum" in c.source
    check_against_reference(c)


def test_avgpool():
    check_against_reference(compile_example("avgpool", {"N": 2, "C": 64, "H": 16, "W": 24}))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_conv_bias_maxpool_half_precision_small(dtype):
    check_against_reference(compile_example("conv_bias_maxpool", {"N": 1, "H": 18, "W": 20}, dtype))


# ---- the assignment's large image (224x224, 256 -> 256, 3x3). Measured per batch-4 case: 12-22 s on a quiet
# 2-core machine, up to ~37 s when it is loaded; batch-1 cases 5-13 s. All six at batch 4 would risk this suite's
# budget, so three run at the harness's batch 4 (fp32 plain and bias + maxpool, which are the checked-in generated
# kernels, and fp16 bias + maxpool) and three at batch 1 (the performance configuration: fp32 bias, fp16 plain and
# bias); batch is a plain outer loop of the kernel, exercised at batch 4 by the small-image cases above too.

CONV_BIAS = """\
kernel conv_bias(X: f32[N, C, H, W], Wt: f32[K, C, R, R], b: f32[K]) -> Y
  default N = 1, C = 256, H = 224, W = 224, K = 256, R = 3
  let Ho = H - R + 1, Wo = W - R + 1
  Y: f32[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = b[k]
    for c in 0..C, r in 0..R, s in 0..R:
      Y[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
"""


def _conv_bias(dtype: str):
    from tilec.compiler.api import compile_loaded
    from tilec.lang import api as lang
    return compile_loaded(lang.load(CONV_BIAS.replace("f32", dtype)))


@pytest.mark.large
def test_conv_bias_maxpool_224_fp32_batch4():
    c = compile_example("conv_bias_maxpool", {"N": 4})
    assert c.source == (ROOT / "generated" / "conv_bias_maxpool.py").read_text()  # the checked-in kernel
    check_against_reference(c)


@pytest.mark.large
def test_conv_bias_maxpool_224_fp16_batch4():
    check_against_reference(compile_example("conv_bias_maxpool", {"N": 4}, "f16"))


@pytest.mark.large
def test_conv2d_224_fp32_batch4():
    c = compile_example("conv2d", {"N": 4})
    assert c.source == (ROOT / "generated" / "conv2d.py").read_text()  # the checked-in kernel
    check_against_reference(c)


@pytest.mark.large
def test_conv2d_224_fp16():
    check_against_reference(compile_example("conv2d", {"N": 1}, "f16"))


@pytest.mark.large
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_conv_bias_224(dtype):
    check_against_reference(_conv_bias(dtype))
