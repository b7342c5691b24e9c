"""An initial value shared by the batch of a batched matmul (rows21): causal attention scores with one mask for
every head, `P[h, i, j] = Mk[i, j]` then `P[h, i, j] += Q[h, i, d] * K[h, j, d] * 0.125`, add the mask on the PSUM
eviction (select_conv._init_residual, build_conv's residual read at batch index 0) instead of a sum through HBM and
an element-wise add (init_split). Checked against NumPy in f32 and bf16 at a few tiles; a mask that does not read
every index but the batch still goes through init_split."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_matches, run_signed
from tilec.compiler.pipeline import compile_program
from tilec.lang import api as lang

CAUSAL = (pathlib.Path(__file__).parents[1] / "programs" / "user20" / "causal_scores.tl").read_text()
# (sizes, the plan's order): the mask saved against the heads' K loaded per row tile (schedule_conv: 512 KiB
# against 96 KiB, then 256 KiB against 256 KiB)
SIZES = [("Hd = 3, S = 256, D = 32", ("k", "n", "y")), ("Hd = 2, S = 256, D = 128", ("n", "y", "k"))]

# two batch indices, the mask per head shared by the images: the sum's batch is (b, h), the mask reads h
PER_HEAD = """kernel scores(Q: f32[B, Hd, S, D], K: f32[B, Hd, S, D], Mk: f32[Hd, S, S]) -> P
  default B = 2, Hd = 2, S = 128, D = 32
  P: f32[B, Hd, S, S]
  for b in 0..B, h in 0..Hd, i in 0..S, j in 0..S:
    P[b, h, i, j] = Mk[h, i, j]
    for d in 0..D:
      P[b, h, i, j] += Q[b, h, i, d] * K[b, h, j, d]
"""


def _causal(a):
    return np.einsum("hid,hjd->hij", a["Q"], a["K"]) * 0.125 + a["Mk"]


@pytest.mark.parametrize("sizes,order,dtype", [(s, o, dt) for s, o in SIZES for dt in ("f32", "bf16")])
def test_mask_added_on_the_eviction(sizes, order, dtype):
    prog, c, out, a = run_signed(CAUSAL.replace("Hd = 2, S = 64, D = 32", sizes), dtype, seed=5)
    assert_matches(prog, "P", out["P"], _causal(a))
    assert c.result.plans[[op.name for op in c.result.ops].index("P")].order == order
    assert "buffer=nl.hbm)" not in c.source  # no HBM temporary: the sum is not stored before the mask is added
    assert "Mk_skip" in c.source


def test_heads_inside_the_mask_tiles_when_that_loads_less():
    """At 8 heads of 1024 x 1024 the mask (4 MiB) loaded once per head would be 28 MiB more; the heads' K loaded
    once per tile of 128 rows is 14 MiB more: the row tiles go outside the heads (schedule_conv)."""
    prog = lang.load(CAUSAL.replace("Hd = 2, S = 64, D = 32", "Hd = 8, S = 1024, D = 64"))
    r = compile_program(prog)
    plan, = [p for op, p in zip(r.ops, r.plans) if op.name == "P"]
    assert plan.order == ("k", "n", "y")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_mask_of_part_of_the_batch_goes_through_init_split(dtype):
    prog, c, out, a = run_signed(PER_HEAD, dtype, seed=6)
    want = np.einsum("bhid,bhjd->bhij", a["Q"], a["K"]) + a["Mk"][None]
    assert_matches(prog, "P", out["P"], want)
