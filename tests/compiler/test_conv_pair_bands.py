"""Row pairs keep their band where one group per band would leave tiny groups (schedule_conv.pairs_plan): a row-pair
plan takes one matmul group per band (two with 16-bit operands) only when the group's pairs fill at least half of
a matmul's moving rows. 14 x 100: 7 pairs a band, at most 5 pairs of 100 columns a matmul, and 7 is prime, so the
group is 1 pair; one group a band made 2-row bands (bf16 batch 8: 79.3 us on the model; 52 x 52: 271.1), now the
14-row band holds 7 groups (37.4; 52 x 52: 58.5). The plan in the kernel's schedule and NumPy float64 on the
interpreter, both dialects; 56 x 56 keeps its 28-row bands of two 7-pair groups."""
from __future__ import annotations

import pytest

from compiler_helpers import assert_matches, compile_and_run
from test_conv_padded import conv_ref, rounded

SAME = """\
kernel same(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3]) -> Y
  default N = {n}, C = 64, H = {h}, W = {w}, K = 64
  Y: {dt}[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[k, c, r, s]
"""


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt, n", [("bf16", 2), ("f32", 1)])
def test_prime_pairs_keep_the_band(nki, dt, n):
    prog, c, inputs, out = compile_and_run(SAME.format(dt=dt, n=n, h=14, w=100), nki)
    assert "    tile Y.y, 1\n    split Y.y, 14\n" in c.source  # 7 groups of one pair in one 14-row band
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"]))


def test_whole_groups_still_one_or_two_a_band():
    """The families' 56 x 56: 7-pair groups (at most 9 a matmul), two a 16-bit band of 28 rows."""
    from tilec.compiler.api import compile_loaded
    from tilec.lang import api as lang
    c = compile_loaded(lang.load(SAME.format(dt="bf16", n=8, h=56, w=56)), None, "0.6")
    assert "    tile Y.y, 7\n    split Y.y, 28\n" in c.source
