"""More `neuronxcc.nki.language` APIs of NKI 0.1 that AWS's suites use (issue 15): rand, random_seed, dropout,
loop_reduce, shared_constant, static_cast, finfo (language.py re-exports them).

Semantics from the NKI 0.1 docstrings (aws-neuron-sdk v2.26.1, `nki/api/nki/language/__init__.py`) [NL1]. Random
numbers come from one generator per run: `random_seed(s)` makes the following draws repeat for the same seed, as the
docstring promises; the values differ from the hardware's generator (undocumented), only the distribution is the same.
"""
from __future__ import annotations

import numpy as np

from tilec.nki import alu, core, dtypes, isa, isa_more, rules
from tilec.nki.tensor import Tensor


def rand(shape: object, dtype: object = np.float32, **kwargs: object) -> Tensor:
    """A new SBUF tile of uniform random values in [0, 1) [NL1 rand]."""
    run, where = core.begin()
    shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    dt = dtypes.as_dtype(dtype)
    value = core.compute(run, lambda: isa_more.rng(run).random(shape, dtype=np.float32))
    out = core.result(run, value, shape, dt, "sbuf", where, "rand")
    core.emit(run, "gpsimd", "rand", out, (), where)
    return out


def random_seed(seed: object, *, mask: object = None, **kwargs: object) -> None:
    """Reseed the run's generator: the same seed gives the same later draws [NL1 random_seed]. A seed held in a
    tile uses its first element."""
    run, where = core.begin()
    if isinstance(seed, Tensor):
        core.read(run, seed, where)
        value = core.compute(run, lambda: int(np.asarray(core.values(seed)).reshape(-1)[0]))
    else:
        value = int(seed)
    run.rng = np.random.default_rng(None if value is None else value & 0xFFFFFFFF)


def dropout(x: Tensor, rate: object, *, dtype: object = None, mask: object = None, **kwargs: object) -> Tensor:
    """Zero each element with probability `rate` (a scalar, or a tile with one element per partition) [NL1]."""
    return isa_more.dropout(x, rate, dtype=dtype, mask=mask)


class LoopReduce:
    """What `nl.loop_reduce(x, op, ...)` returns: assigned into dst it computes dst = op(dst, x) on VectorE."""

    def __init__(self, x: Tensor, fn: alu.Op, dtype: object, mask: object) -> None:
        self.x, self.fn, self.dtype, self.mask = x, fn, dtype, mask

    def fold_into(self, dst: Tensor) -> None:
        """dst = op(dst, x) on VectorE, logged as an accumulation: the reduction loop_reduce exists for runs across
        the iterations of an affine_range loop in any order (like `acc += nc_matmul(...)`), so it is no race."""
        from tilec.nki import checks, races

        run, where = core.begin()
        for role, t in (("dst", dst), ("x", self.x)):
            checks.tile(t, "loop_reduce", role, where)
        checks.same_partitions(dst, self.x, "loop_reduce", ("dst", "x"), where)
        m = isa.mask_array(self.mask, dst.shape)
        core.read(run, dst, where, log_it=False, mask=m)
        core.read(run, self.x, where, mask=None if self.x.shape != dst.shape else m)
        fn = self.fn
        value = core.compute(run, lambda: fn.binary(core.f32(dst), core.f32(self.x).reshape(dst.shape)))
        core.write(run, dst, value, where, kind=races.ACC, mask=m)
        core.emit(run, "vector", "tensor_tensor", dst, (dst, self.x), where, attrs=(("alu", fn.name),))


def update_in_place(dst: Tensor, x: object, op_name: str, symbol: str) -> None:
    """`dst += x` (also -=, *=, /=) other than a PSUM matmul accumulation: dst = op(dst, x) on VectorE. SDK 2.23
    made these operators "consistent ... across loop types, PSUM, and SBUF" [RN 2.23, release-notes/prev/rn.rst];
    across the iterations of an affine_range loop it is an associative reduction, which "is not considered a loop
    carried dependency" [NL1 affine_range], so it is logged as an accumulation, like loop_reduce (AWS's
    select_and_scatter sample sums its windows with `out_local += vals_local`). x is a tile of dst's shape, a
    (P, 1)-style lower-rank tile broadcast along the free dims, or a scalar."""
    from tilec.nki import checks, races

    run, where = core.begin()
    fn = alu.OPS[op_name]
    checks.tile(dst, symbol, "dst", where)
    core.read(run, dst, where, log_it=False)
    ins: tuple = (dst,)
    if isinstance(x, Tensor):
        checks.tile(x, symbol, "x", where)
        checks.same_partitions(dst, x, symbol, ("dst", "x"), where)
        core.read(run, x, where)
        ins = (dst, x)
        padded = tuple(x.shape) + (1,) * (dst.ndim - x.ndim)
        if x.size != dst.size and not all(n in (1, d) for n, d in zip(padded, dst.shape)):
            raise rules.NkiSyntaxError(f"'{symbol}': a tile of shape {tuple(x.shape)} does not broadcast to the "
                                       f"destination's {tuple(dst.shape)}", "inplace_shape", where,
                                       f"destination {dst.describe()}; operand {x.describe()}")
        rhs = lambda: (core.f32(x).reshape(dst.shape) if x.size == dst.size else  # noqa: E731
                       np.broadcast_to(core.f32(x).reshape(padded), dst.shape))
    else:
        rhs = lambda: np.float32(x)  # noqa: E731
    value = core.compute(run, lambda: fn.binary(core.f32(dst), rhs()))
    core.write(run, dst, value, where, kind=races.ACC)
    core.emit(run, "vector", "tensor_tensor" if len(ins) == 2 else "tensor_scalar", dst, ins, where,
              attrs=(("alu", fn.name),))


