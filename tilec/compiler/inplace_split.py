"""An output finished in place after a contraction, `O[i, d] += e[i, j] * V[j, d]` then `O[i, d] = O[i, d] / z[i]`
(attention's normalisation after P V), `C[i, j] = C[i, j] * 0.5 + b[j]`: the contraction rule evicts PSUM into
its target once and takes only a relu in place (select_conv._in_place_error), so the statements before the last
one write a new tensor, `O_acc`, which the last one reads:

    O_acc[i, d] += e[i, j] * V[j, d]
    O[i, d] = O_acc[i, d] / z[i]           # an element-wise statement (or an epilogue fused on the eviction)

O_acc has O's dtype: the reference rounds the finished sum to O's dtype before the last statement reads it. Done
only when the last statement is alone in its top-level nest, writes O at plain loop variables (O an output, or an
intermediate when the statement also reads another tensor: `Sc = Sc * s + bias[h, j]`), reads O only at the
element it writes, is no relu / relu6 of that element alone (the eviction's own epilogue, compiled as is), and
an earlier top-level statement accumulates into O with `+=`; no later statement may write O."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.names import unique
from tilec.compiler.rewrite import rechecked, taken_names
from tilec.lang import syntax as sx


def split_in_place_epilogues(program):
    from tilec.compiler.select_conv import strip_activation
    kernel = program.kernel
    taken = taken_names(kernel)
    body = list(kernel.body)
    decls: list[sx.Decl] = []

    def only_assign(st: sx.Stmt) -> sx.Assign | None:
        while isinstance(st, sx.Loop) and len(st.body) == 1:
            st = st.body[0]
        return st if isinstance(st, sx.Assign) else None

    def assigns(st: sx.Stmt):
        if isinstance(st, sx.Loop):
            for c in st.body:
                yield from assigns(c)
        elif isinstance(st, sx.Assign):
            yield st

    def rename(st: sx.Stmt, old: str, new: str) -> sx.Stmt:
        def read(a: sx.Access) -> sx.Expr:
            return replace(a, tensor=new) if a.tensor == old else a
        if isinstance(st, sx.Loop):
            return replace(st, body=tuple(rename(c, old, new) for c in st.body))
        assert isinstance(st, sx.Assign)
        target = replace(st.target, tensor=new) if st.target.tensor == old else st.target
        return replace(st, target=target, value=sx.map_reads(st.value, read))

    for t, top in enumerate(body):
        st = only_assign(top)
        if st is None or st.op != "=" or st.target.tensor in {p.name for p in kernel.params}:
            continue
        name = st.target.tensor
        if not all(isinstance(ix, sx.Name) for ix in st.target.indices):
            continue
        if name not in kernel.outputs and all(a.tensor == name for a in accesses(st.value)):
            continue  # an intermediate's `h = gelu(h)`: the eviction's epilogue (the FFN's hidden layer)
        own = [a for a in accesses(st.value) if a.tensor == name]
        if not own or any(a.indices != st.target.indices or a.fill is not None for a in own):
            continue
        inner, bound = strip_activation(st.value)
        if bound is not None and isinstance(inner, sx.Access) and inner.tensor == name:
            continue  # `O = relu(O)`: fused on the eviction as written
        if not any(a.target.tensor == name and a.op == "+=" for s in body[:t] for a in assigns(s)):
            continue
        if any(a.target.tensor == name for s in body[t + 1:] for a in assigns(s)):
            continue
        acc = unique(f"{name}_acc", taken)
        decl = next(d for d in kernel.decls if d.name == name)
        decls.append(replace(decl, name=acc))
        body[:t] = [rename(s, name, acc) for s in body[:t]]
        body[t] = rename(top, name, acc)
        body[t] = _retarget(body[t], acc, name)
    return rechecked(program, decls, body)


def _retarget(st: sx.Stmt, old: str, new: str) -> sx.Stmt:
    """st with its stores into `old` stored into `new` (its reads unchanged)."""
    if isinstance(st, sx.Loop):
        return replace(st, body=tuple(_retarget(c, old, new) for c in st.body))
    assert isinstance(st, sx.Assign)
    return replace(st, target=replace(st.target, tensor=new)) if st.target.tensor == old else st
