"""Per-channel element-wise ops over fewer channels than partitions (lead23): batch norm at inference in NCHW,

    for n in 0..N, c in 0..C, y in 0..H, x in 0..W:          C = 64
      Y[n, c, y, x] = (X[n, c, y, x] - mean[c]) * rsqrt(var[c] + 1e-5) * g[c] + b[c]

The element-wise rule puts the columns' index c on the partitions (one scalar per partition), so a tile has C of
the 128 partitions: half of every engine's lanes and of the DMA queues' spread idle (bf16 8 x 64 x 56 x 56: 3.2x
the DMA floor on the model). Splitting the next axis, y = a * (H / k) + y2, puts (c, a) on the partitions, C * k of
them: the tensors indexed like the output are viewed [N, C, k, H / k, W] (a contiguous tensor reshapes freely; the
signature keeps its shape, as packed_rows.py does), and each column is first replicated k times into a small
temporary, which the rule then reads as one scalar per partition:

    for c in 0..C, a in 0..k:  g_rep[c, a] = g[c]            (and mean_rep, var_rep, b_rep)
    for n in 0..N, c in 0..C, a in 0..k, y2 in 0..H / k, x in 0..W:
      Y[n, c, a, y2, x] = (X[n, c, a, y2, x] - mean_rep[c, a]) * .. + b_rep[c, a]

The same values, element by element. Done for a top-level perfect nest from 0 around one `=` statement storing a
kernel output at its loop variables in order, whose reads are inputs indexed like the output (read nowhere else)
or columns indexed by one loop variable c that is neither the first nor the last, the same for all; when C * k
fills at least 3/4 of the partitions for some k >= 2 dividing the next axis, leaving MIN_FREE elements or more per
partition. The same object when there is none."""
from __future__ import annotations

import math
from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.lower import size_value
from tilec.compiler.names import unique
from tilec.compiler.packed_rows import PARTS, _used_elsewhere, output_nest, views_rewritten
from tilec.compiler.rewrite import nested
from tilec.lang import syntax as sx

MIN_FREE = 512  # elements per partition left after the split: a shorter tile pays each instruction's fixed cost


def split_channel_columns(program):
    return views_rewritten(program, _one)


def _one(program, top: sx.Stmt, taken: set[str]):
    """(fills, the nest, declarations, {tensor: its view's shape}) for a nest to rewrite, else None."""
    found = _candidate(program, top)
    if found is None:
        return None
    loops, st, j, k = found
    fills, nest, decls = _rewritten(program, loops, st, j, k, taken)
    y = loops[j + 1]
    split = tuple(lp.stop for lp in loops[:j + 1]) + (sx.Num(k), sx.BinOp("/", y.stop, sx.Num(k), y.span)) + \
        tuple(lp.stop for lp in loops[j + 2:])
    return fills, nest, decls, {name: split for name in _full(st, len(loops))}


def _full(st: sx.Assign, n: int) -> list[str]:
    return [st.target.tensor] + sorted({a.tensor for a in accesses(st.value) if len(a.indices) == n})


def _candidate(program, top: sx.Stmt):
    """(loops, statement, the columns' loop position j, the split k) when `top` is a nest to rewrite, else None."""
    found = output_nest(program, top, 3)
    if found is None:
        return None
    loops, st = found
    names, out = [lp.var for lp in loops], st.target
    cols: set[str] = set()
    for a in accesses(st.value):
        idx = [ix.id if isinstance(ix, sx.Name) else None for ix in a.indices]
        if a.fill is not None or a.tensor == out.tensor:
            return None
        if idx == names:
            if program.tensors[a.tensor].kind != "input" or a.tensor in program.views:
                return None
        elif len(idx) == 1 and idx[0] in names[1:-1]:
            cols.add(idx[0])
        else:
            return None
    if len(cols) != 1 or _used_elsewhere(program.kernel.body, top, set(_full(st, len(names)))):
        return None
    j = names.index(cols.pop())
    ext = [size_value(lp.stop, program.sizes) for lp in loops]
    k = _split(ext[j], ext[j + 1], math.prod(ext[j + 2:]))
    return None if k is None else (loops, st, j, k)


def _split(C: int, H: int, rest: int) -> int | None:
    """The k >= 2 dividing H with the most partitions C * k <= 128, at least 3/4 of them, leaving MIN_FREE elements
    or more per partition; None when there is none (C already fills the partitions, or the axis is too short)."""
    ks = [k for k in range(2, PARTS // C + 1) if H % k == 0 and H // k * rest >= MIN_FREE]
    k = max(ks, default=None)
    return k if k is not None and 4 * C * k >= 3 * PARTS else None


def _rewritten(program, loops: list[sx.Loop], st: sx.Assign, j: int, k: int, taken: set[str]):
    """(the columns' fill nests, the nest with (c, a) before y2, the temporaries' declarations)."""
    span = st.span
    c, y = loops[j], loops[j + 1]
    a, y2 = unique(f"{y.var}_a", taken), unique(f"{y.var}_2", taken)
    taken |= {a, y2}
    split = [sx.Loop(a, sx.Num(0), sx.Num(k), (), span),
             sx.Loop(y2, sx.Num(0), sx.BinOp("/", y.stop, sx.Num(k), span), (), span)]
    new_loops = loops[:j + 1] + split + loops[j + 2:]
    at = tuple(sx.Name(lp.var, span) for lp in new_loops)
    fills: list[sx.Stmt] = []
    decls: list[sx.Decl] = []
    reps: dict[str, sx.Access] = {}

    def read(x: sx.Access) -> sx.Expr:
        if len(x.indices) == len(loops):
            return replace(x, indices=at)
        if x.tensor not in reps:
            name = unique(f"{x.tensor}_rep", taken)
            taken.add(name)
            decls.append(sx.Decl(name, sx.TensorType(program.tensors[x.tensor].dtype, (c.stop, sx.Num(k)), span),
                                 span))
            one = sx.Loop(a, sx.Num(0), sx.Num(1), (), span)
            for part in range(k):  # k copies of the column, each a DMA HBM -> HBM (the copy rule's part copies)
                at_part = sx.BinOp("+", sx.Name(a, span), sx.Num(part, span), span) if part else sx.Name(a, span)
                to = sx.Access(name, (sx.Name(c.var, span), at_part), span)
                fills.append(nested(sx.Assign(to, "=", x, span), [c, one]))
            reps[x.tensor] = sx.Access(name, (sx.Name(c.var, span), sx.Name(a, span)), span)
        return reps[x.tensor]
    value = sx.map_reads(st.value, read)
    nest = nested(sx.Assign(replace(st.target, indices=at), "=", value, span), new_loops)
    return fills, nest, decls
