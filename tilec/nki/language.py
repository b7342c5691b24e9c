"""`neuronxcc.nki.language`: tensor creation, buffers, loops, tile sizes, dtypes, element-wise and reduction ops,
load/store/copy/transpose/matmul, index helpers and device_print (NKI 0.1 semantics, spec §1.4-1.9).

Language-level compute calls lower to the ISA instruction the NKI compiler would pick (nl.add on two tiles ->
tensor_tensor on VectorE, nl.exp -> activation on ScalarE, nl.load -> dma_copy, ...) and are recorded as such.
"""
from __future__ import annotations

import builtins

import numpy as np

from tilec import target as hardware
from tilec.nki import alu, checks, core, dtypes, isa, rules, runtime
from tilec.nki.dtypes import (bfloat16, bool_, float8_e4m3, float8_e5m2, float16, float32, float32r,  # noqa: F401
                              int8, int16, int32, tfloat32, uint8, uint16, uint32)
from tilec.nki.indexing import arange, ds, mgrid  # noqa: F401
from tilec.nki.indirect import Indirect
from tilec.nki.runtime import affine_range, sequential_range, static_range  # noqa: F401
from tilec.nki.tensor import Tensor

F32 = np.dtype(np.float32)


# ---- buffers ----
class Buffer:
    def __init__(self, name: str, memory: str, direct: bool = False) -> None:
        self.name, self.memory = name, memory
        self.direct = direct  # a direct allocation (nki.compiler.sbuf/psum.alloc, mod_alloc)

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def auto_alloc(self) -> "Buffer":
        return self


sbuf, psum = Buffer("sbuf", "sbuf"), Buffer("psum", "psum")
hbm, shared_hbm, private_hbm = Buffer("hbm", "hbm"), Buffer("shared_hbm", "hbm"), Buffer("private_hbm", "hbm")


class par_dim(int):
    """Marks the partition dimension of a shape; it must be the first one (NKI 2.25+)."""


def running_target() -> hardware.Target:
    """The target of the kernel running now (`simulate(..., target="trn1")`, `--target`), else the default."""
    run = runtime.active()
    return run.target if run is not None else hardware.target()


class TileSizeFacts(type):
    """nl.tile_size's constants are the running kernel's target's figures (tilec/target.py), read when asked: a kernel
    run for trn1 sees trn1's SBUF. Outside a run (a module-level constant) they are the default target's."""

    pmax = property(lambda cls: running_target().pmax)
    psum_fmax = property(lambda cls: running_target().psum_fmax)
    gemm_stationary_fmax = property(lambda cls: running_target().stationary_fmax)
    gemm_moving_fmax = property(lambda cls: running_target().moving_fmax)
    bn_stats_fmax = property(lambda cls: running_target().instr("bn_stats").limit("f"))
    # bytes per partition (the name is misleading)
    total_available_sbuf_size = property(lambda cls: running_target().sbuf_usable)


class tile_size(metaclass=TileSizeFacts):
    """Hardware tile-size constants of the running kernel's target (see TileSizeFacts)."""


class _Min:
    def __init__(self, bits: str, value: float) -> None:
        self.bits, self.min = bits, value


fp32 = _Min("0xff7fffff", float(np.finfo(np.float32).min))
bfp16 = _Min("0xff80", float("-inf"))


# ---- creation ----
def _memory(buffer: object) -> tuple[str, str]:
    if buffer is None:
        return "sbuf", "sbuf"
    if isinstance(buffer, Buffer):
        return buffer.memory, buffer.name
    raise rules.NkiTypeError(f"unknown buffer {buffer!r}", "buffer", runtime.callsite(),
                             hint="use nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm or nl.private_hbm")


def _shape(shape: object, where: tuple, name: str) -> tuple[tuple[int, ...], int]:
    """The shape as ints and the position of the partition dimension (its `nl.par_dim`, else 0)."""
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    pdim = next((i for i, d in enumerate(shape) if isinstance(d, par_dim)), 0)
    return tuple(int(d) for d in shape), pdim


