"""The less common `neuronxcc.nki.isa` instructions of NKI 0.1: predicated copy, scalar-tensor-tensor, scan,
batch-norm statistics, partition reduction and select_reduce (isa.py re-exports them).

Semantics, operand rules and engines follow the NKI 0.1 API reference (aws-neuron-sdk v2.26.1,
`nki/api/nki/isa/__init__.py`, rendered as `nki/api/generated/nki.isa.<name>.html`). Same pattern as isa.py: operand
checks, `core.read` of every operand, the arithmetic as a step passed to `core.compute` (skipped by a trace-only run),
a result of declared shape and one trace instruction.

Where the reference is silent tilec takes the conservative reading and says so next to the code:
  * tensor_copy_predicated keeps dst's old values where the predicate is false, so dst must be written before;
  * the scan (each output depends on every earlier element) and the instructions whose output shape differs from
    the input (bn_stats, bn_aggr, partition reduce) refuse `mask=`: the reference does not say how it applies there;
    select_reduce refuses it too (its reduction spans the whole row);
  * select_reduce's accumulator registers (`Run.vector_acc`) are defined only after a reset: reduce_cmd=reduce
    without one, or reading them out after an idle instruction ("idle may still modify" them), is an error.
"""
from __future__ import annotations


import numpy as np

from tilec.nki import alu, checks, core, dtypes, rules
from tilec.nki.isa import F32, _elementwise_engine, _finish, _op, _operand, _read_operand, _scalar_operand, mask_array
from tilec.nki.tensor import Tensor

_PREDICATE_DTYPES = (dtypes.uint8, dtypes.uint16, dtypes.uint32)  # (nl.bool_ is stored as uint8)
_PARTITION_REDUCE_OPS = ("add", "max", "maximum", "bitwise_or", "bitwise_and")


# ---- shared operand rules ----
def _same_free(a: Tensor, b: Tensor, api: str, roles: tuple, where: tuple) -> None:
    checks.same_partitions(a, b, api, roles, where)
    if a.free_size != b.free_size:
        raise rules.NkiSyntaxError(
            f"{api} operands differ in elements per partition: '{roles[0]}' has {a.free_size}, '{roles[1]}' has "
            f"{b.free_size}", f"{api}_shape", where, f"{roles[0]} {a.describe()}; {roles[1]} {b.describe()}")


def _one_psum(a: Tensor, b: Tensor, api: str, roles: tuple, where: tuple) -> None:
    if a.buf.memory == "psum" and b.buf.memory == "psum":
        raise rules.MemoryRuleError(
            f"'{api}' can read at most one of '{roles[0]}' and '{roles[1]}' from PSUM; both are in psum",
            f"{api}_psum_operands", where, f"{roles[0]} {a.describe()}; {roles[1]} {b.describe()}",
            hint="copy one operand to SBUF first")


def _arithmetic(fns: list, api: str, where: tuple) -> None:
    for fn in fns:
        if fn.kind == "bitvec" or fn.binary is None:
            raise rules.NkiTypeError(f"{api} takes binary arithmetic operators; nl.{fn.name} is not one",
                                     "unsupported_op", where, hint="use nl.add, nl.subtract, nl.multiply, ...")


def _no_mask(mask: object, api: str, where: tuple) -> None:
    if mask is not None:
        raise rules.NkiValueError(
            f"tilec does not support mask= on '{api}': the NKI reference does not say how a mask applies to it",
            "unsupported_mask", where,
            hint="slice the operands to the elements you need instead")


def _like(mask: np.ndarray | None, t: Tensor) -> np.ndarray | None:
    """A mask over one operand's elements, for another operand of the same element count."""
    return None if mask is None else mask.reshape(t.shape)


def _rows(t: Tensor) -> np.ndarray:
    """An operand read() checked, as (partitions, elements per partition) in fp32."""
    return core.f32(t).reshape(t.shape[0], -1)


