"""More `neuronxcc.nki.isa` instructions of NKI 0.1 that AWS's suites use (issue 15): max8, nc_find_index8,
nc_match_replace8, nc_stream_shuffle, dropout, activation_reduce, tensor_scalar_reduce (isa.py re-exports them).

Semantics follow the NKI 0.1 docstrings (aws-neuron-sdk v2.26.1, `nki/api/nki/isa/__init__.py`) [ISA1]; same pattern
as isa.py: operand checks, `core.read` of every operand, the arithmetic as a step passed to `core.compute` (skipped by
a trace-only run), a result of declared shape, one trace instruction.
"""
from __future__ import annotations

import numpy as np

from tilec.nki import checks, core, dtypes, rules
from tilec.nki.isa import F32, _elementwise_engine, _finish, _op, activation, mask_array, tensor_scalar
from tilec.nki.tensor import Tensor

MAX8_FMIN, MAX8_FMAX = 8, 16384  # elements per partition max8 / find_index8 read [ISA1 max8]


def _rows(t: Tensor, mask: np.ndarray | None = None) -> np.ndarray:
    """The operand as fp32 rows (partition, flattened free); masked-off elements are NaN (never selected)."""
    v = core.f32(t, mask)
    if mask is not None:
        v = np.where(mask, v, np.float32(np.nan))
    return v.reshape(t.shape[0], -1)


def _eight_per_partition(t: Tensor, api: str, role: str, where: tuple) -> None:
    if t.free_size != 8:
        raise rules.NkiSyntaxError(f"{api} '{role}' must hold exactly 8 elements per partition, got {t.free_size}",
                                   f"{api}_vals", where, f"{role} {t.describe()}")


def _data_size(t: Tensor, api: str, where: tuple) -> None:
    if not MAX8_FMIN <= t.free_size <= MAX8_FMAX:
        raise rules.NkiSyntaxError(f"{api} reads between {MAX8_FMIN} and {MAX8_FMAX} elements per partition, got "
                                   f"{t.free_size}", f"{api}_size", where, f"data {t.describe()}")


def max8(*, src: Tensor, mask: object = None, dtype: object = None, **kwargs: object) -> Tensor:
    """The 8 largest values of each partition, descending, as a (P, 8) tile [ISA1 max8]."""
    run, where = core.begin()
    _elementwise_engine(None, "vector", (("src", src),), "max8", run, where)
    _data_size(src, "max8", where)
    m = mask_array(mask, src.shape)
    core.read(run, src, where, mask=m)
    value = core.compute(run, lambda: -np.sort(-np.nan_to_num(_rows(src, m), nan=-np.inf), axis=1)[:, :8])
    out = _finish(run, None, value, (src.shape[0], 8), dtype, src.dtype, "sbuf", where, "max8")
    core.emit(run, "vector", "max8", out, (src,), where, attrs=(("in_free", src.free_size),))
    return out


