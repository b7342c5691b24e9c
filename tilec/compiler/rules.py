"""Default schedules as rules (TVM DLight style): `rule(nest, target, params) -> list[Prim] | None`.

A rule recognises a level-A nest (compiler/nest.py), and either says "not applicable" (None) or writes its schedule
as a list of primitive applications: data, printable, applied by `apply` with the primitives' own legality checks
(primitives.py, layout.py). The code generator lowers the scheduled nest (lower_tiles.py); the rule's parameters
(a record such as `EltwisePlan`) are what directives and the tuner change.

    eltwise(nest, target, EltwisePlan(128, 200))   z[i] = x[i] + y[i], i < 25600:
        reshape(i, (p, 128), (f, 200))              the data as 128 partitions x 200 elements (HBM views)
        split(f, 200, outer=t, inner=f_i, name=TILE_F)
        reorder(t, p)                               free tiles outermost, the partitions inside
        partition(p)
        stage_out(z_v, t, name=z_tile)              the result tile in SBUF, stored after the body
        stage(y_v, t, name=y_tile) ...              each input tile loaded into SBUF
        tensorize(p)                                the tile's expression -> engine instructions
        block(t, "z = element-wise, 128 partitions")

`fallback` is the generic rule: any injective element-wise nest, with default parameters.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

from tilec.compiler import layout, primitives as pr, rules_copy
from tilec.compiler.names import unique
from tilec.compiler.nest import (Access, Assign, Const, Expr, Kernel, Load, Loop, Op, Update, fmt_expr, loads,
                                 loop_index)
from tilec.compiler.schedule import EltwisePlan, ReducePlan, TransposePlan, best_divisor, eltwise_plan
from tilec.compiler.select_eltwise import turn_run, turns
from tilec.compiler.select_permute import dma_runs
from tilec.lang.functions import ACCUMULATE
from tilec.target import Target

WHOLE_ROWS_BYTES = 32 * 1024  # SBUF per partition broadcast rows may take when copied once for the whole nest
COPY_TILE_BYTES = 64 * 1024  # SBUF per partition of a replicated (upsampled) tile; larger ones go in row chunks


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


def _lowering_only(k: Kernel, *args: Any, **kw: Any) -> Kernel:
    return k


# primitives applied to the nest; `tensorize` and `block` only instruct the lowering (lower_tiles.py)
_PRIMITIVES: dict[str, Callable[..., Kernel]] = {
    "reshape": layout.reshape, "split": pr.split, "reorder": pr.reorder, "partition": pr.partition,
    "unroll": pr.unroll, "stage": pr.stage, "stage_out": layout.stage_out, "broadcast": layout.broadcast,
    "buffers": pr.buffers, "fold_init": pr.fold_init, "stage_grouped": layout.stage_grouped, "cut": layout.cut,
    "merge_dims": layout.merge_dims,
    "bind_expr": pr.bind_expr, "reverse_compute_at": pr.reverse_compute_at, "pair": pr.pair,
    "tensorize": _lowering_only, "block": _lowering_only,
    "resolve_fill": rules_copy.resolve_fill, "fill_from": rules_copy.fill_from,
}
# these check capacity against the target
_TARGETED = ("partition", "stage", "stage_out", "broadcast", "buffers", "stage_grouped", "fill_from", "bind_expr")


def apply(k: Kernel, prims: list[Prim], target: Target) -> Kernel:
    for p in prims:
        kw = dict(p.kw)
        if p.name in _TARGETED:
            kw["target"] = target
        k = _PRIMITIVES[p.name](k, *p.args, **kw)
    return k


def print_prims(prims: list[Prim]) -> str:
    return "".join(f"{p}\n" for p in prims)


# ---- element-wise --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Injective:
    """What the element-wise rule sees in a nest: one assignment under a perfect nest of loops, its reads either
    indexed like the output (full), or by a run of its indices (a broadcast: columns lead, rows trail)."""
    top: Loop
    stmt: Assign
    loops: tuple[Loop, ...]
    full: tuple[str, ...]
    columns: tuple[str, ...]
    rows: tuple[str, ...]
    run: tuple[int, int]  # the output indices on the partitions (with broadcasts); (0, 0): the data flattened


def injective(k: Kernel) -> Injective | None:
    """The nest's element-wise structure, or None when it is not one injective assignment over plain indices."""
    tops = [s for s in k.body if isinstance(s, Loop)]
    if len(tops) != 1:
        return None
    chain = layout.perfect_chain(tops[0])
    body = chain[-1].body
    if len(body) != 1 or not isinstance(body[0], Assign):
        return None
    stmt, names = body[0], [lp.var for lp in chain]
    if _plain(stmt.dst.index) != names:
        return None
    full: list[str] = []
    columns: list[str] = []
    rows: list[str] = []
    runs: set[tuple[int, int, bool]] = set()
    for a in loads(stmt.expr):
        idx = _plain(a.index)
        if idx is None and reversed_loops(a, chain) is not None and a.buf != stmt.dst.buf:
            full += [a.buf] if a.buf not in full else []  # a reversed read of every loop (A[N - 1 - i, j])
            continue
        if idx is None or a.buf == stmt.dst.buf:
            return None
        if idx == names:
            full += [a.buf] if a.buf not in full else []
            continue
        if not idx or idx[0] not in names or names[names.index(idx[0]):names.index(idx[0]) + len(idx)] != idx:
            return None
        first = names.index(idx[0])
        group = rows if first + len(idx) == len(names) else columns
        group += [a.buf] if a.buf not in group else []
        runs.add((first, first + len(idx), group is rows))
    col = next(((a, b) for a, b, r in runs if not r), None)
    row = next(((a, b) for a, b, r in runs if r), None)
    run = col or ((0, row[0]) if row else (0, 0))
    found = turns([f for a in loads(stmt.expr) if (f := reversed_loops(a, chain))], len(chain))
    if found and run == (0, 0):
        want = turn_run(found, len(chain))
        if want is None:
            return None
        run = want
    if not found <= {0, *run, len(chain)}:
        return None
    return Injective(tops[0], stmt, tuple(chain), tuple(full), tuple(columns), tuple(rows), run)


def reversed_loops(a: Access, chain: list[Loop]) -> tuple[int, ...] | None:
    """The loops (positions in the chain) an access indexed by every loop in order reads reversed (`A[N - 1 - i,
    j]`: the index n - 1 - v of a loop v of extent n), or None when it is not such an access."""
    if len(a.index) != len(chain):
        return None
    out = []
    for d, (i, lp) in enumerate(zip(a.index, chain)):
        way = loop_index(i, {lp.var: lp.extent})
        if way is None:
            return None
        if way[1]:
            out.append(d)
    return tuple(out)


def _plain(index) -> list[str] | None:
    out = []
    for i in index:
        if len(i.terms) != 1 or i.terms[0].coef != 1 or i.const:
            return None
        out.append(i.terms[0].var)
    return out


def eltwise_layout(n: Injective) -> tuple[tuple[str, int], ...]:
    """(), or with broadcasts the output as O (outer) x P (partitions) x F (free)."""
    if n.run == (0, 0):
        return ()
    ext = [lp.extent for lp in n.loops]
    a, b = n.run
    return (("O", math.prod(ext[:a])), ("P", math.prod(ext[a:b])), ("F", math.prod(ext[b:])))


def eltwise_params(n: Injective) -> EltwisePlan:
    """The default parameters (schedule.eltwise_plan, which the op's default plan uses too)."""
    return eltwise_plan(math.prod(lp.extent for lp in n.loops), dict(eltwise_layout(n)), bool(n.rows))


