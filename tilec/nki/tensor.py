"""Tensors as affine views of buffers: indexing, slicing, reshape, broadcast, and the operator overloads.

A `Tensor` is `(buffer, offset, shape, strides)` with offset and strides counted in elements: the access pattern the
hardware itself executes. Slicing with ints, slices (with steps), `...`, `None` and `nl.arange`/`mgrid` affine
expressions, `.reshape` and `.broadcast_to` all produce new views without copying; out-of-bounds indices are errors,
not clamped. Reads and writes go through `tilec.nki.core`, which checks and records them.
"""
from __future__ import annotations

import math

import numpy as np

from tilec.nki import rules, runtime
from tilec.nki.indexing import IndexExpr

_BUFFER_NAMES = {"sbuf": "sbuf", "psum": "psum", "hbm": "hbm"}


class Tensor:
    __slots__ = ("buf", "off", "shape", "strides", "_arr", "oob")

    def __init__(self, buf: runtime.Buffer, off: int, shape: tuple, strides: tuple) -> None:
        self.buf, self.off, self.shape, self.strides = buf, off, shape, strides
        self._arr = None
        self.oob = None  # (valid-element mask, error) of an index that leaves the tensor: legal only under mask=

    @classmethod
    def whole(cls, buf: runtime.Buffer) -> "Tensor":
        shape = buf.shape
        strides, acc = [], 1
        for n in reversed(shape):
            strides.append(acc)
            acc *= n
        t = cls(buf, 0, tuple(shape), tuple(reversed(strides)))
        t._arr = buf.data  # the whole buffer: its own array, no view to build
        return t

    # ---- numpy views (cached) ----
    @property
    def arr(self) -> np.ndarray:
        a = self._arr
        if a is None:
            if self.oob is not None:
                raise self.oob[1]
            b = self.buf
            isz = b.itemsize
            a = self._arr = np.ndarray(self.shape, b.dtype, buffer=b.data, offset=self.off * isz,
                                       strides=tuple(s * isz for s in self.strides))
        return a

    def written_view(self) -> np.ndarray:
        return np.ndarray(self.shape, np.bool_, buffer=self.buf.written, offset=self.off, strides=self.strides)

    # ---- metadata ----
    dtype = property(lambda self: self.buf.dtype)
    ndim = property(lambda self: len(self.shape))
    itemsize = property(lambda self: self.buf.itemsize)
    name = property(lambda self: self.buf.name)
    buffer = property(lambda self: self.buf.memory)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def partitions(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def free_size(self) -> int:
        return self.size // self.shape[0] if self.shape and self.shape[0] else self.size

    def describe(self) -> str:
        return f"'{self.buf.name}' ({self.buf.memory}, shape {tuple(self.shape)}, {self.buf.dtype.name})"

    def __repr__(self) -> str:
        return f"Tensor{self.describe()}"

    def __len__(self) -> int:
        return self.shape[0]

    # ---- indexing ----
    def __getitem__(self, key: object) -> "Tensor":
        from tilec.nki.indexing import Grid

        key = tuple(key) if isinstance(key, Grid) else key if isinstance(key, tuple) else (key,)
        if any(isinstance(k, (Tensor, DynamicIndex)) for k in key[1:]):
            key = key[:1] + _resolve_dynamic(key)[1:]
        if key and isinstance(key[0], Tensor):
            from tilec.nki.indirect import Indirect

            return Indirect(self, key[0], key[1:])
        lead = 0
        while lead < len(key) and isinstance(key[lead], (int, np.integer)):
            lead += 1
        if 0 < lead < len(key) and isinstance(key[lead], Tensor):  # t[b, idx_tile, ...]: indirect after ints
            return self._basic(key[:lead])[key[lead:]]
        if any(isinstance(k, IndexExpr) for k in key):
            return self._advanced(key)
        if key and type(key[0]) is int and self.buf.memory != "hbm" and getattr(self.buf.run, "api", "") == "0.6":
            k, n = key[0], self.shape[0]  # NKI 0.6: an integer partition index keeps a size-1 dim on-chip [LG6]
            if -n <= k < n:
                key = (slice(k % n, k % n + 1),) + key[1:]
        return self._basic(key)

    def _expand(self, key: tuple) -> tuple:
        n_ell = used = 0
        for k in key:  # one pass, no generators: every tile index in a kernel comes through here
            if k is Ellipsis:
                n_ell += 1
            elif k is not None:
                used += 1
        if n_ell > 1:
            raise rules.NkiIndexError("an index can only have a single ellipsis ('...')", "indexing",
                                      runtime.callsite(), f"tensor {self.describe()}")
        if used > len(self.shape):
            raise rules.NkiIndexError(f"too many indices: {used} for a tensor of rank {len(self.shape)}",
                                      "indexing", runtime.callsite(), f"tensor {self.describe()}")
        fill = (slice(None),) * (len(self.shape) - used)
        if n_ell:
            i = key.index(Ellipsis)
            return key[:i] + fill + key[i + 1:]
        return key + fill

    def _basic(self, key: tuple) -> "Tensor":
        key = self._expand(key)
        off, shape, strides, d = self.off, [], [], 0
        tails: list | None = None  # (result axis, valid length, error) of slices running past the tensor's end
        for k in key:
            if k is None:
                shape.append(1)
                strides.append(0)
                continue
            n, s = self.shape[d], self.strides[d]
            if isinstance(k, slice):
                start, stop, step = self._slice_bounds(k, n, d)
                length = max(0, (stop - start + step - 1) // step)
                if stop > n:
                    tails = (tails or []) + [(len(shape), max(0, (n - start + step - 1) // step),
                                              self._oob_error(start, stop - 1, n, d))]
                off += start * s
                shape.append(length)
                strides.append(s * step)
            elif type(k) is int and 0 <= k < n:  # the common in-range int, without a call
                off += k * s
            else:
                off += self._int_index(k, n, d) * s
            d += 1
        if len(shape) == 1 and len(self.shape) > 1 and self.buf.memory != "hbm" and strides[0] == self.strides[0]:
            # an on-chip tile stays 2-D: `t[:, i]` of a (P, n) tile is the (P, 1) column i (spec §1.4: tiles have
            # at least 2 dimensions; AWS's flash attention indexes `l_buffer[:, i]` and then `[:, 0]` of that)
            shape.append(1)
            strides.append(1)
        t = Tensor(self.buf, off, tuple(shape), tuple(strides))
        if tails is not None:
            t.oob = _slice_tails(t.shape, tails)
        return t

    def _slice_bounds(self, k: slice, n: int, d: int) -> tuple[int, int, int]:
        """A slice's (start, stop, step). A stop past the end is kept: like an affine index leaving the tensor
        (err_tensor_access_out_of_bound [ERR]), the view is legal only where a mask= cuts the tail off (AWS's
        adaptive_avg_pool2d loads and stores its last channel tile this way); a start outside stays an error."""
        step = 1 if k.step is None else int(k.step)
        if step <= 0:
            raise rules.NkiIndexError(f"slice step {step} is not supported; steps must be positive", "indexing",
                                      runtime.callsite(), f"tensor {self.describe()}, dimension {d}")
        start = 0 if k.start is None else int(k.start)
        stop = n if k.stop is None else int(k.stop)
        start, stop = start + n if start < 0 else start, stop + n if stop < 0 else stop
        if start < 0 or start > stop or (stop > n and start >= n):
            self._oob(start, stop - 1, n, d)
        return start, stop, step

    def _int_index(self, k: object, n: int, d: int) -> int:
        if not isinstance(k, (int, np.integer)):
            raise rules.NkiTypeError(f"unsupported index {k!r} of type {type(k).__name__}", "indexing",
                                     runtime.callsite(), f"tensor {self.describe()}, dimension {d}",
                                     hint="index with ints, slices, nl.ds, or nl.arange/nl.mgrid expressions")
        i = int(k) + n if int(k) < 0 else int(k)
        if not 0 <= i < n:
            self._oob(int(k), int(k), n, d)
        return i

    def _oob(self, lo: int, hi: int, n: int, d: int) -> None:
        raise self._oob_error(lo, hi, n, d)

    def _oob_error(self, lo: int, hi: int, n: int, d: int) -> rules.NkiIndexError:
        return rules.NkiIndexError(f"index range [{lo}, {hi}] exceed dimension size of {n}",
                                   "err_tensor_access_out_of_bound", runtime.callsite(),
                                   f"tensor {self.describe()}, dimension {d}",
                                   hint="keep slices inside the tensor (or use mask= to cut off the tail)")

    def _advanced(self, key: tuple) -> "Tensor":
        key = self._expand(key)
        if any(isinstance(k, slice) for k in key):
            raise rules.NkiIndexError("mixing basic tensor indexing and advanced tensor indexing is not supported",
                                      "err_unsupported_mixing_basic_advanced_tensor_indexing",
                                      runtime.callsite(), f"tensor {self.describe()}",
                                      hint="index every dimension with nl.arange/nl.mgrid expressions or ints")
        exprs = [k for k in key if isinstance(k, IndexExpr)]
        ndim = max(e.ndim for e in exprs)
        if ndim == 1 and len(self.shape) > 1:
            raise rules.NkiIndexError("1d arange is not supported as a tile index", "err_1d_arange_not_supported",
                                      runtime.callsite(), f"tensor {self.describe()}",
                                      hint="add a broadcast axis: nl.arange(n)[:, None] or nl.arange(n)[None, :]")
        shape, strides, off = [1] * ndim, [0] * ndim, self.off
        oob = None
        for d, k in enumerate(key):
            n, s = self.shape[d], self.strides[d]
            if isinstance(k, IndexExpr):
                lo, hi = k.bounds()
                if lo < 0 or hi >= n:
                    oob = self._oob_elements(k, n, d, ndim, oob)
                off += k.const * s
                shift = ndim - k.ndim
                for axis, size, coef in k.terms:
                    shape[axis + shift] = size
                    strides[axis + shift] += coef * s
            else:
                off += self._int_index(k, n, d) * s
        t = Tensor(self.buf, off, tuple(shape), tuple(strides))
        if oob is not None:
            t.oob = (np.broadcast_to(oob[0], t.shape), oob[1])
        return t

    def _oob_elements(self, k: IndexExpr, n: int, d: int, ndim: int, prev: tuple | None) -> tuple:
        """An affine index leaving the tensor is allowed if a mask= cuts the outside elements off (spec §1.6)."""
        v = k.values().reshape((1,) * (ndim - k.ndim) + k.shape)
        valid = (v >= 0) & (v < n)
        lo, hi = k.bounds()
        try:
            self._oob(lo, hi, n, d)
        except rules.NkiIndexError as err:
            error = err
        return (valid if prev is None else valid & prev[0]), (error if prev is None else prev[1])

    # ---- views ----
    def reshape(self, *shape: object, **kwargs: object) -> "Tensor":
        where = runtime.callsite()
        if set(kwargs) - {"shape"} or (shape and kwargs):
            raise rules.NkiTypeError(f"reshape takes the new shape positionally or as shape=, got {sorted(kwargs)}",
                                     "reshape", where, f"tensor {self.describe()}")
        if kwargs:  # tile.reshape(shape=(...)): the documented keyword [NL1 NkiTensor.reshape]
            shape = (kwargs["shape"],)
        new = tuple(int(x) for x in (shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list))
                                     else shape))
        try:
            view = self.arr.view()
            view.shape = new
        except (AttributeError, ValueError) as exc:
            raise rules.NkiValueError(f"cannot reshape tensor of shape {tuple(self.shape)} into {new}: {exc}",
                                      "reshape", where, f"tensor {self.describe()}",
                                      hint="reshape needs the reshaped dimensions to be contiguous") from None
        if self.buf.memory != "hbm" and view.shape[0] != self.shape[0]:
            raise rules.NkiSyntaxError(
                f"reshape of an on-chip tile must keep the partition dimension ({self.shape[0]}), got {new}",
                "reshape", where, f"tensor {self.describe()}",
                hint="fold or split only free dimensions; move data across partitions with a transpose")
        isz = self.buf.itemsize
        return Tensor(self.buf, self.off, tuple(view.shape), tuple(s // isz for s in view.strides))

    def view(self, dtype: object) -> "Tensor":
        """`t.view(dtype)`: the same bytes as another dtype; tilec supports only a dtype of the same itemsize whose
        storage is the tensor's own (e.g. an fp8 argument viewed as nl.float8_e5m2)."""
        from tilec.nki import dtypes

        dt = dtypes.as_dtype(dtype)
        if dt == self.dtype:
            return self
        raise rules.NkiTypeError(f"view as {dt.name} of a {self.dtype.name} tensor is not supported by tilec",
                                 "view_dtype", runtime.callsite(), f"tensor {self.describe()}",
                                 hint="pass the argument in the dtype the kernel views it as")

    def broadcast_to(self, shape: tuple) -> "Tensor":
        shape = tuple(int(x) for x in shape)
        if len(shape) < len(self.shape):
            self._bad_broadcast(shape)
        pad = len(shape) - len(self.shape)
        old_shape, old_strides = (1,) * pad + tuple(self.shape), (0,) * pad + tuple(self.strides)
        if pad and self.buf.memory != "hbm" and self.shape and self.shape[0] == shape[0]:
            # an on-chip tile's first dimension is its partition dimension: a lower-rank tile keeps it and
            # broadcasts along new free dimensions, e.g. the (P,) row sums of nisa.tensor_reduce to (P, F) (the
            # documented result is "broadcast along the partition dimension of src" [NL1 broadcast_to]; AWS's SD
            # attention sample scales its softmax rows by `(1.0 / sum_res).broadcast_to((P, d))`)
            old_shape, old_strides = tuple(self.shape) + (1,) * pad, tuple(self.strides) + (0,) * pad
        strides = []
        for n_old, s, n_new in zip(old_shape, old_strides, shape):
            if n_old == n_new:
                strides.append(s)
            elif n_old == 1:
                strides.append(0)
            else:
                self._bad_broadcast(shape)
        return Tensor(self.buf, self.off, shape, tuple(strides))

    def _bad_broadcast(self, shape: tuple) -> None:
        raise rules.NkiValueError(f"cannot broadcast tensor of shape {tuple(self.shape)} to {shape}",
                                  "broadcast", runtime.callsite(), f"tensor {self.describe()}")

    def expand_dims(self, axis: int) -> "Tensor":
        axis = axis + len(self.shape) + 1 if axis < 0 else axis
        return Tensor(self.buf, self.off, self.shape[:axis] + (1,) + self.shape[axis:],
                      self.strides[:axis] + (0,) + self.strides[axis:])

    def ap(self, pattern: object, offset: int | None = None, **kwargs: object) -> "Tensor":
        """NKI 0.6 access pattern [[stride, count], ...] over the storage (tilec.nki.language06.access_pattern)."""
        from tilec.nki.language06 import access_pattern

        return access_pattern(self, pattern, offset, **kwargs)

    def assert_shape(self, shape: tuple) -> "Tensor":
        if tuple(shape) != tuple(self.shape):
            raise rules.NkiValueError(f"shape assertion failed: expected {tuple(shape)}, got {tuple(self.shape)}",
                                      "assert_shape", runtime.callsite(), f"tensor {self.describe()}")
        return self

    def astype(self, dtype: object) -> "Tensor":
        from tilec.nki import isa

        return isa.tensor_copy(self, dtype=dtype)

    # ---- writes ----
    def __setitem__(self, key: object, value: object) -> None:
        from tilec.nki import core

        core.assign(self[key], value)

    def __iadd__(self, other: object) -> "Tensor":
        from tilec.nki import core

        if core.is_matmul_accumulation(self, other):
            core.accumulate(self, other)
        else:
            self._update("add", "+=", other)
        return self

    def _update(self, op_name: str, symbol: str, other: object) -> "Tensor":
        from tilec.nki import language_more

        language_more.update_in_place(self, other, op_name, symbol)
        return self

    def __isub__(self, other: object) -> "Tensor":
        return self._update("subtract", "-=", other)

    def __imul__(self, other: object) -> "Tensor":
        return self._update("multiply", "*=", other)

    def __itruediv__(self, other: object) -> "Tensor":
        return self._update("divide", "/=", other)

    def __bool__(self) -> bool:
        raise rules.NkiValueError("the truth value of a tensor is ambiguous", "err_ambiguous_tensor_truth_value",
                                  runtime.callsite(), f"tensor {self.describe()}",
                                  hint="control flow cannot depend on tensor values; use &, | and nl.where")

    __hash__ = object.__hash__


class DynamicIndex:
    """`scalar_tile + nl.arange(...)`: an index whose offset is a value held on chip (tensor_copy_dynamic_src), read
    when the index is used."""

    def __init__(self, scalar: Tensor, expr: IndexExpr) -> None:
        self.scalar, self.expr = scalar, expr


def _dynamic_value(t: Tensor) -> int:
    """The value of a one-element on-chip tile used as an index (a dynamic offset)."""
    from tilec.nki import core

    run, where = runtime.current(), runtime.callsite()
    core.read(run, t, where)
    core.needs_values(run, "an index read from a tile (a dynamic offset)", where)
    return int(np.asarray(core.values(t)).reshape(-1)[0])


def _resolve_dynamic(key: tuple) -> tuple:
    out = []
    for i, k in enumerate(key):
        if isinstance(k, DynamicIndex):
            k = k.expr + _dynamic_value(k.scalar)
        elif i > 0 and isinstance(k, Tensor) and k.size == 1 and k.buf.memory != "hbm":
            k = _dynamic_value(k)
        out.append(k)
    return tuple(out)


def _binary(name: str, symbol: str, reverse: bool = False):
    def method(self: Tensor, other: object) -> Tensor:
        from tilec.nki import language

        if name == "add" and isinstance(other, IndexExpr) and self.size == 1:
            return DynamicIndex(self, other)

        if isinstance(other, Tensor) and self.shape and other.shape and self.shape[0] != other.shape[0]:
            raise rules.NkiSyntaxError(
                f"operator '{symbol}' does not broadcast along the partition dimension: shapes "
                f"{tuple(self.shape)} and {tuple(other.shape)}", "operator_partition_broadcast",
                runtime.callsite(), f"{self.describe()}; {other.describe()}",
                hint=f"call nl.{name}(a, b), which broadcasts partitions, or broadcast explicitly")
        fn = getattr(language, name)
        return fn(other, self) if reverse else fn(self, other)

    return method


for _op, _fn, _sym in [("add", "add", "+"), ("sub", "subtract", "-"), ("mul", "multiply", "*"),
                       ("truediv", "divide", "/"), ("pow", "power", "**"), ("and", "bitwise_and", "&"),
                       ("or", "bitwise_or", "|"), ("xor", "bitwise_xor", "^"), ("lshift", "left_shift", "<<"),
                       ("rshift", "right_shift", ">>"), ("mod", "mod", "%")]:
    setattr(Tensor, f"__{_op}__", _binary(_fn, _sym))
    setattr(Tensor, f"__r{_op}__", _binary(_fn, _sym, reverse=True))
for _op, _fn, _sym in [("lt", "less", "<"), ("le", "less_equal", "<="), ("gt", "greater", ">"),
                       ("ge", "greater_equal", ">="), ("eq", "equal", "=="), ("ne", "not_equal", "!=")]:
    setattr(Tensor, f"__{_op}__", _binary(_fn, _sym))


def _unary(name: str):
    def method(self: Tensor) -> Tensor:
        from tilec.nki import language

        return getattr(language, name)(self)

    return method


Tensor.__neg__, Tensor.__abs__, Tensor.__invert__ = _unary("negative"), _unary("abs"), _unary("invert")


def _slice_tails(shape: tuple, tails: list) -> tuple:
    """The oob record of a sliced view: elements whose index along a tail axis is below its valid length exist."""
    valid = np.ones(shape, dtype=bool)
    for axis, n_valid, _ in tails:
        along = np.arange(shape[axis]) < n_valid
        valid &= along.reshape([-1 if a == axis else 1 for a in range(len(shape))])
    return valid, tails[0][2]
