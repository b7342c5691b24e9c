"""Pairwise squared distances, `Dm[i, j] += (A[i, k] - B[j, k]) * (A[i, k] - B[j, k])` (torch.cdist squared,
k-means, an RBF kernel), are no form a rule maps: the sum reads a difference, not one tensor or a product. Written
by hand such a kernel expands the square, |a|^2 - 2 a.b + |b|^2, and does the cross term on TensorE; the two norms
ride along in the same matmul as one more row of the contraction, so the result leaves PSUM finished:

    aa[i] = 0;  for k: aa[i] += A[i, k] * A[i, k]          (row sums of squares, one pass each)
    bb[j] = 0;  for k: bb[j] += B[j, k] * B[j, k]
    Aa[i, k] = -2 * A[i, k];  Aa[i, K] = 1                  (A with a column of ones: K + 1 columns)
    Ba[j, k] = B[j, k];       Ba[j, K] = bb[j]              (B with its norms as that column)
    Dm[i, j] = aa[i];  for k in 0..K + 1: Dm[i, j] += Aa[i, k] * Ba[j, k]   (aa along the output's rows: the bias)

The temporaries are f32 (the expansion's terms are not rounded to a narrower input's dtype). The expansion
cancels where a row of A is near a row of B: the result's error is then relative to |a|^2 + |b|^2, not to the
distance (tests say so). Done for a top-level nest `for i, j: Dm[i, j] = 0; for k: Dm[i, j] += d * d` with d the
same difference written twice (`P - Q` or `Q - P`), P and Q reads of plain loop variables, P indexed by i and k,
Q by j and k, Dm by i and j; the same object when there is none (the rules' refusal stands)."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.names import unique
from tilec.compiler.rewrite import perfect_nest, rechecked, taken_names
from tilec.lang import syntax as sx


def split_squared_distances(program):
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    body: list[sx.Stmt] = []
    for top in kernel.body:
        found = _distance_nest(top)
        if found is None:
            body.append(top)
            continue
        (i_loop, j_loop), k_loop, init, (p, q) = found
        names = {}
        for base in ("aa", "bb", "Aa", "Ba"):
            names[base] = unique(f"{init.target.tensor}_{base}", taken)
            taken.add(names[base])
        body += _expanded(names, i_loop, j_loop, k_loop, init, p, q, decls)
    return rechecked(program, decls, body)


def _distance_nest(top: sx.Stmt):
    """((the i loop, the j loop), the k loop, the init, (P, Q)) of such a nest, or None."""
    outer, last = perfect_nest(top)
    if len(outer) != 1 or not isinstance(last, sx.Loop) or len(last.body) != 2 or not _from_zero(last):
        return None
    init, k_nest = last.body
    if not (isinstance(init, sx.Assign) and init.op == "=" and init.value == sx.Num(0)):
        return None
    reduced, update = perfect_nest(k_nest)
    if len(reduced) != 1 or not isinstance(update, sx.Assign) or update.op != "+=" or update.target != init.target:
        return None
    i, j, k = outer[0].var, last.var, reduced[0].var
    if init.target.indices != (sx.Name(i), sx.Name(j)):
        return None
    v = update.value
    if not (isinstance(v, sx.BinOp) and v.op == "*" and v.lhs == v.rhs and isinstance(v.lhs, sx.BinOp)
            and v.lhs.op == "-"):
        return None
    p, q = v.lhs.lhs, v.lhs.rhs
    if _indexed_by(q, {i, k}) and _indexed_by(p, {j, k}):
        p, q = q, p
    if not (_indexed_by(p, {i, k}) and _indexed_by(q, {j, k})):
        return None
    return (outer[0], last), reduced[0], init, (p, q)


def _from_zero(lp: sx.Loop) -> bool:
    return isinstance(lp.start, sx.Num) and lp.start.value == 0


def _indexed_by(e: sx.Expr, names: set[str]) -> bool:
    """e is a plain read whose indices are exactly these loop variables, each once."""
    if not isinstance(e, sx.Access) or e.fill is not None:
        return False
    ids = [ix.id for ix in e.indices if isinstance(ix, sx.Name)]
    return len(ids) == len(e.indices) == len(names) and set(ids) == names


def _expanded(names: dict[str, str], i_loop: sx.Loop, j_loop: sx.Loop, k_loop: sx.Loop, init: sx.Assign,
              p: sx.Access, q: sx.Access, decls: list[sx.Decl]) -> list[sx.Stmt]:
    """The statements of the module docstring, their declarations appended to decls."""
    span = init.span
    wide = sx.BinOp("+", k_loop.stop, sx.Num(1), span)
    for name, rows in (("aa", i_loop), ("bb", j_loop)):
        decls.append(sx.Decl(names[name], sx.TensorType("f32", (rows.stop,), span), span))
    for name, rows in (("Aa", i_loop), ("Ba", j_loop)):
        decls.append(sx.Decl(names[name], sx.TensorType("f32", (rows.stop, wide), span), span))

    def at(name: str, *ix: sx.Expr) -> sx.Access:
        return sx.Access(name, tuple(ix), span)

    def loop(lp: sx.Loop, *stmts: sx.Stmt, stop: sx.Expr | None = None) -> sx.Loop:
        return sx.Loop(lp.var, lp.start, stop or lp.stop, stmts, lp.span)

    i, j, kk = (sx.Name(lp.var, span) for lp in (i_loop, j_loop, k_loop))
    out: list[sx.Stmt] = []
    for norm, rows, x in (("aa", i_loop, p), ("bb", j_loop, q)):
        row = sx.Name(rows.var, span)
        out.append(loop(rows, sx.Assign(at(names[norm], row), "=", sx.Num(0), span),
                        loop(k_loop, sx.Assign(at(names[norm], row), "+=", sx.BinOp("*", x, x, span), span))))
    scaled = sx.BinOp("*", sx.Num(-2), p, span)
    out += [loop(i_loop, loop(k_loop, sx.Assign(at(names["Aa"], i, kk), "=", scaled, span))),
            loop(i_loop, sx.Assign(at(names["Aa"], i, k_loop.stop), "=", sx.Num(1), span)),
            loop(j_loop, loop(k_loop, sx.Assign(at(names["Ba"], j, kk), "=", q, span))),
            loop(j_loop, sx.Assign(at(names["Ba"], j, k_loop.stop), "=", at(names["bb"], j), span))]
    product = sx.BinOp("*", at(names["Aa"], i, kk), at(names["Ba"], j, kk), span)
    update = sx.Assign(init.target, "+=", product, span)
    out.append(loop(i_loop, loop(j_loop, replace(init, value=at(names["aa"], i)),
                                 loop(k_loop, update, stop=wide))))
    return out
