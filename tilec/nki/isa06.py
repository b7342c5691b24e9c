"""`nki.isa` of NKI 0.6 (Neuron SDK 2.32): every instruction writes its destination, `dst` first; no dtype=/mask=.

Each call runs the 0.1 instruction of the same name on the shared core (operand rules, fp32 arithmetic, one trace
instruction) with the destination's dtype, then stores the result into `dst` through the core's assignment (the
engine's write rules, the partition rules, the trace instruction retargeted to dst): a 0.6 kernel and the 0.1 kernel
of the same schedule produce the same trace. What 0.6 adds is checked here, in the docs' wording where they have one
[ISA6 = aws-neuron-sdk v2.32.0 nki/api/nki/isa/__init__.py, MIG = nki/migration/index.rst]:

  * dst holds the result: same partitions and elements per partition; nc_transpose keeps the dtype;
  * nc_matmul `accumulate=`: False overwrites, True adds, None infers (first write overwrites); accumulating onto
    PSUM never written, or written by a non-matmul instruction (memset, tensor_copy, ...), is undefined behaviour
    on NeuronCore-v2/v3 and an error here; dst is a float32 PSUM tile;
  * dma_copy does not read PSUM; with dge_mode=hwdge the dtypes match;
  * dma_transpose: dst in SBUF, dst.shape is the transposed src.shape including rank, src.dtype == dst.dtype; hwdge
    needs a 2-byte dtype, src.shape[-1] <= 128 and the documented src.shape[0];
  * tensor_scalar / activation operands given as tiles are float32 (scale), as documented;
  * iota and affine_select take an access pattern ([[step, num], ...], offset, channel_multiplier) instead of an
    nl.arange expression.
"""
from __future__ import annotations

import enum

import numpy as np

from tilec.nki import alu, checks, core, dtypes, isa, rules, runtime
from tilec.nki.isa import F32, nc_version  # noqa: F401  (nc_version is part of the API)
from tilec.nki.tensor import Tensor


class engine(enum.IntEnum):
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


class dge_mode(enum.IntEnum):
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class reduce_cmd(enum.IntEnum):
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


oob_mode = isa.oob_mode


class matmul_perf_mode(enum.Enum):
    none = "none"
    double_row = "double_row"


# deprecated aliases the 0.6 module still lists
unknown_engine, tensor_engine, scalar_engine = engine.unknown, engine.tensor, engine.scalar
gpsimd_engine, vector_engine = engine.gpsimd, engine.vector
_ENGINES = {engine.tensor: "tensor", engine.scalar: "scalar", engine.gpsimd: "gpsimd", engine.vector: "vector"}


_SYNC, _SCALAR, _UNKNOWN = engine.sync, engine.scalar, engine.unknown


def _dge(mode: object, trigger: object, api: str, where: tuple) -> None:
    """dge_mode=hwdge needs NeuronCore-v3 (Target.hwdge); engine= picks the HWDGE trigger: "nki.isa.engine.sync or
    nki.isa.engine.scalar. Only valid when dge_mode=nisa.dge_mode.hwdge" (ISA6 v2.32.0, dma_copy)."""
    tgt = runtime.current().target
    if mode == dge_mode.hwdge and not tgt.hwdge:
        raise rules.NkiValueError(f"{api} with dge_mode=hwdge needs NeuronCore-v3 or newer; {tgt.name} is "
                                  f"{tgt.core}", "dma_hwdge_target", where, hint="leave dge_mode= out")
    if trigger in (None, _UNKNOWN):
        return
    if mode != dge_mode.hwdge or trigger not in (_SYNC, _SCALAR):
        raise rules.NkiValueError(f"{api} engine= names the hardware DGE's trigger (engine.sync or engine.scalar) "
                                  f"and is only valid with dge_mode=hwdge; got engine={trigger!r}, dge_mode={mode!r}",
                                  "dma_engine", where, hint="leave engine= out, or pass dge_mode=nisa.dge_mode.hwdge")


def get_nc_version() -> nc_version:
    return isa.get_nc_version()


def _engine(requested: object) -> object:
    """0.6 engine enum -> the 0.1 one the core reads (None: let the instruction choose)."""
    name = _ENGINES.get(requested) if requested is not None else None
    return isa.engine[name] if name else None


