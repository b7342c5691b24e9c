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

from tilec.compiler.exprs import accesses, const_value
from tilec.compiler.names import unique
from tilec.compiler.rewrite import from_zero, rechecked, resolved, taken_names
from tilec.compiler.schedule import PMAX
from tilec.compiler.sum_split import init_and_sum
from tilec.lang import syntax as sx


def extra_tile(k_loop: sx.Loop, sizes) -> bool:
    """Whether one more contraction row (the augmented form's column) costs a contraction tile of its own: K a
    multiple of the partitions (D = 128: TensorE's work doubles, sqdist 4.05x). The norm along the output's
    columns is then added on the PSUM eviction instead, from a row replicated on every partition once
    (eviction_fusion's row steps); elsewhere the extra row is free and the augmented form's single eviction is
    the faster (4096 x 4096 x 127: 378.8 us against 391.2; x 64: 325.7 against 359.9)."""
    k = const_value(k_loop.stop, sizes)
    return k is not None and k % PMAX == 0


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
        body += _expanded(names, i_loop, j_loop, k_loop, init, p, q, decls, extra_tile(k_loop, program.sizes))
    return rechecked(program, decls, body)


def _distance_nest(top: sx.Stmt):
    """((the i loop, the j loop), the k loop, the init, (P, Q)) of such a nest, or None."""
    found = init_and_sum(top)
    if found is None:
        return None
    outer, init, reduced, update = found
    if len(outer) != 2 or len(reduced) != 1 or not from_zero(outer[1]) or init.value != sx.Num(0):
        return None
    last = outer[1]
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


def _indexed_by(e: sx.Expr, names: set[str]) -> bool:
    """e is a plain read whose indices are exactly these loop variables, each once."""
    if not isinstance(e, sx.Access) or e.fill is not None:
        return False
    ids = [ix.id for ix in e.indices if isinstance(ix, sx.Name)]
    return len(ids) == len(e.indices) == len(names) and set(ids) == names


def _expanded(names: dict[str, str], i_loop: sx.Loop, j_loop: sx.Loop, k_loop: sx.Loop, init: sx.Assign,
              p: sx.Access, q: sx.Access, decls: list[sx.Decl], on_eviction: bool) -> list[sx.Stmt]:
    """The statements of the module docstring, their declarations appended to decls (on_eviction: the matmul of
    P and Q themselves, -2 its factor, bb added on its eviction: `Dm = aa[i]; Dm += -2 P Q; Dm = Dm + bb[j]`)."""
    span = init.span
    wide = sx.BinOp("+", k_loop.stop, sx.Num(1), span)
    for name, rows in (("aa", i_loop), ("bb", j_loop)):
        decls.append(sx.Decl(names[name], sx.TensorType("f32", (rows.stop,), span), span))
    for name, rows in (("Aa", i_loop), ("Ba", j_loop)) if not on_eviction else ():
        decls.append(sx.Decl(names[name], sx.TensorType("f32", (rows.stop, wide), span), span))

    def at(name: str, *ix: sx.Expr) -> sx.Access:
        return sx.Access(name, tuple(ix), span)

    def loop(lp: sx.Loop, *stmts: sx.Stmt, stop: sx.Expr | None = None) -> sx.Loop:
        return sx.Loop(lp.var, lp.start, stop or lp.stop, stmts, lp.span)

    i = sx.Name(i_loop.var, span)
    out: list[sx.Stmt] = []
    for norm, rows, x in (("aa", i_loop, p), ("bb", j_loop, q)):
        row = sx.Name(rows.var, span)
        out.append(loop(rows, sx.Assign(at(names[norm], row), "=", sx.Num(0), span),
                        loop(k_loop, sx.Assign(at(names[norm], row), "+=", sx.BinOp("*", x, x, span), span))))
    scaled = sx.BinOp("*", sx.Num(-2), p, span)
    terms = (at(names["aa"], i), at(names["bb"], sx.Name(j_loop.var, span)))
    if on_eviction:
        return out + on_eviction_form((i_loop, j_loop, k_loop), init.target, (scaled, q), terms)
    return out + augmented(names, (i_loop, j_loop, k_loop), init.target, (scaled, q), terms)


