"""A padded transposed conv's ops (tconv_pad.py's rewrite) recognised for build_tconv.py, which then builds them as
one on-chip kernel: phase (a, b) accumulates in PSUM, over its terms, tap (a + kr, b + kq) of Wt times the input
band shifted by (d, e) (a band with a zero halo, so reads past X's edge are zeros), and is evicted into its strided
place of Y's layout, as the kernel-2 conv's taps are.

The ops, as selection makes them from the rewrite: the matmul of every tap `T[n, k, r, q, y, x] = X . Wt[:, k, r,
q]`, one padded copy per term `T_pad[n, k, a, b, y, x] = T[n, k, a + kr, b + kq, y + d, x + e] ?? 0`, their sum
(with a per-channel bias) `Y_pre[n, k, a, b, y, x] = b[k] + T_pad + ..`, and the permute of Y_pre into Y. Built
apart they take T, every T_pad and Y_pre through HBM (DCGAN 256 -> 128 at 16x16 f32: 86 us at batch 1 on the
model, and batch 8 did not fit SBUF)."""
from __future__ import annotations

from typing import Callable

from tilec.compiler.build_tconv import Found, fits, permutes, plain_1x1
from tilec.compiler.lower import affine_index
from tilec.compiler.ops import ConvOp, EltwiseOp
from tilec.errors import TilecError
from tilec.lang import syntax as sx


def find_padded(ops: tuple, i: int, hbm: dict, keep: Callable[[range], set], scheduled) -> Found | None:
    conv = ops[i]
    if not isinstance(conv, ConvOp) or not plain_1x1(conv) or conv.bias:
        return None
    t = hbm[conv.out].shape
    if len(t) not in (5, 6):
        return None
    kc, R, Q, h, w = t[-5:]
    j = i + 1
    while j < len(ops) and isinstance(ops[j], EltwiseOp) and ops[j].copy and ops[j].inputs == (conv.out,):
        j += 1
    copies = ops[i + 1:j]
    if not copies or j + 1 >= len(ops) or conv.dim("K") != kc * R * Q or not fits(conv, hbm, (kc, R, Q), (h, w)):
        return None
    pre, perm = ops[j], ops[j + 1]
    span = range(i, j + 2)
    if any(o.name in scheduled for o in ops[i:j + 2]) or \
            {conv.out, pre.out, *(c.out for c in copies)} & keep(span) or not isinstance(pre, EltwiseOp):
        return None
    found = [_term(c, conv.out) for c in copies]
    bias = _summed(pre, [c.out for c in copies], kc, hbm)
    terms = tuple(x for x in found if x is not None)
    if len(terms) != len(found) or bias is None or not permutes(perm, pre.out, hbm) or \
            hbm[pre.out].shape[-4:-2] != (2, 2):
        return None
    if not all(any(0 <= a + kr < R and 0 <= b + kq < Q for kr, kq, _, _ in terms) for a in range(2) for b in range(2)):
        return None  # a phase with no tap: its output is the bias alone (not built here)
    return Found(conv, perm, len(t) == 6, kc, (2, 2), bias or None, True, frozenset(span), (R, Q), terms)


def _term(copy: EltwiseOp, src: str) -> tuple[int, int, int, int] | None:
    """(kr, kq, d, e) of `T_pad[.., k, a, b, y, x] = T[.., k, a + kr, b + kq, y + d, x + e] ?? 0`."""
    e = copy.expr
    order = [v for _, v in copy.vars]
    if not isinstance(e, sx.Access) or e.tensor != src or e.fill != 0.0 or len(e.indices) != len(order) \
            or copy.out_index or list(e.indices[:-4]) != [sx.Name(v) for v in order[:-4]]:
        return None
    shifts = []
    for ix, v in zip(e.indices[-4:], order[-4:]):
        try:
            coefs, const = affine_index(ix, set(order), {})
        except TilecError:
            return None
        if coefs != {v: 1}:
            return None
        shifts.append(const)
    kr, kq, d, dx = shifts
    return kr, kq, d, dx


def _summed(pre: EltwiseOp, parts: list[str], kc: int, hbm: dict) -> str | None:
    """The per-channel bias of `Y_pre = [b[k] +] T_pad + ..` ("" for none), each part read once at Y_pre's own
    indices; None if the sum is not that."""
    order = [sx.Name(v) for _, v in pre.vars]
    terms: list[sx.Expr] = []

    def walk(x: sx.Expr) -> None:
        if isinstance(x, sx.BinOp) and x.op == "+":
            walk(x.lhs)
            walk(x.rhs)
        else:
            terms.append(x)
    walk(pre.expr)
    reads = [x for x in terms if isinstance(x, sx.Access) and x.tensor in parts]
    if sorted(r.tensor for r in reads) != sorted(parts) or any(list(r.indices) != order or r.fill is not None
                                                               for r in reads):
        return None
    rest = [x for x in terms if not (isinstance(x, sx.Access) and x.tensor in parts)]
    if not rest or rest == [sx.Num(0.0)] or rest == [sx.Num(0)]:
        return ""
    b = rest[0]
    k = order[-5]
    if len(rest) == 1 and isinstance(b, sx.Access) and b.fill is None and list(b.indices) == [k] \
            and hbm[b.tensor].shape == (kc,):
        return b.tensor
    return None
