"""The schedule language: directives (data, printable back to text) folded into one plan record per operation.

A schedule is a sequence of `Directive(name, args)` (from the `.tl` `schedule:` section or `--schedule FILE`). The
default schedule (`default_directives`) is itself a directive list, so `tilec explain` can print it and a user can
copy and edit it. Each directive is applied by one function in `directives.APPLY` (a table keyed by name, as in
tinygrad's `Opt`), which checks legality and returns the updated plan. Directives and their meaning:

    tile OP.v, N        tile size of loop v           conv: k (out channels, on partitions, <= 128), c (in channels,
                                                      contraction, <= 128), y (output rows per matmul), x (columns
                                                      per matmul); eltwise: free elements per tile (with a
                                                      broadcast: of the free dims; <= 512 with a row broadcast),
                                                      or, v a loop of a broadcast layout's partition run, the
                                                      partitions per tile (<= 128);
                                                      transpose: i/j block size (<= 128); pool: b (channels on
                                                      partitions); reduce: a kept loop sets the rows per
                                                      partition tile (<= 128), a reduced loop the elements per
                                                      partition of one tensor_reduce (of the flattened dims)
    split OP.v, N       rows per band                 conv.y: output rows per input band / output DMA (rows per
                                                      matmul shrink to a divisor of it); conv.x: output columns
                                                      per input band (when whole rows do not fit); transpose.i/j:
                                                      128-blocks per DMA; pool.i: output rows per tile
    split W, OP.v       weight DMA granularity        W a conv's out-channel-major weights: OP.k one DMA per
                                                      out-channel tile (default), OP.c one per (out, in) tile block
                                                      (the first transposes start after a smaller load)
    reorder OP, a, b..  loop order                    conv outer loops (n, y, k) or its accumulation loops (c, r, s)
    partition OP.v      bind v to partitions          only legal where the engines allow it (conv.k, pool.b, ...)
    compute_at P, C.v   fusion point                  C.n: a whole image of P live per consumer image; C.i: one
                                                      pooled row per matmul group; C.j: one pooled element per
                                                      matmul; `root`: not fused, P goes through HBM (default:
                                                      fused, bands of rows chosen for big DMAs)
    place P, MEM        memory of a tensor            sbuf (fused) | hbm (not fused)
    hoist T, OP.v       where T's preparation goes    weights: `root` (once, before all loops) or inside OP.k;
                                                      input bands: kept inside OP.n / OP.y / OP.k
    buffers T, N        buffers of T in flight        1: one buffer reused (serialises); >= 2: one per iteration
                                                      (eltwise: T an operand or the output, only 1: in-loop tiles
                                                      are already rotated by the NKI compiler)
    unroll OP.v         fully unroll loop v           nl.static_range (conv: c, r, s; eltwise: the tile loop v runs
                                                      through; in NKI 0.6 every loop is a `range` unrolled when
                                                      traced, so only the 0.1 form's text changes)
    method OP, M        transpose engine              pe (nc_transpose) | dma (dma_transpose)
"""
from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from tilec.compiler.ir import DTYPE_BYTES
from tilec.compiler.ops import ColumnReduceOp, ConvOp, EltwiseOp, Op, PoolOp, ReduceOp, TransposeOp
from tilec.lang import syntax as sx
from tilec.lang.plan import reads
from tilec.target import Target, invariant

# Limits every NeuronCore generation shares (tilec/target.py): plans use them as constants.
PMAX, MOVING_FMAX, PSUM_BANK = invariant("pmax"), invariant("moving_fmax"), invariant("psum_bank_bytes")
PSUM_F32 = PSUM_BANK // 4  # fp32 columns of one PSUM bank
PSUM_BANKS = invariant("psum_banks")  # PSUM banks per partition
# The compiler plans SBUF within the target's usable bytes less this margin: headroom for the NKI allocator's
# alignment and buffer rotation, which tilec's byte count does not see (on trn2: 224 - 32 = 192 KiB, the budget
# every generated kernel has been verified and measured with).
SBUF_PLANNING_MARGIN = 32 * 1024
# bytes per partition of a DMA: the recommended minimum (nki-spec §2.5, DMABW/DMAINTRO: >= 2 KiB per partition)
DMA_MIN_ROW = 2048


