"""Transposed convolutions (ConvTranspose2d, a U-Net's up-conv, issue 13), written the ways a user writes them:

    Y[n, k, y, x] += X[n, c, y / 2, x / 2] * Wt[c, k, y % 2, x % 2]            # y in 0..2H, x in 0..2W
    Y[n, k, 2 * y + a, 2 * x + b] += X[n, c, y, x] * Wt[c, k, a, b]             # y in 0..H, a in 0..2
    Y[n, k, y, a, x, b] += X[n, c, y, x] * Wt[c, k, a, b]                       # Y declared [N, K, H, 2, W, 2]

Kernel 2, stride 2: each input pixel's (a, b) tap is its own 1x1 conv, so the whole layer is one matmul whose
stationary rows are Wt's (k, a, b) (a free reshape of Wt to [C, K*2*2]: select_conv.trailing_rows), followed by a
depth-to-space permute of its result into Y. Two rewrites make that form:

split_floor_loops (before view_split): in a nest with a reduction, a loop `for y in 0..E` whose variable the reads
index only as `y / d` and `y % d` (one constant d dividing E) and the stores index plainly is the two loops
`for y_q in 0..E/d, y_r in 0..d`, y being `d * y_q + y_r` (exact: floor division and remainder of that number).
view_split then views the store's `2 * y_q + y_r` as a split dimension (the third spelling above).

split_transposed_convs (after view_split): a contraction `Y[.., k, y, a, x, b] (= init) += X[..] * W[.., k, a, b]`
whose stationary W ends in output variables (k, a, b) that are apart in Y's indices is computed into a temporary T
of Y's dtype with those variables next to each other (`T[n, k, a, b, y, x]`, the matmul's rows), then copied
`Y[n, k, y, a, x, b] = T[n, k, a, b, y, x]` (a permute; the rounding to Y's dtype happens once either way).
Both return the same object when they have nothing to do."""
from __future__ import annotations

import itertools
from dataclasses import replace
from typing import cast

from tilec.compiler.exprs import accesses
from tilec.compiler.lower import size_value
from tilec.compiler.names import unique
from tilec.compiler.rewrite import from_zero, leaves, nested, rechecked, resolved, taken_names
from tilec.compiler.sum_split import init_and_sum
from tilec.lang import syntax as sx


def split_floor_loops(program):
    body = [_split_top(program, top) for top in program.kernel.body]
    if all(new is old for new, old in zip(body, program.kernel.body)):
        return program
    return resolved(program, replace(program.kernel, body=tuple(body)))


def _split_top(program, top: sx.Stmt) -> sx.Stmt:
    if not any(isinstance(st, sx.Assign) and st.op != "=" for st, _ in leaves(top)):
        return top
    taken = {v for _, loops in leaves(top) for v in loops}

    def walk(st: sx.Stmt) -> sx.Stmt:
        if not isinstance(st, sx.Loop):
            return st
        st = replace(st, body=tuple(walk(c) for c in st.body))
        d = _divisor(program, st)
        if d is None:
            return st
        q, r = unique(f"{st.var}_q", taken), unique(f"{st.var}_r", taken | {f"{st.var}_q"})
        taken.update((q, r))
        body = tuple(_substituted(c, st.var, q, r, d) for c in st.body)
        inner = sx.Loop(r, sx.Num(0, st.span), sx.Num(d, st.span), body, st.span)
        return sx.Loop(q, st.start, _quotient(st.stop, d, program.sizes), (inner,), st.span)
    return walk(top)


def _divisor(program, lp: sx.Loop) -> int | None:
    """d when the loop's variable is read only as `v / d`, `v % d` and stored plainly (see the module's text)."""
    if not from_zero(lp):
        return None
    found: set[int] = set()
    for st, _ in leaves(lp):
        if not isinstance(st, sx.Assign) or not all(_plain_or_absent(ix, lp.var) for ix in st.target.indices):
            return None
        for acc in accesses(st.value):
            for ix in acc.indices:
                if not _divided(ix, lp.var, found):
                    return None
    if len(found) != 1:
        return None
    d, = found
    return d if d >= 2 and size_value(lp.stop, program.sizes) % d == 0 else None


