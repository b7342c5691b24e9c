"""The meaning of level-A IR on NumPy: `evaluate_nest(kernel, inputs) -> outputs`.

Statements run in program order, a loop's iterations in order, exactly like the sequential nest. For speed, a loop
is run for all its iterations at once (its variable becomes an array axis) when that cannot change the result:
every buffer its body writes is accessed in that body through one and the same index tuple (so an iteration only
touches its own elements: the body can be distributed and each statement vectorised). Otherwise the loop runs one
iteration at a time. A padded read (`Access.fill`) gives its fill where an index falls outside the buffer.
Arithmetic is float32; an Assign rounds to its buffer's dtype; an Update accumulates in float32 (as PSUM does) and
the buffer is rounded to its dtype when the kernel ends, as the reference evaluator does. A buffer first written
by an update starts at that update's identity (0 for +=, -inf for max=, inf for min=): a reduction whose initial
value is its identity may leave the initial value out (primitives.fold_init; the reduce instruction writes its first
result), and an accumulator it fills is read only after it.
"""
from __future__ import annotations

import numpy as np

from tilec.compiler.ir import Aff
from tilec.compiler.nest import (Access, Alloc, Assign, Const, Expr, Index, Kernel, Load, Loop, Stmt, Update,
                                 loads, walk)
from tilec.lang.evaluator import round_to
from tilec.lang.functions import FUNCTIONS

F32 = np.float32
_ARITH = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}
_REDUCE = {"+=": np.add, "max=": np.maximum, "min=": np.minimum}


