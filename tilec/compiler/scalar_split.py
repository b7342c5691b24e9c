"""A vector's element at a constant index read in an element-wise statement (`Y[i, j] = X[i, j] * gam[0]`, ECA's
`k[0] * p[n, c - 1] + k[1] * p[n, c] + ..`, a softmax's `exp(s[l] - m[0]) / z[0]`): the element-wise rule loads
operands indexed by a run of the output's indices, and a read at constant indices uses none, so it was refused.
The element becomes a column along the statement's first index, made by rules that exist:

    for i, u:  gam_b[i, u] = gam[u]            (the vector broadcast along the rows: the row-broadcast rule)
    for i, z:  gam_0[i, z] = gam_b[i, 0 + z]   (its column at the constant: a shifted copy; skipped for a [1] vector)
    for i, j:  Y[i, j] = X[i, j] * gam_0[i, 0] (a column read: the broadcast rule; a dimension of 1 read at 0)

Exact (copies in the vector's dtype). Cost: small nests of (rows x the vector's length) elements; the vector is
broadcast once a statement and shared by its constants. Only 1-D vectors read
with a number as their index, in statements whose first stored index is a loop variable from 0."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.names import unique
from tilec.compiler.rewrite import from_zero, hoisted, nested, rechecked, substituted, taken_names
from tilec.lang import syntax as sx


def split_scalar_reads(program):
    """The program with each constant-index vector read of an element-wise statement read from a column made
    first; the same object when there is none."""
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []

    def declare(base: str, dtype: str, shape: tuple[sx.Expr, ...], span) -> str:
        name = unique(base, taken)
        decls.append(sx.Decl(name, sx.TensorType(dtype, shape, span), span))
        return name

    def column(acc: sx.Access, row: sx.Loop, pre: list[sx.Stmt], made: dict) -> sx.Access:
        """The read of the column holding `acc`'s element on every row of `row` (its nests appended to pre;
        `made`: the statement's reads made so far, by (tensor, constant), and its broadcasts, by tensor)."""
        at = _number(acc.indices[0])
        if (acc.tensor, at) in made:
            return made[acc.tensor, at]
        info = program.tensors[acc.tensor]
        span = acc.span
        r = sx.Name(row.var, span)
        if acc.tensor not in made:  # the vector broadcast along the rows, once a statement
            u = unique("u", taken | {row.var})
            width = sx.Num(info.shape[0], span)
            name = declare(f"{acc.tensor}_b", info.dtype, (row.stop, width), span)
            fill = sx.Assign(sx.Access(name, (r, sx.Name(u, span)), span), "=",
                             sx.Access(acc.tensor, (sx.Name(u, span),), span), span)
            pre.append(nested(fill, [row, sx.Loop(u, sx.Num(0, span), width, (), span)]))
            made[acc.tensor] = sx.Access(name, (r,), span)
        name = made[acc.tensor].tensor
        read = sx.Access(name, (r, sx.Num(at, span)), span)
        if info.shape[0] != 1:  # the constant's column, a dimension of 1 (read at 0 as a broadcast column)
            one = declare(f"{acc.tensor}_{at}", info.dtype, (row.stop, sx.Num(1, span)), span)
            z = sx.Name(unique("z", taken | {row.var}), span)
            shifted = sx.Access(name, (r, sx.BinOp("+", read.indices[1], z, span)), span)
            copy = sx.Assign(sx.Access(one, (r, z), span), "=", shifted, span)
            pre.append(nested(copy, [row, sx.Loop(z.id, sx.Num(0, span), sx.Num(1, span), (), span)]))
            read = sx.Access(one, (r, sx.Num(0, span)), span)
        made[acc.tensor, at] = read
        return read

    def leaf(st: sx.Assign, loops: tuple[sx.Loop, ...], top_writes: set[str]) -> tuple[list[sx.Stmt], sx.Stmt]:
        first = st.target.indices[0] if st.target.indices else None
        rows = [lp for lp in loops if isinstance(first, sx.Name) and lp.var == first.id and from_zero(lp)]
        scalars = [a for a in accesses(st.value) if _scalar(a, program) and a.tensor not in top_writes]
        if st.op != "=" or not rows or not scalars:
            return [], st
        pre: list[sx.Stmt] = []
        made: dict = {}
        new: dict[int, sx.Expr] = {id(a): column(a, rows[0], pre, made) for a in scalars}
        return pre, replace(st, value=substituted(st.value, new))

    return rechecked(program, decls, hoisted(kernel.body, leaf))


def _number(e: sx.Expr) -> int:
    assert isinstance(e, sx.Num)  # (_scalar's reads)
    return int(e.value)


def _scalar(acc: sx.Access, program) -> bool:
    """A read of a declared 1-D tensor at a number (`gam[0]`), not padded."""
    info = program.tensors.get(acc.tensor)
    return info is not None and len(info.shape) == 1 and acc.fill is None and len(acc.indices) == 1 \
        and isinstance(acc.indices[0], sx.Num) and isinstance(info.shape[0], int)
