"""A batched matrix-vector product as written from its formula (user20; lead19's next step),

    for b in 0..B, m in 0..M:
      y[b, m] = 0
      for k in 0..K:
        y[b, m] += A[b, m, k] * x[b, k]

is no form select_conv maps: with the batch index b read by both operands and no output index of x, x[b, k] reads
as a depthwise window that would also sum. The batched matmul with x as a [B, K, 1] matrix is (lead19 measured it
1.61x of the floor at 8 x 1024 x 1024, the same as the hand-written form), so the statement is rewritten to it, the
vector and the result copied through temporaries with a unit last dimension:

    for b, k, z in 0..1:  x_col[b, k, z] = x[b, k]
    for b, m, z in 0..1:  y_col[b, m, z] = 0;  for k: y_col[b, m, z] += A[b, m, k] * x_col[b, k, z]
    for b, m:             y[b, m] = y_col[b, m, 0]

Done for a top-level nest `for batch.., m: y[batch.., m] = init; for k: y[..] += A[batch.., m, k] * x[batch.., k]`
or a vector times a matrix, `x[batch.., k] * A[batch.., k, m]` (a masked sum over a sequence; any order of the two
factors, constant factors kept, at least one batch index, every index a plain loop variable
of a loop from 0). The same object when there is none."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import product_factors
from tilec.compiler.names import unique
from tilec.compiler.rewrite import nested, perfect_nest, rechecked, substituted, taken_names
from tilec.lang import syntax as sx


def split_batched_matvec(program):
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    body: list[sx.Stmt] = []
    for top in kernel.body:
        found = _matvec(top)
        if found is None:
            body.append(top)
            continue
        outer, init, k_loop, update, vec = found
        x_col = unique(f"{vec.tensor}_col", taken)
        y_col = unique(f"{init.target.tensor}_col", taken | {x_col})
        taken |= {x_col, y_col}
        z = unique("z", {lp.var for lp in outer} | {k_loop.var} | taken)
        decls += [_column(kernel, program, vec.tensor, x_col), _column(kernel, program, init.target.tensor, y_col)]
        body += _rewritten(outer, init, k_loop, update, vec, x_col, y_col, z)
    return rechecked(program, decls, body)


def _matvec(top: sx.Stmt):
    """(outer loops, init, the summed loop, the update, the vector's read) of a batched mat-vec nest, or None."""
    loops, last = perfect_nest(top)
    if not isinstance(last, sx.Loop) or len(last.body) != 2 or not _from_zero(last):
        return None
    loops = loops + [last]
    init, k_loop = loops[-1].body
    if not (isinstance(init, sx.Assign) and init.op == "=" and isinstance(k_loop, sx.Loop)):
        return None
    inner, update = perfect_nest(k_loop)
    if len(inner) != 1 or not _from_zero(k_loop) or not isinstance(update, sx.Assign) or update.op != "+=" \
            or update.target != init.target:
        return None
    names = [lp.var for lp in loops]
    if _plain(init.target) != names or len(names) < 2:
        return None
    factors, _ = product_factors(update.value)
    reads = [f for f in factors if isinstance(f, sx.Access) and f.fill is None]
    if len(factors) != 2 or len(reads) != 2:
        return None
    batch, m, k = names[:-1], names[-1], inner[0].var
    by_len = sorted(reads, key=lambda f: len(f.indices))
    vec, mat = by_len[0], by_len[1]
    if _plain(mat) not in (batch + [m, k], batch + [k, m]) or _plain(vec) != batch + [k] or mat.tensor == vec.tensor:
        return None  # (A[b, m, k] x[b, k], or a vector times a matrix: x[b, k] A[b, k, m], a masked sum over k)
    return loops, init, k_loop, update, vec


def _from_zero(lp: sx.Loop) -> bool:
    return isinstance(lp.start, sx.Num) and lp.start.value == 0


def _plain(a: sx.Access) -> list[str] | None:
    """The access's indices as loop-variable names, or None when one is not a plain name."""
    if not all(isinstance(ix, sx.Name) for ix in a.indices):
        return None
    return [ix.id for ix in a.indices if isinstance(ix, sx.Name)]


def _column(kernel: sx.Kernel, program, tensor: str, name: str) -> sx.Decl:
    """A temporary of `tensor`'s dtype and shape with a last dimension of 1."""
    t = next((p.type for p in kernel.params if p.name == tensor), None) or \
        next(d.type for d in kernel.decls if d.name == tensor)
    return sx.Decl(name, replace(t, shape=t.shape + (sx.Num(1, t.span),)), t.span)


def _rewritten(outer, init, k_loop, update, vec, x_col, y_col, z) -> list[sx.Stmt]:
    span = update.span
    zn, zloop = sx.Name(z, span), sx.Loop(z, sx.Num(0, span), sx.Num(1, span), (), span)
    y = init.target
    y_z = replace(y, tensor=y_col, indices=y.indices + (zn,))
    vec_z = replace(vec, tensor=x_col, indices=vec.indices + (zn,))
    copy_in = nested(sx.Assign(replace(vec, tensor=x_col, indices=vec.indices + (zn,)), "=", vec, span),
                     list(outer[:-1]) + [k_loop, zloop])
    new_update = replace(update, target=y_z, value=substituted(update.value, {id(vec): vec_z}))
    new_k = replace(k_loop, body=(new_update,))
    main = nested(replace(zloop, body=(replace(init, target=y_z), new_k)), outer)
    copy_out = nested(sx.Assign(y, "=", replace(y, tensor=y_col, indices=y.indices + (sx.Num(0, span),)), span),
                      outer)
    return [copy_in, main, copy_out]
