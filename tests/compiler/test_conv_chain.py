"""conv -> relu -> conv chains (issue 13 item 6): where the intermediate T lives and why (`tilec explain`), and the
`place T, hbm|sbuf` directive on it (the on-chip chains themselves: test_conv_onchip.py). Checked against NumPy (one
einsum per tap) on the NKI interpreter."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_conv_onchip import chain
from test_conv_padded import NARROW, conv_ref, rounded, run
from tilec.lang import api as lang
from tilec.compiler.api import compile_loaded, explain
from tilec.errors import TilecError
from kernel_numbers import numbered

CHAIN = chain(dt="{dt}")  # two unpadded 3x3 convs with a relu between, 136 channels (test_conv_onchip.py)
LINES = CHAIN.count("\n")  # a schedule section starts after the kernel's last line


def compiled(schedule: str | None = None, dt: str = "f32"):
    text = CHAIN.format(dt=dt) + (f"  schedule:\n    {schedule}\n" if schedule else "")
    return compile_loaded(lang.load(text))


def test_explain_says_where_the_intermediate_goes_and_why():
    """136 channels (a ragged second tile), unpadded: T stays on chip by default and explain says why, with the
    model's numbers; `place T, hbm` puts it back in HBM and says that too."""
    block = " ".join(_placement(explain(compiled())).split())
    assert "T SBUF, one image at a time (conv -> conv chain) on chip by default: conv T (tl:6) evicts each image of " \
           "T into an SBUF buffer laid out as conv Y (tl:11)'s input, which its matmuls read in place" in block
    assert "us on chip (plain plans, halo zeroed per image) vs" in block
    hbm = " ".join(_placement(explain(compiled("place T, hbm"))).split())
    assert "T HBM scratch (not fused: written, then read back) `place T, hbm`: stored by conv T (tl:6)" in hbm


def _placement(text: str) -> str:
    return text[text.index("tensor placement:"):text.index("buffers (allocate):")]


def test_explain_depthwise_and_pointwise_consumers():
    """The MobileNet block: a 1x1 expand feeds a depthwise conv, which feeds a 1x1 project (both through HBM when a
    directive names one of them; by default build_mbblock keeps them on chip, tests/compiler/test_conv_mobilenet.py)."""
    from compiler_helpers import compile_example

    reason = " ".join(explain(compile_example("mobilenet_block", schedule="place A, hbm\n")).split())
    assert "depthwise conv B (tl:15) reads A as its moving operand" in reason
    assert "each channel reading its own channel of A" in reason
    assert "conv Y (tl:19) reads B as its moving operand in row bands (a 1x1 window, across all" in reason


@pytest.mark.parametrize("schedule", ["place T, hbm", "compute_at T, root"])
def test_place_hbm_keeps_t_in_hbm_and_matches_numpy(schedule):
    c = compiled(schedule)
    assert "T = nl.ndarray((2, 136, 10, 8), dtype=nl.float32, buffer=nl.hbm)" in numbered(c.source)
    assert "T_img" not in numbered(c.source) and "T_img" in numbered(compiled().source)
    prog, c, inputs, out = run(CHAIN.format(dt="f32"), schedule + "\n")
    x = rounded(inputs, "f32")
    t = np.maximum(conv_ref(x["X"], x["W1"], pad=(0, 0)), 0)
    assert_matches(prog, "Y", out["Y"], conv_ref(t, x["W2"], pad=(0, 0)))


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_chain_through_hbm_matches_numpy_16_bit(dt):
    prog = lang.load(CHAIN.format(dt=dt) + "  schedule:\n    place T, hbm\n")
    rng = np.random.default_rng(6)
    scale = 1 / np.sqrt(136 * 9)  # keeps T and Y near 1: f16 holds them (the shared inputs overflow it)
    inputs = {"X": rng.uniform(-1, 1, (2, 136, 12, 10)), "W1": rng.uniform(-scale, scale, (136, 136, 3, 3)),
              "W2": rng.uniform(-scale, scale, (136, 136, 3, 3))}
    out = compile_loaded(prog).run(**inputs)
    x = rounded(inputs, dt)
    t = np.maximum(conv_ref(x["X"], x["W1"], pad=(0, 0)), 0).astype(NARROW[dt]).astype(np.float64)
    assert_matches(prog, "Y", out["Y"], conv_ref(t, x["W2"], pad=(0, 0)))


