"""`nki.language` of NKI 0.6 (Neuron SDK 2.32) on the interpreter core shared with 0.1 (language.py).

Same tensors, buffers, dtypes, operators and value-returning language calls (nl.add, nl.load, nl.matmul, ...) as
0.1, with the 0.6 differences [NL6 = aws-neuron-sdk v2.32.0 nki/api/nki/language/__init__.py, MIG]:

  * `ndarray(shape, dtype, buffer=sbuf, name='', address=None)`: buffers are the nl.* objects (string buffer names
    are rejected since 0.3); a tensor allocated in nl.shared_hbm may be returned (top06: outputs must be);
  * affine_range / sequential_range / static_range are aliases of Python's range (deprecated since 0.3): loops run
    in order, unrolled, with Python semantics;
  * no mask= (masks, nl.arange and nl.mgrid were removed in 0.2: slices of tiles replace them);
  * tile_size gains psum_bank_fmax, psum_num_banks, sbuf_fmax, sbuf_size_bytes;
  * fori_loop / while_loop / dynamic_range (register-driven loops) are not interpreted: a clear error says so.
"""
from __future__ import annotations

import builtins

import numpy as np

from tilec.nki import alu, checks, core, dtypes, language as _l01, rules, runtime
from tilec.nki.dtypes import (bfloat16, bool_, float8_e4m3, float8_e5m2, float16, float32,  # noqa: F401
                              int8, int16, int32, tfloat32, uint8, uint16, uint32)
from tilec.nki.indexing import ds  # noqa: F401
from tilec.nki.language import (Buffer, broadcast_to, device_print, expand_dims, hbm, num_programs,  # noqa: F401
                                private_hbm, program_id, program_ndim, psum, sbuf, shared_hbm)
from tilec.nki.indirect import Indirect
from tilec.nki.tensor import Tensor

NkiTensor = Tensor


