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
for r1..: Y[..] op= e1; for r2..: Y[..] op= e2 ..` whose stored indices are the outer loops' plain variables. The
same object when there is none."""
from __future__ import annotations

from tilec.compiler.rewrite import perfect_nest, rechecked, taken_names
from tilec.compiler.sum_split import chained
from tilec.lang import syntax as sx


def split_continued_reductions(program):
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    body: list[sx.Stmt] = []
    for top in kernel.body:
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
        if not loops or not isinstance(update, sx.Assign) or update.target != init.target or update.op == "=":
            return None
        ops.add(update.op)
    return (outer, init, reductions) if len(ops) == 1 else None
