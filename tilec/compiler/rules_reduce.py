"""The row-reduction rule (`s[i] = c; s[i] OP= A[i, j]`, rules.reduce), short rows included; split from rules.py,
which re-exports it."""
from __future__ import annotations

import math

from tilec.compiler import layout
from tilec.compiler.names import unique
from tilec.compiler.nest import Access, Assign, Const, Kernel, Load, Loop, Op, Update, fmt_expr, loads
from tilec.compiler.rules_base import Prim, _at, _const, _plain, _ragged_parts, later_nest, prim, settings
from tilec.compiler.schedule import ReducePlan
from tilec.compiler.tensorize import match
from tilec.lang.functions import ACCUMULATE
from tilec.target import Target


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
    from tilec.compiler.build_reduce import long_row  # (the builder's own choice)
    if long_row(R, F, k.buffers()[reads[0]].dtype, len(reads) == 1 and isinstance(upd.expr, Load),
                any(epilogue)) is not None:
        return None  # one long row: over the partitions (build_reduce.build_long_row)
    from tilec.compiler.build_longrows import few_long_rows
    if few_long_rows(R, F, k.buffers()[reads[0]].dtype, len(reads) == 1 and isinstance(upd.expr, Load),
                     any(epilogue)) is not None:
        return None  # a few long rows: each over the partitions (build_longrows)
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
        ref = later_nest(chain[0].var, ["r", "f"] + [x for e0 in loops[:n] for x in (e0, f"{e0}_u")],
                         len(epilogue) - n > 1)
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
    # the table's activation that squares and sums a row (tensorize.match): named on the expression's nest
    how = match(upd, target)
    summed = {"square": "sum"} if how is not None and dict(how.roles).get("FN") == ("square",) else {}
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
        for q, p in enumerate(ps):  # a square's sum: one ScalarE activation, `square` with the row sum its reduce_res
            # each region of a ragged cut has temporaries of its own shape (rows, free elements)
            temps = {"temps": f"tmp{ctag(q)}_"} if ctag(q) else {}
            prims += [prim("tensorize", f"{p}_x", **summed, **temps)] if expr else []
            prims.append(prim("tensorize", p) if at != x("pt") else prim("tensorize", p, accumulate=True))
        prims += [prim("tensorize", f"{x(e)}_r") for e in loops]
        part = f", rows {r0}..{r0 + size}" if sfx else ""
        prims.append(prim("block", x("pt"), f"{S} = {ACCUMULATE[upd.op]} over the last dims of {what}{part}"))
    return settings(prims, params.unroll, params.single)


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
        ref = later_nest(chain[0].var, ["p", "g", "f"] + [x for e0 in loops[:n] for x in (e0, f"{e0}_g")],
                         len(epilogue) - n > 1)
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