# ---- storing a result into dst ----
def _tile(t: object, api: str, role: str, where: tuple) -> Tensor:
    if not isinstance(t, Tensor):
        raise rules.NkiTypeError(f"operand '{role}' of '{api}' must be a tensor, got {type(t).__name__}",
                                 "operand_type", where, hint=f"NKI 0.6 instructions write their destination: "
                                                             f"nisa.{api}(dst=tile, ...)")
    return t


def _into(dst: Tensor, value: Tensor, api: str) -> None:
    """Store an instruction's fresh result into dst (same partitions, same elements per partition)."""
    where = runtime.callsite()
    _tile(dst, api, "dst", where)
    if dst.shape[0] != value.shape[0] or dst.free_size != value.free_size:
        raise rules.NkiSyntaxError(
            f"'{api}' computes a tile of shape {tuple(value.shape)}, but dst has shape {tuple(dst.shape)}",
            "dst_shape_mismatch", where, f"dst {dst.describe()}",
            hint="dst needs the same partitions and the same number of elements per partition as the result")
    core.assign(dst, value)  # (core.write clears dst's 'last written by a matmul' flags)


def _flags(t: Tensor, create: bool = True) -> np.ndarray | None:
    """The view of t in its PSUM buffer's 'last written by a matmul' flags (None: not PSUM, or never flagged)."""
    return core.matmul_flags(runtime.current(), t, create)


def _written(t: Tensor) -> np.ndarray:
    return np.ones(t.shape, dtype=bool) if t.buf.all_written else t.written_view()


def _no_legacy(kwargs: dict, api: str) -> None:
    if kwargs:
        names = ", ".join(f"{k}=" for k in kwargs)
        hint = ("NKI 0.6 instructions take no dtype= or mask=: the output dtype is dst.dtype, and a partial tile is "
                "a slice of dst" if set(kwargs) & {"dtype", "mask"} else f"see the NKI 0.6 signature of nisa.{api}")
        raise rules.NkiTypeError(f"nisa.{api} got unexpected argument(s) {names}", "unexpected_argument",
                                 runtime.callsite(), hint=hint)


# ---- data movement ----
def dma_copy(dst: Tensor, src: Tensor, priority: object = None, oob_mode: object = isa.oob_mode.error,
             dge_mode: object = dge_mode.unknown, engine: object = engine.unknown, name: object = None,
             **kwargs: object) -> None:
    _no_legacy(kwargs, "dma_copy")
    where = runtime.callsite()
    _dge(dge_mode, engine, "dma_copy", where)
    if isinstance(src, Tensor) and src.buf.memory == "psum":
        raise rules.MemoryRuleError("nisa.dma_copy no longer supports reading directly from PSUM",
                                    "dma_psum_access", where, f"src {src.describe()}",
                                    hint="copy PSUM to SBUF with nisa.tensor_copy, then DMA from SBUF")
    if dge_mode == _HWDGE and isinstance(src, Tensor) and isinstance(dst, Tensor) and src.dtype != dst.dtype:
        raise rules.NkiTypeError(f"dma_copy with dge_mode=hwdge copies without casting: src is {src.dtype.name}, "
                                 f"dst is {dst.dtype.name}", "dma_hwdge_dtype", where,
                                 hint="use the same dtype, or the default dge_mode")
    named = {_SYNC: "sync", _SCALAR: "scalar"}
    trigger = named.get(engine) if dge_mode == _HWDGE else None  # type: ignore[call-overload]
    isa.triggered_dma_copy(dst, src, oob_mode=oob_mode, trigger=trigger)


_HWDGE = dge_mode.hwdge


def dma_transpose(dst: Tensor, src: Tensor, axes: object = None, priority: object = None,
                  dge_mode: object = dge_mode.unknown, oob_mode: object = isa.oob_mode.error, name: object = None,
                  **kwargs: object) -> None:
    _no_legacy(kwargs, "dma_transpose")
    where = runtime.callsite()
    _tile(dst, "dma_transpose", "dst", where)
    _tile(src, "dma_transpose", "src", where)
    if dst.buf.memory != "sbuf":
        raise rules.MemoryRuleError("the destination of dma_transpose must be a tile in SBUF", "dma_transpose_dst",
                                    where, f"dst {dst.describe()}")
    if src.dtype != dst.dtype:
        raise rules.NkiTypeError(f"dma_transpose needs src.dtype == dst.dtype, got {src.dtype.name} and "
                                 f"{dst.dtype.name}", "dma_transpose_dtype", where)
    _dge(dge_mode, None, "dma_transpose", where)
    if dge_mode == _HWDGE:
        _hwdge_transpose(src, where)
    value = isa.dma_transpose(src, axes=axes)
    if tuple(dst.shape) != tuple(value.shape):
        raise rules.NkiSyntaxError(
            f"dma_transpose: dst.shape must match the transposed src.shape exactly, including rank: expected "
            f"{tuple(value.shape)}, got {tuple(dst.shape)}", "dma_transpose_shape", where,
            f"src {src.describe()} view {tuple(src.shape)}; dst {dst.describe()} view {tuple(dst.shape)}")
    core.assign(dst, value)


