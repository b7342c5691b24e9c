"""Convolutions and matmuls whose channel counts have no good divisor (257, 131, 251: primes above 128) take
128-channel tiles plus one remainder tile, for the contraction C and the output channels K (build_conv.py), instead
of 1-channel tiles (~129,000 matmuls: tests/fuzz/regressions/l04_hang-conv-prime-channels.tl). Each case runs on the
interpreter against the reference evaluator, with the default schedule and with directives that move the parts
around (weights per out-channel tile, weight DMAs per in-channel tile, taps and outer loops reordered)."""
from __future__ import annotations

import warnings

import pytest

from tilec.testing.oracle import check

CONV = """kernel conv(X: {dt}[N, C, H, W], Wt: {dt}[{wshape}], b: f32[K]) -> Y
  default N = 2, C = {C}, H = 6, W = 7, K = {K}, R = 2
  let Ho = H - R + 1, Wo = W - R + 1
  conv: f32[N, K, Ho, Wo]
  Y: f32[N, K, Ho / 1, Wo / 2]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    conv[n, k, y, x] = b[k]
    for c in 0..C, r in 0..R, s in 0..R:
      conv[n, k, y, x] += X[n, c, y + r, x + s] * Wt[{widx}]
  for n in 0..N, k in 0..K, i in 0..Ho / 1, j in 0..Wo / 2:
    Y[n, k, i, j] = -inf
    for q in 0..2:
      Y[n, k, i, j] max= relu(conv[n, k, i, 2*j + q])
"""

LINEAR = """kernel linear(X: f32[M, K], W: f32[K, N], b: f32[{bias}]) -> Y
  default M = {M}, K = {K}, N = {N}
  H: f32[M, N]
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    H[i, j] = b[{bidx}]
    for k in 0..K:
      H[i, j] += X[i, k] * W[k, j]
  for i in 0..M, j in 0..N:
    Y[i, j] = relu(H[i, j])
"""


def conv(c: int, k: int, layout: str = "kc", dt: str = "f32") -> str:
    wshape, widx = ("K, C, R, R", "k, c, r, s") if layout == "kc" else ("C, K, R, R", "c, k, r, s")
    return CONV.format(C=c, K=k, dt=dt, wshape=wshape, widx=widx)


CASES = {
    "conv-C257-K251": (conv(257, 251), None),
    "conv-C257-K64-bf16": (conv(257, 64, dt="bf16"), None),
    "conv-C3-K131-ck": (conv(3, 131, "ck"), None),
    "conv-C131-K131-ck": (conv(131, 131, "ck"), None),
    "conv-hoist-w-per-k": (conv(131, 257), "hoist Wt, conv.k\n"),
    "conv-w-dma-per-c": (conv(257, 131), "split Wt, conv.c\n"),
    "conv-taps-c-inner": (conv(131, 131), "reorder conv, r, s, c\nreorder conv, k, n, y\n"),
    "conv-x-pinned-k": (conv(131, 131), "hoist X, conv.k\nbuffers X, 1\n"),
    "matmul-K131-M257": (LINEAR.format(M=257, K=131, N=96, bias="N", bidx="j"), None),
    "matmul-rows-bias": (LINEAR.format(M=131, K=257, N=40, bias="M", bidx="i"), None),
}


@pytest.mark.parametrize("name", CASES)
def test_ragged_channels_match_the_reference(name):
    text, schedule = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verdict, _ = check(text, schedule)
    assert verdict.cls == "ok", verdict.line()


def test_ragged_plan_issues_a_few_matmuls_not_one_per_channel(tmp_path):
    from tilec.compiler.api import compile_file

    path = tmp_path / "conv.tl"
    path.write_text(conv(257, 251))
    kernel = compile_file(path).source
    assert "range(257)" not in kernel and "range(251)" not in kernel
    assert "stationary=Wt_T[0:1, 2" in kernel  # the remainder contraction tile: channel 256 of C = 257
