"""The reference evaluator: runs a checked kernel on NumPy arrays. It is the ground truth for every later test.

Semantics (the sequential loop nest, exactly): statements run in program order, a statement inside a loop runs once
per iteration. A padded read `X[i - 1] ?? 0` is X's element where every index is inside X, else the constant (rounded
to X's dtype); in indices `/` and `%` are floor division and floor modulo (`X[i / 2]` is element floor(i / 2)). Inputs are rounded to their declared dtype, arithmetic is float32, and every store rounds to the
target's dtype. An accumulation (`+=`, `max=`, `min=`) over the loops directly around it keeps its running value in
float32 and rounds when it is stored after the whole reduction (as a PSUM accumulation does); the summation order
is unspecified. Temporaries start as zeros. Every element of an output must be stored by some statement: on the
hardware an element never stored holds whatever the memory held, so an output written only in part is an error (at
its declaration), found here and, without computing values, by `check_coverage` (`tilec check`).

How it is fast: a loop is run "open" (all iterations at once, as NumPy array operations) when `plan.can_open`
proves that executing its statements one after another, each over all of its iterations, gives the same result as
the sequential nest. Otherwise the loop runs in Python, one iteration at a time, and its body is tried again.
A statement over open loops reads tensors through `as_strided` views (one axis per loop variable, no copies);
a `+=` of a product becomes a contraction (`contract.py`: one batched matmul, or einsum), looping in Python only
over the "taps": reduction variables that share an index with another variable (r, s in `X[y + r, x + s]`), so no
im2col copy is ever built. Padded and quasi-affine reads are gathered with index arrays instead of viewed.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping

import ml_dtypes
import numpy as np

from tilec.errors import TilecError
from tilec.lang import syntax as s
from tilec.lang.contract import Contractor, einsum
from tilec.lang.functions import FUNCTIONS
from tilec.lang.plan import Affines, OpenLoop, Planner, statements_under

NP_DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}


def round_to(dtype: str, values: np.ndarray) -> np.ndarray:
    """Round float32 values to dtype's value set, keeping them float32 (arithmetic stays float32)."""
    if dtype == "f32":
        return values
    return np.asarray(values).astype(NP_DTYPES[dtype]).astype(np.float32)


@dataclass(frozen=True)
class Labelled:
    """An array with one named axis per loop variable it varies over (axes in loop order)."""

    data: np.ndarray
    axes: tuple[str, ...]


def run(kernel: s.Kernel, sizes: Mapping[str, int], tensors: Mapping[str, tuple[str, tuple[int, ...], str]],
        inputs: Mapping[str, np.ndarray], spans: Mapping[str, object] | None = None) -> dict[str, np.ndarray]:
    """tensors: name -> (dtype, shape, kind). Returns the outputs in their own dtype. Raises a TilecError (at the
    output's declaration in `spans`) if an output has elements no statement writes: they would silently read as 0."""
    store = {}
    for name, (dtype, shape, kind) in tensors.items():
        if kind == "input":
            store[name] = np.ascontiguousarray(round_to(dtype, np.asarray(inputs[name], dtype=np.float32)))
        else:
            store[name] = np.zeros(shape, dtype=np.float32)
    Machine(sizes, tensors, store, outputs=kernel.outputs).execute(kernel, spans or {})
    return {o: store[o].astype(NP_DTYPES[tensors[o][0]]) for o in kernel.outputs}


def check_coverage(kernel: s.Kernel, sizes: Mapping[str, int],
                   tensors: Mapping[str, tuple[str, tuple[int, ...], str]], spans: Mapping[str, object]) -> None:
    """The write-coverage check of `run` alone: which output elements the statements store, no values computed."""
    store = {name: np.zeros(shape if kind != "input" else (0,) * len(shape), dtype=np.float32)
             for name, (_, shape, kind) in tensors.items()}
    Machine(sizes, tensors, store, outputs=kernel.outputs, values=False).execute(kernel, spans)


