"""A conv -> [relu ->] conv chain kept on chip (the ResNet basic block's two convolutions).

The first conv's PSUM eviction (bias, relu already fused there) writes its output T straight into an SBUF buffer
laid out as the second conv's input: T's channels on the partitions in tiles of the second conv's in-channel tile,
one image's rows x columns in the free dimension, with a zeroed halo when the second conv reads T zero-padded. The
second conv's matmuls read that buffer in place (no store of T, no reload, no padded copy). Both convs run inside one
loop over the images; the buffer is allocated per image, so consecutive images use two buffers (the producer of
image n + 1 overlaps the consumer of image n).

The mechanism is general: `OnChip` records where a conv's moving operand already is (buffer, the tensor's row and
column at buffer position 0); `build_conv._ConvBuilder` takes it as `src_chip` (its matmuls read it, no band loads)
or `dst_chip` (its eviction writes it, no output band). Any producer whose eviction can write the layout (a
depthwise conv's channel-on-partition eviction, say) can feed a conv the same way.

Placement: on chip by default when the chain is eligible (`ineligible`), one image of T fits (the built kernel's
peak SBUF, checked against the Target), and the performance model's own costs (`estimate`) say it is faster than the
HBM round trip with each conv's best plan; `place T, sbuf` forces it (a located error with the reason when it
cannot), `place T, hbm` keeps the HBM path. The on-chip layout is the plain one (one copy of T per channel tile):
the row pairs and folded taps of 32/64-channel convs want a second, shifted copy of T on the other partition half,
which an eviction cannot write (engines keep their partitions), so such convs take their plain plan on chip;
row pairs on both sides (64 channels, fp32) are the exception: the producer's two partition halves hold even and
odd rows, exactly the two copies the consumer's pairs read (OnChip.paired).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from tilec.compiler import conv_pairs, ir
from tilec.compiler.build_util import loop
from tilec.compiler.ir import DTYPE_BYTES, Alloc, Buf, Stmt
from tilec.compiler.ops import ConvOp
from tilec.compiler.pool_segments import at_value
from tilec.compiler.schedule import MOVING_FMAX, ConvPlan, best_divisor, pairable
from tilec.errors import TilecError

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder


@dataclass(frozen=True)
class OnChip:
    """A tensor held in SBUF for one image: buffer [partitions (a channel tile), channel tiles, rows, columns];
    buffer row 0 (column 0) holds the tensor's row `row0` (column `col0`): negative for a zero halo above (left)."""
    tensor: str
    buf: Buf
    row0: int
    col0: int
    height: int  # the tensor's own rows and columns (the producer writes exactly those)
    width: int
    store: bool  # the tensor is also an output or read by another op: the producer stores it from the buffer too
    # paired: the layout of row pairs (32/64 channels): copy 0 of the channels on the first partition half, copy 1
    # (one row further) on the second, and only the rows the pairs read: index m of copy c holds row 2m + row0 + c
    paired: bool = False
    reach: int = 0  # rows from row0 the consumer's window reaches (halo included)
    # folded: the consumer's band copies (its taps folded into the contraction partitions): copy j, on partitions
    # [j*K, (j+1)*K), holds the tensor shifted by (rows, columns) copies[j]; the producer writes each copy
    copies: tuple[tuple[int, int], ...] = ((0, 0),)
    # phases: a phased conv's image (stem_chain.py): partition h*K + k, row i holds the tensor's row 2i + h
    phases: bool = False

    @property
    def halo(self) -> bool:
        """Whether the buffer has positions outside the tensor (zeroed once per image)."""
        cols = self.buf.shape[-1]
        return self.row0 < 0 or self.col0 < 0 or self.reach + self.row0 > self.height or \
            cols + self.col0 > self.width


