"""A sum over middle dimensions followed by a constant factor, as one op (issue 13): the NHWC global average pool
`S[n, c] += X[n, i, j, c]; Y[n, c] = S[n, c] / 49`. The division becomes the ColumnReduceOp's own factor (applied
as the PSUM sums are evicted, ScalarE's activation scale), so S never goes to HBM and back to be divided by a
second nest (nhwc23: 9.8x of the floor at batch 1, most of it that round trip).
"""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.lower import Comp
from tilec.compiler.ops import ColumnReduceOp, index_maps, plain, reads
from tilec.lang import syntax as sx


def fuse_reduce_divide(op: ColumnReduceOp, comps: tuple[Comp, ...], i: int, program,
                       consumed: set[int]) -> ColumnReduceOp:
    """op writing Y with the factor 1 / D (or D for `* D`) when comps[i + 1] is `Y[..] = S[..] / D` (D a number)
    over S's own indices and S, a temporary that starts from 0, is read nowhere else; op itself otherwise."""
    s, nxt = op.out, comps[i + 1] if i + 1 < len(comps) else None
    if op.op != "add" or op.init != 0.0 or nxt is None or nxt.red_op is not None or nxt.init is None \
            or nxt.fused or s in program.kernel.outputs:
        return op
    if any(a.tensor == s for j, c in enumerate(comps) if j not in (i, i + 1) for a in reads(c)):
        return op
    e = nxt.init
    if not isinstance(e, sx.BinOp) or e.op not in "*/" or not isinstance(e.rhs, sx.Num) or e.rhs.value == 0:
        return op
    lhs = e.lhs
    if not isinstance(lhs, sx.Access) or lhs.tensor != s or lhs.fill is not None \
            or program.tensors[nxt.target].shape != program.tensors[s].shape \
            or program.tensors[nxt.target].dtype != program.tensors[s].dtype:
        return op  # (a narrower Y than S would round the sum, which the fused op does not)
    if [plain(m) for m in index_maps(lhs, nxt, program)] != list(nxt.out_vars):
        return op
    k = float(e.rhs.value)
    consumed.add(i + 1)
    return replace(op, out=nxt.target, scale=op.scale * (1.0 / k if e.op == "/" else k))
