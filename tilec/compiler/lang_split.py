"""Source rewrites for forms a new user writes that no rule maps as written (lang15; issue 13's audit13
reproducers). Like pad_split, reduce_split and permute_split, each turns a statement into ordinary statements the
rules map, and the rewritten kernel is checked again as if the user had written it.

- fold_value_sizes: a size read as a value, `Y[n, c] = S[n, c] / (H * W)` (a mean's last step): sizes are known
  at compile time, so the constant subexpression becomes one number, computed as the program computes it (float32
  arithmetic on the size's value; tilec/lang/evaluator.py reads a size in a value as float32)."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import const_value
from tilec.compiler.lower import uses_names
from tilec.compiler.rewrite import resolved
from tilec.lang import syntax as sx


def fold_value_sizes(program):
    """The program with each element-wise (`=`) statement's constant subexpressions that read a size folded into a
    number; the same object when no statement reads a size in its value. Reductions keep their form (their rules
    fold `X / (H * W)` themselves)."""
    sizes = program.sizes
    names = set(sizes)
    changed = False

    def fold(e: sx.Expr) -> sx.Expr:
        if isinstance(e, sx.Access):
            return e  # indices are sizes' own business
        if uses_names(e, names) and not _reads(e):
            v = const_value(e, sizes)
            if v is not None:
                return sx.Num(int(v) if v.is_integer() else v, e.span)
        if isinstance(e, sx.Neg):
            return replace(e, x=fold(e.x))
        if isinstance(e, sx.BinOp):
            return replace(e, lhs=fold(e.lhs), rhs=fold(e.rhs))
        if isinstance(e, sx.Call):
            return replace(e, args=tuple(fold(a) for a in e.args))
        return e

    def stmt(st: sx.Stmt, loop_vars: frozenset[str]) -> sx.Stmt:
        nonlocal changed
        if isinstance(st, sx.Loop):
            inner = loop_vars | {st.var}
            return replace(st, body=tuple(stmt(c, inner) for c in st.body))
        if st.op != "=" or loop_vars & names:
            return st
        value = fold(st.value)
        if value == st.value:
            return st
        changed = True
        return replace(st, value=value)

    body = tuple(stmt(st, frozenset()) for st in program.kernel.body)
    return resolved(program, replace(program.kernel, body=body)) if changed else program


def _reads(e: sx.Expr) -> bool:
    """Whether the expression reads a tensor (it is not a constant of sizes)."""
    if isinstance(e, sx.Access):
        return True
    if isinstance(e, sx.Neg):
        return _reads(e.x)
    if isinstance(e, sx.BinOp):
        return _reads(e.lhs) or _reads(e.rhs)
    if isinstance(e, sx.Call):
        return any(_reads(a) for a in e.args)
    return False