def _hwdge_transpose(src: Tensor, where: tuple) -> None:
    ok_first = src.shape[0] == 16 if src.ndim == 2 else (src.shape[0] in (1, 2, 4, 8, 16) and
                                                           (src.shape[0] * src.shape[-2]) % 16 == 0)
    if src.itemsize != 2 or src.shape[-1] > 128 or not ok_first:
        raise rules.NkiSyntaxError(
            "dma_transpose with dge_mode=hwdge needs a 2-byte src.dtype, src.shape[-1] <= 128 and src.shape[0] == 16 "
            "(2-D) or in {1, 2, 4, 8, 16} with (src.shape[0] * src.shape[-2]) % 16 == 0 (3-D/4-D)",
            "dma_transpose_hwdge", where, f"src {src.describe()} view {tuple(src.shape)}")


# ---- TensorE ----
def nc_matmul(dst: Tensor, stationary: Tensor, moving: Tensor, is_stationary_onezero: bool = False,
              is_moving_onezero: bool = False, is_transpose: bool = False, accumulate: object = None,
              tile_position: tuple = (), tile_size: tuple = (), perf_mode: object = matmul_perf_mode.none,
              name: object = None, **kwargs: object) -> None:
    _no_legacy(kwargs, "nc_matmul")
    where = runtime.callsite()
    _tile(dst, "nc_matmul", "dst", where)
    # ARCH3 transpose mode: "FP16/BF16 PSUM output for FP16/BF16 transpose" (as nc_transpose's dst keeps the dtype)
    half = is_transpose and runtime.current().target.transpose_mode and dst.dtype == stationary.dtype and \
        dst.itemsize == 2
    if dst.buf.memory != "psum" or (dst.dtype != F32 and not half):
        raise rules.MemoryRuleError("The dst tile of nc_matmul must be a float32 tile in PSUM on NeuronCore-v2 and "
                                    "NeuronCore-v3", "matmul_dst", where, f"dst {dst.describe()}",
                                    hint="allocate it with nl.ndarray(shape, nl.float32, buffer=nl.psum)" +
                                    (" (or, with is_transpose=True, of the 16-bit input's dtype)"
                                     if is_transpose and stationary.itemsize == 2 else ""))
    add = _accumulate_flag(dst, accumulate, where)
    if add and half:
        raise rules.NkiValueError("nc_matmul(is_transpose=True) into a 16-bit PSUM tile cannot accumulate: PSUM "
                                  "accumulates in float32 only", "matmul_accumulate_16bit", where,
                                  f"dst {dst.describe()}", hint="pass accumulate=False (a transpose overwrites)")
    value = isa.nc_matmul(stationary, moving, is_stationary_onezero=is_stationary_onezero,
                          is_moving_onezero=is_moving_onezero, is_transpose=is_transpose,
                          tile_position=tile_position, tile_size=tile_size)
    if dst.shape[0] != value.shape[0] or dst.free_size != value.free_size:
        raise rules.NkiSyntaxError(
            f"nc_matmul computes a ({value.shape[0]}, {value.free_size}) result (stationary free size, moving free "
            f"size), but dst has shape {tuple(dst.shape)}", "dst_shape_mismatch", where, f"dst {dst.describe()}",
            hint="the free dimension of stationary matches dst's partitions, moving's free size dst's free size")
    if add:
        core.accumulate(dst, value)
    else:
        core.assign(dst, value)
    flags = _flags(dst)
    if flags is not None:
        flags[...] = True


