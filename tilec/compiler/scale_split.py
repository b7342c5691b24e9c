"""A contraction's result scaled by a vector along its last index, the cosine similarity of every row of A with every
row of B written from its formula,

    dot[i, j] += A[i, k] * B[j, k]
    S[i, j] = dot[i, j] * rsqrt(aa[i] + e) * rsqrt(bb[j] + e)

leaves PSUM into HBM and is read back: the eviction applies vectors along the output's rows (the partitions, `aa[i]`)
but not along its columns (`bb[j]`, one value per free element). A factor of the last index alone scales the
operand that carries that index instead (the rows of B are normalised before the matmul, as such kernels are
written by hand), and the rest of the statement is an epilogue the eviction computes:

    B_s[j, k] = B[j, k] * rsqrt(bb[j] + e)          (N x K values: the operand, not the M x N result)
    dot[i, j] += A[i, k] * B_s[j, k]
    S[i, j] = dot[i, j] * rsqrt(aa[i] + e)

Exact up to rounding (a product reassociated; B_s is f32). Done for a top-level `for i, j: T[i, j] = 0; for k:
T[i, j] += P * Q` with Q a plain read indexed by j and k only and P not reading j, T an intermediate that one later
top-level nest `for i, j: Y[i, j] = t1 * t2 ..` alone reads, once, as a factor of its product, some factor of which
(`* f` or `/ f`) reads j and no other loop variable; the same object when there is none."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.names import unique
from tilec.compiler.reduce_split import index_vars
from tilec.compiler.rewrite import perfect_nest, rechecked, taken_names
from tilec.lang import syntax as sx

Factor = tuple[str, sx.Expr]  # ("*" | "/", the factor)


def split_column_scales(program):
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    body = list(kernel.body)
    before: dict[int, list[sx.Stmt]] = {}
    for n, top in enumerate(kernel.body):
        found = _contraction(top, kernel.outputs)
        reader = _only_reader(kernel.body, n, found[1].target.tensor) if found else None
        if found is None or reader is None:
            continue
        (loops, update, operands), (m, st) = found, reader
        tensor = update.target.tensor
        factors = _factors(st.value, "*")
        in_factors = [f for _, f in factors if isinstance(f, sx.Access) and f.tensor == tensor]
        at = _reader_vars(kernel.body[m], st, tensor, loops) if len(in_factors) == 1 else None
        kept = list(factors)
        for own, lp, operand in zip(at or (), loops, operands):
            moved = [f for f in factors if _vars(f[1]) == {own} and not _reads(f[1], tensor)]
            if not moved or operand is None or written_from(kernel.body, n, moved_reads(moved)):
                continue
            name = unique(f"{operand.tensor}_s", taken)
            taken.add(name)
            decls.append(_scaled_decl(name, operand, loops))
            before.setdefault(n, []).append(_scaled_copy(name, operand, loops, [(op, _renamed(f, own, lp.var))
                                                                                   for op, f in moved]))
            top = _map_top(top, lambda a, o=operand, nm=name: replace(a, tensor=nm) if a == o else a)
            kept = [f for f in kept if f not in moved]
        if len(kept) < len(factors):
            body[n] = top
            body[m] = _with_value(body[m], st, _product(kept))
    if not decls:
        return program
    out: list[sx.Stmt] = []
    for n, st in enumerate(body):
        out += before.get(n, []) + [st]
    return rechecked(program, decls, out)


def _scaled_decl(name: str, operand: sx.Access, loops: list[sx.Loop]) -> sx.Decl:
    """An f32 temporary over the operand's loops, in its index order."""
    stops = {lp.var: lp.stop for lp in loops}
    shape = tuple(stops[ix.id] for ix in operand.indices if isinstance(ix, sx.Name))
    return sx.Decl(name, sx.TensorType("f32", shape, operand.span), operand.span)


def _scaled_copy(name: str, operand: sx.Access, loops: list[sx.Loop], moved: list[Factor]) -> sx.Stmt:
    """`for ..: name[..] = operand * f1 / f2 ..` over the operand's loops, in its index order."""
    order = [ix.id for ix in operand.indices if isinstance(ix, sx.Name)]
    copy: sx.Stmt = sx.Assign(replace(operand, tensor=name), "=", _product([("*", operand)] + moved), operand.span)
    for v in reversed(order):
        lp = next(lp for lp in loops if lp.var == v)
        copy = sx.Loop(v, lp.start, lp.stop, (copy,), lp.span)
    return copy


def moved_reads(exprs: list[Factor]) -> set[str]:
    return {a.tensor for _, e in exprs for a in accesses(e)}


def written_from(body: tuple[sx.Stmt, ...], n: int, tensors: set[str]) -> bool:
    """Some top-level statement from the n-th on writes one of `tensors`: what moves before the n-th (into the
    contraction's operands) would read them unwritten or early."""
    return any(st.target.tensor in tensors for top in body[n:] for st in _assigns(top))


