"""At batch 1, a conv band of several accumulation groups is stored group by group (build_conv.group_stores): each
group's rows leave in their own DMA, issued in the loop over groups right after the group's eviction, so the last
store of the kernel waits for one group only. Checked against NumPy (einsum per tap) on the NKI interpreter for
f32, f16 and bf16 in both NKI dialects, for a padded "same" conv, a strided conv and a conv with a residual add."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run
from test_conv_padded import NARROW, conv_ref, rounded
from tilec.compiler.wrap import unwrap

SAME = """\
kernel same(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3]) -> Y
  default N = {n}, C = 128, H = 12, W = 10, K = 96
  Y: {dt}[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[k, c, r, s]
  schedule:
    tile Y.y, 3
"""

STRIDED = """\
kernel strided(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3]) -> Y
  default N = {n}, C = 96, H = 25, W = 17, K = 64
  Y: {dt}[N, K, (H - 3) / 2 + 1, (W - 3) / 2 + 1]
  for n in 0..N, k in 0..K, y in 0..(H - 3) / 2 + 1, x in 0..(W - 3) / 2 + 1:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += X[n, c, 2*y + r, 2*x + s] * Wt[k, c, r, s]
  schedule:
    tile Y.y, 4
"""

RESIDUAL = """\
kernel res(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3], S: {dt}[N, K, H - 2, W - 2]) -> Y
  default N = {n}, C = 128, H = 14, W = 12, K = 128
  conv: {dt}[N, K, H - 2, W - 2]
  Y: {dt}[N, K, H - 2, W - 2]
  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:
    conv[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      conv[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:
    Y[n, k, y, x] = conv[n, k, y, x] + S[n, k, y, x]
  schedule:
    tile conv.y, 4
"""


def reference(name: str, x: dict, dt: str):
    if name == "same":
        return conv_ref(x["X"], x["Wt"])
    if name == "strided":
        return conv_ref(x["X"], x["Wt"], stride=2, pad=(0, 0))
    conv = conv_ref(x["X"], x["Wt"], pad=(0, 0)).astype(NARROW[dt]).astype(np.float64)  # conv is stored in dt
    return conv + x["S"]


def stores_in_group_loop(src: str) -> tuple[int, int]:
    """(stores of Y inside a loop over groups, stores of Y outside one)."""
    lines = unwrap(src).split("\n")
    inside = outside = 0
    for i, ln in enumerate(lines):
        if not re.search(r"dma_copy\(dst=Y|^\s*Y\[[^\n]*\] = nl\.load|nl\.store\(Y", ln):
            continue
        depth = len(ln) - len(ln.lstrip())
        loops = [lines[j] for j in range(i) if re.match(r"\s*for y_g\d* in ", lines[j])
                 and len(lines[j]) - len(lines[j].lstrip()) < depth]
        enclosing = [lp for lp in loops if all(len(lines[m]) - len(lines[m].lstrip()) > len(lp) - len(lp.lstrip())
                                              for m in range(lines.index(lp) + 1, i) if lines[m].strip())]
        if enclosing:
            inside += 1
        else:
            outside += 1
    return inside, outside


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("text", [SAME, STRIDED, RESIDUAL], ids=["same", "strided", "residual"])
def test_batch_1_bands_stored_group_by_group(nki, dt, text):
    prog, c, inputs, out = compile_and_run(text.format(dt=dt, n=1), nki)
    inside, outside = stores_in_group_loop(c.source)
    assert inside >= 1 and outside == 0, (inside, outside)
    name = re.match(r"kernel (\w+)", text).group(1)
    assert_matches(prog, "Y", out["Y"], reference(name, rounded(inputs, dt), dt))


@pytest.mark.parametrize("text", [SAME, RESIDUAL], ids=["same", "residual"])
def test_batch_2_bands_stored_once(text):
    """From batch 2 on a band leaves in one store after its last group (group stores wait on each other)."""
    prog, c, inputs, out = compile_and_run(text.format(dt="bf16", n=2), "0.6")
    inside, outside = stores_in_group_loop(c.source)
    assert inside == 0 and outside >= 1, (inside, outside)
    name = re.match(r"kernel (\w+)", text).group(1)
    assert_matches(prog, "Y", out["Y"], reference(name, rounded(inputs, "bf16"), "bf16"))
