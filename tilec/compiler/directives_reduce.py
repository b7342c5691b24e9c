"""`reorder` and `split` of a reduction (directives.apply_reorder / apply_split): both are refused at the directive's
line, each saying which case it is and what to write instead. The rules fix a reduction's order for a reason that
depends on the kind: a row reduction reduces one row tile at a time into its accumulator column; a column sum sums
all row tiles of one free tile into one PSUM row. Its tiles are its DMAs (`tile` sets both).
"""
from __future__ import annotations

from typing import NoReturn

from tilec.compiler.ops import ColumnReduceOp, ReduceOp
from tilec.errors import TilecError
from tilec.lang import syntax as sx


def _groups(op: ReduceOp) -> tuple[list[str], list[str], list[str]]:
    """(loops taken one at a time, loops of the outer tiles, loops of the inner tiles) in the rule's order: a row
    reduction's row tiles (kept) outside its reduced tiles; a column sum's outer loops, then its free tiles (kept
    after the reduced run) outside its row tiles (reduced, summed over the partitions)."""
    by = lambda c: [v for role, v in op.vars if role.startswith(c)]  # noqa: E731
    if isinstance(op, ColumnReduceOp):
        return by("o"), by("k"), by("r")
    return [], by("k"), by("r")


def _what(op: ReduceOp) -> tuple[str, str]:
    """(the outer tiles, the inner tiles) in words."""
    if isinstance(op, ColumnReduceOp):
        return "free tiles", "row tiles"
    return "row tiles", "reduced tiles"


def tile_hint(op: ReduceOp) -> str:
    """The `tile` directives that set a reduction's tiles (each tile is one load)."""
    _, outer, inner = _groups(op)
    if isinstance(op, ColumnReduceOp):
        return (f"`tile {op.name}.{inner[0]}, N` sets the rows summed per matmul, `tile {op.name}.{outer[0]}, N` the "
                "columns per PSUM row (each tile is one load)")
    return (f"`tile {op.name}.{inner[0]}, N` sets the elements each tensor_reduce (and each load) takes, "
            f"`tile {op.name}.{outer[0]}, N` the rows per tile")


def refuse_reorder(op: ReduceOp, d: sx.Directive) -> NoReturn:
    """`reorder s, ...` of a reduction: the rule's order (the directive would leave the kernel as it is), loops of
    one flattened run listed apart or swapped, or the reduced tiles asked outside: each a located error with what
    to write instead."""
    span = d.span
    once, outer, inner = _groups(op)
    names = [a.parts[0] if isinstance(a, sx.Ref) and len(a.parts) == 1 else None for a in d.args[1:]]
    known = once + outer + inner
    if None in names or any(n not in known for n in names) or len(set(names)) != len(names):
        raise TilecError(f"reorder lists loop variables of {op.name}, each once: {', '.join(known)}", span)
    listed = [n for n in names if n is not None]
    rank = {v: g for g, vs in enumerate((once, outer, inner)) for v in vs}
    groups = [rank[n] for n in listed]
    o_word, i_word = _what(op)
    if groups != sorted(groups):
        if any(g == 0 for g in groups[next(i for i, g in enumerate(groups) if g):]):
            raise TilecError(f"{', '.join(once)} of {op.name} are taken one at a time outside its tiles: a reorder "
                             "cannot move them inside", span, f"list {', '.join(once)} first, or leave them out")
        if isinstance(op, ColumnReduceOp):
            why = ("the rule sums every row tile of one free tile into one PSUM row (ones matmuls on TensorE) before "
                   "the next free tile; "
                   "the other order would keep a PSUM accumulator per free tile live across the row tiles, which is "
                   "not compiled")
        else:
            why = ("the rule reduces one row tile at a time into its accumulator column; the other order would keep "
                   "every row tile's accumulator live across the reduced loop, which is not compiled")
        raise TilecError(f"{op.name}'s {i_word} ({', '.join(inner)}) cannot go outside its {o_word} "
                         f"({', '.join(outer)}): {why}", span, tile_hint(op))
    for g, run in ((1, outer), (2, inner)):
        mine = [n for n in listed if rank[n] == g]
        if mine != [v for v in run if v in mine]:
            raise TilecError(f"{', '.join(run)} are flattened into one loop of {op.name}'s tiles in the tensor's order "
                             "(contiguous in HBM): swapped, they cannot be ordered", span,
                             f"list them in the tensor's order ({', '.join(run)})")
    raise TilecError(f"`reorder {op.name}, {', '.join(listed)}` is the order the rule compiles {op.name} "
                     f"in already ({o_word} outside {i_word}): the directive would leave the kernel as it is", span,
                     "remove it; " + tile_hint(op))


def refuse_split(op: ReduceOp, d: sx.Directive, loop: str) -> NoReturn:
    """`split s.v, N` of a reduction: its tiles are its DMAs (a row tile x a reduced tile per load; a column sum's
    row tiles loaded in the groups its rule chooses), so there are no tiles within a DMA to split off."""
    what = "a row tile's rows by the elements of one reduced tile" if not isinstance(op, ColumnReduceOp) else \
        "the rows of one row tile by the columns of one free tile (groups of row tiles in flight: the rule's choice)"
    raise TilecError(f"`split` of {op.name}'s loop `{loop}` is not compiled: a reduction's tiles are its DMAs (each "
                     f"load is {what}), so there is no DMA of several tiles to split", d.span, tile_hint(op))