def _contraction(top: sx.Stmt, outputs: tuple[str, ...]):
    """([i, j, k loops], the update, (P, Q)) of `for i, j: T[i, j] = 0; for k: T[i, j] += P * Q` with P read at
    (i, k) or Q at (j, k) in some order (the other None when it is not such a read), or None."""
    outer, last = perfect_nest(top)
    if len(outer) != 1 or not isinstance(last, sx.Loop) or len(last.body) != 2:
        return None
    init, k_nest = last.body
    reduced, update = perfect_nest(k_nest)
    if len(reduced) != 1 or not isinstance(update, sx.Assign) or update.op != "+=" or \
            not isinstance(init, sx.Assign) or init.op != "=" or init.value != sx.Num(0) or \
            init.target != update.target or update.target.tensor in outputs:
        return None
    i, j, k = outer[0].var, last.var, reduced[0].var
    v = update.value
    if update.target.indices != (sx.Name(i), sx.Name(j)) or not (isinstance(v, sx.BinOp) and v.op == "*"):
        return None
    p, q = (v.lhs, v.rhs) if j in _vars(v.rhs) else (v.rhs, v.lhs)
    operands = (_read_at(p, {i, k}), _read_at(q, {j, k}))
    if j in _vars(p) or i in _vars(q) or operands == (None, None):
        return None
    return [outer[0], last, reduced[0]], update, operands


def _read_at(e: sx.Expr, names: set[str]) -> sx.Access | None:
    if not isinstance(e, sx.Access) or e.fill is not None:
        return None
    ids = [ix.id for ix in e.indices if isinstance(ix, sx.Name)]
    return e if len(ids) == len(e.indices) == len(names) and set(ids) == names else None


def _only_reader(body: tuple[sx.Stmt, ...] | list[sx.Stmt], n: int, tensor: str):
    """(its position, the statement) of the one later top-level nest touching `tensor`, a perfect nest around one
    `=`; None when another statement reads or writes it."""
    found = None
    for m, top in enumerate(body):
        if m == n:
            continue
        touches = [st for st in _assigns(top) if st.target.tensor == tensor or _reads(st.value, tensor)]
        if not touches:
            continue
        _, st = perfect_nest(top)
        if found is not None or m < n or not isinstance(st, sx.Assign) or st.op != "=" or touches != [st]:
            return None
        found = (m, st)
    return found


def _reader_vars(top: sx.Stmt, st: sx.Assign, tensor: str, loops: list[sx.Loop]) -> tuple[str, str] | None:
    """The reader's loop variables at T's row and column when it reads T once, at two plain loop variables, each
    loop running over all of T's from 0 (what moved factors or terms are evaluated at)."""
    reads = [a for a in accesses(st.value) if a.tensor == tensor]
    if len(reads) != 1 or not all(isinstance(ix, sx.Name) for ix in reads[0].indices):
        return None
    x, y = (ix.id for ix in reads[0].indices if isinstance(ix, sx.Name))
    own, _ = perfect_nest(top)
    stops = {lp.var: lp.stop for lp in own if lp.start == sx.Num(0)}
    if x == y or stops.get(x) != loops[0].stop or stops.get(y) != loops[1].stop:
        return None
    return x, y


def _renamed(e: sx.Expr, old: str, new: str) -> sx.Expr:
    """e with the loop variable `old` of its reads' indices named `new`."""
    def index(ix: sx.Expr) -> sx.Expr:
        if isinstance(ix, sx.Name):
            return sx.Name(new, ix.span) if ix.id == old else ix
        if isinstance(ix, sx.BinOp):
            return replace(ix, lhs=index(ix.lhs), rhs=index(ix.rhs))
        return replace(ix, x=index(ix.x)) if isinstance(ix, sx.Neg) else ix
    return sx.map_reads(e, lambda a: replace(a, indices=tuple(index(ix) for ix in a.indices)))


def _assigns(st: sx.Stmt):
    if isinstance(st, sx.Loop):
        for c in st.body:
            yield from _assigns(c)
    else:
        yield st


def _factors(e: sx.Expr, op: str) -> list[Factor]:
    """e as a product of factors, each multiplying or dividing (`a * b / c` -> [*a, *b, /c])."""
    if isinstance(e, sx.BinOp) and e.op == "*":
        return _factors(e.lhs, op) + _factors(e.rhs, op)
    if isinstance(e, sx.BinOp) and e.op == "/" and op == "*":
        return _factors(e.lhs, op) + [("/", e.rhs)]
    return [(op, e)]


def _product(factors: list[Factor]) -> sx.Expr:
    out: sx.Expr | None = None
    for op, f in factors:
        if out is None:
            out = f if op == "*" else sx.BinOp("/", sx.Num(1), f, f.span)
        else:
            out = sx.BinOp(op, out, f, f.span)
    assert out is not None
    return out


def _vars(e: sx.Expr) -> set[str]:
    return set().union(*(index_vars(a) for a in accesses(e)))


def _reads(e: sx.Expr, tensor: str) -> int:
    return sum(a.tensor == tensor for a in accesses(e))


def _map_top(st: sx.Stmt, read):
    if isinstance(st, sx.Loop):
        return replace(st, body=tuple(_map_top(c, read) for c in st.body))
    assert isinstance(st, sx.Assign)
    return replace(st, value=sx.map_reads(st.value, read))


def _with_value(top: sx.Stmt, old: sx.Assign, value: sx.Expr) -> sx.Stmt:
    if isinstance(top, sx.Loop):
        return replace(top, body=tuple(_with_value(c, old, value) for c in top.body))
    return replace(top, value=value) if top is old else top
