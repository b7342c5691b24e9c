"""A contraction of a sum of products, `Y[i, j] += A[i, k] * B[k, j] + C[i, k] * D[k, j]` (two layers' outputs
added in one statement, the real part of a complex product), is no form a rule maps: a contraction multiplies two
tensors. It is the first product's contraction, then the next one's started from that result (the contraction's
form with a tensor start, a bias or a residual):

    Y_1[i, j] = init;       for k: Y_1[i, j] += A[i, k] * B[k, j]
    Y[i, j] = Y_1[i, j];    for k: Y[i, j] += C[i, k] * D[k, j]

n terms take n - 1 f32 temporaries (the partial sums are not rounded to a narrower Y's dtype); a subtracted term
keeps its sign (`- C * D` is `(-1) * C * D`, a constant factor). Done for a top-level nest `for outer: Y[..] = init;
for reduced..: Y[..] += t1 + t2 ..` whose every term reads a reduced loop variable (a term constant along the sum
would be summed K times: left to the rules) and whose stored indices are plain loop variables. The same object when
there is none."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.names import unique
from tilec.compiler.reduce_split import index_vars
from tilec.compiler.rewrite import nested, perfect_nest, rechecked, taken_names
from tilec.lang import syntax as sx


def split_summed_products(program):
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    body: list[sx.Stmt] = []
    for top in kernel.body:
        found = _sum_nest(top)
        if found is None:
            body.append(top)
            continue
        outer, init, reduced, update, terms = found
        steps = [(reduced, replace(update, value=term if sign > 0 else sx.Neg(term, term.span)))
                 for sign, term in terms]
        body += chained(outer, init, steps, taken, decls)
    return rechecked(program, decls, body)


def chained(outer: list[sx.Loop], init: sx.Assign, steps: list[tuple[list[sx.Loop], sx.Assign]], taken: set[str],
            decls: list[sx.Decl]) -> list[sx.Stmt]:
    """One nest per step (its reduced loops, its update): each but the last into a new f32 temporary (declared into
    `decls`), started from the one before; the first from `init`'s value, the last into init's target."""
    body: list[sx.Stmt] = []
    start: sx.Expr = init.value
    for n, (reduced, update) in enumerate(steps):
        target = init.target
        if n < len(steps) - 1:
            name = unique(f"{init.target.tensor}_{n + 1}", taken)
            taken.add(name)
            decls.append(temporary(name, init.target, outer))
            target = replace(init.target, tensor=name)
        sums = nested(replace(update, target=target), reduced)
        body.append(nested(sx.Loop(outer[-1].var, outer[-1].start, outer[-1].stop,
                                   (replace(init, target=target, value=start), sums), outer[-1].span), outer[:-1]))
        start = target
    return body


def init_and_sum(top: sx.Stmt):
    """(outer loops, init, the reduced loops, the update) of a nest `for outer: Y[..] = init; for reduced..: Y[..]
    += e` whose stored indices are the outer loops' plain variables, or None."""
    outer, last = perfect_nest(top)
    if not outer or not isinstance(last, sx.Loop) or len(last.body) != 2:
        return None
    outer = outer + [last]
    init, k_loop = last.body
    if not (isinstance(init, sx.Assign) and init.op == "=" and isinstance(k_loop, sx.Loop)):
        return None
    reduced, update = perfect_nest(k_loop)
    if not reduced or not isinstance(update, sx.Assign) or update.op != "+=" or update.target != init.target:
        return None
    names = [lp.var for lp in outer]
    if not all(isinstance(ix, sx.Name) and ix.id in names for ix in init.target.indices):
        return None
    return outer, init, reduced, update


def _sum_nest(top: sx.Stmt):
    """(outer loops, init, the reduced loops, the update, its signed terms) of such a nest, or None."""
    found = init_and_sum(top)
    if found is None:
        return None
    outer, init, reduced, update = found
    terms = _terms(update.value, 1)
    summed = {lp.var for lp in reduced}
    if len(terms) < 2 or not all(_vars(t) & summed for _, t in terms):
        return None
    return outer, init, reduced, update, terms


def _terms(e: sx.Expr, sign: int) -> list[tuple[int, sx.Expr]]:
    if isinstance(e, sx.BinOp) and e.op in "+-":
        return _terms(e.lhs, sign) + _terms(e.rhs, sign if e.op == "+" else -sign)
    return [(sign, e)]


def _vars(e: sx.Expr) -> set[str]:
    """The loop variables the reads of e index with."""
    return set().union(*(index_vars(a) for a in accesses(e)))


def temporary(name: str, target: sx.Access, outer: list[sx.Loop]) -> sx.Decl:
    """An f32 tensor shaped like the stored region: each index's loop extent, in the target's index order."""
    stops = {lp.var: lp.stop for lp in outer}
    shape = tuple(stops[ix.id] for ix in target.indices if isinstance(ix, sx.Name))
    return sx.Decl(name, sx.TensorType("f32", shape, target.span), target.span)