def _accumulate_flag(dst: Tensor, accumulate: object, where: tuple) -> bool:
    """Whether this matmul adds onto dst; raises where the hardware result would be undefined."""
    written = _written(dst)
    flags = _flags(dst, create=False)
    by_matmul = flags if flags is not None else np.zeros(dst.shape, bool)
    if accumulate is None:
        if written.all():
            add = True
        elif not written.any():
            add = False
        else:
            raise rules.NkiValueError(
                "nc_matmul accumulate=None cannot infer the flag: part of dst was written before, part was not",
                "matmul_accumulate_ambiguous", where, f"dst {dst.describe()}",
                hint="pass accumulate=False for the first matmul into a PSUM region and accumulate=True after it")
    else:
        add = bool(accumulate)
    if not add:
        return False
    if not written.all():
        index = [int(i) for i in np.argwhere(~written)[0]]
        raise rules.UninitializedReadError(
            f"nc_matmul with accumulate=True on an uninitialized PSUM location is undefined behavior (element "
            f"{index} of dst was never written)", "matmul_accumulate_uninitialized", where, f"dst {dst.describe()}",
            hint="the first matmul into a PSUM location must overwrite: accumulate=False (or accumulate=(k > 0) "
                 "in the contraction loop)")
    if not by_matmul.all():
        raise rules.NkiValueError(
            "matmul accumulating into a PSUM location that was value-initialized by a non-matmul instruction (e.g., "
            "memset, tensor_copy) is not supported and is undefined behavior on hardware (NeuronCore-v2 and "
            "NeuronCore-v3)", "matmul_accumulate_non_matmul_init", where, f"dst {dst.describe()}",
            hint="allocate the accumulator with nl.ndarray(..., buffer=nl.psum), not nl.zeros, and start the "
                 "chain with accumulate=False")
    return True


def nc_transpose(dst: Tensor, data: Tensor, engine: object = engine.unknown, name: object = None,
                 **kwargs: object) -> None:
    _no_legacy(kwargs, "nc_transpose")
    where = runtime.callsite()
    _tile(dst, "nc_transpose", "dst", where)
    _tile(data, "nc_transpose", "data", where)
    if dst.dtype != data.dtype:
        raise rules.NkiTypeError(f"The output dst tile must have the same data type as that of data: data is "
                                 f"{data.dtype.name}, dst is {dst.dtype.name}", "transpose_dtype", where,
                                 f"dst {dst.describe()}; data {data.describe()}",
                                 hint="transpose into a tile of the input's dtype, then nisa.tensor_copy to cast")
    eng = _engine(engine)
    if eng is None and dst.buf.memory == "sbuf":
        eng = isa.engine.vector  # TensorE writes only PSUM; VectorE transposes into SBUF
    value = isa.nc_transpose(data, engine=eng)
    _into(dst, value, "nc_transpose")


# ---- VectorE / ScalarE / GpSimdE ----
def tensor_copy(dst: Tensor, src: Tensor, engine: object = engine.unknown, name: object = None,
                **kwargs: object) -> None:
    _no_legacy(kwargs, "tensor_copy")
    _tile(dst, "tensor_copy", "dst", runtime.callsite())
    _into(dst, isa.tensor_copy(src, dtype=dst.dtype, engine=_engine(engine)), "tensor_copy")


def memset(dst: Tensor, value: object, engine: object = engine.unknown, name: object = None,
           **kwargs: object) -> None:
    _no_legacy(kwargs, "memset")
    _tile(dst, "memset", "dst", runtime.callsite())
    _into(dst, isa.memset(dst.shape, value, dst.dtype, engine=_engine(engine)), "memset")


def tensor_tensor(dst: Tensor, data1: Tensor, data2: Tensor, op: object, engine: object = engine.unknown,
                  name: object = None, **kwargs: object) -> None:
    _no_legacy(kwargs, "tensor_tensor")
    _tile(dst, "tensor_tensor", "dst", runtime.callsite())
    _into(dst, isa.tensor_tensor(data1, data2, op, dtype=dst.dtype, engine=_engine(engine)), "tensor_tensor")


def tensor_scalar(dst: Tensor, data: Tensor, op0: object, operand0: object, reverse0: bool = False,
                  op1: object = None, operand1: object = None, reverse1: bool = False,
                  engine: object = engine.unknown, name: object = None, **kwargs: object) -> None:
    _no_legacy(kwargs, "tensor_scalar")
    where = runtime.callsite()
    _tile(dst, "tensor_scalar", "dst", where)
    for role, operand, op in (("operand0", operand0, op0), ("operand1", operand1, op1)):
        fn = alu.lookup(op) if op is not None else None
        arithmetic = fn is None or fn.kind != "bitvec"
        if isinstance(operand, Tensor) and arithmetic and operand.dtype != F32:
            raise rules.NkiTypeError(f"tensor_scalar {role} must be float32, got {operand.dtype.name}",
                                     "tensor_scalar_operand_dtype", where, f"{role} {operand.describe()}",
                                     hint="copy the column to a float32 tile first")
    value = isa.tensor_scalar(data, op0, operand0, reverse0, op1, operand1, reverse1, dtype=dst.dtype,
                              engine=_engine(engine))
    _into(dst, value, "tensor_scalar")


