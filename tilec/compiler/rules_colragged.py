"""A column sum whose reduced rows the row tiles do not divide (`tile s.i, 64` over 300 rows): rules.colreduce's
plain layout with the reduced loop cut inside each free tile into the whole row tiles and one tile of the rest,
both summed by their ones matmuls into the free tile's PSUM row (the first matmul of the first part starts the
sum, every later one adds: codegen06's accumulate chain). Column sums of 300 x 700 with `tile s.i, 64`:

    split(f, 350, outer=ft, inner=f_i, name=TILE_F)
    reorder(o, ft, r, f_i)
    cut(r, 256)                               r@a: 256 rows, r@b: the last 44
    split(r@a, 64, outer=rt@a, inner=p@a, name=TILE_P); split(r@b, 44, outer=rt@b, inner=p@b)
    partition(p@a, summed=True); partition(p@b, summed=True)
    stage(X_v, rt@a, name=X_tile); stage(X_v, rt@b, name=X_tile_b)
    tensorize(p@a); tensorize(p@b)

A row the sum reads at the kept indices (`abs(X[i, j] - c[j])`) is loaded once per free tile and copied to the
partitions of the whole tiles once; the last part reads its first partitions (`broadcast(.., others=(p@b,))`)."""
from __future__ import annotations

from tilec.compiler.names import unique
from tilec.compiler.rules_base import Prim, _ragged_parts, prim


def regions(R: int, parts: int) -> list[tuple[str, str, str]]:
    """(row-tile loop, partition loop, name suffix) of the whole tiles' part and the rest's."""
    return [(f"rt@{t}", f"p@{t}", "" if t == "a" else "_b") for t in "ab"[:len(_ragged_parts(R, parts, 1))]]


def splits(R: int, parts: int, free: int, red: list[str]) -> list[Prim]:
    """The free tiles outside the reduced rows, the rows cut into the whole tiles and the rest, each split into
    its row tiles and partitions (summed)."""
    (_, whole, tp, _), (_, rest, tr, _) = _ragged_parts(R, parts, 1)
    note = f"for {', '.join(red)} (tiles of TILE_P, summed in PSUM)"
    return [prim("split", "f", free, outer="ft", inner="f_i", name="TILE_F"),
            prim("reorder", "o", "ft", "r", "f_i"),
            prim("cut", "r", whole),
            prim("split", "r@a", tp, outer="rt@a", inner="p@a", name="TILE_P", note=note),
            prim("split", "r@b", tr, outer="rt@b", inner="p@b", note=f"for the last {rest} rows of "
                                                                     f"{', '.join(red)}"),
            prim("partition", "p@a", summed=True), prim("partition", "p@b", summed=True)]


def stages(reads: list[str], rows: list[str], v: dict[str, str], taken: set[str], R: int, parts: int
           ) -> list[Prim]:
    """Each part's tiles of the summed tensors, and the rows read at the kept indices copied to the partitions
    once per free tile (see the module's docstring)."""
    out = [prim("stage", v[B], rt, name=unique(f"{B}_tile{sfx}", taken))
           for rt, _, sfx in regions(R, parts) for B in reversed(reads)]
    for c in reversed(rows):
        row = unique(f"{c}_row", taken)
        out += [prim("stage", v[c], "ft", name=row),
                prim("broadcast", row, "ft", "p@a", name=unique(f"{c}_tile", taken), others=("p@b",))]
    return out


def terms(acc: str, S: str, dtype: str, taken: set[str], R: int, parts: int, how: dict) -> list[Prim]:
    """The summed expression of each part's tiles computed into a tile of the source's dtype (each part's
    temporaries named apart: their shapes differ)."""
    out: list[Prim] = []
    for _, p, sfx in regions(R, parts):
        temps = {"temps": "tmp_b_"} if sfx else {}
        out += [prim("bind_expr", acc, p, unique(f"{S}_terms{sfx}", taken), dtype=dtype),
                prim("tensorize", f"{p}_x", **how, **temps)]
    return out
