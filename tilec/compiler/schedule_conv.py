"""A convolution's default plan as a table of rules (issue 10's "default schedules as rules"; lead17's review: the
choices had grown as `if` branches of one function, schedule._default_conv).

`conv_sizes` works out what every rule reads: the channel and column tiles, the band of output rows that fits the
input band budget, the rows per matmul group, and the band of a single image (`two_bands`). `CONV_RULES` are
records (name, applies-when predicate, plan, why); the first rule whose predicate holds gives the plan, and
`conv_rule` names it (tests and notes can ask which rule chose a plan). The order matters where predicates
overlap: row pairs before folded taps (both fold), the strided split before plain folded taps, the stacked 1x1
bands before the 1x1 band per group, and the plain plan last (it always applies).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from tilec.compiler import rows_dma
from tilec.compiler.ir import DTYPE_BYTES
from tilec.compiler.ops import ConvOp
from tilec.compiler.schedule import (DMA_MIN_ROW, MOVING_FMAX, PMAX, ConvPlan, best_divisor, conv_channel_tile,
                                     divisors, halves, pairable, ragged_tile, stacks, two_bands)

BAND_BUDGET = 48 * 1024  # input band bytes per partition: big DMAs, room for two in flight
BAND_ROWS = 32  # output rows per band at most (a taller image takes several bands)
HALF_ROWS_BYTES = 8192  # band halves: output half-rows per partition of one band's store (below)
MIXED_STATIONARY = 16 * 1024  # mixed taps: a stationary of at most this many bytes per partition stays resident


@dataclass(frozen=True)
class ConvSizes:
    """What the rules read, worked out once per conv (the names of _default_conv before the table)."""
    op: ConvOp
    tile_k: int  # out-channel tile: conv_channel_tile (fewest moving passes)
    tile_c: int  # contraction tile: ragged_tile (conv_batched.lead_tile's plans are built for its even splits)
    tile_x: int  # output columns per matmul
    max_rows: int  # output rows per matmul group at tile_x columns (the moving size / PSUM bank)
    elem: int  # bytes of an X element
    out_elem: int  # bytes of an output element
    w_elem: int  # bytes of a weight element
    ct: int  # contraction tiles (a ragged plan's remainder is one more)
    reach_rows: int  # the window's reach in input rows: (R - 1) * dilation + 1
    sy: int  # row stride
    cols: int  # input columns per band
    band_x: int  # output columns per band (wo: whole rows)
    band: int  # output rows per band (the budget's largest divisor of Ho)
    rows: int  # output rows per matmul group
    split: int  # output rows per band of a single image (two_bands at N = 1)
    weights: int  # bytes of the weights
    taps: int  # R x S

    @property
    def wo(self) -> int:
        return self.op.dim("Wo")

    @property
    def ho(self) -> int:
        return self.op.dim("Ho")

    @property
    def wy(self) -> int:
        return self.op.pool.wy if self.op.pool else 1


def conv_sizes(op: ConvOp, dtypes: dict[str, str]) -> ConvSizes:
    wy, wx = (op.pool.wy, op.pool.wx) if op.pool else (1, 1)
    tile_k, tile_c = conv_channel_tile(op.dim("K")), ragged_tile(op.dim("C"))
    kg = op.dim("K") // op.groups
    if op.groups > 1 and tile_k % kg:  # a grouped conv's out-channel tile holds whole groups (block diagonal)
        tile_k = PMAX // kg * kg
    wo, ho = op.dim("Wo"), op.dim("Ho")
    # a matmul group covers at least one pooling window of wy rows: wy * tile_x must fit the moving size / PSUM bank
    x_limit = MOVING_FMAX // wy
    tile_x = wo if wo <= x_limit else best_divisor(wo, x_limit, wx)
    max_rows = MOVING_FMAX // tile_x
    elem = DTYPE_BYTES[dtypes[op.x]]
    ct = -(-op.dim("C") // tile_c)
    # the window's reach in input rows (columns): (R - 1) * dilation + 1
    r, s = (op.dim("R") - 1) * op.dilation[0] + 1, (op.dim("S") - 1) * op.dilation[1] + 1
    sy, sxx = op.stride  # input rows behind d output rows: (d - 1) * sy + r
    # a whole row of the band: X's width, or a padded read's (halo included)
    reach = (wo - 1) * sxx + s
    width = op.dim("W") if op.offset[1] == 0 and reach <= op.dim("W") else reach
    # columns per band: whole rows unless even a minimal band of whole rows does not fit (or the read is padded:
    # column bands of a padded read are not compiled)
    band_x = wo
    if ct * ((wy - 1) * sy + r) * width * elem > BAND_BUDGET and width == op.dim("W") and op.offset[1] == 0:
        fits = [d for d in divisors(wo)
                if d % wx == 0 and ct * ((wy - 1) * sy + r) * ((d - 1) * sxx + s) * elem <= BAND_BUDGET]
        band_x = max(fits) if fits else wx
        tile_x = best_divisor(band_x, x_limit, wx)
        max_rows = MOVING_FMAX // tile_x
    cols = width if band_x == wo else (band_x - 1) * sxx + s
    band_limit = BAND_ROWS if ho > BAND_ROWS else ho
    band = wy
    for d in sorted(divisors(ho), reverse=True):
        if d % wy == 0 and d <= band_limit and ct * ((d - 1) * sy + r) * cols * elem <= BAND_BUDGET:
            band = d
            break
    rows = best_divisor(band, max_rows, wy)
    split = two_bands(ho, band, max_rows, wy) if op.dim("N") == 1 else band  # (not for row pairs, band halves)
    w_elem = DTYPE_BYTES[dtypes[op.w]]
    return ConvSizes(op, tile_k, tile_c, tile_x, max_rows, elem, DTYPE_BYTES[dtypes[op.out]], w_elem, ct, r, sy,
                     cols, band_x, band, rows, split, ct * r * s * op.dim("K") * w_elem, op.dim("R") * op.dim("S"))


def base_plan(z: ConvSizes, rows: int, band: int) -> ConvPlan:
    """The plan of z's tiles with `rows` per matmul group and `band` rows per band (weights resident unless big)."""
    op, bx = z.op, 0 if z.band_x == z.wo else z.band_x
    if op.w_batch:  # one stationary matrix per batch index: prepared inside the batch loop, per out-channel tile
        return ConvPlan(z.tile_k, z.tile_c, z.tile_x, rows, band, bx, hoist_w="k")
    if z.weights > 64 * 1024 or \
            rows_dma.plain_rows(op, z.w_elem) and rows_dma.pays(op, z.tile_k, z.w_elem, z.out_elem, z.elem):
        # weights too big to keep resident, or fp32 rows of a plain matmul transposed by DMA (rows_dma.py): prepare
        # one out-channel tile at a time, outermost
        return ConvPlan(z.tile_k, z.tile_c, z.tile_x, rows, band, bx, ("k", "n", "y"), hoist_w="k")
    return ConvPlan(z.tile_k, z.tile_c, z.tile_x, rows, band, bx)


