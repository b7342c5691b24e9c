"""A temporary copied whole into a region of another tensor is stored there by its producer (rows21). store_split
turns a rotary embedding's halves, `Y[s, Dh + d] = f(..)`, into `Y_part[s, d] = f(..)` and a copy `Y[s, Dh + d] =
Y_part[s, d]` (the rules store a shifted index only in a copy), so each half went through HBM twice more:

    block Y_part = element-wise ...:  .. dma_copy(dst=Y_part[t*128:t*128 + 128], src=Y_part_tile)
    block Y = copy of Y_part:         for s_o: dma_copy(dst=Y[s_o*128:.., 64:128], src=Y_part[s_o*128:..])

On the built kernel (before the later passes), the producer's views of the temporary become views of the copy's
destination shifted by the copy's offsets, and the copy and the temporary go:

    block Y_part = element-wise ..., stored into Y[:, 64:128]:  .. dma_copy(dst=Y[t*128:t*128 + 128, 64:128], ..)

Done when the copy is a block of DMAs only (in loops), HBM to HBM, moving every element of the temporary once at
one constant offset per dimension (equal index terms, equal sizes); the temporary is an HBM allocation of the
kernel that one earlier top-level statement writes (by DMA only: no other read), and neither that statement nor
any statement between it and the copy touches the destination (its writes would move before theirs)."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from tilec.compiler import ir


def stores_in_place(k: ir.Kernel) -> ir.Kernel:
    body = list(k.body)
    folded: dict[int, tuple[ir.Stmt, list[tuple[str, tuple[int, ...], tuple[int, ...]]]]] = {}
    at = 0
    while at < len(body):
        found = _in_place(body, at, k, folded)
        if found is None:
            at += 1
            continue
        producer, temp, dst, offsets = found
        views = {s.buf.name: _dst_view(body, s.buf.shape, temp, dst, offsets)
                 for s in body if isinstance(s, ir.Reshape) and s.base == temp}
        made = [ir.Reshape(v[0], dst, body[producer].line) for v in views.values() if v is not None
                and not any(isinstance(s, ir.Reshape) and s.buf == v[0] for s in body)]
        made = list({r.buf.name: r for r in made}.values())
        body[producer:producer] = made  # (dst seen split, before its use)
        producer, at = producer + len(made), at + len(made)
        regions = folded.get(id(body[producer]), (None, []))[1]
        body[producer] = _moved(body[producer], temp, dst, offsets, views)
        # (keyed by the statement itself: positions move as copies and allocations go)
        folded[id(body[producer])] = (body[producer], regions + [(dst.name, offsets, temp.shape)])
        body = [s for n, s in enumerate(body) if n != at and not (isinstance(s, ir.Alloc) and s.buf == temp)
                and not (isinstance(s, ir.Reshape) and s.base == temp)]
        at = 0  # (the temporary's allocation before the copy went too: the next copy may now be at `at`)
    return replace(k, body=tuple(body))


def copies_folded(k: ir.Kernel, fold: Callable[[list[ir.Stmt], int, ir.Kernel], list[ir.Stmt] | None]) -> ir.Kernel:
    """The kernel with each top-level statement in turn offered to `fold`: the body with the copy at that position
    folded away (the same position is then looked at again), or None (the next one) (unit_copies.py)."""
    body = list(k.body)
    at = 0
    while at < len(body):
        folded = fold(body, at, k)
        if folded is None:
            at += 1
        else:
            body = folded
    return replace(k, body=tuple(body))


def _in_place(body: list[ir.Stmt], at: int, k: ir.Kernel, folded: dict):
    """(the producer's position, the temporary, the destination buffer, the offsets) when body[at] is a copy to
    fold into its producer, else None. A producer that already stores other temporaries into the destination
    (`folded`: sibling element-wise work built in one nest, siblings.py) takes one more when the regions are
    disjoint, so the order of their stores inside it does not matter."""
    copy = _region_copy(body[at])
    if copy is None:
        return None
    temp, dst, offsets = copy
    kernel_bufs = {b.name for b in k.params + k.outputs}
    if temp.name in kernel_bufs or not any(isinstance(s, ir.Alloc) and s.buf == temp for s in body[:at]):
        return None
    views = {s.buf.name for s in body if isinstance(s, ir.Reshape) and s.base == temp}
    if any(_squeezed(s.buf.shape) != temp.shape and _split(s.buf.shape, temp.shape, dst.shape, offsets) is None
           for s in body if isinstance(s, ir.Reshape) and s.base == temp):
        return None  # (a view with unit dimensions added is the same indices, a split of leading ones _split's)
    users = [n for n, s in enumerate(body) if n != at and ({temp.name} | views) & _names(s)]
    if len(users) != 1 or users[0] > at or not _written_only(body[users[0]], {temp.name} | views):
        return None
    producer = users[0]
    family = _family(body, dst)
    if any(family & _names(s) for s in body[producer + 1:at]) or \
            family & _names(body[producer]) and not _apart(folded, body[producer], dst, offsets, temp.shape):
        return None
    if dst.name not in kernel_bufs and not any(isinstance(s, (ir.Reshape, ir.Alloc)) and s.buf == dst
                                               for s in body[:producer]):
        return None  # (the destination must exist before the producer)
    return producer, temp, dst, offsets


def _split(vshape: tuple[int, ...], temp: tuple[int, ...], dst: tuple[int, ...],
           offsets: tuple[int, ...]) -> tuple[tuple[int, ...], int] | None:
    """(the shape to see `dst` with, how many of the temporary's dimensions it splits) when a view of the temporary
    splits its leading dimensions (build_halo's k rows per partition: [S, D] seen [S / k, k, D]) and those are the
    destination's own, at offset 0: the same split of `dst` keeps every element's place; None otherwise."""
    for j in range(1, len(temp)):
        tail = temp[j:]
        lead = vshape[:len(vshape) - len(tail)]
        if vshape[len(lead):] == tail and math.prod(lead) == math.prod(temp[:j]) and temp[:j] == dst[:j] and \
                not any(offsets[:j]):
            return lead + dst[j:], j
    return None


def _dst_view(body: list[ir.Stmt], vshape: tuple[int, ...], temp: ir.Buf, dst: ir.Buf,
              offsets: tuple[int, ...]) -> tuple[ir.Buf, int] | None:
    """For a view of the temporary that splits its leading dimensions: the view of `dst` split alike (an existing
    one, else a new name) and how many leading dimensions the split has; None for a view adding unit dimensions."""
    if _squeezed(vshape) == temp.shape:
        return None
    split = _split(vshape, temp.shape, dst.shape, offsets)
    assert split is not None
    shape, j = split
    lead = len(shape) - len(dst.shape) + j
    for s in body:
        if isinstance(s, ir.Reshape) and s.base == dst and s.buf.shape == shape:
            return s.buf, lead
    taken = {v.buf.name for x in ir.walk(tuple(body)) for v in ir.views(x)} | \
        {s.buf.name for s in body if isinstance(s, (ir.Reshape, ir.Alloc))}
    name = next(n for n in (f"{dst.name}_v{'' if i == 0 else i + 1}" for i in range(len(taken) + 1))
                if n not in taken)
    return ir.Buf(name, "hbm", dst.dtype, shape), lead


def _apart(folded: dict, producer: ir.Stmt, dst: ir.Buf, offsets: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether every touch of `dst` in `producer` is an earlier fold's store (into `dst` itself), each into a region
    disjoint from offsets + shape."""
    kept, regions = folded.get(id(producer), (None, []))
    if kept is not producer or not regions or any(name != dst.name for name, _, _ in regions):
        return False
    return all(any(o + n <= p or p + m <= o for o, n, p, m in zip(offsets, shape, other, size))
               for _, other, size in regions)


def _region_copy(s: ir.Stmt):
    """(source, destination, offsets) when `s` is a block of DMAs only, HBM to HBM, each moving the source at one
    constant offset per dimension into the destination, all of the source once; else None."""
    if not isinstance(s, ir.Block):
        return None
    dmas: list[tuple[ir.Dma, int]] = []
    if not _dmas(s.body, 1, dmas) or len(dmas) != 1:
        return None
    (dma, trips), = dmas
    src, dst = dma.src, dma.dst
    if src.buf.memory != "hbm" or dst.buf.memory != "hbm" or src.perm or dst.perm or src.blocks or dst.blocks or \
            len(src.idx) != len(src.buf.shape) or len(dst.idx) != len(src.idx) or len(dst.buf.shape) != len(src.idx):
        return None
    offsets = [_offset(a, b) for a, b in zip(src.idx, dst.idx)]
    if any(o is None for o in offsets) or trips * math.prod(src.shape()) != math.prod(src.buf.shape):
        return None
    return src.buf, dst.buf, tuple(o for o in offsets if o is not None)


def _dmas(body: tuple[ir.Stmt, ...], trips: int, out: list) -> bool:
    """Collect the DMAs under loops (with their trip counts); False when anything else is there."""
    for s in body:
        if isinstance(s, ir.Loop):
            if not _dmas(s.body, trips * s.extent, out):
                return False
        elif isinstance(s, ir.Dma):
            out.append((s, trips))
        else:
            return False
    return True


def _offset(a: ir.Idx, b: ir.Idx) -> int | None:
    """b's index minus a's when they differ by a constant (the same terms, slice sizes and steps), else None."""
    if isinstance(a, ir.Sl) and isinstance(b, ir.Sl):
        same = a.size == b.size and a.step == b.step and sorted(a.start.terms, key=repr) == sorted(b.start.terms, key=repr)
        return b.start.const - a.start.const if same else None
    if isinstance(a, ir.Aff) and isinstance(b, ir.Aff) and sorted(a.terms, key=repr) == sorted(b.terms, key=repr):
        return b.const - a.const
    return None


def _names(s: ir.Stmt) -> set[str]:
    """The buffers a statement (with its loops and blocks) reads or writes through views."""
    return {v.buf.name for x in ir.walk((s,)) for v in ir.views(x)}


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)


def _written_only(s: ir.Stmt, names: set[str]) -> bool:
    """Whether every use of `names` in `s` is the destination of a DMA whose view is plain (no permutation or access
    pattern blocks) and indexes every dimension."""
    for x in ir.walk((s,)):
        for field, v in vars(x).items():
            if isinstance(v, ir.View) and v.buf.name in names:
                if not isinstance(x, ir.Dma) or field != "dst" or v.perm or v.blocks or \
                        len(v.idx) != len(v.buf.shape):
                    return False
    return True


def _family(body: list[ir.Stmt], buf: ir.Buf) -> set[str]:
    """`buf` and the HBM views of the same tensor (a Reshape of it, or of what it reshapes)."""
    shapes = [s for s in body if isinstance(s, ir.Reshape)]
    names = {buf.name}
    for _ in range(2):  # views of views: the base and its other views
        names |= {s.buf.name for s in shapes if s.base.name in names} | \
            {s.base.name for s in shapes if s.buf.name in names}
    return names


def _moved(s: ir.Stmt, temp: ir.Buf, dst: ir.Buf, offsets: tuple[int, ...],
           views: dict[str, tuple[ir.Buf, int] | None]) -> ir.Stmt:
    """`s` with every view of `temp` (or of its reshapes `views`: those adding unit dimensions have their indices
    there dropped, those splitting leading dimensions become views of `dst` split alike) a view of `dst` at
    `offsets`; a block's label says where it stores."""
    def idx(i: ir.Idx, off: int) -> ir.Idx:
        return replace(i, start=i.start.plus(off)) if isinstance(i, ir.Sl) else i.plus(off)

    def stmt(x: ir.Stmt) -> ir.Stmt:
        if isinstance(x, (ir.Loop, ir.Block)):
            return replace(x, body=tuple(stmt(c) for c in x.body))
        if isinstance(x, ir.Dma) and x.dst.buf.memory == "hbm" and (x.dst.buf == temp or x.dst.buf.name in views):
            split = views.get(x.dst.buf.name)
            if split is not None:  # (the split dimensions are at offset 0: _split)
                shifts = (0,) * split[1] + offsets[len(offsets) - (len(x.dst.idx) - split[1]):]
                return replace(x, dst=ir.View(split[0], tuple(idx(i, o) for i, o in zip(x.dst.idx, shifts))))
            kept = [i for i, n in zip(x.dst.idx, x.dst.buf.shape) if n != 1 or x.dst.buf == temp]
            return replace(x, dst=ir.View(dst, tuple(idx(i, o) for i, o in zip(kept, offsets))))
        return x
    out = stmt(s)
    if isinstance(out, ir.Block):
        where = ", ".join(f"{o}:{o + n}" for o, n in zip(offsets, temp.shape))
        joined = " and" if ", stored into " in out.label else ", stored into"  # (a sibling's region: siblings.py)
        out = replace(out, label=f"{out.label}{joined} {dst.name}[{where}]")
    return out
