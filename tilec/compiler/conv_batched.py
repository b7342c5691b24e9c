"""A batched matmul's out-channel tiles, for build_conv._ConvBuilder: the first tile peeled so the stationary's
loads go with the moving band's (lead_tile, with_band), or a few 16-bit tiles all at once with the contraction loop
outside them (tiles_together), a contraction-major stationary loaded whole per batch index (w_per_image), and one
output band holding every tile's slot (tiles_band, tile_slot_body). Functions of the builder `b`, as conv_pairs.py
and conv_weights.py.
"""
from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from tilec.compiler import ir
from tilec.compiler.build_util import a, drop_var, loop, map_aff, sl
from tilec.compiler.ir import DTYPE_BYTES, Alloc, Buf, Dma, Stmt, View, full, whole
from tilec.compiler.schedule import PMAX
from tilec.target import TARGETS, compiled

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder


# a batched matmul's output band of every out-channel tile (tiles_band) stays within an eighth of the smallest SBUF
BAND_BUDGET = min(t.sbuf_usable for t in TARGETS.values()) // 8
# a DMA's contiguous runs shorter than this cost more in descriptors than in bytes on the model (a descriptor's 14 ns
# is 322 B at one engine's 23 B/ns): a contraction-major stationary of such tiles is loaded whole (w_per_image)
DMA_RUN_BYTES = 512
# contraction tiles from which an fp32 vector of a batched mat-vec is loaded as rows and turned (vector_rows)
VECTOR_ROWS_FP32 = 8
# out-channel tiles accumulated at once by tiles_together: one PSUM bank each, beside the stationary transposes'
# rotating PSUM tiles and whatever the kernel's other ops hold
MAX_TOGETHER = 4


def lead_tile(b: _ConvBuilder, part: Callable[[str | None, int], list[Stmt]], note: str) -> list[Stmt] | None:
    """A batched matmul's loop over out-channel tiles with its first tile peeled, so that the stationary's loads
    for tile 0 are issued with the moving band's instead of after them: the `hoist` pass lifts the band, shared
    by every tile, out of the tile loop, ahead of tile 0's stationary on the same DMA queues, and TensorE waited
    for the whole band before its first matmul (bmm f32 batch 1: the first matmul at 1.73 us, B's four band
    loads first). When both are one loop over the contraction tiles (A by DMA transposes, B's band by DMA) the
    two loops become one, tile k of A then tile k of B, and the first matmul waits for one of each; otherwise
    A's loads go first (bmm bf16 batch 1 18.0 -> 17.6 us), unless the band is more than DMAs (B^T transposed
    on TensorE: that chain, not A's loads, leads). The remaining tiles loop from tile 1 and read the band
    already loaded (as does a ragged plan's last, partial tile, which loaded its own copy before). A stationary
    of the whole batch index (w_per_image) is loaded with the band in one block before the tile loop, nothing
    peeled. A few whole tiles whose stationary is turned on TensorE go all at once instead (tiles_together). None
    when the plan has no whole tile, the stationary is not prepared per tile or per batch index, or the band is
    pinned in the tile loop."""
    kv = b.var["k"]
    if b.KT < 1 or b.p.hoist_w != "k" or b.src_chip is not None:
        return None
    body = part(kv, b.p.tile_k)
    w_label, x_label = load_labels(b)
    blocks = [s for s in body if isinstance(s, ir.Block) and s.label in (w_label, x_label)]
    if [b.label for b in blocks] != [w_label, x_label] or blocks[1].pin or kv in block_vars(blocks[1]) \
            or not all(isinstance(x, (Alloc, ir.Loop, Dma)) or isinstance(x, ir.Transpose) and x.engine == "dma"
                       for x in ir.walk(blocks[1].body)):
        return None  # (a band transposed on TensorE: its chain, not A's loads, leads; bmm_bt f32 batch 1 +1 us)
    band0 = blocks[1]
    together = tiles_together(b, body, blocks[0], band0)
    if together is not None:
        return together
    if kv not in block_vars(blocks[0]):  # the stationary of the whole batch index (w_per_image): both
        # loaded in one block before the tile loop, which the partial tile of a ragged plan follows
        def others(stmts: list[Stmt]) -> list[Stmt]:
            return [s for s in stmts if not (isinstance(s, ir.Block) and s.label in (w_label, x_label))]
        out = [with_band(b, blocks[0], band0)] + loop(kv, b.KT, others(body), note=note, line=b.L["k"])
        return out + (others(part(None, b.KR)) if b.KR else [])
    first: list[Stmt] = []
    for s in drop_var(tuple(body), kv):
        if isinstance(s, ir.Block) and s.label == x_label:
            continue
        first.append(with_band(b, s, band0) if isinstance(s, ir.Block) and s.label == w_label else s)
    rest = [s for s in body if s is not blocks[1]]

    def next_tile(x: ir.Aff) -> ir.Aff:  # tile i_t + 1
        return ir.Aff(x.terms, x.const + sum(t.coef for t in x.terms if t.var == kv))
    out = first
    if b.KT > 1:
        out += loop(kv, b.KT - 1, map_aff(tuple(rest), next_tile), note=f"{note}, from tile 1",
                    line=b.L["k"])
    if b.KR:  # the partial tile reads the band loaded with tile 0
        out += [s for s in part(None, b.KR) if not (isinstance(s, ir.Block) and s.label == x_label)]
    return out


