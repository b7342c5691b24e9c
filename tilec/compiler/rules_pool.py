"""Window pools of any window, stride and padding (issue 13): the rule and its lowering to level B.

    Y[n, c, i, j] max= X[n, c, 2*i + p - 1, 2*j + q - 1] ?? -inf       (3x3, stride 2, padding 1)
    pool(Y, TilecPlan(tile_b=64, band=14)):
        partition(b, 64)                      rows of n*c on the partitions (tiles of TILE_P)
        split(i, 14, name=BAND)               bands of output rows; the first and last band are peeled (static)
        stage(X, rows=29, halo=(-1, 0))       the band's input rows in SBUF, one DMA; rows outside X not loaded
        window(j, taps=3, stride=2, offset=-1)   along x: each tap a strided view, combined on VectorE
        window(i, taps=3, stride=2, offset=-1)   then along y over the x results (R + S taps, not R * S)
        scale(0.111)                          an average's 1 / count on ScalarE while it casts to Y's dtype
        stage_out(Y)                          the band's result, one DMA

Padding is never materialised: a padded read reads the reduction's identity (-inf for max, 0 for a sum), so a
window that reaches outside X simply has fewer taps. Each pass splits its outputs into segments with the same set
of valid taps (the border columns, the interior), one instruction per tap and segment. An average that excludes the
padding (count_include_pad=False) multiplies each border segment by window / taps inside, then scales by
1 / (wy * wx) like the others.

With few channel rows (n*c <= 64, batch 1), blocks of output rows fill the other partitions. When X's and Y's rows
split evenly into the blocks, the blocks are interleaved with the channel rows (`Interleave`: partition b * G + g
holds block g of row b, a plain reshape of X and Y): a band is then one DMA over all 128 partitions each way, and
the model's stores to Y, which it orders one DMA latency apart (their HBM byte ranges interleave), are one per band
rather than one per block per band; the few output rows whose window crosses a block edge are computed apart.

The rule is split over these files: rules_pool.py (the plan as primitives, the Interleave), pool_window.py (a pool's
partition tiles, bands, loads and stores: `WindowPool`), pool_tensor.py (the pass along x through PSUM: TensorE's
copies or taps), pool_passes.py (the passes on VectorE and GpSimdE, the counts that exclude the padding),
pool_costs.py (the choices from the model's costs), pool_segments.py (runs of outputs with the same taps),
pool_stack.py (several channel rows per partition) and pool_knobs.py (the constants tests and measurements set).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tilec.compiler import pool_knobs as knobs
from tilec.compiler.build_conv import Fresh
from tilec.compiler.build_pool_axes import axes_prims, build_pool_axes
from tilec.compiler.ir import Buf, Stmt
from tilec.compiler.ops import PoolOp
from tilec.compiler.pool_axes import is_inner
from tilec.compiler.pool_costs import psum_choice
from tilec.compiler.pool_passes import PoolShared
from tilec.compiler.pool_stack import stacked
from tilec.compiler.pool_window import WindowPool
from tilec.compiler.rules import Prim, prim
from tilec.compiler.schedule import PMAX, PoolPlan

Built = tuple[list[tuple[str, int]], list[Stmt]]


def pool(op: PoolOp, plan: PoolPlan, dtypes: tuple[str, str] | None = None) -> list[Prim]:
    """The schedule of a window pool as primitives (printable; `build_window_pool` lowers it); dtypes: X's and Y's,
    to say whether the pass along x reads X through PSUM."""
    if is_inner(op):
        return axes_prims(op, dtypes or ("f32", "f32"))
    w = op.window
    assert w is not None
    (sy, sx), (oy, ox) = w.stride, w.offset
    split = interleaved(op, plan, dtypes[0] if dtypes is not None else "f32")
    images = 1
    if split is None:
        op, plan = stacked(op, plan)
        images = plan.images
    band = plan.band if split is None else interleaved_band(plan, split)
    rows = (band - 1) * sy + op.pool.wy
    scale = op.pool.scale / (op.pool.wy * op.pool.wx if w.count == "inside" else 1)
    prims = [prim("partition", "b", plan.tile_b), prim("split", "i", band, name="BAND"),
             prim("stage", op.src, rows=rows, halo=(oy, oy + rows - sy * band))]
    if split is not None:
        prims.insert(1, prim("interleave", "i", split.blocks, rows=(split.first, split.end), seams=len(split.seams)))
    if images > 1:
        prims.insert(1, prim("stack", "b", images, rows=op.dim("H")))
    G = plan.row_blocks(op)
    choice = None
    if dtypes is not None and split is None and G == 1:
        ob = min(band, w.out[0])
        choice = psum_choice(op, ob, op.dim("B") // plan.tile_b * -(-w.out[0] // ob), *dtypes,
                             tiles=op.dim("B") // plan.tile_b)
    if choice is not None:
        prims.append(prim("psum", op.src, rows=choice.rows, copy="TensorE identity matmul" + (", one per tap" if
                                                                                              choice.taps else ""),
                          **({"whole_rows": choice.whole} if choice.whole else {})))
    engine = {} if choice is None else {"engine": "TensorE into PSUM, ScalarE evicts" if choice.taps else
                                        "VectorE from PSUM"}
    if (op.pool.wx, sx, ox) != (1, 1, 0):
        prims.append(prim("window", "j", taps=op.pool.wx, stride=sx, offset=ox, op=op.pool.op, **engine))
    if (op.pool.wy, sy, oy) != (1, 1, 0):
        prims.append(prim("window", "i", taps=op.pool.wy, stride=sy, offset=oy, op=op.pool.op))
    if w.count == "inside":
        prims.append(prim("count", "inside"))
    if scale != 1.0:
        prims.append(prim("scale", float(f"{scale:.6g}"), **({"on": "ScalarE's evictions"} if choice is not None and
                                                              choice.taps else {})))
    return prims + [prim("stage_out", op.out)]


def build_pool(op: PoolOp, plan: PoolPlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    """Every standalone pool (overlapping, strided, padded, or window == stride: `windowed` makes that explicit)."""
    if is_inner(op):  # window axes with dimensions after them (NHWC): a builder of its own
        return build_pool_axes(op, hbm, fresh)
    return build_window_pool(op.windowed(), plan, hbm, fresh)


def build_window_pool(op: PoolOp, plan: PoolPlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    split = interleaved(op, plan, hbm[op.src].dtype)
    if split is not None:
        return build_interleaved(op, plan, hbm, fresh, split)
    op, plan = stacked(op, plan)  # (several channel rows per partition: pool_stack.py)
    pool = WindowPool(op, plan, hbm, fresh)
    return [("TILE_P", plan.tile_b), ("BAND", pool.OB)], pool.build()


@dataclass(frozen=True)
class Interleave:
    """Blocks of rows interleaved with the channel rows: partition b * G + g holds rows g*H/G.. of channel row b,
    a plain reshape of X (and of Y), so each band is one DMA in and one out over all partitions (16 DMA engines)
    instead of one per block. Output rows whose window leaves their block (the seams: at the blocks' edges,
    including the padding) are computed apart, on the channel rows alone."""
    blocks: int
    first: int  # block-local output rows first..end have their windows inside the block
    end: int
    seams: tuple[tuple[int, int], ...]  # runs of output rows [start, stop) computed apart


def interleaved(op: PoolOp, plan: PoolPlan, dtype: str) -> Interleave | None:
    """The interleaved form of a pool planned in row blocks (few channel rows), when X's and Y's rows split evenly
    into the blocks (G * H/G input rows, H/G = Ho/G * stride); dtype: X's."""
    w, G = op.window, plan.blocks
    assert w is not None
    B, H = op.dim("B"), op.dim("H")
    (sy, _), (oy, _) = w.stride, w.offset
    Ho, wy = w.out[0], op.pool.wy
    if G < 2 or plan.tile_b != B or B * G > PMAX or H % G or Ho % G or H // G != Ho // G * sy:
        return None
    first = -(oy // sy) if oy < 0 else 0
    end = min(Ho // G, (H // G - wy - oy) // sy + 1)
    if end - first < knobs.MIN_INTERLEAVED:
        return None
    rows = [g * (Ho // G) + r for g in range(G) for r in range(Ho // G) if not first <= r < end]
    if len(rows) > knobs.SEAMS_PER_BLOCK * G and not kept_for_taps(op, dtype):
        # the row blocks store a band's blocks as one DMA too (pool_window.one_store: Ho splits evenly), which was
        # the interleaved form's advantage; what it still costs is its seams, computed apart on B of the partitions,
        # while the blocks only reload wy - sy halo rows per band (a max reads a row of X where the blocks' rows
        # leave X, a sum zeroes those rows: pool_window.zero_rows). Measured (model, f32 batch 1, 64 channel rows,
        # max): 3x3 s1 pad 1 56 x 56 14.75 -> 11.01 us, 5x5 s2 pad 2 112 x 112 24.87 -> 22.74, 7x7 s2 pad 3
        # 44.37 -> 34.73; 3x3 s2 pad 1 (one seam row per block) stays interleaved: 15.18 against 16.48. Sums
        # (avg, f32): 14.81 -> 12.62, 25.18 -> 24.39, 44.64 -> 36.47; 32 channel rows 3x3 s1 56 x 56 14.01 -> 7.98
        return None
    seams: list[tuple[int, int]] = []
    for r in rows:
        seams = seams[:-1] + [(seams[-1][0], r + 1)] if seams and seams[-1][1] == r else seams + [(r, r + 1)]
    return Interleave(G, first, end, tuple(seams))


def kept_for_taps(op: PoolOp, dtype: str) -> bool:
    """A 16-bit sum whose rows step by more than 1 keeps the Interleave: there (one partition tile) TensorE sums
    the taps of the pass along x (psum_choice), which reads stride x more input rows than the pass along y writes,
    and the row blocks have no PSUM form. Measured (model, bf16 batch 1, 64 channel rows, interleaved -> blocks):
    5x5 s2 pad 2 112 x 112 18.74 -> 21.44 us (14.85 interleaved since its identity comes before the seams), 7x7
    s2 pad 3 28.71 -> 33.36; at stride 1 the blocks win or tie anyway: 5x5 pad 2 56 x 56 17.51 -> 16.28, 3x3 pad 1
    11.47 -> 11.46, 32 channel rows 3x3 13.36 -> 7.38."""
    w = op.window
    assert w is not None
    return op.pool.op == "add" and w.stride[0] > 1 and dtype in knobs.HALF


def interleaved_band(plan: PoolPlan, split: Interleave) -> int:
    """Output rows per band of an Interleave: INTERLEAVED_BANDS bands, or a `split` directive's band if smaller."""
    return min(plan.band, max(1, -(-(split.end - split.first) // knobs.INTERLEAVED_BANDS)))


def build_interleaved(op: PoolOp, plan: PoolPlan, hbm: dict[str, Buf], fresh: Fresh, split: Interleave) -> Built:
    """The seams first (small: their stores join the ordered chain of stores to Y early), then the interleaved
    bands; an identity matrix for TensorE's taps before both."""
    w = op.window
    assert w is not None
    G, B, H = split.blocks, op.dim("B"), op.dim("H")
    (sy, sx), (oy, ox) = w.stride, w.offset
    Ho, Wo = w.out
    out: list[Stmt] = []
    shared = PoolShared()
    lengths = {stop - start for start, stop in split.seams}
    if len(lengths) == 1 and w.count == "window" and B * len(split.seams) <= PMAX:
        # seams of one length side by side as blocks: one load each on its own DMA engines, one set of instructions
        pool = WindowPool(op, PoolPlan(B, lengths.pop()), hbm, fresh, None, shared,
                           tuple(start for start, _ in split.seams))
        pool.note = " (the seams between blocks)"
        out += pool.build()
    for start, stop in split.seams if not out else ():
        seam = replace(op, window=replace(w, offset=(oy + start * sy, ox), out=(stop - start, Wo)))
        pool = WindowPool(seam, PoolPlan(B, stop - start), hbm, fresh, (Ho, start), shared)
        pool.note = f"; output rows {start}..{stop} (a seam between blocks)"
        out += pool.build()
    rows = split.end - split.first
    main = replace(op, dims=(("B", B * G), ("H", H // G), ("W", op.dim("W"))),
                   window=replace(w, offset=(oy + split.first * sy, ox), out=(rows, Wo)))
    pool = WindowPool(main, PoolPlan(B * G, interleaved_band(plan, split)), hbm, fresh, (Ho // G, split.first),
                       shared)
    pool.split_loads = True
    pool.note = f"; rows {split.first}..{split.end} of {G} blocks of {Ho // G} output rows, block g of row b on " \
        f"partition b * {G} + g"
    ident, body = pool.parts()  # (the identity first: TensorE's taps of the bands need not wait for the seams)
    return [("TILE_P", B * G), ("BAND", pool.OB)], ident + out + body