def ineligible(producer: ConvOp, consumer: ConvOp) -> str:
    """Why the chain cannot stay on chip ("" if it can)."""
    name = producer.out
    dims = shape(producer)
    if producer.name != producer.out:
        return f"{name} is computed on the eviction of {producer.name} (a residual or pool), not by a conv itself"
    if producer.pool or producer.residual or producer.w_layout == "dw" or producer.groups > 1 \
            or producer.x_transposed or producer.w_batch or producer.bias_role != "k":
        return f"the conv writing {name} is not a plain dense convolution (pool, residual, depthwise, groups)"
    if consumer.w_layout == "dw" or consumer.groups > 1 or consumer.x_transposed or consumer.w_batch \
            or consumer.residual == name:
        return f"the conv reading {name} is not a plain dense convolution (depthwise, groups, or {name} as residual)"
    if consumer.dim("N") != producer.dim("N") or (consumer.dim("H"), consumer.dim("W")) != dims[2:]:
        return f"{name} is not read image by image as [N, C, H, W]"
    if consumer.offset[0] > 0 or consumer.offset[1] > 0:
        return f"the conv reading {name} starts past its first row or column (a crop)"
    rows, cols = extent(consumer)
    if rows + consumer.offset[0] < dims[2] or cols + consumer.offset[1] < dims[3]:
        return f"the conv reading {name} does not read all of its rows and columns"
    return ""


def shape(producer: ConvOp) -> tuple[int, int, int, int]:
    """The conv's output seen as [N, K, rows, columns] (how build_conv views it in HBM)."""
    return producer.dim("N"), producer.dim("K"), producer.dim("Ho"), producer.dim("Wo")


def extent(consumer: ConvOp) -> tuple[int, int]:
    """The rows and columns of its input (halo included) the consumer's window reaches over one image."""
    d = dict(consumer.dims)
    return ((d["Ho"] - 1) * consumer.stride[0] + (d["R"] - 1) * consumer.dilation[0] + 1,
            (d["Wo"] - 1) * consumer.stride[1] + (d["S"] - 1) * consumer.dilation[1] + 1)


def chain_plans(producer: ConvOp, pplan: ConvPlan, consumer: ConvOp, cplan: ConvPlan, hbm: dict
                ) -> tuple[ConvPlan, ConvPlan, str]:
    """The plans the chain is built with, and whether the image is paired: images outermost in both, whole rows.
    When both convs use row pairs (64 channels, fp32) they keep them: the producer's two partition halves hold
    even and odd rows, which are exactly the two copies the consumer's pairs read (the producer swaps its halves
    when the copies start at an odd row). Otherwise no row pairs (their halves would hold rows the plain layout
    wants on one half), the consumer's in-channel tiles those of the producer's out-channels, and its taps unfolded
    (folded taps read column-shifted copies of T that the eviction does not write)... unless the producer can
    write them: one out-channel tile of 32 or 64 channels (each copy on a 32-aligned partition start), as many
    copies as fit 128 partitions, none reaching before the image (the consumer's padding covers the shifts, or a
    column shift is clipped statically on one column tile per row): then the image is folded, the producer's
    stationary repeats its channels once per copy and its eviction writes each copy at its shift.
    Returns (producer plan, consumer plan, layout: plain | paired | folded)."""
    from tilec.compiler.build_conv import _ConvBuilder

    def n_first(order: tuple[str, ...]) -> tuple[str, ...]:
        return ("n",) + tuple(r for r in order if r != "n")
    p = replace(pplan, band_x=0, order=n_first(pplan.order))
    c = replace(cplan, band_x=0, order=n_first(cplan.order))
    if hbm[producer.x].dtype != "f32" and all(pairs_16(op, plan) != plan for op, plan in ((producer, p), (consumer, c))):
        p, c = pairs_16(producer, p), pairs_16(consumer, c)
    try:
        pb, cb = _ConvBuilder(producer, p, hbm, _unnamed), _ConvBuilder(consumer, c, hbm, _unnamed)
        if pb.pair == cb.pair == 2 and not pb.halves and not cb.halves and pb.NXB == cb.NXB == 1:
            return p, c, "paired"
        pb = _ConvBuilder(producer, replace(p, pair=1), hbm, _unnamed)
        k, row0, col0 = producer.dim("K"), consumer.offset[0], consumer.offset[1]
        if cb.fold > 1 and cb.pair == 1 and not cb.halves and pb.KT == 1 and not pb.KR and k in (32, 64) \
                and k * len(cb.shifts) <= pb.p.tile_k * 4 and pb.NXB == 1 \
                and all(dr <= -row0 and (dc <= -col0 or pb.XT == 1) for dr, dc in cb.shifts):
            return replace(p, pair=1), c, "folded"
    except TilecError:  # a plan the builders refuse: the plain layout (their error, if any, comes later)
        pass
    return replace(p, pair=1), replace(c, pair=1, fold=1, tile_c=pplan.tile_k), "plain"