def tiles_together(b: _ConvBuilder, body: list[Stmt], w: ir.Block, band: ir.Block) -> list[Stmt] | None:
    """Every out-channel tile at once, the contraction loop outside them: each tile's stationary prepared first
    (its rows loaded and turned on TensorE, loads in tile order), then the band, then one loop over the
    contraction tiles issuing every tile's matmul into its own PSUM accumulator, then each tile's eviction and
    store. Tile by tile, the last tile's stationary loads after the band and its whole chain (rows, transposes,
    every matmul, the eviction) follows the last byte; here only the last contraction tile's matmuls and the
    evictions do (bmm bf16 1 x 256 x 512 x 256: 4.57 -> 4.27 us run in a hand kernel). For few whole tiles
    (MAX_TOGETHER: their accumulators and the transposes' two PSUM tiles within the banks) whose stationary is
    more than DMA loads (an fp32 stationary by DMA transposes interleaves with the band instead: TensorE's
    warm-up throttle, not the loads, sets that kernel's pace), one accumulator of one bank each. None otherwise."""
    kv = b.var["k"]
    if not (2 <= b.KT <= MAX_TOGETHER and b.KR == 0 and kv in block_vars(w)) or \
            all(isinstance(x, (Alloc, ir.Loop, Dma)) or isinstance(x, ir.Transpose) and x.engine == "dma"
                for x in ir.walk(w.body)):
        return None
    rest = [x for x in body if x is not w and x is not band]  # the accumulator, its matmuls, eviction, store
    if len(rest) < 3 or not isinstance(rest[0], Alloc) or rest[0].buf.memory != "psum" or \
            not isinstance(rest[1], ir.Loop) or len(rest[1].body) != 1 or not isinstance(rest[1].body[0], ir.Matmul) \
            or any(isinstance(x, (ir.Loop, ir.Block, ir.Matmul)) for x in rest[2:]):
        return None
    acc = rest[0].buf
    if DTYPE_BYTES[acc.dtype] * acc.shape[-1] * acc.shape[-2] > compiled().psum_bank_bytes:
        return None
    own = tuple([w] + rest)
    local = {x.buf.name for x in ir.walk(own) if isinstance(x, Alloc)}  # each tile's own buffers

    def tile(t: int):
        stmts = at_tile(own, kv, t)
        return renamed(stmts, local, lambda name: b.fresh(f"{name}_{t}")) if t else stmts
    tiles = [tile(t) for t in range(b.KT)]
    matmuls = replace(rest[1], body=tuple(m for stmts in tiles for m in stmts[2].body))
    loads = tuple(x for stmts in tiles for x in stmts[0].body) + band.body
    return [ir.Block(w.label.replace("this", "every"), loads, w.line, hoist=True)] + \
        [stmts[1] for stmts in tiles] + [matmuls] + \
        [on_vector(x) if t % 2 else x for t, stmts in enumerate(tiles) for x in stmts[3:]]


def on_vector(s: Stmt) -> Stmt:
    """A plain PSUM eviction (an activation copy) as a VectorE copy: the tiles' evictions, all ready at once after
    the last matmul, alternate between ScalarE and VectorE (bmm bf16 batch 1, model: 17.4 -> 17.27 us total: the
    second eviction no longer waits for the first)."""
    if isinstance(s, ir.Act) and s.func == "copy" and s.bias is None and s.scale == 1.0 and s.total is None:
        return ir.Copy(s.dst, s.src, s.line)
    return s


