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

This module holds the primitives' dispatch (`apply`) and the element-wise rules; the other families live in
rules_transpose.py (transpose), rules_reduce.py (row reductions), rules_colreduce.py (column reductions) and
rules_move.py (copy), rules_copy.py and rules_pool.py, with the shared pieces in rules_base.py. The names are
re-exported here: `rules.reduce`, `rules.colreduce`, `rules.copy`, `rules.transpose`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

from tilec.compiler import fuse, layout, primitives as pr, rules_copy
from tilec.compiler.ir import DTYPE_BYTES
from tilec.compiler.names import unique
from tilec.compiler.nest import Access, Assign, Kernel, Loop, loads, loop_index, walk
from tilec.compiler.rules_base import Prim, _at, _const, _plain, _ragged_parts, prim, settings
from tilec.compiler.schedule import (ELTWISE_FREE, MOVING_FMAX, PMAX, EltwisePlan, best_divisor, eltwise_plan,
                                     row_free, rows_whole, tile_size)
from tilec.compiler.select_eltwise import outer_row, turn_run, turns
from tilec.target import Target



def _lowering_only(k: Kernel, *args: Any, **kw: Any) -> Kernel:
    return k


# primitives applied to the nest; `tensorize` and `block` only instruct the lowering (lower_tiles.py)
_PRIMITIVES: dict[str, Callable[..., Kernel]] = {
    "reshape": layout.reshape, "split": pr.split, "reorder": pr.reorder, "partition": pr.partition,
    "unroll": pr.unroll, "stage": pr.stage, "stage_out": layout.stage_out, "broadcast": layout.broadcast,
    "buffers": pr.buffers, "fold_init": pr.fold_init, "stage_grouped": layout.stage_grouped, "cut": layout.cut,
    "merge_dims": layout.merge_dims, "unroll_tiles": lambda k, base: unroll_tiles(k, base),
    "bind_expr": pr.bind_expr, "reverse_compute_at": pr.reverse_compute_at, "pair": pr.pair, "fuse": fuse.fuse,
    "tensorize": _lowering_only, "block": _lowering_only, "single": _lowering_only,
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
    outer: set[int] = set()  # rows read per outer index: where the outer indices end
    for a in loads(stmt.expr):
        idx = _plain(a.index)
        if idx is None and reversed_loops(a, chain) is not None and a.buf != stmt.dst.buf:
            full += [a.buf] if a.buf not in full else []  # a reversed read of every loop (A[N - 1 - i, j])
            continue
        if idx is None or a.buf == stmt.dst.buf:
            return None
        if idx == names or idx == [lp.var for lp in chain if lp.extent > 1 or lp.var in idx]:
            full += [a.buf] if a.buf not in full else []  # (loops of one iteration left out: the same element)
            continue
        split = outer_row(idx, names)  # `mask[b, k]` of S[b, h, q, k]: a row per b (selection checked the runs)
        if split is not None:
            outer.add(split[0])
            idx = names[split[1][0]:]
        if not idx or idx[0] not in names or names[names.index(idx[0]):names.index(idx[0]) + len(idx)] != idx:
            return None
        first = names.index(idx[0])
        group = rows if first + len(idx) == len(names) else columns
        group += [a.buf] if a.buf not in group else []
        runs.add((first, first + len(idx), group is rows))
    col = next(((a, b) for a, b, r in runs if not r), None)
    row = next(((a, b) for a, b, r in runs if r), None)
    run = col or ((0, row[0]) if row else (0, 0))
    if outer:
        if len(outer) > 1 or row is None or col not in (None, (min(outer), row[0])):
            return None
        run = (min(outer), row[0])
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


def eltwise_layout(n: Injective) -> tuple[tuple[str, int], ...]:
    """(), or with broadcasts the output as O (outer) x P (partitions) x F (free)."""
    if n.run == (0, 0):
        return ()
    ext = [lp.extent for lp in n.loops]
    a, b = n.run
    return (("O", math.prod(ext[:a])), ("P", math.prod(ext[a:b])), ("F", math.prod(ext[b:])))


def eltwise_params(n: Injective, k: Kernel) -> EltwisePlan:
    """The default parameters (schedule.eltwise_plan, which the op's default plan uses too)."""
    itemsize = DTYPE_BYTES[k.buffers()[n.stmt.dst.buf].dtype]
    return eltwise_plan(math.prod(lp.extent for lp in n.loops), dict(eltwise_layout(n)), len(n.rows),
                        itemsize=itemsize, stored_only=not n.full)


def eltwise(k: Kernel, target: Target, params: EltwisePlan | None = None) -> list[Prim] | None:
    """The element-wise rule: tiles of parts x free elements; inputs staged per tile, columns per partition tile,
    rows copied to every partition (once for the whole nest when they fit), the result staged and stored. Sizes
    the tiles do not divide are cut into the whole tiles and the rest (`cut`): flattened data then goes on the
    partitions along its own loops (the leading ones, where the fewest tiles cover it)."""
    n = injective(k)
    if n is None:
        return None
    default = eltwise_params(n, k)
    params = params or default
    if _unit_column(n) and params == default:  # (tiles a user's directives chose keep the column layout)
        return _unit_column_alone(n, params)
    if _rows_on_partitions(n) and params == default:
        return _rows_reused(n)
    if n.run == (0, 0):
        size = math.prod(lp.extent for lp in n.loops)
        if size % params.parts == 0 and (size // params.parts) % params.free == 0:
            return settings(_flat(n, params), params.unroll, params.single)
        n = replace(n, run=(0, _split_point(n, params)))
    half = {r: k.buffers()[r].dtype for r in n.rows if k.buffers()[r].dtype in ("bf16", "f16")}
    return settings(_broadcast(n, params, half), params.unroll, params.single)


def unroll_tiles(k: Kernel, base: str) -> Kernel:
    """`unroll` of every tile loop named `base` (`t`; a region's copies `t@a`, `t@ab`, .. after cuts) (golden:
    primitives/unroll_tiles.txt)."""
    for var in [lp.var for lp in walk(k.body) if isinstance(lp, Loop) and lp.var.split("@")[0] == base]:
        k = pr.unroll(k, var)
    return k


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
             *_flat_tiles(p),
             prim("partition", "p"),
             prim("stage_out", v[out], "t", name=name(f"{out}_tile"))]
    prims += [prim("stage", v[b], "t", name=name(f"{b}_tile")) for b in reversed(n.full)]
    return prims + [prim("tensorize", "p"), prim("block", "t", f"{out} = element-wise, {p.parts} partitions")]


def _flat_tiles(p: EltwisePlan) -> list[Prim]:
    """Free tiles of p.free elements (loop t); with `split` (p.dma_tiles = N) blocks of N tiles (loop t, what the
    stages load and store) each computed tile by tile (loop tc)."""
    if p.dma_tiles == 1:
        return [prim("split", "f", p.free, outer="t", inner="f_i", name="TILE_F"), prim("reorder", "t", "p")]
    return [prim("split", "f", p.free * p.dma_tiles, outer="t", inner="f_b", name="DMA_F"),
            prim("split", "f_b", p.free, outer="tc", inner="f_i", name="TILE_F"),
            prim("reorder", "t", "tc", "p")]


def _broadcast(n: Injective, p: EltwisePlan, half: dict[str, str] | None = None) -> list[Prim]:
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
    # the plan's wide tiles are for rows broadcast whole, which rows per outer index are not (schedule.row_free)
    p = replace(p, free=row_free(lay["F"], p.free, len(n.rows), _outer_rows(n), len(rows) > 1))
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
            prims += _broadcast_region(n, p, replace(p, parts=tp, free=tf), sfx, part, v, name, half or {})
    return prims


def _broadcast_region(n: Injective, plan: EltwisePlan, p: EltwisePlan, sfx: str, part: str, v: dict[str, str],
                      name: _Names, half: dict[str, str]) -> list[Prim]:
    """The schedule of one region of O x P x F (all of it, or a part after cuts: loops `o@ab`, `p@ab`, `f@ab`):
    tiles of p.parts x p.free, the whole-tile constants named after the plan's. A 16-bit row (`half`) is copied to
    the partitions in its own dtype (its values, through the fp32 PSUM copy, unchanged): a tensor_tensor of 16-bit
    operands only runs at VectorE's 1x rate, 2x with an fp32 one (nki-spec 1.10.4, perf/costs.py)."""
    lay = dict(eltwise_layout(n))
    at = lambda x: x + sfx  # noqa: E731
    tag = f"_{sfx[1:]}" if sfx else ""
    out = n.stmt.dst.buf
    per_o = bool(n.rows) and _outer_rows(n)  # rows read per outer index: staged inside loop o
    whole = rows_whole(lay["F"], p.free, len(n.rows), per_o, ragged=bool(sfx))
    # rows too long to broadcast whole: the free tiles go outside the partition tiles, so each tile of a row is
    # copied to every partition once, not once per partition tile
    per_tile = bool(n.rows) and not whole and lay["F"] // p.free > 1
    per_tile = per_tile if p.free_outer is None else p.free_outer  # a user's `reorder` (directives.py)
    order = (at("t"), at("o"), at("pt")) if per_tile else (at("pt"), at("o"), at("t"))
    prims = [prim("split", at("p"), p.parts, outer=at("pt"), inner=at("p_i"), name=_const(p.parts, plan.parts, "P")),
             prim("split", at("f"), p.free, outer=at("t"), inner=at("f_i"), name=_const(p.free, plan.free, "F")),
             prim("reorder", *order, at("p_i"), at("f_i")),
             prim("partition", at("p_i")),
             prim("stage_out", v[out], at("pt") if per_tile else at("t"), name=name(f"{out}_tile{tag}"))]
    prims += [prim("stage", v[x], at("pt") if per_tile else at("t"), name=name(f"{x}_tile{tag}"))
              for x in reversed(n.full)]
    once = []  # the rows' tiles: made on chip, not loaded per tile (expr_instrs: the tile's DMA time)
    for i, r in reversed(list(enumerate(n.rows))):
        where = "" if whole else at("o") if per_o and per_tile else at("t")
        row, tile = name(f"{r}_row{tag}"), name(f"{r}_tile{tag}")
        once.append(tile)
        prims += [prim("stage", v[r], where, name=row),
                  prim("broadcast", row, where, at("p_i"), name=tile, **({"dtype": half[r]} if r in half else {}))]
        if whole:  # one PSUM bank at a time: TILE_F columns, or (wider tiles) the largest divisor of F that fits
            chunk = "c" if i == 0 else f"c{i + 1}"
            width = p.free if p.free <= MOVING_FMAX else best_divisor(lay["F"], MOVING_FMAX)
            prims += [prim("split", f"{tile}_c1", width, outer=chunk, inner=f"{tile}_f",
                           name="TILE_F" if width == p.free else "ROW_CHUNK", note="for the free tiles of the row"),
                      prim("reorder", chunk, f"{tile}_c0")]
    prims += [prim("stage", v[c], at("pt"), name=name(f"{c}_col{tag}"), dtype="f32") for c in reversed(n.columns)]
    # with whole broadcast rows VectorE carries their tensor_tensor work: column terms go to ScalarE (bias/scale)
    fold = (whole or per_tile) and bool(n.rows) and bool(n.columns)
    label = f"{out} = element-wise" + (f", broadcasting {', '.join(n.columns + n.rows)}" if n.columns + n.rows else
                                       f", {', '.join(lp.var for lp in n.loops[n.run[0]:n.run[1]])} on the partitions"
                                       if n.run[1] else "")
    temps = {"temps": f"tmp{tag}_"} if tag else {}  # a region's temporaries have its own shape
    rows = {"once": tuple(once)} if once else {}
    return prims + [prim("tensorize", at("p_i"), fold=fold, regroup=fold, **temps, **rows),
                    prim("block", at("pt"), label + part)]


def _outer_rows(n: Injective) -> bool:
    """Whether a row operand is read per outer index (`mask[b, k]` in S[b, h, q, k]): its view is [o, 0, f]."""
    row_vars = {lp.var for lp in n.loops[n.run[1]:]}
    return any(set(_plain(a.index) or ()) - row_vars for a in loads(n.stmt.expr) if a.buf in n.rows)



def _rows_on_partitions(n: Injective) -> bool:
    """Rows of two or more trailing indices broadcast over few leading ones (`P[s, d]` of Y[b, s, d] = X[b, s, d] +
    P[s, d], a positional embedding added to a batch), no columns: laid out with the leading indices on the
    partitions, the tiles would have B partitions and each row (S x D long) would be copied to all of them (B = 8,
    512 x 512 fp32: 40x the DMA floor on the model). `_rows_reused` puts the row's first index on the partitions
    instead, in whole tiles of 128 (or all of it) and free tiles the default's, rows not read per outer index."""
    a, b = n.run
    ext = [lp.extent for lp in n.loops]
    if not n.rows or n.columns or a != 0 or b == 0 or b + 1 >= len(ext) or math.prod(ext[:b]) >= PMAX:
        return False
    if _outer_rows(n) or any(set(_plain(x.index) or ()) != {lp.var for lp in n.loops[b:]}
                             for x in loads(n.stmt.expr) if x.buf in n.rows):
        return False
    S, F = ext[b], math.prod(ext[b + 1:])
    return S > math.prod(ext[:b]) and (S <= PMAX or S % PMAX == 0) and F % tile_size(F, ELTWISE_FREE) == 0


def _rows_reused(n: Injective) -> list[Prim]:
    """The layout of `_rows_on_partitions`: [O, P, F] = [leading indices, the row's first index, the rest], the
    row operands read like full tiles of (P, F), staged once per (partition tile, free tile) and reused by every
    outer index in the loop inside:

        reshape(b, ((o, B), (p, S), (f, D)))       Y_v[o, p, f] = X_v[o, p, f] + P_v[0, p, f]
        split(p, 128, pt, p_i); split(f, TILE_F, t, f_i); reorder(pt, t, o, p_i, f_i); partition(p_i)
        stage_out(Y_v, o); stage(X_v, o); stage(P_v, t)        P's tile loaded once for all B
    """
    a, b = n.run
    names, ext = [lp.var for lp in n.loops], [lp.extent for lp in n.loops]
    O, S, F = math.prod(ext[:b]), ext[b], math.prod(ext[b + 1:])
    parts, free = min(S, PMAX), tile_size(F, ELTWISE_FREE)
    name = _Names(n)
    v = _views(n, name)
    out = n.stmt.dst.buf
    lines = (n.loops[0].line, n.loops[b].line, n.loops[b + 1].line)
    prims = [prim("reshape", n.top.var, (("o", O), ("p", S), ("f", F)),
                  notes=(f"for {', '.join(names[:b])}", f"for {names[b]}", f"for {', '.join(names[b + 1:])}"),
                  lines=lines, views=tuple(v.items()),
                  groups=(tuple(names[:b]), (names[b],), tuple(names[b + 1:]))),
             prim("split", "p", parts, outer="pt", inner="p_i", name="TILE_P"),
             prim("split", "f", free, outer="t", inner="f_i", name="TILE_F"),
             prim("reorder", "pt", "t", "o", "p_i", "f_i"),
             prim("partition", "p_i"),
             prim("stage_out", v[out], "o", name=name(f"{out}_tile"))]
    prims += [prim("stage", v[x], "o", name=name(f"{x}_tile")) for x in reversed(n.full)]
    prims += [prim("stage", v[r], "t", name=name(f"{r}_tile")) for r in reversed(n.rows)]
    label = f"{out} = element-wise, {', '.join(n.rows)} loaded once for every {', '.join(names[:b])}"
    return prims + [prim("tensorize", "p_i", fold=False, regroup=False), prim("block", "pt", label)]

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
    return n is not None and _unit_column(n) and params == eltwise_params(n, k)


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

# the rule families split from this module, re-exported (callers say rules.reduce, rules.colreduce, ..)
from tilec.compiler.rules_transpose import Permute, _one_copy, _region, permute, transpose  # noqa: E402,F401
from tilec.compiler.rules_reduce import _epilogue_step, _reduce_views, _short_rows, reduce  # noqa: E402,F401
from tilec.compiler.rules_colreduce import _Squares, _stacked_sum, colreduce  # noqa: E402,F401
from tilec.compiler.rules_move import (COPY_TILE_BYTES, _hbm_copy, _permute_dma, _replication,  # noqa: E402,F401
                                       copy)