# ---- predicates and plans of the rules ----------------------------------------------------------------------------

def folds(z: ConvSizes) -> bool:
    """Few input channels: filter taps fold into the contraction partitions (build_conv.fold_groups)."""
    return 2 * z.op.dim("C") <= PMAX and z.taps > 1 and z.band_x == z.wo and not z.op.x_transposed


def fold(z: ConvSizes) -> int:
    return min(z.taps, PMAX // z.op.dim("C"))


def folded_plan(z: ConvSizes) -> ConvPlan:
    return replace(base_plan(z, z.rows, z.band), fold=fold(z))


def pair_band(z: ConvSizes) -> int:
    """The band of a phased plan: band halves take bands whose output half-rows fit HALF_ROWS_BYTES per partition."""
    if not (halves(z.op) and pairable(z.op)):
        return z.band
    fits = [d for d in divisors(z.ho) if d % 2 == 0 and d <= z.band and d // 2 * z.wo * z.out_elem <= HALF_ROWS_BYTES]
    return max(fits) if fits else z.band


def pairs(z: ConvSizes) -> bool:
    return folds(z) and (halves(z.op) or fold(z) == 2) and pairable(z.op) and pair_band(z) % 2 == 0


def pairs_plan(z: ConvSizes) -> ConvPlan:
    band = pair_band(z)
    rows = best_divisor(band // 2, z.max_rows)
    # row pairs: one matmul group per band (two with 16-bit operands, see the rule), unless its groups are small
    # (few_pairs): then the band stays, several groups long
    if not halves(z.op) and not few_pairs(z, rows):
        groups = 2 if z.elem < 4 and band % (4 * rows) == 0 else 1
        band = 2 * groups * rows
    return replace(folded_plan(z), pair=2, band=band, rows=rows)


def few_pairs(z: ConvSizes, rows: int) -> bool:
    """Whether a row-pair band's groups of `rows` pairs are too small to give each its own band: one pair (bands of
    2 rows: a band's DMAs move a few KB each), or, with 16-bit operands (DMA-bound, not TensorE), under half the
    pairs a matmul takes. A prime count of pairs per band does it: bf16 conv3x3same 52 x 52 batch 8 (13 pairs a
    26-row band, at most 9 of 52 columns a matmul) 271.1 -> 58.5 us on the model, f32 277.0 -> 198.5; 14 x 100
    (7 pairs, at most 5) bf16 79.3 -> 37.4, f32 99.8 -> 90.8; 28 x 100 (2-pair groups) bf16 86.9 -> 52.9 (f32 kept:
    155.4, 160.3 with its band kept, the per-group stores of a TensorE-bound fp32 band pipelining better)."""
    return rows == 1 or z.elem < 4 and 2 * rows < z.max_rows


def strided_folded(z: ConvSizes) -> bool:
    return folds(z) and z.sy > 1 and z.split == z.band


def strided_folded_plan(z: ConvSizes) -> ConvPlan:
    split = two_bands(z.ho, z.band, z.max_rows, z.wy)
    return replace(folded_plan(z), band=split, rows=best_divisor(split, z.max_rows, z.wy))


def folded_split_plan(z: ConvSizes) -> ConvPlan:
    return replace(folded_plan(z), band=z.split, rows=best_divisor(z.split, z.max_rows, z.wy))


def mixed_band(z: ConvSizes) -> int:
    return two_bands(z.ho, z.band, z.max_rows, z.wy)


def mixed(z: ConvSizes) -> bool:
    from tilec.compiler import conv_mixed  # (it reads PMAX from schedule)
    op = z.op
    return (not folds(z) and conv_mixed.pays(op, z.elem, z.cols, -(-op.dim("K") // z.tile_k)) and z.band_x == z.wo
            and conv_mixed.tiles(op.dim("C"), z.taps) * ((mixed_band(z) - 1) * z.sy + z.reach_rows) * z.cols * z.elem
            <= BAND_BUDGET)


def mixed_plan(z: ConvSizes) -> ConvPlan:
    from tilec.compiler import conv_mixed
    band = mixed_band(z)
    plan = replace(base_plan(z, best_divisor(band, z.max_rows, z.wy), band), fold=z.taps)
    if conv_mixed.tiles(z.op.dim("C"), z.taps) * z.op.dim("K") * z.w_elem <= MIXED_STATIONARY:
        plan = replace(plan, order=("n", "y", "k"), hoist_w="root")
    return plan


def band_per_group(z: ConvSizes) -> bool:
    """A 1x1 conv whose band holds several matmul groups of rows long enough for efficient DMAs."""
    return z.taps == 1 and z.band > z.rows and ((z.rows - 1) * z.sy + z.reach_rows) * z.cols * z.elem >= DMA_MIN_ROW


def stacked(z: ConvSizes) -> bool:
    return band_per_group(z) and stacks(z.op) and z.ho % (2 * z.rows) == 0 and z.ho > z.rows


def rows_plan(z: ConvSizes, band: int) -> ConvPlan:
    return base_plan(z, best_divisor(band, z.max_rows, z.wy), band)


@dataclass(frozen=True)
class ConvRule:
    name: str
    applies: Callable[[ConvSizes], bool]
    plan: Callable[[ConvSizes], ConvPlan]
    why: str


CONV_RULES: tuple[ConvRule, ...] = (
    ConvRule("row pairs", pairs, pairs_plan,
             "32 or 64 output channels: two parts of the output rows share each matmul (the stationary's two column "
             "halves): even and odd rows from two band copies (a matmul per 2 rows covers 4 blocks of the 128 x 128 "
             "array), or with few input channels the two halves of the band (copies per tap and half). Row pairs in "
             "16 bits too, since a band's two phases leave in one store and its copies load as one run per partition "
             "(conv10: families --dtype bf16 conv3x3same 3.39x -> 2.20x at batch 8). Row pairs take one matmul group "
             "per band, so each band's store follows its matmuls (conv3x3same 2.86x/1.76x -> 2.69x/1.74x, "
             "resnet_block 2.84x -> 2.60x at batch 1); with 16-bit operands, whose matmuls take a quarter of the "
             "time, two groups: fewer, larger DMAs (bf16 conv3x3same batch 8: 60.6 -> 51.9 us). Band halves take "
             "bands whose output half-rows take at most 8 KiB per partition (a DMA's efficiency saturates at 4 KiB, "
             "nki-spec §2.5), so each band's store, on all 16 DMA engines, pipelines with the next bands' matmuls "
             "(conv_c3: 32-row bands 2.68x/2.45x -> 8-row bands ~2.3x/2.2x; with band slots, 16-row bands: 2.01x -> "
             "1.80x at batch 1, f16 32-row bands 1.99x -> 1.84x)."),
    ConvRule("strided folded: two bands per image", strided_folded, strided_folded_plan,
             "A strided folded conv loads sy * sx times the bytes of each output row it stores: two bands per image "
             "at any batch, so the next band's load runs under this band's matmuls (conv21: conv3x3s2 f32 b8 82.55 "
             "-> 80.10 us with the per-group weights; conv_residual's plan, unstrided, keeps whole-image bands at "
             "N > 1: its half-image stores are runs half as long)."),
    ConvRule("folded taps", folds, folded_split_plan,
             "Few input channels (2 C <= 128): filter taps fold into the contraction partitions "
             "(build_conv.fold_groups; a grouped conv's block-diagonal stationary too): the C = 3 first layer does "
             "9 taps in one matmul over 27 partitions instead of 9 over 3."),
    ConvRule("mixed taps", mixed, mixed_plan,
             "More channels than whole copies fold (2 C > 128): every tap's rows cut into tiles of 128 (conv_mixed), "
             "when the matmul time saved beats the copies' DMA time (conv_mixed.pays). Bands halved at any batch: a "
             "band's matmuls wait for its load and then its copies, two DMA latencies (conv_odd f32 b8 152.5 -> "
             "148.2 us). Its stationary (conv_odd: 5 x 129 elements per partition) stays resident and the "
             "out-channel parts read each band's copies in turn (by the 64 KiB of W, the parts were outermost and "
             "each made the band again: conv_odd bf16 b1 20.2 us)."),
    ConvRule("1x1: stacked bands", stacked, lambda z: rows_plan(z, 2 * z.rows),
             "A 1x1 conv of few input channels: two matmul groups per band, side by side on the partition halves "
             "(build_conv.stack), so the band's loads reach all 16 DMA engines (small20's hand kernel; conv21: "
             "conv1x1s2 b8 1.72x -> 1.16x)."),
    ConvRule("1x1: a band per matmul group", band_per_group, lambda z: rows_plan(z, z.rows),
             "A 1x1 conv at any batch: a band per matmul group, so the first matmul waits for one group's rows, not "
             "the band's."),
    ConvRule("plain", lambda z: True, lambda z: rows_plan(z, z.split),
             "One matmul per tap and contraction tile over bands of whole rows within the band budget; a single "
             "image in two bands when each holds a whole matmul group (two_bands)."),
)


def conv_rule(op: ConvOp, dtypes: dict[str, str]) -> tuple[ConvRule, ConvSizes]:
    """The first rule of CONV_RULES that applies to `op`, and the sizes it read."""
    z = conv_sizes(op, dtypes)
    return next(rule for rule in CONV_RULES if rule.applies(z)), z


def default_conv(op: ConvOp, dtypes: dict[str, str]) -> ConvPlan:
    rule, z = conv_rule(op, dtypes)
    plan = rule.plan(z)
    return replace(plan, order=("k", "n", "y")) if shared_residual_first(op, dtypes, plan) else plan


def shared_residual_first(op: ConvOp, dtypes: dict[str, str], plan: ConvPlan) -> bool:
    """Whether the out-channel tiles go outside the batch (rows21): a residual shared by the batch
    (`P[h, i, j] = Mk[i, j]` before the sum, select_conv._init_residual) is then loaded once per tile, not once per
    batch index, and the batch's input is loaded once per out-channel tile instead of once: chosen when the residual
    bytes saved, (N - 1) x its size, are more than the input bytes added, (tiles - 1) x the input's size (causal
    scores, 8 heads of 1024 x 1024 fp32: 28 MiB saved, 14 MiB added; model 405.6 -> 244.9 us)."""
    if op.residual is None or not op.residual_shared or plan.order != ("n", "y", "k"):
        return False
    n, tiles = op.dim("N"), -(-op.dim("K") // plan.tile_k)
    residual = op.dim("K") * op.dim("Ho") * op.dim("Wo") * DTYPE_BYTES[dtypes[op.residual]]
    inputs = n * op.dim("C") * op.dim("H") * op.dim("W") * DTYPE_BYTES[dtypes[op.x]]
    return (n - 1) * residual > (tiles - 1) * inputs
