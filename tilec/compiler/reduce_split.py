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

import math
from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.lower import uses_names
from tilec.compiler.names import unique
from tilec.compiler.rewrite import from_zero, hoisted, leaves, nested, read_order, rechecked, resolved, taken_names
from tilec.lang import syntax as sx


def split_broadcast_reductions(program):
    from tilec.compiler.operand_split import contraction_groups
    """The program with each such reduction's expression computed into a temporary first; the same object when
    there is none."""
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    starts: dict[str, set[str]] = {}  # the tensors each tensor's assignments read (a reduction's initial value)
    for top in kernel.body:
        for st, _ in leaves(top):
            if isinstance(st, sx.Assign) and st.op == "=":
                starts.setdefault(st.target.tensor, set()).update(a.tensor for a in accesses(st.value))

    def splittable(st: sx.Assign, loops: tuple[sx.Loop, ...], top_writes: set[str]) -> bool:
        if st.op not in ("+=", "max=", "min=") or not all(isinstance(ix, sx.Name) for ix in st.target.indices):
            return False
        kept = {ix.id for ix in st.target.indices if isinstance(ix, sx.Name)}
        loop_vars = [lp.var for lp in loops]
        reduced = set(loop_vars) - kept
        if not reduced or not kept <= set(loop_vars) or len(kept) != len(st.target.indices):
            return False
        if any(not from_zero(lp) for lp in loops):
            return False
        reads = accesses(st.value)
        if len(reads) < 2 or any(a.fill is not None for a in reads) or any(a.tensor in top_writes for a in reads):
            return False
        if st.op == "+=" and isinstance(st.value, sx.BinOp) and st.value.op == "*" and len(reads) == 2:
            return False  # a product of two reads summed: a contraction's form (max= of a product is not one)
        if contraction_groups(st, loops, top_writes, program) is not None:
            return False  # a contraction of two expressions: each computed on its own (operand_split.py)
        along = [bool(index_vars(a) & reduced) for a in reads]
        if st.op == "+=" and column_rows(st, loop_vars, program.tensors, starts.get(st.target.tensor, set())):
            return False  # the column rule reads the row itself (rules_colreduce: staged per free tile, broadcast)
        return any(along) and not all(along)

    def stmt(st: sx.Assign, loops: tuple[sx.Loop, ...], top_writes: set[str]) -> tuple[list[sx.Stmt], sx.Stmt]:
        """(nests to put before the top-level statement, the statement rewritten)."""
        if not splittable(st, loops, top_writes):
            return [], st
        span = st.value.span
        name = unique(f"{st.target.tensor}_terms", taken)
        by_var = {lp.var: lp for lp in loops}
        order = read_order(st.value, [lp.var for lp in loops]) or [lp.var for lp in loops]
        loops = tuple(by_var[v] for v in order)
        decls.append(sx.Decl(name, sx.TensorType("f32", tuple(lp.stop for lp in loops), span), span))
        idx = tuple(sx.Name(lp.var, span) for lp in loops)
        value = sizes_as_numbers(st.value, {lp.var for lp in loops}, program.sizes)
        fill = nested(sx.Assign(sx.Access(name, idx, span), "=", value, st.span), loops)
        return [fill], replace(st, value=sx.Access(name, idx, span))

    return rechecked(program, decls, hoisted(kernel.body, stmt))


def column_rows(st: sx.Assign, loop_vars: list[str], tensors, start: set[str]) -> bool:
    """`s[j] += abs(X[i, j] - c[j])`: a column sum of f32 reads (or all-bf16 ones, same_width) over all the loops
    (the same index order, the kept indices the trailing ones: no kept index before the reduced run) and of rows
    indexed by the kept indices in order. rules_colreduce computes the terms per tile with each row broadcast to the partitions, so the terms never
    go through HBM (column_l1 4096 x 4096: 599 -> see docs/notes/cols17.md)."""
    kept = [ix.id for ix in st.target.indices if isinstance(ix, sx.Name)]
    reads = accesses(st.value)
    full = [a for a in reads if len(a.indices) == len(loop_vars)]
    dtypes = {tensors[a.tensor].dtype for a in reads}
    if not full or not kept or not same_width(dtypes, tensors[st.target.tensor].dtype):
        return False
    order = [ix.id if isinstance(ix, sx.Name) else None for ix in full[0].indices]
    if sorted(map(str, order)) != sorted(loop_vars) or order[len(order) - len(kept):] != kept:
        return False
    plain = lambda a: [ix.id if isinstance(ix, sx.Name) else None for ix in a.indices]  # noqa: E731
    rows = [a for a in reads if a not in full]
    if any(a.tensor in start for a in rows):
        return False  # (a row that is also the initial value: the rule stages each once; split as before)
    return all(plain(a) == order for a in full) and all(plain(a) == kept for a in rows)


