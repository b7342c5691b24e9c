"""A row chain's mean and variance in one pass over X: VectorE's bn_stats / bn_aggr instead of two ScalarE passes.

A layernorm written as `mu = mean(X); d = X - mu; v = mean(d * d)` is built by the row chain (build_rowchain.py) as
two ScalarE passes over X, each an activation kept only for its row sums (reduce_res): the first sums -X / N into
-mu, the second squares X with bias -mu and sums. The second needs the first's column, so X is read in three phases
(mean, variance, output) and must survive two phase boundaries. NISA has the one-pass pair [NISA bn_stats,
bn_aggr]: bn_stats of up to 512 elements per partition writes (count, mean, variance * count) of the even and of the
odd elements (6 values), and one bn_aggr over all the chunks' triples gives (mean, variance), the population
variance mean((x - mean)^2), computed in fp32 on VectorE:

    mu_neg_parts = (P, K)                              stats = (P, F / 512 * 6)
    for cc: act(discard, X[:, cc], copy, scale=-1/N,   for cc: for cs: bn_stats(stats[:, (cc, cs) * 6], X[:, cc, cs])
                total=mu_neg_parts[:, cc])             mv = (P, 2); bn_aggr(mv, stats)
    mu_neg = sum(mu_neg_parts)                         mu_neg = act(mv[:, 0], copy, scale=-1)      (ScalarE)
    v_parts = (P, K)                                   (the variance's readers read mv[:, 1] * N)
    for cc: act(discard, X[:, cc], square, bias=mu_neg,
                total=v_parts[:, cc])
    v_col = sum(v_parts)

The rewrite is made on the built (and chunked) chain's statements when both passes are there as above: the mean's
activation of X with scale -1/N and no bias, and the squares' activation of the same X slices with bias the mean's
column (nothing else read between them). Numerics: bn_aggr's variance is the program's mean of squared deviations
computed another way in fp32 (Chan's merge of per-chunk means and squared deviations), never E[x^2] - mu^2.
"""
from __future__ import annotations

import dataclasses

from tilec.compiler import ir
from tilec.compiler.ir import Act, Aff, Alloc, Buf, Loop, Reduce, Sl, Stmt, Term, View, whole

BN_STATS = 6  # values per partition one bn_stats writes


def one_pass_stats(stmts: list[Stmt], free: int, fresh, fmax: int) -> list[Stmt] | None:
    """The chain's statements with the mean and variance passes over X rewritten into bn_stats / bn_aggr (module
    docstring), or None when the chain does not have them as expected. `fmax`: bn_stats' elements per partition
    at most (the target's bn_stats record)."""
    k = len(stmts) - 1
    block = stmts[k] if stmts else None
    if not (isinstance(block, ir.Block) and len(block.body) == 1 and isinstance(block.body[0], Loop)):
        return None
    outer = block.body[0]
    body = _rewritten(list(outer.body), free, fresh, fmax)
    if body is None:
        return None
    return stmts[:k] + [dataclasses.replace(block, body=(dataclasses.replace(outer, body=tuple(body)),))]


def _passes(s: Stmt) -> list[Act]:
    """The activations kept for their row sums in `s` (a chunk loop or one activation)."""
    return [x for x in ir.walk((s,)) if isinstance(x, Act) and x.total is not None]


def _rewritten(body: list[Stmt], free: int, fresh, fmax: int) -> list[Stmt] | None:
    # the mean pass: one statement (a chunk loop, or the activation itself) with one summing activation of X
    for i, s in enumerate(body):
        acts = _passes(s)
        if len(acts) != 1 or not _mean_like(acts[0], free):
            continue
        mean = acts[0]
        fold, col = _fold_after(body, i, mean)
        if col is None:
            continue
        j = next((n for n in range(i + 1, len(body)) if _passes(body[n])), None)
        if j is None:
            return None
        sq_acts = _passes(body[j])
        if len(sq_acts) != 1 or not _square_of(sq_acts[0], mean, col):
            return None
        square = sq_acts[0]
        sq_fold, var = _fold_after(body, j, square)
        if var is None:
            return None
        return _rewrite(body, i, fold, j, sq_fold, mean, square, col, var, free, fresh, fmax)
    return None