def _first_indices(data: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """Per partition, the index of the first occurrence of each value (each index used once, so repeated values
    find successive occurrences, as the hardware's match-and-replace does)."""
    out = np.zeros(vals.shape, np.uint32)
    for p in range(data.shape[0]):
        taken = np.zeros(data.shape[1], bool)
        for j, v in enumerate(vals[p]):
            hits = np.flatnonzero((data[p] == v) & ~taken)
            if hits.size:
                out[p, j] = hits[0]
                taken[hits[0]] = True
    return out


def nc_find_index8(*, data: Tensor, vals: Tensor, mask: object = None, dtype: object = None,
                   **kwargs: object) -> Tensor:
    """Index of the first occurrence of each of the 8 values in each partition; uint32 by default [ISA1]."""
    run, where = core.begin()
    _elementwise_engine(None, "vector", (("data", data), ("vals", vals)), "nc_find_index8", run, where)
    checks.same_partitions(data, vals, "nc_find_index8", ("data", "vals"), where)
    _data_size(data, "nc_find_index8", where)
    _eight_per_partition(vals, "nc_find_index8", "vals", where)
    out_dtype = dtypes.as_dtype(dtype) if dtype is not None else dtypes.uint32
    if out_dtype not in (dtypes.uint16, dtypes.uint32):
        raise rules.NkiTypeError(f"nc_find_index8 returns uint16 or uint32, got {out_dtype.name}", "index8_dtype",
                                 where)
    m = mask_array(mask, data.shape)
    core.read(run, data, where, mask=m)
    core.read(run, vals, where)
    value = core.compute(run, lambda: _first_indices(_rows(data, m), _rows(vals)))
    out = core.result(run, value, (data.shape[0], 8), out_dtype, "sbuf", where, "find_index8")
    core.emit(run, "vector", "nc_find_index8", out, (data, vals), where, attrs=(("in_free", data.free_size),))
    return out


def nc_match_replace8(*, data: Tensor, vals: Tensor, imm: object, dst_idx: Tensor | None = None,
                      mask: object = None, dtype: object = None, **kwargs: object) -> Tensor:
    """Replace the first occurrence of each of the 8 values in each partition of `data` by `imm`; optionally write
    the matched indices into `dst_idx` [ISA1 nc_match_replace8]. Masked-off data elements are neither matched nor
    replaced (they keep their value)."""
    run, where = core.begin()
    _elementwise_engine(None, "vector", (("data", data), ("vals", vals)), "nc_match_replace8", run, where)
    checks.same_partitions(data, vals, "nc_match_replace8", ("data", "vals"), where)
    if data.free_size > MAX8_FMAX:
        raise rules.NkiSyntaxError(f"nc_match_replace8 reads at most {MAX8_FMAX} elements per partition, got "
                                   f"{data.free_size}", "nc_match_replace8_size", where, f"data {data.describe()}")
    _eight_per_partition(vals, "nc_match_replace8", "vals", where)
    m = mask_array(mask, data.shape)
    core.read(run, data, where, mask=m)
    core.read(run, vals, where)
    if dst_idx is not None:
        checks.tile(dst_idx, "nc_match_replace8", "dst_idx", where)
        _eight_per_partition(dst_idx, "nc_match_replace8", "dst_idx", where)
    if isinstance(imm, Tensor):  # a kernel argument: a scalar held in HBM
        core.read(run, imm, where)
        core.needs_values(run, "nc_match_replace8 with imm from a tensor", where)
        imm = float(np.asarray(core.values(imm)).reshape(-1)[0])
    found = core.compute(run, lambda: _first_indices(_rows(data, m), _rows(vals)))
    value = core.compute(run, lambda: _replaced(data, m, found, imm))
    out = _finish(run, None, value, data.shape, dtype, data.dtype, "sbuf", where, "match_replace8")
    core.emit(run, "vector", "nc_match_replace8", out, (data, vals), where, attrs=(("in_free", data.free_size),))
    if dst_idx is not None:
        core.write(run, dst_idx, None if found is None else found.reshape(dst_idx.shape), where)
    return out


def _replaced(data: Tensor, mask: np.ndarray | None, found: np.ndarray, imm: object) -> np.ndarray:
    rows = core.f32(data, mask).reshape(data.shape[0], -1).copy()
    np.put_along_axis(rows, found.astype(np.int64), np.float32(imm), axis=1)
    return rows.reshape(data.shape)


def nc_stream_shuffle(src: Tensor, dst: Tensor, shuffle_mask: object, *, dtype: object = None, mask: object = None,
                      **kwargs: object) -> None:
    """Within each quadrant of 32 partitions, output partition i copies input partition shuffle_mask[i] (255: left
    unmodified), the same mask for every quadrant [ISA1 nc_stream_shuffle]."""
    run, where = core.begin()
    _elementwise_engine(None, "vector", (("src", src), ("dst", dst)), "nc_stream_shuffle", run, where)
    sel = [int(x) for x in shuffle_mask]
    if len(sel) != 32 or any(not (0 <= s < 32 or s == 255) for s in sel):
        raise rules.NkiValueError("nc_stream_shuffle shuffle_mask must list 32 partitions of a quadrant (0..31, or "
                                  f"255 to leave one unmodified), got {sel}", "stream_shuffle_mask", where)
    if src.dtype != dst.dtype or src.free_size != dst.free_size:
        raise rules.NkiSyntaxError("nc_stream_shuffle needs dst with src's dtype and elements per partition",
                                   "stream_shuffle_operands", where, f"src {src.describe()}; dst {dst.describe()}")
    core.read(run, src, where)
    rows = [(q * 32 + i, q * 32 + s) for q in range(-(-dst.shape[0] // 32)) for i, s in enumerate(sel)
            if s != 255 and q * 32 + i < dst.shape[0]]
    for _, s in rows:
        if s >= src.shape[0] and src.shape[0] != 1:
            raise rules.NkiIndexError(f"nc_stream_shuffle reads partition {s} of a source with {src.shape[0]}",
                                      "stream_shuffle_partition", where, f"src {src.describe()}")
    value = core.compute(run, lambda: _shuffled(src, dst, rows))
    m = np.zeros(dst.shape, bool)
    for d, _ in rows:
        m[d] = True
    mm = mask_array(mask, dst.shape)
    core.write(run, dst, value, where, mask=m if mm is None else m & mm)
    core.emit(run, "vector", "nc_stream_shuffle", dst, (src,), where)


def _shuffled(src: Tensor, dst: Tensor, rows: list) -> np.ndarray:
    s = core.values(src).reshape(src.shape[0], -1)
    out = np.zeros((dst.shape[0], s.shape[1]), s.dtype)
    for d, p in rows:
        out[d] = s[p if src.shape[0] > 1 else 0]
    return out.reshape(dst.shape)


def dropout(data: Tensor, prob: object, *, mask: object = None, dtype: object = None, **kwargs: object) -> Tensor:
    """Each element becomes 0 with probability `prob` (a scalar or a (P, 1) tile, per partition) [ISA1 dropout];
    kept elements are not rescaled. The draws come from the run's generator (nl.random_seed)."""
    run, where = core.begin()
    _elementwise_engine(None, "vector", (("data", data),), "dropout", run, where)
    reads = [data]
    if isinstance(prob, Tensor):
        checks.tile(prob, "dropout", "prob", where)
        checks.same_partitions(data, prob, "dropout", ("data", "prob"), where)
        if prob.free_size != 1:
            raise rules.NkiSyntaxError(f"dropout prob must be a scalar or a ({data.shape[0]}, 1) tile, got "
                                       f"{tuple(prob.shape)}", "dropout_prob", where)
        core.read(run, prob, where)
        reads.append(prob)
    m = mask_array(mask, data.shape)
    core.read(run, data, where, mask=m)

    def step() -> np.ndarray:
        p = core.f32(prob).reshape((data.shape[0],) + (1,) * (data.ndim - 1)) if isinstance(prob, Tensor) \
            else np.float32(prob)
        keep = rng(run).random(data.shape) >= p
        return np.where(keep, core.f32(data, m), np.float32(0))

    out = _finish(run, mask, core.compute(run, step), data.shape, dtype, data.dtype, "sbuf", where, "dropout")
    core.emit(run, "vector", "dropout", out, tuple(reads), where)
    return out


def rng(run: object) -> np.random.Generator:
    """The run's random generator (nl.random_seed reseeds it; unseeded runs draw from fresh entropy)."""
    gen = getattr(run, "rng", None)
    if gen is None:
        gen = run.rng = np.random.default_rng()
    return gen


def activation_reduce(op: object, data: Tensor, *, reduce_op: object, reduce_res: Tensor, bias: object = None,
                      scale: object = 1.0, mask: object = None, dtype: object = None, **kwargs: object) -> Tensor:
    """nisa.activation plus an add-reduction of its result along the free dims into reduce_res (one element per
    partition) [ISA1 activation_reduce: "equivalent to calling nisa.activation with reduce_cmd=reset_reduce"]."""
    _, where = core.begin()
    if _op(reduce_op, "activation_reduce", where).name not in ("add", "sum"):  # np.sum is an addition too
        raise rules.NkiValueError("activation_reduce supports only reduce_op=nl.add", "activation_reduce_op", where)
    return activation(op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res, mask=mask,
                      dtype=dtype)


_SCALAR_REDUCE = {"add": np.sum, "subtract": None, "multiply": np.prod, "max": np.max, "maximum": np.max,
                  "min": np.min, "minimum": np.min}


def tensor_scalar_reduce(*, data: Tensor, op0: object, operand0: object, reduce_op: object, reduce_res: Tensor,
                         reverse0: bool = False, dtype: object = None, mask: object = None,
                         **kwargs: object) -> Tensor:
    """tensor_scalar with one operator, plus a reduction of its result along the free dims into reduce_res
    [ISA1 tensor_scalar_reduce; reduce_op is add, subtract, multiply, max or min]."""
    run, where = core.begin()
    fn = _op(reduce_op, "tensor_scalar_reduce", where)
    if fn.name not in _SCALAR_REDUCE:
        raise rules.NkiValueError(f"tensor_scalar_reduce reduce_op must be add, subtract, multiply, max or min, got "
                                  f"nl.{fn.name}", "tensor_scalar_reduce_op", where)
    checks.tile(reduce_res, "tensor_scalar_reduce", "reduce_res", where)
    checks.same_partitions(data, reduce_res, "tensor_scalar_reduce", ("data", "reduce_res"), where)
    if reduce_res.free_size != 1:
        raise rules.NkiSyntaxError(f"tensor_scalar_reduce reduce_res must be ({data.shape[0]}, 1), got "
                                   f"{tuple(reduce_res.shape)}", "tensor_scalar_reduce_res", where)
    out = tensor_scalar(data, op0, operand0, reverse0, dtype=dtype, mask=mask)
    raw = out.buf.raw
    core.write(run, reduce_res, core.compute(run, lambda: _row_reduce(fn.name, raw, reduce_res.shape)), where)
    core.also_writes(run, out.buf.instr, reduce_res)
    return out


def _row_reduce(name: str, value: np.ndarray, shape: tuple) -> np.ndarray:
    rows = np.asarray(value, F32).reshape(value.shape[0], -1)
    if name == "subtract":  # a left fold: x0 - x1 - x2 ...
        red = rows[:, 0] - rows[:, 1:].sum(axis=1)
    else:
        red = _SCALAR_REDUCE[name](rows, axis=1)
    return red.reshape(shape)



def reciprocal(data: Tensor, *, dtype: object = None, mask: object = None, **kwargs: object) -> Tensor:
    """1 / x element-wise on VectorE [ISA1 reciprocal; cost max(MIN_II, 8N)]."""
    run, where = core.begin()
    _elementwise_engine(None, "vector", (("data", data),), "reciprocal", run, where)
    m = mask_array(mask, data.shape)
    core.read(run, data, where, mask=m)
    with np.errstate(divide="ignore"):
        value = core.compute(run, lambda: np.reciprocal(core.f32(data, m)))
    out = _finish(run, mask, value, data.shape, dtype, data.dtype, "sbuf", where, "reciprocal")
    core.emit(run, "vector", "reciprocal", out, (data,), where)
    return out


_COMPARE = {"equal": np.equal, "less": np.less, "less_equal": np.less_equal, "greater": np.greater,
            "greater_equal": np.greater_equal}


def range_select(*, on_true_tile: Tensor, comp_op0: object, comp_op1: object, bound0: Tensor, bound1: Tensor,
                 reduce_cmd: object = 0, reduce_res: object = None, reduce_op: object = np.amax,
                 range_start: object = 0, on_false_value: object = None, mask: object = None, dtype: object = None,
                 **kwargs: object) -> Tensor:
    """out = on_true where comp_op0(i, bound0) & comp_op1(i, bound1), i = range_start + free index, else
    on_false_value (FP32_MIN); the row max goes through the VectorE accumulator registers into reduce_res, as with
    select_reduce (reset_reduce starts, reduce accumulates) [ISA1 range_select, NeuronCore-v3]."""
    from tilec.nki.isa_extra import _IDLE, _accumulation_rules, _update_registers

    run, where = core.begin()
    api = "range_select"
    if run.target.name == "trn1":
        raise rules.NkiSyntaxError("range_select is available only on NeuronCore-v3 (trn2) and later",
                                   "range_select_target", where)
    _elementwise_engine(None, "vector", (("on_true_tile", on_true_tile), ("bound0", bound0), ("bound1", bound1)),
                        api, run, where)
    fns = []
    for role, op in (("comp_op0", comp_op0), ("comp_op1", comp_op1)):
        fn = _op(op, api, where)
        if fn.name not in _COMPARE:
            raise rules.NkiTypeError(f"range_select {role} must be equal, less, less_equal, greater or "
                                     f"greater_equal; got nl.{fn.name}", "unsupported_op", where)
        fns.append(_COMPARE[fn.name])
    for role, b in (("bound0", bound0), ("bound1", bound1)):
        checks.same_partitions(on_true_tile, b, api, ("on_true_tile", role), where)
        if b.free_size != 1 or b.dtype != F32:
            raise rules.NkiSyntaxError(f"range_select {role} must be a float32 ({on_true_tile.shape[0]}, 1) tile, got "
                                       f"{tuple(b.shape)} {b.dtype.name}", "range_select_bound", where)
    cmd = int(reduce_cmd)
    _accumulation_rules(run, cmd, reduce_op, reduce_res, on_true_tile, where)
    for t in (on_true_tile, bound0, bound1):
        core.read(run, t, where)
    fill = np.float32(np.finfo(np.float32).min if on_false_value is None else on_false_value)
    if isinstance(range_start, Tensor):
        core.needs_values(run, "range_select with range_start from a tile", where)
        core.read(run, range_start, where)
        range_start = float(np.asarray(core.values(range_start)).reshape(-1)[0])

    def step() -> np.ndarray:
        rows = core.f32(on_true_tile).reshape(on_true_tile.shape[0], -1)
        idx = np.float32(range_start) + np.arange(rows.shape[1], dtype=F32)[None, :]
        keep = fns[0](idx, core.f32(bound0).reshape(-1, 1)) & fns[1](idx, core.f32(bound1).reshape(-1, 1))
        return np.where(keep, rows, fill).reshape(on_true_tile.shape)

    value = core.compute(run, step)
    out = _finish(run, mask, value, on_true_tile.shape, dtype, on_true_tile.dtype, "sbuf", where, "range_select")
    seq = core.emit(run, "vector", api, out, (on_true_tile, bound0, bound1), where, attrs=(("reduce_cmd", cmd),))
    run.vector_acc_defined = cmd != _IDLE
    if cmd != _IDLE:
        core.compute(run, lambda: _update_registers(run, cmd, value, on_true_tile.shape[0]))
    if reduce_res is not None:
        parts = on_true_tile.shape[0]
        core.write(run, reduce_res, core.compute(run, lambda: run.vector_acc[:parts].reshape(reduce_res.shape)),
                   where)
        core.also_writes(run, seq, reduce_res)
    return out


def sequence_bounds(*, segment_ids: Tensor, dtype: object = None, **kwargs: object) -> Tensor:
    """For each element, [start, end) of the run of equal segment ids it belongs to, as a (1, 2, n) tile; padding
    (id 0) gets start n and end -1 [ISA1 sequence_bounds, GpSimdE; partition dim 1]."""
    run, where = core.begin()
    _elementwise_engine(None, "gpsimd", (("segment_ids", segment_ids),), "sequence_bounds", run, where)
    if segment_ids.shape[0] != 1 or segment_ids.dtype not in (F32, dtypes.int32):
        raise rules.NkiSyntaxError(f"sequence_bounds takes a (1, n) float32 or int32 tile, got "
                                   f"{tuple(segment_ids.shape)} {segment_ids.dtype.name}", "sequence_bounds_input",
                                   where)
    core.read(run, segment_ids, where)
    n = segment_ids.free_size
    value = core.compute(run, lambda: _bounds(core.f32(segment_ids).reshape(-1)).reshape(1, 2, n))
    out = _finish(run, None, value, (1, 2, n), dtype, segment_ids.dtype, "sbuf", where, "sequence_bounds")
    core.emit(run, "gpsimd", "sequence_bounds", out, (segment_ids,), where)
    return out


def _bounds(ids: np.ndarray) -> np.ndarray:
    n = ids.size
    start, end = np.empty(n, F32), np.empty(n, F32)
    for i in range(n):
        start[i] = n if ids[i] == 0 else (start[i - 1] if i and ids[i] == ids[i - 1] else i)
    for i in range(n - 1, -1, -1):
        end[i] = -1 if ids[i] == 0 else (end[i + 1] if i < n - 1 and ids[i] == ids[i + 1] else i + 1)
    return np.stack([start, end])


def local_gather(src_buffer: Tensor, index: Tensor, num_elem_per_idx: int = 1, num_valid_indices: object = None, *,
                 mask: object = None, **kwargs: object) -> Tensor:
    """GpSimdE gather within each group of 16 partitions (one GpSimd core each): the group's uint16 indices, read
    column-major and cut to num_valid_indices, are element offsets of runs of num_elem_per_idx elements picked from
    each of its partitions;
    the output is (P, num_valid_indices, num_elem_per_idx) in src's dtype [ISA1 local_gather, its NumPy semantics]."""
    run, where = core.begin()
    api = "local_gather"
    _elementwise_engine(None, "gpsimd", (("src_buffer", src_buffer), ("index", index)), api, run, where)
    p, e = src_buffer.shape[0], int(num_elem_per_idx)
    if index.shape[0] != p or p % 16 or e not in (1, 2, 4, 8, 16, 32) or index.dtype != dtypes.uint16 or \
            src_buffer.free_size % e:
        raise rules.NkiSyntaxError(
            "local_gather needs src_buffer and a uint16 index with the same partitions (a multiple of 16) and "
            "num_elem_per_idx in 1, 2, 4, 8, 16, 32 dividing src's elements per partition", "local_gather_shape",
            where, f"src_buffer {src_buffer.describe()}; index {index.describe()}; num_elem_per_idx {e}")
    per_core = index.size // (p // 16)
    nv = per_core if num_valid_indices is None else int(num_valid_indices)
    if not 0 < nv <= min(per_core, 4096):
        raise rules.NkiValueError(f"local_gather num_valid_indices {nv} must be in 1..{min(per_core, 4096)}",
                                  "local_gather_count", where)
    core.read(run, src_buffer, where)
    core.read(run, index, where)
    core.needs_values(run, "local_gather (its addresses are the values of an index tile)", where)
    idx = np.asarray(core.values(index)).reshape(p, -1).astype(np.int64)
    f = src_buffer.free_size
    src = core.values(src_buffer).reshape(p, f)
    out = np.empty((p, nv, e), src.dtype)
    for g in range(0, p, 16):  # an index is the element offset where its run of num_elem_per_idx starts
        pick = idx[g:g + 16].flatten(order="F")[:nv]
        if (pick + e > f).any():
            raise rules.NkiIndexError(f"local_gather index {int(pick.max())} reads past the {f} elements of a "
                                      "partition (undefined on hardware)", "local_gather_out_of_bounds", where)
        out[g:g + 16] = src[g:g + 16][:, pick[:, None] + np.arange(e)[None, :]]
    result = core.result(run, out, (p, nv, e), src_buffer.dtype, "sbuf", where, "gather")
    core.emit(run, "gpsimd", api, result, (src_buffer, index), where)
    return result


def tensor_copy_dynamic_src(src: Tensor, *, mask: object = None, dtype: object = None, engine: object = None,
                            **kwargs: object) -> Tensor:
    """tensor_copy of a source at a dynamic offset within each partition (the offset, a value in SBUF, was read
    when `src` was indexed: `t[ix, offset_tile + iy]`) [ISA1 tensor_copy_dynamic_src]."""
    from tilec.nki.isa import tensor_copy

    return tensor_copy(src, mask=mask, dtype=dtype, engine=engine)