def on_eviction_form(loops: tuple[sx.Loop, sx.Loop, sx.Loop], target: sx.Access, operands: tuple[sx.Expr, sx.Expr],
                     terms: tuple[sx.Expr, sx.Expr | None], reader: sx.Stmt | None = None) -> list[sx.Stmt]:
    """`target[i, j] = row_term; for k: target += P * Q`, then `column_term` added along the output's columns on
    the eviction (`Y[i, j] = target[i, j] + column_term`: the reader's statement, or in place on target): the row's
    term is the matmul's bias column, the column's a row replicated on every partition (eviction_fusion)."""
    (i_loop, j_loop, k_loop), span = loops, target.span
    (p, q), (row_term, column_term) = operands, terms

    def loop(lp: sx.Loop, *stmts: sx.Stmt) -> sx.Loop:
        return sx.Loop(lp.var, lp.start, lp.stop, stmts, lp.span)

    product = sx.BinOp("*", p, q, span)
    out: list[sx.Stmt] = [loop(i_loop, loop(j_loop, sx.Assign(target, "=", row_term, span),
                                            loop(k_loop, sx.Assign(target, "+=", product, span))))]
    if reader is None and column_term is not None:
        reader = loop(i_loop, loop(j_loop, sx.Assign(target, "=", sx.BinOp("+", target, column_term, span), span)))
    return out + ([reader] if reader is not None else [])


def augmented(names: dict[str, str], loops: tuple[sx.Loop, sx.Loop, sx.Loop], target: sx.Access,
              operands: tuple[sx.Expr, sx.Expr], terms: tuple[sx.Expr, sx.Expr]) -> list[sx.Stmt]:
    """`target[i, j] = row_term; for k in 0..K + 1: target += Aa[i, k] * Ba[j, k]` with Aa = [P | 1] and Ba =
    [Q | column_term] (names["Aa"], names["Ba"], declared by the caller with K + 1 columns): P Q^T plus a term of
    the row (the start: a bias along the output's partitions) and one of the column (the extra row of the
    contraction)."""
    (i_loop, j_loop, k_loop), span = loops, target.span
    (p, q), (row_term, column_term) = operands, terms
    wide = sx.BinOp("+", k_loop.stop, sx.Num(1), span)
    i, j, k = (sx.Name(lp.var, span) for lp in loops)

    def at(name: str, *ix: sx.Expr) -> sx.Access:
        return sx.Access(name, tuple(ix), span)

    def loop(lp: sx.Loop, *stmts: sx.Stmt, stop: sx.Expr | None = None) -> sx.Loop:
        return sx.Loop(lp.var, lp.start, stop or lp.stop, stmts, lp.span)

    product = sx.BinOp("*", at(names["Aa"], i, k), at(names["Ba"], j, k), span)
    return [loop(i_loop, loop(k_loop, sx.Assign(at(names["Aa"], i, k), "=", p, span))),
            loop(i_loop, sx.Assign(at(names["Aa"], i, k_loop.stop), "=", sx.Num(1), span)),
            loop(j_loop, loop(k_loop, sx.Assign(at(names["Ba"], j, k), "=", q, span))),
            loop(j_loop, sx.Assign(at(names["Ba"], j, k_loop.stop), "=", column_term, span)),
            loop(i_loop, loop(j_loop, sx.Assign(target, "=", row_term, span),
                              loop(k_loop, sx.Assign(target, "+=", product, span), stop=wide)))]


