"""A temporary copied whole into a tensor holding the same elements in the same order (the two shapes equal but for
dimensions of extent 1) is that tensor. matvec_split writes a batched mat-vec's result as a column with a unit
last dimension and copies it out, `y[b, m] = y_col[b, m, 0]`: an HBM -> HBM copy of the whole result after the
matmuls (decode attention 4 x 8 x 2048 x 128: the scores' copy on one DMA engine, 13 us between the matmuls and the
softmax, and the output's 6 us after the last store; the model gave 251.0 -> 238.4 us without both).

On the built kernel (before the later passes) the temporary's allocation becomes a view of the destination,
`y_col = y.reshape(...)`, so its producer stores into the destination through its own views, and the copy goes.
Done when the copy is a block of HBM -> HBM DMAs only (in loops), each moving a region of the temporary to the same
region of the destination (equal indices once the unit dimensions' are dropped), every element once; the
temporary is an HBM allocation of the kernel that no statement after the copy uses, the destination exists before
the temporary's allocation, and no statement from the temporary's first use to the copy touches the destination.
store_regions.py folds a copy into a region of a tensor of the same rank (at an offset) by rewriting the producer's
views; this one needs no rewriting: every view of the temporary becomes a view of the destination as it is."""
from __future__ import annotations

import math

from tilec.compiler import ir
from tilec.compiler.store_regions import _dmas, _family, _names, _offset, copies_folded


def unit_copies_dropped(k: ir.Kernel) -> ir.Kernel:
    return copies_folded(k, _dropped)


def _dropped(body: list[ir.Stmt], at: int, k: ir.Kernel) -> list[ir.Stmt] | None:
    found = _aliased(body, at, k)
    if found is None:
        return None
    alloc, temp, dst = found
    view = ir.Reshape(temp, dst, body[alloc].line)
    return [view if n == alloc else s for n, s in enumerate(body) if n != at]


def _aliased(body: list[ir.Stmt], at: int, k: ir.Kernel) -> tuple[int, ir.Buf, ir.Buf] | None:
    """(the temporary's allocation's position, the temporary, the destination) when body[at] copies a temporary
    whole into a tensor of the same element order, and the two can be one buffer; else None."""
    copy = _identity_copy(body[at])
    if copy is None:
        return None
    temp, dst = copy
    kernel_bufs = {b.name for b in k.params + k.outputs}
    allocs = [n for n, s in enumerate(body[:at]) if isinstance(s, ir.Alloc) and s.buf == temp]
    if temp.name in kernel_bufs or len(allocs) != 1:
        return None
    alloc = allocs[0]
    family = _family(body, dst)
    if dst.name not in kernel_bufs and not any(isinstance(s, (ir.Reshape, ir.Alloc)) and s.buf.name in family
                                               for s in body[:alloc]):
        return None  # (the destination must exist where the temporary's view is made)
    mine = _family(body, temp)
    users = [n for n, s in enumerate(body) if n not in (alloc, at) and mine & _names(s)
             and not (isinstance(s, ir.Reshape) and s.base == temp)]
    if not users or users[-1] > at or any(family & _names(s) for s in body[users[0]:at]):
        return None
    return alloc, temp, dst


def _identity_copy(s: ir.Stmt) -> tuple[ir.Buf, ir.Buf] | None:
    """(source, destination) when `s` is an HBM -> HBM DMA, or a block of such DMAs only, each moving a region of
    the source to the same region of a destination of the same dtype and element order, all of the source once;
    else None."""
    dmas: list[tuple[ir.Dma, int]] = []
    if not isinstance(s, (ir.Block, ir.Dma)) or not _dmas(s.body if isinstance(s, ir.Block) else (s,), 1, dmas) \
            or not dmas:
        return None
    src, dst = dmas[0][0].src.buf, dmas[0][0].dst.buf
    if src.memory != "hbm" or dst.memory != "hbm" or src.dtype != dst.dtype or src == dst or \
            _squeezed(src.shape) != _squeezed(dst.shape):
        return None
    moved = 0
    for dma, trips in dmas:
        a, b = dma.src, dma.dst
        if a.buf != src or b.buf != dst or a.perm or b.perm or a.blocks or b.blocks or \
                len(a.idx) != len(src.shape) or len(b.idx) != len(dst.shape):
            return None
        ia, ib = _kept(a.idx, src.shape), _kept(b.idx, dst.shape)
        if len(ia) != len(ib) or any(_offset(x, y) != 0 for x, y in zip(ia, ib)):
            return None
        moved += trips * math.prod(a.shape())
    return (src, dst) if moved == math.prod(src.shape) else None


def _kept(idx: tuple[ir.Idx, ...], shape: tuple[int, ...]) -> list[ir.Idx]:
    """The indices of the dimensions of extent > 1."""
    return [i for i, n in zip(idx, shape) if n != 1]


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)