def tensor_reduce(dst: Tensor, op: object, data: Tensor, axis: object, negate: bool = False, keepdims: bool = False,
                  name: object = None, **kwargs: object) -> None:
    _no_legacy(kwargs, "tensor_reduce")
    _tile(dst, "tensor_reduce", "dst", runtime.callsite())
    value = isa.tensor_reduce(op, data, axis, dtype=dst.dtype, negate=negate, keepdims=keepdims)
    _into(dst, value, "tensor_reduce")


def activation(dst: Tensor, op: object, data: Tensor, bias: object = None, scale: object = 1.0,
               reduce_op: object = None, reduce_res: object = None, reduce_cmd: object = reduce_cmd.idle,
               name: object = None, **kwargs: object) -> None:
    _no_legacy(kwargs, "activation")
    _tile(dst, "activation", "dst", runtime.callsite())
    value = isa.activation(op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                           reduce_cmd=int(reduce_cmd), dtype=dst.dtype)
    _into(dst, value, "activation")


# ---- pattern instructions (GpSimdE) ----
def _pattern_values(dst: Tensor, pattern: object, offset: int, channel_multiplier: int, api: str,
                    where: tuple) -> np.ndarray:
    """offset + partition * channel_multiplier + sum(index_d * step_d) over the pattern [[step, num], ...]."""
    try:
        dims = [(int(step), int(num)) for step, num in pattern]
    except (TypeError, ValueError):
        raise rules.NkiTypeError(f"{api} pattern must be a list of [step, num] pairs, got {pattern!r}",
                                 f"{api}_pattern", where) from None
    count = int(np.prod([n for _, n in dims])) if dims else 1
    if len(dims) > 4 or count != dst.free_size:
        raise rules.NkiSyntaxError(
            f"{api}: the pattern {pattern!r} has {count} elements per partition, dst has {dst.free_size} (the total "
            "number of elements in pattern must match the number of elements per partition in dst, up to 4-D)",
            f"{api}_pattern", where, f"dst {dst.describe()}")
    value = np.full((1,), int(offset), dtype=np.int64)
    for step, num in dims:
        value = (value[:, None] + step * np.arange(num, dtype=np.int64)[None, :]).ravel()
    rows = np.arange(dst.shape[0], dtype=np.int64)[:, None] * int(channel_multiplier)
    return (rows + value[None, :]).reshape(dst.shape)


def iota(dst: Tensor, pattern: object, offset: int = 0, channel_multiplier: int = 0, name: object = None,
         **kwargs: object) -> None:
    _no_legacy(kwargs, "iota")
    run, where = core.begin()
    _tile(dst, "iota", "dst", where)
    if dst.buf.memory != "sbuf":
        raise rules.MemoryRuleError("The output dst tile of iota must be in SBUF", "iota_dst", where,
                                    f"dst {dst.describe()}")
    checks.tile(dst, "iota", "dst", where)
    values = _pattern_values(dst, pattern, offset, channel_multiplier, "iota", where)  # index arithmetic: always
    core.write(run, dst, core.compute(run, lambda: values.astype(np.int32).astype(F32)
                                      if dtypes.is_float(dst.dtype) else values.astype(np.int32)), where)
    core.emit(run, "gpsimd", "iota", dst, (), where)


