"""Several channel rows per partition, stacked as rows (PoolPlan.images): a window pool of many channel rows (batch 8:
1536 rows of 28 x 28, twelve tiles of 128) runs each partition tile's two passes as a few large instructions, and
every instruction pays its engine's static cycles (~100; nki-spec §2.4 "static ≈ 100 for tiny or dependent
back-to-back instructions"), about a fifth of a 28 x 28 tile's vector time. With k images per partition, partition p
of a tile holds k consecutive channel rows, which in HBM are one contiguous run (X is [rows, H, W]): X and Y seen as
[rows / k, k * H, W] (a free reshape), so a tile is one pool over k * H rows. The pass along x treats rows alike, so
its instructions are the same as one image's, over k times the rows; the pass along y reads rows of its own image
only: its segments (the outputs with the same taps inside the input) are one image's repeated every Ho outputs
(`y_segments`), which needs Ho * stride == H (an output row's window then starts at the same place in every image).
The band is the whole tile (k * Ho output rows), so no band crosses an image's edge in a loop body."""

from __future__ import annotations

from dataclasses import replace

from tilec.compiler import pool_knobs as knobs
from tilec.compiler.ops import PoolOp
from tilec.compiler.pool_segments import Segment, segments
from tilec.compiler.schedule import PMAX, PoolPlan, best_divisor


def fits(op: PoolOp, plan: PoolPlan, k: int) -> bool:
    """Whether `plan` can stack k images per partition: a standalone max or min pool (a sum keeps its forms through
    PSUM, which read one image's rows) of one block per tile, whose output rows start at the same place in every
    image (Ho * stride == H), k dividing the channel rows into whole tiles of plan.tile_b, and one band per image."""
    w = op.window
    assert w is not None
    B, H = op.dim("B"), op.dim("H")
    return k > 1 and op.pool.op in ("maximum", "minimum") and not op.relu and w.count == "window" and \
        plan.blocks == 1 and not plan.across and w.out[0] * w.stride[0] == H and B % k == 0 and \
        (B // k) % plan.tile_b == 0 and plan.band >= w.out[0]


def stacked(op: PoolOp, plan: PoolPlan) -> tuple[PoolOp, PoolPlan]:
    """The pool over [rows / k, k * H, W] and its plan of one band per tile (k = plan.images), or op and plan as
    they are when it does not fit (a directive changed the tile or the band)."""
    k = plan.images
    if not fits(op, plan, k):
        return op, replace(plan, images=1) if k != 1 else plan
    w = op.window
    assert w is not None
    dims = tuple((d, n // k if d == "B" else n * k if d == "H" else n) for d, n in op.dims)
    return replace(op, dims=dims, window=replace(w, out=(w.out[0] * k, w.out[1]))), \
        replace(plan, band=w.out[0] * k)


def y_segments(n: int, first: int, stride: int, window: int, height: int, images: int, offset: int) -> list[Segment]:
    """The pass along y's segments of a band of n output rows whose first window starts at input row `first`
    (pool_segments.segments), with `images` images of `height` rows stacked: output o of image b reads rows of b
    only, so each image's segments, shifted by its first output. offset: the window's (-padding), so that
    first - offset is the band's first output row times the stride."""
    if images == 1:
        return segments(n, first, stride, window, height)
    per = n // images
    assert per * images == n and first == offset, (n, images, first, offset)
    one = segments(per, first, stride, window, height)
    return [Segment(g.start + b * per, g.size, g.taps) for b in range(images) for g in one]


def choose_images(op: PoolOp, x: str, out: str, one: PoolPlan) -> PoolPlan | None:
    """A plan of k images per partition (k = 2..4) when the model's costs (pool_costs.forms_ns, each instruction
    with its static cycles) make the kernel faster than `one` (schedule.window_pool_plan's) by PLAN_GAIN (estimates
    1.5 % better were 2.5-3.6 % slower kernels: f32 max 4x4 s2 over 1024 rows of 40 x 40, 47.14 -> 48.85 us,
    and 2x2 s2 over 2048 rows, 60.31 -> 61.84); knob IMAGES ("auto",
    "off", or a k to force where it fits). Candidates keep full tiles of 128 partitions and their band within
    band_rows' ~16 KiB of input rows per partition."""
    from tilec.compiler.pool_costs import band_rows, forms_ns  # (late: pool_costs imports the plans' module)
    w = op.window
    assert w is not None
    if knobs.IMAGES == "off" or one.blocks != 1 or one.across:
        return None
    best, chosen = (forms_ns(op, x, out, one) * knobs.PLAN_GAIN if knobs.IMAGES == "auto" else float("inf")), None
    for k in ([int(knobs.IMAGES)] if knobs.IMAGES != "auto" else [2, 3, 4]):
        B = op.dim("B")
        if B % k or best_divisor(B // k, PMAX) != PMAX:
            continue
        plan = PoolPlan(PMAX, w.out[0], images=k)
        if not fits(op, plan, k):
            continue
        sop, splan = stacked(op, plan)
        if band_rows(sop, splan.band) < splan.band:
            continue
        ns = forms_ns(sop, x, out, splan)
        if ns < best:
            best, chosen = ns, plan
    return chosen
