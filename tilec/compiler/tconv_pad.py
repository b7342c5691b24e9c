"""Transposed convolutions whose kernel is larger than their stride (DCGAN's 4x4 stride 2 padding 1, a 3x3 stride 2
padding 1 with output_padding 1), written in their phase form: output pixel (2y + a, 2x + b) sums, over the input
channels and the taps (t, u) of its phase, input pixel (y + a - t, x + b - u) (zero outside X) times tap
(2t + 1 - a, 2u + 1 - b) of Wt:

    Y[n, k, 2 * y + a, 2 * x + b] += (X[n, c, y + a - t, x + b - u] ?? 0) * Wt[c, k, 2 * t + 1 - a, 2 * u + 1 - b]

`split_padded_tconvs` rewrites such a nest into two that compile: every tap of every input pixel as one matmul over
Wt seen as [C, K*R*R] rows (tconv_split's kernel-2 form with R*R taps),

    T[n, k, r, q, y, x] = 0;  T[n, k, r, q, y, x] += X[n, c, y, x] * Wt[c, k, r, q]

then each output pixel the sum of the taps that reach it, grouped by the input pixel's offset d = -1, 0, 1 from y
(for that offset, phase a reads tap a + 1 - 2d for kernel 4 padding 1: one tap a term, `?? 0` outside T):

    Y[n, k, 2 * y + a, 2 * x + b] = init + sum over (d, e) of (T[n, k, a + kd, b + ke, y + d, x + e] ?? 0)

The offsets and taps are read off the statement by evaluating its indices at each phase and tap (any stride-2 kernel
and padding whose taps of one phase and offset are one tap); a nest it cannot express so is left as it is (then
refused at selection, select_conv._strided_store). T is fp32 (the terms summed once, as one accumulation would).
build_tconv.py fuses the parts back into one on-chip kernel when it can."""
from __future__ import annotations

from tilec.compiler.exprs import accesses
from tilec.compiler.lower import affine_index, size_value
from tilec.compiler.names import unique
from tilec.compiler.rewrite import nested, perfect_nest, rechecked, taken_names
from tilec.compiler.tconv_split import names_in
from tilec.errors import TilecError
from tilec.lang import syntax as sx

STRIDE = 2


def split_padded_tconvs(program):
    taken = taken_names(program.kernel)
    decls: list[sx.Decl] = []
    body: list[sx.Stmt] = []
    for top in program.kernel.body:
        new = _rewritten(program, top, taken, decls)
        body += [top] if new is None else new
    return program if not decls else rechecked(program, decls, body)


def _rewritten(program, top: sx.Stmt, taken: set[str], decls: list) -> list[sx.Stmt] | None:
    found = _nest(top)
    if found is None:
        return None
    outer, init, reduced, update = found
    form = _form(program, outer, init, reduced, update)
    if form is None:
        return None
    lead, k, (y, a, ky), (x, b, kx), xr, wr, c = form
    stops = {lp.var: lp.stop for lp in outer}
    span = init.span
    R, Q = (d if isinstance(d, int) else size_value(d, program.sizes) for d in program.tensors[wr.tensor].shape[2:])
    name = unique(f"{init.target.tensor}_taps", taken)
    taken.add(name)
    r, q = unique("r", taken | set(stops)), unique("q", taken | set(stops))
    dims = tuple(stops[v] for v in lead) + (stops[k], sx.Num(R), sx.Num(Q), stops[y], stops[x])
    decls.append(sx.Decl(name, sx.TensorType("f32", dims, span), span))
    t_at = sx.Access(name, tuple(sx.Name(v) for v in lead + [k, r, q, y, x]), span)
    product = sx.BinOp("*", sx.Access(xr.tensor, tuple(sx.Name(v) for v in lead + [c.var, y, x]), span),
                       sx.Access(wr.tensor, tuple(sx.Name(v) for v in (c.var, k, r, q)), span), span)
    sums = sx.Loop(c.var, c.start, c.stop, (sx.Assign(t_at, "+=", product, update.span),), c.span)
    inner = sx.Loop(x, sx.Num(0), stops[x], (sx.Assign(t_at, "=", sx.Num(0.0, span), span), sums), span)
    loops = [sx.Loop(v, sx.Num(0), stops[v], (), span) for v in lead + [k]] + \
        [sx.Loop(v, sx.Num(0), sx.Num(n), (), span) for v, n in ((r, R), (q, Q))] + \
        [sx.Loop(y, sx.Num(0), stops[y], (), span)]
    first = nested(inner, loops)
    value: sx.Expr = init.value
    for dy, kr in ky:
        for dx, kq in kx:
            idx = tuple(sx.Name(v) for v in lead) + (sx.Name(k), _plus(a, kr), _plus(b, kq), _plus(y, dy),
                                                     _plus(x, dx))
            value = sx.BinOp("+", value, sx.Access(name, idx, span, fill=0.0), span)
    second = nested(sx.Assign(init.target, "=", value, span), outer)
    return [first, second]


