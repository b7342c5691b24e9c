"""A permute that keeps its last dimension, HBM -> HBM, on all 16 DMA engines when the copy rule's partition loop
has fewer than 128 iterations (ShuffleNet's channel shuffle `Y[n, c * G + g, h, w] = X[n, g * Cg + c, h, w]`, seen by
view_split as [n, g, c, h, w] -> [n, c, g, h, w]: its DMAs had the 64 channels of a group as rows, and an HBM -> HBM
DMA runs on the engines of its rows, 8 rows an engine, so half the engines moved every byte: 1.39x the floor on
the model).

Here the rows are the result's dimensions after some outer ones, merged (Y is contiguous, so consecutive
dimensions of Y are one dimension of uniform stride: [n, (c, g), (h, w)]), in blocks of 128: per outer iteration
and block one DMA writes 128 of Y's rows whole and reads X through a permuted view of the same elements in Y's
order (a DMA moves elements in row-major order of both views; X's runs are the dimensions both orders end with,
as before). Built on level B (rules_copy.row_blocks, through permute_onchip.build)."""
from __future__ import annotations

import math

from tilec.compiler import ir
from tilec.compiler.build_util import a, hbm_view, loop, sl, term
from tilec.compiler.schedule import best_divisor
from tilec.compiler.select_permute import dma_runs
from tilec.target import Target

Order = tuple[str, ...]


def rows_plan(so: Order, oo: Order, ext: dict[str, int], pmax: int) -> tuple[int, int, int] | None:
    """(k, r, q) when the copy rule's DMAs would have fewer than pmax rows: Y's dimensions oo[k:k + r] (extents > 1)
    are the rows, blocks of pmax of them (q of the first one's elements a block); the fewest DMAs, then the fewest
    row dimensions. None when the permute moves its last dimension or its DMAs already have pmax rows."""
    runs = dma_runs(so, oo, ext, pmax)
    if runs is None or best_divisor(ext[runs[1][0]], pmax) >= pmax:
        return None
    t = [v for v in oo if ext[v] > 1]
    for k in range(len(t) - 1):
        for r in range(1, len(t) - k):  # at least one dimension left inside the rows (X's runs)
            rest = math.prod(ext[v] for v in t[k + 1:k + r])
            if pmax % rest == 0 and ext[t[k]] % (pmax // rest) == 0:
                return k, r, pmax // rest
    return None


def wide_rows(so: Order, oo: Order, ext: dict[str, int], X: ir.Buf, Y: ir.Buf, line: int, fresh,
              target: Target) -> list | None:
    found = rows_plan(so, oo, ext, target.pmax)
    if found is None:
        return None
    k, r, q = found
    s, t = [v for v in so if ext[v] > 1], [v for v in oo if ext[v] > 1]
    outer, rows, inner = t[:k], t[k:k + r], t[k + r:]
    names = {v: fresh(v) for v in outer}
    bv = fresh("rb")
    yv, s1 = hbm_view(Y, tuple(ext[v] for v in outer) + (math.prod(ext[v] for v in rows),
                                                          math.prod(ext[v] for v in inner)), fresh(f"{Y.name}_rows"), line)
    xv, s2 = hbm_view(X, tuple(ext[v] for v in s), fresh(f"{X.name}_all"), line)
    dst = ir.View(yv, tuple(a(term(names[v])) for v in outer) + (sl(a(term(bv, target.pmax)), target.pmax),
                                                                   ir.full(yv.shape[-1])))
    idx: list[ir.Idx] = []
    for v in s:
        idx.append(a(term(names[v])) if v in names else sl(a(term(bv, q)), q) if v == rows[0] else ir.full(ext[v]))
    kept = [v for v in s if v not in names]  # the view's slices, in X's order
    perm = tuple(kept.index(v) for v in rows + inner)
    src = ir.View(xv, tuple(idx), perm if perm != tuple(range(len(perm))) else ())
    body = loop(bv, ext[rows[0]] // q, [ir.Dma(dst, src, line)], note=f"blocks of {target.pmax} rows", line=line)
    for v in reversed(outer):
        body = loop(names[v], ext[v], body, line=line)
    label = (f"{Y.name} = permute of {X.name} (HBM -> HBM, {target.pmax} rows of ({', '.join(rows)}), "
             f"{' x '.join(inner)} each)")
    return s1 + s2 + [ir.Block(label, tuple(body), line)]