def _block_dims(run: object, shape: tuple, pdim: int, where: tuple, name: str) -> None:
    """Block dimensions before the par_dim: deprecated in SDK 2.23, an error of neuronxcc from 2.25 [spec §1.4:
    BLOCK, RN, ERR]; SDK 2.21 (the course's Trn2 toolchain) ran them, and AWS's v2.26.1 doc tests and nki-samples
    kernels of that time still use them in simulation. Each block is a separate (P, free...) tile."""
    rules.later_release(
        run, "block dimensions before the partition dimension", "err_leading_dimension_of_tensor_must_be_partition",
        where, "Neuron SDK 2.25 and later reject them (leading dimension of a tensor must be the partition "
        "dimension)", f"tensor '{name}' of shape {shape} has par_dim at position {pdim}",
        hint="fold block dimensions into free dimensions, e.g. (128, 4, 512), or allocate inside the loop",
        error=rules.NkiSyntaxError)


def _create(shape: object, dtype: object, buffer: object, name: str, fill: object, api: str) -> Tensor:
    run, where = core.begin()
    memory, kind = _memory(buffer)
    name = name or core.target_name(where, api)
    shape, pdim = _shape(shape, where, name)
    if pdim and memory != "hbm":
        _block_dims(run, shape, pdim, where, name)
    elif pdim:
        pdim = 0  # par_dim means nothing in HBM
    if memory != "hbm" and len(shape) < 2:
        raise rules.NkiSyntaxError(f"Insufficient rank: {memory} tile '{name}' of shape {shape} needs at least 2 "
                                   "dimensions", "insufficient_rank", where, hint=f"use shape ({shape[0]}, 1)"
                                   if shape else "")
    if kind == "shared_hbm" and run.frames:
        raise rules.NkiSyntaxError(f"shared_hbm tensor '{name}' must be created at the top level of the kernel",
                                   "err_shared_hbm_must_in_kernel_level", where,
                                   hint="create kernel outputs before any loop")
    if memory == "hbm" and fill is not None:
        raise rules.NkiSyntaxError(f"HBM tensor '{name}' cannot be created with an initial value",
                                   "err_hbm_tensor_with_init_value_not_supported", where,
                                   hint="create it with nl.ndarray and store values with nisa.dma_copy")
    if kind == "shared_hbm" and run.grid:
        run.shared_next += 1
        if run.shared_next <= len(run.shared):
            return run.shared[run.shared_next - 1]
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.float32  # the README tip omits dtype
    t = core.allocate(run, shape, dt, memory, name, where, fill=fill, pdim=pdim)
    t.buf.direct = bool(getattr(buffer, "direct", False))
    if kind == "shared_hbm" and run.grid:
        run.shared.append(t)
    if fill is not None:  # the engine is the compiler's choice (VectorE or GpSimdE) [ISA1 memset]
        core.emit(run, "vector", "memset", t, (), where,
                  attrs=(("value", float(fill)), ("engine_choice", True)))
    return t


def ndarray(shape: object, dtype: object = None, *, buffer: object = None, name: str = "", **kwargs: object) -> Tensor:
    return _create(shape, dtype, buffer, name, None, "ndarray")


def zeros(shape: object, dtype: object = None, *, buffer: object = None, name: str = "", **kwargs: object) -> Tensor:
    return _create(shape, dtype, buffer, name, 0, "zeros")


def ones(shape: object, dtype: object = None, *, buffer: object = None, name: str = "", **kwargs: object) -> Tensor:
    return _create(shape, dtype, buffer, name, 1, "ones")


def full(shape: object, fill_value: object, dtype: object, *, buffer: object = None, name: str = "",
         **kwargs: object) -> Tensor:
    return _create(shape, dtype, buffer, name, fill_value, "full")


def zeros_like(a: Tensor, dtype: object = None, *, buffer: object = None, name: str = "", **kw) -> Tensor:
    return _create(a.shape, dtype or a.dtype, buffer, name, 0, "zeros_like")