def loop_reduce(x: Tensor, op: object, loop_indices: object, *, dtype: object = None, mask: object = None,
                **kwargs: object) -> LoopReduce:
    """`dst[...] = nl.loop_reduce(x, op, [k])` is `dst[...] = nisa.tensor_tensor(dst, x, op)` [NL1 loop_reduce:
    "The destination tile is also the rhs input to op"]; the destination is known at the assignment."""
    _, where = core.begin()
    fn = alu.lookup(op)
    if fn is None or fn.binary is None:
        raise rules.NkiTypeError(f"loop_reduce needs a binary operator, got {op!r}", "unsupported_op", where)
    if not isinstance(x, Tensor):
        raise rules.NkiTypeError(f"loop_reduce reduces a tile, got {type(x).__name__}", "operand_type", where)
    return LoopReduce(x, fn, dtype, mask)


def shared_constant(constant: object, dtype: object = None, **kwargs: object) -> Tensor:
    """An HBM tensor holding `constant` (cast to dtype) [NL1 shared_constant]."""
    run, where = core.begin()
    arr = np.asarray(constant)
    dt = dtypes.as_dtype(dtype) if dtype is not None else arr.dtype
    t = core.allocate(run, tuple(arr.shape), np.dtype(dt), "hbm", core.target_name(where, "constant"), where,
                      fill=0)
    core.compute(run, lambda: np.copyto(t.arr, arr.astype(np.float32) if arr.dtype != dt else arr,
                                        casting="unsafe"))
    return t


def shared_identity_matrix(n: int, dtype: object = np.uint8, **kwargs: object) -> Tensor:
    """An n x n identity matrix in SBUF [NL1 shared_identity_matrix, new in SDK 2.21]. Its docs (v2.29.0) say it
    behaves as `shared_constant`: a constant in HBM, so here it is one, copied into SBUF by one DMA load (what the
    trace and the performance model see; tilec's own kernels build theirs on chip instead, ir.Identity)."""
    from tilec.nki import language as _nl  # late: language imports this module

    return _nl.load(shared_constant(np.eye(int(n)), dtype=dtype))


def static_cast(input_data: object, dtype: object) -> object:
    """Cast a scalar or array to dtype (a host-side helper, used outside kernels too) [NL1 static_cast]."""
    dt = dtypes.as_dtype(dtype)
    if np.isscalar(input_data):
        return np.asarray(input_data).astype(dt)[()]
    return np.asarray(input_data).astype(dt)


class _FInfo:
    def __init__(self, dt: np.dtype) -> None:
        import ml_dtypes

        info = ml_dtypes.finfo(dt)
        self.dtype, self.bits = dt, info.bits
        self.min, self.max, self.eps, self.tiny = float(info.min), float(info.max), float(info.eps), \
            float(info.tiny)


def finfo(dtype: object) -> _FInfo:
    """Machine limits of a floating dtype (min, max, eps, tiny, bits), as numpy.finfo, for NKI dtypes too."""
    return _FInfo(np.dtype(dtypes.as_dtype(dtype)))


def atomic_rmw(dst: object, value: object, op: object, *, mask: object = None, **kwargs: object) -> None:
    """dst = op(dst, value) on HBM rows chosen by an indirect index (the only indexing 0.1 supports), op np.add
    [NL1 atomic_rmw]: a DMA with dst_rmw_op."""
    from tilec.nki.indirect import Indirect

    _, where = core.begin()
    if not isinstance(dst, Indirect):
        raise rules.NkiSyntaxError("atomic_rmw supports only an HBM destination with indirect (tile) indices",
                                   "atomic_rmw_dst", where, hint="index dst with an int32 (P, 1) index tile")
    isa.dma_copy(dst=dst, src=value, dst_rmw_op=op, mask=mask)


def gather_flattened(data: Tensor, indices: Tensor, *, mask: object = None, dtype: object = None,
                     **kwargs: object) -> Tensor:
    """out[p, k...] = data[p].flatten()[indices[p, k...]] per partition; indices are uint32 [NL1 gather_flattened];
    an index outside the row is an error here (garbage on hardware)."""
    from tilec.nki import checks
    from tilec.nki.isa import _elementwise_engine, _finish

    run, where = core.begin()
    _elementwise_engine(None, "gpsimd", (("data", data), ("indices", indices)), "gather_flattened", run, where)
    checks.same_partitions(data, indices, "gather_flattened", ("data", "indices"), where)
    if indices.dtype != dtypes.uint32:
        raise rules.NkiTypeError(f"gather_flattened indices must be uint32, got {indices.dtype.name}",
                                 "gather_indices_dtype", where)
    core.read(run, data, where)
    core.read(run, indices, where)
    core.needs_values(run, "gather_flattened (its addresses are the values of an index tile)", where)
    idx = np.asarray(core.values(indices)).reshape(indices.shape[0], -1).astype(np.int64)
    if (idx >= data.free_size).any():
        raise rules.NkiIndexError(f"gather_flattened index {int(idx.max())} is outside a row of {data.free_size} "
                                  "elements", "gather_out_of_bounds", where, f"data {data.describe()}")
    value = np.take_along_axis(core.f32(data).reshape(data.shape[0], -1), idx, axis=1).reshape(indices.shape)
    out = _finish(run, mask, value, tuple(indices.shape), dtype, data.dtype, "sbuf", where, "gather")
    core.emit(run, "gpsimd", "gather_flattened", out, (data, indices), where)
    return out
