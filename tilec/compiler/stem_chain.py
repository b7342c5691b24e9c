"""The ResNet stem's conv -> 3x3 s2 max pool kept on chip in the conv's row phases (issue 13, stem_maxpool).

The phased stem (conv_pairs.phases_pay: fp32, few input channels, 32/64 output channels) computes the even output
rows of a band on the stationary's first column half and the odd rows on the second. Evicted in halves, partition
h*K + k, row i of its image buffer P holds T[k, 2i + h]. A 3x3 stride-2 pad-1 pool's output row i reads T's rows
2i - 1, 2i and 2i + 1: the odd rows i - 1 and i and the even row i, so the pool is, per block of output rows,
  Hc = the pass along x on all 2K partitions (windows of 3 columns at stride 2: one VectorE tensor_reduce over
       the overlapping windows, 3 inputs per output, where two tensor_tensor passes streamed 4; stem20: f32 batch 1
       38.58 -> 38.17 us, bf16 25.34 -> 24.34; P's column 0 is T's column -1, set to -inf once per buffer, so one
       instruction covers every window where column 0's clipped window took a second, 0.17 us a block, stem22),
  a DMA moving Hc's even rows to the odd half's partitions (no engine moves data across partitions, nki-spec §1),
  V = max(Hc[odd i], Hc[odd i - 1]) on the odd half, in place on its partitions, while that DMA runs,
  Y = max(V, the moved even rows) on the odd half, stored to HBM from there.
(The DMA used to move V to the even half instead: it waited for V, and its destination's DMA engines 0-7 are the
ones the conv's band loads keep busy; stem20: f32 batch 1 39.62 -> 38.58 us, batch 8 247.41 -> 244.58.)
T never goes to HBM: per 224 x 224 image (f32, 64 channels) 3.2 MB of store and 3.2 MB of reload become 0.8 MB of
SBUF -> SBUF DMA. The pool runs one image behind the conv (pool_chain.skewed) and in blocks of the conv band's rows
(one block's chain DMA -> max -> store overlaps the next block's passes; the whole image in one block was 327 us
instead of 258 at batch 8 in a hand-edited kernel). Engines: VectorE takes the passes along x and V (at batch 1 V of
the store before the last on GpSimdE: pool_image), GpSimdE the last max (it waits for the DMA; GpSimdE's other
work, the conv's halo copies, is queued before it, so the conv's loads never wait behind a pool). The last image's
pool ends in blocks of the conv's eviction groups (blocks). On the model, stem_maxpool f32 batch 1 53.97 -> 40.30
us run, batch 8 350.37 -> 247.41; bf16 33.83 -> 25.78 and 161.97 -> 124.58 (docs/notes/stem19.md); stem20: f32
37.39 and 245.39, bf16 24.00 and 113.80 (docs/notes/stem20.md); stem22: f32 37.39 and 223.71, bf16 22.78 and
100.80 (also the conv's copies: columns_per_copy).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Iterable

from tilec.compiler import conv_fold, ir
from tilec.compiler.build_util import a, hbm_view, loop, sl, term
from tilec.compiler.conv_chain import OnChip, Rename
from tilec.compiler.ir import DTYPE_BYTES, Alloc, Binary, Buf, Dma, Reduce, Stmt, View, full, whole
from tilec.compiler.ops import ConvOp, PoolOp
from tilec.compiler.schedule import PMAX, ConvPlan
from tilec.target import compiled

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder


def ineligible(producer: ConvOp, pplan: ConvPlan, pool: PoolOp, hbm: dict[str, Buf], store: bool) -> str:
    """Why the phased chain does not apply ("" if it does): the pool is a 3x3 stride-2 max pool with padding 1 over
    an even number of rows and columns, the conv's plan is phased with one tile of its 32 or 64 output channels, and
    T is read by the pool only."""
    w = pool.windowed().window
    assert w is not None
    if (pool.pool.wy, pool.pool.wx, pool.pool.op) != (3, 3, "maximum") or w.stride != (2, 2) \
            or w.offset != (-1, -1) or pool.relu:
        return "the pool is not a 3x3 max pool of stride 2 and padding 1"
    ho, wo = producer.dim("Ho"), producer.dim("Wo")
    if ho % 2 or wo % 2 or w.out != (ho // 2, wo // 2):
        return f"{producer.out}'s rows and columns ({ho} x {wo}) are not even"
    if store:
        return f"{producer.out} is also stored"
    dummy = Buf("", "sbuf", hbm[producer.out].dtype, (2 * producer.dim("K"), ho // 2, wo + 1))
    b = builder(producer, pplan, hbm, OnChip(producer.out, dummy, 0, -1, ho, wo, False, reach=ho, phases=True))
    if not b.phased or b.PK != 2 * b.K or b.KT != 1:
        return f"{producer.name}'s plan does not compute its rows in phases on two partition halves"
    return ""


def plan(pplan: ConvPlan) -> ConvPlan:
    """The conv's plan in the chain: images outermost, whole rows (its eviction writes the image), phases kept."""
    return replace(pplan, band_x=0, order=("n",) + tuple(r for r in pplan.order if r != "n"))