def ones_like(a: Tensor, dtype: object = None, *, buffer: object = None, name: str = "", **kw) -> Tensor:
    return _create(a.shape, dtype or a.dtype, buffer, name, 1, "ones_like")


def empty_like(a: Tensor, dtype: object = None, *, buffer: object = None, name: str = "", **kw) -> Tensor:
    return _create(a.shape, dtype or a.dtype, buffer, name, None, "empty_like")


# ---- data movement ----
def load(src: Tensor, *, mask: object = None, dtype: object = None, **kwargs: object) -> Tensor:
    run, where = core.begin()
    if isinstance(src, Indirect):  # gather rows chosen by an index tile
        out = core.allocate(run, src.shape, dtypes.as_dtype(dtype) if dtype is not None else src.dtype, "sbuf",
                            core.target_name(where, "load"), where)
        isa.dma_copy(dst=out, src=src, mask=mask)
        return out
    if not isinstance(src, Tensor) or src.buf.memory != "hbm":
        mem = src.buf.memory if isinstance(src, Tensor) else type(src).__name__
        raise rules.MemoryRuleError(f"Expected operand 'src' of 'load' to be in address space 'hbm', but got a "
                                    f"tile in '{mem}' instead", "err_unsupported_memory", where,
                                    hint="nl.load reads HBM; use nisa.tensor_copy for on-chip copies")
    out_dtype = dtypes.as_dtype(dtype) if dtype is not None else src.dtype
    name = core.target_name(where, "load")
    shape = tuple(src.shape) if src.ndim >= 2 else (tuple(src.shape) + (1,))
    m = isa.mask_array(mask, src.shape)
    core.read(run, src, where, mask=m)
    value = core.compute(run, lambda: _loaded(src, m, shape, out_dtype))
    out = core.result(run, value, shape, out_dtype, "sbuf", where, name, mask=None if m is None else m.reshape(shape))
    isa._emit_dma(run, "dma_copy", src, out, where)
    return out


def _loaded(src: Tensor, mask: np.ndarray | None, shape: tuple, out_dtype: np.dtype) -> np.ndarray:
    value = core.values(src, mask).reshape(shape)
    return value if out_dtype == src.dtype else value.astype(F32)


def load_transpose2d(src: Tensor, *, mask: object = None, dtype: object = None, **kwargs: object) -> Tensor:
    """HBM [a, b] -> SBUF tile [b, a]: a transposing DMA (spec §1.9; slower than nl.load, spec §2.5)."""
    if not isinstance(src, Tensor) or src.buf.memory != "hbm" or src.ndim != 2:
        what = f"a {src.ndim}-D tensor in '{src.buf.memory}'" if isinstance(src, Tensor) else type(src).__name__
        raise rules.MemoryRuleError(f"load_transpose2d reads a 2-D tensor in 'hbm', got {what}",
                                    "err_unsupported_memory", runtime.callsite(),
                                    hint="transpose on-chip tiles with nl.transpose / nisa.nc_transpose")
    return isa.dma_transpose(src, mask=mask, dtype=dtype)


def store(dst: Tensor, value: object, *, mask: object = None, **kwargs: object) -> None:
    run, where = core.begin()
    if isinstance(dst, Indirect):  # scatter rows to places chosen by an index tile
        isa.dma_copy(dst=dst, src=value, mask=mask)
        return
    if not isinstance(dst, Tensor) or dst.buf.memory != "hbm":
        mem = dst.buf.memory if isinstance(dst, Tensor) else type(dst).__name__
        raise rules.MemoryRuleError(f"Expected operand 'dst' of 'store' to be in address space 'hbm', but got a "
                                    f"tile in '{mem}' instead", "err_unsupported_memory", where)
    if isinstance(value, Tensor) and value.buf.memory == "psum":
        value = isa.tensor_copy(value)  # 2.25+: a PSUM value is first copied to SBUF
    if not isinstance(value, Tensor):
        value = isa.memset(dst.shape if dst.ndim >= 2 else tuple(dst.shape) + (1,), value, dst.dtype)
    isa.dma_copy(dst=dst, src=value.broadcast_to(dst.shape) if value.size < dst.size else value, mask=mask)