# ---- tensor_copy_predicated ----
def tensor_copy_predicated(*, src: object, dst: Tensor, predicate: Tensor, reverse_pred: bool = False,
                           mask: object = None, dtype: object = None) -> None:
    """dst = src where predicate (nonzero) else dst, on VectorE; `src` is a tile or a scalar. Returns None."""
    run, where = core.begin()
    api = "tensor_copy_predicated"
    tiles = (("dst", dst), ("predicate", predicate)) + ((("src", src),) if isinstance(src, Tensor) else ())
    _elementwise_engine(None, "vector", tiles, api, run, where)
    _copy_predicated_rules(src, dst, predicate, dtype, where)
    for role, t in tiles[1:]:
        _same_free(dst, t, api, ("dst", role), where)
    m = mask_array(mask, dst.shape)
    for _, t in tiles[1:]:
        core.read(run, t, where, mask=_like(m, t))
    # Where the predicate is false dst keeps its old values: tilec requires them written (docs silent on garbage).
    core.read(run, dst, where, mask=m)
    value = core.compute(run, lambda: _predicated(src, dst, predicate, reverse_pred, m))
    core.write(run, dst, value, where, mask=m)
    attrs = (("reverse_pred", True),) if reverse_pred else ()
    core.emit(run, "vector", api, dst, tuple(t for _, t in tiles[2:]) + (predicate,), where, attrs=attrs)


def _copy_predicated_rules(src: object, dst: Tensor, predicate: Tensor, dtype: object, where: tuple) -> None:
    api = "tensor_copy_predicated"
    if not isinstance(src, (Tensor, int, float, np.number)):
        raise rules.NkiTypeError(f"{api} src must be a tile or a scalar, got {type(src).__name__}", "operand_type",
                                 where)
    if predicate.dtype not in _PREDICATE_DTYPES:
        raise rules.NkiTypeError(f"{api} predicate must be uint8, uint16 or uint32, got {predicate.dtype.name}",
                                 "predicate_dtype", where, f"predicate {predicate.describe()}",
                                 hint="build the predicate with dtype=nl.uint8")
    if isinstance(src, Tensor):
        if src.dtype != dst.dtype:
            raise rules.NkiTypeError(f"{api} src and dst must share the same data type: src is {src.dtype.name}, "
                                     f"dst is {dst.dtype.name}", "copy_predicated_dtype", where,
                                     hint="cast src first with nisa.tensor_copy(src, dtype=...)")
        _one_psum(src, predicate, api, ("src", "predicate"), where)
    if dtype is not None and dtypes.as_dtype(dtype) != dst.dtype:
        raise rules.NkiTypeError(f"{api} writes dst in its own dtype {dst.dtype.name}, got dtype="
                                 f"{dtypes.as_dtype(dtype).name}", "copy_predicated_dtype", where)


def _predicated(src: object, dst: Tensor, predicate: Tensor, reverse: bool, m: np.ndarray | None) -> np.ndarray:
    keep = core.values(predicate, _like(m, predicate)).reshape(dst.shape) != 0
    if reverse:
        keep = ~keep
    new = core.values(src, _like(m, src)).reshape(dst.shape) if isinstance(src, Tensor) else \
        np.asarray(src).astype(dst.dtype)  # a scalar is stored in dst's dtype
    return np.where(keep, new, core.values(dst, m))  # same dtype on both sides: the copy keeps the bits


