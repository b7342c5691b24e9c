"""Loop-nest builder for a convolution (or matmul) and its fused epilogue, from a ConvPlan.

Tile-size constants and derived loop variables are named after the user's loops (`TILE_I`, `i_t` for a matmul's i);
comments call a convolution's operands weights and input band, a matmul's the stationary and moving operand.

The kernel it builds is the assignment's shifted-matmul convolution:

    weights   W[k, c, r, s] loaded k-major, transposed per tap on TensorE into w_T[c, c_t, r, s, k] (once)
    for n, y-band, k-tile (in the plan's order):
      X band   X[n, c, band rows + R-1, :] -> SBUF, one DMA per in-channel tile, reused by all taps and k-tiles
      for row group, column tile:
        acc (PSUM) += w_T[c, c_t, r, s, k-tile].T @ X_band[c, c_t, rows + r, cols + s]   over c_t, r, s
        epilogue: activation(acc + bias) [relu] -> pool (vector engine) -> out band (SBUF)
      out band -> HBM, one DMA

The builder's features live in their own files: conv_weights.py (the stationary operand and bias), conv_band.py
(the input band's loads, a batched A B^T's transposed moving operand), conv_epilogue.py (the eviction and its fused
epilogue, a chain image's store), conv_batched.py (a batched matmul's out-channel tiles), conv_fold.py (filter taps
folded into the contraction partitions), conv_pairs.py (row pairs and band halves); conv_chain.py keeps a conv ->
conv intermediate on chip (the builder's src_chip / dst_chip).

Channel counts without a good divisor (C = 257, K = 251: primes above 128) get a ragged plan: 128-channel tiles in
the loops above plus one remainder tile after them (`over_k`, `over_c`), kept in the first KR (CR) partitions of one
more tile of the same buffers; the remainder's loads and matmuls use constant offsets instead of a loop variable.

Row phases (ConvPlan.pair = 2: conv_pairs.py) and folded taps (ConvPlan.fold: conv_fold.py) use band copies on more
partitions; their files say how.

A matmul's bias along its output columns (C[i, j] = b[j] + ...) is a row, not a per-partition column: it is copied
to every partition once before the nest (b_bc = ones[1, TILE_I].T @ b[1, tile of j], a contraction of 1 on TensorE)
and added by the eviction (tensor_tensor acc + b_bc, then relu in place), so the accumulation keeps one moving
pass per contraction tile.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from tilec.compiler import build_conv_cols, build_depthwise, build_matvec, ir
from tilec.compiler import conv_band, conv_batched, conv_epilogue, conv_fold, conv_halo, conv_mixed, conv_pairs, \
    conv_split, conv_spread, conv_vpair, conv_weights
from tilec.compiler.build_util import a, hbm_view, loop, sl, term
from tilec.compiler.conv_band import dma_engine_ns  # (its home until the split: rules_move imports it from here)
from tilec.compiler.conv_fold import fold_groups
from tilec.compiler.conv_pairs import pair_groups
from tilec.compiler.ir import DTYPE_BYTES, Act, Alloc, Binary, Buf, Dma, Matmul, Scalar, Stmt, View, full, whole
from tilec.compiler.names import sanitised, unique
from tilec.compiler.named import named_fields
from tilec.compiler.schedule import PMAX, ConvPlan, best_divisor, halves, pairable, stacks
from tilec.compiler.ops import ConvOp
from tilec.errors import TilecError

if TYPE_CHECKING:
    from tilec.compiler.conv_chain import OnChip


SLOTS = 4  # band slots of a folded band with gaps between its copies (conv_c3: 2 slots 95 us, 3 or 4: 87 us)
MAX_SLOTS = 8  # band slots at most (slot_count: the band loop is unrolled once per slot)
SLOT_BYTES = 96 * 1024  # at most this much of each partition for the slots (schedule.py's band budget, twice)

Fresh = Callable[[str], str]  # a derived name -> a name unique in the kernel (names.NameAllocator, per op)


def slot_count(bands: int, most: int, images: int) -> int:
    """Band slots for `bands` bands per image (at most `most`: the bands, SLOT_BYTES). The band loop is unrolled
    once per slot and the bands left over reuse the first slots, so the next image's first bands reuse slots that
    only `bands % slots` bands ago held data being read: with several images, the fewest slots from SLOTS up to
    MAX_SLOTS keeping that distance at SLOTS or more (conv_c3 f32, 14 bands: 5 slots, batch 8 443.6 -> 427.5 us;
    the 4 slots before left 2 bands between an image's last use of slot 0 and the next image's first, and TensorE
    waited ~4 us per image for the load), else the most distant."""
    if images == 1 or most <= SLOTS:
        return min(SLOTS, most)
    choices = range(SLOTS, min(MAX_SLOTS, most) + 1)
    reuse = lambda s: bands % s or s  # noqa: E731  (bands between a slot's last use and the next image's first)
    return next((s for s in choices if reuse(s) >= SLOTS), max(choices, key=reuse))


def build_conv(op: ConvOp, plan: ConvPlan, hbm: dict[str, Buf], fresh: Fresh
               ) -> tuple[list[tuple[str, int]], list[Stmt]]:
    built = build_depthwise.build_depthwise(op, plan, hbm, fresh)  # a depthwise conv's default schedule
    if built is not None:
        return built
    built = build_matvec.build_matvec(op, plan, hbm, fresh)  # W[i, k] v[k]: rows on partitions, no transposes
    if built is not None:
        return built
    if op.x == op.w:  # a Gram matrix `A A^T` (lang_split._gram: no copy): the band's buffers under a name of
        # their own (the builders name buffers after their operand), the same tensor in HBM
        alias = next(f"{op.x}_{n}" for n in range(2, 99) if f"{op.x}_{n}" not in hbm)
        op, hbm = replace(op, x=alias), {**hbm, alias: hbm[op.x]}
    b = _ConvBuilder(op, plan, hbm, fresh)
    return b.consts(), b.build()


def is_convolution(op: ConvOp) -> bool:
    """A contraction with a batch, an output row or filter taps is a convolution (1x1 ones included); one over just
    output rows, output columns and a contraction is a plain matmul."""
    return any(role in dict(op.vars) for role in ("n", "y", "r", "s"))


def const_names(op: ConvOp, fresh: Fresh) -> dict[str, str]:
    """role -> its tile-size constant: TILE_<the user's loop> for the tiled loops (TILE_I, TILE_K, TILE_J for a
    matmul over i, j, k), ROWS / BAND / BAND_X for the row groups and bands of a convolution's output."""
    v = dict(op.vars)
    bases: set[str] = set()  # two loops whose names differ only in case (i, I) still get two constants
    tiles = {role: fresh(unique(_tile_const(v.get(role, role), role), bases)) for role in ("k", "c", "x")}
    return {**tiles, "rows": fresh("ROWS"), "band": fresh("BAND"), "band_x": fresh("BAND_X")}


def _tile_const(loop: str, role: str) -> str:
    """TILE_<loop> as an identifier: a Unicode loop as Python reads it (x² -> TILE_X2), else after its role."""
    name = f"TILE_{sanitised(loop).upper()}"
    return name if name.isidentifier() else f"TILE_{role.upper()}"


def operand_words(op: ConvOp) -> dict[str, str]:
    """How comments describe the operands: a convolution's weights and input band, a matmul's operands by role."""
    if is_convolution(op):
        return {"w": f"weights {op.w}", "x": f"input band {op.x}", "k_tile": "out-channel tile", "bands": "row bands",
                "x_buf": "band", "out_buf": "band"}
    rows = dict(op.vars).get("k", "k")
    return {"w": f"stationary operand {op.w}", "x": f"moving operand {op.x}", "k_tile": f"tile of {rows}",
            "bands": f"tiles of {rows}", "x_buf": "tiles", "out_buf": "rows"}