def same_width(reads: set[str], out: str) -> bool:
    """The dtypes a column sum reading rows takes whole: all f32, or all bf16 into a bf16 result (its terms are bf16
    arithmetic either way). A bf16 source with f32 rows or an f32 result keeps its f32 terms in HBM: the rule computes
    the terms in the source's dtype (test_cols17_rows' bf16 sources)."""
    return reads == {"f32"} or reads == {"bf16"} == {out}


def sizes_as_numbers(e: sx.Expr, loop_vars: set[str], sizes: dict[str, int]) -> sx.Expr:
    """e with each size named in its value (not in an index: `/ N` of a mean) replaced by its number, as the
    reduction rule's constant factor takes it (the element-wise rule takes numbers only)."""
    if isinstance(e, sx.Name) and e.id not in loop_vars and e.id in sizes:
        return sx.Num(sizes[e.id], e.span)
    if isinstance(e, sx.BinOp):
        return replace(e, lhs=sizes_as_numbers(e.lhs, loop_vars, sizes),
                       rhs=sizes_as_numbers(e.rhs, loop_vars, sizes))
    if isinstance(e, sx.Neg):
        return replace(e, x=sizes_as_numbers(e.x, loop_vars, sizes))
    if isinstance(e, sx.Call):
        return replace(e, args=tuple(sizes_as_numbers(a, loop_vars, sizes) for a in e.args))
    return e


def index_vars(a: sx.Access) -> set[str]:
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



IDENTITY = {"+=": 0.0, "max=": -math.inf, "min=": math.inf}


def split_total_reductions(program):
    """A reduction of a whole nest into one element, `s[0] = 0` then `for i, j: s[0] += X[i, j]` (a total sum, a
    dot product `s[0] += a[i] * b[i]`, a global max): no rule maps it (a reduction keeps at least one loop in the
    stored index to lay the rows on partitions). Computed in two steps, each an ordinary reduction:

        t[i] = 0; t[i] += X[i, j]            # rows to a column (f32; skipped when there is one loop)
        u[z, i] = t[i]                       # the column as one row (z in 0..1)
        s[z] = 0; s[z] += u[z, i]            # that row reduced into the element, its initial value kept

    Done when the element's initial value, a constant, is stored by the top-level statement right before the
    nest, the nest is perfect (one statement, loops from 0), the stored indices are all 0, and the value does not
    read the element's tensor. The same object when there is none. Sums are added in another order than the
    reference's loop order (f32 rounding), max= and min= give the same values."""
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    out: list[sx.Stmt] = []
    body = list(kernel.body)
    k, changed = 0, False
    while k < len(body):
        unit = _unit_loop(body[k])
        if unit is not None:  # `for z in 0..1: L[z] = 0; ..L[z] += ..`: the same as `L[0]`, spliced in
            body[k:k + 1] = unit
        pair = _total_pair(body, k)
        if pair is None:
            out.append(body[k])
            k += 1
            continue
        init, loops, red = pair
        out += _total_split(init, loops, red, taken, decls, program)
        changed = True
        k += 2
    if changed and not decls:  # (only dot products: rewritten without a temporary)
        return resolved(program, replace(kernel, body=tuple(out)))
    return rechecked(program, decls, out)


def _total_pair(body: list[sx.Stmt], k: int) -> tuple[sx.Assign, list[sx.Loop], sx.Assign] | None:
    init = body[k]
    if k + 1 >= len(body) or not isinstance(init, sx.Assign) or init.op != "=" or not _constant(init.value):
        return None
    if not init.target.indices or not all(_zero(ix) for ix in init.target.indices):
        return None
    loops: list[sx.Loop] = []
    st = body[k + 1]
    while isinstance(st, sx.Loop) and len(st.body) == 1:
        if not _zero(st.start):
            return None
        loops.append(st)
        st = st.body[0]
    if not loops or not isinstance(st, sx.Assign) or st.op not in IDENTITY:
        return None
    if st.target.tensor != init.target.tensor or len(st.target.indices) != len(init.target.indices) \
            or not all(_zero(ix) for ix in st.target.indices):
        return None
    reads = accesses(st.value)
    if not reads or any(a.tensor == st.target.tensor for a in reads):
        return None
    return init, loops, st


def _unit_loop(top: sx.Stmt) -> list[sx.Stmt] | None:
    """`for z in 0..1:` (the bound written as 1) around an element's start and its nest, z used only as a whole
    stored index (`L[z] = 0; for i: L[z] += r[i]`): the two statements with z as 0, the pair _total_pair takes; None
    otherwise (the loop is kept as written)."""
    if not (isinstance(top, sx.Loop) and from_zero(top) and isinstance(top.stop, sx.Num) and top.stop.value == 1
            and len(top.body) == 2):
        return None
    pair = [_stored_at_zero(st, top.var) for st in top.body]
    if any(st is None for st in pair) or _total_pair(pair, 0) is None:  # type: ignore[arg-type]
        return None
    return pair  # type: ignore[return-value]