def copy(src: Tensor, *, mask: object = None, dtype: object = None, **kwargs: object) -> Tensor:
    run, where = core.begin()
    if isinstance(src, Tensor) and src.buf.memory == "hbm":
        checks.tile(src, "copy", "src", where)
    return isa.tensor_copy(src, dtype=dtype, mask=mask)


alu.alias(copy, "identity")


def transpose(x: Tensor, *, dtype: object = None, mask: object = None, **kwargs: object) -> Tensor:
    run, where = core.begin()
    if not isinstance(x, Tensor) or x.ndim != 2 or builtins.max(x.shape) > tile_size.pmax:
        shape = tuple(x.shape) if isinstance(x, Tensor) else ()
        raise rules.NkiSyntaxError(f"nl.transpose takes a 2-D tile with both dimensions <= 128, got shape {shape}",
                                   "err_exceed_max_supported_dimension", where)
    return isa.nc_transpose(x, dtype=dtype, mask=mask)


def matmul(x: Tensor, y: Tensor, *, transpose_x: bool = False, mask: object = None, **kwargs: object) -> Tensor:
    stationary = x if transpose_x else isa.tensor_copy(isa.nc_transpose(x))
    return isa.nc_matmul(stationary, y, mask=mask)


def broadcast_to(x: Tensor, shape: tuple) -> Tensor:
    return x.broadcast_to(shape)


def expand_dims(x: Tensor, axis: int) -> Tensor:
    return x.expand_dims(axis)


def device_print(prefix: str, x: object, *, mask: object = None, **kwargs: object) -> None:
    run, where = core.begin()
    if not isinstance(x, Tensor):
        print(prefix, np.array(x), flush=True)
        return
    core.read(run, x, where)
    shown = core.compute(run, lambda: np.array(x.arr))
    print(prefix, "(values not computed: trace-only run)" if shown is None else shown, flush=True)


# ---- SPMD ----
def program_id(axis: int = 0) -> int:
    run = runtime.current()
    return run.program_ids[axis] if axis < len(run.program_ids) else 0


def num_programs(axis: int = 0) -> int:
    run = runtime.current()
    return run.grid[axis] if axis < len(run.grid) else 1


def program_ndim() -> int:
    return len(runtime.current().grid)


def nc(n: int) -> int:
    return n


def spmd_dim(*dims: int) -> int:
    """`nl.spmd_dim(nl.nc(2), 2)`: a grid dimension split over NeuronCores; instances run one after another here,
    so only the total count matters."""
    total = 1
    for d in dims:
        total *= int(d)
    return total


# ---- element-wise, unary and reduction ops (each an alu.Op; calling it lands here) ----
def call_op(op: alu.Op, *args: object, **kwargs: object) -> object:
    if op.role == "binary":
        return _binary(op, *args, **kwargs)
    if op.role == "unary":
        return _unary(op, *args, **kwargs)
    return _reduce(op, *args, **kwargs)


def _binary(op: alu.Op, x: object, y: object, *, dtype: object = None, mask: object = None, **kw) -> object:
    if not isinstance(x, Tensor) and not isinstance(y, Tensor):
        return op.binary(np.float32(x), np.float32(y))
    if not isinstance(x, Tensor):
        return _with_scalar(op, y, x, True, dtype, mask)
    if not isinstance(y, Tensor):
        return _with_scalar(op, x, y, False, dtype, mask)
    if x.shape == y.shape:
        return isa.tensor_tensor(x, y, op, dtype=dtype or dtypes.promote(x.dtype, y.dtype), mask=mask)
    return _broadcast_binary(op, x, y, dtype, mask)


def _with_scalar(op: alu.Op, t: Tensor, scalar: object, reverse: bool, dtype: object, mask: object) -> Tensor:
    out_dtype = dtype or dtypes.promote(t.dtype, dtypes.scalar_dtype(scalar))
    return isa.tensor_scalar(t, op, scalar, reverse0=reverse, dtype=out_dtype, mask=mask)