def affine_select(dst: Tensor, pattern: object, channel_multiplier: int, on_true_tile: Tensor,
                  on_false_value: object, cmp_op: object = None, offset: int = 0, name: object = None,
                  **kwargs: object) -> None:
    _no_legacy(kwargs, "affine_select")
    run, where = core.begin()
    _tile(dst, "affine_select", "dst", where)
    for role, t in (("dst", dst), ("on_true_tile", on_true_tile)):
        if _tile(t, "affine_select", role, where).buf.memory != "sbuf":
            raise rules.MemoryRuleError(f"affine_select {role} must be in SBUF", "affine_select_memory", where,
                                        f"{role} {t.describe()}")
    checks.same_partitions(dst, on_true_tile, "affine_select", ("dst", "on_true_tile"), where)
    if dst.free_size != on_true_tile.free_size:
        raise rules.NkiSyntaxError("affine_select: dst and on_true_tile differ in elements per partition",
                                   "affine_select_shape", where, f"dst {dst.describe()}; on_true_tile "
                                                                 f"{on_true_tile.describe()}")
    fn = alu.lookup(cmp_op if cmp_op is not None else alu.OPS["equal"])
    if fn is None or fn.binary is None:
        raise rules.NkiTypeError(f"affine_select cmp_op must be a comparison operator, got {cmp_op!r}",
                                 "unsupported_op", where)
    affine = _pattern_values(dst, pattern, offset, channel_multiplier, "affine_select", where)
    cond = np.asarray(fn.binary(affine.astype(F32), np.float32(0))) != 0
    core.read(run, on_true_tile, where)
    value = core.compute(run, lambda: np.where(cond, core.f32(on_true_tile).reshape(dst.shape),
                                               np.float32(on_false_value)).astype(F32))
    core.write(run, dst, value, where)
    core.emit(run, "gpsimd", "affine_select", dst, (on_true_tile,), where)


# ---- the less common instructions of the 0.1 surface, in the 0.6 form ----
def tensor_copy_predicated(dst: Tensor, src: object, predicate: Tensor, reverse_pred: bool = False,
                           name: object = None, **kwargs: object) -> None:
    _no_legacy(kwargs, "tensor_copy_predicated")
    isa.tensor_copy_predicated(src=src, dst=dst, predicate=predicate, reverse_pred=reverse_pred)


def scalar_tensor_tensor(dst: Tensor, data: Tensor, op0: object, operand0: object, op1: object, operand1: Tensor,
                         reverse0: bool = False, reverse1: bool = False, name: object = None,
                         **kwargs: object) -> None:
    _no_legacy(kwargs, "scalar_tensor_tensor")
    _tile(dst, "scalar_tensor_tensor", "dst", runtime.callsite())
    value = isa.scalar_tensor_tensor(data=data, op0=op0, operand0=operand0, op1=op1, operand1=operand1,
                                     reverse0=reverse0, reverse1=reverse1, dtype=dst.dtype)
    _into(dst, value, "scalar_tensor_tensor")


def tensor_tensor_scan(dst: Tensor, data0: Tensor, data1: Tensor, initial: object, op0: object, op1: object,
                       reverse0: bool = False, reverse1: bool = False, name: object = None, **kwargs: object) -> None:
    _no_legacy(kwargs, "tensor_tensor_scan")
    _tile(dst, "tensor_tensor_scan", "dst", runtime.callsite())
    value = isa.tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0, reverse1, dtype=dst.dtype)
    _into(dst, value, "tensor_tensor_scan")


def bn_stats(dst: Tensor, data: Tensor, name: object = None, **kwargs: object) -> None:
    _no_legacy(kwargs, "bn_stats")
    _tile(dst, "bn_stats", "dst", runtime.callsite())
    _into(dst, isa.bn_stats(data, dtype=dst.dtype), "bn_stats")


def bn_aggr(dst: Tensor, data: Tensor, name: object = None, **kwargs: object) -> None:
    _no_legacy(kwargs, "bn_aggr")
    _tile(dst, "bn_aggr", "dst", runtime.callsite())
    _into(dst, isa.bn_aggr(data, dtype=dst.dtype), "bn_aggr")


def tensor_partition_reduce(dst: Tensor, op: object, data: Tensor, name: object = None, **kwargs: object) -> None:
    _no_legacy(kwargs, "tensor_partition_reduce")
    _tile(dst, "tensor_partition_reduce", "dst", runtime.callsite())
    _into(dst, isa.tensor_partition_reduce(op, data, dtype=dst.dtype), "tensor_partition_reduce")


def select_reduce(dst: Tensor, predicate: Tensor, on_true: Tensor, on_false: object, reduce_res: object = None,
                  reduce_cmd: object = reduce_cmd.idle, reduce_op: object = None, reverse_pred: bool = False,
                  name: object = None, **kwargs: object) -> None:
    _no_legacy(kwargs, "select_reduce")
    isa.select_reduce(dst=dst, predicate=predicate, on_true=on_true, on_false=on_false, reduce_res=reduce_res,
                      reduce_cmd=int(reduce_cmd), reduce_op=np.amax if reduce_op is None else reduce_op,
                      reverse_pred=reverse_pred)
