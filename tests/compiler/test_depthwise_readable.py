"""The default depthwise kernel reads in the program's own terms: its section comments name the program's channel
loop and tensors (not the builder's internal names), say which engine runs how many taps, and stay within 120
characters; `tilec explain` describes the plan that kernel uses. The kernels themselves are checked against NumPy in
test_depthwise_fast.py; here one of them is run too, so that a comment change cannot hide a changed kernel."""
from __future__ import annotations

import re

import numpy as np

from compiler_helpers import assert_matches
from test_conv_padded import run
from test_depthwise_fast import reference

# the channel loop is `e` and the image loop `m`, as in a MobileNet block's depthwise stage
PROGRAM = """\
kernel dw(A: f32[M, E, H, W], Wd: f32[E, 3, 3], bd: f32[E]) -> B
  default M = {m}, E = {e}, H = {h}, W = 20
  B: f32[M, E, H, W]
  for m in 0..M, e in 0..E, y in 0..H, x in 0..W:
    B[m, e, y, x] = bd[e]
    for r in 0..3, s in 0..3:
      B[m, e, y, x] += (A[m, e, y + r - 1, x + s - 1] ?? 0) * Wd[e, r, s]
"""


def comments(source: str) -> list[str]:
    return [line.strip() for line in source.splitlines() if line.strip().startswith("# ----")]


def test_comments_use_the_programs_names():
    prog, c, inputs, out = run(PROGRAM.format(m=1, e=150, h=40))
    notes = comments(c.source)
    assert any(n.startswith("# ---- Wd and bd: each e's weights") for n in notes), notes
    assert any("main: depthwise B (no sum over e), partitions hold" in n for n in notes), notes
    chunks = [n for n in notes if re.match(r"# ---- B rows \d+\.\.\d+, 9 taps: ", n)]
    assert chunks, notes
    for n in chunks:  # the engine counts cover the 9 taps: products and TensorE's matmuls
        counts = re.search(r"taps: (?:TensorE (\d+), )?products ScalarE (\d+)(?: \+ VectorE (\d+))?", n)
        assert counts and sum(int(g or 0) for g in counts.groups()) == 9, n
    loops = [line for line in c.source.splitlines() if "for e_g" in line]
    assert loops and all("for e (groups of" in line for line in loops), loops
    assert not any("for c " in line or "for c(" in line for line in c.source.splitlines())
    dw_lines = [line for line in c.source.splitlines() if line.strip().startswith("#")]
    assert all(len(line) <= 120 for line in dw_lines), [line for line in dw_lines if len(line) > 120]
    x, w, b = (inputs[k].astype(np.float64) for k in ("A", "Wd", "bd"))
    assert_matches(prog, "B", out["B"], reference(x, w, pad=1, bias=b))


def test_row_blocks_are_named_in_the_comments():
    """At batch 1 with few channels the slots are row blocks of one image, and the comments say so."""
    _, c, _, _ = run(PROGRAM.format(m=1, e=40, h=64))
    notes = comments(c.source)
    assert any("every row block's partitions" in n for n in notes), notes
    assert any("partitions hold (row block, e) pairs" in n for n in notes), notes