# ---- scalar_tensor_tensor ----
def scalar_tensor_tensor(*, data: Tensor, op0: object, operand0: object, op1: object, operand1: Tensor,
                         reverse0: bool = False, reverse1: bool = False, dtype: object = None,
                         mask: object = None) -> Tensor:
    """(data op0 operand0) op1 operand1 on VectorE: operand0 a scalar or (P, 1) tile, operand1 a tile like data."""
    run, where = core.begin()
    api = "scalar_tensor_tensor"
    fns = [_op(op0, api, where), _op(op1, api, where)]
    _arithmetic(fns, api, where)
    _elementwise_engine(None, "vector", (("data", data), ("operand1", operand1)), api, run, where)
    _same_free(data, operand1, api, ("data", "operand1"), where)
    _one_psum(data, operand1, api, ("data", "operand1"), where)
    m = mask_array(mask, data.shape)
    core.read(run, data, where, mask=m)
    scalar = _scalar_operand(run, data, operand0, "operand0", fns[0], "vector", where, api)
    core.read(run, operand1, where, mask=_like(m, operand1))
    value = core.compute(run, lambda: _stt_value(data, scalar, operand1, fns, reverse0, reverse1, m))
    out = _finish(run, mask, value, data.shape, dtype, data.dtype, "sbuf", where, api)
    reads = (data,) + ((operand0,) if isinstance(operand0, Tensor) else ()) + (operand1,)
    core.emit(run, "vector", api, out, reads, where, attrs=(("alu", (fns[0].name, fns[1].name)),))
    return out


def _stt_value(data: Tensor, scalar: object, operand1: Tensor, fns: list, reverse0: bool, reverse1: bool,
               m: np.ndarray | None) -> np.ndarray:
    s = scalar() if callable(scalar) else scalar
    x = core.f32(data, m)
    x = fns[0].binary(s, x) if reverse0 else fns[0].binary(x, s)
    y = core.f32(operand1, _like(m, operand1)).reshape(data.shape)
    return fns[1].binary(y, x) if reverse1 else fns[1].binary(x, y)


# ---- tensor_tensor_scan ----
def tensor_tensor_scan(data0: Tensor, data1: Tensor, initial: object, op0: object, op1: object,
                       reverse0: bool = False, reverse1: bool = False, *, dtype: object = None,
                       mask: object = None) -> Tensor:
    """Per partition, along the free elements: r[i] = op1(op0(data0[i], r[i-1]), data1[i]), r[-1] = initial."""
    run, where = core.begin()
    api = "tensor_tensor_scan"
    fns = [_op(op0, api, where), _op(op1, api, where)]
    _arithmetic(fns, api, where)
    _no_mask(mask, api, where)
    _elementwise_engine(None, "vector", (("data0", data0), ("data1", data1)), api, run, where)
    _same_free(data0, data1, api, ("data0", "data1"), where)
    _one_psum(data0, data1, api, ("data0", "data1"), where)
    core.read(run, data0, where)
    core.read(run, data1, where)
    start = _scalar_operand(run, data0, initial, "initial", fns[0], "vector", where, api)
    value = core.compute(run, lambda: _scan(data0, data1, start, fns, reverse0, reverse1))
    out = _finish(run, None, value, data0.shape, dtype, dtypes.promote(data0.dtype, data1.dtype), "sbuf", where,
                  api)
    reads = (data0, data1) + ((initial,) if isinstance(initial, Tensor) else ())
    core.emit(run, "vector", api, out, reads, where, attrs=(("alu", (fns[0].name, fns[1].name)),))
    return out


def _scan(data0: Tensor, data1: Tensor, start: object, fns: list, reverse0: bool, reverse1: bool) -> np.ndarray:
    """The running value stays in fp32 inside the engine (the reference computes in fp32; only the store rounds).
    Several free dimensions are scanned in their row-major order, the order the engine streams them."""
    a, b = _rows(data0), _rows(data1)
    state = start() if callable(start) else start
    state = np.broadcast_to(np.asarray(state, dtype=F32).reshape(-1), (a.shape[0],))
    out = np.empty(a.shape, F32)
    for i in range(a.shape[1]):
        x = fns[0].binary(state, a[:, i]) if reverse0 else fns[0].binary(a[:, i], state)
        state = fns[1].binary(b[:, i], x) if reverse1 else fns[1].binary(x, b[:, i])
        out[:, i] = state
    return out.reshape(data0.shape)


