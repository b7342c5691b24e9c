"""Zero-padded ("same") convolutions `(X[n, c, y + r - 1, x + s - 1] ?? 0) * W[k, c, r, s]`: the input band in SBUF
is allocated zeroed (nl.zeros) and only its interior is loaded, so no padded copy of X is ever written to HBM; the
first and last row bands (whose rows run past X's edge) are peeled off the band loop with their own halo. Checked
against an independent NumPy formula (np.pad + einsum per tap) on the NKI interpreter, with strides, dilations,
fused epilogues (bias, relu, pool), several row bands, channels above 128 and f32/f16/bf16."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import assert_matches, inputs_for
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang

NARROW = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def conv_ref(x, w, stride=1, dilation=1, pad=(1, 1), bias=None):
    """torch.conv2d(x, w, bias, stride, padding, dilation) in float64: np.pad, then one einsum per tap."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    ho = (h + 2 * pad[0] - dilation * (r - 1) - 1) // stride + 1
    wo = (wd + 2 * pad[1] - dilation * (s - 1) - 1) // stride + 1
    out = np.zeros((n, k, ho, wo))
    for i in range(r):
        for j in range(s):
            win = xp[:, :, i * dilation:i * dilation + stride * (ho - 1) + 1:stride,
                     j * dilation:j * dilation + stride * (wo - 1) + 1:stride]
            out += np.einsum("kc,nchw->nkhw", w[:, :, i, j], win)
    return out + (bias.astype(np.float64)[None, :, None, None] if bias is not None else 0)


def rounded(inputs: dict, dtype: str) -> dict:
    """The inputs as the kernel sees them (rounded to the program's dtype), in float64 for the reference."""
    return {name: v.astype(NARROW[dtype]).astype(np.float64) for name, v in inputs.items()}


def resnet_ref(x: dict, dt: str):
    """The ResNet block in float64: relu(conv2(relu(conv1(X) + b1)) + b2 + X), T rounded to the program's dtype
    before the second conv reads it (it is stored in that dtype)."""
    t = conv_ref(x["X"], x["W1"], bias=x["b1"])
    if dt != "f32":
        t = rounded({"t": t}, dt)["t"]
    return (conv_ref(t.clip(min=0), x["W2"], bias=x["b2"]) + x["X"]).clip(min=0)


def run(text: str, schedule: str | None = None):
    prog = lang.load(text)
    c = compile_loaded(prog, lang.parse_schedule(schedule, "<test>") if schedule else None)
    inputs = inputs_for(prog)
    return prog, c, inputs, c.run(**inputs)


