"""Element-wise work stored into part of a tensor (user20): a rotary embedding writes each half of the features,

    for s in 0..S, d in 0..Dh:
      Y[s, Dh + d] = X[s, Dh + d] * Cs[s, d] + X[s, d] * Sn[s, d]

and the rules store a shifted index (`Y[C1 + c]`) only in a plain copy (select_copy; a concatenation). The
statement is split into the element-wise work into a temporary indexed by its loop variables, then that copy:

    for s, d:  Y_part[s, d] = X[s, Dh + d] * Cs[s, d] + X[s, d] * Sn[s, d]
    for s, d:  Y[s, Dh + d] = Y_part[s, d]

Done for a top-level perfect nest from 0 around one `=` statement whose stored indices are distinct loop variables,
each plain or plus a constant, every loop's variable among them, whose value is not already a plain read, and which
stores at a shifted index or into a tensor written in parts (_in_parts: a concatenation's other parts). The temporary has the stored tensor's dtype. The same object when there is none."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.lower import shifted_index, size_value
from tilec.compiler.names import unique
from tilec.compiler.rewrite import leaves, nested, perfect_nest, rechecked, taken_names, written
from tilec.lang import syntax as sx


def split_shifted_stores(program):
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    body: list[sx.Stmt] = []
    parts = _in_parts(kernel.body, program.sizes)
    for top in kernel.body:
        loops, st = perfect_nest(top)
        order = _stored_vars(loops, st, program.sizes, parts)
        if order is None or not isinstance(st, sx.Assign):
            body.append(top)
            continue
        part = unique(f"{st.target.tensor}_part", taken)
        by_var = {lp.var: lp for lp in loops}
        dtype = next(d.type.dtype for d in kernel.decls if d.name == st.target.tensor)
        decls.append(sx.Decl(part, sx.TensorType(dtype, tuple(by_var[v].stop for v in order), st.span), st.span))
        read = sx.Access(part, tuple(sx.Name(v, st.span) for v in order), st.span)
        body += [nested(sx.Assign(read, "=", st.value, st.span), loops),
                 nested(sx.Assign(st.target, "=", read, st.span), loops)]
    return rechecked(program, decls, body)


def _in_parts(body: tuple[sx.Stmt, ...], sizes: dict[str, int]) -> set[str]:
    """The tensors written in parts: by several top-level nests, one of them at a shifted index, with `=` only and
    never read by a statement writing them (no init and reduction, no in-place update `Y = relu(Y)`)."""
    nests: dict[str, int] = {}
    blocked: set[str] = set()
    shifted: set[str] = set()
    for top in body:
        for leaf, loops in leaves(top):
            if not isinstance(leaf, sx.Assign):
                continue
            name = leaf.target.tensor
            if leaf.op != "=" or name in {a.tensor for a in accesses(leaf.value)}:
                blocked.add(name)
            found = [shifted_index(ix, set(loops), sizes) for ix in leaf.target.indices]
            if any(f is not None and f[1] != 0 for f in found):
                shifted.add(name)
        for name in written(top):
            nests[name] = nests.get(name, 0) + 1
    return {name for name, n in nests.items() if n > 1 and name in shifted and name not in blocked}


def _stored_vars(loops: list[sx.Loop], st: sx.Stmt, sizes: dict[str, int], parts: set[str]) -> list[str] | None:
    """The loop variables of the stored indices in their order when the nest is one to split, else None."""
    if not loops or not isinstance(st, sx.Assign) or st.op != "=" or \
            (isinstance(st.value, sx.Access) and st.value.fill is None):
        return None
    names = {lp.var for lp in loops}
    found = [shifted_index(ix, names, sizes) for ix in st.target.indices]
    if any(f is None for f in found):
        return None
    order = [f[0] for f in found if f is not None]
    shifted = any(f[1] != 0 for f in found if f is not None)
    if sorted(order) != sorted(names) or not (shifted or st.target.tensor in parts):
        return None
    if any(size_value(lp.start, sizes) != 0 for lp in loops):
        return None
    return order