def sbuf_budget(target: Target) -> int:
    """SBUF bytes per partition the compiler lets one kernel allocate on `target`."""
    return target.sbuf_usable - SBUF_PLANNING_MARGIN


@dataclass(frozen=True)
class ConvPlan:
    tile_k: int
    tile_c: int
    tile_x: int
    rows: int  # output rows per matmul group (PSUM tile)
    band: int  # output rows per input band
    band_x: int = 0  # output columns per input band (0: whole rows)
    order: tuple[str, ...] = ("n", "y", "k")
    taps: tuple[str, ...] = ("c", "r", "s")
    fused: bool = True
    hoist_w: str = "root"  # root | k
    w_split: str = "k"  # weight DMAs: one per out-channel tile (k) | one per (out-, in-channel) tile block (c)
    x_pin: str = ""  # keep the input band load inside this loop (n | y | k); "" = as far out as it goes
    x_bufs: int = 2
    unroll: tuple[str, ...] = ()
    fold: int = 1  # filter taps per matmul, folded into the contraction partitions (in-channels x taps <= 128)
    pair: int = 1  # output row phases on the stationary's column halves (2: K = 32 or 64, folded taps; build_conv)


@dataclass(frozen=True)
class PoolPlan:
    tile_b: int
    band: int  # output rows per tile
    blocks: int = 1  # a window pool's output rows cut into this many blocks, each on its own partitions (n*c <= 64)
    across: bool = False  # the blocks with several partition tiles of channel rows (pool_costs.across_blocks)
    images: int = 1  # channel rows per partition, stacked as rows (pool_stack.py; band: one image's output rows)

    def row_blocks(self, op: PoolOp) -> int:
        """The blocks a window pool's kernel makes: with one partition tile of every channel row, or `across` while
        the blocks fit the partitions (a `tile` directive may have widened the tile); an average that excludes the
        padding has none (its counts differ between blocks)."""
        assert op.window is not None
        spread = self.tile_b == op.dim("B") or (self.across and self.tile_b * self.blocks <= PMAX)
        return self.blocks if spread and op.window.count == "window" else 1


@dataclass(frozen=True)
class TransposePlan:
    tile: int  # rows of a block (a divisor of M, on the partitions of the load)
    bi: int
    bj: int
    method: str = "pe"
    tile_j: int = 0  # columns of a block (a divisor of N); 0: square blocks of `tile`
    ragged: bool = False  # blocks of min(128, M) x min(128, N) and one more block for the rest of each dim

    @property
    def tj(self) -> int:
        return self.tile_j or self.tile


@dataclass(frozen=True)
class EltwisePlan:
    parts: int
    free: int
    # `unroll Y.v`: the tile loops made static ranges, by the part of the layout v is in: "o" (outer loops of a
    # broadcast layout), "pt" (partition tiles), "t" (free tiles; every loop of flattened data)
    unroll: tuple[str, ...] = ()
    single: tuple[str, ...] = ()  # `buffers X, 1`: tensors whose tiles use one buffer for the whole nest
    # `reorder Y, ...` of a broadcast layout: the free tiles outside the partition tiles (True) or inside (False);
    # None: the rule's choice (outside only for broadcast rows too long to copy once, rules._broadcast_region)
    free_outer: bool | None = None
    dma_tiles: int = 1  # `split Y.v, N` of flattened data: N free tiles per DMA (loads and stores), computed per tile

    def __repr__(self) -> str:  # (`tilec explain` prints the settings a schedule made, the sizes always)
        extra = "".join(f", {k}={v}" for k, v in (("unroll", self.unroll), ("single", self.single)) if v)
        extra += f", free_outer={self.free_outer}" if self.free_outer is not None else ""
        extra += f", dma_tiles={self.dma_tiles}" if self.dma_tiles != 1 else ""
        return f"EltwisePlan(parts={self.parts}, free={self.free}{extra})"


