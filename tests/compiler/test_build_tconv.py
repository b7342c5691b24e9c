"""The transposed conv built with its result on chip (build_tconv.py): against NumPy's ConvTranspose2d at shapes
that take each of the builder's layouts: row groups side by side on the partitions (K = 64: two, K = 32: four),
output-channel tiles (K = 160), several bands of rows and matmul row chunks, no bias, a bias per channel and tap,
an odd batch, bf16 and f16."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, run_in_own_dtypes
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

TEXT = """\
kernel tc(X: {d}[N, C, H, W], Wt: {d}[C, K, 2, 2], bias: {d}[{bias}]) -> Y
  default N = {N}, C = {C}, H = {H}, W = {W}, K = {K}
  Y: {d}[N, K, 2 * H, 2 * W]
  for n in 0..N, k in 0..K, y in 0..H, a in 0..2, x in 0..W, b in 0..2:
    Y[n, k, 2 * y + a, 2 * x + b] = {init}
    for c in 0..C:
      Y[n, k, 2 * y + a, 2 * x + b] += X[n, c, y, x] * Wt[c, k, a, b]
"""
CASES = {  # name: (dtype, N, C, H, W, K, init)
    "two_groups": ("bf16", 2, 130, 6, 5, 64, "bias[k]"),
    "four_groups": ("f32", 1, 20, 8, 3, 32, "bias[k]"),
    "k_tiles": ("f16", 1, 12, 3, 4, 160, "bias[k]"),
    "bands_no_bias": ("f32", 2, 8, 40, 64, 40, "0"),
    "tap_bias_odd_batch": ("bf16", 3, 16, 4, 6, 32, "bias[k, a, b]"),
}


def _reference(a: dict, init: str) -> np.ndarray:
    t = np.einsum("ncyx,ckab->nkyaxb", a["X"], a["Wt"])
    if init == "bias[k]":
        t = t + a["bias"][None, :, None, None, None, None]
    elif init != "0":  # a bias per output channel and tap
        t = t + a["bias"][None, :, None, :, None, :]
    n, k, h, _, w, _ = t.shape
    return t.reshape(n, k, 2 * h, 2 * w)


def _text(case: str) -> str:
    d, n, c, h, w, k, init = CASES[case]
    return TEXT.format(d=d, N=n, C=c, H=h, W=w, K=k, init=init, bias="K, 2, 2" if "a, b" in init else "K")


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_numpy(case: str) -> None:
    prog, out, a = run_in_own_dtypes(_text(case), 11)
    want = _reference(a, CASES[case][-1])
    assert_matches(prog, "Y", np.asarray(out["Y"], np.float32), want)


def test_groups_share_the_partitions() -> None:
    """K = 64: each tap's matmuls write PSUM partitions [0, 64) and [64, 128) (two groups of rows), and one DMA
    per image stores both groups' rows (merged by dma_merge.py; bf16 N = 2: the two images of a pair)."""
    source = compile_loaded(lang.load(_text("two_groups"))).source
    assert "_acc0[64:128]" in source
    assert source.count("dma_copy(dst=Y_v") == 2


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_case_keeps_the_result_on_chip(case: str) -> None:
    """No HBM temporary between the matmul and the permute (the unfused form stores Y_t and reads it back)."""
    assert "Y_t = nl.ndarray" not in compile_loaded(lang.load(_text(case))).source
