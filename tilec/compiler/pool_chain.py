"""A conv -> window pool chain kept on chip (issue 13: the ResNet stem's conv, then its 3x3 s2 pad 1 max pool).

A pool whose windows tile the conv's rows runs on the conv's PSUM eviction (build_conv's fused pool). An
overlapping, strided or padded window does not: each pooled row reads rows of two conv bands (the halo). Here the
conv's eviction writes each image's output T into one SBUF buffer, [the out-channel tile's partitions, channel tile
t's rows from t * Ho on, Wo columns] (conv_epilogue.chip_rows), and the pool's bands read their rows, halo included,
in place (WindowPool.read_chip): no store of T, no reload. From batch 2 on the pool runs one image behind the conv
(`skewed`, two image buffers): the vector engines run their instructions in order, and a pool queued before the
next image's conv held that conv's band memsets and evictions, so TensorE waited (conv 3x3 64 -> 128 at 56 x 56 then
the 3x3 s2 max pool, bf16 batch 8: 153.9 us in one loop per image, 90.0 skewed, 115.7 through HBM).

The pool then has the conv's channel tiles on the partitions, one image at a time: it cannot spread few channels'
rows over the other partitions (the standalone pool's blocks of output rows), so with 64 channels its passes use
half the lanes. Whether that is faster than the HBM round trip is the model's question (`estimate`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import replace
from typing import Callable

from tilec.compiler import ir
from tilec.compiler.build_util import loop, map_aff
from tilec.compiler.conv_chain import OnChip, Rename
from tilec.compiler.ir import DTYPE_BYTES, Aff, Alloc, Buf, Stmt, Term
from tilec.compiler.ops import ConvOp, PoolOp
from tilec.compiler.pool_window import WindowPool
from tilec.compiler.schedule import ConvPlan, PoolPlan, window_pool_plan


def ineligible(producer: ConvOp, pool: PoolOp, pplan: ConvPlan) -> str:
    """Why the conv's output cannot stay on chip for the pool ("" if it can)."""
    name = producer.out
    if producer.name != producer.out:
        return f"{name} is computed on the eviction of {producer.name} (a residual or pool), not by a conv itself"
    if producer.pool or producer.residual or producer.w_layout == "dw" or producer.groups > 1 \
            or producer.x_transposed or producer.w_batch or producer.bias_role != "k":
        return f"the conv writing {name} is not a plain dense convolution (pool, residual, depthwise, groups)"
    if pool.window is None or pool.src != name:
        return f"the pool does not read {name} through a window"
    n, k, ho, wo = producer.dim("N"), producer.dim("K"), producer.dim("Ho"), producer.dim("Wo")
    if (pool.dim("B"), pool.dim("H"), pool.dim("W")) != (n * k, ho, wo):
        return f"the pool does not read {name} image by image as [N, K, Ho, Wo]"
    if k % pplan.tile_k:
        return f"the conv's {k} output channels are not whole tiles of {pplan.tile_k}"
    return ""


def plans(producer: ConvOp, pplan: ConvPlan, pool: PoolOp, qplan: PoolPlan | None) -> tuple[ConvPlan, PoolPlan]:
    """The conv's plan with images outermost and whole rows (its eviction writes the image), and the pool's: the
    conv's channel tiles on the partitions, no blocks of rows (the rows are where the conv put them), the pool's own
    band (or the default's for one image's channels)."""
    order = ("n",) + tuple(r for r in pplan.order if r != "n")
    p = replace(pplan, band_x=0, order=order, pair=1)
    op = pool.windowed()
    assert op.window is not None
    if qplan is None or qplan.across:  # (blocks over partition tiles: the chain keeps the conv's channel tiles)
        qplan = window_pool_plan(replace(op, dims=(("B", producer.dim("K")),) + op.dims[1:]))
    return p, PoolPlan(p.tile_k, min(qplan.band, op.window.out[0]), 1)