def at_tile(node, var: str, t: int):
    """`var` replaced by the tile index t."""
    def fn(x: ir.Aff) -> ir.Aff:
        return ir.Aff(tuple(u for u in x.terms if u.var != var), x.const + t * sum(u.coef for u in x.terms
                                                                                   if u.var == var))
    return map_aff(node, fn)


def renamed(node, names: set[str], fresh: Callable[[str], str]):
    """The buffers named in `names` given fresh names, everywhere in node."""
    new: dict[str, Buf] = {}

    def walk(x):
        if isinstance(x, Buf):
            if x.name not in names:
                return x
            if x.name not in new:
                new[x.name] = replace(x, name=fresh(x.name))
            return new[x.name]
        if isinstance(x, tuple):
            return tuple(walk(y) for y in x)
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return replace(x, **{f.name: walk(getattr(x, f.name)) for f in dataclasses.fields(x)})
        return x
    return walk(node)


def load_labels(b: _ConvBuilder) -> tuple[str, str]:
    """The labels of out_band's load blocks: the stationary (per out-channel tile, or of the batch index), the
    moving band."""
    w = f"{b.words['w']} of this batch index, every {b.words['k_tile']}" if w_per_image(b) else \
        f"{b.words['w']} for this {b.words['k_tile']}"
    return w, f"{b.words['x']}: all contraction tiles, shared by every output tile"


def w_per_image(b: _ConvBuilder, banded: bool = False) -> bool:
    """A batched matmul's contraction-major stationary (A^T B: A[n] stored [k, i]) loaded whole per batch
    index, in the layout of a resident stationary (`hoist A, root`: every out-channel tile's columns), instead
    of one out-channel tile at a time: its rows in HBM are then M elements long, not one tile's (bf16 M = 256:
    512-byte runs instead of 256, half the descriptors: bmm_at bf16 batch 8 34.25 -> 32.1 us). Only within an
    eighth of SBUF (BAND_BUDGET), for plans with the batch index outside the out-channel tiles (tiles_band), when
    one tile's rows are shorter than DMA_RUN_BYTES (fp32 tiles of 128 are not: bmm_at f32 batch 8 50.7 -> 50.9
    us), from batch 2 on and for at most two tiles: tile 0's last matmul waits for every tile's columns of A
    (bf16 1 x 512 x 1024 x 512: 27.2 -> 28.0 us, batch 2 34.4 -> 35.0). A batched matrix-vector product (one
    moving column: the stationary's loads are the kernel's work, TensorE waits on them) takes it for any tile
    count and width (masked mean pooling f32 32 x 512 x 768: 512-byte runs -> 3 KB, 229.7 -> 188.6 us)."""
    op = b.op
    if not (op.w_batch and (op.w_layout == "ck" or kc_by_dma(b)) and b.p.hoist_w == "k"
            and (b.o_tiles is not None or banded)
            and op.groups == 1 and b.fold == 1 and b.pair == 1 and b.dup == 1 and b.N > 1):
        return False
    item = DTYPE_BYTES[b.hbm[op.w].dtype]
    if b.CTB * b.K * b.R * b.S * item > BAND_BUDGET:
        return False
    return b.Ho * b.Wo == 1 or b.KTB <= 2 and b.p.tile_k * item < DMA_RUN_BYTES


def partition_major(b: _ConvBuilder, banded: bool = False) -> bool:
    """A batched mat-vec whose stationary is loaded whole per batch index (w_per_image, stored [C, K]) sums its
    contraction index c as c = p * CT + t (partition p of tile t) instead of t * 128 + p: the sum is the same,
    and both operands then load in one DMA per batch index with one contiguous run per partition (W's CT rows of
    K elements, the vector's CT elements) instead of CT DMAs of 128 rows each, or the vector's rows turned on
    TensorE (vector_rows). The model charges a descriptor 14 ns (perf/costs.py): decode attention's P V loaded
    V's 512-byte rows at 210 ns a tile against 175 ns of bytes. Whole tiles of 128, one 1x1 column per batch index.
    Decided where the stationary and the band are built (the plan's tiles_band known); `banded`: before it, in the
    prelude, as if tiles_band holds (vector_rows then declares no rows view the band would not read)."""
    op = b.op
    return bool(op.w_layout == "ck" and w_per_image(b, banded) and b.Ho * b.Wo == 1 and b.H * b.W == 1
                and b.R == b.S == 1 and b.CR == 0 and b.CT > 1 and b.p.tile_c == PMAX and b.KR == 0
                and not op.x_transposed and b.src_chip is None and b.fold == 1 and not b.stack and not b.mixed)


