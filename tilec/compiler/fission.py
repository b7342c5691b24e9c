"""Loop distribution of several reductions written in one loop nest (user20): a user computes two statistics in one
pass, as the NumPy loop reads,

    for n in 0..N, h in 0..H, w in 0..W:           # CBAM's channel max and mean
      Mx[n, h, w] = -inf
      Mn[n, h, w] = 0
      for c in 0..C:
        Mx[n, h, w] max= X[n, c, h, w]
        Mn[n, h, w] += X[n, c, h, w] / C

and the rules map one tensor's init and reduction at a time (lower.py merges an init with the reduction right after
it). When the statements of a loop's body fall into groups that write disjoint tensors and no group reads what
another group writes in that loop, the loop is one loop per group, in the order the groups first write:

    for n, h, w:  Mx = -inf;  for c: Mx max= ...
    for n, h, w:  Mn = 0;     for c: Mn += ...

Each statement then runs for the same iterations, in the same order relative to the statements it depends on (the
values a group reads are written before the loop or by the group itself), so the result is the same. Only loops
whose body holds a nested loop or a reduction are distributed: a body of element-wise statements already lowers
one statement at a time."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.rewrite import leaves, resolved, written
from tilec.lang import syntax as sx


def distribute_reductions(program):
    """The program with each loop whose body holds a nested loop and writes several tensors independently split into
    one loop per group of statements (see the module's text); the same object when no loop is split."""
    body: list[sx.Stmt] = []
    for st in program.kernel.body:
        body += _distributed(st)
    if len(body) == len(program.kernel.body):
        return program
    return resolved(program, replace(program.kernel, body=tuple(body)))


def _distributed(st: sx.Stmt) -> list[sx.Stmt]:
    """`st` as one or more statements (the loops its distribution makes, outermost split first)."""
    if not isinstance(st, sx.Loop):
        return [st]
    children: list[sx.Stmt] = []
    for child in st.body:
        children += _distributed(child)
    reducing = any(isinstance(c, sx.Loop) or c.op != "=" for c in children if isinstance(c, (sx.Loop, sx.Assign)))
    groups = _groups(children) if reducing else [children]
    return [replace(st, body=tuple(g)) for g in groups]


def _groups(children: list[sx.Stmt]) -> list[list[sx.Stmt]]:
    """The children in groups that write disjoint tensors (children writing a common tensor together), in the order
    of their first child; one group when some group reads a tensor another group writes."""
    groups: list[tuple[set[str], list[sx.Stmt]]] = []
    for child in children:
        wrote = written(child)
        joined = [g for g in groups if g[0] & wrote]
        merged: tuple[set[str], list[sx.Stmt]] = (set(wrote), [])
        for g in groups:
            if g in joined:
                merged[0].update(g[0])
                merged[1].extend(g[1])
        merged[1].append(child)
        first = next((i for i, g in enumerate(groups) if g in joined), len(groups))
        groups = [g for g in groups if g not in joined]
        groups.insert(min(first, len(groups)), merged)
    for tensors, members in groups:
        reads = {a.tensor for m in members for leaf, _ in leaves(m) if isinstance(leaf, sx.Assign)
                 for a in accesses(leaf.value)}
        if any(reads & other for other, _ in groups if other is not tensors):
            return [children]
    position = {id(c): i for i, c in enumerate(children)}
    return [sorted(members, key=lambda m: position[id(m)]) for _, members in groups]