def image_bytes(producer: ConvOp, pplan: ConvPlan, dtype: str) -> int:
    """SBUF bytes per partition of one image of the conv's output (every channel tile)."""
    return math.ceil(producer.dim("K") / pplan.tile_k) * producer.dim("Ho") * producer.dim("Wo") * DTYPE_BYTES[dtype]


def build(producer: ConvOp, pplan: ConvPlan, pool: PoolOp, qplan: PoolPlan, hbm: dict[str, Buf],
          fresh_p: Callable[[str], str], fresh_c: Callable[[str], str], store: bool,
          rename: Rename) -> tuple[list[tuple[str, int]], list[Stmt]]:
    """Both ops' preparation (HBM views, weights), then the images: T's buffer, the conv's nest evicting into it,
    the pool's bands reading it. One image: in that order. Several: skewed (`skewed`). The plans are `plans`'s."""
    from tilec.compiler.build_conv import _ConvBuilder  # late: build_conv imports the chain modules' types
    name, t = producer.out, hbm[producer.out]
    k, ho, wo, n_img = producer.dim("K"), producer.dim("Ho"), producer.dim("Wo"), producer.dim("N")
    shape = (pplan.tile_k, math.ceil(k / pplan.tile_k) * ho, wo)
    bufs = [Buf(fresh_p(f"{name}_img{j + 1 if j else ''}"), "sbuf", t.dtype, shape)
            for j in range(1 if n_img == 1 else 2)]  # two images in flight from batch 2 on (`skewed`)
    chip = OnChip(name, bufs[0], 0, 0, ho, wo, store, reach=ho)
    pb = _ConvBuilder(producer, pplan, hbm, fresh_p, dst_chip=chip)
    n = pb.var["n"]
    wp = WindowPool(pool.windowed(), qplan, hbm, fresh_c)
    wp.read_chip(bufs[0], n, k)
    p_consts, p_stmts = rename(pb.consts(), [ir.Block("", tuple(pb.prelude())), ir.Block("", tuple(pb.per_image()))],
                               producer.out)
    built = wp.build()
    views = len(wp.views)
    q_consts, q_stmts = rename([("TILE_P", qplan.tile_b), ("BAND", wp.OB)],
                               [ir.Block("", tuple(built[:views])), ir.Block("", tuple(built[views:]))], pool.out)
    conv, pooled, line = list(p_stmts[1].body), list(q_stmts[1].body), producer.line
    label = (f"main: {producer.name} then {pool.out} image by image, {name} kept in SBUF"
             + (" (and stored)" if store else ""))
    if n_img == 1:
        body = [Alloc(bufs[0], line=line)] + conv + pooled
        main = ir.Block(label, tuple(loop(n, 1, body, note=pb.T["n"], line=pb.L["n"])), line)
    else:
        main = ir.Block(label + ", the pool one image behind", tuple(skewed(conv, pooled, n, n_img, bufs, line)),
                        line)
    return p_consts + q_consts, list(p_stmts[0].body) + list(q_stmts[0].body) + [main]


