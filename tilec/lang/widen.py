"""Operands of different dtypes in one statement are read as float32 (arithmetic is float32, docs/language.md).

A bf16 softmax with float32 statistics is written as it is meant,

    s[i] += exp(X[i, j] - mx[i])          # X: bf16, mx: f32

and means what the explicit form means,

    s[i] += exp(f32(X[i, j]) - mx[i])

because widening a 16-bit value to float32 is exact: nothing rounds until the store, where it always does (to the
stored tensor's dtype). So a statement whose operands (tensor reads and conversions) have different dtypes gets
`f32(...)` around each 16-bit one before it is checked, and the compiler sees the explicit form. A statement whose
operands all share one 16-bit dtype is left alone: its arithmetic is float32 all the same, and the compiler keeps
its 16-bit tiles. Names the checker does not know are left for it to report."""
from __future__ import annotations

from dataclasses import replace

from tilec.lang import syntax as s
from tilec.lang.checker import children
from tilec.lang.functions import FUNCTIONS

_CASTS = frozenset(name for name, f in FUNCTIONS.items() if f.instr == "cast")


def widen_mixed(kernel: s.Kernel) -> s.Kernel:
    dtypes = {t.name: t.type.dtype for t in (*kernel.params, *kernel.decls)}
    body = tuple(_stmt(st, dtypes) for st in kernel.body)
    return kernel if body == kernel.body else replace(kernel, body=body)


def _stmt(st: s.Stmt, dtypes: dict[str, str]) -> s.Stmt:
    if isinstance(st, s.Loop):
        return replace(st, body=tuple(_stmt(b, dtypes) for b in st.body))
    kinds = set(_operands(st.value, dtypes))
    if len(kinds) < 2 or None in kinds:
        return st
    return replace(st, value=_widened(st.value, dtypes))


def _operands(e: s.Expr, dtypes: dict[str, str]):
    """The dtype of each operand of e (a tensor read or a conversion), None for a tensor the kernel does not have."""
    if isinstance(e, s.Access):
        yield dtypes.get(e.tensor)
    elif isinstance(e, s.Call) and e.fn in _CASTS:
        yield e.fn
    else:
        for child in children(e):
            yield from _operands(child, dtypes)


def _widened(e: s.Expr, dtypes: dict[str, str]) -> s.Expr:
    if isinstance(e, s.Access) and dtypes[e.tensor] != "f32" or isinstance(e, s.Call) and e.fn in _CASTS - {"f32"}:
        return s.Call("f32", (e,), e.span)
    if isinstance(e, s.BinOp):
        return replace(e, lhs=_widened(e.lhs, dtypes), rhs=_widened(e.rhs, dtypes))
    if isinstance(e, s.Call) and e.fn not in _CASTS:
        return replace(e, args=tuple(_widened(a, dtypes) for a in e.args))
    if isinstance(e, s.Neg):
        return replace(e, x=_widened(e.x, dtypes))
    return e
