"""A column sum whose tiles do not divide its sizes (`tile s.i, 64` over 300 summed rows, `tile s.j, 64` over 700
columns): rules.colreduce's plain layout cut into parts. The reduced loop is cut inside each free tile into the
whole row tiles and one tile of the rest, both summed by their ones matmuls into the free tile's PSUM row (the
first matmul of the first part starts the sum, every later one adds: codegen06's accumulate chain). Column sums of
300 x 700 with `tile s.i, 64`:

    split(f, 350, outer=ft, inner=f_i, name=TILE_F)
    reorder(o, ft, r, f_i)
    cut(r, 256)                               r@a: 256 rows, r@b: the last 44
    split(r@a, 64, outer=rt@a, inner=p@a, name=TILE_P); split(r@b, 44, outer=rt@b, inner=p@b)
    partition(p@a, summed=True); partition(p@b, summed=True)
    stage(X_v, rt@a, name=X_tile); stage(X_v, rt@b, name=X_tile_b)
    tensorize(p@a); tensorize(p@b)

Columns the free tiles do not divide cut the nest at its outer loop first, `reorder(o, f, r); cut(f, 640,
root=o)`: each part (o@a .. and o@b ..) is then a column sum of its own columns with its own PSUM row, its rows cut
as above where they are ragged too (loops r@aa, r@ab, ..); an epilogue's nests are cut at the same column
(`cut(e_f, 640, root=e_u)`) and each part computed at its part's free tiles.

A row the sum reads at the kept indices (`abs(X[i, j] - c[j])`) is loaded once per free tile and copied to the
partitions of the whole row tiles once; the last part reads its first partitions (`broadcast(.., others=(p@b,))`)."""
from __future__ import annotations

from tilec.compiler.names import unique
from tilec.compiler.ops import ColumnReduceOp
from tilec.compiler.rules_base import Prim, _ragged_parts, prim
from tilec.compiler.schedule import MOVING_FMAX, PMAX, ReducePlan


def at(base: str, tags: str) -> str:
    """A loop's name in the part `tags` of the cuts (`r`, "ab" -> `r@ab`)."""
    return f"{base}@{tags}" if tags else base


def tags(extent: int, tile: int) -> list[str]:
    """The parts' tags of a loop cut where its tile does not divide it ([""]: not cut)."""
    return ["a", "b"] if extent % tile else [""]


def regions(R: int, parts: int, col: str = "") -> list[tuple[str, str, str]]:
    """(row-tile loop, partition loop, name suffix) of the whole row tiles' part and the rest's, in the column
    part `col`."""
    return [(at("rt", col + t), at("p", col + t), "_" + (col + t) if col + t not in ("", "a") else "")
            for t in tags(R, parts)]


def splits(R: int, parts: int, F: int, free: int, red: list[str]) -> list[Prim]:
    """The free tiles outside the reduced rows (each column part's), the rows cut into the whole tiles and the
    rest, each split into its row tiles and partitions (summed)."""
    cols, rows = _ragged_parts(F, free, 1), _ragged_parts(R, parts, 1)
    out = [prim("reorder", "o", "f", "r"), prim("cut", "f", cols[0][1], root="o")] if len(cols) > 1 else []
    note = f"for {', '.join(red)} (tiles of TILE_P, summed in PSUM)"
    for x, (_, _, tf, _) in zip(tags(F, free), cols):
        out += [prim("split", at("f", x), tf, outer=at("ft", x), inner=at("f_i", x), name="TILE_F" if tf == free
                     else "", note="" if tf == free else f"for the last {tf} columns"),
                prim("reorder", at("o", x), at("ft", x), at("r", x), at("f_i", x))]
        out += [prim("cut", at("r", x), rows[0][1])] if len(rows) > 1 else []
        for y, (_, size, tp, _) in zip(tags(R, parts), rows):
            out += [prim("split", at("r", x + y), tp, outer=at("rt", x + y), inner=at("p", x + y),
                         **({"name": "TILE_P", "note": note} if tp == parts else
                            {"note": f"for the last {size} rows of {', '.join(red)}"})),
                    prim("partition", at("p", x + y), summed=True)]
    return out


def stages(reads: list[str], rows: list[str], v: dict[str, str], taken: set[str], R: int, parts: int, col: str = ""
           ) -> list[Prim]:
    """Each part's tiles of the summed tensors, and the rows read at the kept indices copied to the partitions
    once per free tile (see the module's docstring)."""
    out = [prim("stage", v[B], rt, name=unique(f"{B}_tile{sfx}", taken))
           for rt, _, sfx in regions(R, parts, col) for B in reversed(reads)]
    ps = [p for _, p, _ in regions(R, parts, col)]
    for c in reversed(rows):
        row = unique(f"{c}_row", taken)
        out += [prim("stage", v[c], at("ft", col), name=row),
                prim("broadcast", row, at("ft", col), ps[0], name=unique(f"{c}_tile", taken), others=tuple(ps[1:]))]
    return out