# ---- bn_stats / bn_aggr ----
def bn_stats(data: Tensor, *, mask: object = None, dtype: object = None) -> Tensor:
    """Per partition, 6 values: (count, mean, variance*count) of the even elements, then of the odd ones."""
    run, where = core.begin()
    _no_mask(mask, "bn_stats", where)
    _elementwise_engine(None, "vector", (("data", data),), "bn_stats", run, where)
    fmax = run.target.instr("bn_stats").limit("f")  # nl.tile_size.bn_stats_fmax
    if data.free_size > fmax:
        raise rules.NkiSyntaxError(
            f"bn_stats free size {data.free_size} exceeds bn_stats_fmax {fmax}", "bn_stats_free_size",
            where, f"data {data.describe()}",
            hint=f"run bn_stats on each {fmax}-element slice into one stats tile, then one nisa.bn_aggr")
    core.read(run, data, where)
    value = core.compute(run, lambda: _stats(_rows(data)))
    out = _finish(run, None, value, (data.shape[0], 6), dtype, data.dtype, "sbuf", where, "bn_stats")
    core.emit(run, "vector", "bn_stats", out, (data,), where, attrs=(("in_free", data.free_size),))
    return out


def _stats(x: np.ndarray) -> np.ndarray:
    return np.concatenate([_count_mean_m2(x[:, 0::2]), _count_mean_m2(x[:, 1::2])], axis=1)


def _count_mean_m2(x: np.ndarray) -> np.ndarray:
    """(count, mean, sum of squared deviations) per row; no elements (a 1-element row has no odd ones) gives
    (0, 0, 0), which bn_aggr weighs by its count of 0 (the reference is silent on this case)."""
    n = x.shape[1]
    mean = x.mean(axis=1, dtype=F32) if n else np.zeros(x.shape[0], F32)
    m2 = ((x - mean[:, None]) ** 2).sum(axis=1, dtype=F32)
    return np.stack([np.full(x.shape[0], n, F32), mean, m2], axis=1).astype(F32)


def bn_aggr(data: Tensor, *, mask: object = None, dtype: object = None) -> Tensor:
    """Per partition, (mean, variance) of all elements summarised by the (count, mean, variance*count) triples."""
    run, where = core.begin()
    _no_mask(mask, "bn_aggr", where)
    _elementwise_engine(None, "vector", (("data", data),), "bn_aggr", run, where)
    if data.free_size % 3:
        raise rules.NkiSyntaxError(
            f"bn_aggr input holds (count, mean, variance*count) triples: its free size {data.free_size} is not a "
            "multiple of 3", "bn_aggr_free_size", where, f"data {data.describe()}",
            hint="pass the outputs of nisa.bn_stats (6 elements per partition each)")
    core.read(run, data, where)
    value = core.compute(run, lambda: _aggregate(_rows(data)))
    out = _finish(run, None, value, (data.shape[0], 2), dtype, data.dtype, "sbuf", where, "bn_aggr")
    core.emit(run, "vector", "bn_aggr", out, (data,), where, attrs=(("in_free", data.free_size),))
    return out