class TileSizeFacts06(_l01.TileSizeFacts):
    """0.6's additions, from the running kernel's target as 0.1's (tilec/target.py)."""

    psum_bank_fmax = property(lambda cls: _l01.running_target().psum_fmax)  # fp32 per partition in one PSUM bank
    psum_bank_fmax_bytes = property(lambda cls: _l01.running_target().psum_bank_bytes)
    psum_num_banks = property(lambda cls: _l01.running_target().psum_banks)
    sbuf_fmax = property(lambda cls: _l01.running_target().sbuf_usable // 4)  # fp32 elements per partition
    sbuf_fmax_bytes = property(lambda cls: _l01.running_target().sbuf_usable)
    # "Total SBUF capacity in bytes (all partitions combined)" (nki.language.tile_size, v2.32.0)
    sbuf_size_bytes = property(lambda cls: _l01.running_target().pmax * _l01.running_target().sbuf_bytes)


class tile_size(_l01.tile_size, metaclass=TileSizeFacts06):
    """Hardware tile-size constants of the running kernel's target (NKI 0.6 names included)."""


def _where() -> tuple[str, int]:
    return runtime.callsite()


def _buffer(buffer: object, api: str) -> Buffer:
    if isinstance(buffer, Buffer):
        return buffer
    hint = "pass nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm or nl.private_hbm"
    if isinstance(buffer, str):
        raise rules.NkiTypeError(f"nl.{api}: string buffer names are no longer supported (NKI 0.3+): "
                                 f"buffer={buffer!r}", "buffer", _where(), hint=hint)
    raise rules.NkiTypeError(f"nl.{api}: unknown buffer {buffer!r}", "buffer", _where(), hint=hint)


def _no_mask(kwargs: dict, api: str) -> None:
    if kwargs:
        raise rules.NkiTypeError(f"nl.{api} got unexpected argument(s) {', '.join(k + '=' for k in kwargs)}",
                                 "unexpected_argument", _where(),
                                 hint="NKI 0.6 has no mask=: compute on a slice of the tile instead"
                                 if "mask" in kwargs else f"see the NKI 0.6 signature of nl.{api}")


def _track(t: Tensor, buffer: Buffer) -> Tensor:
    run = runtime.current()
    if buffer is shared_hbm and hasattr(run, "shared_ids"):
        run.shared_ids.add(t.buf.id)
    return t


def _created(shape: object, dtype: object, buffer: object, name: str, fill: object, api: str) -> Tensor:
    buf = _buffer(buffer, api)
    return _track(_l01._create(shape, dtype, buf, name, fill, api), buf)


# ---- creation ----
def ndarray(shape: object, dtype: object, buffer: object = sbuf, name: str = "", address: object = None) -> Tensor:
    """`address`: checked for PSUM (a bank start, checks.psum_address); the placement itself is not simulated (an
    SBUF address's unit is ambiguous in MIG, and tilec never emits addresses)."""
    t = _created(shape, dtype, buffer, name, None, "ndarray")
    if address is not None and t.buf.memory == "psum":
        checks.psum_address(runtime.current(), address, tuple(t.shape), t.buf.name, _where())
    return t


def zeros(shape: object, dtype: object, buffer: object = sbuf, name: str = "") -> Tensor:
    return _created(shape, dtype, buffer, name, 0, "zeros")


def ones(shape: object, dtype: object, buffer: object = sbuf, name: str = "") -> Tensor:
    return _created(shape, dtype, buffer, name, 1, "ones")


def full(shape: object, fill_value: object, dtype: object, buffer: object = sbuf, name: str = "") -> Tensor:
    return _created(shape, dtype, buffer, name, fill_value, "full")


def zeros_like(x: Tensor, dtype: object = None, buffer: object = None, name: str = "") -> Tensor:
    return _created(x.shape, dtype or x.dtype, buffer if buffer is not None else sbuf, name, 0, "zeros_like")


def empty_like(x: Tensor, dtype: object = None, buffer: object = None, name: str = "") -> Tensor:
    same = {"sbuf": sbuf, "psum": psum, "hbm": hbm}[x.buf.memory]
    return _created(x.shape, dtype or x.dtype, buffer if buffer is not None else same, name, None, "empty_like")


def shared_constant(constant: object) -> Tensor:
    """A shared_hbm tensor holding constant data (a NumPy array or a .npy path), loaded with the model [NL6]."""
    data = np.load(constant) if isinstance(constant, str) else np.array(constant)
    run, where = runtime.current(), _where()
    storage = np.ascontiguousarray(data, dtype=dtypes.storage_dtype(data.dtype))
    buf = runtime.Buffer(run, core.target_name(where, "constant"), "hbm", storage, written=True, where=where)
    run.allocate(buf)
    return _track(Tensor.whole(buf), shared_hbm)


def shared_identity_matrix(n: int, dtype: object = uint8, dst: Tensor | None = None) -> Tensor:
    """An n x n identity matrix in SBUF: a constant in HBM, copied in by one DMA (what the trace shows)."""
    dt = dtypes.as_dtype(dtype)
    identity = shared_constant(np.eye(int(n), dtype=dt))
    out = dst if dst is not None else ndarray((int(n), int(n)), dt, buffer=sbuf)
    from tilec.nki import isa06

    isa06.dma_copy(dst=out, src=identity)
    return out


# ---- tensor operations (value-returning, as in 0.1; no mask=) ----
def load(src: Tensor, dtype: object = None, **kwargs: object) -> Tensor:
    _no_mask(kwargs, "load")
    return _l01.load(src, dtype=dtype)


def load_transpose2d(src: Tensor, dtype: object = None, **kwargs: object) -> Tensor:
    _no_mask(kwargs, "load_transpose2d")
    return _l01.load_transpose2d(src, dtype=dtype)


def store(dst: Tensor, value: object, **kwargs: object) -> None:
    _no_mask(kwargs, "store")
    _l01.store(dst, value)


def copy(x: Tensor, dtype: object = None, **kwargs: object) -> Tensor:
    _no_mask(kwargs, "copy")
    return _l01.copy(x, dtype=dtype)


alu.alias(copy, "identity")  # nl.copy is also the identity activation function [SHARED6]


def transpose(x: Tensor, dtype: object = None, **kwargs: object) -> Tensor:
    _no_mask(kwargs, "transpose")
    return _l01.transpose(x, dtype=dtype)


def matmul(x: Tensor, y: Tensor, transpose_x: bool = False, **kwargs: object) -> Tensor:
    _no_mask(kwargs, "matmul")
    return _l01.matmul(x, y, transpose_x=transpose_x)


def where(condition: Tensor, x: object, y: object, dtype: object = None, **kwargs: object) -> Tensor:
    _no_mask(kwargs, "where")
    return _l01.where(condition, x, y, dtype=dtype)


# ---- views ----
def access_pattern(t: Tensor, pattern: object, offset: int | None = None, scalar_offset: object = None,
                   vector_offset: object = None, indirect_dim: int = 0, dtype: object = None) -> object:
    """`t.ap(pattern=[[stride, count], ...], offset=None, ...)`: a view addressing t's storage directly, like
    torch.as_strided (strides in elements; the first pair is the partition dimension). `vector_offset=idx` (a (P, 1)
    integer SBUF tile, indirect_dim=0, t in HBM) makes a gather/scatter view for nisa.dma_copy: row p starts
    idx[p] * stride0 further; `scalar_offset=s` (a 1x1 tile) shifts the view by s * stride of indirect_dim."""
    where = _where()
    if dtype is not None:
        raise rules.NkiError(".ap(dtype=...) reinterpreting storage is not interpreted by tilec", "unsupported_api",
                             where, hint="use a static pattern in the tensor's own dtype")
    if scalar_offset is not None and vector_offset is not None:
        raise rules.NkiValueError(".ap: vector_offset and scalar_offset are mutually exclusive", "access_pattern",
                                  where)
    try:
        pairs = [(int(stride), int(count)) for stride, count in pattern]
    except (TypeError, ValueError):
        raise rules.NkiTypeError(f".ap pattern must be a list of [stride, count] pairs, got {pattern!r}",
                                 "access_pattern", where) from None
    off = t.off + (int(offset) if offset is not None else 0)
    if scalar_offset is not None:
        off += _scalar_offset(scalar_offset, where) * pairs[int(indirect_dim)][0]
    if vector_offset is not None:
        return _gather_view(t, pairs, off, vector_offset, int(indirect_dim), where)
    return _strided(t, pairs, off, pattern, where)


def _strided(t: Tensor, pairs: list, off: int, pattern: object, where: tuple) -> Tensor:
    shape, strides = tuple(c for _, c in pairs), tuple(s for s, _ in pairs)
    # (nl.sum, nl.min and nl.max are operators in this module: the builtins are spelled out)
    lo = off + builtins.sum(builtins.min(0, s * (c - 1)) for s, c in pairs)
    hi = off + builtins.sum(builtins.max(0, s * (c - 1)) for s, c in pairs)
    if not pairs or builtins.min(shape) < 1 or lo < 0 or hi >= t.buf.data.size:
        raise rules.NkiIndexError(f".ap pattern {pattern!r} (offset {off}) leaves tensor '{t.buf.name}' of "
                                  f"{t.buf.data.size} elements", "access_pattern_bounds", where,
                                  f"tensor {t.describe()}")
    return Tensor(t.buf, off, shape, strides)


def _scalar_offset(value: object, where: tuple) -> int:
    if not isinstance(value, Tensor):
        return int(value)
    run = runtime.current()
    core.read(run, value, where)
    core.needs_values(run, ".ap(scalar_offset=tile) (its offset is a tensor value)", where)
    return int(np.asarray(core.values(value)).reshape(-1)[0])


def _gather_view(t: Tensor, pairs: list, off: int, index: object, dim: int, where: tuple) -> Indirect:
    if dim != 0 or t.buf.memory != "hbm":
        raise rules.NkiSyntaxError(".ap(vector_offset=...) indexes dimension 0 of a tensor in HBM",
                                   "access_pattern_indirect", where, f"tensor {t.describe()}")
    stride, rest = pairs[0][0], pairs[1:]
    span = builtins.sum(builtins.max(0, s * (c - 1)) for s, c in rest)
    rows = (t.buf.data.size - off - span - 1) // stride + 1 if stride > 0 else 1
    base = Tensor(t.buf, off, (builtins.max(rows, 0),) + tuple(c for _, c in rest),
                  (stride,) + tuple(s for s, _ in rest))
    return Indirect(base, index, ())


# ---- loops: Python range (deprecated aliases) ----
def affine_range(start: int, stop: int | None = None, step: int = 1) -> range:
    return builtins.range(start) if stop is None else builtins.range(start, stop, step)


sequential_range = static_range = affine_range


def _register_loop(name: str):
    def loop(*args: object, **kwargs: object) -> object:
        raise rules.NkiError(f"nl.{name} runs its loop on the device with a register induction variable, which "
                             "tilec's interpreter does not model", "unsupported_api", _where(),
                             hint="use a Python range loop (unrolled at specialisation)")

    loop.__name__ = name
    return loop


fori_loop, while_loop, dynamic_range = (_register_loop(n) for n in ("fori_loop", "while_loop", "dynamic_range"))


def is_psum(buffer: object) -> bool:
    return buffer is psum


def is_sbuf(buffer: object) -> bool:
    return buffer is sbuf


def is_hbm(buffer: object) -> bool:
    return isinstance(buffer, Buffer) and buffer.memory == "hbm"


def is_on_chip(buffer: object) -> bool:
    return buffer is sbuf or buffer is psum


_REMOVED = {"arange": "index tiles with slices (t[0:128, 0:512]) or nl.ds(start, size)",
            "mgrid": "index tiles with slices (t[0:128, 0:512]) or nl.ds(start, size)",
            "par_dim": "shapes are plain tuples; the first dimension is the partition dimension",
            "spmd_dim": "launch LNC kernels with kernel[lnc](...) and nl.program_id(0)",
            "nc": "launch LNC kernels with kernel[lnc](...) and nl.program_id(0)"}


def __getattr__(name: str) -> object:
    if name in _REMOVED:
        raise AttributeError(f"nki.language.{name} was removed in NKI 0.2: {_REMOVED[name]}")
    raise AttributeError(f"module 'nki.language' has no attribute {name!r}")


# the operators (nl.add, nl.maximum, nl.exp, nl.sum, ...): the same objects as 0.1's, usable as op= and callable
for _name, _op in alu.OPS.items():
    if _name not in globals():
        globals()[_name] = _op
del _name, _op