def conv_loop_vars(op: ConvOp, fresh: Fresh) -> dict[str, str]:
    """role -> loop variable of the built nest: the user's own for n, r, s; derived from the user's loop for tiles
    (`i_t`: tile index of i, `y_b`: row band of y, `y_g`: row group in the band, `x_b`: column band of x)."""
    v = dict(op.vars)
    derived = {"k": ("k", "t"), "c": ("c", "t"), "y": ("y", "b"), "xb": ("x", "b"), "g": ("y", "g"),
               "x": ("x", "t")}
    bases = {role: f"{v.get(src, src)}_{suffix}" for role, (src, suffix) in derived.items()}
    for role, (src, suffix) in derived.items():  # a role the program lacks is named after the role letter, which
        if src not in v and list(bases.values()).count(bases[role]) > 1:  # may be a user's loop of another role
            bases[role] = f"{src}{role}_{suffix}"  # (a matmul's column loop named y: y_b twice, one loop var)
    out = {role: fresh(base) for role, base in bases.items()}
    # a role the program lacks (no batch; one spatial dim) still gets a loop of extent 1: never a user's name
    own = {role: v[role] if role in v else fresh(role) for role in ("n", "r", "s")}
    # the weight and bias preparation loops walk the same out-channel tiles as the main nest (sibling loops)
    return {**out, **own, "kw": out["k"], "kb": out["k"]}