def skewed(conv: list[Stmt], pooled: list[Stmt], n: str, images: int, bufs: list[Buf], line: int,
           last: list[Stmt] | None = None, prep: tuple[Stmt, ...] = ()) -> list[Stmt]:
    """conv(0), then conv(j + 1) before pool(j) for every image j, then the last pool: the pool of an image is
    queued on the vector engines (in order) after the next image's conv, so the conv's band memsets and evictions
    never wait for a pool, and TensorE runs on while the pool works (`conv` and `pooled` are one image's nests,
    with the loop variable n and the buffer bufs[0]; `last`, if given, is the last image's pool, which nothing
    follows; `prep`, what sets up the buffers once after their allocation). Image j's buffer is bufs[j % 2]: the
    loop runs over pairs of images, m, with the two steps written out."""
    m = n + "_p"

    def at(stmts: list[Stmt], c: int, scale: int = 0, slot: int = 0) -> list[Stmt]:
        """stmts for image scale * m + c (a constant image when scale is 0), in buffer bufs[slot]."""
        def fn(x: Aff) -> Aff:
            coef = sum(u.coef for u in x.terms if u.var == n)
            rest = tuple(u for u in x.terms if u.var != n)
            return Aff(rest + ((Term(m, coef * scale),) if coef and scale else ()), x.const + coef * c)
        out = list(map_aff(tuple(stmts), fn))
        return out if slot == 0 else list(swap_buf(tuple(out), bufs[0], bufs[1]))
    steps = images - 1  # step j: conv(j + 1), pool(j)
    out: list[Stmt] = [Alloc(b, line=line) for b in bufs] + list(prep) + at(conv, 0)
    pair = at(conv, 1, 2, 1) + at(pooled, 0, 2, 0) + at(conv, 2, 2, 0) + at(pooled, 1, 2, 1)
    note = f"convs of images 2 * {m} + 1 and + 2, pools of 2 * {m} and + 1"
    out += loop(m, steps // 2, pair, note=note, line=line) if steps >= 2 else []
    if steps % 2:
        out += at(conv, steps, 0, steps % 2) + at(pooled, steps - 1, 0, (steps - 1) % 2)
    return out + at(pooled if last is None else last, images - 1, 0, (images - 1) % 2)


def swap_buf(node, old: Buf, new: Buf):
    """An IR node with every use of buffer `old` made a use of `new` (the same shape)."""
    if node == old:
        return new
    if isinstance(node, tuple):
        return tuple(swap_buf(x, old, new) for x in node)
    if dataclasses.is_dataclass(node) and not isinstance(node, (type, Buf, Term, Aff)):
        return dataclasses.replace(node, **{f.name: swap_buf(getattr(node, f.name), old, new)
                                            for f in dataclasses.fields(node)})
    return node

def lost(producer: ConvOp, pplan: ConvPlan, pool: PoolOp, qplan: PoolPlan | None) -> str:
    """What the chain gives up against each op's own plan ("" nothing): on chip both keep to the conv's channel
    tiles on the partitions, so a conv whose plan puts two parts of its rows on the two partition halves (row pairs
    or band halves of 32/64 channels) or a pool spreading few channel rows over the partitions in blocks of rows
    runs on half of them. (The ResNet stem, 64 channels, has both: on the model 143.0 us forced on chip against
    78.9 through HBM, docs/notes/pool20.md.)"""
    why = []
    if pplan.pair > 1:
        why.append(f"{producer.name}'s plan puts two parts of its output rows on the two partition halves (row "
                   f"pairs of {producer.dim('K')} channels), which its eviction cannot write into one image")
    own = qplan if qplan is not None else window_pool_plan(pool.windowed())
    if own.blocks > 1 and not own.across:  # (blocks over several tiles: a smaller gain than the round trip's)
        why.append(f"the pool spreads its {pool.dim('B')} channel rows over {pool.dim('B') * own.blocks} "
                   f"partitions in {own.blocks} blocks of output rows, where the conv's image holds whole channels")
    return "; ".join(why)


def round_trip_ns(producer: ConvOp, dtype: str, target: str, store: bool = False) -> float:
    """T's store and reload through HBM on the performance model's constants: its bytes twice over every DMA
    engine, a DMA latency each way and the write's acknowledgement (what the chain saves when it loses nothing);
    store (T is stored anyway: an output, or read by another op): the reload only."""
    from tilec.perf.params import target_params  # the model's constants, late: perf reads kernels
    prm = {name: value for name, value, _ in target_params(target).table()}
    size = producer.dim("N") * producer.dim("K") * producer.dim("Ho") * producer.dim("Wo") * DTYPE_BYTES[dtype]
    moved = size / (prm["dma_engines"] * prm["dma_engine_bw"]) + prm["dma_latency_ns"]
    return moved if store else 2 * moved + prm["dma_write_ack_ns"]