def split_row_column_terms(program):
    """The expansion written out, `ab[i, j] += A[i, k] * B[j, k]` then `Dm[i, j] = aa[i] - 2 * ab[i, j] + bb[j]`
    (one reader of the sum, a sum of terms of which one is the sum times a constant and each other reads the row's
    loop variable alone or the column's alone): the terms ride in the contraction as distance_split's do, the row's
    as its start, the column's as one more row of the operands, and the reader becomes a copy of the finished sum
    (an eviction, not an HBM round trip: a column's vector is no eviction epilogue). Done for the contractions
    scale_split takes (P read at (i, k), Q at (j, k)); the same object when there is none."""
    from tilec.compiler.exprs import product_factors
    from tilec.compiler.scale_split import (_contraction, _only_reader, _reader_vars, _renamed, _vars, _with_value,
                                            moved_reads, written_from)
    from tilec.compiler.sum_split import _terms
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    changed = False
    body: list[list[sx.Stmt]] = [[st] for st in kernel.body]
    for n, top in enumerate(kernel.body):
        found = _contraction(top, kernel.outputs)
        reader = _only_reader(kernel.body, n, found[1].target.tensor) if found else None
        if found is None or reader is None or None in found[2]:
            continue
        (loops, update, (p, q)), (m, st) = found, reader
        at = _reader_vars(kernel.body[m], st, update.target.tensor, loops)
        terms = _terms(st.value, 1)
        own = [(sign, t) for sign, t in terms if any(a.tensor == update.target.tensor for a in accesses(t))]
        if at is None or len(own) != 1:
            continue
        factors, const = product_factors(own[0][1])
        if factors != [_read_of(st, update)]:
            continue
        rest = [(sign, t) for sign, t in terms if not any(a.tensor == update.target.tensor for a in accesses(t))]
        rows = [(sign, _renamed(t, at[0], loops[0].var)) for sign, t in rest if _vars(t) <= {at[0]}]
        cols = [(sign, _renamed(t, at[1], loops[1].var)) for sign, t in rest if _vars(t) == {at[1]}]
        if len(rows) + len(cols) != len(rest) or not cols or written_from(kernel.body, n, moved_reads(rest)):
            continue
        span = update.span
        factor = own[0][0] * const
        scaled = p if factor == 1 else sx.BinOp("*", sx.Num(factor), p, span)
        late = [(sign, t) for sign, t in rest if _vars(t) == {at[1]}]
        copies = _in_order(p, (loops[0].var, loops[2].var)) and _in_order(q, (loops[1].var, loops[2].var))
        if (extra_tile(loops[2], program.sizes) or not copies) and _plain_terms(rows, late):
            # the column's terms added on the eviction (a row replicated on every partition), not as a
            # contraction row of their own: the reader adds them to the finished sum
            start = rows[0][1] if rows else sx.Num(0, span)
            body[n] = on_eviction_form((loops[0], loops[1], loops[2]), update.target, (scaled, q), (start, None))
            value = _read_of(st, update)
            for sign, t in late:
                value = sx.BinOp("+" if sign > 0 else "-", value, t, span)
            body[m] = [_with_value(kernel.body[m], st, value)]
            changed = True
            continue
        if not copies:  # (Ba[j, k] = B[k, j] would be a part of Ba that is no copy: a refusal)
            continue
        names = {base: unique(f"{update.target.tensor}_{base}", taken) for base in ("Aa", "Ba")}
        taken |= set(names.values())
        wide = sx.BinOp("+", loops[2].stop, sx.Num(1), span)
        decls += [sx.Decl(names[b], sx.TensorType("f32", (lp.stop, wide), span), span)
                  for b, lp in (("Aa", loops[0]), ("Ba", loops[1]))]
        body[n] = augmented(names, (loops[0], loops[1], loops[2]), update.target, (scaled, q),
                            (_signed_sum(rows, span), _signed_sum(cols, span)))
        body[m] = [_with_value(kernel.body[m], st, _read_of(st, update))]
    flat = [st for part in body for st in part]
    return resolved(program, replace(kernel, body=tuple(flat))) if changed and not decls else \
        rechecked(program, decls, flat)


def _in_order(e: sx.Expr, names: tuple[str, str]) -> bool:
    """e read at exactly these loop variables in this order (a part of an augmented operand is then a copy)."""
    return isinstance(e, sx.Access) and e.indices == tuple(sx.Name(n) for n in names)


def _plain_terms(rows: list[tuple[int, sx.Expr]], cols: list[tuple[int, sx.Expr]]) -> bool:
    """The row's terms one read added (the matmul's start: a bias column is a read as it is) or none, and the
    column's plain reads (each one step of the eviction's chain)."""
    return (not rows or len(rows) == 1 and rows[0][0] > 0 and isinstance(rows[0][1], sx.Access)) \
        and all(isinstance(t, sx.Access) for _, t in cols)


def _read_of(st: sx.Assign, update: sx.Assign) -> sx.Access:
    """The reader's read of the contraction's result."""
    return next(a for a in accesses(st.value) if a.tensor == update.target.tensor)


def _signed_sum(terms: list[tuple[int, sx.Expr]], span) -> sx.Expr:
    out: sx.Expr = sx.Num(0, span)
    for sign, t in terms:
        out = t if out == sx.Num(0) and sign > 0 else sx.BinOp("+" if sign > 0 else "-", out, t, span)
    return out