@pytest.mark.parametrize("schedule, message, hint", [
    ("compute_at T, Y.y", "`compute_at T, ...` of a conv read back by a separate op takes only root", "place T, hbm"),
])
def test_on_chip_placement_is_a_located_error(schedule, message, hint):
    with pytest.raises(TilecError) as e:
        compiled(schedule)
    text = str(e.value)
    assert f"<string>:{LINES + 2}:5: error: {message}" in text
    assert "1280 bytes per partition" in text
    assert "^" * len(schedule) in text and hint in text


def test_place_of_a_conv_fused_into_its_residual_add_is_a_located_error():
    """The ResNet block's second conv U is computed into Y on the eviction (the residual add and relu)."""
    text = open("examples/resnet_block.tl").read() + "  schedule:\n    place U, hbm\n"
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(text))
    assert "U is computed into Y on the PSUM eviction" in str(e.value)
    assert "hint: remove the directive" in str(e.value)


OVERLAPPING_POOL = """\
kernel cpool(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3]) -> Y
  default N = 2, C = 136, H = 17, W = 13, K = 130
  conv: f32[N, K, H - 2, W - 2]
  Y: f32[N, K, (H - 5) / 2 + 1, (W - 5) / 2 + 1]
  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:
    conv[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      conv[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, i in 0..(H - 5) / 2 + 1, j in 0..(W - 5) / 2 + 1:
    Y[n, k, i, j] = -inf
    for p in 0..3, q in 0..3:
      Y[n, k, i, j] max= conv[n, k, 2*i + p, 2*j + q]
"""


def test_conv_then_overlapping_pool_explains_and_places():
    """A 3x3 stride-2 max pool (ResNet's) is not fused into the conv's eviction: each image of conv stays on chip
    for the pool by default (pool_chain.py; 130 channels in two tiles of 65, nothing given up) and explain says so;
    `place conv, hbm` stores it and the pool loads it back. Both match NumPy."""
    reason = " ".join(explain(compile_loaded(lang.load(OVERLAPPING_POOL))).split())
    assert "conv SBUF, one image at a time (conv -> pool chain) on chip by default: conv conv (tl:6) evicts each " \
           "image of conv into an SBUF buffer" in reason
    prog, c, inputs, out = run(OVERLAPPING_POOL)
    assert "conv_img" in c.source and "conv_v" not in c.source
    conv = conv_ref(rounded(inputs, "f32")["X"], rounded(inputs, "f32")["Wt"], pad=(0, 0))
    want = np.max([conv[:, :, p:p + 13:2, q:q + 9:2] for p in range(3) for q in range(3)], axis=0)
    assert_matches(prog, "Y", out["Y"], want)
    prog, c, inputs, out = run(OVERLAPPING_POOL, "place conv, hbm\n")
    assert "conv_img" not in c.source and "conv_v" in c.source
    assert_matches(prog, "Y", out["Y"], want)
    hbm = " ".join(explain(c).split())
    assert "conv HBM scratch (not fused: written, then read back) `place conv, hbm`: pool Y (tl:10) reads conv" in hbm


def test_explain_says_the_schedule_put_a_pooled_conv_in_hbm():
    from compiler_helpers import compile_example

    reason = " ".join(explain(compile_example("conv_bias_maxpool", schedule="place conv, hbm")).split())
    assert "the schedule places conv in HBM (`place conv, hbm` or `compute_at conv, root`)" in reason
    default = explain(compile_example("conv_bias_maxpool"))
    assert "conv         never in HBM: fused into Y" in default


def test_matmul_chain_through_hbm():
    """T = A @ B, Y = T @ C: T is the second matmul's stationary operand; explain names both matmuls and `place T,
    hbm` is the default kernel (matches NumPy)."""
    text = """\
kernel mm2(A: f32[M, K], B: f32[K, P], C: f32[P, Q]) -> Y
  default M = 200, K = 150, P = 140, Q = 96
  T: f32[M, P]
  Y: f32[M, Q]
  for i in 0..M, j in 0..P:
    T[i, j] = 0
    for k in 0..K:
      T[i, j] += A[i, k] * B[k, j]
  for i in 0..M, j in 0..Q:
    Y[i, j] = 0
    for k in 0..P:
      Y[i, j] += T[i, k] * C[k, j]
"""
    reason = " ".join(explain(compile_loaded(lang.load(text))).split())
    assert "T HBM scratch (not fused: written, then read back) written by matmul T (tl:6), read back by matmul Y " \
           "(tl:10)" in reason
    prog, c, inputs, out = run(text, "place T, hbm\n")
    assert numbered(c.source) == numbered(compile_loaded(lang.load(text)).source)
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], x["A"] @ x["B"] @ x["C"])