SAME = """\
kernel same(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3], b: {dt}[K]) -> Y
  default N = 2, C = 160, H = 20, W = 9, K = 136
  Y: {dt}[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = b[k]
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[k, c, r, s]
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_same_conv_ragged_channels_several_bands(dt):
    prog, c, inputs, out = run(SAME.format(dt=dt), "split Y.y, 5\n")
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], bias=x["b"]))


def test_same_conv_zeroes_the_halo_in_sbuf_not_in_hbm():
    prog, c, inputs, out = run(SAME.format(dt="f32"), "split Y.y, 5\n")
    code = c.source
    assert "nl.zeros" in code or "memset" in code  # the halo, zeroed on chip
    assert code.count("nl.shared_hbm") == 1  # Y only: no padded copy of X
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], bias=x["b"]))


STRIDED = """\
kernel stem(X: f32[N, C, H, W], Wt: f32[K, C, 7, 7]) -> Y
  default N = 2, C = 3, H = 24, W = 22, K = 16
  let Ho = (H + 6 - 7) / 2 + 1, Wo = (W + 6 - 7) / 2 + 1
  Y: f32[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..7, s in 0..7:
      Y[n, k, y, x] += (X[n, c, 2*y + r - 3, 2*x + s - 3] ?? 0) * Wt[k, c, r, s]
"""


@pytest.mark.parametrize("schedule", [None, "split Y.y, 2\n", "split Y.y, 3\ntile Y.y, 1\n"])
def test_padded_stride_2_7x7(schedule):
    prog, c, inputs, out = run(STRIDED, schedule)
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], stride=2, pad=(3, 3)))


SAME_RELU_POOL = """\
kernel srp(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3], b: f32[K]) -> Y
  default N = 1, C = 64, H = 16, W = 12, K = 32
  conv: f32[N, K, H, W]
  Y: f32[N, K, H / 2, W / 2]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    conv[n, k, y, x] = b[k]
    for c in 0..C, r in 0..3, s in 0..3:
      conv[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, i in 0..H / 2, j in 0..W / 2:
    Y[n, k, i, j] = -inf
    for p in 0..2, q in 0..2:
      Y[n, k, i, j] max= relu(conv[n, k, 2*i + p, 2*j + q])
"""


@pytest.mark.parametrize("schedule", [None, "split conv.y, 4\n"])
def test_padded_conv_with_fused_bias_relu_pool(schedule):
    prog, c, inputs, out = run(SAME_RELU_POOL, schedule)
    assert "fused Y" in c.stages["select"]
    x = rounded(inputs, "f32")
    conv = np.maximum(conv_ref(x["X"], x["Wt"], bias=x["b"]), 0)
    n, k, h, w = conv.shape
    want = conv.reshape(n, k, h // 2, 2, w // 2, 2).max(axis=(3, 5))
    assert_matches(prog, "Y", out["Y"], want)


ONE_SIDED = """\
kernel one(X: f32[C, H, W], Wt: f32[K, C, 2, 2]) -> Y
  default C = 16, H = 9, W = 7, K = 8
  Y: f32[K, H, W]
  for k in 0..K, y in 0..H, x in 0..W:
    Y[k, y, x] = 0
    for c in 0..C, r in 0..2, s in 0..2:
      Y[k, y, x] += (X[c, y + r - 1, x + s] ?? 0) * Wt[k, c, r, s]
"""


def test_one_sided_padding_without_batch():
    prog, c, inputs, out = run(ONE_SIDED, "split Y.y, 3\n")
    x = rounded(inputs, "f32")
    xp = np.pad(x["X"], ((0, 0), (1, 0), (0, 1)))
    want = sum(np.einsum("kc,chw->khw", x["Wt"][:, :, r, s], xp[:, r:r + 9, s:s + 7])
               for r in range(2) for s in range(2))
    assert_matches(prog, "Y", out["Y"], want)


RESNET = """\
kernel block(X: {dt}[N, C, H, W], W1: {dt}[C, C, 3, 3], b1: {dt}[C], W2: {dt}[C, C, 3, 3], b2: {dt}[C]) -> Y
  default N = 2, C = 24, H = 10, W = 8
  T: {dt}[N, C, H, W]
  U: {dt}[N, C, H, W]
  Y: {dt}[N, C, H, W]
  for n in 0..N, k in 0..C, y in 0..H, x in 0..W:
    T[n, k, y, x] = b1[k]
    for c in 0..C, r in 0..3, s in 0..3:
      T[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * W1[k, c, r, s]
  for n in 0..N, k in 0..C, y in 0..H, x in 0..W:
    U[n, k, y, x] = b2[k]
    for c in 0..C, r in 0..3, s in 0..3:
      U[n, k, y, x] += relu(T[n, c, y + r - 1, x + s - 1] ?? 0) * W2[k, c, r, s]
  for n in 0..N, k in 0..C, y in 0..H, x in 0..W:
    Y[n, k, y, x] = relu(U[n, k, y, x] + X[n, k, y, x])
"""


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_resnet_basic_block(dt):
    prog, c, inputs, out = run(RESNET.format(dt=dt))
    x = rounded(inputs, dt)
    t = np.maximum(conv_ref(x["X"], x["W1"], bias=x["b1"]), 0).astype(NARROW[dt]).astype(np.float64)
    u = conv_ref(t, x["W2"], bias=x["b2"]).astype(NARROW[dt]).astype(np.float64)
    assert_matches(prog, "Y", out["Y"], np.maximum(u + x["X"], 0))


def test_relu_of_an_input_operand_is_a_located_error():
    text = RESNET.format(dt="f32").replace("relu(T[n, c, y + r - 1, x + s - 1] ?? 0)",
                                           "(T[n, c, y + r - 1, x + s - 1] ?? 0)") \
        .replace("(X[n, c, y + r - 1, x + s - 1] ?? 0) * W1", "relu(X[n, c, y + r - 1, x + s - 1] ?? 0) * W1")
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(text))
    assert "relu of the operand `X[n, c, y + r - 1, x + s - 1]`" in str(e.value)
    assert e.value.span is not None and e.value.span.line == 9
    assert "compute it into a tensor first (`R[..] = relu(X[..])`)" in (e.value.hint or "")


def test_column_bands_of_a_padded_read_are_a_located_error():
    with pytest.raises(TilecError) as e:
        run(SAME.format(dt="f32"), "split Y.x, 3\n")
    assert "column bands of the zero-padded read of X are not compiled yet" in str(e.value)
    assert "drop `split Y.x`" in (e.value.hint or "")


def test_padded_read_elsewhere_is_still_rejected():
    text = """\
kernel sh(X: f32[M, N]) -> Y
  Y: f32[M]
  for i in 0..M:
    Y[i] = 0
    for j in 0..N:
      Y[i] += (X[i, j + 1] ?? 0) * X[i, j]
"""  # (an element-wise statement's shifted padded read compiles since core9: test_padded_eltwise.py)
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(text, {"M": 4, "N": 4}))
    assert "zero padding" in str(e.value) and e.value.span.line == 6