class _ConvBuilder:
    bias_col: Buf  # the bias as one column per out-channel tile (conv_weights.bias)
    bias_bc: Buf  # a matmul's row bias on every partition (conv_weights.bias_row)
    w_rows: Buf | None = None  # a batched matmul's stationary rows, one buffer declared once (rows_once)
    # the whole stationary of a batch index declared before the nest (once_per_image, decided as if the plan's
    # tiles_band held): where a schedule's directives make the tiles load their own, theirs take another name
    wt_declared: bool = False
    o_tiles: Buf | None = None  # a batched matmul's output rows of every out-channel tile (tiles_band)
    o_rows: Buf | None = None  # the output seen as [N, tiles, 128], stored as rows (conv_batched.rows_store)
    x_rows_v: Buf | None = None  # the vector seen as [N, tiles, 128], loaded as rows (conv_batched.vector_rows)
    x_rows: Buf | None = None  # a batched A B^T's rows of B, one buffer declared once (prelude)
    r_band: Buf  # the residual's band added on the eviction (conv_epilogue.residual_band)
    r_all: Buf | None = None  # or the whole batch's residual, one buffer (conv_epilogue.batch_residual)
    epi_cols: dict[str, Buf]  # the fused chain's vectors as columns (conv_epilogue.epilogue_columns)
    epi_rows: dict[str, Buf]  # its rows along a matmul's columns, replicated on every partition (the same)
    epi_allocs: list[Stmt]  # the fused chain's work tiles of one eviction (conv_epilogue.chain)
    base_flat: View  # mixed taps' base band, flat (conv_mixed.x_band), read by a spread remainder (conv_spread)
    spread_w: Buf  # a spread remainder's [C, taps] stationary (conv_spread.weights)
    spread_ones: Buf  # and the ones column summing its taps
    spread_t: Buf  # and its taps' sums of the band being built, shifted (conv_spread.taps)

    def __init__(self, op: ConvOp, plan: ConvPlan, hbm: dict[str, Buf], fresh: Fresh,
                 src_chip: "OnChip | None" = None, dst_chip: "OnChip | None" = None) -> None:
        # a conv -> conv chain kept in SBUF (conv_chain.py): src_chip is this conv's moving operand already on chip
        # (its matmuls read it in place, no band loads), dst_chip the buffer its eviction writes (no output band)
        self.src_chip, self.dst_chip = src_chip, dst_chip
        cn = const_names(op, fresh)  # the plan's tiles by their constants' names: trip counts read SIZE_K // TILE_K
        plan = named_fields(plan, tile_k=cn["k"], tile_c=cn["c"], tile_x=cn["x"], rows=cn["rows"], band=cn["band"])
        # row pairs evicted into a paired image whose copies start at an odd row: odd rows on the first half
        self.swap = int(dst_chip is not None and dst_chip.paired and dst_chip.row0 % 2 == 1)
        if op.w_layout == "dw":  # depthwise: an out-channel tile reads the in-channel tile of the same channels
            plan = replace(plan, tile_c=plan.tile_k, fold=1)
        self.KG = dict(op.dims)["K"] // op.groups  # output channels per group (all of K unless grouped)
        if op.groups > 1:  # block-diagonal weights: loaded per group into zeroed rows of whole k-tiles
            if plan.tile_k % self.KG:
                raise TilecError(f"`{op.name}` is a grouped convolution with {self.KG} output channels per group: "
                                 f"its out-channel tile {plan.tile_k} must hold whole groups", op.span,
                                 f"tile its output channels by a multiple of {self.KG}")
            plan = replace(plan, w_split="k")  # folded taps keep the blocks (conv_fold.weights_folded)
        # groups of as many input as output channels: out-channel tile i holds the groups of in-channel tile i, so
        # its matmuls read that c-tile only (the other blocks of its stationary are zero)
        self.diagonal = op.groups > 1 and dict(op.dims)["C"] == dict(op.dims)["K"]
        if self.diagonal:
            plan = replace(plan, tile_c=plan.tile_k)
        self.op, self.p, self.hbm, self.line, self.fresh = op, plan, hbm, op.line, fresh
        d = dict(op.dims)
        self.N, self.C, self.K, self.H, self.W = d["N"], d["C"], d["K"], d["H"], d["W"]
        self.Ho, self.Wo, self.R, self.S = d["Ho"], d["Wo"], d["R"], d["S"]
        self.wy, self.wx = (op.pool.wy, op.pool.wx) if op.pool else (1, 1)
        self.sy, self.sx = op.stride
        self.dy, self.dx = op.dilation
        self.oy, self.ox = op.offset  # input row (column) of band row (column) 0 of the first band
        self.col0 = self.ox  # X's column at band column 0 (below: 0 for row pairs over X's own columns)
        # channel counts without a good divisor (257) take 128-channel tiles plus one remainder tile (a ragged plan):
        # the remainder sits in the first KR (CR) partitions of one more tile of the same buffers
        self.KT, self.CT = self.K // plan.tile_k, self.C // plan.tile_c
        self.KR, self.CR = self.K % plan.tile_k, self.C % plan.tile_c
        self.CTB = self.CT + (1 if self.CR else 0)
        self.KTB = self.KT + (1 if self.KR else 0)
        self.BX = plan.band_x or self.Wo  # output columns per input band
        self.NB, self.G, self.XT = self.Ho // plan.band, plan.band // plan.rows, self.BX // plan.tile_x
        self.NXB = self.Wo // self.BX
        v = dict(op.vars)
        self.var = conv_loop_vars(op, fresh)
        self.kv: str | None = self.var["k"]  # the out-channel part being built: its loop var (None: the remainder)
        # the row band being built: (loop var, first band) for a loop over bands, (None, band) for one peeled band
        # (a band whose input rows run past X's edge: its halo rows are zero, not loaded)
        self.yb: tuple[str | None, int] = (self.var["y"], 0)
        self.stack = False  # stacked bands (below)
        self.band_shared = False  # the band made before the out-channel parts (nest), not in each part
        self.band_tag = ""  # a peeled band's own names (conv_spread.ahead: two bands' buffers live at once)
        self._check_halo()
        # filter taps folded into the contraction partitions (few input channels: C = 3 uses 3 of 128): copy j of
        # the input band, on partitions [j*C, (j+1)*C), holds X shifted by tap delta j, so one matmul covers a
        # group of taps (the C = 3 first layer: 9 taps in one matmul over 27 partitions instead of 9 over 3)
        self.fold = plan.fold if (plan.fold > 1 and self.CT == 1 and not self.CR and self.NXB == 1
                                  and not op.x_transposed) else 1
        self.groups = fold_groups(self.R, self.S, self.fold)
        # the band copies' shifts in input rows and columns (tap delta times the dilation)
        self.shifts = [(dr * self.dy, ds * self.dx) for dr, ds in self.groups[0]]
        # mixed-tap folding (conv_mixed.py): the copies' rows cut into contraction tiles of 128 (C = 67: 5 tiles)
        self.mixed = conv_mixed.tiles(self.C, self.fold) if self.fold > 1 and self.fold * self.C > PMAX else 0
        # row phases (ConvPlan.pair): the stationary's column half h computes part h of the output rows, either the
        # rows of parity h (row pairs: copy 1 holds X one row down; the 128 x 128 array in 4 blocks for C <= 64) or,
        # with few input channels, half h of the band (band halves: copies per tap row, tap column and half; their
        # output channels interleave on the partitions, 2k + h)
        self.halves = plan.pair == 2 and self.fold > 1 and halves(op)
        self.pair = 2 if (plan.pair == 2 and (self.fold == 2 or self.halves) and pairable(op) and self.KT == 1
                          and not self.KR and plan.band % 2 == 0) else 1
        self.halves = self.halves and self.pair == 2
        if self.pair > 1:  # rows per phase: a divisor of half the band (`split conv.y` may have set the band's rows)
            plan = self.p = replace(plan, rows=best_divisor(plan.band // 2, plan.rows))
        self.pairs: list[tuple[int, int]] = []
        self.g0 = 0  # the band row (pair) the group being built starts at, past g's (conv_split.split_groups)
        self.tag = ""  # appended to the names of its accumulator and eviction tiles (their rows differ)
        self.acc_in: tuple[Buf, int] | None = None  # a PSUM tile the group sums into from a row on (half_groups)
        self.g_step = 0  # rows (pairs) from group g to g + 1 where not the plan's rows (half_groups: a group's part)
        self.phased = False  # band halves as even and odd output rows (below)
        self.NR, self.hstep = 0, 0  # band halves: row copies per column copy, first copy of half 1
        if self.halves:
            # copy (c, h, r) holds X shifted by tap row r, by c tap columns and by half the band's output rows;
            # the matmul of group g reads the copies g * M tap columns further (M copies per tap row; a last group
            # reaching past the taps leaves the trailing copies out)
            self.M = conv_pairs.columns_per_copy(self, plan)
            # (NR row copies per column copy; half h's R taps are copies h * HSTEP.. of each column copy)
            self.NR, self.hstep = 2 * self.R, self.R
            self.shifts = [(r * self.dy + h * plan.band // 2 * self.sy, c * self.dx) for c in range(self.M)
                           for h in range(2) for r in range(self.R)]
            # fp32 first layers' phases: the two parts are the even and odd output rows of the band instead of its
            # two halves, so the copies at row offsets sy.. serve both (conv_pairs.phases_pay)
            self.phased = conv_pairs.phases_pay(self)
            if self.phased:
                self.M = conv_pairs.columns_per_copy(self, plan)
                self.NR, self.hstep = self.R + self.sy, self.sy
                self.shifts = [(r, c * self.dx) for c in range(self.M) for r in range(self.NR)]
            self.pairs = [(0, g * self.M) for g in range(-(-self.S // self.M))]
            self.G = plan.band // (2 * plan.rows)
        elif self.pair > 1:
            self.shifts = [(0, 0), (1, 0)]
            self.pairs = pair_groups(self.R, self.S)
            self.G = plan.band // (2 * plan.rows)
        # X's column at band column 0: the read's offset (a padded read's band starts with zero halo columns), or 0
        # for row pairs of a padded read, whose band holds X's own columns: each copy's rows are then one run per
        # partition in HBM and SBUF alike (one DMA descriptor, not one per row: 1,920 descriptors of 112 B per band
        # of bf16 conv3x3same), and a column tap reaching past X's edge computes the output columns it reaches only,
        # after a tap reaching all of them (conv_pairs.tap_columns)
        if self.pair > 1 and not self.halves and src_chip is None and self.NXB == 1 and self.BX == plan.tile_x \
                and self.ox < 0 and any(conv_pairs.tap_columns(self, s) == (0, self.Wo) for _, s in self.pairs):
            self.col0 = 0
        # folded taps of a padded read likewise hold X's own columns when their tap groups can be formed from taps
        # that reach the same output columns, without more groups (conv_fold.column_groups)
        if self.fold > 1 and self.pair == 1 and src_chip is None and self.NXB == 1 and self.BX == plan.tile_x \
                and self.ox < 0 and not self.mixed:
            same = conv_fold.column_groups(self)
            # (the first group's matmul starts the sum: it must write every output column)
            if same and len(same) <= len(self.groups) and conv_pairs.tap_columns(self, same[0][0][1]) == (0, self.Wo):
                self.groups, self.col0 = same, 0
        self.x_down: Buf | None = None  # conv_vpair's second band buffer (the band being built)
        self.vpair = conv_vpair.applies(self, self.groups)
        if self.vpair:  # the lone taps (r, 0) paired down the rows: 5 matmuls per band, not 6
            self.groups = conv_vpair.paired(self.groups)
        # a plain conv's band likewise (build_conv_cols: one DMA descriptor per channel, not per row)
        if build_conv_cols.applies(self):
            self.col0 = 0
        self.n_groups = len(self.pairs) if self.pair > 1 else self.mixed or len(self.groups)
        # copy j of a folded band sits on partitions [j*Q, j*Q + C): with few copies of few channels (the C = 3
        # first layer's 18 copies, 54 partitions) they are spread over the 128 partitions so that their loads use
        # all 16 DMA engines (8 partitions each) instead of the first 7; the gaps must read as zeros, so the band
        # is then one buffer of SLOTS slots zeroed once before the loops (band b in slot b % SLOTS, the band loop
        # unrolled SLOTS times). A padded read's bands (the stem of stem_maxpool) take slots too: each band then
        # copies its halo from conv_halo's zero tiles into its slot before its loads, as a band buffer does
        self.Q, self.slots, self.slot, self.ymul = self.C, 1, 0, 1
        self.at: tuple[int, ...] = ()  # the copies' first partitions when not j * Q (spread, below)
        if self.halves and src_chip is None and plan.x_bufs != 1 and self.NB >= 2:
            per_slot = self.copy_rows() * self.in_cols() * DTYPE_BYTES[self.hbm[op.x].dtype]
            most = min(self.NB, SLOT_BYTES // per_slot)
            self.slots = slot_count(self.NB, most, self.N)
            self.Q = max(self.C, PMAX // len(self.shifts)) if self.slots > 1 else self.C
            self.slots = max(self.slots, 1)
            # a padded read's band halves (16-bit: not phased) at one image keep one buffer: the slots' memsets (their
            # gaps) delay the first load and nothing amortises them (bf16 stem_maxpool batch 1 34.87 -> 38.86 us with
            # slots, 36.21 without gaps; batch 2 71.8 -> 71.2, batch 8 189.93 -> 165.17 us with them)
            padded = self.ox != 0 or any(self.band_clip(b) != (0, 0) for b in range(self.NB))
            # (likewise 16-bit phases, which only a stem kept on chip takes, stem_chain.py: bf16 stem_maxpool batch 1
            # 30.13 -> 25.78 us with one buffer; fp32 phases have no gaps: 36 copies of 3 channels on 108 partitions)
            narrow = not self.phased or DTYPE_BYTES[self.hbm[op.x].dtype] < 4
            if self.slots > 1 and (not conv_halo.slots_serve(self) or padded and self.N == 1 and narrow):
                self.Q, self.slots = self.C, 1
            # copies packed C apart on the first partitions leave DMA engines idle (the f32 stem: 36 copies of 3
            # channels on 108 partitions, engines 0-13): spread over all of them, the gaps zeroed with the slots
            # (conv_fold.spread); not a padded read at one image, whose slots' memsets then delay its first loads
            # (stem_maxpool f32 batch 1 37.39 -> 45.35 us with them, batch 8 245.39 -> 232.20)
            if self.slots > 1 and self.Q == self.C and not (self.N == 1 and padded):
                self.at = conv_fold.spread(self)
            if self.Q > self.C and self.phased and dst_chip is not None and self.N > 1:  # the stem -> pool chain
                from tilec.compiler import stem_chain  # (late: stem_chain imports this module)
                self.at = stem_chain.placement(self)
        # a padded read's first bands (their rows clipped at X's top) in slots of their own, every slot's halo
        # zeroed once (conv_halo.fixed_slots); the shared slots' count then keeps its reuse distance for the others
        self.fixed = conv_halo.fixed_slots(self) if self.slots > 1 else {}
        if self.fixed:
            self.slots = slot_count(self.NB - len(self.fixed), min(most, self.NB - len(self.fixed)), self.N)
            self.fixed = {band: self.slots + j for j, band in enumerate(self.fixed)}
        # a band of X's own columns (row pairs, above) has no halo but its edge rows is its edge rows: they are copied from a small zero tile made once (zero_rows)
        # instead of zeroing the whole band, so the band's loads (other rows) do not wait for a memset (bf16
        # conv3x3same batch 1: the first load waited 1 us for the GpSimdE memset of its band)
        self.zero_rows: Buf | None = None
        # a padded read's halo: zero tiles its rows and columns are copied from (conv_halo), when they serve
        self.halo_rows: Buf | None = None
        self.halo_cols: Buf | None = None
        self.regroup_sel: Buf | None = None  # conv_pairs.regroup_prelude's selection stationaries
        self.regroup_setup: list[Stmt] = []  # and the statements that build them (after the weights)
        # a batch whose last image is built apart from the image loop, its odd band regrouped (conv_pairs.peels_last)
        self.peel_last = False
        self.last_image = False  # the image being built is that last image
        # a chain whose consumer reads its residual from the producer's band copies (conv_chain.skip_from_bands):
        # the producer's buffer of each peeled band (x_bands), the consumer's view of them (skip_bands, skip_oy)
        self.x_bands: dict[int, Buf] | None = None
        self.skip_bands: dict[int, Buf] | None = None
        self.skip_oy = 0
        if self.col0 != self.ox and (self.fold > 1 or self.pair > 1):  # (a plain band: conv_halo's zero tiles)
            halo = max(count for b in range(self.NB) for _, count in conv_fold.halo_spans(self, b) + [(0, 0)])
            if halo:
                self.zero_rows = Buf(fresh(f"{op.x}_zero_rows"), "sbuf", self.hbm[op.x].dtype,
                                     (self.copy_parts(len(self.shifts)), halo, self.W))
        if self.mixed:  # its base band's halo, copied from a zero tile (conv_mixed.x_band)
            self.zero_rows = conv_mixed.zero_tile(self)
        # a chain's producer writing a folded image (conv_chain.OnChip.copies): its stationary repeats the output
        # channels once per copy (free on TensorE), so each copy's partitions of the accumulator hold all of them
        self.dup = len(dst_chip.copies) if dst_chip is not None else 1
        self.PK = self.pair * plan.tile_k * self.dup  # partitions of the accumulator and the output band
        # stacked bands (schedule.stacks): a 1x1 conv's band of two matmul groups holds group g's input rows on
        # partitions [64g, 64g + C) and its stationary on both halves, so the band's loads reach all 16 DMA engines
        # (64: an access of 33-64 partitions starts at 0 or 64, nki-spec §1.6)
        self.stack = (stacks(op) and self.G == 2 and self.fold == 1 and self.pair == 1 and self.dup == 1
                      and src_chip is None and dst_chip is None and self.CT == 1 and not self.CR and self.KTB == 1
                      and self.XT == 1 and self.NXB == 1 and plan.x_bufs != 1 and plan.hoist_w == "root")
        self.ks = plan.tile_k  # and its channel count
        self.cn = const_names(op, fresh)
        self.words = operand_words(op)
        texts = dict(op.texts)
        self.T = {role: texts.get(role, f"for {v.get(role, role)}") for role in ("n", "k", "c", "y", "x", "r", "s")}
        lines = dict(op.lines)
        roles = ("n", "k", "c", "y", "x", "r", "s", "update", "pool", "relu", "residual", "epilogue")
        self.L = {role: lines.get(role, op.line) for role in roles}

    def consts(self) -> list[tuple[str, int]]:
        p, cn = self.p, self.cn
        wide = [(cn["band_x"], self.BX)] if self.NXB > 1 else []
        return [(cn["k"], p.tile_k), (cn["c"], p.tile_c), (cn["x"], p.tile_x), (cn["rows"], p.rows),
                (cn["band"], p.band)] + wide

    # ---- channel parts: whole tiles, then the remainder tile of a ragged plan ------------------------------------

    def over_k(self, var: str, body: Callable[[str | None, int], list[Stmt]], note: str, line: int) -> list[Stmt]:
        """body(var, tile_k) in a loop over the whole out-channel tiles, then body(None, KR) for the remainder."""
        out = loop(var, self.KT, body(var, self.p.tile_k), note=note, line=line)
        return out + (body(None, self.KR) if self.KR else [])

    def over_c(self, var: str, body: Callable[[str | None, int], list[Stmt]], line: int) -> list[Stmt]:
        """body(var, tile_c) in a loop over the whole in-channel tiles, then body(None, CR) for the remainder."""
        out = loop(var, self.CT, body(var, self.p.tile_c), note=f"{self.T['c']} (tiles of {self.cn['c']})",
                   line=line)
        return out + (body(None, self.CR) if self.CR else [])

    def k_start(self, kv: str | None):
        return a(term(kv, self.p.tile_k, self.cn["k"])) if kv else a(self.KT * self.p.tile_k)

    def c_start(self, cv: str | None):
        return a(term(cv, self.p.tile_c, self.cn["c"])) if cv else a(self.CT * self.p.tile_c)

    @staticmethod
    def tile_index(v: str | None, whole_tiles: int):
        return a(v) if v else a(whole_tiles)

    @staticmethod
    def part(size: int, tile: int):
        """The partitions (or columns) of a tile-sized buffer that a part of `size` channels uses."""
        return full(tile) if size == tile else sl(0, size)

    # ---- buffers -------------------------------------------------------------------------------------------------

    def build(self) -> list[Stmt]:
        fused = f", fused into {self.op.out}" if self.op.fused else ""
        return self.prelude() + [ir.Block(f"main: {self.op.name} by {self.words['bands']}{fused}",
                                          tuple(self.nest(0)), self.line)]

    def per_image(self) -> list[Stmt]:
        """The nest inside the loop over images (the plan's order starts with n): a chain's two convs share it."""
        assert self.p.order[0] == "n", self.p.order
        return self.nest(1)

    def prelude(self) -> list[Stmt]:
        """HBM views, weights, bias: everything before the main nest."""
        op, line, fresh = self.op, self.line, self.fresh
        xshape = (self.N, self.W, self.C) if op.x_transposed else (self.N, self.C, self.H, self.W)
        x4, s1 = hbm_view(self.hbm[op.x], xshape, fresh(f"{op.x}_v"), line)
        if self.src_chip is not None:
            s1 = []  # the input is already in SBUF: no HBM tensor to view
        wshape: tuple[int, ...] = (self.K, self.C // op.groups, self.R, self.S) if op.w_layout == "kc" else \
            (self.K, self.R, self.S) if op.w_layout == "dw" else (self.C, self.K, self.R, self.S)
        wshape = (self.N,) * op.w_batch + wshape  # a batched matmul: one stationary matrix per batch index
        w4, s2 = hbm_view(self.hbm[op.w], wshape, fresh(f"{op.w}_v"), line)
        oshape = (self.N, self.K, self.Ho // self.wy, self.Wo // self.wx)
        o4, s3 = hbm_view(self.hbm[op.out], oshape, fresh(f"{op.out}_v"), line)
        if self.dst_chip is not None and not self.dst_chip.store:
            s3 = []  # the output stays in SBUF: no HBM tensor to view
        self.x4, self.w4, self.o4 = x4, w4, o4
        stmts: list[Stmt] = s1 + s2 + s3
        if conv_batched.vector_rows(self):
            self.x_rows_v, s7 = hbm_view(self.hbm[op.x], (self.N, self.CT, PMAX), fresh(f"{op.x}_rows_v"), line)
            stmts += s7
        if conv_batched.column_rows(self):
            self.o_rows, s6 = hbm_view(self.hbm[op.out], (self.N, self.KT, self.PK), fresh(f"{op.out}_rows_v"), line)
            stmts += s6
        if op.residual:  # (one shared by the batch, select_conv._init_residual: read at batch index 0)
            rshape = (1,) + oshape[1:] if op.residual_shared else oshape
            self.s4, s4 = hbm_view(self.hbm[op.residual], rshape, fresh(f"{op.residual}_v"), line)
            stmts += s4
        if self.phased:  # output rows as (pair, phase): partition 2k + h holds rows 2i + h (a permuted view)
            self.o6, s5 = hbm_view(self.hbm[op.out], (self.N, self.K, self.Ho // 2, 2, self.Wo),
                                   fresh(f"{op.out}_pairs"), line)
            stmts += s5 if self.dst_chip is None else []  # (a phases image on chip: stem_chain.py)
        elif self.halves:  # a band's rows as (half, row): its output band (partition 2k + h) moves in one DMA
            hshape = (self.N, self.K, self.NB, 2, self.p.band // 2, self.Wo)
            self.o6, s5 = hbm_view(self.hbm[op.out], hshape, fresh(f"{op.out}_halves"), line)
            stmts += s5
            if op.residual:
                self.s6, s6 = hbm_view(self.hbm[op.residual], hshape, fresh(f"{op.residual}_halves"), line)
                stmts += s6
        elif self.pair > 1 and self.dst_chip is None:
            # row pairs: output rows as (pair, phase), so a band's two phases move in one DMA (conv_pairs.rows_view)
            pshape = (self.N, self.K, self.Ho // 2, 2, self.Wo)
            self.o5, s5 = hbm_view(self.hbm[op.out], pshape, fresh(f"{op.out}_pairs"), line)
            stmts += s5 + (conv_pairs.regroup_prelude(self) if conv_pairs.regroups(self) else [])
            if op.residual and self.skip_bands is None:
                self.s5, s5 = hbm_view(self.hbm[op.residual], pshape, fresh(f"{op.residual}_pairs"), line)
                stmts += s5
        if self.p.hoist_w == "root":
            stmts.append(ir.Block(f"{self.words['w']}: contraction-major, resident in SBUF",
                                  tuple(conv_weights.weights(self, False)),
                                  line))
        stmts += [] if self.peel_last else self.regroup_setup  # (else in the last image: conv_chain._built)
        if op.bias and op.bias_role == "x":
            label = f"bias {op.bias}: a row along {dict(op.vars)['x']}, copied to every partition once"
            stmts.append(ir.Block(label, tuple(conv_weights.bias_row(self)), line))
        elif op.bias:
            stmts.append(ir.Block(f"bias {op.bias}: one column per {self.words['k_tile']}",
                                  tuple(conv_weights.bias(self)), line))
        if op.epilogue:  # the fused element-wise chain's vectors (eviction_fusion)
            stmts += conv_epilogue.epilogue_columns(self)
        if conv_epilogue.batch_residual(self):
            stmts.append(Alloc(conv_epilogue.residual_all(self), line=self.L["residual"]))
        if self.zero_rows is not None:
            stmts.append(Alloc(self.zero_rows, zero=True, line=line))
        elif self.p.x_bufs != 1 and self.src_chip is None and not op.x_transposed and not self.mixed:
            stmts += conv_halo.zero_tiles(self, force=self.slots > 1)
        if self.slots > 1:  # the band slots, their gaps zeroed once (a memset each: they run side by side)
            allocs: list[Stmt] = []
            # each slot's halo copies right after its memset, in the order the bands use the slots: the first band's
            # loads then wait for its own slot's memset and halo, not for every slot's memset before any halo
            # (stem_maxpool b8: f32 232.20 -> 224.15 us, bf16 113.80 -> 110.25)
            used = conv_halo.first_used(self)
            for self.slot in used + [s for s in range(self.slots + len(self.fixed)) if s not in used]:
                allocs.append(Alloc(self.x_band_buf(), zero=self.Q > self.C or bool(self.at), line=line))
                if self.slot in used:
                    allocs += conv_halo.slot_halo(self, self.x_band_buf(), self.slot)
            self.slot = 0
            gaps = ", gaps zeroed once" if self.Q > self.C or self.at else ""
            own = f"; the first band in slot {self.slots}, halos zeroed once" if self.fixed else ""
            apart = "spread over every DMA engine" if self.at else f"{self.Q} partitions apart"
            stmts.append(ir.Block(f"band slots of {op.x} (band {self.slots}*y_b + j in slot j{own}), copies {apart}"
                                  f"{gaps}", tuple(allocs), line))
        elif self.p.x_bufs == 1 and self.src_chip is None:
            stmts.append(Alloc(self.x_band_buf(), line=line))
        if conv_batched.once_per_image(self, True):  # refilled whole by one DMA per batch index: the allocator
            stmts.append(Alloc(self.wt_buf(False), line=self.L["update"]))  # renames it (perf load_versions)
            self.wt_declared = True
        self.w_rows = conv_weights.rows_once(self)
        if self.w_rows is not None:
            stmts.append(Alloc(self.w_rows, line=self.L["update"]))
        if op.x_transposed and op.w_batch and self.src_chip is None and not conv_band.x_by_dma(self):
            # B's rows too (A B^T), as rows_once says
            jb = best_divisor(self.in_cols(), PMAX)
            self.x_rows = Buf(fresh(f"{op.x}_block_rows"), "sbuf", self.hbm[op.x].dtype, (jb, self.C))
            stmts.append(Alloc(self.x_rows, line=self.L["update"]))
        return stmts

    def wt_buf(self, local: bool) -> Buf:
        k = (self.p.tile_k if local else self.K) * self.dup
        c = PMAX // 2 + self.p.tile_c if self.stack else self.p.tile_c  # stacked: from partition 0 and 64 on
        if self.op.w_layout == "dw":  # one fp32 column per tap and channel: the per-partition scale of ScalarE
            name = f"{self.op.w}_col" if not local or self.kv else f"{self.op.w}_col_rest"
            return Buf(self.fresh(name), "sbuf", "f32", (self.p.tile_k, 1 if local else self.KTB, self.R, self.S))
        if self.fold > 1:  # one stationary block of (taps of the group) x C partitions per tap group
            name = f"{self.op.w}_T" if not local or self.kv else f"{self.op.w}_T_rest"
            return Buf(self.fresh(name), "sbuf", self.hbm[self.op.w].dtype,
                       (self.fold_parts(), self.n_groups, self.pair * k))
        # the remainder's own weights (hoisted on their own, out of loops the whole tiles' loads stay inside)
        name = f"{self.op.w}_T" if not local or self.kv else f"{self.op.w}_T_rest"
        if local and self.wt_declared:
            name = f"{name}_tile"
        shape = (c, self.CTB, self.R, self.S, k) if self.op.w_layout == "kc" else \
            (c, self.CTB, k, self.R, self.S)
        return Buf(self.fresh(name), "sbuf", self.hbm[self.op.w].dtype, shape)

    def x_band_buf(self) -> Buf:
        if self.src_chip is not None:  # the whole image, already in SBUF (with its zero halo)
            return self.src_chip.buf
        parts = self.fold_parts() if self.fold > 1 else \
            PMAX // 2 + self.p.tile_c if self.stack else self.p.tile_c
        rows = self.copy_rows() if self.fold > 1 else self.in_rows()
        slot = str(self.slot) if self.slots > 1 else ""  # band slot j: band slots * y_b + j
        kept = self.x_bands if self.yb[0] is None else None  # kept for the image: a name per band
        if kept is not None or self.band_tag:
            slot = str(self.yb[1])
        buf = Buf(self.fresh(f"{self.op.x}_{self.words['x_buf']}{slot}"), "sbuf", self.hbm[self.op.x].dtype,
                  (parts, self.mixed or self.CTB, rows, self.in_cols()))
        if kept is not None:
            kept[self.yb[1]] = buf
        return buf

    def fold_parts(self) -> int:
        """Partitions of a folded band and stationary: its copies', or with mixed taps a whole tile's."""
        return PMAX if self.mixed else self.copy_parts(len(self.shifts))

    def copy_parts(self, copies: int) -> int:
        """Partitions of the first `copies` band copies (the last one's C partitions included)."""
        return self.copy_at(copies - 1) + self.C

    def copy_at(self, j: int) -> int:
        """The first partition of band copy j."""
        return self.at[j] if self.at else j * self.Q

    def in_rows(self) -> int:
        """Input rows behind one band of output rows: (BAND - 1) * stride + (R - 1) * dilation + 1 (stacked bands:
        behind one matmul group, each group on its own partitions)."""
        return ((self.p.rows if self.stack else self.p.band) - 1) * self.sy + (self.R - 1) * self.dy + 1

    def copy_rows(self) -> int:
        """Rows of each band copy: the band's input rows, or with band halves the rows one tap of half the band
        reads (every stride-th row of X: a strided window's copies hold only the rows it reads)."""
        return self.p.band // 2 if self.halves else self.in_rows()

    def in_cols(self) -> int:
        """Input columns of a band: whole rows of X (from the window's offset on: a padded read's band includes
        its left and right halo), or the columns behind one column band."""
        reach = (self.BX - 1) * self.sx + (self.S - 1) * self.dx + 1
        if self.NXB == 1 and self.col0 == 0 and (reach <= self.W or self.ox < 0):
            return self.W
        return reach

    def clip(self, start: int, size: int, extent: int) -> tuple[int, int]:
        """(halo before, halo after): the part of [start, start + size) outside [0, extent)."""
        return max(0, -start), max(0, start + size - extent)

    def band_clip(self, band: int) -> tuple[int, int]:
        if self.src_chip is not None:  # the on-chip image holds its halo: no band is peeled
            return (0, 0)
        return self.clip(band * self.p.band * self.sy + self.oy, self.in_rows(), self.H)

    def _check_halo(self) -> None:
        """Column bands (`split conv.x`) of a padded read would each need their own halo: not compiled yet."""
        if self.NXB > 1 and any(self.clip(b * self.BX * self.sx + self.ox, self.in_cols(), self.W) != (0, 0)
                                for b in range(self.NXB)):
            raise TilecError(f"column bands of the zero-padded read of {self.op.x} are not compiled yet",
                             self.op.span, f"drop `split {self.op.name}.{dict(self.op.vars).get('x', 'x')}` "
                                           "(padded reads take whole rows per band)")
        if self.op.w_batch and self.p.hoist_w == "root":
            raise TilecError(f"{self.op.w} has one matrix per batch index: it cannot be loaded once for all of them",
                             self.op.span, f"drop `hoist {self.op.w}, root`")
        if self.p.x_bufs == 1 and self.src_chip is None and (
                self.ox or any(self.band_clip(b) != (0, 0) for b in range(self.NB))):
            raise TilecError(f"one buffer for the input bands of the zero-padded read of {self.op.x} is not "
                             "compiled yet (each band zeroes its halo)", self.op.span,
                             f"drop `buffers {self.op.x}, 1`")

    def y_at(self, coef: int, name: str = "") -> "ir.Aff":
        """The current row band's index times coef: y_b*coef (+ its first band's), or a peeled band's constant."""
        var, base = self.yb
        if var and self.ymul > 1:  # an unrolled band loop (band slots): band ymul * y_b + base
            return a(term(var, coef * self.ymul), base * coef)
        return a(term(var, coef, name), base * coef) if var else a(base * coef)

    def step(self, var: str, size: int, name: str, stride: int):
        """The index term var * size * stride (named after its constant only when the stride is 1)."""
        return term(var, size, name) if stride == 1 else term(var, size * stride)

    # ---- phases --------------------------------------------------------------------------------------------------

    def nest(self, i: int) -> list[Stmt]:
        order, V = self.p.order, self.var
        if i == len(order):
            return self.out_band()
        role = order[i]
        notes = {"n": self.T["n"], "k": f"{self.T['k']} (tiles of {self.cn['k']})",
                 "y": f"{self.T['y']} (bands of {self.cn['band']} rows)"}
        if role == "k":
            def part(kv: str | None, ks: int) -> list[Stmt]:
                self.kv, self.ks = kv, ks
                return self.nest(i + 1)
            self.o_tiles = conv_batched.tiles_band(self, i)
            # mixed taps' band (conv_mixed: a load and 13 on-chip copies) made once for a ragged K's two parts
            # (each part built its own: conv_odd bf16 b1 20.2 us), when the parts are the innermost loop
            # (likewise a plain band whose one-channel remainder reads it spread: conv_spread)
            shared = (self.mixed > 0 or conv_spread.spreads_plain(self, self.KR)) and self.KR > 0 \
                and i == len(order) - 1 and self.src_chip is None
            band = [ir.Block(conv_batched.load_labels(self)[1], tuple(conv_band.x_band(self)), self.line,
                             hoist=True)] if shared else []
            self.band_shared = shared
            lead = conv_batched.lead_tile(self, part, notes["k"]) if self.o_tiles is not None else None
            out = lead if lead is not None else self.over_k(V["k"], part, notes["k"], self.L["k"])
            self.kv, self.ks = V["k"], self.p.tile_k
            self.band_shared = False
            if self.o_tiles is None:
                self.o_rows = None  # (rows_store stores tiles_band's band only)
            if self.o_tiles is not None:
                out = [Alloc(self.o_tiles, line=self.line)] + out
                out += conv_batched.rows_store(self, self.line) if self.o_rows is not None else []
            return band + out
        if role == "y":
            return self.row_bands(i, notes["y"])
        return loop(V[role], self.N, self.nest(i + 1), note=notes[role], line=self.L[role])

    def row_bands(self, i: int, note: str) -> list[Stmt]:
        """The loop over row bands; bands whose input rows run past X's edge (a padded read's first and last bands)
        are peeled off it, each built with its own constant halo."""
        V = self.var

        def part(var: str | None, first: int) -> list[Stmt]:
            self.yb = (var, first)
            # column bands (only when a whole row band does not fit) sit inside the row bands
            return loop(V["xb"], self.NXB, self.nest(i + 1), note=f"{self.T['x']} (bands of {self.cn['band_x']})",
                        line=self.L["x"])
        inner = [b for b in range(self.NB) if self.band_clip(b) == (0, 0) and self.skip_bands is None]
        if inner and inner[-1] == self.NB - 1 and conv_split.splits_tail(self):  # the kernel's last band on its own
            inner.pop()
        lo, hi = (inner[0], inner[-1] + 1) if inner else (self.NB, self.NB)
        out = self.peeled(part, range(lo))
        if hi > lo and self.slots > 1:  # band slots: the loop unrolled, band slots * y_b + lo + j in slot_of(lo + j)
            ns, whole = self.slots, (hi - lo) // self.slots * self.slots
            body: list[Stmt] = []
            for j in range(ns if whole else 0):
                self.slot, self.ymul = self.slot_of(lo + j), ns
                body += part(V["y"], lo + j)
            self.ymul = 1
            if whole:
                out += loop(V["y"], whole // ns, body,
                            note=f"{note}, {ns} at a time (slots of {self.op.x}'s band buffer)", line=self.L["y"])
            for b in range(lo + whole, hi):
                self.slot = self.slot_of(b)
                out += part(None, b)
            lo = hi
        if hi > lo:
            note_mid = note if (lo, hi) == (0, self.NB) else f"{note}, bands {lo}..{hi - 1}"
            whole = self.NB if (lo, hi) == (0, self.NB) else hi - lo  # all bands: NB (named SIZE_Ho // BAND)
            out += loop(V["y"], whole, part(V["y"], lo), note=note_mid, line=self.L["y"])
        out += self.peeled(part, range(hi, self.NB))
        self.yb, self.slot = (V["y"], 0), 0
        return out

    def peeled(self, part: Callable[[str | None, int], list[Stmt]], bands: range) -> list[Stmt]:
        """Consecutive peeled bands, each built on its own; with a spread remainder (its stage 1 on TensorE in the
        band's block) each band's block runs a band ahead under its own names (conv_spread.ahead)."""
        ahead = len(bands) > 1 and conv_spread.spreads_plain(self, self.KR) and self.src_chip is None
        parts = []
        for b in bands:  # (band slots: slot_of)
            self.slot, self.band_tag = self.slot_of(b), "1" if ahead else ""
            parts.append(part(None, b))
        self.band_tag = ""
        return conv_spread.ahead(parts) if ahead else [s for p in parts for s in p]

    @property
    def g_rows(self) -> int:
        """Rows (pairs) from group g to g + 1: the plan's, or the whole group's while half_groups builds a part."""
        return self.g_step or self.p.rows

    def slot_of(self, band: int) -> int:
        """Band slot of band `band` (of an image): a first band's own (conv_halo.fixed_slots), else the shared
        slots in turn from the first band without its own."""
        return self.fixed.get(band, (band - len(self.fixed)) % self.slots)

    def out_band(self) -> list[Stmt]:
        """The innermost level: loads are placed here and lifted by the `hoist` pass as far as they can go."""
        p, line, V, op = self.p, self.line, self.var, self.op
        loads: list[Stmt] = []
        w_label, x_label = conv_batched.load_labels(self)
        if p.hoist_w == "k":
            local = not conv_batched.w_per_image(self)
            loads.append(ir.Block(w_label, tuple(conv_weights.weights(self, local)), line, hoist=True))
        extents = {"n": self.N, "y": self.NB, "k": self.KT if self.kv else 1}  # the remainder has no k loop
        pin = V[p.x_pin] if p.x_pin and extents[p.x_pin] > 1 else ""
        if self.src_chip is None and not self.band_shared:
            loads.append(ir.Block(x_label, tuple(conv_band.x_band(self)), line, hoist=True, pin=pin))
        if self.o_tiles is not None:  # this tile's slot of the batch index's band (tiles_band)
            return loads + conv_batched.tile_slot_body(self, line)
        ob = Buf(self.fresh(f"{op.out}_{self.words['out_buf']}"), "sbuf", self.hbm[op.out].dtype,
                 (self.PK, p.band // self.wy // self.pair, self.BX // self.wx))
        self.o_band = ob
        if op.residual and self.skip_bands is None:
            loads.append(ir.Block(f"{op.residual}: the band added on the eviction",
                                  tuple(conv_epilogue.residual_band(self)),
                                  self.L["residual"], hoist=True))
        group = loop(V["g"], self.G, loop(V["x"], self.XT, self.group(),
                                          note=f"{self.T['x']} (tiles of {self.cn['x']})",
                                          line=self.L["x"]),
                     note=f"{self.T['y']} (groups of {self.cn['rows']} rows in the band)", line=self.L["y"])
        line = self.L["pool"] if op.pool else line
        if self.dst_chip is not None:  # the eviction writes the on-chip image; a store only if T is read elsewhere
            return loads + group + conv_epilogue.chip_store(self)
        if self.phased:  # partition 2k + h, row i of the band: row 2i + h of the output (one DMA)
            return loads + [Alloc(ob, line=line)] + group + [
                Dma(View(self.o6, conv_pairs.phases_region(self), perm=(0, 2, 1, 3)), whole(ob), line)]
        if self.halves:  # partition 2k + h, row i of the band: row h * BAND / 2 + i of the output (one DMA)
            return loads + [Alloc(ob, line=line)] + group + [Dma(View(self.o6, conv_pairs.halves_region(self)),
                                                                 whole(ob), line)]
        if conv_split.splits(self):  # the kernel's last band in two groups, each stored once evicted
            return loads + [Alloc(ob, line=line)] + conv_split.split_groups(self, ob)
        if self.pair > 1:  # partition h*K + k, row i of the band: row 2i + h of the output (one DMA)
            regroup = conv_pairs.regroup_band(self)
            stores = conv_pairs.regroup_store(self, ob) if regroup else [
                Dma(conv_pairs.rows_view(self, self.o5), whole(ob), line)]
            if regroup and conv_split.splits_half(self):
                group = loop(V["g"], self.G, conv_split.half_groups(self),
                             note=f"{self.T['y']} (groups of {self.cn['rows']} rows in the band)", line=self.L["y"])
            return loads + [Alloc(ob, line=line)] + group + conv_epilogue.band_relu(self, ob) + stores
        if self.group_stores():
            rows = sl(a(term(V["g"], p.rows, self.cn["rows"])), p.rows)
            store = Dma(View(self.o4, (a(V["n"]), sl(self.k_start(self.kv), self.ks),
                                       sl(self.y_at(p.band).plus(rows.start), p.rows), full(self.BX))),
                        View(ob, (self.part(self.ks, p.tile_k), rows, full(ob.shape[2]))), line)
            group = loop(V["g"], self.G, loop(V["x"], self.XT, self.group(),
                                              note=f"{self.T['x']} (tiles of {self.cn['x']})",
                                              line=self.L["x"]) + [store],
                         note=f"{self.T['y']} (groups of {self.cn['rows']} rows in the band)", line=self.L["y"])
            return loads + [Alloc(ob, line=line)] + group
        store = Dma(View(self.o4, (a(V["n"]), sl(self.k_start(self.kv), self.ks),
                                   sl(self.y_at(p.band // self.wy), p.band // self.wy),
                                   sl(a(term(V["xb"], self.BX // self.wx)), self.BX // self.wx))),
                    View(ob, (self.part(self.ks, p.tile_k), full(ob.shape[1]), full(ob.shape[2]))), line)
        return loads + [Alloc(ob, line=line)] + group + [store]

    def group_stores(self) -> bool:
        """At batch 1, a band of several accumulation groups stored group by group, each group's rows as soon as
        they are evicted, instead of once after its last group: the kernel's last store then waits for one group
        and moves a group's bytes (families batch 1, e.g. dilated3x3 f32 82.6 -> 82.0 us, conv_residual bf16 22.4
        -> 22.2). Not from batch 2 on: a group's store waits for the previous group's (their HBM rows interleave
        over the channels, and the model orders such writes: tilec/perf/deps.py), and on a trigger stream shared
        with the next band's loads that wait held them back (conv_residual bf16 batch 8: 45.2 -> 48.9 us).
        Whole-width bands, no pool, no folded taps (depthwise_mult3x3 bf16 batch 1: 16.71 -> 18.56 us with them)."""
        return (self.N == 1 and self.pair == 1 and self.fold == 1 and self.G > 1 and self.XT == 1
                and self.NXB == 1 and self.wy == self.wx == 1 and not self.op.pool and self.dst_chip is None)

    def group(self) -> list[Stmt]:
        p, line, V, op = self.p, self.line, self.var, self.op
        acc = Buf(self.fresh(f"{op.name}_acc{self.tag}"), "psum", "f32", (self.PK, p.rows, p.tile_x)) \
            if self.acc_in is None else self.acc_in[0]
        accv = View(acc, (self.part(self.ks, p.tile_k) if self.pair == self.dup == 1 else full(self.PK),
                          full(p.rows) if self.acc_in is None else sl(self.acc_in[1], p.rows), full(p.tile_x)))
        alloc = [Alloc(acc, zero=True, line=line)] if self.acc_in is None else []  # (half_groups allocates it)
        r, s = V["r"], V["s"]
        local = p.hoist_w == "k" and not conv_batched.w_per_image(self)
        wt = self.wt_buf(local)
        kidx = self.part(self.ks, p.tile_k) if local else sl(self.k_start(self.kv), self.ks)
        if self.dup > 1:  # every copy of the output channels (one k-tile)
            kidx = full(self.PK)
        sy, sx = self.sy, self.sx  # a strided window reads every sy-th row / sx-th column of the band
        tap_r, tap_s = term(r, self.dy), term(s, self.dx)  # a dilated window steps its taps by the dilation
        # (stacked bands: group g's rows start at row 0 of its partition half)
        first = a(tap_r) if self.stack else a(self.step(V["g"], self.g_rows, self.cn["rows"], sy), tap_r,
                                                         self.g0 * sy)
        if self.src_chip is not None:  # the image in SBUF is read at the band's rows (a loaded band starts at 0)
            first = first.plus(self.y_at(p.band * sy, self.cn["band"] if sy == 1 else ""))
        rows = sl(first, p.rows, sy, self.cn["rows"] if sy == 1 else "")
        cols = sl(a(self.step(V["x"], p.tile_x, self.cn["x"], sx), tap_s), p.tile_x, sx,
                  self.cn["x"] if sx == 1 else "")

        def matmul(cv: str | None, cs: int, tap: build_conv_cols.TapColumns | None = None) -> list[Stmt]:
            cp, ci = self.part(cs, p.tile_c), self.tile_index(cv, self.CT)
            if self.stack:  # group g's input and stationary on partitions [64g, 64g + C) (aligned starts: §1.6)
                cp = sl(a(term(V["g"], PMAX // 2)), cs, 1, self.cn["c"])
            ts, xcols, acc_at = a(s), cols, accv
            if tap is not None:  # a band of X's own columns: a static tap column over the output columns it reaches
                (col, (x0, n)) = tap
                ts, xcols = a(col), sl(x0 * sx + col * self.dx + self.ox, n, sx)
                acc_at = View(accv.buf, accv.idx[:-1] + (sl(x0, n),))
            stat = View(wt, (cp, ci, a(r), ts, kidx)) if op.w_layout == "kc" else View(wt, (cp, ci, kidx, a(r), ts))
            return [Matmul(acc_at, stat, View(self.x_band_buf(), (cp, ci, rows, xcols)), self.L["update"])]
        extents = {"r": self.R, "s": self.S}
        notes = {"r": self.T["r"], "s": self.T["s"]}

        def taps(level: int, cpart: tuple[str | None, int]) -> list[Stmt]:
            if level == len(p.taps):
                return matmul(*cpart)
            role = p.taps[level]  # the `unroll` pass turns the schedule's unrolled loops static
            if role == "c" and self.diagonal:
                return taps(level + 1, (self.kv, self.ks))
            if role == "c":
                return self.over_c(V["c"], lambda cv, cs: taps(level + 1, (cv, cs)), self.L["c"])
            return loop(V[role], extents[role], taps(level + 1, cpart), "affine", note=notes[role], line=self.L[role])
        if op.w_layout == "dw":
            return build_depthwise.depthwise_taps(self)
        if self.halves:
            return alloc + conv_pairs.matmul_halves(self, accv, wt) + self.epilogue(accv)
        if self.pair > 1:
            return alloc + conv_pairs.matmuls_paired(self, accv, wt) + self.epilogue(accv)
        if self.fold > 1:
            return alloc + \
                conv_vpair.matmuls(self, conv_fold.matmuls_folded(self, accv, wt, kidx)) + self.epilogue(accv)
        if self.kv is None and conv_spread.spreads_plain(self, self.ks):  # the remainder's taps spread
            return alloc + conv_spread.matmul_plain(self, accv) + self.epilogue(accv)
        if self.col0 != self.ox:  # a plain band of X's own columns (build_conv_cols)
            return alloc + build_conv_cols.taps(self, matmul) + self.epilogue(accv)
        return alloc + taps(0, (V["c"], p.tile_c)) + self.epilogue(accv)

    def epilogue(self, acc: View) -> list[Stmt]:
        p, V = self.p, self.var
        kp = self.part(self.ks, p.tile_k) if self.pair == 1 else full(self.PK)
        rows_o, cols_o = p.rows // self.wy, p.tile_x // self.wx
        rname, cname = (self.cn["rows"] if self.wy == 1 else ""), (self.cn["x"] if self.wx == 1 else "")
        band, slot = (self.o_tiles, (self.tile_index(self.kv, self.KT),)) if self.o_tiles is not None else \
            (self.o_band, ())  # a batched matmul's band holds a slot per out-channel tile (tiles_band)
        dst = View(band, (kp,) + slot + (sl(a(term(V["g"], self.g_rows // self.wy, rname), self.g0), rows_o),
                                         sl(a(term(V["x"], cols_o, cname)), cols_o)))
        if self.dup > 1:  # each copy of the output channels to its copy of the image, at its shift
            return [st for dst, src, kp in conv_fold.chip_copies(self, acc) for st in conv_epilogue.evict_chain(
                self, dst, src, "relu" if self.op.relu else "copy",
                View(self.bias_col, (kp, sl(0, 1))) if self.op.bias else None, kp)]
        if self.dst_chip is not None and self.dst_chip.paired:  # each partition half to its copy of the image
            return [st for dst, kp in conv_pairs.chip_halves(self)
                    for st in conv_epilogue.epilogue_to(self, dst, View(acc.buf, (kp,) + acc.idx[1:]), kp)]
        if self.dst_chip is not None and self.dst_chip.phases:  # row i of part h: the image's row band / 2 + i
            first = a(term(V["g"], rows_o, rname)).plus(self.y_at(p.band // 2))
            cols = sl(a(term(V["x"], cols_o, cname), -self.dst_chip.col0), cols_o)
            dst = View(self.dst_chip.buf, (full(self.PK), sl(first, rows_o), cols))
        elif self.dst_chip is not None:  # straight into the next conv's input image, at its halo offset
            first = a(term(V["g"], rows_o, rname)).plus(self.y_at(p.band, self.cn["band"]))
            dst = View(self.dst_chip.buf, conv_epilogue.chip_rows(self, first, rows_o) +
                       (sl(a(term(V["x"], cols_o, cname), -self.dst_chip.col0), cols_o),))
        return conv_epilogue.epilogue_to(self, dst, acc, kp)

    def row_tile(self, bc: Buf, kp) -> View:
        """The output tile's columns of a row replicated on every partition (conv_weights.row_broadcast)."""
        V, p = self.var, self.p
        col = a(self.step(V["xb"], self.BX, self.cn["band_x"], 1), term(V["x"], p.tile_x, self.cn["x"]))
        return View(bc, (kp, sl(col, p.tile_x)))

    def evict(self, dst: View, acc: View, func: str, bias: View | None) -> list[Stmt]:
        """PSUM -> SBUF in one pass (activation with the per-partition bias column); a row bias is a tensor_tensor
        add reading PSUM instead (activation only adds columns), followed by the relu in place."""
        p, V, op, line = self.p, self.var, self.op, self.line
        clamp: list[Stmt] = [Scalar(dst, dst, "minimum", op.clamp, line)] if op.clamp is not None else []  # relu6
        if func == "copy" and bias is None and op.scale == 1.0 and not clamp and self.kv is not None \
                and conv_spread.evicts_on_vector(self):
            return [ir.Copy(dst, acc, line)]
        if not (op.bias and op.bias_role == "x"):  # func(scale * acc + bias): a negated product's sign first
            return [Act(dst, acc, func, bias, op.scale, line)] + clamp
        bc = self.row_tile(self.bias_bc, self.part(self.ks, p.tile_k))
        out: list[Stmt] = [Binary(dst, acc, bc, "add", line)] if op.scale == 1.0 else \
            [Binary(dst, bc, acc, "subtract", line)] if op.scale == -1.0 else \
            [Act(dst, acc, "copy", None, op.scale, line), Binary(dst, dst, bc, "add", line)]  # the factor first
        return out + ([Act(dst, dst, "relu", None, 1.0, self.L["relu"])] if op.relu else []) + clamp
