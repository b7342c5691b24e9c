"""The copy rule (crop, shift, part of a concatenation, nearest upsampling: rules.copy); split from rules.py, which
re-exports it."""
from __future__ import annotations

import math

from tilec.compiler import rules_copy
from tilec.compiler.names import unique
from tilec.compiler.nest import Kernel
from tilec.compiler.rules_base import Prim, _plain, prim
from tilec.compiler.rules_transpose import _one_copy
from tilec.compiler.schedule import best_divisor
from tilec.compiler.select_permute import dma_runs
from tilec.target import Target

COPY_TILE_BYTES = 64 * 1024  # SBUF per partition of a replicated (upsampled) tile; larger ones go in row chunks


# ---- data movement -------------------------------------------------------------------------------------------------


def copy(k: Kernel, target: Target) -> list[Prim] | None:
    """The copy rule (crop, shift, a part of a concatenation, nearest upsampling): one assignment of a read over a
    perfect nest whose indices are loops plus constants (a loop read divided by k arrives split: i = k*i_q + i_r).

    A read of every loop moves its data HBM -> HBM: one DMA per block of partitions, the loop with the largest
    divisor <= 128 on the partitions and every loop inside it in the same descriptor stream (the loops outside
    it are DMAs of their own). A read that skips loops (upsampling: X[n, c, i_q, j_q]) replicates on chip: per
    block of partitions the read's region is loaded whole, one on-chip copy per combination of the skipped loops
    writes the strided positions of the result's tile (`Y_tile[c, 2*i_q + i_r, 2*j_q + j_r]`), and the tile is
    stored whole: both DMAs move long contiguous rows."""
    found = _one_copy(k)
    if found is None:
        return None
    chain, stmt, src = found
    loops = [lp.var for lp in chain]
    read = {t.var for i in src.index for t in i.terms}
    ext = {lp.var: lp.extent for lp in chain}
    Y, X = stmt.dst.buf, src.buf
    if src.fill is not None:  # a padded read: an interior box copied HBM -> HBM, fill boxes from a constant tile
        return rules_copy.padded_copy(k, target, chain, src)
    x_order, y_order = _plain(src.index), _plain(stmt.dst.index)
    # a permute keeping its last dimension (select_permute); a loop of one iteration that only one side indexes
    # (a reshape's head, permute_split.split_reshape_copies) orders nothing, but one both sides index still does:
    # the copy path below would put a unit dimension on the partitions of a transposing DMA (fuzz l40)
    both = set(x_order or ()) & set(y_order or ())
    long = lambda order: [v for v in order if ext[v] > 1 or v in both]  # noqa: E731
    if x_order and y_order and long(x_order) != long(y_order):
        runs = dma_runs(tuple(x_order), tuple(y_order), ext, target.pmax)
        if runs is None:  # the last dimension moves: built on level B (permute_onchip.py); this is its fallback,
            runs = (tuple(y_order[:-1]), tuple(y_order[-1:]))  # one element per partition per DMA
        return _permute_dma(loops, runs, ext, X, Y, target)
    alone = {i.terms[0].var for i in stmt.dst.index if len(i.terms) == 1}  # a dimension of its own in the result
    itemsize = 4 if k.buffers()[Y].dtype == "f32" else 2
    plan = _replication(loops, read, alone, ext, itemsize, target)
    if plan is None:  # every loop read (a crop, a shift, a part), or replication that cannot be staged: HBM -> HBM
        last = [i.terms for i in (src.index[-1], stmt.dst.index[-1])]  # the innermost loop moves rows on both sides?
        contiguous = all(len(t) == 1 and t[0].var == loops[-1] and t[0].coef == 1 for t in last)
        return _hbm_copy(loops, read, ext, X, Y, target, itemsize, contiguous)
    part, chunk = plan
    d = best_divisor(ext[part], target.pmax)
    before, after = loops[:loops.index(part)], loops[loops.index(part) + 1:]
    skipped, kept = [v for v in after if v not in read], [v for v in after if v in read]
    p_out, p_in = f"{part}_o", f"{part}_p"  # staging happens at the block loop (extent 1 when one block is all)
    prims = [prim("split", part, d, outer=p_out, inner=p_in, note=f"for {part} (blocks of {d} partitions)")]
    if chunk < ext[kept[0]]:  # rows of the result's tile in chunks that fit
        rows = kept[0]
        prims.append(prim("split", rows, chunk, outer=f"{rows}_t", inner=f"{rows}_i",
                          note=f"for {rows} (chunks of {chunk})"))
        at, kept = f"{rows}_t", [f"{rows}_i"] + kept[1:]
        order = before + [p_out, at] + skipped + [p_in] + kept
    else:
        at = p_out
        order = before + [p_out] + skipped + [p_in] + kept
    taken = set(k.buffers())
    x_tile, y_tile = unique(f"{X}_tile", taken), unique(f"{Y}_tile", taken | {f"{X}_tile"})
    prims += [prim("reorder", *order), prim("partition", p_in),
              prim("stage_out", Y, at, name=y_tile), prim("stage", X, at, name=x_tile)]
    first = skipped[0]
    if ext[first] > 1:  # the copies of the first replicated loop's first position on ScalarE, the rest on VectorE
        prims += [prim("cut", first, 1), prim("tensorize", f"{p_in}@a", engine="scalar"),
                  prim("tensorize", f"{p_in}@b")]
    else:
        prims.append(prim("tensorize", p_in))
    return prims + [prim("block", loops[0], f"{Y} = {X} replicated ({d} partitions)")]


