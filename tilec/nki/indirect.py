"""Indirect DMA: `hbm[idx_tile, ...]` picks rows of an HBM tensor at run time from an on-chip int32 (P, 1) index
tile (gather as a DMA source, scatter as a destination), in nl.load / nl.store / nisa.dma_copy (spec §1.6, §1.10.1).

Only the first (partition) index may be a tile. Rows outside the tensor raise IndexError with numpy's wording (as
AWS's simulator does), or are skipped with `oob_mode=nisa.oob_mode.skip`.
"""
from __future__ import annotations

import numpy as np

from tilec.nki import checks, core, recorder, rules, runtime
from tilec.nki.indexing import IndexExpr
from tilec.nki.tensor import Tensor

F32 = np.dtype(np.float32)


class Indirect:
    """A row-gathered view: row p is `base[index[p]][rest]`."""

    def __init__(self, base: Tensor, index: Tensor, rest: tuple) -> None:
        where = runtime.callsite()
        if base.buf.memory != "hbm":
            raise rules.NkiSyntaxError("indirect (tile) indices are supported only on HBM tensors",
                                       "err_indirect_indices_are_not_supported_with_nki_api", where,
                                       f"tensor {base.describe()}")
        if any(isinstance(k, Tensor) for k in rest):
            raise rules.NkiSyntaxError("indirect indices are supported only on the partition dimension",
                                       "err_indirect_indices_free_dim", where, f"tensor {base.describe()}")
        checks.tile(index, "indirect index", "index", where)
        if index.dtype.kind not in "iu" or index.free_size != 1:
            raise rules.NkiTypeError(f"an indirect index must be an integer (P, 1) tile, got shape "
                                     f"{tuple(index.shape)} {index.dtype.name}", "indirect_index_tile", where)
        self.base, self.index, self.rest = base, index, rest
        # `t[idx_tile, nl.arange(C)[None, :]]`: the free index expression shares the tile's partition axis with
        # the index tile, so its leading broadcast axis is the partition axis, not a dimension of the row
        self.squeeze = any(isinstance(k, IndexExpr) and k.ndim == 2 for k in rest)
        row = self.row(0)
        self.shape = (index.shape[0],) + tuple(row.shape)
        self.dtype, self.buf, self.itemsize = base.dtype, base.buf, base.itemsize
        self.size = self.shape[0] * row.size
        self.ndim = len(self.shape)
        self.partitions = self.shape[0]

    def describe(self) -> str:
        return f"rows of {self.base.describe()} chosen by tile '{self.index.buf.name}'"

    def row(self, i: int) -> Tensor:
        row = self.base[(i,) + self.rest]
        if self.squeeze and row.shape and row.shape[0] == 1:
            row = Tensor(row.buf, row.off, row.shape[1:], row.strides[1:])
        return row


def dma(run, dst: object, src: object, where: tuple, skip: bool, op: object = None,
        mask: np.ndarray | None = None) -> None:
    """dma_copy where src and/or dst is an Indirect view: one descriptor per row. `op` (an alu.Op, from
    dst_rmw_op=) combines each row with what the destination holds: dst = op(dst, src) [ISA1 dma_copy]. With a
    mask (over the plain side's shape), a row whose elements are all masked off is neither read, nor written, nor
    bounds-checked (its index may point anywhere), the others move their masked-in elements [NL1 load/store mask]."""
    ind = src if isinstance(src, Indirect) else dst
    plain = dst if ind is src else src
    if isinstance(plain, Indirect):
        raise rules.NkiSyntaxError("dma_copy cannot have indirect indices on both sides", "indirect_both_sides",
                                   where)
    if plain.buf.memory == "psum":
        checks.dma(plain, plain, where)
    core.read(run, ind.index, where)
    if ind.index.buf.id not in run.known:  # (an iota's rows are known to a trace-only run too)
        core.needs_values(run, "indirect DMA (its rows are chosen by the values of an index tile)", where)
    rows = core.values(ind.index).reshape(-1).astype(np.int64)
    n = ind.base.shape[0]
    active = np.ones(rows.shape, bool) if mask is None else mask.reshape(rows.shape[0], -1).any(axis=1)
    valid = ((rows >= 0) & (rows < n)) | ~active
    if not valid.all() and not skip:
        bad = int(rows[~valid][0])
        row_size = ind.base.size // max(n, 1)
        # a plain IndexError with numpy's message, as AWS's simulator raises it (its doc tests compare both); the
        # kernel line and the hint ride along as a note
        err = IndexError(f"index {bad * row_size} is out of bounds for axis 0 with size {ind.base.size}")
        err.add_note(rules.NkiIndexError("indirect DMA row out of bounds", "dma_indirect_out_of_bounds", where,
                                         f"{ind.describe()}: row {bad} of {n}",
                                         hint="keep the index tile inside the tensor, or pass "
                                              "oob_mode=nisa.oob_mode.skip").render())
        raise err
    moved = valid & active & (rows >= 0) & (rows < n)
    for p in np.nonzero(moved)[0].tolist():
        one = ind.row(int(rows[p]))
        other = plain[p]
        s, d = (one, other) if ind is src else (other, one)
        m = None if mask is None or mask[p].all() else np.broadcast_to(mask[p].reshape(-1), (d.size,)).reshape(d.shape)
        core.read(run, s, where, mask=None if m is None else m.reshape(s.shape))
        value = core.values(s, None if m is None else m.reshape(s.shape)).reshape(d.shape)
        if op is not None:
            core.read(run, d, where, mask=m)
            value = op.binary(core.f32(d), value.astype(F32))
        core.write(run, d, value if s.dtype == d.dtype and op is None else value.astype(F32), where, mask=m)
    n_rows = int(moved.sum())
    row_bytes = ind.size // max(ind.shape[0], 1) * plain.itemsize
    reads = (ind.index, ind.base if ind is src else plain)
    out = plain if ind is src else ind.base
    core.emit(run, "dma", "dma_copy", out, reads, where, partitions=plain.shape[0],
              free=plain.size // max(plain.shape[0], 1), bytes=n_rows * row_bytes, dma_chunks=n_rows,
              dma_chunk_bytes=row_bytes, attrs=(("indirect", True),))