def partition_major_loads(b: _ConvBuilder, wt: Buf | None, xb: Buf | None, line: int) -> list[Stmt]:
    """partition_major's load of the stationary `wt` or of the vector `xb`: one DMA from a view of the HBM
    tensor as [N, 128, CT, ...]."""
    from tilec.compiler.build_util import hbm_view
    op, n = b.op, a(b.var["n"])
    if wt is not None:
        view, st = hbm_view(b.hbm[op.w], (b.N, PMAX, b.CT, b.K), b.fresh(f"{op.w}_pmajor"), line)
        return st + [Dma(View(wt, (full(PMAX), full(b.CT), full(b.K), a(0), a(0))),
                         View(view, (n, full(PMAX), full(b.CT), full(b.K))), line)]
    assert xb is not None
    view, st = hbm_view(b.hbm[op.x], (b.N, PMAX, b.CT), b.fresh(f"{op.x}_pmajor"), line)
    return st + [Alloc(xb, line=line), Dma(View(xb, (full(PMAX), full(b.CT), a(0), a(0))),
                                          View(view, (n, full(PMAX), full(b.CT))), line)]


def kc_whole(b: _ConvBuilder, banded: bool = False) -> bool:
    """kc_by_dma's stationary of one contraction tile (C <= 128) transposed by one DMA per batch index, HBM [K, C]
    -> SBUF [C, K], into a buffer declared once (build_conv.prelude), as partition_major's: the allocator renames
    a buffer refilled whole by one DMA (perf model `load_versions`), so the next batch indices' transposes are
    issued while this one's matmuls run; a buffer filled by one transpose per tile rotated through two copies
    (decode attention f32 4 x 8 x 2048 x 128: the scores' phase 148 us for 33.5 MB of K)."""
    return bool(kc_by_dma(b) and w_per_image(b, banded) and b.CT == 1 and b.CR == 0 and b.KR == 0)


def once_per_image(b: _ConvBuilder, banded: bool = False) -> bool:
    """The stationary of each batch index filled whole by one DMA (partition_major, kc_whole)."""
    return partition_major(b, banded) or kc_whole(b, banded)


def kc_whole_load(b: _ConvBuilder, wt: Buf, line: int) -> list[Stmt]:
    """kc_whole's one DMA transpose of the batch index's matrix."""
    from tilec.compiler.conv_weights import w_view
    return [ir.Transpose(View(wt, (full(b.C), a(0), a(0), a(0), full(b.K))),
                         w_view(b, (full(b.K), full(b.C), a(0), a(0))), "dma", line)]


def kc_by_dma(b: _ConvBuilder) -> bool:
    """A batched mat-vec's stationary stored [M, K] whose tiles are transposed by DMA from HBM (rows_by_dma): the
    whole batch index's tiles go into one buffer (w_per_image), so the next batch index's transposes are issued
    while this one's matmuls run; one buffer per tile rotated through two copies, each transpose waited for the
    matmul two tiles back plus a DMA latency (decode attention f32 4 x 8 x 2048 x 128: 0.77 us a tile of 64 KB)."""
    from tilec.compiler.conv_weights import rows_by_dma  # late: conv_weights imports this module's callers
    return b.op.w_layout == "kc" and b.Ho * b.Wo == 1 and rows_by_dma(b)


def block_vars(b: Stmt) -> set[str]:
    found: set[str] = set()

    def fn(x: ir.Aff) -> ir.Aff:
        found.update(x.vars())
        return x
    map_aff(b, fn)
    return found - {s.var for s in ir.walk((b,)) if isinstance(s, ir.Loop)}


