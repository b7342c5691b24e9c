"""Sibling fusion: element-wise statements over one domain that read the same source, built as one nest so each
tile of the source (and of every operand they share) is loaded once for all of them.

A rotary embedding writes the two halves of every row from the same three tensors:

    for s, d:  Y[s, d]      = X[s, d] * Cs[s, d] - X[s, Dh + d] * Sn[s, d]
    for s, d:  Y[s, Dh + d] = X[s, Dh + d] * Cs[s, d] + X[s, d] * Sn[s, d]

Each statement is a halo group of its own (build_halo.py: X's tile loaded with its shifts, Cs and Sn beside it),
so X, Cs and Sn crossed HBM twice: 2.5 KB of traffic per row where 1.5 KB is the floor. `with_siblings` extends
the group at op i with every later group over the same source and the same output shape; build_halo then loads
the source once with the union of their shifts, each plain operand once, and computes and stores each user.

Legality (fusing moves a sibling's ops up to the first group, and interleaves the groups' tiles):
- no sibling reads what an earlier group of the fusion writes, at any index, nor writes what one reads or writes
  (so interleaving their tiles changes no value: the groups are independent);
- every op passed over between the groups neither writes what the sibling reads nor reads or writes what it writes
  (so the sibling may move above it);
- the shifts together stay within build_halo.MAX_HALO columns, or the tile is the source's whole row
  (build_halo.too_wide: a wider tile would reload most of its columns);
- no op of the sibling is one a row chain builds (fusers.Site.chains), and the nest with its siblings fits the
  SBUF budget (fusers._halo builds the group alone otherwise).
A sibling that fails is left to be built on its own; nothing is refused."""
from __future__ import annotations

from dataclasses import replace
from typing import AbstractSet

from tilec.compiler.build_halo import Halo, shifted_group, too_wide


def with_siblings(h: Halo, ops: tuple, keep: AbstractSet[str], scheduled: AbstractSet[str],
                  shapes: dict[str, tuple[int, ...]], sizes: dict[str, int], taken: AbstractSet[int]) -> Halo:
    """`h` with its siblings (the module docstring); `taken`: ops another fused part builds (never a sibling's)."""
    from tilec.compiler.build_rowchain import reads_of
    members = list(h.op_range)
    reads = {n for j in members for n in reads_of(ops[j])}
    writes = {ops[j].out for j in members}
    passed: list[int] = []
    k = members[-1] + 1
    while k < len(ops):
        g = shifted_group(ops, k, keep, scheduled, shapes, sizes)
        if g is None or not _same_domain(h, g) or too_wide(h.shifts + g.shifts, h.cols, h.width) or \
                set(g.op_range) & taken:
            passed.append(k)
            k += 1
            continue
        g_reads = {n for j in g.op_range for n in reads_of(ops[j])}
        g_writes = {ops[j].out for j in g.op_range}
        moved_over = [ops[j] for j in passed]
        if g_reads & writes or g_writes & (reads | writes) or \
                any(o.out in g_reads or g_writes & ({o.out} | set(reads_of(o))) for o in moved_over):
            passed.append(k)
            k += 1
            continue
        h = replace(h, shifts=h.shifts + g.shifts, siblings=h.siblings + tuple(g.op_range))
        reads, writes = reads | g_reads, writes | g_writes
        k += g.count
    return h


def _same_domain(h: Halo, g: Halo) -> bool:
    return (g.src, g.rows, g.cols, g.width) == (h.src, h.rows, h.cols, h.width)
