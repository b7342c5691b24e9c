"""A standalone max or min pool's band of output rows from the model's costs. window_pool_plan's band takes ~16 KiB
of input rows per partition, and the last band what is left: 56 output rows of a 112 x 112 image at stride 2 were
bands of 18, 18, 18 and 2, the last one a band of its own loads and of as many small instructions as the others,
each paying its engine's static cycles (nki-spec §2.4). Here the bands divide the rows evenly (ceil(Ho / nb) rows
each), up to twice the input rows (the two input buffers of 32 KiB per partition stay a third of SBUF's 192 KiB),
and the kernel keeps the candidate pool_costs.forms_ns estimates fastest (bands one after another, each band's
busiest vector engine with its instructions' static cycles, its load and the DMA latency two buffers do not hide)
among those whose kernel fits SBUF (`fits_sbuf`)."""

from __future__ import annotations

from dataclasses import replace

from tilec.compiler import passes
from tilec.compiler import pool_knobs as knobs
from tilec.compiler.ir import Buf
from tilec.compiler.ops import PoolOp
from tilec.compiler.schedule import PoolPlan, sbuf_budget
from tilec.target import compiled

MAX_INPUT_BYTES = 32768  # a band's input rows per partition, counted at 4 bytes an element as window_pool_plan's


def even_band(op: PoolOp, x: str, out: str, plan: PoolPlan) -> PoolPlan:
    """plan with the band of the fastest even split of the output rows (knob EVEN_BANDS False: plan as it is).
    Only for one block per tile, more than one tile (one tile keeps at least two bands, so that its load, passes
    and store overlap), and max or min pools (a sum's band also sets its PSUM chunks and TensorE's rows, which
    forms_ns does not estimate)."""
    from tilec.compiler.pool_costs import forms_ns  # (late: pool_costs imports the plans' module)
    w = op.window
    assert w is not None
    ho, sy, W = w.out[0], w.stride[0], op.dim("W")
    if not knobs.EVEN_BANDS or plan.blocks != 1 or plan.across or plan.images != 1 or plan.band >= ho or \
            op.pool.op not in ("maximum", "minimum") or op.dim("B") // plan.tile_b < 2:
        return plan
    cap = max(1, MAX_INPUT_BYTES // (sy * W * 4))
    fewest = -(-ho // cap)
    best, chosen = forms_ns(op, x, out, plan) * knobs.PLAN_GAIN, plan
    for nb in range(fewest, fewest + 4):
        band = -(-ho // nb)
        if band == plan.band or band < 1:
            continue
        ns = forms_ns(op, x, out, replace(plan, band=band))
        if ns < best and fits_sbuf(op, x, out, replace(plan, band=band)):
            best, chosen = ns, replace(plan, band=band)
    return chosen


def fits_sbuf(op: PoolOp, x: str, out: str, plan: PoolPlan) -> bool:
    """Whether the pool's kernel in `plan` (built here, its SBUF buffers counted as the capacity check counts them:
    passes.peak_usage, where a block's buffers do not add to those of the blocks before it) fits the SBUF one kernel
    may use: larger bands must not turn a kernel that fits into one that does not (a 64 x 1024 f32 max 5x5 needs
    455 KiB with bands of 8 rows against main's 263 with 4; neither fits)."""
    from tilec.compiler.pool_window import WindowPool  # (late: the pool rules import the plans' module)
    w = op.window
    assert w is not None
    B, H, W = op.dim("B"), op.dim("H"), op.dim("W")
    hbm = {op.src: Buf(op.src, "hbm", x, (B, H, W)), op.out: Buf(op.out, "hbm", out, (B, *w.out))}
    body = WindowPool(op, plan, hbm, lambda base: base).build()
    return passes.peak_usage(tuple(body))[0] <= sbuf_budget(compiled())