def _plain_or_absent(ix: sx.Expr, var: str) -> bool:
    return isinstance(ix, sx.Name) or var not in names_in(ix)


def _divided(e: sx.Expr, var: str, found: set[int]) -> bool:
    """Every use of `var` in e is `var / d` or `var % d` (d collected into found)."""
    if isinstance(e, sx.BinOp) and e.op in "/%" and e.lhs == sx.Name(var) and isinstance(e.rhs, sx.Num) \
            and isinstance(e.rhs.value, int):
        found.add(e.rhs.value)
        return True
    if isinstance(e, sx.Name):
        return e.id != var
    if isinstance(e, sx.BinOp):
        return _divided(e.lhs, var, found) and _divided(e.rhs, var, found)
    if isinstance(e, sx.Neg):
        return _divided(e.x, var, found)
    return var not in names_in(e)


def names_in(e: sx.Expr) -> set[str]:
    """The names an expression uses (loop variables, sizes), through indices, calls and operators."""
    if isinstance(e, sx.Name):
        return {e.id}
    if isinstance(e, sx.BinOp):
        return names_in(e.lhs) | names_in(e.rhs)
    if isinstance(e, sx.Neg):
        return names_in(e.x)
    if isinstance(e, sx.Call):
        return set().union(*map(names_in, e.args)) if e.args else set()
    if isinstance(e, sx.Access):
        return set().union(*map(names_in, e.indices)) if e.indices else set()
    return set()