class Machine:
    """Executes statements over open loops; falls back to Python loops where opening is not proven safe."""

    def __init__(self, sizes: Mapping[str, int], tensors: Mapping, store: dict[str, np.ndarray],
                 outputs: tuple[str, ...] = (), values: bool = True) -> None:
        self.sizes, self.tensors, self.store, self.values = sizes, tensors, store, values
        self.written = {o: np.zeros(store[o].shape, dtype=bool) for o in outputs}  # elements some statement stored
        self.affines = Affines(sizes)
        self.contractor = Contractor()
        self.planner = Planner(self.affines, {n: a.strides for n, a in store.items()},
                               {n: a.shape for n, a in store.items()})

    def execute(self, kernel: s.Kernel, spans: Mapping[str, object]) -> None:
        """Every statement of the kernel in order, then the check that each output was stored whole."""
        for st in kernel.body:
            self.item(st, {})
        self.check_written(spans)

    def item(self, st: s.Stmt, env: dict[str, int]) -> None:
        if isinstance(st, s.Assign):
            self.statement(st, (), env)
            return
        if not self.values or self.planner.can_open(st, env):  # which elements a loop stores is order-free
            for stmt, loops in statements_under(st, self.affines, env):
                self.statement(stmt, loops, env)
            return
        start, stop = self.affines.bound(st.start, env), self.affines.bound(st.stop, env)
        for value in range(start, stop):
            for child in st.body:
                self.item(child, {**env, st.var: value})

    # ---- one statement over its open loops ----------------------------------------------------------------------

    def statement(self, st: s.Assign, loops: tuple[OpenLoop, ...], env: dict[str, int]) -> None:
        if any(lp.stop <= lp.start for lp in loops):
            return
        if st.target.tensor in self.written:
            view, _ = self.view(st.target, loops, env, writeable=True, base=self.written[st.target.tensor])
            view[...] = True
        if not self.values:
            return
        written = set(self.affines.vars_of(st.target, env))
        if st.op == "=":  # a plain store in a reduction loop keeps the last iteration's value
            env = {**env, **{lp.var: lp.stop - 1 for lp in loops if lp.var not in written}}
            loops = tuple(lp for lp in loops if lp.var in written)
        taps = self.planner.taps(st, loops, env)
        inner = tuple(lp for lp in loops if lp.var not in {t.var for t in taps})
        total = None
        for values in itertools.product(*(range(t.start, t.stop) for t in taps)):
            tap_env = {**env, **{t.var: v for t, v in zip(taps, values)}}
            part = self.reduced(st, inner, tap_env, written)
            total = _first(part, taps) if total is None else _accumulate(st.op, total, part)
        self.store_result(st, loops, env, written, total)

    def reduced(self, st: s.Assign, loops: tuple[OpenLoop, ...], env: dict[str, int], written: set[str]) -> Labelled:
        """The statement's value summed (or maxed, minned) over its reduction loops, as a Labelled over the
        written variables it depends on."""
        reduce_vars = [lp for lp in loops if lp.var not in written]
        if st.op == "+=":
            factors = _factors(st.value)
            if len(factors) > 1:
                return self.contract([self.expr(f, loops, env) for f in factors], loops, written)
        value = self.expr(st.value, loops, env)
        axes = tuple(i for i, a in enumerate(value.axes) if a not in written)
        if st.op == "+=":
            missing = np.prod([lp.stop - lp.start for lp in reduce_vars if lp.var not in value.axes], dtype=np.int64)
            data = value.data.sum(axis=axes, dtype=np.float32) if axes else value.data
            data = data * np.float32(missing) if missing != 1 else data
        elif axes:
            data = (np.max if st.op == "max=" else np.min)(value.data, axis=axes)
        else:
            data = value.data
        return Labelled(np.asarray(data, dtype=np.float32), tuple(a for a in value.axes if a in written))

    def contract(self, factors: list[Labelled], loops: tuple[OpenLoop, ...], written: set[str]) -> Labelled:
        """sum over the reduction axes of the product of factors: a batched matmul for two array factors
        (constant factors are applied after), einsum otherwise."""
        extent = {lp.var: lp.stop - lp.start for lp in loops}
        present = {a for f in factors for a in f.axes}
        out_axes = tuple(lp.var for lp in loops if lp.var in written and lp.var in present)
        scale = np.float32(np.prod([lp.stop - lp.start for lp in loops if lp.var not in written | present]))
        arrays = [f for f in factors if f.axes]
        for f in factors:
            scale = scale * np.float32(f.data) if not f.axes else scale
        if not arrays:
            data = np.float32(1)
        elif len(arrays) == 1:
            summed = tuple(i for i, a in enumerate(arrays[0].axes) if a not in out_axes)
            data = arrays[0].data.sum(axis=summed, dtype=np.float32) if summed else arrays[0].data
        elif len(arrays) == 2:
            data = self.contractor.contract((arrays[0].data, arrays[1].data), (arrays[0].axes, arrays[1].axes),
                                            out_axes, extent)
        else:
            data = einsum([f.data for f in arrays], [f.axes for f in arrays], out_axes)
        data = np.asarray(data, dtype=np.float32)
        return Labelled(data * scale if scale != 1 else data, out_axes)

    def store_result(self, st: s.Assign, loops: tuple[OpenLoop, ...], env: dict[str, int], written: set[str],
                     value: Labelled) -> None:
        view, axes = self.view(st.target, loops, env, writeable=True)
        data = _align(value, axes)
        dtype = self.tensors[st.target.tensor][0]
        if st.op == "=":
            view[...] = round_to(dtype, np.broadcast_to(data, view.shape))
        elif dtype == "f32":  # update in place: no rounding needed, no temporary of the target's size
            _UPDATE[st.op](view, data, out=view)
        else:
            view[...] = round_to(dtype, _UPDATE[st.op](view, data))

    # ---- expressions --------------------------------------------------------------------------------------------

    def expr(self, e: s.Expr, loops: tuple[OpenLoop, ...], env: dict[str, int]) -> Labelled:
        if isinstance(e, s.Num):
            return Labelled(np.float32(e.value), ())
        if isinstance(e, s.Name):
            return self.name(e, loops, env)
        if isinstance(e, s.Access) and self.affines.gathered(e):
            return self.gather(e, loops, env)
        if isinstance(e, s.Access):
            view, axes = self.view(e, loops, env, writeable=False)
            return Labelled(view, axes)
        if isinstance(e, s.Neg):
            x = self.expr(e.x, loops, env)
            return Labelled(-x.data, x.axes)
        if isinstance(e, s.BinOp):
            return _binary(e.op, self.expr(e.lhs, loops, env), self.expr(e.rhs, loops, env), loops)
        args = [self.expr(a, loops, env) for a in e.args]
        return _call(e.fn, args, loops)

    def name(self, e: s.Name, loops: tuple[OpenLoop, ...], env: dict[str, int]) -> Labelled:
        for lp in loops:
            if lp.var == e.id:
                return Labelled(np.arange(lp.start, lp.stop, dtype=np.float32), (e.id,))
        value = env[e.id] if e.id in env else self.sizes[e.id]
        return Labelled(np.float32(value), ())

    def view(self, acc: s.Access, loops: tuple[OpenLoop, ...], env: dict[str, int], writeable: bool,
             base: np.ndarray | None = None) -> tuple[np.ndarray, tuple[str, ...]]:
        """A strided view of the accessed elements, one axis per open loop variable the access depends on (of the
        tensor's values, or of `base`, an array of the same shape such as its written-element mask)."""
        base = self.store[acc.tensor] if base is None else base
        dims = self.affines.of(acc, env)
        used = {v for d in dims for v in d.coeffs}
        open_loops = [lp for lp in loops if lp.var in used]
        item = base.itemsize
        offset = sum(d.offset * st for d, st in zip(dims, base.strides)) // item
        offset += sum(d.coeffs.get(lp.var, 0) * lp.start * st
                      for lp in open_loops for d, st in zip(dims, base.strides)) // item
        shape = tuple(lp.stop - lp.start for lp in open_loops)
        strides = tuple(sum(d.coeffs.get(lp.var, 0) * st for d, st in zip(dims, base.strides)) for lp in open_loops)
        flat = base.reshape(-1)[offset:]
        view = np.lib.stride_tricks.as_strided(flat, shape=shape, strides=strides, writeable=writeable)
        return view, tuple(lp.var for lp in open_loops)

    def gather(self, acc: s.Access, loops: tuple[OpenLoop, ...], env: dict[str, int]) -> Labelled:
        """A padded or quasi-affine read (`X[y + r - 1] ?? 0`, `X[i / 2]`), which no strided view expresses: the
        elements gathered by index arrays, one axis per open loop variable the access depends on; where an index
        falls outside the tensor (only a padded read may), the padding constant rounded to the tensor's dtype."""
        base = self.store[acc.tensor]
        dims = self.affines.of(acc, env)
        used = {v for d in dims for v in d.vars()}
        open_loops = [lp for lp in loops if lp.var in used]
        grids = {lp.var: np.arange(lp.start, lp.stop, dtype=np.int64).reshape(
            [-1 if k == i else 1 for k in range(len(open_loops))]) for i, lp in enumerate(open_loops)}
        shape = tuple(lp.stop - lp.start for lp in open_loops)
        inside = np.ones(shape, dtype=bool)
        index = []
        for d, n in zip(dims, base.shape):
            ix = np.broadcast_to(d.values(grids), shape)
            ok = (ix >= 0) & (ix < n)
            inside &= ok
            index.append(np.where(ok, ix, 0))
        data = base[tuple(index)]
        if acc.fill is not None:
            fill = round_to(self.tensors[acc.tensor][0], np.asarray(acc.fill, dtype=np.float32))
            data = np.where(inside, data, fill).astype(np.float32)
        return Labelled(data, tuple(lp.var for lp in open_loops))

    # ---- outputs every element of which must be written ---------------------------------------------------------

    def check_written(self, spans: Mapping[str, object]) -> None:
        for name, mask in self.written.items():
            if not mask.all():
                first = tuple(int(i) for i in np.argwhere(~mask)[0])
                missing = int(mask.size - np.count_nonzero(mask))
                verb = "is" if missing == 1 else "are"
                raise TilecError(f"output `{name}` is only partly written: {missing} of its {mask.size} elements "
                                 f"{verb} never stored (the first is {name}[{', '.join(map(str, first))}])",
                                 spans.get(name),
                                 f"make the loops storing into {name} cover its whole shape, or declare it smaller")


