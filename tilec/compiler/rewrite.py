"""The shared steps of the source rewrites that run before lowering (pad_split, reduce_split, permute_split,
inplace_split): each turns a statement no rule maps into ordinary statements over new temporaries, then checks the
rewritten kernel again as if the user had written it (so the temporaries get shapes, dtypes and proven bounds the
same way as declared tensors)."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from tilec.compiler.exprs import accesses
from tilec.lang import syntax as sx

# (statement, loops around it, tensors its top-level nest writes) -> (nests to put before that top-level nest, the
# statement rewritten)
Leaf = Callable[[sx.Assign, tuple[sx.Loop, ...], set[str]], tuple[list[sx.Stmt], sx.Stmt]]


def taken_names(kernel: sx.Kernel) -> set[str]:
    """The names a new temporary must not take: parameters, declarations and lets."""
    return {p.name for p in kernel.params} | {d.name for d in kernel.decls} | {lt.name for lt in kernel.lets}


def written(st: sx.Stmt) -> set[str]:
    """The tensors a statement (with its nested loops) stores into."""
    if isinstance(st, sx.Loop):
        return set().union(*(written(c) for c in st.body)) if st.body else set()
    return {st.target.tensor} if isinstance(st, sx.Assign) else set()


def hoisted(body: tuple[sx.Stmt, ...], leaf: Leaf) -> list[sx.Stmt]:
    """`body` with each assignment rewritten by `leaf`, the nests `leaf` makes put before its top-level nest (they
    fill temporaries the rewritten statement reads)."""
    def stmt(st: sx.Stmt, loops: tuple[sx.Loop, ...], top_writes: set[str]) -> tuple[list[sx.Stmt], sx.Stmt]:
        if isinstance(st, sx.Loop):
            before: list[sx.Stmt] = []
            inner = []
            for child in st.body:
                pre, new = stmt(child, loops + (st,), top_writes)
                before += pre
                inner.append(new)
            return before, replace(st, body=tuple(inner))
        return leaf(st, loops, top_writes) if isinstance(st, sx.Assign) else ([], st)

    out: list[sx.Stmt] = []
    for top in body:
        pre, new = stmt(top, (), written(top))
        if pre and out and _init_nest(out[-1], new, pre):
            out[-1:] = pre + out[-1:] + [new]  # the init stays right before its reduction (lower merges the two)
        else:
            out += pre + [new]
    return out


def _init_nest(prev: sx.Stmt, top: sx.Stmt, pre: list[sx.Stmt]) -> bool:
    """`prev` is the own nest of an initial value of the reduction `top` (`s[j] = 0` before `for i, j: s[j] +=`),
    and the nests `pre` neither read nor write what it writes: they may run before it."""
    inits, updates = list(leaves(prev)), [st for st, _ in leaves(top)]
    if not inits or not all(isinstance(st, sx.Assign) and st.op == "=" for st, _ in inits):
        return False
    if not any(isinstance(st, sx.Assign) and st.op != "=" for st in updates):
        return False
    target = written(prev)
    if not target <= written(top):
        return False
    touched = {a.tensor for p in pre for st, _ in leaves(p) if isinstance(st, sx.Assign)
               for a in accesses(st.value)} | set().union(*(written(p) for p in pre))
    return not target & touched


def substituted(e: sx.Expr, new: dict[int, sx.Expr]) -> sx.Expr:
    """`e` with each subexpression whose id is a key of `new` replaced by its value (indices are not entered)."""
    if id(e) in new:
        return new[id(e)]
    if isinstance(e, sx.Neg):
        return replace(e, x=substituted(e.x, new))
    if isinstance(e, sx.BinOp):
        return replace(e, lhs=substituted(e.lhs, new), rhs=substituted(e.rhs, new))
    if isinstance(e, sx.Call):
        return replace(e, args=tuple(substituted(a, new) for a in e.args))
    return e


def from_zero(lp: sx.Loop) -> bool:
    """The loop starts at 0 (its variable is then an index of the temporaries a rewrite makes)."""
    return isinstance(lp.start, sx.Num) and lp.start.value == 0


def perfect_nest(top: sx.Stmt) -> tuple[list[sx.Loop], sx.Stmt]:
    """The loops of a perfect nest starting at 0 around one statement (outermost first), and that statement."""
    loops: list[sx.Loop] = []
    st = top
    while isinstance(st, sx.Loop) and len(st.body) == 1 and from_zero(st):
        loops.append(st)
        st = st.body[0]
    return loops, st


def leaves(top: sx.Stmt, loops: tuple[str, ...] = ()):
    """Every statement below `top` that is not a loop, with the names of the loops around it."""
    if isinstance(top, sx.Loop):
        for c in top.body:
            yield from leaves(c, loops + (top.var,))
    else:
        yield top, loops


def perfect(st: sx.Stmt) -> tuple[list[sx.Loop], sx.Stmt]:
    """The loops of a perfect nest from `st` down (each holding one statement) and what they hold."""
    loops: list[sx.Loop] = []
    while isinstance(st, sx.Loop) and len(st.body) == 1:
        loops.append(st)
        st = st.body[0]
    return loops, st


def read_order(value: sx.Expr, loop_vars: set[str] | list[str]) -> list[str] | None:
    """The loop variables in the order of the first read of `value` indexed by exactly them (plain names, not a
    padded read): the layout of a temporary over those loops that reads like its source (`X[i, j]` under `for j:
    for i:`); None when no read is."""
    for a in accesses(value):
        names = [ix.id for ix in a.indices if isinstance(ix, sx.Name)]
        if a.fill is None and len(names) == len(a.indices) and sorted(names) == sorted(loop_vars):
            return names
    return None


def nested(st: sx.Stmt, loops: list[sx.Loop] | tuple[sx.Loop, ...]) -> sx.Stmt:
    """`st` inside `loops` (outermost first), each running as the program's loop of that name runs."""
    for lp in reversed(loops):
        st = sx.Loop(lp.var, lp.start, lp.stop, (st,), lp.span)
    return st


def rechecked(program, decls: list[sx.Decl], body: list[sx.Stmt] | tuple[sx.Stmt, ...]):
    """The program with `decls` added and `body` as its kernel's body, checked and resolved again; the same object
    when nothing was declared (nothing was rewritten)."""
    if not decls:
        return program
    return resolved(program, replace(program.kernel, decls=program.kernel.decls + tuple(decls), body=tuple(body)))


def resolved(program, kernel: sx.Kernel):
    """The program with `kernel` (a rewrite of its own) in its place, checked and resolved again."""
    from tilec.lang import api, bounds, checker
    facts = checker.check(kernel)
    pending = bounds.prove(facts)
    bound = {k: v for k, v in program.sizes.items() if k in facts.symbols}
    out = api._resolve(kernel, program.path, program.source, facts, pending, program.defines, bound)
    return replace(out, views=program.views) if program.views else out  # (view_split's signature shapes)
