"""Heads packed in a contraction's operands, `P[h, i, j] += Q[i, h * D + d] * K[j, h * D + d]` (attention scores
from a QKV projection's [S, Hd * D] output, user20's heads_scores): the batched-matmul rule wants its batch index
first in the output and in both operands, and view_split leaves a contraction's operands as written (a grouped
convolution's merged channels are select.ungroup's). So each operand whose merged index splits into output
variables (the heads, first in the output) and others is copied first with the heads leading,

    Q_h[h, i, d] = Q[i, h * D + d]          # one copy per head (permute_split.split_reshape_copies)
    P[h, i, j] += Q_h[h, i, d] * K_h[h, j, d]

(and `O[h, i, d] += A[h, i, t] * V[t, h * D + d]`, P V: V_h[h, t, d], its d staying last).

A merged index is view_split's split (`v1 * s1 + .. + vk`, the strides of the variables' extents). Only when the
output is indexed by plain variables with those heads first (else the batched rule refuses it either way)."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.lower import size_value
from tilec.compiler.names import unique
from tilec.compiler.rewrite import hoisted, nested, rechecked, taken_names
from tilec.compiler.view_split import _contraction, _split
from tilec.lang import syntax as sx


def split_packed_heads(program):
    """The program with each such operand copied head-first; the same object when there is none."""
    taken = taken_names(program.kernel)
    decls: list[sx.Decl] = []

    def leaf(st: sx.Assign, loops: tuple[sx.Loop, ...], top_writes: set[str]) -> tuple[list[sx.Stmt], sx.Stmt]:
        out = [ix.id for ix in st.target.indices if isinstance(ix, sx.Name)]
        if not _contraction(st) or len(out) != len(st.target.indices):
            return [], st
        by_var = {lp.var: lp for lp in loops}
        fills: list[sx.Stmt] = []
        new: dict[int, sx.Access] = {}
        for acc in accesses(st.value):
            order = None if acc.tensor in top_writes else _head_first(acc, by_var, out, program)
            if order is None:
                continue
            span = acc.span
            name = unique(f"{acc.tensor}_h", taken)
            decls.append(sx.Decl(name, sx.TensorType(program.tensors[acc.tensor].dtype,
                                                     tuple(by_var[v].stop for v in order), span), span))
            head = sx.Access(name, tuple(sx.Name(v, span) for v in order), span)
            fills.append(nested(sx.Assign(head, "=", acc, st.span), [by_var[v] for v in order]))
            new[id(acc)] = head
        if not new:
            return [], st
        return fills, replace(st, value=sx.map_reads(st.value, lambda a: new.get(id(a), a)))

    return rechecked(program, decls, hoisted(program.kernel.body, leaf))


def _head_first(acc: sx.Access, loops: dict[str, sx.Loop], out: list[str], program) -> list[str] | None:
    """The variables of the operand's copy, heads first, when one index of `acc` is a merged index whose parts
    include the output's leading variables (the heads; its other parts stay where the index was) and the other
    indices are plain variables, else None."""
    shape = program.tensors[acc.tensor].shape
    parts: list[list[str]] = []
    heads: list[str] = []
    for d, ix in enumerate(acc.indices):
        if isinstance(ix, sx.Name) and ix.id in loops:
            parts.append([ix.id])
            continue
        extent = shape[d] if isinstance(shape[d], int) else size_value(shape[d], program.sizes)
        split = _split(ix, loops, program.sizes, extent)
        if split is None or heads:
            return None
        lead = next(n for n in range(len(out), -1, -1) if set(out[:n]) <= {v for v, _ in split})
        heads = out[:lead]  # the output's leading variables among the parts (P[h, ..]: h; O[h, i, d]: h, not d)
        parts.append([v for v, _ in split if v not in heads])
    order = heads + [v for p in parts for v in p]
    if not heads or len(set(order)) != len(order) or \
            any(size_value(loops[v].start, program.sizes) != 0 for v in order):
        return None
    return order