def eltwise(k: Kernel, target: Target, params: EltwisePlan | None = None) -> list[Prim] | None:
    """The element-wise rule: tiles of parts x free elements; inputs staged per tile, columns per partition tile,
    rows copied to every partition (once for the whole nest when they fit), the result staged and stored. Sizes
    the tiles do not divide are cut into the whole tiles and the rest (`cut`): flattened data then goes on the
    partitions along its own loops (the leading ones, where the fewest tiles cover it)."""
    n = injective(k)
    if n is None:
        return None
    default = eltwise_params(n)
    params = params or default
    if _unit_column(n) and params == default:  # (tiles a user's directives chose keep the column layout)
        return _unit_column_alone(n, params)
    if n.run == (0, 0):
        size = math.prod(lp.extent for lp in n.loops)
        if size % params.parts == 0 and (size // params.parts) % params.free == 0:
            return _flat(n, params)
        n = replace(n, run=(0, _split_point(n, params)))
    return _broadcast(n, params)


def _split_point(n: Injective, p: EltwisePlan) -> int:
    """Where flattened data that the plan's tiles do not divide leaves the partitions: the loops before it go on
    them, the rest on the free dimension; the split with the fewest (ragged) tiles."""
    ext = [lp.extent for lp in n.loops]
    tiles = lambda k: -(-math.prod(ext[:k]) // p.parts) * -(-math.prod(ext[k:]) // p.free)  # noqa: E731
    return min(range(1, len(ext) + 1), key=lambda k: (tiles(k), k))


def fallback(k: Kernel, target: Target) -> list[Prim] | None:
    """The generic rule: any injective element-wise nest, with the default parameters."""
    return eltwise(k, target)


class _Names:
    """Names of the buffers a rule makes, unique in the nest (a user tensor may be called `A_v` or `A_tile`)."""

    def __init__(self, n: Injective) -> None:
        self.taken = {n.stmt.dst.buf} | {a.buf for a in loads(n.stmt.expr)}

    def __call__(self, base: str) -> str:
        return unique(base, self.taken)


def _views(n: Injective, name: _Names) -> dict[str, str]:
    """The HBM view of each buffer, named in the order reshape makes them (operands, result, columns, rows)."""
    return {b: name(f"{b}_v") for b in (*n.full, n.stmt.dst.buf, *n.columns, *n.rows)}


def _flat(n: Injective, p: EltwisePlan) -> list[Prim]:
    size = math.prod(lp.extent for lp in n.loops)
    names = ", ".join(lp.var for lp in n.loops)
    out = n.stmt.dst.buf
    name = _Names(n)
    v = _views(n, name)
    prims = [prim("reshape", n.top.var, (("p", p.parts), ("f", size // p.parts)), notes=("", f"for {names}"),
                  lines=(n.top.line, n.top.line), views=tuple(v.items())),
             prim("split", "f", p.free, outer="t", inner="f_i", name="TILE_F"),
             prim("reorder", "t", "p"),
             prim("partition", "p"),
             prim("stage_out", v[out], "t", name=name(f"{out}_tile"))]
    prims += [prim("stage", v[b], "t", name=name(f"{b}_tile")) for b in reversed(n.full)]
    return prims + [prim("tensorize", "p"), prim("block", "t", f"{out} = element-wise, {p.parts} partitions")]


def _broadcast(n: Injective, p: EltwisePlan) -> list[Prim]:
    lay = dict(eltwise_layout(n))
    a, b = n.run
    names = [lp.var for lp in n.loops]
    lines = (n.loops[0].line, n.loops[a].line if a < len(n.loops) else n.top.line,
             n.loops[b].line if b < len(n.loops) else n.top.line)
    name = _Names(n)
    v = _views(n, name)
    prims = [prim("reshape", n.top.var, (("o", lay["O"]), ("p", lay["P"]), ("f", lay["F"])),
                  notes=(f"for {', '.join(names[:a])}", f"for {', '.join(names[a:b])}",
                         f"for {', '.join(names[b:])}"), lines=lines, views=tuple(v.items()))]
    # tiles the sizes do not divide: cut the partitions and the free elements into whole tiles and the rest
    rows = _ragged_parts(lay["P"], min(p.parts, lay["P"]), 1)
    cols = _ragged_parts(lay["F"], min(p.free, lay["F"]), 1)
    if len(rows) > 1:
        prims.append(prim("cut", "p", rows[1][0], root="o"))
    if len(cols) > 1:
        prims += [prim("cut", f"f{_at(len(rows), r)}", cols[1][0], root=f"o{_at(len(rows), r)}")
                  for r in range(len(rows))]
    for r, (p0, ps, tp, _) in enumerate(rows):
        for c, (f0, fs, tf, _) in enumerate(cols):
            sfx = _at(len(rows), r, len(cols), c)
            part = f", rows {p0}..{p0 + ps} x columns {f0}..{f0 + fs}" if len(rows) * len(cols) > 1 else ""
            prims += _broadcast_region(n, p, replace(p, parts=tp, free=tf), sfx, part, v, name)
    return prims


def _broadcast_region(n: Injective, plan: EltwisePlan, p: EltwisePlan, sfx: str, part: str, v: dict[str, str],
                      name: _Names) -> list[Prim]:
    """The schedule of one region of O x P x F (all of it, or a part after cuts: loops `o@ab`, `p@ab`, `f@ab`):
    tiles of p.parts x p.free, the whole-tile constants named after the plan's."""
    lay = dict(eltwise_layout(n))
    at = lambda x: x + sfx  # noqa: E731
    tag = f"_{sfx[1:]}" if sfx else ""
    out = n.stmt.dst.buf
    whole = not sfx and bool(n.rows) and lay["F"] // p.free > 1 and lay["F"] * 4 * len(n.rows) <= WHOLE_ROWS_BYTES
    # rows too long to broadcast whole: the free tiles go outside the partition tiles, so each tile of a row is
    # copied to every partition once, not once per partition tile
    per_tile = bool(n.rows) and not whole and lay["F"] // p.free > 1
    order = (at("t"), at("o"), at("pt")) if per_tile else (at("pt"), at("o"), at("t"))
    prims = [prim("split", at("p"), p.parts, outer=at("pt"), inner=at("p_i"), name=_const(p.parts, plan.parts, "P")),
             prim("split", at("f"), p.free, outer=at("t"), inner=at("f_i"), name=_const(p.free, plan.free, "F")),
             prim("reorder", *order, at("p_i"), at("f_i")),
             prim("partition", at("p_i")),
             prim("stage_out", v[out], at("pt") if per_tile else at("t"), name=name(f"{out}_tile{tag}"))]
    prims += [prim("stage", v[x], at("pt") if per_tile else at("t"), name=name(f"{x}_tile{tag}"))
              for x in reversed(n.full)]
    for i, r in reversed(list(enumerate(n.rows))):
        where, row, tile = "" if whole else at("t"), name(f"{r}_row{tag}"), name(f"{r}_tile{tag}")
        prims += [prim("stage", v[r], where, name=row), prim("broadcast", row, where, at("p_i"), name=tile)]
        if whole:  # one PSUM bank of TILE_F columns at a time
            chunk = "c" if i == 0 else f"c{i + 1}"
            prims += [prim("split", f"{tile}_c1", p.free, outer=chunk, inner=f"{tile}_f", name="TILE_F",
                           note="for the free tiles of the row"),
                      prim("reorder", chunk, f"{tile}_c0")]
    prims += [prim("stage", v[c], at("pt"), name=name(f"{c}_col{tag}"), dtype="f32") for c in reversed(n.columns)]
    # with whole broadcast rows VectorE carries their tensor_tensor work: column terms go to ScalarE (bias/scale)
    fold = (whole or per_tile) and bool(n.columns)
    label = f"{out} = element-wise" + (f", broadcasting {', '.join(n.columns + n.rows)}" if n.columns + n.rows else
                                       f", {', '.join(lp.var for lp in n.loops[n.run[0]:n.run[1]])} on the partitions"
                                       if n.run[1] else "")
    temps = {"temps": f"tmp{tag}_"} if tag else {}  # a region's temporaries have its own shape
    return prims + [prim("tensorize", at("p_i"), fold=fold, regroup=fold, **temps),
                    prim("block", at("pt"), label + part)]


def _unit_column(n: Injective) -> bool:
    """Broadcast columns of one element (their loops all of extent 1) and no rows, under leading loops: laid out as
    columns, each tile would have one partition (4096 x 1 x 64 f32: 4016 us against 21 for a fill)."""
    a, b = n.run
    ext = [lp.extent for lp in n.loops]
    return bool(n.columns) and not n.rows and a > 0 and math.prod(ext[a:b]) == 1 and math.prod(ext[:a]) > 1


def unit_column_alone(k: Kernel, params: EltwisePlan) -> bool:
    """Whether rules.eltwise lays `k` out as a one-element column alone (_unit_column_alone) for `params`: the
    plan's own tiles (one partition) are then not the kernel's, and `tilec explain` says so."""
    n = injective(k)
    return n is not None and _unit_column(n) and params == eltwise_params(n)


def _unit_column_alone(n: Injective, params: EltwisePlan) -> list[Prim]:
    """`Y[n, m, p] = 2 * c[m] + 1` with M = 1 (and full operands, `A[n, m, p] - c[m]`): the leading loops go on the
    partitions, the trailing ones on the free dimension (the unit loops of the columns left out: reshape's groups),
    each column is loaded once as a (1, 1) row and copied to every partition once (`broadcast`: the row machinery),
    and the tiles read that (P, 1) column:

        reshape(n, ((p, 4096), (f, 64)), groups=((n,), (p,)))     Y_v[p, f] = 2 * c_v[0, 0] + 1
        stage(c_v, "", name=c_row); broadcast(c_row, "", p_i, name=c_col)   c_col[p, 0]: the value on each partition
        split(p, 128, ..); split(f, 64, ..); reorder(pt, t, p_i, f_i); partition(p_i); stage_out(Y_v, t); tensorize

    Ragged partitions or free elements are cut into whole tiles and the rest, as `_broadcast` does; with a ragged
    partition part the column is copied to every partition in each partition tile. Only the default schedule:
    tiles a user's directives chose keep the column layout they were chosen for."""
    a, b = n.run
    names, ext = [lp.var for lp in n.loops], [lp.extent for lp in n.loops]
    O, F = math.prod(ext[:a]), math.prod(ext[b:])
    plan = replace(eltwise_plan(O * F, {"O": 1, "P": O, "F": F}, False), free=params.free)
    name = _Names(n)
    v = _views(n, name)
    before, after = names[:a], names[b:]
    lines = (n.loops[0].line, n.loops[b].line if b < len(n.loops) else n.top.line)
    prims = [prim("reshape", n.top.var, (("p", O), ("f", F)), notes=(f"for {', '.join(before)}",
                                                                      f"for {', '.join(after)}"),
                  lines=lines, views=tuple(v.items()), groups=(tuple(before), tuple(after)))]
    out = n.stmt.dst.buf
    label = f"{out} = element-wise, broadcasting {', '.join(n.columns)} (one value on every partition)"
    rowname = {c: name(f"{c}_row") for c in n.columns}
    flat = eltwise_plan(O * F, {}, False)
    if O * F % flat.parts == 0 and O * F // flat.parts % flat.free == 0:  # every value is one: the data flattened
        flats = {b: name(f"{b}_flat") for b in (*n.full, out)}
        prims[0] = replace(prims[0], args=(n.top.var, (("q", O), ("g", F))))
        prims += [prim("reshape", "q", (("p", flat.parts), ("f", O * F // flat.parts)),
                       notes=("", f"for {', '.join(before + after)}"), lines=(n.top.line, n.top.line),
                       views=tuple((v[b], flats[b]) for b in flats)),
                  prim("split", "f", flat.free, outer="t", inner="f_i", name="TILE_F"),
                  prim("reorder", "t", "p"),
                  prim("partition", "p"),
                  prim("stage_out", flats[out], "t", name=name(f"{out}_tile"))]
        prims += [prim("stage", flats[b], "t", name=name(f"{b}_tile")) for b in reversed(n.full)]
        prims += [prim("stage", v[c], "", name=rowname[c]) for c in reversed(n.columns)]
        prims += [prim("broadcast", rowname[x], "", "p", name=name(f"{x}_col")) for x in reversed(n.columns)]
        return prims + [prim("tensorize", "p", fold=False, regroup=False),
                        prim("block", "t", f"{label}, {flat.parts} partitions")]
    rows = _ragged_parts(O, min(plan.parts, O), 1)
    cols = _ragged_parts(F, min(plan.free, F), 1)
    if len(rows) > 1:
        prims.append(prim("cut", "p", rows[1][0]))
    if len(cols) > 1:
        prims += [prim("cut", f"f{_at(len(rows), r)}", cols[1][0], root=f"p{_at(len(rows), r)}")
                  for r in range(len(rows))]
    once = len(rows) == 1  # one partition tile size: the column copied to every partition once, before the loops
    prims += [prim("stage", v[c], "", name=rowname[c]) for c in reversed(n.columns)]
    for r, (p0, ps, tp, _) in enumerate(rows):
        for c, (f0, fs, tf, _) in enumerate(cols):
            sfx = _at(len(rows), r, len(cols), c)
            at = lambda x: x + sfx  # noqa: E731
            tag = f"_{sfx[1:]}" if sfx else ""
            part = f", rows {p0}..{p0 + ps} x columns {f0}..{f0 + fs}" if len(rows) * len(cols) > 1 else ""
            prims += [prim("split", at("p"), tp, outer=at("pt"), inner=at("p_i"), name=_const(tp, plan.parts, "P")),
                      prim("split", at("f"), tf, outer=at("t"), inner=at("f_i"), name=_const(tf, plan.free, "F")),
                      prim("reorder", at("pt"), at("t"), at("p_i"), at("f_i")),
                      prim("partition", at("p_i")),
                      prim("stage_out", v[out], at("t"), name=name(f"{out}_tile{tag}"))]
            prims += [prim("stage", v[x], at("t"), name=name(f"{x}_tile{tag}")) for x in reversed(n.full)]
            if once and c == 0 or not once:
                where = "" if once else at("pt")
                prims += [prim("broadcast", rowname[x], where, at("p_i"), name=name(f"{x}_col{tag}"))
                          for x in reversed(n.columns)]
            temps = {"temps": f"tmp{tag}_"} if tag else {}
            prims += [prim("tensorize", at("p_i"), fold=False, regroup=False, **temps),
                      prim("block", at("pt"), label + part)]
    return prims


def _const(size: int, planned: int, dim: str) -> str:
    """TILE_P / TILE_F where a region's tile is the plan's whole tile; "" (a plain number) for the rest."""
    return f"TILE_{dim}" if size == planned else ""


# ---- transposes and permutes ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Permute:
    """What the transpose rule sees: Y[batch, second, first] = X[batch, first, second] over a perfect nest."""
    top: Loop
    stmt: Assign
    src: Access  # the read of X
    batch: tuple[str, ...]
    first: tuple[str, ...]
    second: tuple[str, ...]
    extents: dict[str, int]
    lines: dict[str, int]
    middle: bool = False  # the batch dimensions sit between the two swapped ones (no [B, M, N] views)


def _one_copy(k: Kernel) -> tuple[list[Loop], Assign, Access] | None:
    """(the perfect loop chain, its one assignment, the read it copies) when the nest is a single copy `Y[..] =
    X[..]` inside one perfect loop chain (what the permute and copy rules start from), else None."""
    tops = [s for s in k.body if isinstance(s, Loop)]
    if len(tops) != 1:
        return None
    chain = layout.perfect_chain(tops[0])
    body = chain[-1].body
    if len(body) != 1 or not isinstance(body[0], Assign) or not isinstance(body[0].expr, Load):
        return None
    return chain, body[0], body[0].expr.access


def permute(k: Kernel) -> Permute | None:
    """The nest's permute structure, or None when it is not one copy that swaps two runs after a batch."""
    found = _one_copy(k)
    if found is None:
        return None
    chain, stmt, read = found
    src, out = _plain(read.index), _plain(stmt.dst.index)
    if src is None or out is None or sorted(src) != sorted(out) or src == out:
        return None
    n = next(i for i, (x, y) in enumerate(zip(src, out)) if x != y)
    rest, want = src[n:], out[n:]
    cut = next((c for c in range(1, len(rest)) if rest[c:] + rest[:c] == want), None)
    swap = [p for p, (x, y) in enumerate(zip(src, out)) if x != y]
    if cut is None and len(swap) == 2:  # two single dimensions swap around dimensions that stay in place
        a, c = src[swap[0]], src[swap[1]]
        return Permute(chain[0], stmt, read, tuple(v for v in out if v not in (a, c)), (a,), (c,),
                       {lp.var: lp.extent for lp in chain}, {lp.var: lp.line for lp in chain}, middle=True)
    if cut is None:
        return None
    return Permute(chain[0], stmt, read, tuple(src[:n]), tuple(rest[:cut]), tuple(rest[cut:]),
                   {lp.var: lp.extent for lp in chain}, {lp.var: lp.line for lp in chain})


def transpose(k: Kernel, target: Target, params: TransposePlan) -> list[Prim] | None:
    """The transpose rule: super-tiles of (BI x BJ) blocks of TI x TJ; a strip of BI block rows loaded (one DMA per
    block row), BI*BJ block transposes (TensorE through PSUM, or DMA transposes straight from HBM), a strip of BJ
    block columns stored. A batched or N-D permute sees X as [B, M, N] (views) and repeats that per batch. A ragged
    plan (sizes without a large divisor, 521 x 257) cuts the rows and columns into the multiples of the block and
    the rest (up to four regions), each scheduled the same way."""
    n = permute(k)
    if n is None:
        return None
    size = lambda vs: math.prod(n.extents[v] for v in vs)  # noqa: E731
    B, M, N = size(n.batch), size(n.first), size(n.second)
    vi, vj = n.first[0], n.second[0]
    prims: list[Prim] = []
    i, j, X, Y, top = vi, vj, n.src.buf, n.stmt.dst.buf, ""
    if n.middle:  # the batch loops outermost; the accesses keep their shapes (strided 2-D slices per batch)
        order = list(n.batch) + [vi, vj]
        if [lp.var for lp in layout.perfect_chain(n.top)] != order:
            prims.append(prim("reorder", *order))
        top = n.batch[0] if n.batch else ""
    elif n.batch or len(n.first) > 1 or len(n.second) > 1:  # views: X as [B, M, N], Y as [B, N, M]
        order = list(n.batch + n.first + n.second)
        if [lp.var for lp in layout.perfect_chain(n.top)] != order:
            prims.append(prim("reorder", *order))
        loops = ((("bt", B),) if B > 1 else ()) + (("i", M), ("j", N))
        notes = ((f"for {n.batch[0]} (batch)",) if B > 1 else ()) + ("", "")
        lines = ((n.lines[n.batch[0]],) if B > 1 else ()) + (n.lines[vi], n.lines[vj])
        # loops of extent 1 leave open which old loops a new one iterates: say it (batch, first run, second run)
        groups = ((tuple(n.batch),) if B > 1 else ()) + (tuple(n.first), tuple(n.second))
        unit = 1 in (n.extents[v] for v in order)
        prims.append(prim("reshape", order[0], loops, notes=notes, lines=lines, **({"groups": groups} if unit else {})))
        i, j, X, Y, top = "i", "j", f"{X}_v", f"{Y}_v", "bt" if B > 1 else ""
    elif [lp.var for lp in layout.perfect_chain(n.top)] != [vi, vj]:
        prims.append(prim("reorder", vi, vj))
    rows, cols = _ragged_parts(M, params.tile, params.bi), _ragged_parts(N, params.tj, params.bj)
    if len(rows) > 1:
        prims.append(prim("cut", i, rows[1][0]))
    if len(cols) > 1:
        prims += [prim("cut", f"{j}{_at(len(rows), r, 1)}", cols[1][0], root=f"{i}{_at(len(rows), r, 1)}")
                  for r in range(len(rows))]
    taken = set(k.buffers())  # strips named apart from the user's tensors (`A_strip` may be one)
    strips = (unique(f"{n.src.buf}_strip", taken), unique(f"{n.stmt.dst.buf}_strip", taken))
    ci, cj = ("TILE", "TILE") if params.tile == params.tj else ("TILE_I", "TILE_J")
    for r, rp in enumerate(rows):
        for c, cp in enumerate(cols):
            suffix = _at(len(rows), r, len(cols), c)
            tag = "" if r == c == 0 else f"_{'ab'[r]}{'ab'[c]}"
            names = (ci if rp[2] == params.tile and r == 0 else "", cj if cp[2] == params.tj and c == 0 else "")
            prims += _region(n, params, (i + suffix, j + suffix), (rp, cp), names, suffix, tag, (X, Y), strips,
                             k.buffers()[n.src.buf].dtype)
    label = f"{n.stmt.dst.buf} = transpose of {n.src.buf}"
    if params.ragged:
        return prims + [prim("block", top, f"{label}, ragged ({M}x{N})")]
    return prims[:-1] + [prim("block", top, f"{label} by {params.tile}x{params.tj} blocks")]


def _at(parts: int, r: int, cols: int = 1, c: int = 0) -> str:
    """The level-A suffix of a region's loops after cuts (`i@ab`: rows part a, columns part b); "" without cuts."""
    tags = ("ab"[r] if parts > 1 else "") + ("ab"[c] if cols > 1 else "")
    return f"@{tags}" if tags else ""


def _ragged_parts(extent: int, tile: int, per_strip: int) -> list[tuple[int, int, int, int]]:
    """(start, size, block, blocks per strip) of the whole blocks, then of the remainder (one block)."""
    whole = extent - extent % tile
    parts = [(0, whole, tile, per_strip)] if whole else []
    return parts + ([(whole, extent % tile, extent % tile, 1)] if extent % tile else [])


def _region(n: Permute, params: TransposePlan, loops: tuple[str, str], parts, names: tuple[str, str], suffix: str,
            tag: str, bufs: tuple[str, str], strips: tuple[str, str], src_dtype: str) -> list[Prim]:
    """The schedule of one region: blocks of TI x TJ, strips of BI x BJ blocks, strips staged, blocks tensorized."""
    (i, j), ((r0, M, TI, BI), (c0, N, TJ, BJ)), (ci, cj) = loops, parts, names
    vi, vj = n.first[0], n.second[0]
    at = lambda v: v + suffix  # noqa: E731
    prims = [prim("split", i, TI, outer=at("i_o"), inner=at("i_i"), name=ci, note=f"for {vi} (blocks of {ci or TI})"),
             prim("split", at("i_o"), BI, outer=at("bi"), inner=at("ai"), note=f"for {vi} (strips of BI blocks)"),
             prim("split", j, TJ, outer=at("j_o"), inner=at("j_i"), name=cj, note=f"for {vj} (blocks of {cj or TJ})"),
             prim("split", at("j_o"), BJ, outer=at("bj"), inner=at("bj2"), note=f"for {vj} (strips of BJ blocks)"),
             prim("reorder", *map(at, ("bi", "bj", "ai", "bj2", "i_i", "j_i"))),
             prim("partition", at("i_i"))]
    dma = params.method == "dma"
    X, Y = bufs
    # a DMA transpose copies without casting (src.dtype == dst.dtype [ISA6 dma_transpose]): its strip keeps the
    # source dtype and the store's dma_copy converts; the PE path converts on the PSUM -> SBUF copy
    prims.append(prim("stage_grouped", Y, at("bj"), ((at("j_i"),), (at("bj2"),), (at("ai"), at("i_i"))),
                      into=False, name=strips[1] + tag, dtype=src_dtype if dma else ""))
    if not dma:
        prims.append(prim("stage_grouped", X, at("bj"), ((at("i_i"),), (at("ai"),), (at("bj2"), at("j_i"))),
                          name=strips[0] + tag))
    part = f"rows {r0}..{r0 + M} x columns {c0}..{c0 + N} by {TI}x{TJ} blocks"
    return prims + [prim("tensorize", at("i_i"), psum=f"{n.stmt.dst.buf}_tp{tag}"), prim("block", at("bi"), part)]


# ---- row reductions -----------------------------------------------------------------------------------------------



def reduce(k: Kernel, target: Target, params: ReducePlan, short: tuple[int, int, int] | None = None,
           resident: bool = False) -> list[Prim] | None:
    """The row-reduction rule, `s[i] = c; s[i] OP= A[i, j]` over trailing dimensions, c OP's identity
    (lower_tiles.reduce_nest); rowsum 256 x 384, one free tile holding a whole row:

        fold_init(s)                           `s[i] = 0` goes: the first reduce writes the column
        reshape(i, (r, R), (f, F))             rows (kept indices) x reduced elements, HBM views A_v, s_v[r, 0]
        split(r, 128, outer=pt, inner=p, name=TILE_P)
        split(f, F, outer=ft, inner=f_i, name=TILE_F)
        reorder(pt, ft, p, f_i)                the reduction's tiles outside the partitions
        partition(p)
        stage_out(s_v, ft, name=s_acc, line=L)  the (TILE_P, 1) accumulator column, stored after the reduce
        stage(A_v, ft, name=A_tile)            the row tile loaded into SBUF
        tensorize(p)                           one tensor_reduce into the column (the identity init folded)
        block(pt, "s = add over the last dims of A")

    With several free tiles the accumulator is staged at the row tile (`stage_out(s_v, pt)`) and tensorized with
    `accumulate=True`: it starts at the identity (a zeroed tile, plus -inf/inf for max/min), each tile's
    tensor_reduce goes into a column `s_part` combined into it.

    The epilogue nests after the reduction (a constant factor `s[i] = s[i] * 0.5`, an initial value `s[i] = s[i] +
    b[i]`) are each reshaped onto the rows (`e, e_u`: R x 1, the same view s_v), computed at the loop holding the
    accumulator (`reverse_compute_at(e, ft)`: after the reduce of each row tile), bound to the partitions and
    tensorized in place on the accumulator; a tensor's column is staged just before its step (`stage(b_v, ft,
    near=True)`). An output narrower than fp32 keeps an fp32 accumulator and is cast into a tile of its dtype
    before the store (`stage_out(.., dtype=f32, cast=s_tile)`). A reduced expression is bound to a tile first
    (`bind_expr(s_v, p, s_terms)`, `tensorize(p_x)`); a sum of a square `x * x` names its instructions,
    `tensorize(p_x, square=sum)`: one ScalarE activation squares x and sums the row into the accumulator
    (reduce_res), x's fp32 producer shared by GpSimdE and VectorE (lower_tiles.square_sums).

    `short` = (P, G, GB): rows short enough that one per partition wastes the DMAs (build_reduce.short_rows) go G
    per partition, row p * G + g on partition p: the rows reshaped to (p, P) x (g, G), g split into tiles of GB
    (TILE_G), a (P, GB, F) tile staged per tile (or, `resident`, one tile of the whole input with each tile's
    load into its own part) and one last-axis tensor_reduce into a (P, G) result tile staged for the whole kernel;
    the epilogue runs once on the whole (P, G) tile after the loop."""
    tops = [s for s in k.body if isinstance(s, Loop)]
    if len(tops) < 2:
        return None
    init = layout.perfect_chain(tops[0])[-1].body
    chain = layout.perfect_chain(tops[1])
    body = chain[-1].body
    if len(body) != 1 or not isinstance(body[0], Update) or not loads(body[0].expr):
        return None
    if len(init) != 1 or not isinstance(init[0], Assign) or init[0].dst != body[0].dst:
        return None
    upd = body[0]
    kept = _plain(upd.dst.index)
    names = [lp.var for lp in chain]
    reads = list(dict.fromkeys(a.buf for a in loads(upd.expr)))  # every tensor of the expression, at one element
    if kept is None or any(_plain(a.index) != names for a in loads(upd.expr)) or kept != names[:len(kept)] or \
            len(kept) == len(names) or upd.dst.buf in reads:
        return None
    epilogue = [_epilogue_step(t, upd.dst) for t in tops[2:]]
    if None in epilogue or len(tops) != len(k.body):
        return None
    R = math.prod(lp.extent for lp in chain[:len(kept)])
    F = math.prod(lp.extent for lp in chain[len(kept):])
    if params.free > F or params.parts > target.pmax or params.parts > R:
        return None
    # with unit loops the extents alone leave reshape's views ambiguous (s[0] of one row): the groups say it
    units = any(lp.extent == 1 for lp in chain)
    if short is not None and short[0] > 1:
        if units:
            return None
        return _short_rows(k, upd, init[0], chain, kept, reads, epilogue, short, resident)
    groups = {"groups": (tuple(kept), tuple(names[len(kept):]))} if units else {}
    tiles = F // params.free
    S = upd.dst.buf
    columns = [c for c in epilogue if c]
    v, taken = _reduce_views(S, reads, columns)
    red = names[len(kept):]
    notes = (f"for {', '.join(kept)}", f"for {', '.join(red)}")
    top = chain[0].var + ("#0" if epilogue else "")
    prims = [prim("fold_init", S),
             prim("reshape", top, (("r", R), ("f", F)), notes=notes,
                  lines=(chain[0].line, chain[len(kept)].line), views=tuple((b, v[b]) for b in (*reads, S)),
                  view_line=init[0].line, **groups)]
    loops = [f"e{n + 1 if n else ''}" for n in range(len(epilogue))]
    for n, (e, c) in enumerate(zip(loops, epilogue)):  # after the reduction's reshape its loops are the only ones
        ref = chain[0].var + ("#0" if len(epilogue) - n > 1 else "")
        views = ((S, v[S]),) + (((c, v[c]),) if c else ())
        prims.append(prim("reshape", ref, ((e, R), (f"{e}_u", 1)), views=views,
                          **({"groups": (tuple(kept), ())} if units else {})))
    # a row count the row tiles do not divide: the whole tiles, then one tile of the remaining rows (139 rows: 128
    # and 11), the reduction and each epilogue step cut alike
    rows = _ragged_parts(R, params.parts, 1)
    if len(rows) > 1:
        prims += [prim("cut", x, rows[1][0]) for x in ["r", *loops]]
    expr = not isinstance(upd.expr, Load)
    narrow = k.buffers()[S].dtype != "f32"
    what = fmt_expr(upd.expr) if expr else reads[0]
    # a reduced size the free tiles do not divide: whole free tiles, then one tile of the rest (12289: 3 x 4096 and
    # 1), each reduced into the row tile's accumulator
    cols = _ragged_parts(F, params.free, 1)
    summed = {"square": "sum"} if upd.op == "+=" and square(upd.expr) is not None else {}
    for r, (r0, size, tp, _) in enumerate(rows):
        sfx = _at(len(rows), r)
        x = lambda name: name + sfx  # noqa: E731
        tag = f"_{sfx[1:]}" if sfx else ""
        at = x("ft") if tiles == 1 and len(cols) == 1 else x("pt")
        prims += [prim("split", x("r"), tp, outer=x("pt"), inner=x("p"), name=_const(tp, params.parts, "P"))]
        if len(cols) == 1:
            ps = [x("p")]
            prims += [prim("split", x("f"), params.free, outer=x("ft"), inner=x("f_i"), name="TILE_F"),
                      prim("reorder", x("pt"), x("ft"), x("p"), x("f_i")),
                      prim("partition", x("p"))]
        else:  # the reduced loop cut inside the row tile: both parts reduce into its accumulator
            y = lambda name, c: name + (sfx or "@") + "ab"[c]  # noqa: E731
            ps = [y("p", q) for q in range(2)]
            prims += [prim("reorder", x("pt"), x("f"), x("p")), prim("cut", x("f"), cols[1][0])]
            for q, (_, _, tf, _) in enumerate(cols):
                prims += [prim("split", y("f", q), tf, outer=y("ft", q), inner=y("f_i", q),
                               name=_const(tf, params.free, "F")),
                          prim("reorder", y("ft", q), y("p", q), y("f_i", q)),
                          prim("partition", y("p", q))]
        for e in loops:
            prims += [prim("reverse_compute_at", x(e), at), prim("partition", f"{x(e)}_r")]
        ctag = lambda q: tag + ("" if len(cols) == 1 else "_" + "ab"[q])  # noqa: E731
        if expr:  # the expression of the staged tiles computed into a tile first, then reduced from it
            prims += [prim("bind_expr", v[S], p, unique(f"{S}_terms{ctag(q)}", taken)) for q, p in enumerate(ps)]
        cast = {"dtype": "f32", "cast": unique(f"{S}_tile{tag}", taken)} if narrow else {}
        prims.append(prim("stage_out", v[S], at, name=unique(f"{S}_acc{tag}", taken), line=init[0].line, **cast))
        for q, p in enumerate(ps):
            ft = p.replace("p", "ft", 1)
            prims += [prim("stage", v[A], ft, name=unique(f"{A}_tile{ctag(q)}", taken)) for A in reversed(reads)]
        prims += [prim("stage", v[c], at, name=unique(f"{c}_col{tag}", taken), near=True) for c in columns]
        for p in ps:  # a square's sum: one ScalarE activation, `square` with the row sum its reduce_res
            prims += [prim("tensorize", f"{p}_x", **summed)] if expr else []
            prims.append(prim("tensorize", p) if at != x("pt") else prim("tensorize", p, accumulate=True))
        prims += [prim("tensorize", f"{x(e)}_r") for e in loops]
        part = f", rows {r0}..{r0 + size}" if sfx else ""
        prims.append(prim("block", x("pt"), f"{S} = {ACCUMULATE[upd.op]} over the last dims of {what}{part}"))
    return prims


def _reduce_views(S: str, reads: list[str], columns: list[str]) -> tuple[dict[str, str], set[str]]:
    """The HBM view names of a reduction's inputs, its result and its epilogue's columns, unique in the nest, and
    the names taken so far (the rule's buffers are named after them)."""
    taken = {S, *reads, *columns}
    v = {A: unique(f"{A}_v", taken) for A in reads}
    v[S] = unique(f"{S}_v", taken)
    v.update({c: unique(f"{c}_v", taken) for c in columns})
    return v, taken


def _short_rows(k: Kernel, upd: Update, init: Assign, chain: list[Loop], kept: list[str], reads: list[str],
                epilogue: list[str | None], short: tuple[int, int, int], resident: bool) -> list[Prim]:
    """rules.reduce for short rows (G per partition); see its docstring."""
    P, G, GB = short
    F = math.prod(lp.extent for lp in chain[len(kept):])
    names = [lp.var for lp in chain]
    S = upd.dst.buf
    columns = [c for c in epilogue if c]
    v, taken = _reduce_views(S, reads, columns)
    top = chain[0].var + ("#0" if epilogue else "")
    prims = [prim("fold_init", S),
             prim("reshape", top, (("p", P), ("g", G), ("f", F)), notes=(f"for {', '.join(kept)}",) * 2 +
                  (f"for {', '.join(names[len(kept):])}",), lines=(chain[0].line,) * 2 + (chain[len(kept)].line,),
                  views=tuple((b, v[b]) for b in (*reads, S)), view_line=init.line, unit=False)]
    loops = [f"e{n + 1 if n else ''}" for n in range(len(epilogue))]
    for n, (e, c) in enumerate(zip(loops, epilogue)):
        ref = chain[0].var + ("#0" if len(epilogue) - n > 1 else "")
        views = ((S, v[S]),) + (((c, v[c]),) if c else ())
        prims.append(prim("reshape", ref, ((e, P), (f"{e}_g", G)), views=views))
    prims += [prim("split", "g", GB, outer="gt", inner="g_i", name="TILE_G",
                   note=f"for the rows, TILE_G at a time on each partition ({G} per partition)"),
              prim("reorder", "gt", "p", "g_i", "f"),
              prim("partition", "p")]
    prims += [prim("partition", e) for e in loops]
    expr = not isinstance(upd.expr, Load)
    if expr:
        prims.append(prim("bind_expr", v[S], "p", unique(f"{S}_terms", taken)))
    narrow = k.buffers()[S].dtype != "f32"
    cast = {"cast": unique(f"{S}_tile", taken)} if narrow else {}
    prims.append(prim("stage_out", v[S], "", name=unique(f"{S}_col", taken), line=init.line, dtype="f32", **cast))
    how = {"name": "", "resident": True} if resident else {"name": ""}
    for A in reversed(reads):
        prims.append(prim("stage", v[A], "gt", **{**how, "name": unique(f"{A}_all" if resident else f"{A}_tile",
                                                                         taken)}))
    prims += [prim("stage", v[c], "", name=unique(f"{c}_tile", taken), dtype="f32") for c in columns]
    prims += [prim("tensorize", "p_x")] if expr else []
    prims += [prim("tensorize", "p")] + [prim("tensorize", e) for e in loops]
    return prims + [prim("block", "", f"{S}: short rows, {G} per partition (row p * {G} + g on partition p)")]


def _epilogue_step(top: Loop, dst: Access) -> str | None:
    """"" or the column tensor it reads, when the nest is one step of a reduction's epilogue, `s[i] = s[i] * c` or
    `s[i] = s[i] OP (c | b[i])`, over the kept loops; None otherwise."""
    body = layout.perfect_chain(top)[-1].body
    if len(body) != 1 or not isinstance(body[0], Assign) or body[0].dst != dst:
        return None
    e = body[0].expr
    if not isinstance(e, Op) or len(e.args) != 2 or e.args[0] != Load(dst):
        return None
    other = e.args[1]
    if isinstance(other, Const):
        return ""
    if isinstance(other, Load) and other.access.index == dst.index and other.access.buf != dst.buf:
        return other.access.buf
    return None


# ---- column reductions --------------------------------------------------------------------------------------------


def colreduce(k: Kernel, target: Target, params: ReducePlan) -> list[Prim] | None:
    """The column-reduction rule, `s[o, f] = 0; s[o, f] += A[o, r, f]` (lower_tiles.colreduce_nest: the kept
    indices before the reduced run, the reduced ones, the kept ones after); a column sum 384 x 1024:

        fold_init(s)                         the first matmul writes the sums
        reshape(j, (o, 1), (r, 384), (f, 1024))   A_v[o, r, f], s_v[o, 0, f] (a row per o)
        split(r, 128, outer=rt, inner=p, name=TILE_P)
        split(f, 512, outer=ft, inner=f_i, name=TILE_F)
        reorder(o, ft, rt, p, f_i)           the reduced row tiles inside a free tile
        partition(p)
        stage_out(s_v, ft, memory=psum, name=s_acc, cast=s_row)   a (1, TILE_F) PSUM row, evicted to SBUF
        stage(A_v, rt, name=A_tile)
        tensorize(p)                         the update over the partitions: ones[TILE_P, 1].T @ A_tile
        block(o, "s = sum over i of A (ones matmul)")

    The epilogue nests after the sum (lower_tiles.colreduce_nest: a constant factor `s = s * c`, a mean; then an
    initial value, `s = s + 0.5` or `s = s + b`) are reshaped onto the rows of sums (e, e_u, e_f: the same view
    s_v, e_u its unit dimension), computed at the free tile and bound to its one partition. The row of a free tile
    is then staged in fp32 SBUF (`stage_out(s_v, ft, name=s_row)`, cast into s_tile for a narrower output) and the
    sum alone in PSUM (`stage_out(s_row, ft, memory=psum, name=s_acc, of=rt)`): the copy out of PSUM is the
    eviction, the steps work on the row, a column's row is loaded just before its step (`stage(b_v, ft, near=True)`).
    A factor rides on the eviction (`tensorize(e_u_r, evict=True)`: one ScalarE activation with its scale) when the
    matmuls do not bound the step; otherwise VectorE multiplies after a plain copy.

    16-bit sources of several row tiles take GROUP_ROWS (4 or 2 tiles, build_colreduce._group: that many loads in
    flight) per step, each tile a buffer of its own (1024 x 384 bf16):

        split(r, 512, outer=rt, inner=r_g, name=GROUP_ROWS); split(r_g, 128, outer=g, inner=p, name=TILE_P)
        split(f, 384, ..); reorder(o, ft, rt, g, p, f_i); partition(p, summed=True)
        unroll(g, copies=True)               g#0 .. g#3: the four tiles of a group written out
        stage(A_v, g#0, name=A_r0) .. stage(A_v, g#3, name=A_r3)   each tile loaded into its own buffer

    fp32 tiles of a group are added in pairs first (an fp32 matmul streams at 4.7x the 16-bit cost), ScalarE
    evicting (with the factor, if any), as build_colreduce did:

        pair(g#0, g#1)                       s_acc[0, f_i] += A_r0[p, f_i] + A_r1[p, f_i]
        bind_expr(s_acc, p#0, s_pair0, suffix=_x0); tensorize(p_x0)   VectorE: s_pair0 = A_r0 + A_r1
        (then g#1 .. for a group of 4); tensorize(s_row_c0, engine=scalar)   the eviction on ScalarE

    A square's terms `T = x * x` are named `tensorize(p_x, square=scalar)` where ScalarE computes them (_Squares).

    Takes sums but fp32 rows two to a partition and stacked expressions (build_colreduce), None otherwise."""
    from tilec.compiler.build_colreduce import _group, row_pairs_of, stacked, wide  # (the builder's own choices)
    tops = [s for s in k.body if isinstance(s, Loop)]
    if len(tops) < 2 or len(tops) != len(k.body):
        return None
    init = layout.perfect_chain(tops[0])[-1].body
    chain = layout.perfect_chain(tops[1])
    body = chain[-1].body
    if len(body) != 1 or not isinstance(body[0], Update) or body[0].op != "+=" or not loads(body[0].expr):
        return None
    epilogue = [_epilogue_step(t, body[0].dst) for t in tops[2:]]
    if None in epilogue:
        return None
    upd, names = body[0], [lp.var for lp in chain]
    out = _plain(upd.dst.index)
    reads = list(dict.fromkeys(a.buf for a in loads(upd.expr)))  # every tensor of the expression, at one element
    if len(init) != 1 or not isinstance(init[0], Assign) or init[0].dst != upd.dst or out is None or \
            any(_plain(a.index) != names for a in loads(upd.expr)) or upd.dst.buf in reads:
        return None
    red = [v for v in names if v not in out]
    first = names.index(red[0]) if red else 0
    if not red or names[first:first + len(red)] != red or names[:first] + names[first + len(red):] != out:
        return None
    ext = {lp.var: lp.extent for lp in chain}
    O, R, F = (math.prod(ext[v] for v in vs) for vs in (names[:first], red, names[first + len(red):]))
    S, A = upd.dst.buf, reads[0]
    dtype = k.buffers()[A].dtype
    expr = not isinstance(upd.expr, Load)
    group, W, K = _group(R // params.parts), wide(O, R, F, params, 1, dtype), stacked(O, R, params)
    pairs = row_pairs_of(R, params, dtype, expr) > 1
    if R % params.parts or F % params.free or (K > 1 or W > 1) and pairs:  # (the builder: two rows a partition)
        return None
    if K > 1 and (expr or any(lp.extent == 1 for lp in chain)):
        return None  # (the builder stacks these: expressions, unit loops)
    columns = [c for c in epilogue if c]
    v, taken = _reduce_views(S, reads, columns)
    before, after = names[:first], names[first + len(red):]
    if K > 1:
        W = wide(O, R, F, ReducePlan(K * R, params.free), K, dtype)
        return _stacked_sum(k, params, (O, R, F, K, W), (before, red, after), chain, init[0], upd, epilogue, v,
                            taken)
    squares = _Squares()
    groups = (tuple(before), tuple(red), tuple(after))
    line = lambda vs: chain[names.index(vs[0])].line if vs else init[0].line  # noqa: E731
    top = chain[0].var + ("#0" if epilogue else "")
    prims = [prim("fold_init", S),
             prim("reshape", top, (("o", O), ("r", R), ("f", F)),
                  notes=(f"for {', '.join(before)}" if before else "", f"for {', '.join(red)}",
                         f"for {', '.join(after)}"),
                  lines=(line(before), line(red), line(after)), views=(*((B, v[B]) for B in reads), (S, v[S])),
                  view_line=init[0].line, groups=groups)]
    loops = [f"e{n + 1 if n else ''}" for n in range(len(epilogue))]
    for n, (e, c) in enumerate(zip(loops, epilogue)):  # each step over the same rows of sums: s_v[o, 0, f]
        ref = tops[2 + n].var + ("#0" if len(epilogue) - n > 1 else "")
        views = ((S, v[S]),) + (((c, v[c]),) if c else ())
        lead = ((e, O),) if before else ()  # (no kept index before the reduced run: the rows are s_v[0, f])
        prims.append(prim("reshape", ref, lead + ((f"{e}_u", 1), (f"{e}_f", F)), views=views,
                          groups=((tuple(before),) if before else ()) + ((), tuple(after)), units=(f"{e}_u",)))
    if group > 1:  # GROUP row tiles per step: one (TILE_P, GROUP, TILE_F) tile, each part summed by its matmul
        prims += [prim("split", "r", group * params.parts, outer="rt", inner="r_g", name="GROUP_ROWS",
                       note=f"for {', '.join(red)} (groups of {group} TILE_P tiles: "
                            + ("added in pairs on VectorE, " if dtype == "f32" else "") + "summed in PSUM)"),
                  prim("split", "r_g", params.parts, outer="g", inner="p", name="TILE_P",
                       note="the TILE_P tiles of a group"),
                  prim("split", "f", params.free, outer="ft", inner="f_i", name="TILE_F"),
                  prim("reorder", "o", "ft", "rt", "g", "p", "f_i"),
                  prim("partition", "p", summed=True),
                  prim("unroll", "g", copies=True)]
    elif W > 1:  # one load of W PSUM banks' worth of columns, each bank summed by a matmul of its own
        prims += [prim("split", "r", params.parts, outer="rt", inner="p", name="TILE_P",
                       note=f"for {', '.join(red)} (tiles of TILE_P, summed in PSUM)"),
                  prim("split", "f", W * params.free, outer="ft", inner="f_w", name="TILE_F"),
                  prim("reorder", "o", "ft", "rt", "p", "f_w"),
                  prim("partition", "p", summed=True)]
        if expr:  # the terms of the whole loaded tile (one instruction), before the banks split the sum
            prims += [prim("bind_expr", v[S], "p", unique(f"{S}_terms", taken), dtype=dtype),
                      prim("tensorize", "p_x", **squares(upd.expr, dtype))]
        prims += [prim("split", "f_w", params.free, outer="w", inner="f_i", name="BANK_F",
                       note="the PSUM banks of a free tile: a matmul each, evicted into its part of the row"),
                  prim("reorder", "w", "p", "f_i")]
    else:
        prims += [prim("split", "r", params.parts, outer="rt", inner="p", name="TILE_P",
                       note=f"for {', '.join(red)} (tiles of TILE_P, summed in PSUM)"),
                  prim("split", "f", params.free, outer="ft", inner="f_i", name="TILE_F"),
                  prim("reorder", "o", "ft", "rt", "p", "f_i"),
                  prim("partition", "p", summed=True)]
    step = layout.perfect_chain(tops[2])[-1].body[0] if epilogue else None
    factor = isinstance(step, Assign) and isinstance(step.expr, Op) and step.expr.name == "*"
    for n, e in enumerate(loops):  # each step on the row of sums of a free tile, once it is evicted (wide: a
        at = "w" if W > 1 and n == 0 and factor else "ft"  # factor on each bank's eviction, the rest on the row)
        prims += [prim("reverse_compute_at", e if before else f"{e}_u", at), prim("partition", f"{e}_u_r")]
    if W > 1:  # the banks written out, each a PSUM tile of its own (as many in flight as banks)
        prims.append(prim("unroll", "w", copies=True))
    if not epilogue and W > 1:  # each bank's eviction writes its part of the row, in the output's dtype
        row = unique(f"{S}_row", taken)
        accs = [unique(f"{S}_acc", taken) for _ in range(W)]
        prims += [prim("stage_out", v[S], "ft", name=row, line=upd.line)]
        prims += [prim("stage_out", row, f"w#{j}", memory="psum", name=acc, line=upd.line, dtype="f32", of="p")
                  for j, acc in enumerate(accs)]
    elif not epilogue:  # the eviction writes the output's dtype
        acc, row = unique(f"{S}_acc", taken), unique(f"{S}_row", taken)
        prims.append(prim("stage_out", v[S], "ft", memory="psum", name=acc, line=upd.line, dtype="f32", cast=row))
    else:  # an fp32 row in SBUF the epilogue works on (cast for a narrower output), the sums in PSUM before it
        narrow = k.buffers()[S].dtype != "f32"
        row = unique(f"{S}_row", taken)
        cast = {"cast": unique(f"{S}_tile", taken)} if narrow else {}
        accs = [unique(f"{S}_acc", taken) for _ in range(W)]
        acc = accs[0]
        prims.append(prim("stage_out", v[S], "ft", name=row, line=upd.line, dtype="f32", **cast))
        prims += [prim("stage_out", row, f"w#{j}", memory="psum", name=a, line=upd.line, of="p")
                  for j, a in enumerate(accs)] if W > 1 else \
            [prim("stage_out", row, "ft", memory="psum", name=acc, line=upd.line, of="rt")]
    paired = group > 1 and dtype == "f32"
    if group > 1:
        for j in range(group):
            prims += [prim("stage", v[B], f"g#{j}", name=unique(f"{B}_r{j}", taken)) for B in reversed(reads)]
        # an expression of a copy's tiles computed into a tile of the source's dtype (TensorE sums it as it would
        # the source), each copy's nest then a sum of that tile
        for j in range(group if expr else 0):
            prims += [prim("bind_expr", acc, f"p#{j}", unique(f"{S}_terms_r{j}", taken), suffix=f"_t{j}",
                           dtype=dtype),
                      prim("tensorize", f"p_t{j}", **squares(upd.expr, dtype))]
        # fp32 tiles added in pairs on VectorE first (an fp32 matmul streams at 4.7x the 16-bit cost): each pair
        # of copies one nest `s += A_r0 + A_r1`, its sum bound to a tile of its own, TensorE sums that
        for q in range(group // 2 if paired else 0):
            prims += [prim("pair", f"g#{q}", f"g#{q + 1}"),
                      prim("bind_expr", acc, f"p#{q}", unique(f"{S}_pair{q}", taken), suffix=f"_x{q}"),
                      prim("tensorize", f"p_x{q}")]
    else:
        prims += [prim("stage", v[B], "rt", name=unique(f"{B}_tile", taken)) for B in reversed(reads)]
        if expr and W == 1:  # the staged tiles' expression computed into a tile of the source's dtype, then summed
            prims += [prim("bind_expr", acc, "p", unique(f"{S}_terms", taken), dtype=dtype),
                      prim("tensorize", "p_x", **squares(upd.expr, dtype))]
    prims += [prim("stage", v[c], "ft", name=unique(f"{c}_row", taken), near=True) for c in columns]
    prims.append(prim("tensorize", "p", line=init[0].line))
    # ScalarE evicts, applying a constant factor on the way, when the matmuls do not bound the step (16-bit
    # sources, or one row tile per eviction); fp32 row tiles are TensorE's (4.7x the 16-bit rate): VectorE
    # multiplies after a plain copy (build_colreduce measured it: 16 x 256 x 4096 bf16 mean 261 -> 174 us)
    evict = factor and (k.buffers()[A].dtype != "f32" or R == params.parts or paired)
    if paired and not (evict and factor):  # VectorE adds the pairs: ScalarE evicts (a factor: evict=True below)
        prims.append(prim("tensorize", f"{row}_c0", engine="scalar"))
    prims += [prim("tensorize", f"{e}_u_r", **({"evict": True} if evict and n == 0 else {}))
              for n, e in enumerate(loops)]
    how = "; row tiles added in pairs on VectorE first" if paired else ""
    what = fmt_expr(upd.expr) if expr else A
    return prims + [prim("block", "o", f"{S} = sum over {', '.join(red)} of {what} (ones matmul{how})")]


def square(e: Expr) -> Expr | None:
    """x when the expression is `x * x` (both operands the same expression), else None."""
    return e.args[0] if isinstance(e, Op) and e.name == "*" and len(e.args) == 2 and e.args[0] == e.args[1] else None


class _Squares:
    """Where colreduce's squares `T = x * x` (T summed by TensorE or added in pairs) run: `tensorize(.., square=
    "scalar")` puts one on ScalarE (activation square), x's fp32 producer shared by GpSimdE and VectorE
    (lower_tiles.scalar_squares); VectorE computed the subtraction, the square and the pairs while ScalarE and
    GpSimdE sat idle. A 16-bit square of a loaded tile is as fast on VectorE (tensor_tensor at its 1x rate) as on
    ScalarE: every other one stays there, in program order, the first on ScalarE. Model, 4096 x 4096 without
    start-up: `s[j] += (A - B) * (A - B)` f32 754.2 -> 376.0 us, bf16 622.5 -> 195.3 us; `s[j] += A * A` f32 453.7
    -> 220.9 us, bf16 183.3 -> 104.0 us (ScalarE alone 133.6 us) (DMA floors 364.8, 182.4, 182.4, 91.2)."""

    def __init__(self) -> None:
        self.loaded = 0  # 16-bit squares of loaded tiles met so far

    def __call__(self, e: Expr, dtype: str) -> dict[str, str]:
        x = square(e)
        if x is None:
            return {}
        if isinstance(x, Load) and dtype in ("bf16", "f16"):
            self.loaded += 1
            if self.loaded % 2 == 0:
                return {}
        return {"square": "scalar"}


def _stacked_sum(k: Kernel, params: ReducePlan, sizes: tuple[int, int, int, int, int],
                 names: tuple[list[str], list[str], list[str]], chain: list[Loop], init: Assign, upd: Update,
                 epilogue: list[str | None], v: dict[str, str], taken: set[str]) -> list[Prim]:
    """rules.colreduce for K o's stacked on the partitions (build_colreduce.stacked: one row tile holds the R
    reduced rows of an o, so K o's go on K * R partitions of one load and a (K * R, K) block-diagonal ones matrix
    sums each o's rows into its own row of a (K, TILE_F) PSUM tile); 6 x 32 x 512, K = 3:

        reshape(b, ((o, 2), (k, 3), (r, 32), (f, 512)), unit=False)   A_v[o, k, r, f], s_v[o, k, f]
        merge_dims(A_v, 1)                   A_v[o, 32*k + r, f]: one (96, TILE_F) tile per step
        split(r, 32, outer=rt, inner=p, name=TILE_P); split(f, 512, ..); reorder(o, ft, rt, k, p, f_i)
        partition(p, summed=True); partition(k)   s_acc[k, f_i] += A_tile[32*k + p, f_i]
        stage_out(s_v, ft, memory=psum, name=s_acc, cast=s_row); stage(A_v, rt, name=A_tile)
        tensorize(k)                         one matmul: ones[96, 3] (block-diagonal).T @ A_tile

    The epilogue steps are reshaped onto the same (o, k, f) rows and computed on the (K, TILE_F) row of sums. W > 1
    (build_colreduce.wide): a TILE_F of W PSUM banks per load, the banks written out as in rules.colreduce (each a
    (K, BANK_F) PSUM tile of its own, the factor on its eviction)."""
    O, R, F, K, W = sizes
    before, red, after = names
    S, reads = upd.dst.buf, list(dict.fromkeys(a.buf for a in loads(upd.expr)))
    A = reads[0]
    columns = [c for c in epilogue if c]
    at = {lp.var: lp.line for lp in chain}
    top = chain[0].var + ("#0" if epilogue else "")
    prims = [prim("fold_init", S),
             prim("reshape", top, (("o", O // K), ("k", K), ("r", R), ("f", F)),
                  notes=(f"for {', '.join(before)} ({K} at a time, stacked on the partitions)", "",
                         f"for {', '.join(red)}", f"for {', '.join(after)}"),
                  lines=(at[before[0]], at[before[0]], at[red[0]], at[after[0]] if after else init.line),
                  views=(*((B, v[B]) for B in reads), (S, v[S])), view_line=init.line, unit=False)]
    prims += [prim("merge_dims", v[B], 1) for B in reads]
    loops = [f"e{n + 1 if n else ''}" for n in range(len(epilogue))]
    tops = [s for s in k.body if isinstance(s, Loop)]
    for n, (e, c) in enumerate(zip(loops, epilogue)):  # each step over the same rows of sums: s_v[o, k, f]
        ref = tops[2 + n].var + ("#0" if len(epilogue) - n > 1 else "")
        views = ((S, v[S]),) + (((c, v[c]),) if c else ())
        lead = ((e, O // K),) if O > K else ()  # (one step: the reduction's s_v[k, f] has no o, a row it leaves out)
        prims.append(prim("reshape", ref, lead + ((f"{e}_k", K), (f"{e}_f", F)), views=views, unit=False))
    prims += [prim("split", "r", R, outer="rt", inner="p", name="TILE_P",
                   note=f"for {', '.join(red)} (the {R} rows of each of the {K} o's, summed in PSUM)")]
    if W > 1:
        prims += [prim("split", "f", W * params.free, outer="ft", inner="f_w", name="TILE_F"),
                  prim("split", "f_w", params.free, outer="w", inner="f_i", name="BANK_F",
                       note="the PSUM banks of a free tile: a matmul each, evicted into its part of the rows"),
                  prim("reorder", "o", "ft", "rt", "w", "k", "p", "f_i")]
    else:
        prims += [prim("split", "f", params.free, outer="ft", inner="f_i", name="TILE_F"),
                  prim("reorder", "o", "ft", "rt", "k", "p", "f_i")]
    prims += [prim("partition", "p", summed=True), prim("partition", "k")]
    step = layout.perfect_chain(tops[2])[-1].body[0] if epilogue else None
    factor = isinstance(step, Assign) and isinstance(step.expr, Op) and step.expr.name == "*"
    for n, e in enumerate(loops):  # each step on the (K, TILE_F) rows of sums of a free tile, once they are evicted
        where = "w" if W > 1 and n == 0 and factor else "ft"  # (wide: the factor on each bank's eviction)
        prims += [prim("reverse_compute_at", e if O > K else f"{e}_k", where), prim("partition", f"{e}_k_r")]
    accs = [unique(f"{S}_acc", taken) for _ in range(W)] if W > 1 else []
    if W > 1:  # the banks written out, each a PSUM tile of its own
        prims.append(prim("unroll", "w", copies=True))
    if not epilogue and W > 1:  # each bank's eviction writes its part of the rows, in the output's dtype
        row = unique(f"{S}_row", taken)
        prims.append(prim("stage_out", v[S], "ft", name=row, line=upd.line))
        prims += [prim("stage_out", row, f"w#{j}", memory="psum", name=a, line=upd.line, dtype="f32", of="k")
                  for j, a in enumerate(accs)]
    elif not epilogue:  # the eviction writes the output's dtype
        acc, row = unique(f"{S}_acc", taken), unique(f"{S}_row", taken)
        prims.append(prim("stage_out", v[S], "ft", memory="psum", name=acc, line=upd.line, dtype="f32", cast=row))
    else:  # fp32 rows in SBUF the epilogue works on (cast for a narrower output), the sums in PSUM before them
        narrow = k.buffers()[S].dtype != "f32"
        row = unique(f"{S}_row", taken)
        acc = accs[0] if accs else unique(f"{S}_acc", taken)
        cast = {"cast": unique(f"{S}_tile", taken)} if narrow else {}
        prims.append(prim("stage_out", v[S], "ft", name=row, line=upd.line, dtype="f32", **cast))
        prims += [prim("stage_out", row, f"w#{j}", memory="psum", name=a, line=upd.line, of="k")
                  for j, a in enumerate(accs)] if W > 1 else \
            [prim("stage_out", row, "ft", memory="psum", name=acc, line=upd.line, of="rt")]
    prims += [prim("stage", v[B], "rt", name=unique(f"{B}_tile", taken)) for B in reversed(reads)]
    prims += [prim("stage", v[c], "ft", name=unique(f"{c}_row", taken), near=True) for c in columns]
    prims.append(prim("tensorize", "k", line=init.line))
    prims += [prim("tensorize", f"{e}_k_r", **({"evict": True} if factor and n == 0 else {}))
              for n, e in enumerate(loops)]
    what = f"{S} = sum over {', '.join(red)} of {A} (ones matmul; a block-diagonal ones matrix sums each o's rows " \
        "apart)"
    return prims + [prim("block", "o", what)]


# ---- data movement -------------------------------------------------------------------------------------------------


def copy(k: Kernel, target: Target) -> list[Prim] | None:
    """The copy rule (crop, shift, a part of a concatenation, nearest upsampling): one assignment of a read over a
    perfect nest whose indices are loops plus constants (a loop read divided by k arrives split: i = k*i_q + i_r).

    A read of every loop moves its data HBM -> HBM: one DMA per block of partitions, the loop with the largest
    divisor <= 128 on the partitions and every loop inside it in the same descriptor stream (the loops outside
    it are DMAs of their own). A read that skips loops (upsampling: X[n, c, i_q, j_q]) replicates on chip: per
    block of partitions the read's region is loaded whole, one on-chip copy per combination of the skipped loops
    writes the strided positions of the result's tile (`Y_tile[c, 2*i_q + i_r, 2*j_q + j_r]`), and the tile is
    stored whole: both DMAs move long contiguous rows."""
    found = _one_copy(k)
    if found is None:
        return None
    chain, stmt, src = found
    loops = [lp.var for lp in chain]
    read = {t.var for i in src.index for t in i.terms}
    ext = {lp.var: lp.extent for lp in chain}
    Y, X = stmt.dst.buf, src.buf
    if src.fill is not None:  # a padded read: an interior box copied HBM -> HBM, fill boxes from a constant tile
        return rules_copy.padded_copy(k, target, chain, src)
    x_order, y_order = _plain(src.index), _plain(stmt.dst.index)
    if x_order and y_order and x_order != y_order:  # a permute that keeps its last dimension (select_permute)
        runs = dma_runs(tuple(x_order), tuple(y_order), ext, target.pmax)
        assert runs is not None, f"{Y} = {X}: a permuted copy must keep its last dimension"
        return _permute_dma(loops, runs, ext, X, Y, target)
    alone = {i.terms[0].var for i in stmt.dst.index if len(i.terms) == 1}  # a dimension of its own in the result
    itemsize = 4 if k.buffers()[Y].dtype == "f32" else 2
    plan = _replication(loops, read, alone, ext, itemsize, target)
    if plan is None:  # every loop read (a crop, a shift, a part), or replication that cannot be staged: HBM -> HBM
        return _hbm_copy(loops, read, ext, X, Y, target)
    part, chunk = plan
    d = best_divisor(ext[part], target.pmax)
    before, after = loops[:loops.index(part)], loops[loops.index(part) + 1:]
    skipped, kept = [v for v in after if v not in read], [v for v in after if v in read]
    p_out, p_in = f"{part}_o", f"{part}_p"  # staging happens at the block loop (extent 1 when one block is all)
    prims = [prim("split", part, d, outer=p_out, inner=p_in, note=f"for {part} (blocks of {d} partitions)")]
    if chunk < ext[kept[0]]:  # rows of the result's tile in chunks that fit
        rows = kept[0]
        prims.append(prim("split", rows, chunk, outer=f"{rows}_t", inner=f"{rows}_i",
                          note=f"for {rows} (chunks of {chunk})"))
        at, kept = f"{rows}_t", [f"{rows}_i"] + kept[1:]
        order = before + [p_out, at] + skipped + [p_in] + kept
    else:
        at = p_out
        order = before + [p_out] + skipped + [p_in] + kept
    taken = set(k.buffers())
    x_tile, y_tile = unique(f"{X}_tile", taken), unique(f"{Y}_tile", taken | {f"{X}_tile"})
    prims += [prim("reorder", *order), prim("partition", p_in),
              prim("stage_out", Y, at, name=y_tile), prim("stage", X, at, name=x_tile)]
    first = skipped[0]
    if ext[first] > 1:  # the copies of the first replicated loop's first position on ScalarE, the rest on VectorE
        prims += [prim("cut", first, 1), prim("tensorize", f"{p_in}@a", engine="scalar"),
                  prim("tensorize", f"{p_in}@b")]
    else:
        prims.append(prim("tensorize", p_in))
    return prims + [prim("block", loops[0], f"{Y} = {X} replicated ({d} partitions)")]


def _replication(loops: list[str], read: set[str], alone: set[str], ext: dict[str, int], itemsize: int,
                 target: Target) -> tuple[str, int] | None:
    """(partition loop, rows of the first kept loop per tile) for replication in SBUF, or None when the nest does
    not replicate or cannot be staged: the partition loop must be read, index a dimension of the result alone, and
    have replicated loops and read loops inside it (the tiles have a free dimension); a tile must fit in rows."""
    if all(v in read for v in loops):
        return None
    options = []
    for v in loops:
        after = loops[loops.index(v) + 1:]
        kept, skipped = [x for x in after if x in read], [x for x in after if x not in read]
        if v in read and v in alone and kept and skipped and not [x for x in loops[:loops.index(v)] if x not in read]:
            options.append(v)
    if not options:
        return None
    part = max(options, key=lambda v: (best_divisor(ext[v], target.pmax), -loops.index(v)))
    after = loops[loops.index(part) + 1:]
    rows = next(x for x in after if x in read)
    tile_bytes = math.prod(ext[v] for v in after) * itemsize
    per_row = tile_bytes // ext[rows]
    if per_row > COPY_TILE_BYTES:
        return None
    return part, best_divisor(ext[rows], max(1, COPY_TILE_BYTES // per_row))


def _permute_dma(loops: list[str], runs: tuple[tuple[str, ...], tuple[str, ...]], ext: dict[str, int], X: str,
                 Y: str, target: Target) -> list[Prim]:
    """A permute that keeps its last dimension, HBM -> HBM: per iteration of the outer loops one DMA per block of
    partitions copies X's slice over the inner loops (the same order on both sides) to Y's, in chunks of the
    dimensions the two share at their ends (`Y[n, h, s, d] = X[s, n, h, d]`: per (n, h), [s, d] slices, s on the
    partitions)."""
    outer, inner = runs
    part = inner[0]
    d = best_divisor(ext[part], target.pmax)
    p_in, split = part, []
    if d < ext[part]:
        p_in = f"{part}_p"
        split = [prim("split", part, d, outer=f"{part}_o", inner=p_in,
                      note=f"for {part} (blocks of {d} partitions)")]
    blocks = [f"{part}_o", p_in] if split else [p_in]
    order = list(outer) + blocks + list(inner[1:])
    now = [x for v in loops for x in (blocks if v == part else [v])]  # the loops after the split
    prims = split + ([prim("reorder", *order)] if order != now else [])
    label = f"{Y} = permute of {X} (HBM -> HBM, {d} partitions, {' x '.join(inner)} slices)"
    return prims + [prim("partition", p_in), prim("tensorize", p_in), prim("block", order[0], label)]


def _hbm_copy(loops: list[str], read: set[str], ext: dict[str, int], X: str, Y: str, target: Target) -> list[Prim]:
    """HBM -> HBM DMAs: the read loop with the largest divisor <= 128 on the partitions, the read loops inside it
    in the same descriptor stream; loops the read skips (a replication that cannot be staged) and read loops
    outside the partitions are DMAs of their own."""
    reads = [v for v in loops if v in read]
    part = max(reads, key=lambda v: (best_divisor(ext[v], target.pmax), -reads.index(v)))
    d = best_divisor(ext[part], target.pmax)
    p_in, p_out = part, ""
    prims: list[Prim] = []
    if d < ext[part]:
        p_out, p_in = f"{part}_o", f"{part}_p"
        prims.append(prim("split", part, d, outer=p_out, inner=p_in, note=f"for {part} (blocks of {d} partitions)"))
    split = lambda vs: [x for v in vs for x in ((p_out, p_in) if v == part and p_out else  # noqa: E731
                                                (p_in,) if v == part else (v,))]
    order = [v for v in loops if v not in read] + split(reads)  # the DMA's loops: the partitions, read loops
    if order != split(loops):
        prims.append(prim("reorder", *order))
    label = f"{Y} = copy of {X} (HBM -> HBM, {d} partitions)"
    return prims + [prim("partition", p_in), prim("tensorize", p_in), prim("block", order[0], label)]
