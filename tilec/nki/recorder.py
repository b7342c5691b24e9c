"""Trace records of tensor accesses: byte regions per partition (`Access`) and DMA descriptor chunks.

For on-chip memory the region is the partition range [p0, p1) and the byte range [lo, hi) within each partition;
for HBM it is the byte range within the tensor's flat storage (p0 = 0, p1 = 1). A DMA moves its elements as
contiguous chunks (descriptor elements): the longest run of elements that is contiguous on both sides, never crossing
a partition boundary on the on-chip side. On-chip accesses also carry the innermost free stride in bytes (the
performance model's SBUF stride penalty).
"""
from __future__ import annotations

from math import gcd

from tilec.patterns import canonical, storage_dims
from tilec.trace import Access


def access(t: object) -> Access:
    buf = t.buf
    isz = buf.itemsize
    lo = hi = t.off
    for n, s in zip(t.shape, t.strides):
        e = (n - 1) * s
        if e < 0:
            lo += e
        else:
            hi += e
    if t.oob is not None:  # an index leaving the tensor (legal under mask=): clamp to the buffer
        lo, hi = max(lo, 0), min(hi, buf.data.size - 1)
    if buf.memory == "hbm":
        pattern = () if t.oob is not None else (isz, t.off, *canonical(t.shape, t.strides),
                                                storage_dims(tuple(buf.shape)))
        return Access(buf.id, buf.name, "hbm", 0, 1, lo * isz, (hi + 1) * isz, 0, pattern)
    ps = buf.pstride
    p0, p1 = lo // ps, hi // ps + 1
    stride = free_stride(t) * isz
    if p1 - p0 == 1:
        return Access(buf.id, buf.name, buf.memory, p0, p1, (lo % ps) * isz, (hi % ps + 1) * isz, stride)
    flo = fhi = t.off % ps
    for n, s in zip(t.shape, t.strides):
        if s % ps:  # a free dimension
            e = (n - 1) * s
            flo, fhi = (flo + e, fhi) if e < 0 else (flo, fhi + e)
    return Access(buf.id, buf.name, buf.memory, p0, p1, flo * isz, (fhi + 1) * isz, stride)


def free_stride(t: object) -> int:
    """Elements between neighbours along the innermost free dimension with more than one element (a dimension whose
    stride is a multiple of the partition stride is a partition dimension); 0 for a broadcast or a single element."""
    ps = t.buf.pstride
    shape, strides = t.shape, t.strides
    for d in range(len(shape) - 1, -1, -1):
        if shape[d] > 1:
            s = strides[d]
            if s == 0:
                return 0
            if s % ps:
                return abs(s)
    return 0


def contiguous_run(t: object) -> int:
    """Elements in the longest contiguous run of the access pattern (innermost dims first)."""
    on_chip = t.buf.memory != "hbm"
    ps = t.buf.pstride
    run = 1
    for n, s in zip(reversed(t.shape), reversed(t.strides)):
        if n == 1:
            continue
        if s != run or (on_chip and s % ps == 0):
            break
        run *= n
    return run


def dma_chunks(src: object, dst: object) -> tuple[int, int]:
    """(number of chunks, bytes per chunk) of a DMA between two access patterns with equal element counts."""
    size = dst.size
    if size == 0:
        return 0, 0
    chunk = gcd(contiguous_run(src), contiguous_run(dst))
    return size // chunk, chunk * dst.itemsize
