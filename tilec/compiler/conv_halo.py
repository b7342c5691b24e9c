"""A zero-padded read's halo in the input band: only the rows and columns outside X are zeroed, by GpSimdE copies
from two small zero tiles made once before the loops (one for halo rows, one for halo columns), instead of a memset
of the whole band, which every load of the band waited for (conv3x3s2 f32: a 3.5 us GpSimdE memset of 128 x 3249
elements before the first load). Functions of the builder `b`, as conv_band.py.

A box is (kind, first partition, partitions, first row, rows, first column, columns) in the band buffer's
coordinates; kind "rows" boxes come from the rows tile, "cols" boxes from the columns tile.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tilec.compiler import conv_fold, ir
from tilec.compiler.build_util import a, sl
from tilec.compiler.ir import DTYPE_BYTES, Alloc, Buf, Stmt, View

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder

Box = tuple[str, int, int, int, int, int, int]


def region_boxes(p0: int, parts: int, rows: int, cols: int, clip: tuple[int, int, int, int]) -> list[Box]:
    """The halo of a region of rows x cols whose (top, bottom, left, right) lie outside X: the halo rows over the
    whole width, then the halo columns beside the rows inside X."""
    top, bottom, left, right = clip
    inner = rows - top - bottom
    out: list[Box] = [("rows", p0, parts, first, n, 0, cols) for first, n in ((0, top), (rows - bottom, bottom)) if n]
    if inner > 0:
        out += [("cols", p0, parts, top, inner, first, n) for first, n in ((0, left), (cols - right, right)) if n]
    return out


def band_boxes(b: _ConvBuilder, index: int, peeled: bool) -> list[Box] | None:
    """The halo boxes of band `index` (a peeled band: its rows clipped at X's top and bottom; a band of the band
    loop: its columns only), or None when some copy of the band holds no element of X at all."""
    if b.fold == 1:
        rows, cols = b.in_rows(), b.in_cols()
        top, bottom = b.band_clip(index) if peeled else (0, 0)
        left, right = b.clip(b.col0, cols, b.W) if b.NXB == 1 else (0, 0)  # (no halo columns: build_conv_cols)
        if rows - top - bottom <= 0 or cols - left - right <= 0:
            return None
        return region_boxes(0, b.p.tile_c, rows, cols, (top, bottom, left, right))
    return folded_boxes(b, index, peeled)


def folded_boxes(b: _ConvBuilder, index: int, peeled: bool) -> list[Box] | None:
    """A folded band's boxes: each copy's own halo when every copy may be reached on its own partitions (C = 32 or
    64, copies C apart: aligned starts, nki-spec §1.6), else the union of the copies' halos over all the copies'
    partitions (the loads come after the zero copies and rewrite what another copy holds there)."""
    step = 2 * b.sy if b.phased else b.sy if b.halves else 1
    band = index * b.p.band * b.sy + b.oy
    cols = b.in_cols()
    per_copy = b.C in (32, 64) and b.Q == b.C
    boxes: list[Box] = []
    for j, (r0, c0) in enumerate(b.shifts):
        need = b.copy_rows() if b.halves else b.in_rows() - r0
        top, bottom = conv_fold.clip_rows(b, band + r0, need, step) if peeled else (0, 0)
        left, right = b.clip(b.col0 + c0, cols - c0, b.W)
        if need - top - bottom <= 0 or cols - c0 - left - right <= 0:
            return None
        p0, parts = (j * b.Q, b.C) if per_copy else (0, b.copy_parts(len(b.shifts)))
        boxes += region_boxes(p0, parts, need, cols - c0, (top, bottom, left, right))
    return boxes if per_copy else hulls(boxes)


def hulls(boxes: list[Box]) -> list[Box]:
    """The union mode's boxes (every copy's partitions) merged per kind and side into their hulls: the copies'
    halos differ in rows and columns (the stem's 36 copies: 22 boxes for its first band), but a box over all the
    copies' partitions may zero more than one copy's halo, as the loads after it rewrite what they hold (one GpSimdE
    copy per side instead of one per distinct box: the padded stem's first load waited 3 us for 22 copies)."""
    groups: dict[tuple[str, bool], list[Box]] = {}
    for box in boxes:  # (a rows box starts at row 0 or ends the copy; a cols box at column 0 or right of X)
        groups.setdefault((box[0], (box[3] if box[0] == "rows" else box[5]) == 0), []).append(box)
    out = []
    for (kind, _), mine in groups.items():
        r0, c0 = min(x[3] for x in mine), min(x[5] for x in mine)
        r1, c1 = max(x[3] + x[4] for x in mine), max(x[5] + x[6] for x in mine)
        out.append((kind, mine[0][1], mine[0][2], r0, r1 - r0, c0, c1 - c0))
    return out


def slots_serve(b: _ConvBuilder) -> bool:
    """Whether band slots (build_conv.slot_count) may hold a padded read's bands: every band's halo is boxes the
    zero tiles can fill (none is a copy with no element of X, which would need its slot zeroed whole each time)."""
    return all(band_boxes(b, i, peeled) is not None for i in range(b.NB) for peeled in (True, False))


def zero_tiles(b: _ConvBuilder, force: bool = False) -> list[Stmt]:
    """The two zero tiles (b.halo_rows, b.halo_cols), sized for every band's boxes, allocated zeroed; none when
    the bands have no halo, when some band would need its whole band zeroed (it then keeps the zeroed
    allocation), when the copies stand apart (Q > C) without band slots (the gaps between them must read as
    zeros: a padded read's two bands at batch >= 2, the first in a slot of its own and one shared, which is no
    slot; bf16 stem_maxpool 96 x 96 read never-written SBUF there, stem22), or, unless `force` (band slots,
    allocated once: their halo is always copied), when zeroing the halo takes GpSimdE longer than a memset of the
    band (below)."""
    every = [band_boxes(b, i, peeled) for i in range(b.NB) for peeled in (True, False)]
    if any(boxes is None for boxes in every) or not force and (b.Q > b.C or b.at):
        return []  # copies apart outside band slots: the gaps between them are zeroed with the band, every time
    boxes = [box for bs in every if bs is not None for box in bs]
    shapes = {kind: (max(p0 + n for _, p0, n, *_ in mine), max(box[4] for box in mine), max(box[6] for box in mine))
              for kind in ("rows", "cols") if (mine := [box for box in boxes if box[0] == kind])}
    band = b.x_band_buf()
    tiles = sum(memset_cycles(b, shape[1] * shape[2]) for shape in shapes.values())
    if not shapes or not force and not any(tiles + halo_cycles(bs, band.shape[1]) < memset_cycles(b, elements(band))
                                           for bs in every if bs):
        return []
    out: list[Stmt] = []
    for kind, shape in shapes.items():
        buf = Buf(b.fresh(f"{b.op.x}_zero_{kind}"), "sbuf", b.hbm[b.op.x].dtype, shape)
        setattr(b, f"halo_{kind}", buf)
        out.append(Alloc(buf, zero=True, line=b.L["update"]))
    return out


def elements(buf: Buf) -> int:
    """Elements per partition of an on-chip buffer (a memset's free size)."""
    n = 1
    for d in buf.shape[1:]:
        n *= d
    return n


def gpsimd_cycles(free: int, strided: bool = False, rate: float = 1.0) -> float:
    """A GpSimdE memset or copy of `free` elements per partition by the performance model's rule (its static
    overhead plus one element per cycle, twice that with an SBUF stride over 16 bytes: a halo column; `rate` 2 for
    a 16-bit memset of zeros, nki-spec §2.4)."""
    from tilec.compiler.build_matvec import model_costs  # late: the model reads kernels
    costs = model_costs()
    return costs.static["gpsimd"] + max(costs.min_ii, free * (costs.stride_factor if strided else 1.0) / rate)


def memset_cycles(b: _ConvBuilder, free: int) -> float:
    """A memset of zeros of `free` elements per partition on GpSimdE (16-bit zeros at twice the rate)."""
    return gpsimd_cycles(free, rate=2.0 if DTYPE_BYTES[b.hbm[b.op.x].dtype] == 2 else 1.0)


def halo_cycles(boxes: list[Box], tiles: int) -> float:
    """GpSimdE cycles of a band's zero copies: one per box and contraction tile."""
    return tiles * sum(gpsimd_cycles(nr * nc, kind == "cols") for kind, _, _, _, nr, _, nc in boxes)


def serves(b: _ConvBuilder, boxes: list[Box], band: Buf) -> bool:
    """Whether the band's halo is zeroed by copies: the zero tiles exist and the copies take GpSimdE less time than
    a memset of the band (a small band, conv_odd's 16 x 30, is cheaper to memset than to patch in 3 copies)."""
    tiles = [t for t in (b.halo_rows, b.halo_cols) if t is not None]
    return bool(tiles) and halo_cycles(boxes, band.shape[1]) < memset_cycles(b, elements(band))


def zeroed(b: _ConvBuilder, xb: Buf, index: int, peeled: bool) -> list[Stmt] | None:
    """The band's allocation and its halo's zero copies (before its loads), or None when the zero tiles do not
    serve it (the caller then allocates the band zeroed). A band slot (allocated once, build_conv.slot_count):
    the copies alone, always (a slot's earlier band left its data there)."""
    boxes = band_boxes(b, index, peeled)
    slot = b.slots > 1
    if slot and b.fixed and boxes:  # a shared slot's columns are zeroed once, a first band's whole halo (fixed)
        boxes = [] if index in b.fixed else [box for box in boxes if box[0] == "rows"]
    if not boxes or not slot and not serves(b, boxes, xb):
        return [] if slot else None
    made = copies(b, xb, boxes)
    return None if made is None else ([] if slot else [Alloc(xb, line=b.L["update"])]) + made


FIXED_BYTES = 128 * 1024  # the shared band slots and the first bands' own slots take at most this much of a partition


def fixed_slots(b: _ConvBuilder) -> dict[int, int]:
    """A padded read's first bands (their rows clipped at X's top) in band slots of their own, numbered after the
    shared ones: {band: slot}, and every slot's halo zeroed once before the loops (slot_halo). A first band's rows
    and columns outside X are the same in every image; a shared slot's halo columns are the same for every band
    (its rows do not move them), so only the last bands (rows clipped at X's bottom) still copy their halo rows
    per band; no load writes a copy's halo (where a union box covers another copy's data, those are the other
    copy's partitions, rewritten by its own loads). The conv's next image then starts without a GpSimdE copy: at
    batch 8 the pool's last maxes (stem_chain.py), queued on GpSimdE between two images' convs, held the next
    image's first halo copies, hence its first loads and TensorE (bf16 stem_maxpool 124.14 -> 113.80 us; the last
    bands in own slots too: 115.58; f32 244.58 -> 245.39). {} when the slots would take more than FIXED_BYTES of a
    partition."""
    first = [i for i in range(b.NB) if b.band_clip(i)[0] != 0]
    per_slot = b.copy_rows() * b.in_cols() * DTYPE_BYTES[b.hbm[b.op.x].dtype]  # (as the slots' own budget)
    if not first or (b.slots + len(first)) * per_slot > FIXED_BYTES:
        return {}
    return {band: b.slots + j for j, band in enumerate(first)}


def first_used(b: _ConvBuilder) -> list[int]:
    """The band slots in the order of their first band, when their halo is zeroed once (fixed_slots), else none."""
    order = [b.slot_of(band) for band in range(b.NB)] if b.fixed else []
    return list(dict.fromkeys(order))


def slot_halo(b: _ConvBuilder, xb: Buf, slot: int) -> list[Stmt]:
    """The halo of band slot `slot` (buffer xb), copied from the zero tiles once before the loops (fixed_slots):
    a first band's own slot its whole halo, a shared slot the columns of the bands of the band loop."""
    own = [band for band, s in b.fixed.items() if s == slot]
    boxes = band_boxes(b, own[0], True) if own else \
        [box for box in band_boxes(b, 0, False) or [] if box[0] == "cols"]
    return copies(b, xb, boxes or []) or []


def copies(b: _ConvBuilder, xb: Buf, boxes: list[Box]) -> list[Stmt] | None:
    """GpSimdE copies of the zero tiles into the boxes of band buffer xb (every contraction tile of it); None when
    the zero tile a box needs is missing."""
    slot = b.slots > 1
    out: list[Stmt] = []
    for kind, p0, parts, r0, nr, c0, nc in boxes:
        tile = b.halo_rows if kind == "rows" else b.halo_cols
        if tile is None:
            assert not slot, "a padded read's band slots without zero tiles (conv_halo.slots_serve, zero_tiles)"
            return None
        src = View(tile, (sl(p0, parts), sl(0, nr), sl(0, nc)))
        for t in range(xb.shape[1]):  # every contraction tile of the band (one per copy group when folded)
            out.append(ir.Copy(View(xb, (sl(p0, parts), a(t), sl(r0, nr), sl(c0, nc))), src, b.L["update"],
                               "gpsimd"))
    return out