def _stored_at_zero(top: sx.Stmt, var: str) -> sx.Stmt | None:
    """`top` with each stored index that is `var` alone written 0; None where `var` is used anywhere else."""
    if isinstance(top, sx.Loop):
        body = [_stored_at_zero(st, var) for st in top.body]
        if uses_names(top.start, {var}) or uses_names(top.stop, {var}) or any(st is None for st in body):
            return None
        return replace(top, body=tuple(body))  # type: ignore[arg-type]
    indices = tuple(sx.Num(0, ix.span) if isinstance(ix, sx.Name) and ix.id == var else ix
                    for ix in top.target.indices)
    if uses_names(top.value, {var}) or any(uses_names(ix, {var}) for ix in indices):
        return None
    return replace(top, target=replace(top.target, indices=indices))


def _total_split(init: sx.Assign, loops: list[sx.Loop], red: sx.Assign, taken: set[str],
                 decls: list[sx.Decl], program) -> list[sx.Stmt]:
    span = red.span
    out: list[sx.Stmt] = []
    first = loops[0]
    i = sx.Name(first.var, span)
    vars_ = {lp.var for lp in loops}
    names = taken | vars_
    zs = [sx.Name(unique("z", names), span) for _ in init.target.indices]
    z_loops = [sx.Loop(z.id, sx.Num(0, span), sx.Num(1, span), (), span) for z in zs]
    if len(loops) == 1 and _vector_terms(red, first, program):
        # one loop over vectors (a dot product `a[i] * b[i]`): the element's reduction over a unit loop, the
        # vectors read as one row each (select_reduce._unit_rows: build_longrows lays it over the partitions),
        # no row of terms through HBM
        target = replace(red.target, indices=tuple(zs))
        body: tuple[sx.Stmt, ...] = (sx.Assign(target, "=", init.value, init.span),
                                     replace(first, body=(replace(red, target=target),)))
        for zl in reversed(z_loops):
            body = (replace(zl, body=body),)
        return list(body)
    row_name = unique(f"{red.target.tensor}_row", taken)
    decls.append(sx.Decl(row_name, sx.TensorType("f32", tuple(sx.Num(1, span) for _ in zs) + (first.stop,), span),
                         span))
    row = sx.Access(row_name, tuple(zs) + (i,), span)
    if len(loops) == 1:  # one loop: its terms are the row
        value = sizes_as_numbers(red.value, vars_, program.sizes)
        out.append(nested(sx.Assign(row, "=", value, span), z_loops + loops))
    else:
        col_name = unique(f"{red.target.tensor}_rows", taken)
        decls.append(sx.Decl(col_name, sx.TensorType("f32", (first.stop,), span), span))
        col = sx.Access(col_name, (i,), span)
        start = sx.Assign(col, "=", identity(red.op, span), span)
        rows = nested(sx.Assign(col, red.op, red.value, span), loops[1:])
        out.append(sx.Loop(first.var, first.start, first.stop, (start, rows), first.span))
        out.append(nested(sx.Assign(row, "=", col, span), z_loops + [first]))
    target = replace(red.target, indices=tuple(zs))
    total: tuple[sx.Stmt, ...] = (sx.Assign(target, "=", init.value, init.span),
             sx.Loop(first.var, first.start, first.stop, (sx.Assign(target, red.op, row, span),), first.span))
    inner = total
    for zl in reversed(z_loops):
        inner = (replace(zl, body=inner),)
    out += list(inner)
    return out


def _vector_terms(red: sx.Assign, loop: sx.Loop, program) -> bool:
    """An expression of vectors read at the loop variable (`a[i] * b[i]`) long enough for build_longrows to lay
    the one row over the partitions (few_long_rows); a shorter one keeps its row of terms."""
    from tilec.compiler.build_longrows import few_long_rows
    from tilec.compiler.lower import size_value
    reads = accesses(red.value)
    if isinstance(red.value, sx.Access) or not all(
            len(a.indices) == 1 and isinstance(a.indices[0], sx.Name) and a.indices[0].id == loop.var for a in reads):
        return False
    dtype = program.tensors[reads[0].tensor].dtype
    return few_long_rows(1, size_value(loop.stop, program.sizes), dtype, False, False) is not None


def identity(op: str, span) -> sx.Expr:
    """The start of a reduction by `op` (`0`, `-inf`, `inf`) as an expression."""
    value = IDENTITY[op]
    return sx.Neg(sx.Num(math.inf, span), span) if value == -math.inf else sx.Num(value, span)


def _constant(e: sx.Expr) -> bool:
    return isinstance(e, sx.Num) or (isinstance(e, sx.Neg) and isinstance(e.x, sx.Num))


def _zero(e: sx.Expr) -> bool:
    return isinstance(e, sx.Num) and e.value == 0