def pairs_16(op: ConvOp, plan: ConvPlan) -> ConvPlan:
    """A 16-bit conv's plan with the row pairs the fp32 default gives it (schedule._default_conv): on its own a
    16-bit conv is bound by its DMAs, which the pairs' stores of every other row make slower, but in a chain kept
    on chip the paired layout removes T's store and reload (ResNet block f16, batch 8: 212 -> 146 us model).
    The plan itself when it has no folded pair of copies."""
    if plan.pair == 2 or plan.fold != 2 or not pairable(op) or plan.band % 2:
        return plan
    rows = best_divisor(plan.band // 2, MOVING_FMAX // plan.tile_x)
    return replace(plan, pair=2, band=2 * rows, rows=rows)


def _unnamed(base: str) -> str:
    return base  # (a builder made only to read its plan's structure names nothing)


def layout(producer: ConvOp, pplan: ConvPlan, consumer: ConvOp, cplan: ConvPlan, dtype: str, name: str,
           store: bool, kind: str, hbm: dict) -> OnChip:
    """T's buffer: the consumer's whole-image input (its padded rows and columns), channel tiles of the producer;
    paired: both copies of row pairs, the rows they read (one in two)."""
    dims = shape(producer)
    rows, cols = extent(consumer)
    row0, col0 = consumer.offset
    rows, cols = max(rows, dims[2] - row0), max(cols, dims[3] - col0)
    k = producer.dim("K")
    copies: tuple[tuple[int, int], ...] = ((0, 0),)
    if kind == "paired":  # copy c, index m: row 2m + row0 + c; the producer writes every row of T into one copy
        buf = Buf(name, "sbuf", dtype, (2 * k, 1, (rows + 1) // 2, cols))
    elif kind == "folded":  # the consumer's band copies, each shifted by its tap delta
        from tilec.compiler.build_conv import _ConvBuilder
        copies = tuple(_ConvBuilder(consumer, cplan, hbm, _unnamed).shifts)
        buf = Buf(name, "sbuf", dtype, (len(copies) * k, 1, rows, cols))
    else:
        buf = Buf(name, "sbuf", dtype, (pplan.tile_k, math.ceil(k / pplan.tile_k), rows, cols))
    return OnChip(producer.out, buf, row0, col0, dims[2], dims[3], store, kind == "paired", rows, copies)


Rename = Callable[[list, list, str], tuple[list, list]]  # (consts, stmts, op's output) -> prefixed (pipeline)


def build_chain(producer: ConvOp, pplan: ConvPlan, consumer: ConvOp, cplan: ConvPlan, kind: str,
                hbm: dict[str, Buf], fresh_p: Callable[[str], str], fresh_c: Callable[[str], str], store: bool,
                rename: Rename) -> tuple[list[tuple[str, int]], list[Stmt]]:
    """Both convs' preparation, then one loop over images: T's buffer (halo zeroed), the producer's nest evicting
    into it, the consumer's nest reading it. `plans`: chain_plans's."""
    from tilec.compiler.build_conv import _ConvBuilder  # late: build_conv's type hints name OnChip
    name = producer.out
    t = hbm[name]
    chip = layout(producer, pplan, consumer, cplan, t.dtype, fresh_p(f"{name}_img"), store, kind, hbm)
    pb = _ConvBuilder(producer, pplan, hbm, fresh_p, dst_chip=chip)
    cb = _ConvBuilder(consumer, cplan, hbm, fresh_c, src_chip=chip)
    n = pb.var["n"]
    cb.var["n"] = n  # one loop over the images for both convs
    if skip_from_bands(pb, cb):  # the residual read from the producer's band copies: each band its own buffer
        pb.x_bands = cb.skip_bands = {}
        cb.skip_oy = pb.oy

    def named(b: _ConvBuilder, out: str, parts: list[list[Stmt]]) -> tuple[list, list[list[Stmt]]]:
        consts, stmts = rename(b.consts(), [ir.Block("", tuple(part)) for part in parts], out)
        return consts, [list(st.body) for st in stmts]
    cb.peel_last = peels_last(cb)
    p_parts, c_parts = _built(pb, cb, 2 if cb.peel_last else 1)
    p_consts, (p_pre, *p_bodies) = named(pb, producer.out, p_parts)
    c_consts, (c_pre, *c_bodies) = named(cb, consumer.out, c_parts)
    line = producer.line
    bodies = [[Alloc(chip.buf, zero=chip.halo, line=line)] + p_body + c_body
              for p_body, c_body in zip(p_bodies, c_bodies)]
    label = (f"main: {producer.name} then {consumer.name} image by image, {name} kept in SBUF"
             + (" (and stored)" if store else "") + (f", fused into {consumer.out}" if consumer.fused else ""))
    N = producer.dim("N")
    nest = loop(n, N - 1 if cb.peel_last else N, bodies[0], note=pb.T["n"], line=pb.L["n"])
    if cb.peel_last:
        nest.append(ir.Block("the last image, its odd band regrouped for its store",
                             tuple(at_value(bodies[1], n, N - 1)), line))
    return p_consts + c_consts, p_pre + c_pre + [ir.Block(label, tuple(nest), line)]


def _built(pb: "_ConvBuilder", cb: "_ConvBuilder", images: int) -> tuple[list[list[Stmt]], list[list[Stmt]]]:
    """Each builder's prelude, then its nest of one image `images` times (the second: the last image, built apart
    by peels_last). The consumer's build i reads the producer's build i's band copies (skip_from_bands), which
    each build names anew. The last image's selection stationaries (conv_pairs.regroup_prelude) are built there,
    not before the loop: GpSimdE's identity and memsets held back the first image's start on trn1, where VectorE
    and GpSimdE share a port (resnet_block bf16 batch 8 trn1: 79.51 us, 78.28 built there, 79.26 on main)."""
    p_parts, bands = [pb.prelude()], []
    for _ in range(images):
        p_parts.append(pb.per_image())
        bands.append(None if pb.x_bands is None else dict(pb.x_bands))
    c_parts = [cb.prelude()]
    for i in range(images):
        cb.skip_bands, cb.last_image = bands[i], i == 1
        c_parts.append(cb.regroup_setup + cb.per_image() if i else cb.per_image())
    return p_parts, c_parts


def peels_last(cb: "_ConvBuilder") -> bool:
    """Whether the batch's last image is built apart from the image loop, so that the consumer's odd band (its
    residual added) is regrouped on TensorE before its store (conv_pairs.regroup_store) in that image only. The
    last store is the kernel's tail: it waits behind the band before's 1,792-run store (the model orders their
    HBM writes, which interleave: tilec/perf/deps.py), then moves 1,792 runs of its own (bf16 ResNet block batch
    8: 5.4 us after TensorE's last matmul). Regrouped, it moves 128 runs for 4 selection matmuls once, where
    TensorE has nothing left to do; in every image they would add to the TensorE-bound batch (85.3 -> 94.0 us)."""
    if cb.op.residual is None or cb.N == 1:
        return False
    cb.peel_last = True  # (what conv_pairs.regroups asks of a batch with a residual)
    cb.peel_last = conv_pairs.regroups(cb)
    return cb.peel_last


def estimate(producer: ConvOp, plans: tuple[ConvPlan, ConvPlan], consumer: ConvOp,
             chip: tuple[ConvPlan, ConvPlan, str], hbm: dict, target: str) -> tuple[float, float]:
    """(HBM path, on-chip path) in ns, from the performance model's own constants: each conv's TensorE time under
    its plan (matmuls x (max(min cycles, moving columns) + fixed), x the fp32 factor); the HBM path adds T's store
    and reload (bytes over all DMA engines, and one store -> load round trip of latency), the on-chip path the
    zeroing of each image's buffer and, for row pairs whose halves go to two rows, the second eviction. `chip`:
    chain_plans's."""
    from tilec.compiler.build_conv import _ConvBuilder
    from tilec.perf.params import target_params  # the model's constants, late: perf reads kernels
    prm = {name: value for name, value, _ in target_params(target).table()}

    def pe(op: ConvOp, plan: ConvPlan) -> float:
        b = _ConvBuilder(op, plan, hbm, _unnamed)
        per_group = b.n_groups if (b.fold > 1 or b.pair > 1) else b.CTB * b.R * b.S
        groups = b.N * b.KTB * b.NXB * b.NB * b.G * b.XT
        factor = prm["mm_fp32_factor"] if hbm[op.x].dtype == "f32" else 1
        return groups * per_group * (max(prm["mm_min_cycles"], b.p.rows * b.p.tile_x) + prm["mm_fixed_cycles"]) \
            * factor / prm["tensor_ghz"]
    t = hbm[producer.out]
    size = math.prod(shape(producer)) * DTYPE_BYTES[t.dtype]
    cb = _ConvBuilder(consumer, plans[1], hbm, _unnamed)
    copies = len(cb.shifts) if cb.fold > 1 else 1  # band copies of T the consumer loads
    bw = prm["dma_engines"] * prm["dma_engine_bw"]
    trip = size * (1 + copies) / bw + 2 * prm["dma_latency_ns"] + prm["dma_write_ack_ns"]
    hbm_ns = pe(producer, plans[0]) + pe(consumer, plans[1]) + trip
    pplan, cplan, kind = chip
    image = layout(producer, pplan, consumer, cplan, t.dtype, "", False, kind, hbm)
    _, tiles, rows, cols = image.buf.shape
    zero = producer.dim("N") * tiles * rows * cols / prm["vector_ghz"]
    more = len(image.copies) - 1 + (1 if image.paired and image.row0 % 2 else 0)  # evictions beyond one a group
    pb = _ConvBuilder(producer, pplan, hbm, _unnamed)
    evictions = pb.N * pb.NB * pb.G * pb.XT * more
    second = evictions * (pplan.rows * pplan.tile_x + prm["scalar_static_cycles"]) / prm["scalar_ghz"]
    return hbm_ns, pe(producer, pplan) + pe(consumer, cplan) + zero + second


def skip_from_bands(pb: "_ConvBuilder", cb: "_ConvBuilder") -> bool:
    """Whether the consumer's residual (`Y = relu(conv(T) + X)`, X the producer's input) is read from the
    producer's own X band copies instead of loaded again: row pairs on both sides (the producer's copy h, on
    partitions h*C.., holds X one row further than copy 0; the consumer's partition h*K + k holds output rows
    2i + h, so both phases read band row 2i - oy of their copy: one strided view), every producer band peeled
    (its own buffer, kept for the image), the same bands on both sides, whole rows of X's own columns. The
    residual's paired load was 1,792 runs of 112 B per bf16 band: with the stores, it made the ResNet block's
    batch DMA-bound (8.9 us of DMA engine time per image against TensorE's 8.1)."""
    pop, cop = pb.op, cb.op
    return (cop.residual == pop.x and cb.hbm[cop.residual].dtype == pb.hbm[pop.x].dtype and cop.post_relu
            and pb.pair == cb.pair == 2 and not (pb.halves or pb.phased or cb.halves or cb.phased)
            and pb.shifts == [(0, 0), (1, 0)] and pb.Q == pb.C == cb.K and pb.CTB == 1 and pb.slots == 1
            and pb.p.x_bufs != 1 and pb.NB == cb.NB and pb.p.band == cb.p.band and pb.Ho == cb.Ho
            and all(pb.band_clip(b) != (0, 0) for b in range(pb.NB)) and pb.NXB == cb.NXB == 1
            and pb.col0 == 0 and pb.in_cols() == pb.W == cb.Wo and pb.sy == 1 and pb.H == pb.Ho
            and cb.dst_chip is None and not cop.pool and cb.wy == cb.wx == 1)