def terms(acc: str, S: str, dtype: str, taken: set[str], R: int, parts: int, how: dict, col: str = ""
          ) -> list[Prim]:
    """The summed expression of each part's tiles computed into a tile of the source's dtype (each part's
    temporaries named apart: their shapes differ)."""
    out: list[Prim] = []
    for _, p, sfx in regions(R, parts, col):
        temps = {"temps": f"tmp{sfx}_"} if sfx else {}
        out += [prim("bind_expr", acc, p, unique(f"{S}_terms{sfx}", taken), dtype=dtype),
                prim("tensorize", f"{p}_x", **how, **temps)]
    return out


def column_parts(S: str, v: dict[str, str], reads: list[str], rows: list[str], taken: set[str], sizes: tuple,
                 lines: tuple[int, int], dtype: str, how: dict | None, what: str, steps: tuple = ()) -> list[Prim]:
    """After `splits` with the columns cut: each column part's PSUM row and its tiles, their expression (`how`:
    tensorize's options; None: a plain sum) and their matmuls, then the part's block. sizes = (R, parts, F, free);
    lines = (the update's, the initial value's). Without an epilogue the row is evicted in the output's dtype and
    stored; `steps` = (loops, before, columns, cast, evict): the epilogue nests (loops e, e_u, e_f, each cut at the
    same column as the sum) computed at each part's free tiles on an fp32 row in SBUF, as rules.colreduce does."""
    R, parts, F, free = sizes
    line, init = lines
    loops, before, columns, cast, evict = steps or ((), False, (), {}, False)
    cols = _ragged_parts(F, free, 1)
    out = [prim("cut", f"{e}_f", cols[0][1], root=e if before else f"{e}_u") for e in loops]
    for x, (c0, size, _, _) in zip(tags(F, free), cols):
        for e in loops:
            out += [prim("reverse_compute_at", at(e if before else f"{e}_u", x), at("ft", x)),
                    prim("partition", at(f"{e}_u", x) + "_r")]
        acc, row = unique(f"{S}_acc", taken), unique(f"{S}_row", taken)
        # each part's narrow tile a name of its own, as its rows have (their widths differ)
        narrow = {"cast": cast["cast"] if x in ("", "a") else unique(cast["cast"], taken)} if cast else {}
        if loops:  # an fp32 row the steps work on, the sums in PSUM before it
            out += [prim("stage_out", v[S], at("ft", x), name=row, line=line, dtype="f32", **narrow),
                    prim("stage_out", row, at("ft", x), memory="psum", name=acc, line=line,
                         of="+".join(rt for rt, _, _ in regions(R, parts, x)))]
        else:
            out += [prim("stage_out", v[S], at("ft", x), memory="psum", name=acc, line=line, dtype="f32", cast=row)]
        out += stages(reads, rows, v, taken, R, parts, x)
        out += terms(acc, S, dtype, taken, R, parts, how, x) if how is not None else []
        out += [prim("stage", v[c], at("ft", x), name=unique(f"{c}_row", taken), near=True) for c in columns]
        out += [prim("tensorize", p, line=init) for _, p, _ in regions(R, parts, x)]
        out += [prim("tensorize", at(f"{e}_u", x) + "_r", **({"evict": True} if evict and n == 0 else {}))
                for n, e in enumerate(loops)]
        out += [prim("block", at("o", x), f"{what}, columns {c0}..{c0 + size}")]
    return out


def refusal(op: ColumnReduceOp, plan: ReducePlan) -> str:
    """Why a column sum's tiles that do not divide its rows or columns are refused where the rule does not take
    them (the pipeline's `tile` refusal), and what to write instead."""
    cut = [(n, size, what, most) for n, size, what, most in ((plan.parts, op.dim("R"), "reduced rows", PMAX),
                                                             (plan.free, op.dim("F"), "columns", MOVING_FMAX))
           if size % n]
    fits = "; ".join(f"{what}: " + ", ".join([str(d) for d in range(min(size, most), 0, -1) if size % d == 0][:5])
                     for _, size, what, most in cut)
    return (" and ".join(f"a tile of {n} does not divide its {size} {what}" for n, size, what, _ in cut) +
            ", which only the column rule's plain layout cuts (whole tiles and one of the rest); at these sizes a "
            "builder of its own sums it (few reduced rows, many outer rows, a loop of one iteration, or a maximum): "
            f"use divisors ({fits})")