@dataclass(frozen=True)
class ReducePlan:
    parts: int  # rows (flattened kept indices) per partition tile
    free: int  # reduced elements per partition per tensor_reduce
    # `unroll s.v`: a row reduction's "pt" (row tiles, v kept) or "ft" (free tiles); a column sum's "rt" (row tiles, v
    # reduced) or "ft" (free tiles, v kept)
    unroll: tuple[str, ...] = ()
    single: tuple[str, ...] = ()  # `buffers X, 1`: inputs whose tiles use one buffer for the whole nest

    def __repr__(self) -> str:  # (`tilec explain` prints the settings a schedule made, the sizes always)
        extra = "".join(f", {k}={v}" for k, v in (("unroll", self.unroll), ("single", self.single)) if v)
        return f"ReducePlan(parts={self.parts}, free={self.free}{extra})"


Plan = ConvPlan | PoolPlan | TransposePlan | EltwisePlan | ReducePlan
WHOLE_ROWS_BYTES = 32 * 1024  # SBUF per partition broadcast rows may take when copied once for the whole nest
ELTWISE_FREE = 1024  # elements per partition of one element-wise tile: ~1000 keeps DMAs efficient
# A 16-bit result's tiles take twice the elements, the same 4 KiB per partition: at 1024 the bf16 batch norm's
# 128 x 1024-element tiles waited on each store's write acknowledgement (8 x 64 x 56 x 56 on the trn2 model: 30.1 us
# above start-up with 784-wide tiles, 23.6 us with 1568)
ELTWISE_TILE_BYTES = 4 * ELTWISE_FREE
REDUCE_FREE = 4096  # elements per partition of one reduced tile: 16 KiB of fp32, two in flight well inside SBUF


def reduce_free(F: int) -> int:
    """Elements per free tile of a row reduction: the largest divisor of F up to REDUCE_FREE, or, when that divisor
    is poor (F = 12289, a prime: 1, i.e. 12289 one-element tiles per row tile), REDUCE_FREE with one ragged tile of
    the rest (rules.reduce cuts it: 3 x 4096 + 1)."""
    tile = best_divisor(F, REDUCE_FREE)
    return REDUCE_FREE if 4 * tile < min(F, REDUCE_FREE) and F > REDUCE_FREE else tile


def directive(name: str, *args: "str | int | tuple") -> sx.Directive:
    """directive("tile", ("conv", "k"), 128) -> `tile conv.k, 128`."""
    conv: list[sx.Ref | int] = [sx.Ref(a) if isinstance(a, tuple) else sx.Ref((a,)) if isinstance(a, str) else a for a in args]
    return sx.Directive(name, tuple(conv))


def fmt_arg(a) -> str:
    if isinstance(a, sx.Ref):
        return ".".join(a.parts)
    if isinstance(a, sx.KeyArg):
        return f"{a.key}={fmt_arg(a.value)}"
    return str(a)


def fmt_directive(d: sx.Directive) -> str:
    return f"{d.name} {', '.join(fmt_arg(a) for a in d.args)}".rstrip()


def print_schedule(ds: tuple[sx.Directive, ...]) -> str:
    return "".join(fmt_directive(d) + "\n" for d in ds)


# ---- defaults ------------------------------------------------------------------------------------------------------


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def best_divisor(n: int, limit: int, multiple: int = 1) -> int:
    ok = [d for d in divisors(n) if d <= limit and d % multiple == 0]
    return max(ok) if ok else n


