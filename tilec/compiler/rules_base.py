"""What every rule module shares: a primitive application (Prim, prim) and the loop/region helpers the
rules use (rules.py re-exports them)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Prim:
    """One primitive application: `split(f, 200, outer=t)`."""
    name: str
    args: tuple[Any, ...]
    kw: tuple[tuple[str, Any], ...] = ()

    def __str__(self) -> str:
        args = [_fmt(a) for a in self.args] + [f"{k}={_fmt(v)}" for k, v in self.kw]
        return f"{self.name}({', '.join(args)})"


def _fmt(v: Any) -> str:
    if isinstance(v, tuple):
        return "(" + ", ".join(_fmt(x) for x in v) + ")"
    return repr(v) if isinstance(v, str) and (" " in v or not v) else str(v)


def prim(primitive: str, /, *args: Any, **kw: Any) -> Prim:
    return Prim(primitive, args, tuple(kw.items()))


def settings(prims: list[Prim], unroll: tuple[str, ...], single: tuple[str, ...]) -> list[Prim]:
    """A plan's directives beyond tile sizes, after a rule's primitives: `unroll` (`unroll_tiles(t)`: every tile
    loop of that name, in every region) and `buffers X, 1` (`single(X_tile)`: each tile staged from X allocated
    once, before the loops; lower_tiles reads it)."""
    prims = prims + [prim("unroll_tiles", u) for u in unroll]
    alias: dict[str, str] = {}  # HBM view -> the tensor it shows (the reshapes' views, chained)
    for r in (r for r in prims if r.name == "reshape"):
        for buf, view in dict(r.kw)["views"]:
            alias[view] = alias.get(buf, buf)
    staged = [str(dict(r.kw)["name"]) for r in prims if r.name in ("stage", "stage_out") and
              alias.get(r.args[0]) in single]
    return prims + [prim("single", name) for name in staged]


def _plain(index) -> list[str] | None:
    out = []
    for i in index:
        if len(i.terms) != 1 or i.terms[0].coef != 1 or i.const:
            return None
        out.append(i.terms[0].var)
    return out


def _const(size: int, planned: int, dim: str) -> str:
    """TILE_P / TILE_F where a region's tile is the plan's whole tile; "" (a plain number) for the rest."""
    return f"TILE_{dim}" if size == planned else ""


def _at(parts: int, r: int, cols: int = 1, c: int = 0) -> str:
    """The level-A suffix of a region's loops after cuts (`i@ab`: rows part a, columns part b); "" without cuts."""
    tags = ("ab"[r] if parts > 1 else "") + ("ab"[c] if cols > 1 else "")
    return f"@{tags}" if tags else ""


def _ragged_parts(extent: int, tile: int, per_strip: int) -> list[tuple[int, int, int, int]]:
    """(start, size, block, blocks per strip) of the whole blocks, then of the remainder (one block)."""
    whole = extent - extent % tile
    parts = [(0, whole, tile, per_strip)] if whole else []
    return parts + ([(whole, extent % tile, extent % tile, 1)] if extent % tile else [])


def later_nest(var: str, made: list[str], more: bool) -> str:
    """The reference of the first nest still named `var` (a user's loop) after a rule reshaped the nests before it
    into loops named `made` (its own names, distinct): `var#1` when one of them is named `var` too (a kept loop the
    user called `r` or `e`), `var#0` when further nests of that name follow, else `var`."""
    count = made.count(var)
    return f"{var}#{count}" if count or more else var