def _aggregate(x: np.ndarray) -> np.ndarray:
    """Chan et al.'s merge of (count, mean, M2) groups; population variance (np.var's). A partition of count 0
    gives NaN: no elements have no mean (the reference is silent)."""
    t = x.reshape(x.shape[0], -1, 3)
    count, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
    n = count.sum(axis=1, dtype=F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        total = (count * mean).sum(axis=1, dtype=F32) / n
        spread = (m2 + count * (mean - total[:, None]) ** 2).sum(axis=1, dtype=F32) / n
    return np.stack([total, spread], axis=1).astype(F32)


# ---- tensor_partition_reduce ----
def tensor_partition_reduce(op: object, data: Tensor, *, mask: object = None, dtype: object = None) -> Tensor:
    """Reduce across the partitions on GpSimdE: (P, *free) -> (1, *free); op is add, max, bitwise_or or
    bitwise_and."""
    run, where = core.begin()
    api = "tensor_partition_reduce"
    fn = _op(op, api, where)
    if fn.name not in _PARTITION_REDUCE_OPS:
        raise rules.NkiTypeError(f"{api} supports add, max, bitwise_or and bitwise_and; got nl.{fn.name}",
                                 "unsupported_op", where)
    _no_mask(mask, api, where)
    _elementwise_engine(None, "gpsimd", (("data", data),), api, run, where)
    _read_operand(run, data, fn, where)
    shape = (1,) + tuple(data.shape[1:])
    value = core.compute(run, lambda: _partition_reduced(fn, data))
    out = _finish(run, None, value, shape, dtype, data.dtype, "sbuf", where, api)
    core.emit(run, "gpsimd", api, out, (data,), where, attrs=(("alu", fn.name),))
    return out


def _partition_reduced(fn: alu.Op, data: Tensor) -> np.ndarray:
    reduce = {"add": np.add, "max": np.maximum, "maximum": np.maximum, "bitwise_or": np.bitwise_or,
              "bitwise_and": np.bitwise_and}[fn.name]
    return reduce.reduce(_operand(data, fn), axis=0, keepdims=True)


# ---- select_reduce ----
_SELECT_PREDICATE_DTYPES = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16)


def select_reduce(*, dst: Tensor, predicate: Tensor, on_true: Tensor, on_false: object, reduce_res: object = None,
                  reduce_cmd: object = 0, reduce_op: object = np.amax, reverse_pred: bool = False,
                  mask: object = None, dtype: object = None) -> None:
    """dst = on_true where predicate (nonzero) else on_false, on VectorE; optionally the per-partition max of dst
    through the VectorE accumulator registers into reduce_res (reduce_cmd: 0 idle, 2 reduce, 3 reset_reduce)."""
    run, where = core.begin()
    api = "select_reduce"
    _no_mask(mask, api, where)
    tiles = (("dst", dst), ("on_true", on_true), ("predicate", predicate))
    _elementwise_engine(None, "vector", tiles, api, run, where)
    _select_rules(dst, predicate, on_true, dtype, where)
    for role, t in tiles[1:]:
        _same_free(dst, t, api, ("dst", role), where)
    _one_psum(on_true, predicate, api, ("on_true", "predicate"), where)
    cmd = int(reduce_cmd)
    _accumulation_rules(run, cmd, reduce_op, reduce_res, dst, where)
    core.read(run, on_true, where)
    core.read(run, predicate, where)
    fill = _select_on_false(run, dst, on_false, where)
    value = core.compute(run, lambda: _selected(on_true, predicate, fill, reverse_pred, dst.shape))
    core.write(run, dst, value, where)
    reads = (on_true, predicate) + ((on_false,) if isinstance(on_false, Tensor) else ())
    seq = core.emit(run, "vector", api, dst, reads, where, attrs=(("reduce_cmd", cmd),))
    run.vector_acc_defined = cmd != _IDLE  # "even when idle, the accumulator state may still be modified" [NISA]
    if cmd != _IDLE:
        core.compute(run, lambda: _update_registers(run, cmd, value, dst.shape[0]))
    if reduce_res is not None:
        parts = dst.shape[0]
        core.write(run, reduce_res, core.compute(run, lambda: run.vector_acc[:parts].reshape(reduce_res.shape)),
                   where)
        core.also_writes(run, seq, reduce_res)


def _select_rules(dst: Tensor, predicate: Tensor, on_true: Tensor, dtype: object, where: tuple) -> None:
    api = "select_reduce"
    if predicate.dtype not in _SELECT_PREDICATE_DTYPES:
        raise rules.NkiTypeError(f"{api} predicate must be int8, uint8, int16 or uint16, got {predicate.dtype.name}",
                                 "predicate_dtype", where, f"predicate {predicate.describe()}")
    if on_true.dtype in (dtypes.int32, dtypes.uint32):  # (tfloat32 is stored as float32 here: not told apart)
        raise rules.NkiTypeError(f"{api} on_true cannot be {on_true.dtype.name}", "select_reduce_dtype", where,
                                 f"on_true {on_true.describe()}")
    if dtype is not None and dtypes.as_dtype(dtype) != dst.dtype:
        raise rules.NkiTypeError(f"{api} writes dst in its own dtype {dst.dtype.name}, got dtype="
                                 f"{dtypes.as_dtype(dtype).name}", "select_reduce_dtype", where)


