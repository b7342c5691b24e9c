"""The MobileNetV2 block (1x1 expand, relu6, padded 3x3 depthwise, relu6, 1x1 project, skip connection): relu6 of a
contraction's operand (`min(relu(A[..] ?? 0), 6) * W[..]`) folds into the producer's eviction (relu, then a minimum;
both keep the padding's 0), and an initial value read from another tensor at the output's element
(`Y[..] = X[..]; Y[..] += ...`) is added on the eviction like a residual. Checked against NumPy (einsum, np.pad)
on the NKI interpreter for f32, f16 and bf16."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_conv_depthwise import depthwise_ref
from test_conv_padded import NARROW, rounded, run

FAMILY = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "families" / "mobilenet_block.tl"


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_mobilenet_block(dt):
    text = FAMILY.read_text().replace("f32", dt).replace("C = 24, E = 144, H = 56, W = 56",
                                                           "C = 24, E = 144, H = 11, W = 9")
    prog, c, inputs, out = run(text.replace("N = 1", "N = 2"))
    x = rounded(inputs, dt)
    narrow = lambda v: v.astype(NARROW[dt]).astype(np.float64)  # noqa: E731
    a = narrow(np.einsum("ec,nchw->nehw", x["We"], x["X"]))
    b = narrow(depthwise_ref(np.minimum(np.maximum(a, 0), 6), x["Wd"]))
    y = x["X"] + np.einsum("ke,nehw->nkhw", x["Wp"], np.minimum(np.maximum(b, 0), 6))
    assert_matches(prog, "Y", out["Y"], y)


MATMUL_INIT = """\
kernel mm2(A: f32[M, K], B: f32[K, N], D: f32[M, N]) -> C
  default M = 200, K = 256, N = 96
  C: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = D[i, j]
    for k in 0..K:
      C[i, j] += A[i, k] * B[k, j]
"""


def test_matmul_starting_from_a_matrix():
    prog, c, inputs, out = run(MATMUL_INIT)
    assert "+ D" in c.stages["select"]
    x = rounded(inputs, "f32")
    assert_matches(prog, "C", out["C"], x["D"] + x["A"] @ x["B"])


RELU6_TWICE = """\
kernel r6(X: f32[C, H, W], W1: f32[K, C], W2: f32[K, K, 3, 3]) -> Y
  default C = 16, H = 8, W = 7, K = 32
  T: f32[K, H, W]
  Y: f32[K, H, W]
  for k in 0..K, y in 0..H, x in 0..W:
    T[k, y, x] = 0
    for c in 0..C:
      T[k, y, x] += X[c, y, x] * W1[k, c]
  for k in 0..K, y in 0..H, x in 0..W:
    Y[k, y, x] = 0
    for c in 0..K, r in 0..3, s in 0..3:
      Y[k, y, x] += min(6, relu(T[c, y + r - 1, x + s - 1] ?? 0)) * W2[k, c, r, s]
"""


def test_relu6_of_a_padded_operand_folds_into_its_producer():
    prog, c, inputs, out = run(RELU6_TWICE)
    x = rounded(inputs, "f32")
    t = np.minimum(np.maximum(np.einsum("kc,chw->khw", x["W1"], x["X"]), 0), 6)
    tp = np.pad(t, ((0, 0), (1, 1), (1, 1)))
    want = sum(np.einsum("kc,chw->khw", x["W2"][:, :, r, s], tp[:, r:r + 8, s:s + 7])
               for r in range(3) for s in range(3))
    assert_matches(prog, "Y", out["Y"], want)


def test_two_different_functions_of_one_operand_are_a_located_error():
    from tilec.compiler.api import compile_loaded
    from tilec.errors import TilecError
    from tilec.lang import api as lang
    text = RELU6_TWICE + """\
  Z: f32[K, H, W]
  for k in 0..K, y in 0..H, x in 0..W:
    Z[k, y, x] = 0
    for c in 0..K:
      Z[k, y, x] += relu(T[c, y, x]) * W3[k, c]
"""
    text = text.replace("-> Y", "-> Y, Z").replace("W2: f32[K, K, 3, 3])", "W2: f32[K, K, 3, 3], W3: f32[K, K])")
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(text))
    assert "read only under the same function" in str(e.value) and e.value.span is not None