def _quotient(stop: sx.Expr, d: int, sizes: dict[str, int]) -> sx.Expr:
    """stop / d as the size expression a user would write: `H` of `2 * H`, else the number."""
    if isinstance(stop, sx.BinOp) and stop.op == "*":
        for f, g in ((stop.lhs, stop.rhs), (stop.rhs, stop.lhs)):
            if isinstance(f, sx.Num) and f.value == d:
                return g
    return sx.Num(size_value(stop, sizes) // d, stop.span)


def _substituted(st: sx.Stmt, var: str, q: str, r: str, d: int) -> sx.Stmt:
    if isinstance(st, sx.Loop):
        return replace(st, body=tuple(_substituted(c, var, q, r, d) for c in st.body))
    whole = sx.BinOp("+", sx.BinOp("*", sx.Num(d), sx.Name(q)), sx.Name(r))

    def index(e: sx.Expr, stored: bool) -> sx.Expr:
        if isinstance(e, sx.Name) and e.id == var:
            return replace(whole, span=e.span)
        if isinstance(e, sx.BinOp) and e.lhs == sx.Name(var) and e.rhs == sx.Num(d) and e.op in "/%":
            return sx.Name(q if e.op == "/" else r, e.span)
        if isinstance(e, sx.BinOp):
            return replace(e, lhs=index(e.lhs, stored), rhs=index(e.rhs, stored))
        if isinstance(e, sx.Neg):
            return replace(e, x=index(e.x, stored))
        return e

    def read(a: sx.Access) -> sx.Expr:
        return replace(a, indices=tuple(index(ix, False) for ix in a.indices))
    target = replace(st.target, indices=tuple(index(ix, True) for ix in st.target.indices))
    return replace(st, target=target, value=sx.map_reads(st.value, read))


def split_transposed_convs(program):
    taken = taken_names(program.kernel)
    decls: list[sx.Decl] = []
    body: list[sx.Stmt] = []
    for top in program.kernel.body:
        found = _conv_nest(program, top)
        if found is None:
            body.append(top)
            continue
        outer, init, reduced, update, order, tail = found
        stops = {lp.var: lp.stop for lp in outer}
        start = init.value
        if isinstance(start, sx.Access) and [ix.id for ix in start.indices if isinstance(ix, sx.Name)] != tail:
            start, fill = _widened(program, start, tail, stops, taken, decls)  # bias[k] as bias_w[k, a, b]
            body.append(fill)
        name = unique(f"{init.target.tensor}_t", taken)
        taken.add(name)
        dtype = program.tensors[init.target.tensor].dtype
        decls.append(sx.Decl(name, sx.TensorType(dtype, tuple(stops[v] for v in order), init.span), init.span))
        t = sx.Access(name, tuple(sx.Name(v, init.target.span) for v in order), init.target.span)
        sums = nested(replace(update, target=t), reduced)
        last = outer[-1]
        body.append(nested(replace(last, body=(replace(init, target=t, value=start), sums)), outer[:-1]))
        body.append(nested(replace(last, body=(sx.Assign(init.target, "=", t, update.span),)), outer[:-1]))
    return rechecked(program, decls, body)


def _conv_nest(program, top: sx.Stmt):
    """(outer loops, init, reduced loops, update, T's index order) of a transposed conv's nest, or None."""
    found = init_and_sum(top)
    if found is None:
        return None
    outer, init, reduced, update = found
    out = [ix.id if isinstance(ix, sx.Name) else None for ix in init.target.indices]
    reads = accesses(update.value)
    if len(reads) != 2 or not (isinstance(update.value, sx.BinOp) and update.value.op == "*"):
        return None
    extents = {lp.var: size_value(lp.stop, program.sizes) for lp in outer}
    tails = []
    for w in reads:
        tail = trailing_outputs([ix.id if isinstance(ix, sx.Name) else None for ix in w.indices], out)
        shape = [d if isinstance(d, int) else size_value(d, program.sizes) for d in program.tensors[w.tensor].shape]
        if tail and shape[len(shape) - len(tail):] == [extents[v] for v in tail]:
            tails.append(tail)
    if not tails:
        return None
    tail = min(tails, key=lambda t: out.index(t[0]))  # the rows come first (select_conv's choice of stationary)
    rest = [v for v in out if v not in tail]
    at = len([v for v in out[:out.index(tail[0])] if v not in tail])
    order = rest[:at] + tail + rest[at:]
    good = order != out and _start_ok(init.value, tail)
    return (outer, init, reduced, update, order, tail) if good else None


def _start_ok(start: sx.Expr, tail: list[str]) -> bool:
    """The init is a constant or a read of plain variables among the merged rows (a per-channel bias)."""
    if not isinstance(start, sx.Access):
        return not names_in(start) and not accesses(start)
    names = [ix.id for ix in start.indices if isinstance(ix, sx.Name)]
    return start.fill is None and len(names) == len(start.indices) and set(names) <= set(tail) and \
        names == [v for v in tail if v in names]


def _widened(program, start: sx.Access, tail: list[str], stops: dict, taken: set[str], decls: list):
    """(the read of a copy of `start` over every merged row, the nest filling it): the matmul's rows take one
    bias value each."""
    name = unique(f"{start.tensor}_w", taken)
    taken.add(name)
    dtype = program.tensors[start.tensor].dtype
    decls.append(sx.Decl(name, sx.TensorType(dtype, tuple(stops[v] for v in tail), start.span), start.span))
    wide = sx.Access(name, tuple(sx.Name(v, start.span) for v in tail), start.span)
    loops = [sx.Loop(v, sx.Num(0), stops[v], (), start.span) for v in tail]
    return wide, nested(sx.Assign(wide, "=", start, start.span), loops)


def trailing_outputs(names: list[str | None], out: list) -> list[str]:
    """A stationary operand's last indices (`names`) when they are two or more output variables and no other index
    of it is one (W[c, k, a, b] of a transposed conv: [k, a, b]), and some output variable is not among them (the
    other operand's columns); [] if not."""
    if None in names or set(out) <= set(names):
        return []
    tail = [cast(str, v) for v in itertools.takewhile(lambda v: v in out, reversed(names))][::-1]
    if len(tail) < 2 or any(v in out for v in names[:len(names) - len(tail)]):
        return []
    return tail
