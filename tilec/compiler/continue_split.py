"""Several reductions continuing one another into one output (issue 13), as a user writes two layers' products
added together in two loops,

    for i, j:
      Y[i, j] = init
      for k: Y[i, j] += A[i, k] * B[k, j]
      for k: Y[i, j] += C[i, k] * D[k, j]

The rules map one init and one reduction per tensor (lower.py merges an init with the reduction after it). The
nest is the same chain sum_split.py makes of `Y += A B + C D`: each reduction but the last into an f32 temporary
started from the one before, the last into Y started from the last temporary,

    for i, j:  Y_1[i, j] = init;     for k: Y_1[i, j] += A[i, k] * B[k, j]
    for i, j:  Y[i, j] = Y_1[i, j];  for k: Y[i, j] += C[i, k] * D[k, j]

which the contraction builder runs as a matmul whose eviction adds its start (the residual form), so two matmuls of
the same shapes compile to the kernel of `Y += A B + C D`. The reductions may differ in their loops' extents and
operands; they share the operator (`+=` after `+=`: a sum continued with `max=` is another function). Partial sums
stay f32 (not rounded to a narrower Y's dtype between the two). Done for a top-level nest `for outer: Y[..] = init;
for r1..: Y[..] op= e1; for r2..: Y[..] op= e2 ..` whose stored indices are the outer loops' plain variables. A
reduction in a nest of its own right after such a nest (`for i, j: for k: Y[i, j] += C[i, k] * D[k, j]`, outer loops
of the same extents, storing at the same indices) joins it first: nothing runs between the two. The same object
when there is none."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.lower import rename_vars
from tilec.compiler.rewrite import nested, perfect_nest, rechecked, taken_names
from tilec.compiler.sum_split import chained
from tilec.lang import syntax as sx


def split_continued_reductions(program):
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    body: list[sx.Stmt] = []
    for top in _joined(kernel.body):
        found = _continued(top)
        if found is None:
            body.append(top)
            continue
        outer, init, reductions = found
        body += chained(outer, init, [perfect_nest(red) for red in reductions], taken, decls)
    return rechecked(program, decls, body)


def _continued(top: sx.Stmt):
    """(outer loops, init, the reduction nests) of such a nest, or None."""
    outer, last = perfect_nest(top)
    if not isinstance(last, sx.Loop) or len(last.body) < 3:
        return None
    outer = outer + [last]
    init, *reductions = last.body
    if not (isinstance(init, sx.Assign) and init.op == "="):
        return None
    names = [lp.var for lp in outer]
    if not all(isinstance(ix, sx.Name) and ix.id in names for ix in init.target.indices):
        return None
    ops = set()
    for red in reductions:
        loops, update = perfect_nest(red)
        if not loops or not isinstance(update, sx.Assign) or update.target != init.target or update.op == "=" \
                or init.target.tensor in {a.tensor for a in accesses(update.value)}:
            return None  # (a read of the running value is not a continued sum)
        ops.add(update.op)
    return (outer, init, reductions) if len(ops) == 1 else None


def _joined(body: tuple[sx.Stmt, ...]) -> list[sx.Stmt]:
    """body with each reduction nest that continues the init-and-reduction nest just before it moved into it."""
    out: list[sx.Stmt] = []
    for top in body:
        joined = _join(out[-1], top) if out else None
        if joined is None or _continued(joined) is None:
            out.append(top)
        else:
            out[-1] = joined
    return out


def _join(prev: sx.Stmt, top: sx.Stmt) -> sx.Stmt | None:
    """prev with top's reduction appended to its innermost body, or None (see the module's text)."""
    outer, last = perfect_nest(prev)
    if not isinstance(last, sx.Loop) or len(last.body) < 2 or not isinstance(last.body[0], sx.Assign) \
            or last.body[0].op != "=":
        return None
    outer = outer + [last]
    init = last.body[0]
    loops, update = perfect_nest(top)
    mine, reduced = loops[:len(outer)], loops[len(outer):]
    if not reduced or not isinstance(update, sx.Assign) or update.op == "=" or \
            [(lp.start, lp.stop) for lp in mine] != [(lp.start, lp.stop) for lp in outer]:
        return None
    names = {lp.var: o.var for lp, o in zip(mine, outer)}
    if {lp.var for lp in reduced} & set(names.values()):
        return None  # (a summed variable named like one of prev's loops)
    target = replace(update.target, indices=tuple(rename_vars(ix, names) for ix in update.target.indices))
    update = replace(update, target=target, value=rename_vars(update.value, names))
    if update.target != init.target:
        return None
    inner = nested(update, reduced)
    return nested(replace(last, body=last.body + (inner,)), outer[:-1])
