"""Element-wise work on the way through a transpose, `Y[b, j, i] = relu(X[b, i, j])`, `Y[n, c, h, w] = s[c] *
X[n, h, w, c] - 1.5`: what a transpose can apply on its PSUM -> SBUF eviction (instructions reading the transposed
tile, vectors indexed by the output's partition run as per-partition columns), so the permute is one pass over the
data, not an element-wise pass through an HBM temporary and then a permute (permute_split.py's split).

The value must read one tensor over all the loops in the order of a swap of two runs (select_permute.one_step is
"runs"), and constants, and other tensors plainly, all exactly over the second run (the transposed tile's
partitions: the value is computed on the eviction from PSUM) or all over the first (the source tile's partitions:
the value is computed on the source block into an SBUF tile, which is then transposed and copied out). Both levels read it: the program (permute_split keeps the statement whole, select builds the
TransposeOp with the value) and the level-A nest (rules_transpose finds the read and stages the vectors, tensorize
emits the transpose and then the value on the PSUM tile)."""
from __future__ import annotations

from tilec.compiler.nest import Expr, Load, Op
from tilec.lang import syntax as sx
from tilec.lang.functions import FUNCTIONS

_OPS = ("+", "-", "*", "/")


def runs(src: tuple[str, ...], out: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The two runs of `src` a swap exchanges (`[b, i.., j..] -> [b, j.., i..]`: (i.., j..)), or None when the
    permute is not one swap of runs."""
    if sorted(src) != sorted(out) or src == out:
        return None
    k = next(i for i, (x, y) in enumerate(zip(src, out)) if x != y)
    rest, want = src[k:], out[k:]
    cut = next((c for c in range(1, len(rest)) if rest[c:] + rest[:c] == want), None)
    return None if cut is None else (rest[:cut], rest[cut:])


def _names(a: sx.Access) -> tuple[str, ...] | None:
    names = tuple(ix.id for ix in a.indices if isinstance(ix, sx.Name))
    return names if len(names) == len(a.indices) and a.fill is None else None


def _ops_ok(e: sx.Expr) -> bool:
    """Only what the eviction's instructions compute: + - * / and negation, one- or two-argument functions."""
    if isinstance(e, (sx.Num, sx.Access)):
        return True
    if isinstance(e, sx.Neg):
        return _ops_ok(e.x)
    if isinstance(e, sx.BinOp):
        return e.op in _OPS and _ops_ok(e.lhs) and _ops_ok(e.rhs)
    if isinstance(e, sx.Call):
        return e.fn in FUNCTIONS and FUNCTIONS[e.fn].instr != "cast" and all(_ops_ok(x) for x in e.args)
    return False


def syntax_fused(e: sx.Expr, out: tuple[str, ...], reads) -> sx.Access | None:
    """The permuted read of `e` (a statement's value whose stored indices are the loop variables `out`) when the
    transpose can compute `e` on its eviction, else None. `reads`: e's accesses. Reads in the output's order, over
    all the loops or all but the batch (`X[i, j]` beside `X[j, i]`: a symmetric part; `c[i, j]` of `Y[b, i, j]`), are
    tiles staged like the output's strip and read on the eviction, so the vectors beside them must be over the
    result's partitions too."""
    if isinstance(e, sx.Access) or not _ops_ok(e):
        return None
    full = [a for a in reads if (_names(a) or ()) and sorted(_names(a) or ()) == sorted(out)]
    moved = [a for a in full if _names(a) != out]
    if len(moved) != 1:
        return None
    both = runs(_names(moved[0]) or (), out)
    if both is None:
        return None
    unbatched = out[len(out) - len(both[0]) - len(both[1]):]  # a tile read for every batch: `c[i, j]` of `Y[b, i, j]`
    tiles = [a for a in reads if a not in moved and _names(a) in (out, unbatched)]
    vectors = {_names(a) for a in reads if a not in moved and a not in tiles}
    if any(a.tensor == moved[0].tensor for a in tiles) and (len(both[0]) > 1 or len(both[1]) > 1):
        return None  # X[i, j, k] beside X[j, k, i]: no one view of X shows both (rules_transpose keeps single runs)
    if not (vectors <= {both[1]} or (vectors <= {both[0]} and not tiles)):
        return None  # the vectors all over the source's partitions (done before) or the result's (on eviction)
    return moved[0]


def nest_read(e: Expr, loops: list[str], out: list[str] | None = None) -> Load | None:
    """The level-A read over all of `loops` (the tensor transposed) when e is such a value: one read over all
    the loops (other than reads in the output's index order `out`: tiles read on the eviction), the others reading
    some of them, only the eviction's operations around."""
    def var_set(a) -> list[str]:
        return sorted(t.var for i in a.index for t in i.terms)

    def in_order(a) -> list[str]:
        return [t.var for i in a.index for t in i.terms]

    full = [x for x in _leaves(e) if isinstance(x, Load) and var_set(x.access) == sorted(loops)
            and in_order(x.access) != out]
    if len(full) != 1 or not _nest_ops_ok(e):
        return None
    return full[0]


def _nest_ops_ok(e: Expr) -> bool:
    if isinstance(e, Op):
        known = e.name in _OPS or e.name == "neg" or (e.name in FUNCTIONS and FUNCTIONS[e.name].instr != "cast")
        return known and all(_nest_ops_ok(x) for x in e.args)
    return True


def _leaves(e: Expr):
    if isinstance(e, Op):
        for x in e.args:
            yield from _leaves(x)
    else:
        yield e