def _nest(top: sx.Stmt):
    """(outer loops, init, reduced loops, update) of `for outer: Y[..] = init; for reduced: Y[..] += e` (the store's
    indices any expressions: sum_split.init_and_sum wants plain ones), or None."""
    outer, last = perfect_nest(top)
    if not outer or not isinstance(last, sx.Loop) or len(last.body) != 2:
        return None
    init, k_loop = last.body
    if not (isinstance(init, sx.Assign) and init.op == "=" and isinstance(k_loop, sx.Loop)):
        return None
    reduced, update = perfect_nest(k_loop)
    if not reduced or not isinstance(update, sx.Assign) or update.target != init.target:
        return None
    return outer + [last], init, reduced, update


def _plus(var: str, n: int) -> sx.Expr:
    if n == 0:
        return sx.Name(var)
    return sx.BinOp("+" if n > 0 else "-", sx.Name(var), sx.Num(abs(n)))


def _form(program, outer, init, reduced, update):
    """(lead vars, k, (y, a, y-terms), (x, b, x-terms), X's read, Wt's read, c's loop) of the phase form, or None."""
    out = init.target.indices
    if len(out) < 4 or not all(isinstance(ix, sx.Name) for ix in out[:-2]):
        return None
    extents = {lp.var: size_value(lp.stop, program.sizes) for lp in outer + reduced}
    names = set(extents)
    axes = [_phase_axis(ix, names, extents, program) for ix in out[-2:]]
    v = update.value
    if None in axes or update.op != "+=" or not (isinstance(v, sx.BinOp) and v.op == "*"):
        return None
    reads = accesses(v)
    if len(reads) != 2 or not all(isinstance(s, sx.Access) for s in (v.lhs, v.rhs)):
        return None
    (y, a), (x, b) = axes
    xr, wr = sorted(reads, key=lambda acc: not any(y in _vars(ix) for ix in acc.indices))
    lead = [ix.id for ix in out[:-3] if isinstance(ix, sx.Name)]
    k = out[-3].id if isinstance(out[-3], sx.Name) else ""
    if len(xr.indices) != len(lead) + 3 or len(wr.indices) != 4 or xr.fill not in (None, 0.0) \
            or wr.fill not in (None, 0.0) or program.tensors[wr.tensor].dtype != program.tensors[xr.tensor].dtype:
        return None
    c = wr.indices[0]
    if not isinstance(c, sx.Name) or [ix for ix in xr.indices[:-2]] != [sx.Name(v) for v in lead] + [c] \
            or wr.indices[1] != sx.Name(k):
        return None
    taps = [lp for lp in reduced if lp.var != c.id]
    cl = [lp for lp in reduced if lp.var == c.id]
    if len(taps) != 2 or len(cl) != 1 or set(_vars(init.value)) & {lp.var for lp in reduced}:
        return None
    R = program.tensors[wr.tensor].shape
    ty = _terms(xr.indices[-2], wr.indices[2], y, a, taps, extents, names, program, R[2])
    tx = _terms(xr.indices[-1], wr.indices[3], x, b, taps, extents, names, program, R[3])
    if ty is None or tx is None:
        return None
    return lead, k, (y, a, ty), (x, b, tx), xr, wr, cl[0]


def _phase_axis(ix: sx.Expr, names: set[str], extents: dict, program) -> tuple[str, str] | None:
    """(y, a) of a store index `2 * y + a` with a in 0..2."""
    try:
        coefs, const = affine_index(ix, names, program.sizes)
    except TilecError:
        return None
    big = [v for v, cf in coefs.items() if cf == STRIDE]
    one = [v for v, cf in coefs.items() if cf == 1 and extents.get(v) == STRIDE]
    return (big[0], one[0]) if len(coefs) == 2 and const == 0 and big and one else None


def _terms(xi: sx.Expr, wi: sx.Expr, y: str, a: str, taps: list, extents: dict, names: set[str], program,
           size) -> list[tuple[int, int]] | None:
    """[(offset d, tap shift kd)] along one axis: phase a of output row 2y + a reads input row y + d and tap a + kd,
    one tap per (a, d); phases that no tap of the statement joins to an offset read a tap outside Wt there."""
    R = size if isinstance(size, int) else size_value(size, program.sizes)
    try:
        cx, kx = affine_index(xi, names, program.sizes)
        cw, kw = affine_index(wi, names, program.sizes)
    except TilecError:
        return None
    tap = [lp.var for lp in taps if lp.var in cx]
    if cx.get(y) != 1 or len(tap) != 1 or set(cx) - {y, a, tap[0]} or set(cw) - {a, tap[0]}:
        return None
    t = tap[0]
    pairs: dict[tuple[int, int], int] = {}
    for av in range(STRIDE):
        for tv in range(extents[t]):
            d = cx.get(a, 0) * av + cx[t] * tv + kx
            r = cw.get(a, 0) * av + cw.get(t, 0) * tv + kw
            if not 0 <= r < R:
                continue
            if (av, d) in pairs:
                return None
            pairs[(av, d)] = r
    out = []
    for d in sorted({d for _, d in pairs}):
        shifts = {r - av for (av, dd), r in pairs.items() if dd == d}
        if len(shifts) != 1:
            return None
        kd = shifts.pop()
        if any((av, d) not in pairs and 0 <= av + kd < R for av in range(STRIDE)):
            return None
        out.append((d, kd))
    return out


def _vars(e: sx.Expr) -> set[str]:
    return names_in(e)