def evaluate_nest(k: Kernel, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    bufs = k.buffers()
    mem = {name: np.zeros(b.shape, F32) for name, b in bufs.items()}
    first = _first_writes(k.body)
    for name, op in first.items():
        if op in _IDENTITY:
            mem[bufs[name].view_of or name].fill(_IDENTITY[op])
    for b in k.params:
        mem[b.name] = round_to(b.dtype, np.asarray(inputs[b.name], F32)).reshape(b.shape).copy()
    for b in bufs.values():  # a view shares its base's storage: writes through it land in the base
        if b.view_of:
            mem[b.name] = mem[b.view_of].reshape(b.shape)
    _Run(mem, {n: b.dtype for n, b in bufs.items()}, first).body(k.body, ())
    return {b.name: round_to(b.dtype, mem[b.name]) for b in k.outputs}


_IDENTITY = {"+=": 0.0, "max=": -np.inf, "min=": np.inf}


def _first_writes(body: tuple[Stmt, ...]) -> dict[str, str]:
    """Buffer -> how the nest first writes it: "=" or the update's operator."""
    out: dict[str, str] = {}
    for s in walk(body):
        if isinstance(s, Assign):
            out.setdefault(s.dst.buf, "=")
        elif isinstance(s, Update):
            out.setdefault(s.dst.buf, s.op)
    return out


class _Run:
    def __init__(self, mem: dict[str, np.ndarray], dtypes: dict[str, str], first: dict[str, str]) -> None:
        self.mem, self.dtypes, self.first = mem, dtypes, first
        self.scalars: dict[str, int] = {}  # loops run one iteration at a time

    def body(self, stmts: tuple[Stmt, ...], axes: tuple[tuple[str, int], ...]) -> None:
        for s in stmts:
            if isinstance(s, Loop):
                self.loop(s, axes)
            elif isinstance(s, (Assign, Update)):
                self.store(s, axes)
            elif isinstance(s, Alloc) and not s.buf.view_of:  # a fresh buffer (each iteration of its loop)
                self.mem[s.buf.name].fill(_IDENTITY.get(self.first.get(s.buf.name, "="), 0.0))

    def loop(self, s: Loop, axes: tuple[tuple[str, int], ...]) -> None:
        if _independent(s.body):
            self.body(s.body, axes + ((s.var, s.extent),))
            return
        for i in range(s.extent):
            self.scalars[s.var] = i
            self.body(s.body, axes)
        del self.scalars[s.var]

    def index(self, a: Aff, axes: tuple[tuple[str, int], ...]) -> np.ndarray | int:
        """An affine index as an integer array broadcasting over the vectorised loops (one axis each)."""
        value: np.ndarray | int = a.const
        for t in a.terms:
            if t.var in self.scalars:
                value = value + t.coef * self.scalars[t.var]
                continue
            pos = [v for v, _ in axes].index(t.var)
            shape = [1] * len(axes)
            shape[pos] = axes[pos][1]
            value = value + t.coef * np.arange(axes[pos][1]).reshape(shape)
        return value

    def where(self, a: Access, axes: tuple[tuple[str, int], ...]) -> tuple:
        return tuple(self.index(i, axes) for i in a.index)

    def load(self, a: Access, axes: tuple[tuple[str, int], ...]) -> np.ndarray:
        """A buffer's elements; a padded read gives its fill (rounded to the buffer's dtype, as the reference does)
        where an index falls outside the buffer: np.pad's meaning, without a padded copy."""
        buf, where = self.mem[a.buf], self.where(a, axes)
        if a.fill is None:
            return buf[where]
        inside: np.ndarray | bool = True
        clipped = []
        for w, n in zip(where, buf.shape):
            ok = (np.asarray(w) >= 0) & (np.asarray(w) < n)
            inside = inside & ok
            clipped.append(np.where(ok, w, 0))
        fill = round_to(self.dtypes[a.buf], np.asarray(a.fill, F32))
        return np.where(inside, buf[tuple(clipped)], fill).astype(F32)

    def full(self, x: np.ndarray | F32, axes: tuple[tuple[str, int], ...]) -> np.ndarray:
        return np.broadcast_to(np.asarray(x, F32), tuple(n for _, n in axes))

    def store(self, s: Assign | Update, axes: tuple[tuple[str, int], ...]) -> None:
        buf, where = self.mem[s.dst.buf], self.where(s.dst, axes)
        value = self.full(self.expr(s.expr, axes), axes)
        where = tuple(np.broadcast_to(w, value.shape) for w in where)
        if isinstance(s, Assign):
            buf[where] = round_to(self.dtypes[s.dst.buf], value)
        else:
            _REDUCE[s.op].at(buf, where, value)

    def expr(self, e: Expr, axes: tuple[tuple[str, int], ...]) -> np.ndarray | F32:
        if isinstance(e, Const):
            return F32(e.value)
        if isinstance(e, Index):
            return np.asarray(self.index(e.aff, axes), F32)
        if isinstance(e, Load):
            return self.load(e.access, axes)
        args = [self.expr(a, axes) for a in e.args]
        with np.errstate(all="ignore"):
            if e.name == "neg":
                return np.negative(args[0])
            if e.name in _ARITH:
                return _ARITH[e.name](args[0], args[1], dtype=F32)
            f = FUNCTIONS[e.name]
            if f.instr == "cast":
                return round_to(e.name, np.asarray(args[0], F32))
            return f(*args)


def _accesses(s: Stmt) -> list[Access]:
    if isinstance(s, (Assign, Update)):
        return [s.dst, *loads(s.expr)]
    return []



def _independent(body: tuple[Stmt, ...]) -> bool:
    """Every buffer written in the body is accessed there through one index tuple only, and the body allocates
    nothing (an allocation is each iteration's own: run one iteration at a time, it starts afresh each time)."""
    if any(isinstance(s, Alloc) for s in walk(body)):
        return False
    stmts = [s for s in walk(body) if not isinstance(s, (Loop, Alloc))]
    written = {s.dst.buf for s in stmts}
    seen: dict[str, Access] = {}
    for a in (a for s in stmts for a in _accesses(s) if a.buf in written):
        if seen.setdefault(a.buf, a) != a:
            return False
    return True