# ---- helpers --------------------------------------------------------------------------------------------------------


def _factors(e: s.Expr) -> list[s.Expr]:
    """a * b * (c * d) -> [a, b, c, d]: the operands of a sum-of-products contraction."""
    if isinstance(e, s.BinOp) and e.op == "*":
        return _factors(e.lhs) + _factors(e.rhs)
    return [e]


def _align(x: Labelled, axes: tuple[str, ...]) -> np.ndarray:
    """Reshape x so it broadcasts against the axes (x.axes must be a subsequence of axes)."""
    shape = [1] * len(axes)
    for a, n in zip(x.axes, np.shape(x.data)):
        shape[axes.index(a)] = n
    return np.reshape(x.data, shape) if axes else x.data


def _union(a: Labelled, b: Labelled, loops: tuple[OpenLoop, ...]) -> tuple[str, ...]:
    both = set(a.axes) | set(b.axes)
    return tuple(lp.var for lp in loops if lp.var in both)


_BINARY = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}


def _binary(op: str, a: Labelled, b: Labelled, loops: tuple[OpenLoop, ...]) -> Labelled:
    axes = _union(a, b, loops)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        data = _BINARY[op](_align(a, axes), _align(b, axes), dtype=np.float32)
    return Labelled(data, axes)


def _call(fn: str, args: list[Labelled], loops: tuple[OpenLoop, ...]) -> Labelled:
    f = FUNCTIONS[fn]
    if f.instr == "cast":
        return Labelled(round_to(fn, np.asarray(args[0].data, dtype=np.float32)), args[0].axes)
    axes = args[0].axes if len(args) == 1 else _union(args[0], args[1], loops)
    return Labelled(f(*(_align(x, axes) for x in args)), axes)