def _mean_like(a: Act, free: int) -> bool:
    return a.func == "copy" and a.bias is None and isinstance(a.scale, float) and abs(a.scale * free + 1.0) < 1e-6 \
        and a.dst.buf.memory == "sbuf" and a.src.buf.memory == "sbuf" and a.src.buf.shape[1] == free


def _square_of(a: Act, mean: Act, col: Buf) -> bool:
    return a.func == "square" and a.scale == 1.0 and a.bias is not None and a.bias == whole(col) \
        and a.src == mean.src


def _fold_after(body: list[Stmt], i: int, act: Act) -> tuple[int | None, Buf | None]:
    """The column the summing activation's row sums end in: its total, or (chunked) the column a Reduce after the
    loop folds its partials into. Returns (index of that Reduce or None, the column)."""
    assert act.total is not None
    if isinstance(body[i], Act):
        return None, act.total.buf if act.total == whole(act.total.buf) else None
    parts = act.total.buf
    for n in range(i + 1, len(body)):
        s = body[n]
        if isinstance(s, Reduce) and s.op == "add" and s.src == whole(parts) and s.dst == whole(s.dst.buf):
            return n, s.dst.buf
        if isinstance(s, Loop):
            break
    return None, None


def _rewrite(body: list[Stmt], i: int, fold: int | None, j: int, sq_fold: int | None, mean: Act, square: Act,
             col: Buf, var: Buf, free: int, fresh, fmax: int) -> list[Stmt] | None:
    src = mean.src
    width = src.shape()[1]
    if width % fmax and width > fmax:
        return None
    piece = min(width, fmax)
    pieces = width // piece
    parts = free // piece
    rows = src.buf.shape[0] if src.idx[0] == ir.full(src.buf.shape[0]) else None
    if rows is None:
        return None
    stats = Buf(fresh("mv_stats"), "sbuf", "f32", (rows, parts * BN_STATS))
    mv = Buf(fresh("mv"), "sbuf", "f32", (rows, 2))
    line = mean.line
    # the chunk's position (cc * pieces) in units of bn_stats pieces
    col_sl = src.idx[-1]
    assert isinstance(col_sl, Sl)
    cs = Term("cs", piece, "TILE_BN")
    base = Aff(tuple(Term(t.var, t.coef // piece * BN_STATS, "") for t in col_sl.start.terms),
               col_sl.start.const // piece * BN_STATS)
    if any(t.coef % piece for t in col_sl.start.terms) or col_sl.start.const % piece:
        return None
    data = View(src.buf, src.idx[:-1] + (Sl(Aff(col_sl.start.terms + (cs,), col_sl.start.const), piece, 1,
                                             "TILE_BN"),))
    at = View(stats, (ir.full(rows), Sl(Aff(base.terms + (Term("cs", BN_STATS, ""),), base.const), BN_STATS, 1, "")))
    one = Reduce(at, data, "bn_stats", line)
    note = "for the mean and variance's pieces (TILE_BN columns: one bn_stats each)"
    stats_loop: Stmt = Loop("cs", pieces, (one,), "affine", "", line, note)
    if pieces == 1:
        stats_loop = Reduce(View(stats, (ir.full(rows), Sl(base, BN_STATS, 1, ""))), src, "bn_stats", line)
    # the mean pass, its activation replaced (its discarded output dropped)
    mean_pass = _replaced(body[i], mean, stats_loop)
    aggr: list[Stmt] = [Alloc(mv, line=line), Reduce(whole(mv), whole(stats), "bn_aggr", line),
            Act(whole(col), View(mv, (ir.full(rows), Sl(Aff(), 1))), "copy", scale=-1.0, line=line)]
    variance = View(mv, (ir.full(rows), Sl(Aff((), 1), 1)))
    drop = {j} | ({sq_fold} if sq_fold is not None else set())
    if square.total is not None and square.total.buf != var:
        drop |= {n for n, s in enumerate(body) if isinstance(s, Alloc) and s.buf == square.total.buf}
    drop |= {n for n, s in enumerate(body) if isinstance(s, Alloc) and s.buf == var}
    if mean.total is not None and mean.total.buf != col:
        drop |= {n for n, s in enumerate(body) if isinstance(s, Alloc) and s.buf == mean.total.buf}
    out: list[Stmt] = []
    for n, s in enumerate(body):
        if n in drop:
            continue
        if n == i:
            out += [Alloc(stats, line=line), mean_pass]
            if fold is None:
                out += aggr
            continue
        if n == fold:
            out += aggr
            continue
        s2 = _reading(s, var, variance, free)
        if s2 is None:
            return None
        out.append(s2)
    # the discarded outputs no statement writes any more
    return unused_allocs_dropped(out)


def _replaced(s: Stmt, old: Act, new: Stmt) -> Stmt:
    if s is old:
        return new
    if isinstance(s, Loop):
        body = [_replaced(x, old, new) for x in s.body]
        return dataclasses.replace(s, body=tuple(body))
    return s


def _reading(s: Stmt, var: Buf, variance: View, free: int) -> Stmt | None:
    """`s` reading the variance (mv's second column) where it read the sum of squares `var`: an activation's
    scale times N (the sum was N times the variance); None when another statement reads it."""
    if not any(v.buf == var for x in ir.walk((s,)) for v in ir.views(x)):
        return s
    if isinstance(s, Act) and s.src == whole(var) and s.bias != whole(var) and isinstance(s.scale, float) \
            and s.total is None and s.dst.buf != var:
        return dataclasses.replace(s, src=variance, scale=s.scale * free)
    return None


def unused_allocs_dropped(body: list[Stmt]) -> list[Stmt]:
    """The body without the allocations (at any loop depth) of tiles no instruction touches."""
    used = {v.buf.name for s in ir.walk(tuple(body)) for v in ir.views(s)}

    def kept(stmts: list[Stmt]) -> list[Stmt]:
        out: list[Stmt] = []
        for s in stmts:
            if isinstance(s, Alloc) and s.buf.name not in used:
                continue
            if isinstance(s, Loop):
                s = dataclasses.replace(s, body=tuple(kept(list(s.body))))
            out.append(s)
        return out
    return kept(body)


def last_add_on_gpsimd(stmts: list[Stmt]) -> list[Stmt]:
    """In each loop of VectorE steps over PSUM banks (ct), a product made into PSUM only to be added to a row's
    broadcast (b) into an SBUF tile: the product written into that tile instead, and the addition done there by
    GpSimdE (which reads SBUF only), so that VectorE, busy with bn_stats, keeps one instruction per bank."""
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, (Loop, ir.Block)):
            body = last_add_on_gpsimd(list(s.body))
            if isinstance(s, Loop) and s.var == "ct":
                body = _moved(body)
            s = dataclasses.replace(s, body=tuple(body))
        out.append(s)
    return out


def _moved(body: list[Stmt]) -> list[Stmt]:
    if len(body) < 2 or not isinstance(body[-1], ir.Binary) or not isinstance(body[-2], ir.Binary):
        return body
    prod, add = body[-2], body[-1]
    acc = prod.dst.buf
    if not (add.op == "add" and not add.engine and acc.memory == "psum" and add.a == whole(acc)
            and prod.dst == whole(acc) and add.dst.buf.memory == "sbuf" and add.b.buf.memory == "sbuf"
            and prod.op == "multiply" and not prod.engine):
        return body
    if sum(v.buf == acc for s in body for x in ir.walk((s,)) for v in ir.views(x)) != 2:
        return body  # the product is read elsewhere
    head = [s for s in body[:-2] if not (isinstance(s, Alloc) and s.buf == acc)]
    return head + [dataclasses.replace(prod, dst=add.dst), dataclasses.replace(add, a=add.dst, engine="gpsimd")]