def _broadcast_binary(op: alu.Op, x: Tensor, y: Tensor, dtype: object, mask: object) -> Tensor:
    """Tiles of different shapes: numpy broadcasting (a partition broadcast costs a TensorE pass on hardware)."""
    where = runtime.callsite()
    if x.shape and y.shape and x.ndim != y.ndim and x.shape[0] == y.shape[0]:
        # tiles line up on their partition dimension: `t[:, 0]` of a (P, 1) tile is a column of P, which
        # broadcasts along the other operand's free dimensions (AWS's flash attention relies on it)
        x, y = (_pad_free(x, y.ndim), y) if x.ndim < y.ndim else (x, _pad_free(y, x.ndim))
    try:
        shape = np.broadcast_shapes(tuple(x.shape), tuple(y.shape))
    except ValueError:
        raise rules.NkiSyntaxError(f"nl.{op.name}: shapes {tuple(x.shape)} and {tuple(y.shape)} do not broadcast",
                                   "broadcast", where) from None
    xs, ys = x.broadcast_to(shape), y.broadcast_to(shape)
    return isa.tensor_tensor(xs, ys, op, dtype=dtype or dtypes.promote(x.dtype, y.dtype), mask=mask)


def _pad_free(t: Tensor, ndim: int) -> Tensor:
    pad = ndim - t.ndim
    return Tensor(t.buf, t.off, tuple(t.shape) + (1,) * pad, tuple(t.strides) + (0,) * pad)


def _unary(op: alu.Op, x: Tensor, *, dtype: object = None, mask: object = None, **kw) -> Tensor:
    if not isinstance(x, Tensor):
        return op.unary(np.float32(x))
    if op.kind == "bitvec":
        return isa.tensor_scalar(x, alu.OPS["bitwise_xor"], -1, dtype=dtype)
    return isa.activation(op, x, dtype=dtype, mask=mask)


def _reduce(op: alu.Op, x: Tensor, axis: object = None, *, dtype: object = None, mask: object = None,
            keepdims: bool = False, **kw) -> Tensor:
    if axis is None:
        axis = tuple(range(1, x.ndim))
    return isa.tensor_reduce(op, x, axis, dtype=dtype, keepdims=keepdims, mask=mask)


def where(condition: Tensor, x: object, y: object, *, dtype: object = None, mask: object = None) -> Tensor:
    run, at = core.begin()
    m = isa.mask_array(mask, condition.shape)
    ins = tuple(t for t in (condition, x, y) if isinstance(t, Tensor))
    masks = {id(t): m if t.shape == condition.shape else None for t in ins}
    for t in ins:
        core.read(run, t, at, mask=masks[id(t)])
    shape = np.broadcast_shapes(*(tuple(t.shape) for t in ins))  # np.where's broadcast, checked in both modes

    def operand(t: object) -> object:
        return core.f32(t, masks[id(t)]) if isinstance(t, Tensor) else F32.type(t)

    value = core.compute(run, lambda: np.where(operand(condition) != 0, operand(x), operand(y)).astype(F32))
    out = core.result(run, value, shape, dtypes.as_dtype(dtype) if dtype else ins[-1].dtype, "sbuf", at, "where",
                      mask=m)
    core.emit(run, "vector", "tensor_tensor", out, ins, at, attrs=(("alu", "select"),))
    return out


# nl.max, nl.sum, nl.abs, ... shadow the builtins in this module from here on: use builtins.max etc. above
for _name, _op in alu.OPS.items():
    if _name not in globals():
        globals()[_name] = _op


# The 0.1 APIs AWS's suites use beyond the core set (issue 15); imported last: they build on isa and core.
from tilec.nki.language_more import (atomic_rmw, dropout, finfo, gather_flattened, loop_reduce, rand,  # noqa: E402,F401
                                     random_seed, shared_constant, shared_identity_matrix, static_cast)