def tile_size(n: int, limit: int) -> int:
    """Tiles of n elements, at most `limit` each: the largest divisor of n when it takes at most a quarter more
    tiles than `limit`-wide ones, else `limit` itself (the last tile is smaller: a ragged plan; 521 rows are 512 +
    9, not 521 tiles of one)."""
    d, whole = best_divisor(n, limit), min(n, limit)
    return d if 4 * -(-n // d) <= 5 * -(-n // whole) else whole


def rows_whole(F: int, free: int, rows: int, per_outer: bool = False, ragged: bool = False) -> bool:
    """Whether `rows` broadcast rows of F elements are copied to the partitions once, whole, before a nest tiled
    `free` wide (the one reading rules._broadcast_region and eltwise_plan share): not when they are read per outer
    index (`mask[b, k]`: a row per b) or the nest is cut into ragged regions (each region broadcasts its own
    tiles), and only when the tiles divide F and the rows fit WHOLE_ROWS_BYTES per partition. One tile of F is no
    exception: the copy is then made once for all partition tiles, rather than one per tile (a layer scale
    `R + gamma[d] * X` in bf16 at 4096 x 1024 took 1.65x its floor on the model with 512-wide tiles, which its
    loads waited behind; 1.06x with whole rows, pipelined by partition tiles)."""
    return rows > 0 and not per_outer and not ragged and F >= free and F % free == 0 and \
        F * 4 * rows <= WHOLE_ROWS_BYTES


def row_free(F: int, free: int, rows: int, per_outer: bool = False, ragged: bool = False) -> int:
    """The free tile for a wanted `free`: rows broadcast tile by tile go through one PSUM bank per tile (a ones
    matmul's moving operand: at most MOVING_FMAX fp32 columns), so wider tiles are kept for rows broadcast whole."""
    if rows and free > MOVING_FMAX and not rows_whole(F, free, rows, per_outer, ragged):
        return tile_size(F, MOVING_FMAX)
    return free


def eltwise_plan(size: int, layout: dict[str, int], rows: int, per_outer: bool = False, itemsize: int = 4,
                 stored_only: bool = False) -> "EltwisePlan":
    """The default element-wise tiles: the largest partition count up to 128 and ~1000 elements per partition per
    tile (two or more tiles let loads overlap the vector engine). `rows` broadcast rows copied to the partitions
    tile by tile go through one PSUM bank per tile (at most 512 fp32 columns); rows broadcast whole once, before
    the nest (WHOLE_ROWS_BYTES, in PSUM-bank chunks of their own), leave the tiles ~1000 wide (audit15's swish with
    a per-column beta, bf16 4096 x 4096: 128 x 512 tiles of 1 KiB per partition left it latency-bound): row_free,
    which rules._broadcast reads again on the nest; `per_outer`: a row is read per outer index (rows_per_outer).
    Flattened data without good divisors (a prime element count) gets 128 x 1024 tiles over the loops, ragged at
    the edges (rules.eltwise picks where the partitions end). `itemsize`: the result's bytes per element (a 16-bit
    result's tiles are ELTWISE_TILE_BYTES wide too). `stored_only`: no operand is loaded tile by tile (only
    broadcast columns, rows or constants): the tiles are twice as wide, so that each tile's one transfer, its store,
    moves as many bytes as a tile's load and store do (the outer product `a[i] * b[j]`, 2048 x 2048 f32 on the trn2
    model: 118.8 us with 512-wide tiles, 83.4 with 1024, 68.4 with 2048; each store's latency and write
    acknowledgement come once a tile)."""
    most = ELTWISE_TILE_BYTES // max(itemsize, 2)  # (fp32: ELTWISE_FREE)
    most *= 2 if stored_only else 1
    if layout:
        parts = tile_size(layout["P"], PMAX)
        # (a ragged last tile cuts the nest into regions, whose rows are broadcast tile by tile)
        free = row_free(layout["F"], tile_size(layout["F"], most), rows, per_outer, layout["P"] % parts != 0)
        return EltwisePlan(parts, free)
    parts = best_divisor(size, PMAX)
    free = best_divisor(size // parts, most)
    if 4 * (size // (parts * free)) > 5 * -(-size // (PMAX * most)) + 4:
        return EltwisePlan(PMAX, most)
    return EltwisePlan(parts, free)


def default_transpose(m: int, n: int, elem: int, strips: int = 2) -> TransposePlan:
    """Blocks of ti x tj (the largest divisors of M and N up to 128: rectangular when the sizes share no large
    factor, so 422 x 96 is 2 x 96 blocks, not 10,128 blocks of 2 x 2), bj blocks per row-strip DMA of >= 4 KiB
    per partition (saturates the queues), each strip (bi x bj blocks) within 32 KiB per partition. `strips`: the
    strips staged per super-tile, 2 (source and result) or more (tiles read on the eviction, fn_chain.py), which
    share what two strips get."""
    ti, tj = best_divisor(m, PMAX), best_divisor(n, PMAX)
    ragged = (m > PMAX and ti < 32) or (n > PMAX and tj < 32)  # 521 x 257 would be 133,897 blocks of 1x1
    if ragged:
        ti, tj = min(m, PMAX), min(n, PMAX)
    strip = 2 * 32768 // (strips * max(ti, tj) * 4)  # blocks per strip (fp32 output at worst)
    bj = best_divisor(n // tj, max(1, min(4096 // (tj * elem), strip)))
    bi = best_divisor(m // ti, max(1, min(4096 // (ti * elem), strip // bj)))
    return TransposePlan(ti, bi, bj, tile_j=0 if tj == ti else tj, ragged=ragged)


def window_pool_plan(op: PoolOp, dtypes: tuple[str, str] | None = None) -> PoolPlan:
    """Rows of n*c on up to 128 partitions (with 64 or fewer, blocks of output rows on the others); bands of output
    rows whose input rows take ~16 KiB per partition, at least two per block when there is one partition tile (so
    loads, the engines and stores overlap). dtypes (X's and Y's; a standalone pool's default plan): more channel rows
    that leave partitions of their tiles empty (192: two tiles of 96) may take blocks of output rows too, over
    several tiles, when the model's costs say so (pool_costs.across_blocks); many channel rows may stack several on
    each partition (pool_stack.choose_images); the bands of a max or min may split the rows evenly instead
    (pool_bands.even_band)."""
    if dtypes is not None:
        from tilec.compiler.pool_costs import across_blocks  # (late: the pool rules import this module)
        from tilec.compiler.pool_stack import choose_images
        across = across_blocks(op, *dtypes)
        if across is not None:
            return across
        one = window_pool_plan(op)
        images = choose_images(op, *dtypes, one)
        if images is not None:
            return images
        from tilec.compiler.pool_bands import even_band
        return even_band(op, *dtypes, one)
    assert op.window is not None
    rows, parts = op.dim("B"), best_divisor(op.dim("B"), PMAX)
    ho, sy = op.window.out[0], op.window.stride[0]
    blocks = 1
    if rows <= PMAX // 2 and op.window.count == "window":  # few channel rows: blocks of output rows fill the rest
        blocks = min(PMAX // rows, max(1, ho // 4))  # blocks of at least 4 rows
    ho = -(-ho // blocks)
    band = max(1, 16384 // (sy * op.dim("W") * 4))
    if rows // parts < 2:
        band = min(band, -(-ho // 2))
    return PoolPlan(parts, min(band, ho), blocks)


def inner_pool_plan(op: PoolOp) -> PoolPlan:
    """The plan of a pool over axes with dimensions after them: a placeholder (build_pool_axes chooses its layout
    itself); a directive changing it is refused."""
    return PoolPlan(op.dim("B"), op.dim("Ho"))


def default_plan(op: Op, dtypes: dict[str, str]) -> Plan:
    if isinstance(op, ConvOp):
        return _default_conv(op, dtypes)
    if isinstance(op, PoolOp) and "K" in dict(op.dims):  # build_pool_axes.py: its layout is its own (no knobs)
        return inner_pool_plan(op)
    if isinstance(op, PoolOp):
        x, y = dtypes.get(op.src, "f32"), dtypes.get(op.out, "f32")
        return window_pool_plan(op.windowed(), (x, y))
    if isinstance(op, TransposeOp):
        return default_transpose(op.dim("M"), op.dim("N"), DTYPE_BYTES[dtypes[op.src]], 2 + tile_reads(op))
    if isinstance(op, ColumnReduceOp):  # reduced rows on the partitions, one PSUM bank of sums per free tile
        return ReducePlan(best_divisor(op.dim("R"), PMAX), best_divisor(op.dim("F"), MOVING_FMAX))
    if isinstance(op, ReduceOp):
        return ReducePlan(ragged_tile(op.dim("R")), reduce_free(op.dim("F")))
    itemsize = DTYPE_BYTES[dtypes.get(op.out, "f32")]
    stored_only = set(op.inputs) <= set(op.columns) | set(op.rows)
    return eltwise_plan(op.size, dict(op.layout), len(op.rows), rows_per_outer(op), itemsize, stored_only)


def tile_reads(op: TransposeOp) -> int:
    """The reads of a transpose's value staged like its output (fn_chain.py: over both swapped runs, not the source
    read), each a strip of its own."""
    if op.value is None:
        return 0
    swapped = {dict(op.vars)["i"], dict(op.vars)["j"]}
    names = {(a.tensor, tuple(i.id if isinstance(i, sx.Name) else "" for i in a.indices)) for a in reads(op.value)}
    return sum(1 for _, vs in names if vs != op.src_vars and swapped <= set(vs))


def rows_per_outer(op: EltwiseOp) -> bool:
    """Whether a broadcast row is read per outer index (`mask[b, k]` of S[b, h, q, k]: an index of the op's outer
    loops, before its partition run), as rules._outer_rows sees it on the nest."""
    free = {v for _, v in op.vars[op.run[1]:]}
    return any(isinstance(i, sx.Name) and i.id not in free for a in reads(op.expr) if a.tensor in op.rows
               for i in a.indices)


def eltwise_free(op: EltwiseOp, parts: int) -> int:
    """Elements per partition row: all of them when flattened, the free dims F of a broadcast layout."""
    return op.dim("F") if op.layout else op.size // parts


def ragged_tile(channels: int) -> int:
    """Channels per conv tile (rows per tile of a row reduction): the largest divisor up to 128, or, when that is
    small for a large count (257: 1), 128 channels per tile plus one remainder tile (a ragged plan: 3 tiles, not 257
    tiles of one channel)."""
    tile = best_divisor(channels, PMAX)
    return PMAX if channels > PMAX and tile < 32 else tile


def conv_channel_tile(channels: int) -> int:
    """Channels per conv tile: ragged_tile's, or 128 plus a remainder tile when that takes fewer tiles (K = 129:
    2 tiles of 128 + 1, not 3 of 43; each tile is one more moving pass per tap, so fewer tiles, fewer columns)."""
    tile = ragged_tile(channels)
    return PMAX if -(-channels // PMAX) < -(-channels // tile) else tile


def _default_conv(op: ConvOp, dtypes: dict[str, str]) -> ConvPlan:
    """The first of schedule_conv.CONV_RULES that applies (a table of records: name, predicate, plan, why)."""
    from tilec.compiler import schedule_conv  # (it reads this module's helpers)
    return schedule_conv.default_conv(op, dtypes)


def two_bands(ho: int, band: int, max_rows: int, wy: int) -> int:
    """Output rows per band of a single image: one band is split into two (or more) when each still holds a
    whole matmul group, so the second band's load overlaps the first band's matmuls instead of every matmul
    waiting for the whole image (conv3x3s2 f32 batch 1, 28 rows: the matmuls started after 7.6 us of loads).
    From two images on, the next image's load overlaps this one's matmuls already, and half-image stores move
    runs half as long, ordered by the HBM range rule (conv_residual bf16 batch 8: 32.2 -> 40.7 us split)."""
    if band != ho:
        return band
    group = best_divisor(ho, max_rows, wy)
    fits = [d for d in divisors(ho) if d % wy == 0 and 2 * d <= ho and d >= group]
    return max(fits) if fits else band


def pairable(op: ConvOp) -> bool:
    """Whether a folded convolution can put two parts of its output rows on the two column halves of its
    stationary (build_conv's row phases): out-channel-major weights, at most 64 output channels, no pool over rows
    (its windows would span both halves) and no bias row; even and odd rows (two band copies) also need unit row
    stride and dilation, the two halves of a band (copies per tap row and half) need 2 x R x C <= 128."""
    # the second half starts at partition K: engines reach 32 or 64 partitions only from aligned starts (nki-spec
    # §1.6), so K is 32 or 64
    if not (op.w_layout == "kc" and op.dim("K") in (32, 64) and not op.pool and not op.w_batch and op.groups == 1
            and not (op.bias and op.bias_role == "x")):
        return False
    return halves(op) or (op.stride[0] == 1 and op.dilation[0] == 1)


def stacks(op: ConvOp) -> bool:
    """A 1x1 conv of at most 64 input channels and one out-channel tile whose band's two matmul groups sit on the
    two partition halves (build_conv's stacked bands): C channels on partitions 0-63 reach DMA engines 0-7 of 16
    only (nki-spec §2.5: an engine serves 8 partitions), so the band's loads took twice their bytes' time (small20:
    a hand kernel, conv1x1s2 batch 8 45.2 -> 29.9 us)."""
    return (op.dim("R") == op.dim("S") == 1 and 2 * op.dim("C") <= PMAX and op.dim("K") <= PMAX
            and op.groups == 1 and op.w_layout == "kc" and not op.x_transposed and not op.w_batch
            and not op.pool and op.offset == (0, 0) and op.w_relu is None)


def halves(op: ConvOp) -> bool:
    """Few enough input channels for band copies per filter row and band half (2 x R x C <= 128; the columns
    of the taps come from as many column-shifted copies as fit, the rest from the matmuls' column offsets)."""
    return 2 * op.dim("R") * op.dim("C") <= PMAX


def default_directives(op: Op, dtypes: dict[str, str]) -> tuple[sx.Directive, ...]:
    """The default plan written as directives (what `tilec explain` shows)."""
    return plan_directives(op, default_plan(op, dtypes))


def var_of(op: Op, role: str) -> str:
    return dict(op.vars).get(role, role)


def plan_directives(op: Op, plan: Plan) -> tuple[sx.Directive, ...]:
    """A plan written back as directives (only loops the op really has)."""
    have = dict(op.vars)
    v = lambda role: (op.name, have[role])  # noqa: E731
    if isinstance(op, EltwiseOp) and op.copy:  # the copy rule has no parameters (yet): no directives, no knobs
        return ()
    if isinstance(plan, ConvPlan):
        assert isinstance(op, ConvOp)  # default_plan gives a ConvPlan to a ConvOp only
        sizes = (("tile", "k", plan.tile_k), ("tile", "c", plan.tile_c), ("tile", "x", plan.tile_x),
                 ("tile", "y", plan.rows), ("split", "y", plan.band))
        ragged = {"k": op.dim("K") % plan.tile_k, "c": op.dim("C") % plan.tile_c}  # the default's own tiles
        ds = [directive(name, v(role), n) for name, role, n in sizes if role in have and not ragged.get(role)]
        if plan.band_x:
            ds.append(directive("split", v("x"), plan.band_x))
        for group in (plan.order, plan.taps):
            present = [have[r] for r in group if r in have]
            if len(present) > 1:
                ds.append(directive("reorder", op.name, *present))
        if op.pool and not plan.fused:
            ds.append(directive("place", op.name, "hbm"))
        if plan.hoist_w != "root":
            ds.append(directive("hoist", op.w, v("k")))
        if plan.w_split != "k":
            ds.append(directive("split", op.w, v(plan.w_split)))
        if plan.x_pin:
            ds.append(directive("hoist", op.x, v(plan.x_pin)))
        if plan.x_bufs != 2:
            ds.append(directive("buffers", op.x, plan.x_bufs))
        ds += [directive("unroll", v(r)) for r in plan.unroll]
        return tuple(ds)
    if isinstance(plan, PoolPlan) and "K" in dict(op.dims):  # (build_pool_axes takes no directives yet)
        return ()
    if isinstance(plan, PoolPlan):  # (no `tile` of b when one loop is both b and the rows: a 2-D pool, B = 1)
        channels = () if v("b") == v("i") else (directive("tile", v("b"), plan.tile_b),)
        return (*channels, directive("split", v("i"), plan.band))
    if isinstance(plan, TransposePlan):
        tiles = [] if plan.ragged else [directive("tile", v("i"), plan.tile)] + \
            ([directive("tile", v("j"), plan.tile_j)] if plan.tile_j else [])  # ragged: the default's own blocks
        ds = tiles + [directive("split", v("i"), plan.bi), directive("split", v("j"), plan.bj)]
        return tuple(ds + ([directive("method", op.name, "dma")] if plan.method == "dma" else []))
    if isinstance(plan, ReducePlan) and isinstance(op, ColumnReduceOp):
        looped = {"rt": v("r0"), "ft": v("k0")}
        return (directive("tile", v("r0"), plan.parts), directive("tile", v("k0"), plan.free),
                *(directive("unroll", looped[u]) for u in plan.unroll),
                *(directive("buffers", x, 1) for x in plan.single))
    if isinstance(plan, ReducePlan):
        tiled = {"pt": v("k0"), "ft": v("r0")}
        return (directive("tile", v("k0"), plan.parts), directive("tile", v("r0"), plan.free),
                *(directive("unroll", tiled[u]) for u in plan.unroll),
                *(directive("buffers", x, 1) for x in plan.single))
    assert isinstance(plan, EltwisePlan) and isinstance(op, EltwiseOp)
    loops = {kind: var for kind, var in ((eltwise_loop(op, var), var) for _, var in reversed(op.vars))}
    tile: tuple[sx.Directive, ...] = (directive("tile", (op.name, loops["t"]), plan.free),) if "t" in loops else ()
    if "pt" in loops and plan.parts != eltwise_plan(op.size, dict(op.layout), len(op.rows), rows_per_outer(op)).parts:
        tile += (directive("tile", (op.name, loops["pt"]), plan.parts),)  # a user's partition tile
    tile += (directive("split", (op.name, loops["t"]), plan.dma_tiles),) if plan.dma_tiles != 1 else ()
    return (*tile, *(directive("unroll", (op.name, loops[u])) for u in plan.unroll),
            *(directive("buffers", x, 1) for x in plan.single), *_order_directive(op, plan))


def _order_directive(op: EltwiseOp, plan: EltwisePlan) -> tuple[sx.Directive, ...]:
    """`reorder Y, j, i` (free loops first) or `reorder Y, i, j` for a user's order of a broadcast layout's tiles."""
    if plan.free_outer is None:
        return ()
    names = [v for _, v in op.vars]
    a, b = op.run
    parts, free = names[a:b], names[b:]
    return (directive("reorder", op.name, *(free + parts if plan.free_outer else parts + free)),)


def eltwise_loop(op: EltwiseOp, var: str) -> str:
    """The tile loop of an element-wise kernel that the op's loop `var` runs through: "t" (free tiles; every loop of
    flattened data), "pt" (partition tiles) or "o" (the outer loops of a broadcast layout)."""
    if not op.layout:
        return "t"
    at = [v for _, v in op.vars].index(var)
    return "o" if at < op.run[0] else "pt" if at < op.run[1] else "t"


def eltwise_trips(op: EltwiseOp, plan: EltwisePlan) -> dict[str, int]:
    """Iterations of each tile loop of rules.eltwise's kernel (of its largest region when the tiles are ragged);
    {} for flattened data the tiles do not divide (the rule then picks where the partitions end)."""
    if not op.layout:
        per = op.size // plan.parts
        ok = op.size % plan.parts == 0 and per % plan.free == 0  # (a split's DMAs of dma_tiles tiles: its loop t)
        return {"t": per // plan.free // plan.dma_tiles} if ok else {}
    P, F = op.dim("P"), op.dim("F")
    ragged = P % min(plan.parts, P) != 0
    free = min(row_free(F, plan.free, len(op.rows), rows_per_outer(op), ragged), F)
    return {"o": op.dim("O"), "pt": -(-P // min(plan.parts, P)), "t": -(-F // free)}


def once(lines: list[str], seen: set[str]) -> list[str]:
    """`lines` without the `buffers X, n` already in `seen` (then added): one directive sets the tiles of X of
    every reader built apart (pipeline._shared_tiles), so it prints once."""
    out = [line for line in lines if not (line.startswith("buffers ") and line in seen)]
    seen.update(line for line in lines if line.startswith("buffers "))
    return out


def print_plans(ops: tuple[Op, ...], plans: tuple[Plan, ...], fused: AbstractSet[str] = frozenset()) -> str:
    """Each op's plan as directives, the schedule `tilec explain` prints for pasting back. The ops of `fused` (a
    fused part's members) show their plan as comments: the part's builder tiles them, and a directive naming one
    builds it alone, so pasting their plans back would change the kernel."""
    out: list[str] = []
    seen: set[str] = set()
    for op, plan in zip(ops, plans):
        if isinstance(op, EltwiseOp) and op.copy:  # the copy rule has no parameters (yet)
            out.append(f"# {op.name}: copy (line {op.line}), no schedule parameters")
            continue
        from tilec.compiler.directives import fixed_schedule  # (directives imports this module)
        fixed = fixed_schedule(op, {})  # (the choice does not depend on the dtype, only its tile size does)
        if fixed is not None:
            out.append(f"# {op.name}: {fixed} (line {op.line}), no schedule parameters")
            continue
        out.append(f"# {op.name}: {plan}")
        lines = once([fmt_directive(d) for d in plan_directives(op, plan)], seen)
        out += [f"#   (fused: not a directive) {line}" for line in lines] if op.name in fused else lines
    return "\n".join(out) + "\n"