def _select_on_false(run, dst: Tensor, on_false: object, where: tuple):
    """A scalar (a Python/fp32 number or nl.fp32.min) or a (P, 1) tile; returns the value or a thunk of it."""
    from tilec.nki import language

    if isinstance(on_false, language._Min):
        on_false = on_false.min
    return _scalar_operand(run, dst, on_false, "on_false", alu.OPS["add"], "vector", where, "select_reduce")


def _selected(on_true: Tensor, predicate: Tensor, fill: object, reverse: bool, shape: tuple) -> np.ndarray:
    keep = core.values(predicate).reshape(shape) != 0
    if reverse:
        keep = ~keep
    fill = fill() if callable(fill) else fill
    return np.where(keep, core.f32(on_true).reshape(shape), fill).astype(F32)


_IDLE, _RESET, _REDUCE, _RESET_REDUCE = 0, 1, 2, 3


def _accumulation_rules(run, cmd: int, reduce_op: object, reduce_res: object, dst: Tensor, where: tuple) -> None:
    """The VectorE accumulator registers: one fp32 per partition, reset to -inf, max-reduced over dst's rows."""
    api = "select_reduce"
    fn = alu.OPS["max"] if reduce_op is np.amax else _op(reduce_op, api, where)
    if fn.name not in ("max", "maximum"):
        raise rules.NkiTypeError(f"{api} reduces only with max; got nl.{fn.name}", "unsupported_op", where)
    if cmd not in (_IDLE, _RESET, _REDUCE, _RESET_REDUCE):
        raise rules.NkiValueError(f"{api} reduce_cmd must be a nisa.reduce_cmd, got {cmd}", "reduce_cmd", where)
    if cmd == _REDUCE and not run.vector_acc_defined:
        raise rules.NkiValueError(
            f"{api} with reduce_cmd=reduce accumulates onto registers no reset defined", "accumulator_undefined",
            where, hint="start the accumulation with reduce_cmd=nisa.reduce_cmd.reset_reduce")
    if reduce_res is not None:
        _reduce_res_rules(reduce_res, dst, cmd, where)


def _update_registers(run, cmd: int, value: np.ndarray | None, parts: int) -> None:
    if cmd in (_RESET, _RESET_REDUCE) or run.vector_acc is None:
        run.vector_acc = np.full(run.target.pmax, -np.inf, F32)  # one register per partition
    if cmd in (_REDUCE, _RESET_REDUCE):
        rows = value.reshape(parts, -1).max(axis=1)
        run.vector_acc[:parts] = np.maximum(run.vector_acc[:parts], rows)


def _reduce_res_rules(reduce_res: object, dst: Tensor, cmd: int, where: tuple) -> None:
    api = "select_reduce"
    checks.tile(reduce_res, api, "reduce_res", where)
    checks.same_partitions(dst, reduce_res, api, ("dst", "reduce_res"), where)
    if reduce_res.free_size != 1 or not dtypes.is_float(reduce_res.dtype):
        raise rules.NkiSyntaxError(
            f"{api} reduce_res must be a float vector of shape ({dst.shape[0]}, 1), got shape "
            f"{tuple(reduce_res.shape)} of {reduce_res.dtype.name}", "select_reduce_res", where,
            f"reduce_res {reduce_res.describe()}")
    if cmd == _IDLE:
        raise rules.NkiValueError(f"{api} reduce_res reads the accumulator registers, undefined with "
                                  "reduce_cmd=idle", "accumulator_undefined", where,
                                  hint="use reduce_cmd=nisa.reduce_cmd.reset_reduce")
