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
from tilec.compiler.api import explain

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


def plan_of(schedule: str, op: str) -> list[str]:
    """The lines of `op`'s plan in the schedule stage (its comment lines, up to its first directive)."""
    lines = schedule.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"# {op}: "))
    end = next((i for i in range(at + 1, len(lines)) if not lines[i].startswith("#   ")), len(lines))
    return lines[at:end]


def test_explain_shows_the_depthwise_kernels_plan():
    """Three images of 40 channels fill 120 partitions; 64 rows of 20 take PSUM chunks of 25 (500 fp32) and 14."""
    prog, c, _, _ = run(PROGRAM.format(m=3, e=40, h=64))
    text = explain(c)
    plan = plan_of(c.stages["schedule"], "B")
    assert plan[0] == "# B: the depthwise kernel (build_depthwise), its plan:", plan
    assert "#   partitions: (image, e) pairs, 120 of 128: 40 e channels per group x 3 images per tile" in plan
    assert any(line.startswith("#   loops: 1 group x 1 tile of 3 images;") for line in plan), plan
    assert "#   PSUM chunks of 25 output rows (500 fp32 per partition), pipelined 3 deep" in plan  # 3 images
    taps = [line for line in plan if line.startswith("#   taps of a ")]
    assert [line.split("(")[0] for line in taps] == ["#   taps of a 25-row chunk ", "#   taps of a 14-row chunk "]
    assert "#   eviction from PSUM: + bd, into the output band" in plan
    assert any("the general path's plan: ConvPlan(" in line for line in plan), plan
    assert "# B: the depthwise kernel" in text and "tile B.e, 40" in text  # the report carries it, directives too
    # the taps per chunk match the kernel: as many matmuls on TensorE as the plan says, in each of the 3 chunks
    pe = int(re.search(r"TensorE (\d+)", taps[0]).group(1))
    assert c.source.count("nisa.nc_matmul(") == 3 * pe, c.source.count("nisa.nc_matmul(")


def test_explain_row_blocks_and_the_general_path():
    _, c, _, _ = run(PROGRAM.format(m=1, e=40, h=64))
    plan = plan_of(c.stages["schedule"], "B")
    assert any(line.startswith("#   partitions: (row block, e) pairs") and "row blocks of" in line
               for line in plan), plan
    # a schedule that changes B's plan takes the general path: explain then shows the ConvPlan itself
    _, g, _, _ = run(PROGRAM.format(m=1, e=40, h=64), "tile B.e, 20")
    assert plan_of(g.stages["schedule"], "B")[0].startswith("# B: ConvPlan(tile_k=20")
    assert "depthwise kernel" not in explain(g)
