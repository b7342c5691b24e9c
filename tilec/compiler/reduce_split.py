"""Reductions of an expression that reads a tensor broadcast along the reduced loops, `s[i] += exp(X[i, j] - m[i])`
(softmax's sum, log_softmax), `v[i] += (h[i, j] - mu[i]) * (h[i, j] - mu[i]) / N` (a variance), `s[j] += exp(X[i,
j] - m[j])` (a softmax over columns): no rule maps them (a row reduction reads every tensor at the same element, a
pool one tensor, a contraction a product of two), so the reduced expression is computed first into an f32
temporary over all the statement's loops, then reduced:

    t[i, j] = exp(X[i, j] - m[i])          # the element-wise rule (a broadcast of m along j)
    s[i] += t[i, j]                        # a row (or column) reduction of one tensor

The same values: the reference evaluator computes the expression in float32 and accumulates it in float32, and the
temporary is float32. The temporary's nest is put before the top-level statement that holds the reduction, so it
is done only when nothing that nest writes is read by the expression (its inputs are complete before it), every
loop around the reduction starts at 0 (the temporary is indexed by the loop variables), and the stored indices are
plain loop variables. The temporary is laid out like the read over all the loops when there is one (`s[j] +=
exp(X[i, j] - m[j])` under `for j: for i:` fills `t[i, j]`: no transpose, then a column reduction). A product
of two reads (`y[i] += A[i, k] * c[i]`) is left to the contraction rule."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.names import unique
from tilec.compiler.rewrite import hoisted, nested, rechecked, taken_names
from tilec.lang import syntax as sx


def split_broadcast_reductions(program):
    """The program with each such reduction's expression computed into a temporary first; the same object when
    there is none."""
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []

    def splittable(st: sx.Assign, loops: tuple[sx.Loop, ...], top_writes: set[str]) -> bool:
        if st.op not in ("+=", "max=", "min=") or not all(isinstance(ix, sx.Name) for ix in st.target.indices):
            return False
        kept = {ix.id for ix in st.target.indices if isinstance(ix, sx.Name)}
        loop_vars = [lp.var for lp in loops]
        reduced = set(loop_vars) - kept
        if not reduced or not kept <= set(loop_vars) or len(kept) != len(st.target.indices):
            return False
        if any(not (isinstance(lp.start, sx.Num) and lp.start.value == 0) for lp in loops):
            return False
        reads = accesses(st.value)
        if len(reads) < 2 or any(a.fill is not None for a in reads) or any(a.tensor in top_writes for a in reads):
            return False
        if isinstance(st.value, sx.BinOp) and st.value.op == "*" and len(reads) == 2:
            return False  # a product of two reads: a contraction's form
        along = [bool(_names(a) & reduced) for a in reads]
        return any(along) and not all(along)

    def stmt(st: sx.Assign, loops: tuple[sx.Loop, ...], top_writes: set[str]) -> tuple[list[sx.Stmt], sx.Stmt]:
        """(nests to put before the top-level statement, the statement rewritten)."""
        if not splittable(st, loops, top_writes):
            return [], st
        span = st.value.span
        name = unique(f"{st.target.tensor}_terms", taken)
        by_var = {lp.var: lp for lp in loops}
        order = [lp.var for lp in loops]
        for a in accesses(st.value):  # laid out like a read over all the loops (`X[i, j]` under `for j: for i:`)
            names = [ix.id for ix in a.indices if isinstance(ix, sx.Name)]
            if len(names) == len(a.indices) and sorted(names) == sorted(order):
                order = names
                break
        loops = tuple(by_var[v] for v in order)
        decls.append(sx.Decl(name, sx.TensorType("f32", tuple(lp.stop for lp in loops), span), span))
        idx = tuple(sx.Name(lp.var, span) for lp in loops)
        value = _sizes_as_numbers(st.value, {lp.var for lp in loops}, program.sizes)
        fill = nested(sx.Assign(sx.Access(name, idx, span), "=", value, st.span), loops)
        return [fill], replace(st, value=sx.Access(name, idx, span))

    return rechecked(program, decls, hoisted(kernel.body, stmt))


def _sizes_as_numbers(e: sx.Expr, loop_vars: set[str], sizes: dict[str, int]) -> sx.Expr:
    """e with each size named in its value (not in an index: `/ N` of a mean) replaced by its number, as the
    reduction rule's constant factor takes it (the element-wise rule takes numbers only)."""
    if isinstance(e, sx.Name) and e.id not in loop_vars and e.id in sizes:
        return sx.Num(sizes[e.id], e.span)
    if isinstance(e, sx.BinOp):
        return replace(e, lhs=_sizes_as_numbers(e.lhs, loop_vars, sizes),
                       rhs=_sizes_as_numbers(e.rhs, loop_vars, sizes))
    if isinstance(e, sx.Neg):
        return replace(e, x=_sizes_as_numbers(e.x, loop_vars, sizes))
    if isinstance(e, sx.Call):
        return replace(e, args=tuple(_sizes_as_numbers(a, loop_vars, sizes) for a in e.args))
    return e


def _names(a: sx.Access) -> set[str]:
    out: set[str] = set()

    def walk(e: sx.Expr) -> None:
        if isinstance(e, sx.Name):
            out.add(e.id)
        elif isinstance(e, sx.BinOp):
            walk(e.lhs)
            walk(e.rhs)
        elif isinstance(e, sx.Neg):
            walk(e.x)
        elif isinstance(e, sx.Call):
            for x in e.args:
                walk(x)
    for ix in a.indices:
        walk(ix)
    return out

