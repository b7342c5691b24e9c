"""A contraction started from a broadcast tensor (user20): causal attention scores per head with one mask for all
heads,

    for h in 0..Hd, i in 0..S, j in 0..S:
      P[h, i, j] = Mk[i, j]
      for d in 0..D:
        P[h, i, j] += Q[h, i, d] * K[h, j, d] * 0.125

The contraction rule starts a sum from 0, a bias along one output index, or a residual of the output's own shape
(select_conv._bias, _init_residual); a tensor read along several but not all of the output's indices is none of
them. The sum then starts from 0 and the initial value is added after it, in place,

    P[h, i, j] = 0;  for d: P[h, i, j] += ...
    for h, i, j:  P[h, i, j] = P[h, i, j] + Mk[i, j]

which inplace_split then makes a temporary's sum and an element-wise broadcast add. The reference adds the
products to the mask in float32; the rewrite adds the mask to their float32 sum: the order of the additions differs,
and for a 16-bit P the sum is rounded to P's dtype before the mask is added (inplace_split's P_acc has P's dtype),
one rounding more than the reference (test_user20_programs: causal_scores in bf16 within the tolerance). Done for a top-level nest whose innermost body is
`P[outs] = A[..]` and one loop nest of `+=` into the same element, A indexed by at least two distinct output
variables and fewer than all of them, unless it reads every index but the batch of a batched matmul (rows21:
`_shared_by_batch`; select_conv._init_residual then adds it on the PSUM eviction, no HBM round trip). The same
object when there is none."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.rewrite import from_zero, nested, perfect_nest, resolved
from tilec.lang import syntax as sx


def split_broadcast_inits(program):
    body: list[sx.Stmt] = []
    changed = False
    for top in program.kernel.body:
        found = _broadcast_init(top)
        if found is None:
            body.append(top)
            continue
        loops, init = found
        zero = replace(init, value=sx.Num(0, init.value.span))
        add = sx.Assign(init.target, "=", sx.BinOp("+", init.target, init.value, init.span), init.span)
        body += [_replaced(top, init, zero), nested(add, loops)]
        changed = True
    return resolved(program, replace(program.kernel, body=tuple(body))) if changed else program


def _broadcast_init(top: sx.Stmt) -> tuple[list[sx.Loop], sx.Assign] | None:
    loops, last = perfect_nest(top)
    if not isinstance(last, sx.Loop) or len(last.body) != 2:
        return None
    loops = loops + [last]
    init, red = last.body
    if not (isinstance(init, sx.Assign) and init.op == "=" and isinstance(init.value, sx.Access)
            and init.value.fill is None and isinstance(red, sx.Loop)):
        return None
    _, update = perfect_nest(red)
    if not isinstance(update, sx.Assign) or update.op != "+=" or update.target != init.target:
        return None
    outs = [ix.id for ix in init.target.indices if isinstance(ix, sx.Name)]
    if outs != [lp.var for lp in loops] or not all(from_zero(lp) for lp in loops):
        return None
    read = [ix.id for ix in init.value.indices if isinstance(ix, sx.Name)]
    if len(read) != len(init.value.indices) or len(set(read)) != len(read) or not set(read) < set(outs) \
            or len(read) < 2 or _shared_by_batch(outs, read, update):
        return None
    return loops, init


def _shared_by_batch(outs: list[str], read: list[str], update: sx.Assign) -> bool:
    """Whether the initial value reads every output index but the leading ones, which are exactly the indices every
    tensor of the sum reads, all of them plain (a batched matmul's batch: select_conv._init_residual adds such a
    value on the PSUM eviction, `Mk[i, j]` for every head h of `P[h, i, j]`; then it is left as written)."""
    lead = outs[:len(outs) - len(read)]
    operands = accesses(update.value)
    if read != outs[len(lead):] or len({a.tensor for a in operands}) < 2 or \
            not all(isinstance(ix, sx.Name) for a in operands for ix in a.indices):
        return False
    every = [v for v in outs if all(v in {ix.id for ix in a.indices if isinstance(ix, sx.Name)} for a in operands)]
    return every == lead


def _replaced(st: sx.Stmt, old: sx.Assign, new: sx.Assign) -> sx.Stmt:
    """`st` with the statement `old` (by identity) replaced by `new`."""
    if st is old:
        return new
    if isinstance(st, sx.Loop):
        return replace(st, body=tuple(_replaced(c, old, new) for c in st.body))
    return st
