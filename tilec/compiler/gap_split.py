"""A reduction over dimensions that are not one run, `mu[c] += X[n, c, h, w] / (N * H * W)` (batch norm's
statistics over the batch and the image, C in between): no rule maps it (a reduction lays the kept indices on
partitions and reduces one run of consecutive dimensions). The last run of reduced dimensions goes first, into an
f32 temporary indexed by the others, then the rest:

    mu_part[n, c] = 0; for h, w: mu_part[n, c] += X[n, c, h, w] / (N * H * W)    # a row reduction
    mu[c] = 0; for n: mu[c] += mu_part[n, c]                                     # a column reduction

X is read once (by the first step); the temporary has N * C elements. Applied again while a reduction has gaps
(three runs take two temporaries). Done for a top-level nest `for kept..: T[kept..] = init; for reduced..: T[kept..]
op= value` (op +=, max= or min=; loops from 0; the stored indices the kept loops' variables), whose value reads a
tensor at every loop variable (its order gives the dimensions). Sums are added in another order than the
reference's loop order (f32 rounding); max= and min= give the same values."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.names import unique
from tilec.compiler.reduce_split import IDENTITY, identity
from tilec.compiler.rewrite import from_zero, nested, perfect, read_order, rechecked, taken_names
from tilec.lang import syntax as sx

def split_gapped_reductions(program):
    """The program with each such reduction in two steps (repeatedly); the same object when there is none."""
    taken = taken_names(program.kernel)
    decls: list[sx.Decl] = []
    body = list(program.kernel.body)
    changed = True
    while changed:
        changed = False
        out: list[sx.Stmt] = []
        for top in body:
            parts = _gapped(top)
            if parts is None:
                out.append(top)
                continue
            out += _split(parts, taken, decls)
            changed = True
        body = out
    return rechecked(program, decls, body)


def _gapped(top: sx.Stmt):
    """(kept loops, init, reduced loops, reduction, the read's dimension order, the last reduced run) of a nest of
    the module's form whose reduced dimensions are not one run; else None."""
    kept_loops, inner = perfect(top)  # (inner: the loop whose body is the init and the reduced loops)
    if not isinstance(inner, sx.Loop) or len(inner.body) != 2:
        return None
    kept_loops, block = kept_loops + [inner], inner.body
    init, rest = block
    red_loops, red = perfect(rest)
    if not (isinstance(init, sx.Assign) and init.op == "=" and isinstance(red, sx.Assign) and red.op in IDENTITY):
        return None
    loops = kept_loops + red_loops
    if not red_loops or any(not from_zero(lp) for lp in loops):
        return None
    kept = [lp.var for lp in kept_loops]
    if red.target != init.target or [ix.id if isinstance(ix, sx.Name) else None for ix in red.target.indices] \
            != kept:
        return None
    if any(a.tensor == red.target.tensor for a in accesses(red.value) + accesses(init.value)):
        return None
    order = read_order(red.value, {lp.var for lp in loops})
    if order is None:
        return None
    reduced = {lp.var for lp in red_loops}
    runs = _runs([v in reduced for v in order])
    if len(runs) < 2:
        return None
    start, stop = runs[-1]
    return kept_loops, init, red_loops, red, order, order[start:stop]


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """The [start, stop) runs of True in flags."""
    out: list[tuple[int, int]] = []
    for k, f in enumerate(flags):
        if f and (not out or out[-1][1] != k):
            out.append((k, k + 1))
        elif f:
            out[-1] = (out[-1][0], k + 1)
    return out


def _split(parts, taken: set[str], decls: list[sx.Decl]) -> list[sx.Stmt]:
    kept_loops, init, red_loops, red, order, last = parts
    span = red.span
    by_var = {lp.var: lp for lp in kept_loops + red_loops}
    part_vars = [v for v in order if v not in last]
    name = unique(f"{red.target.tensor}_part", taken)
    decls.append(sx.Decl(name, sx.TensorType("f32", tuple(by_var[v].stop for v in part_vars), span), span))
    part = sx.Access(name, tuple(sx.Name(v, span) for v in part_vars), span)
    start = sx.Assign(part, "=", identity(red.op, span), span)
    stage1 = _nest([by_var[v] for v in part_vars], (start, nested(replace(red, target=part), [by_var[v] for v in last])))
    rest = [lp for lp in red_loops if lp.var not in last]
    stage2_red = nested(replace(red, value=part), rest)
    stage2 = _nest(kept_loops, (init, stage2_red))
    return [stage1, stage2]


def _nest(loops: list[sx.Loop], body: tuple[sx.Stmt, ...]) -> sx.Stmt:
    inner = replace(loops[-1], body=body)
    return nested(inner, loops[:-1])