def with_band(b: _ConvBuilder, w: ir.Block, x: ir.Block) -> ir.Block:
    """Tile 0's stationary loads and the band's as one block: the two loops over the contraction tiles zipped
    when both blocks are allocations and one such loop, else the stationary's loads first."""
    def parts(b: ir.Block) -> tuple[list[Stmt], list[ir.Loop]]:
        return [s for s in b.body if isinstance(s, Alloc)], [s for s in b.body if isinstance(s, ir.Loop)]
    (wa, wl), (xa, xl) = parts(w), parts(x)
    label = f"{w.label}, interleaved with {x.label}" if w_per_image(b) else \
        f"{b.words['w']} for {b.words['k_tile']} 0, interleaved with {x.label}"
    if len(wa) + len(wl) != len(w.body) or len(xa) + len(xl) != len(x.body) or len(wl) != 1 or len(xl) != 1 \
            or (wl[0].var, wl[0].extent) != (xl[0].var, xl[0].extent):
        return ir.Block(label, w.body + x.body, w.line, hoist=True)
    zipped = replace(wl[0], body=wl[0].body + xl[0].body, note=f"{wl[0].note}, and that tile of {b.op.x}")
    return ir.Block(label, tuple(wa + xa) + (zipped,), w.line, hoist=True)


def tiles_band(b: _ConvBuilder, i: int) -> Buf | None:
    """A batched matmul's output band for every out-channel tile of one batch index, allocated outside the loop
    over tiles (level i of the plan's order), each tile evicted into its slot and stored from it. One band per
    tile instead rotates through two buffers, and a band is rewritten only once its store is acknowledged
    (DMA latency + transfer + HBM write acknowledgement, ~2 us on the model): at 16-bit that cycle, not the
    DMA bytes, set the pace (batch 8: 34.8 -> 31.7 us). None for anything else (convolutions, fused epilogues,
    several row or column bands, k outside n, bands over an eighth of SBUF)."""
    op, p = b.op, b.p
    if not (op.w_batch and b.NB == 1 and b.NXB == 1 and b.pair == 1 and not b.halves
            and b.dup == 1 and b.dst_chip is None and not op.pool and not op.residual
            and "n" in p.order[:i] and b.wy == b.wx == 1):
        return None
    dt = b.hbm[op.out].dtype
    shape = (b.PK, b.KTB, p.band, b.BX)
    if b.KTB * p.band * b.BX * DTYPE_BYTES[dt] > BAND_BUDGET:
        return None
    return Buf(b.fresh(f"{op.out}_{b.words['out_buf']}"), "sbuf", dt, shape)


def tile_slot_body(b: _ConvBuilder, line: int) -> list[Stmt]:
    """The accumulation groups of one out-channel tile evicted into its slot of the batch index's band
    (tiles_band), then the slot stored: one store per tile, issued as soon as the tile is evicted (a matrix-vector
    product's band is stored once, as rows: rows_store)."""
    p, V, ob = b.p, b.var, b.o_tiles
    assert ob is not None
    group = loop(V["g"], b.G, loop(V["x"], b.XT, b.group(),
                                      note=f"{b.T['x']} (tiles of {b.cn['x']})", line=b.L["x"]),
                 note=f"{b.T['y']} (groups of {b.cn['rows']} rows in the band)", line=b.L["y"])
    if b.o_rows is not None:
        return group
    store = Dma(View(b.o4, (a(V["n"]), sl(b.k_start(b.kv), b.ks), full(p.band), full(b.BX))),
                View(ob, (b.part(b.ks, p.tile_k), b.tile_index(b.kv, b.KT), full(p.band),
                          full(b.BX))), line)
    return group + [store]


def column_rows(b: _ConvBuilder) -> bool:
    """A batched matrix-vector product's outputs (one column per out-channel tile, `y[n, k]` on partitions k) stored
    as rows: each tile's store wrote one element per partition, 4 bytes a descriptor, and the DMA queues spent as
    long on those as on the whole matrix's loads (masked mean pooling f32 32 x 512 x 768: 146 us of queue time for
    98 KB). Instead the batch index's band of every tile is turned on TensorE ([128, tiles] -> [tiles, 128]) and
    stored as rows of 128 elements. Whole tiles only (a ragged last tile would leave a partial row), at most 128 of
    them (PSUM's partitions), for the plans tiles_band serves (the batch index outside the out-channel tiles), and
    not for an fp32 stationary stored [M, K]: it is turned on TensorE already, at fp32's quarter rate, which then
    bounds the kernel, and the rows' transposes only add to it (user20's batched_matvec 8 x 1024 x 1024: 150.0 ->
    153.9 us); a 16-bit one's turns are 4x cheaper and its column stores' 2-byte descriptors dearer (decode
    attention bf16 4 x 8 x 2048 x 128: the score columns' stores were 366 us of DMA queue time)."""
    op, p = b.op, b.p
    return bool(op.w_batch and not fp32_turned(b) and b.Ho * b.Wo == 1 and b.KR == 0 and 1 < b.KT <= PMAX
                and b.pair == 1 and b.dup == 1
                and b.dst_chip is None and not op.pool and not op.residual and "n" in p.order and "k" in p.order
                and p.order.index("n") < p.order.index("k"))