def _replication(loops: list[str], read: set[str], alone: set[str], ext: dict[str, int], itemsize: int,
                 target: Target) -> tuple[str, int] | None:
    """(partition loop, rows of the first kept loop per tile) for replication in SBUF, or None when the nest does
    not replicate or cannot be staged: the partition loop must be read, index a dimension of the result alone, and
    have replicated loops and read loops inside it (the tiles have a free dimension); a tile must fit in rows."""
    if all(v in read for v in loops):
        return None
    options = []
    for v in loops:
        after = loops[loops.index(v) + 1:]
        kept, skipped = [x for x in after if x in read], [x for x in after if x not in read]
        if v in read and v in alone and kept and skipped and not [x for x in loops[:loops.index(v)] if x not in read]:
            options.append(v)
    if not options:
        return None
    part = max(options, key=lambda v: (best_divisor(ext[v], target.pmax), -loops.index(v)))
    after = loops[loops.index(part) + 1:]
    rows = next(x for x in after if x in read)
    tile_bytes = math.prod(ext[v] for v in after) * itemsize
    per_row = tile_bytes // ext[rows]
    if per_row > COPY_TILE_BYTES:
        return None
    return part, best_divisor(ext[rows], max(1, COPY_TILE_BYTES // per_row))


def _permute_dma(loops: list[str], runs: tuple[tuple[str, ...], tuple[str, ...]], ext: dict[str, int], X: str,
                 Y: str, target: Target) -> list[Prim]:
    """A permute that keeps its last dimension, HBM -> HBM: per iteration of the outer loops one DMA per block of
    partitions copies X's slice over the inner loops (the same order on both sides) to Y's, in chunks of the
    dimensions the two share at their ends (`Y[n, h, s, d] = X[s, n, h, d]`: per (n, h), [s, d] slices, s on the
    partitions)."""
    outer, inner = runs
    part = inner[0]
    d = best_divisor(ext[part], target.pmax)
    p_in, split = part, []
    if d < ext[part]:
        p_in = f"{part}_p"
        split = [prim("split", part, d, outer=f"{part}_o", inner=p_in,
                      note=f"for {part} (blocks of {d} partitions)")]
    blocks = [f"{part}_o", p_in] if split else [p_in]
    order = list(outer) + blocks + list(inner[1:])
    now = [x for v in loops for x in (blocks if v == part else [v])]  # the loops after the split
    prims = split + ([prim("reorder", *order)] if order != now else [])
    label = f"{Y} = permute of {X} (HBM -> HBM, {d} partitions, {' x '.join(inner)} slices)"
    return prims + [prim("partition", p_in), prim("tensorize", p_in), prim("block", order[0], label)]


def _hbm_copy(loops: list[str], read: set[str], ext: dict[str, int], X: str, Y: str, target: Target,
              itemsize: int = 4, rows: bool = True) -> list[Prim]:
    """HBM -> HBM DMAs: the read loop whose DMAs cost the least on the model's DMA engines (_hbm_copy_ns) on the
    partitions, the read loops inside it in the same descriptor stream; loops the read skips (a replication that
    cannot be staged) and read loops outside the partitions are DMAs of their own. Ties keep the largest divisor
    <= 128 (concat_rows_2d, 129 + 127 rows x 300: the columns' 100 partitions made one DMA per row, 387 DMAs,
    44.4 us on the model; the rows' 43 make 3 + 1)."""
    reads = [v for v in loops if v in read]
    part = min(reads, key=lambda v: (round(_hbm_copy_ns(loops, read, ext, v, itemsize, rows, target), 1),
                                     -best_divisor(ext[v], target.pmax), reads.index(v)))
    d = best_divisor(ext[part], target.pmax)
    p_in, p_out = part, ""
    prims: list[Prim] = []
    if d < ext[part]:
        p_out, p_in = f"{part}_o", f"{part}_p"
        prims.append(prim("split", part, d, outer=p_out, inner=p_in, note=f"for {part} (blocks of {d} partitions)"))
    split = lambda vs: [x for v in vs for x in ((p_out, p_in) if v == part and p_out else  # noqa: E731
                                                (p_in,) if v == part else (v,))]
    order = [v for v in loops if v not in read] + split(reads)  # the DMA's loops: the partitions, read loops
    if order != split(loops):
        prims.append(prim("reorder", *order))
    label = f"{Y} = copy of {X} (HBM -> HBM, {d} partitions)"
    return prims + [prim("partition", p_in), prim("tensorize", p_in), prim("block", order[0], label)]


def _hbm_copy_ns(loops: list[str], read: set[str], ext: dict[str, int], part: str, itemsize: int, rows: bool,
                 target: Target) -> float:
    """The model's DMA-engine time of _hbm_copy with `part` on the partitions (build_conv.dma_engine_ns per DMA, or
    one DMA's time on its own engines when longer: 3 partitions keep 1 engine of 16 busy), plus each DMA's latency
    (a conservative charge that keeps one DMA of 64 partitions over 64 DMAs of 32, concat_width):
    one DMA per block of partitions and per iteration of the loops outside it, each moving the read loops inside
    it; a partition's row is one descriptor per iteration of those loops, but the innermost when `rows` (the nest's
    innermost loop is the last dimension of both tensors, step 1: contiguous runs; X[b, i, 2*j + 1] is not)."""
    from tilec.compiler.build_conv import dma_engine_ns  # late: build_conv imports the rules
    from tilec.compiler.build_matvec import model_costs
    d = best_divisor(ext[part], target.pmax)
    at = loops.index(part)
    outside = [v for v in loops if v not in read or loops.index(v) < at]
    inside = [v for v in loops[at + 1:] if v in read]
    dmas = math.prod(ext[v] for v in outside) * (ext[part] // d)
    runs = inside[:-1] if rows and inside and inside[-1] == loops[-1] else inside
    descriptors = d * math.prod(ext[v] for v in runs)
    nbytes = d * math.prod(ext[v] for v in inside) * itemsize
    costs = model_costs()
    alone = costs.dma_transfer_ns(max(descriptors, d), nbytes, min(costs.n_dma, -(-d // costs.ppe)))
    busy = max(dmas * dma_engine_ns(costs, d, descriptors, nbytes), alone)  # the engines' share, or one DMA's time
    return busy + dmas * costs.dma_latency  # each DMA's start-up: many small ones cost more than their bytes