_UPDATE = {"+=": np.add, "max=": np.maximum, "min=": np.minimum}


def _first(part: Labelled, taps: tuple[OpenLoop, ...]) -> Labelled:
    """The first partial result of a tap loop, copied when more will be folded into it in place (it may be a
    view of a stored tensor)."""
    if not taps:
        return part
    return Labelled(np.array(part.data, dtype=np.float32, copy=True), part.axes)


def _accumulate(op: str, acc: Labelled, part: Labelled) -> Labelled:
    if op in _UPDATE and set(part.axes) <= set(acc.axes) and np.ndim(acc.data) == len(acc.axes):
        _UPDATE[op](acc.data, _align(part, acc.axes), out=acc.data)
        return acc
    return _combine(op, acc, part)


def _combine(op: str, acc: Labelled, part: Labelled) -> Labelled:
    """Fold one more partial result into an accumulation (axes of part are a subset of acc's or vice versa)."""
    axes = acc.axes if len(acc.axes) >= len(part.axes) else part.axes
    a, b = _align(acc, axes), _align(part, axes)
    if op == "+=":
        return Labelled(np.add(a, b, dtype=np.float32), axes)
    if op == "max=":
        return Labelled(np.maximum(a, b), axes)
    if op == "min=":
        return Labelled(np.minimum(a, b), axes)
    return Labelled(b, axes)  # "=": the later store wins
