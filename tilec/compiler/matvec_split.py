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
or a vector times a matrix, `x[batch.., k] * A[batch.., k, m]` (a masked sum over a sequence); the vector may be a
product of factors reading only the batch indices and k (`m[b, s] / cnt[b]`, masked mean pooling: computed into
x_col; f32 beside an f32 matrix, the matrix's 16-bit dtype where the tolerance allows it: _vector_dtype), in any
order, constant factors kept, at least one batch index, every
index a plain loop variable of a loop from 0. The same object when there is none."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses, const_value, product_factors
from tilec.compiler.names import unique
from tilec.compiler.operand_split import split_factor
from tilec.compiler.rewrite import from_zero, nested, rechecked, taken_names
from tilec.compiler.sum_split import init_and_sum
from tilec.lang import syntax as sx
from tilec.tolerance import rounded_operand


def split_batched_matvec(program):
    def rewrite(found, taken: set[str], decls: list[sx.Decl]) -> list[sx.Stmt]:
        outer, init, k_loop, update, mat, vec, scale = found
        x_col = unique(f"{accesses(vec)[0].tensor}_col", taken)
        y_col = unique(f"{init.target.tensor}_col", taken | {x_col})
        taken |= {x_col, y_col}
        z = unique("z", {lp.var for lp in outer} | {k_loop.var} | taken)
        x_dtype = program.tensors[vec.tensor].dtype if isinstance(vec, sx.Access) else \
            _vector_dtype(update, mat, program)
        assert x_dtype is not None  # (_matvec keeps only vectors with a dtype)
        x_shape = tuple(lp.stop for lp in outer[:-1]) + (k_loop.stop,)
        decls += [_column(x_col, x_dtype, x_shape, vec.span), _column(y_col, program.tensors[init.target.tensor].dtype,
                                                                      tuple(lp.stop for lp in outer), vec.span)]
        return _rewritten(outer, init, k_loop, update, (mat, vec, scale), x_col, y_col, z)
    return _each_nest(program, lambda top: _matvec(top, program), rewrite)


def _each_nest(program, find, rewrite):
    """The program with each top-level nest `find` recognises replaced by `rewrite(found, taken names, decls)`'s
    statements (the declarations it appends added); the same object when there is none."""
    taken = taken_names(program.kernel)
    decls: list[sx.Decl] = []
    body: list[sx.Stmt] = []
    for top in program.kernel.body:
        found = find(top)
        body += [top] if found is None else rewrite(found, taken, decls)
    return rechecked(program, decls, body)


def _matvec(top: sx.Stmt, program):
    """(outer loops, init, the summed loop, the update, the matrix's read, the vector, the constant factor) of a
    batched mat-vec nest, or None. The vector is the product of the factors other than the matrix: each reads only
    the batch indices and k (`m[b, k] / cnt[b]`)."""
    found = init_and_sum(top)
    if found is None:
        return None
    loops, init, inner, update = found
    if len(inner) != 1 or not from_zero(loops[-1]) or not from_zero(inner[0]):
        return None
    k_loop = inner[0]
    names = [lp.var for lp in loops]
    if _plain(init.target) != names or len(names) < 2:
        return None
    batch, m, k = names[:-1], names[-1], inner[0].var
    factors, scale = product_factors(update.value)
    mults: list[sx.Expr] = []
    divisors: list[sx.Expr] = []
    for f in factors:
        fm, fd = split_factor(f, set(batch + [k]))
        mults, divisors = mults + fm, divisors + fd

    def matrix(f: sx.Expr) -> sx.Access | None:  # the matrix's read, through a widening `f32(..)` (widen.py)
        read = f.args[0] if isinstance(f, sx.Call) and f.fn == "f32" and len(f.args) == 1 else f
        return read if isinstance(read, sx.Access) and read.fill is None \
            and _plain(read) in (batch + [m, k], batch + [k, m]) else None
    found = [f for f in mults if matrix(f) is not None]
    if len(found) != 1:
        return None
    rest = [f for f in mults if f is not found[0]]
    mat = matrix(found[0])
    assert mat is not None
    mats = [mat]
    reads = [a for f in rest + divisors for a in accesses(f)]
    if not rest or any(a.fill is not None or a.tensor == mats[0].tensor or a.tensor == init.target.tensor
                       or not set(_plain(a) or [m]) <= set(batch + [k]) for a in reads):
        return None
    if not any(_plain(a) == batch + [k] for a in reads):
        return None  # (a vector over the batch and k: some factor reads them all)
    vec = rest[0]
    for f in rest[1:]:
        vec = sx.BinOp("*", vec, f, f.span)
    for d in divisors:
        vec = sx.BinOp("/", vec, d, d.span)
    if not isinstance(vec, sx.Access) and _vector_dtype(update, mats[0], program) is None:
        return None  # (a computed vector is f32, as the reference computes it; the matrix would be copied to f32)
    if found[0] is not mats[0] and isinstance(vec, sx.Access):
        return None  # (a widened matrix beside a read vector: two dtypes for TensorE)
    return loops, init, k_loop, update, mats[0], vec, scale


def _vector_dtype(update: sx.Assign, mat: sx.Access, program) -> str | None:
    """The dtype of a computed vector's column: f32 beside an f32 matrix (as the reference computes it); the
    matrix's 16-bit dtype where the sum is stored in that dtype, which the tolerance allows (a computed factor
    beside a 16-bit read, rounded once: tolerance.rounded_operand; bf16 masked mean pooling); else None."""
    dtype = program.tensors[mat.tensor].dtype
    if dtype == "f32":
        return dtype
    return dtype if rounded_operand(update, {n: t.dtype for n, t in program.tensors.items()}) == dtype else None


def _plain(a: sx.Access) -> list[str] | None:
    """The access's indices as loop-variable names, or None when one is not a plain name."""
    if not all(isinstance(ix, sx.Name) for ix in a.indices):
        return None
    return [ix.id for ix in a.indices if isinstance(ix, sx.Name)]


def _column(name: str, dtype: str, shape: tuple[sx.Expr, ...], span) -> sx.Decl:
    """A temporary of that shape with a last dimension of 1."""
    return sx.Decl(name, sx.TensorType(dtype, shape + (sx.Num(1, span),), span), span)


def _rewritten(outer, init, k_loop, update, product, x_col, y_col, z) -> list[sx.Stmt]:
    mat, vec, scale = product
    span = update.span
    zn, zloop = sx.Name(z, span), sx.Loop(z, sx.Num(0, span), sx.Num(1, span), (), span)
    y = init.target
    y_z = replace(y, tensor=y_col, indices=y.indices + (zn,))
    vec_idx = tuple(sx.Name(lp.var, span) for lp in outer[:-1]) + (sx.Name(k_loop.var, span), zn)
    vec_z = sx.Access(x_col, vec_idx, span)
    copy_in = nested(sx.Assign(vec_z, "=", vec, span), list(outer[:-1]) + [k_loop, zloop])
    value: sx.Expr = sx.BinOp("*", mat, vec_z, span)
    if scale != 1.0:
        value = sx.BinOp("*", value, sx.Num(scale, span), span)
    new_update = replace(update, target=y_z, value=value)
    new_k = replace(k_loop, body=(new_update,))
    main = nested(replace(zloop, body=(replace(init, target=y_z), new_k)), outer)
    copy_out = nested(sx.Assign(y, "=", replace(y, tensor=y_col, indices=y.indices + (sx.Num(0, span),)), span),
                      outer)
    return [copy_in, main, copy_out]


def split_vector_matrix(program):
    """A vector times a matrix with no batch and several output indices, `for t, d: Y[t, d] = 0; for l: Y[t, d] +=
    w[l] * Hs[l, t, d]` (ELMo's scalar mix): the vector reads none of the output's indices and the matrix more than
    one, so neither operand can be a matmul's stationary side (select_conv refuses it). With a unit first dimension
    on the vector and the result it is an ordinary matmul (M = 1), the result copied back:

        for z in 0..1, l:     w_row[z, l] = w[l]
        for z in 0..1, t, d:  Y_row[z, t, d] = 0;  for l: Y_row[z, t, d] += w_row[z, l] * Hs[l, t, d]
        for t, d:             Y[t, d] = Y_row[0, t, d]

    Done for a top-level nest whose init is a constant, whose one summed loop k indexes the vector (`w[k]`, a plain
    read) and the matrix as its first index, then the output's indices in order; the same object when there is
    none."""
    def rewrite(found, taken: set[str], decls: list[sx.Decl]) -> list[sx.Stmt]:
        outer, init, k_loop, update, vec, mat = found
        span = update.span
        w_row = unique(f"{vec.tensor}_row", taken)
        y_row = unique(f"{init.target.tensor}_row", taken)
        z = unique("z", {lp.var for lp in outer} | {k_loop.var} | taken)
        one = sx.Num(1, span)
        decls += [sx.Decl(w_row, sx.TensorType(program.tensors[vec.tensor].dtype, (one, k_loop.stop), span), span),
                  sx.Decl(y_row, sx.TensorType(program.tensors[init.target.tensor].dtype,
                                               (one,) + tuple(lp.stop for lp in outer), span), span)]
        zn, zloop = sx.Name(z, span), sx.Loop(z, sx.Num(0, span), one, (), span)
        w_z = sx.Access(w_row, (zn, sx.Name(k_loop.var, span)), span)
        y = init.target
        y_z = replace(y, tensor=y_row, indices=(zn,) + y.indices)
        summed = replace(k_loop, body=(replace(update, target=y_z, value=sx.BinOp("*", w_z, mat, span)),))
        inner = replace(outer[-1], body=(replace(init, target=y_z), summed))
        return [nested(sx.Assign(w_z, "=", vec, span), [zloop, k_loop]),
                nested(inner, [zloop] + list(outer[:-1])),
                nested(sx.Assign(y, "=", replace(y, tensor=y_row, indices=(sx.Num(0, span),) + y.indices), span),
                       outer)]
    return _each_nest(program, lambda top: _vector_matrix(top, program), rewrite)


def _vector_matrix(top: sx.Stmt, program):
    """(outer loops, init, the summed loop, the update, the vector's read, the matrix's read) of such a nest, or
    None."""
    found = init_and_sum(top)
    if found is None:
        return None
    outer, init, inner, update = found
    names = [lp.var for lp in outer]
    if len(inner) != 1 or len(names) < 2 or _plain(init.target) != names or const_value(init.value) is None \
            or not all(from_zero(lp) for lp in outer + inner):
        return None
    k = inner[0].var
    reads = accesses(update.value)
    if not (isinstance(update.value, sx.BinOp) and update.value.op == "*" and len(reads) == 2
            and all(r is f for r, f in zip(reads, (update.value.lhs, update.value.rhs)))):
        return None
    vec = next((r for r in reads if _plain(r) == [k]), None)
    mat = next((r for r in reads if r is not vec and _plain(r) == [k] + names and r.fill is None), None)
    if vec is None or mat is None or vec.fill is not None:
        return None
    return outer, init, inner[0], update, vec, mat
