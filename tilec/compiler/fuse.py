"""The `fuse` primitive on level A: two sibling nests over the same extents become one nest computing both in each
iteration, so what they both read is read once per iteration (a tile staged for one serves the other):

    for i in serial(M):                          for i in serial(M):
      for j in serial(H):                          for j in serial(H):
        Y[i, j] = X[i, j] * C[i, j]      ->          Y[i, j] = X[i, j] * C[i, j]
    for i#1 in serial(M):                            Z[i, j] = X[i, j + H] * C[i, j]
      for j#1 in serial(H):
        Z[i#1, j#1] = X[i#1, j#1 + H] * C[i#1, j#1]

(golden: primitives/fuse*.txt). The second nest's loops take the first's names. Legal when every buffer one of the
nests writes and the other reads or writes is accessed at one index by both: then each element is written and read
in the same iteration, in the order the program has them, so no iteration sees a value another would not have.
A read of such a buffer at another index (`T[i, j + 1]` after `T[i, j] = ..`) would read a later iteration's
element before it is written: refused, naming both accesses. siblings.py does the same fusion for the halo groups
the builders take (RoPE's halves); this is its form on any level-A nest."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.ir import Aff, Term
from tilec.compiler.nest import Access, Assign, Kernel, Loop, Stmt, Update, fmt_access, loads, walk
from tilec.compiler.primitives import _fail, _siblings, _subst, _with_pair, find_loop
from tilec.errors import Span


def fuse(k: Kernel, first: str, second: str, span: Span | None = None) -> Kernel:
    a, b = find_loop(k, first, span), find_loop(k, second, span)
    if _siblings(k.body, a, b) is None:
        raise _fail(f"fuse {first}, {second}: the loops are not next to each other in one body", span,
                    "fuse two consecutive nests")
    chain_a, chain_b = _chain(a), _chain(b)
    if [lp.extent for lp in chain_a] != [lp.extent for lp in chain_b]:
        shown = lambda c: ", ".join(str(lp.extent) for lp in c)  # noqa: E731
        raise _fail(f"fuse {first}, {second}: the nests run over different extents ({shown(chain_a)} and "
                    f"{shown(chain_b)})", span, "fuse nests over the same loops")
    body_b = chain_b[-1].body
    for lb, la in zip(chain_b, chain_a):
        body_b = _subst(body_b, lb.var, Aff((Term(la.var),)))
    _check_independent(chain_a[-1].body, body_b, f"fuse {first}, {second}", span)
    merged = replace(chain_a[-1], body=chain_a[-1].body + body_b)
    for lp in reversed(chain_a[:-1]):
        merged = replace(lp, body=(merged,))
    return _with_pair(k, a, b, merged)


def _chain(loop: Loop) -> list[Loop]:
    """The loops of a perfect nest from `loop` down (each holding only the next)."""
    chain = [loop]
    while len(chain[-1].body) == 1 and isinstance(chain[-1].body[0], Loop):
        chain.append(chain[-1].body[0])
    return chain


def _accesses(body: tuple[Stmt, ...]) -> tuple[list[Access], list[Access]]:
    """(the reads, the writes) of every assignment and update in `body`."""
    reads: list[Access] = []
    writes: list[Access] = []
    for s in walk(body):
        if isinstance(s, (Assign, Update)):
            reads += loads(s.expr) + ([s.dst] if isinstance(s, Update) else [])
            writes.append(s.dst)
    return reads, writes


def _check_independent(body_a: tuple[Stmt, ...], body_b: tuple[Stmt, ...], what: str, span: Span | None) -> None:
    reads_a, writes_a = _accesses(body_a)
    reads_b, writes_b = _accesses(body_b)
    written = {x.buf for x in writes_a + writes_b}
    for buf in sorted(written):
        in_a = [x for x in reads_a + writes_a if x.buf == buf]
        in_b = [x for x in reads_b + writes_b if x.buf == buf]
        if not in_a or not in_b:
            continue
        other = next((x for x in in_a + in_b if x != in_a[0]), None)
        if other is not None:
            raise _fail(f"{what}: {buf} is accessed as {fmt_access(in_a[0])} and as {fmt_access(other)}, and one "
                        f"of the nests writes it: fused, an iteration would read an element another writes", span,
                        "fuse nests that share only what they read, or read what the first writes at its index")