def fp32_turned(b: _ConvBuilder) -> bool:
    """An fp32 stationary stored [M, K] turned on TensorE (not by DMA transposes: conv_weights.rows_by_dma), at
    fp32's quarter rate: column_rows' and vector_rows' turns would add to what then bounds the kernel."""
    from tilec.compiler.conv_weights import rows_by_dma  # late: conv_weights imports this module's callers
    op = b.op
    return op.w_layout != "ck" and DTYPE_BYTES[b.hbm[op.w].dtype] == 4 and not rows_by_dma(b)


def rows_store(b: _ConvBuilder, line: int) -> list[Stmt]:
    """The batch index's band (column_rows) turned on TensorE into PSUM, copied to SBUF, stored as its rows."""
    ob, rows_hbm = b.o_tiles, b.o_rows
    assert ob is not None and rows_hbm is not None
    ps = Buf(b.fresh(f"{b.op.out}_turned"), "psum", ob.dtype, (b.KT, b.PK))
    rows = Buf(b.fresh(f"{b.op.out}_rows"), "sbuf", ob.dtype, (b.KT, b.PK))
    return [Alloc(ps, line=line), ir.Transpose(whole(ps), View(ob, (full(b.PK), full(b.KT), a(0), a(0))), line=line),
            Alloc(rows, line=line), ir.Copy(whole(rows), whole(ps), line=line),
            Dma(View(rows_hbm, (a(b.var["n"]), full(b.KT), full(b.PK))), whole(rows), line)]


def vector_rows(b: _ConvBuilder) -> bool:
    """A batched matrix-vector product's vector (the moving column, `x[n, k]` on partitions k) loaded as rows of
    128 elements and turned on TensorE, instead of one DMA per contraction tile writing one element per partition:
    those 2- or 4-byte descriptors cost the DMA queues as much as the matrix's bytes (decode attention bf16 4 x 8 x
    2048 x 128: the weights' column loads, 57 us of queue time, with the values' 512 KB a head). Whole tiles only,
    at most 128 of them, a 16-bit vector or an fp32 one whose matrix is loaded as it is (column_rows' reason) and
    that has VECTOR_ROWS_FP32 tiles or more: its turn is an fp32 pass on TensorE, ~0.4 us (masked mean f32 32 x 512
    x 768, 4 tiles: 180.2 -> 183.3 us turned; decode attention f32 4 x 8 x 2048 x 128, 16 tiles: 459.5 -> 434.9)."""
    op = b.op
    fp32 = DTYPE_BYTES[b.hbm[op.x].dtype] == 4
    return bool(op.w_batch and not fp32_turned(b) and not partition_major(b, True) and b.Ho * b.Wo == 1 and b.H * b.W == 1
                and b.CR == 0
                and (VECTOR_ROWS_FP32 if fp32 else 2) <= b.CT <= PMAX and b.fold == 1 and not b.stack
                and b.src_chip is None
                and not op.x_transposed and b.p.tile_c == PMAX)


def vector_rows_load(b: _ConvBuilder, xb: Buf, line: int) -> list[Stmt]:
    """The vector's rows (vector_rows) loaded, turned on TensorE into PSUM and copied into the band."""
    assert b.x_rows_v is not None
    dt = b.hbm[b.op.x].dtype
    rows = Buf(b.fresh(f"{b.op.x}_vrows"), "sbuf", dt, (b.CT, PMAX))
    ps = Buf(b.fresh(f"{b.op.x}_vturned"), "psum", dt, (PMAX, b.CT))
    return [Alloc(rows, line=line), Dma(whole(rows), View(b.x_rows_v, (a(b.var["n"]), full(b.CT), full(PMAX))), line),
            Alloc(ps, line=line), ir.Transpose(whole(ps), whole(rows), line=line),
            Alloc(xb, line=line), ir.Copy(View(xb, (full(PMAX), full(b.CT), a(0), a(0))), whole(ps), line=line)]