def builder(producer: ConvOp, pplan: ConvPlan, hbm: dict[str, Buf], chip: OnChip | None = None):
    """The conv's builder (late import: build_conv imports the chain modules)."""
    from tilec.compiler.build_conv import _ConvBuilder
    return _ConvBuilder(producer, pplan, hbm, lambda s: s, dst_chip=chip)


def seam_ns(producer: ConvOp, dtype: str, target: str) -> float:
    """What the chain adds on the DMA queues: the odd rows' pooled half moved to the even partitions (the pooled
    image's bytes) and a DMA latency per block, on the performance model's constants."""
    from tilec.perf.params import target_params  # the model's constants, late: perf reads kernels
    prm = {name: value for name, value, _ in target_params(target).table()}
    size = producer.dim("N") * producer.dim("K") * producer.dim("Ho") * producer.dim("Wo") // 4 * DTYPE_BYTES[dtype]
    return size / (prm["dma_engines"] * prm["dma_engine_bw"]) + prm["dma_latency_ns"]


def build(producer: ConvOp, pplan: ConvPlan, pool: PoolOp, hbm: dict[str, Buf], fresh_p: Callable[[str], str],
          fresh_c: Callable[[str], str], rename: Rename) -> tuple[list[tuple[str, int]], list[Stmt]]:
    """Both ops' preparation, then the images (pool_chain.skewed from batch 2 on): the phased conv evicting into P,
    the pool reading P in blocks of the band's rows. pplan is pool_chain.plans's order with the phases kept."""
    from tilec.compiler import pool_chain  # (pool_chain imports build_conv late, as here)
    name, t = producer.out, hbm[producer.out]
    k, ho, wo, n_img = producer.dim("K"), producer.dim("Ho"), producer.dim("Wo"), producer.dim("N")
    bufs = [Buf(fresh_p(f"{name}_phases{j + 1 if j else ''}"), "sbuf", t.dtype, (2 * k, ho // 2, wo + 1))
            for j in range(1 if n_img == 1 else 2)]
    chip = OnChip(name, bufs[0], 0, -1, ho, wo, False, reach=ho, phases=True)  # (column 0: T's column -1)
    from tilec.compiler.build_conv import _ConvBuilder
    pb = _ConvBuilder(producer, pplan, hbm, fresh_p, dst_chip=chip)
    n = pb.var["n"]
    y_view, views = hbm_view(hbm[pool.out], (n_img, k, ho // 2, wo // 2), fresh_c(f"{pool.out}_img"), pool.line)
    po = ho // 2
    pooled = pool_image(pool, bufs[0], y_view, n, k, blocks(po, pplan.band // 2, pplan.band // 2), fresh_c)
    last = pool_image(pool, bufs[0], y_view, n, k, blocks(po, pplan.band // 2, pplan.rows), fresh_c, n_img == 1)
    p_consts, p_stmts = rename(pb.consts(), [ir.Block("", tuple(pb.prelude())), ir.Block("", tuple(pb.per_image()))],
                               producer.out)
    q_consts, q_stmts = rename([], [ir.Block("", tuple(views)), ir.Block("", tuple(pooled)),
                                    ir.Block("", tuple(last))], pool.out)
    conv, pooled, line = list(p_stmts[1].body), list(q_stmts[1].body), producer.line
    last = list(q_stmts[2].body)
    label = (f"main: {producer.name} then {pool.out} image by image, {name} kept in SBUF in row phases (partition "
             f"h * {k} + k holds rows 2i + h)")
    edge = Buf(fresh_c(f"{name}_edge"), "sbuf", t.dtype, (2 * k, ho // 2, 1))
    prep: list[Stmt] = [Alloc(edge, zero=True, line=pool.line)]
    prep += [ir.Scalar(View(buf, (full(2 * k), full(ho // 2), sl(0, 1))), whole(edge), "add", float("-inf"), pool.line)
             for buf in bufs]  # T's column -1: outside, -inf for the max pool's windows
    if n_img == 1:
        body = [Alloc(bufs[0], line=line)] + prep + conv + last
        main = ir.Block(label, tuple(loop(n, 1, body, note=pb.T["n"], line=pb.L["n"])), line)
    else:
        main = ir.Block(label + ", the pool one image behind",
                        tuple(pool_chain.skewed(conv, pooled, n, n_img, bufs, line, last, tuple(prep))), line)
    return p_consts + q_consts, list(p_stmts[0].body) + list(q_stmts[0].body) + [main]


def blocks(po: int, band: int, tail: int) -> list[list[tuple[int, int]]]:
    """The pool's stores, each a list of blocks of output rows (first row, rows): one store and one block per conv
    band (`band` rows of each phase), the last band's block cut into blocks of `tail` rows. A block can start when
    the conv has evicted its last row, so after the image's conv only the last block's chain (its passes, the seam
    DMA, the last max) and the band's store are left: the last image's pool takes the conv's eviction groups
    (`ConvPlan.rows`) as its tail. (One store per block instead: stores on one DMA stream follow each other at a
    write acknowledgement each, 9 us for 7 stores in the model, bf16 batch 1 25.78 -> 31.48 us.)"""
    start = (po - 1) // band * band
    return [[(r0, min(band, start - r0))] for r0 in range(0, start, band)] + \
        [[(r0, min(tail, po - r0)) for r0 in range(start, po, tail)]]


def pool_image(pool: PoolOp, img: Buf, y: Buf, n: str, k: int, stores: list[list[tuple[int, int]]],
               fresh: Callable[[str], str], alone: bool = False) -> list[Stmt]:
    """One image's pool from its phases image img [2K, Ho / 2, 1 + Wo] (column 0: T's column -1, -inf) into y
    [N, K, Po, Qo] at image n, in `stores` (each a list of blocks: first output row, rows; static: the first block
    has no odd row above). alone: the kernel's only image (batch 1), whose pool follows the whole conv: GpSimdE has
    no later conv work (its halo copies are all queued before), so V of the store before the last goes there and
    VectorE, which the passes along x keep busy, reaches the tail (the last band's small blocks) sooner. (V of
    every store before the last there, stem20: f32 38.17 -> 37.39 us, bf16 24.34 -> 24.00; with the pass along x
    one instruction a block, stem22, GpSimdE became the bound at bf16 (24.17: 1.39 us a V against VectorE's 0.9)
    and only the store before the last keeps it: bf16 22.78, f32 37.39; from batch 2 the pool shares GpSimdE with
    the next image's conv.)"""
    po, qo, line, dt = img.shape[1], (img.shape[2] - 1) // 2, pool.line, img.dtype
    hc = Buf(fresh(f"{pool.out}_cols"), "sbuf", dt, (2 * k, po, qo))
    out: list[Stmt] = [Alloc(hc, line=line)]
    cap = max(sum(rows for _, rows in store) for store in stores)  # (the stores' buffers share a name)
    for store in stores:
        up = Buf(fresh(f"{pool.out}_odd"), "sbuf", dt, (2 * k, cap, qo))  # V on the odd half's partitions
        seam = Buf(fresh(f"{pool.out}_band"), "sbuf", dt, (2 * k, cap, qo))  # Hc's even rows moved to the odd half
        out += [Alloc(up, line=line), Alloc(seam, line=line)]
        s0, rows = store[0][0], sum(rows for _, rows in store)
        for r0, size in store:
            v_engine = "gpsimd" if alone and len(stores) > 1 and store is stores[-2] else "vector"
            out += _block(pool, img, hc, (up, seam, s0), k, (r0, size), v_engine)
        out.append(Dma(View(y, (a(term(n)), full(k), sl(s0, rows), full(qo))),
                       View(seam, (sl(k, k), sl(0, rows), full(qo))), line))
    return out


def _block(pool: PoolOp, img: Buf, hc: Buf, bufs: tuple[Buf, Buf, int], k: int, block: tuple[int, int],
           v_engine: str) -> list[Stmt]:
    """The pool's output rows r0 .. r0 + rows into its store's buffers (up, seam, s0: their row 0 is output row s0;
    see the module's docstring), V on v_engine."""
    (up, seam, s0), (r0, rows), line, qo = bufs, block, pool.line, hc.shape[2]
    both, odd, even = full(2 * k), sl(k, k), sl(0, k)
    rs = sl(r0, rows)
    # windows of 3 columns from T's column 2j - 1 (img's 2j: its column 0 is T's column -1, -inf), overlapping: one
    # tensor_reduce (ir.Reduce.window)
    out: list[Stmt] = [Reduce(View(hc, (both, rs, full(qo))), View(img, (both, rs, sl(0, 2 * qo + 1))), "maximum",
                              line, (2, 3))]
    lo, b0 = (1 if r0 == 0 else 0), r0 - s0  # (output row 0 has no odd row above: its V is Hc's odd row itself)
    mine = View(seam, (odd, sl(b0, rows), full(qo)))
    out.append(Dma(mine, View(hc, (even, rs, full(qo))), line))  # the even rows to the odd half, beside V
    if rows > lo:
        below, above = (View(hc, (odd, sl(r0 + lo + d, rows - lo), full(qo))) for d in (0, -1))
        at = View(up, (odd, sl(b0 + lo, rows - lo), full(qo)))
        out.append(Binary(at, below, above, "maximum", line, v_engine))
        tail = View(seam, (odd, sl(b0 + lo, rows - lo), full(qo)))
        out.append(Binary(tail, tail, at, "maximum", line, "gpsimd"))
    if lo:
        first = View(seam, (odd, sl(b0, 1), full(qo)))
        out.append(Binary(first, first, View(hc, (odd, sl(0, 1), full(qo))), "maximum", line, "gpsimd"))
    return out


def columns_per_copy(b: _ConvBuilder, plan: ConvPlan, top: int) -> int:
    """The phased conv's M (conv_pairs.columns_per_copy) in the chain from batch 2 on: the M whose images take the
    least (`_totals`, either copy layout). conv_pairs' rule spreads every byte over the 16 engines and counts T's
    store, which the chain does not have: bf16 stem_maxpool batch 8 took M = 3, 27 copies 4 apart on engines 0-13
    (6 partitions each) with the seam and store on 8-13, 3.2 us of DMA per band against TensorE's 2.0 (110.25 us
    run); M = 2 put 18 copies 7 apart (4 partitions at most per engine) for 4 matmuls a group instead of 3,
    TensorE-bound at 2.7 us a band (102.13, stem22); M = 3 with the copies placed around the pool's DMAs (`place`)
    is 2.35 us a band (93.5, stem23). At batch 2 only the second image's conv meets the pool's DMAs."""
    return min(range(top, 0, -1), key=lambda m: min(_totals(b, plan, m)))


def placement(b: _ConvBuilder) -> tuple[int, ...]:
    """The first partitions of the chain's band copies (build_conv's `at`) when placing them (`_totals`) beats
    PMAX // copies apart, else (). Copies packed C apart keep conv_fold.spread (f32: TensorE-bound)."""
    apart, placed = _totals(b, b.p, b.M)
    return _DmaCosts(b, b.p.band // 2).place(len(b.shifts), b.C) if placed < apart else ()


PLACED_MARGIN = 1.04  # the estimate's error at near ties (below)


def _totals(b: _ConvBuilder, plan: ConvPlan, m: int) -> tuple[float, float]:
    """The conv's estimated time over the batch with M = m, copies PMAX // copies apart and placed (inf when they
    are packed, or do not fit). A band takes the longer of TensorE's time (conv_pairs.pe_ns) and the busiest DMA
    engine's: its partitions of the band's copies plus, on the odd half's engines, the pool's seam DMA and store
    of the band's pooled rows, which from the second image on run beside the conv (the pool is one image behind:
    pool_chain.skewed). The odd half's engines thus have less room for copies: placed copies even out each
    engine's loads plus pool DMAs (conv_fold.place under per-engine caps, the lowest busiest-engine time that fits),
    at the cost of the stationary's rows moved to them a run of copies C apart at a time (conv_fold.spread_weights,
    VectorE and ScalarE in turn, beside the gathers: an instruction's fixed cost each, in the kernel's head; counted
    as one engine's, half of them was too few: bf16 N=8 160 x 160 placed at M = 2, 72.0 -> 73.1 us)."""
    from tilec.compiler import conv_pairs  # (late: conv_pairs imports this module late too)
    costs, copies = _DmaCosts(b, plan.band // 2), m * (b.R + b.sy)
    pe = conv_pairs.pe_ns(b, plan, m)

    def dma(held: list[int], pooled: bool) -> float:
        return max(h * costs.unit + (costs.pool[e] if pooled else 0) for e, h in enumerate(held))

    def images(held: list[int]) -> float:
        return b.NB * (max(pe, dma(held, False)) + (b.N - 1) * max(pe, dma(held, True)))
    q = max(b.C, PMAX // copies)
    share = [-(-(copies * b.C) // len(costs.pool))] * len(costs.pool)  # packed: conv_fold.spread's share
    held = costs.held(range(0, copies * q, q), b.C) if q > b.C else share
    # not placed: bands whose DMAs take less than a DMA's latency (they wait for that, not for the busiest engine),
    # two bands an image (the first has a slot of its own, the other one slot, zeroed whole at each use: a memset
    # this estimate does not count; bf16 N=4 112 x 224 placed 52.5 -> 54.1 us, N=8 128 x 128 65.0 -> 65.6)
    at = costs.place(copies, b.C) if q > b.C and dma(held, True) > costs.latency and b.NB > 2 else ()
    # placed only when it wins by more than PLACED_MARGIN: near ties went the wrong way (bf16 N=5 176 x 176: M = 3
    # placed estimated 35.26 us against M = 2 apart 35.57, measured 61.3 -> 61.7 us in all; N=3 224 x 224, 31.85
    # against 32.62, is 59.4 -> 57.2)
    moves = sum(1 for j, p in enumerate(at) if not j or p != at[j - 1] + b.C)  # (conv_fold.spread_weights' runs)
    placed = (images(costs.held(at, b.C)) + moves * costs.move) * PLACED_MARGIN if at else math.inf
    return images(held), placed


class _DmaCosts:
    """Per band, on the performance model's constants (dma_transfer_ns: a descriptor per row, DMAINTRO's 8
    partitions per engine): `unit` is one partition's loads (rows of the band's columns), pool[e] engine e's share
    of the pool's seam DMA and store (the odd half's engines, partitions K..2K), `move` a VectorE instruction's
    fixed cost, `latency` a DMA's."""

    def __init__(self, b: _ConvBuilder, rows: int) -> None:
        from tilec.perf.params import target_params  # the model's constants, late: perf reads kernels
        prm = {name: value for name, value, _ in target_params(compiled().name).table()}
        self.ppe, n_dma = int(prm["dma_partitions_per_engine"]), int(prm["dma_engines"])
        desc, bw = prm["dma_desc_ns"], prm["dma_engine_bw"]
        xb, yb = DTYPE_BYTES[b.hbm[b.op.x].dtype], DTYPE_BYTES[b.hbm[b.op.out].dtype]
        self.unit = math.hypot(rows * desc, rows * b.in_cols() * xb / bw)
        pool = 2 * math.hypot(self.ppe * desc, self.ppe * rows * (b.Wo // 2) * yb / bw)
        self.pool = [pool if b.K <= e * self.ppe < 2 * b.K else 0.0 for e in range(n_dma)]
        self.move, self.latency = prm["vector_static_cycles"] / prm["vector_ghz"], prm["dma_latency_ns"]

    def place(self, copies: int, C: int) -> tuple[int, ...]:
        """The copies under the caps of the lowest busiest-engine time at which they fit (() if none)."""
        for t in sorted({h * self.unit + x for h in range(self.ppe + 1) for x in self.pool}):
            at = conv_fold.place(copies, C, [max(0, min(self.ppe, int((t - x) / self.unit + 1e-9))) for x in self.pool])
            if at:
                return at
        return ()

    def held(self, at: Iterable[int], C: int) -> list[int]:
        """Partitions of the copies at `at` on each DMA engine."""
        held = [0] * len(self.pool)
        for p0 in at:
            for p in range(p0, p0 + C):
                held[p // self.ppe] += 1
        return held


def image_bytes(producer: ConvOp, dtype: str) -> int:
    """SBUF bytes per partition of one phases image (2K partitions, Ho / 2 rows)."""
    return math.ceil(producer.dim("Ho") / 2) * (producer.dim("Wo") + 1) * DTYPE_BYTES[dtype]
