"""The column-reduction rule (`s[o, f] = 0; s[o, f] += A[o, r, f]`, rules.colreduce): grouped row tiles, fp32
pairs, expressions and their squares, wide loads, stacked o's; split from rules.py, which re-exports it."""
from __future__ import annotations

import math

from tilec.compiler import layout, rules_colragged as ragged_parts
from tilec.compiler.names import unique
from tilec.compiler.nest import Assign, Expr, Kernel, Load, Loop, Op, Update, fmt_expr, loads
from tilec.compiler.rules_base import Prim, _plain, later_nest, prim, settings
from tilec.compiler.rules_reduce import _epilogue_step, _reduce_views
from tilec.compiler.schedule import ReducePlan
from tilec.compiler.tensorize import square
from tilec.target import Target


# ---- column reductions --------------------------------------------------------------------------------------------


def colreduce(k: Kernel, target: Target, params: ReducePlan) -> list[Prim] | None:
    """The column-reduction rule (_column_sum), then the plan's `unroll` of the row tiles (`rt`) or the free tiles
    (`ft`) and `buffers A, 1` (A's row tiles in one buffer; not for row tiles loaded in groups, each group tile a
    buffer of its own: the pipeline then refuses the directive)."""
    prims = _column_sum(k, target, params)
    if prims is None:
        return None
    grouped = any(p.name == "stage" and str(p.args[1]).startswith("g#") for p in prims)
    return settings(prims, params.unroll, () if grouped else params.single)


def _column_sum(k: Kernel, target: Target, params: ReducePlan) -> list[Prim] | None:
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
    from tilec.compiler.build_colreduce import _group, kept_tile, row_pairs_of, stacked, wide  # (the builder's own choices)
    from tilec.compiler.build_colouter import outer_layout
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
    # every tensor of the expression at one element, and rows read at the kept indices (`abs(X[i, j] - c[j])`,
    # no kept index before the reduced run): staged per free tile and broadcast to the partitions
    rows = list(dict.fromkeys(a.buf for a in loads(upd.expr) if out and names[-len(out):] == out and
                              _plain(a.index) == out != names))
    reads = list(dict.fromkeys(a.buf for a in loads(upd.expr) if a.buf not in rows))
    if len(init) != 1 or not isinstance(init[0], Assign) or init[0].dst != upd.dst or out is None or not reads or \
            any(_plain(a.index) != names for a in loads(upd.expr) if a.buf not in rows) or upd.dst.buf in reads:
        return None
    red = [v for v in names if v not in out]
    first = names.index(red[0]) if red else 0
    if not red or names[first:first + len(red)] != red or names[:first] + names[first + len(red):] != out:
        return None
    ext = {lp.var: lp.extent for lp in chain}
    O, R, F = (math.prod(ext[v] for v in vs) for vs in (names[:first], red, names[first + len(red):]))
    S, A = upd.dst.buf, reads[0]
    dtype = k.buffers()[A].dtype
    terms = terms_dtype(dtype, k.buffers()[S].dtype)
    expr = not isinstance(upd.expr, Load)
    if kept_tile(O, R, F, dtype, not expr, any(epilogue)) is not None:
        return None  # few reduced rows: the kept elements go on the partitions (build_colreduce.build_column_kept)
    if outer_layout(O, R, F, dtype, len(reads), any(epilogue)):
        return None  # many outer rows, few reduced ones: the outer rows go on the partitions (build_colouter)
    group, W, K = _group(R // params.parts), wide(O, R, F, params, 1, dtype), stacked(O, R, params)
    pairs = row_pairs_of(R, params, dtype, expr) > 1
    pairs = pairs and (K > 1 or W > 1)  # (one fp32 o of one row tile: its matmuls bound it either way)
    # a user's tiles that do not divide the rows or columns: the plain layout, cut (rules_colragged)
    ragged, ragged_f = R % params.parts != 0, F % params.free != 0
    if ragged or ragged_f:
        group, W, K, pairs = 1, 1, 1, False
        if any(lp.extent == 1 for lp in chain):
            return None
    if (K > 1 or pairs) and any(lp.extent == 1 for lp in chain):
        return None  # (the builder stacks these: nests with unit loops)
    columns = [c for c in epilogue if c]
    if rows and (K > 1 or pairs or set(rows) & set(columns)):
        return None
    v, taken = _reduce_views(S, reads + rows, columns)
    before, after = names[:first], names[first + len(red):]
    if pairs:  # rows 2q and 2q + 1 on one partition (build_colreduce.row_pairs): R / 2 partitions an o
        half = ReducePlan(params.parts // 2, params.free)
        K = stacked(O, R // 2, half)
        W = wide(O, R // 2, F, ReducePlan(K * half.parts, params.free), K, dtype)
        if K == 1:  # (one o on R / 2 partitions: the reshape drops a unit k from the views; the builder's)
            return None
        return _stacked_sum(k, params, (O, R, F, K, W), (before, red, after), chain, init[0], upd, epilogue, v,
                            taken, pairs=True)
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
                  lines=(line(before), line(red), line(after)),
                  views=(*((B, v[B]) for B in reads + rows), (S, v[S])),
                  view_line=init[0].line, groups=groups)]
    loops = [f"e{n + 1 if n else ''}" for n in range(len(epilogue))]
    for n, (e, c) in enumerate(zip(loops, epilogue)):  # each step over the same rows of sums: s_v[o, 0, f]
        made = ["o", "r", "f"] + [x for e0 in loops[:n] for x in ([e0] if before else []) + [f"{e0}_u", f"{e0}_f"]]
        ref = later_nest(tops[2 + n].var, made, len(epilogue) - n > 1)
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
            prims += [prim("bind_expr", v[S], "p", unique(f"{S}_terms", taken), dtype=terms),
                      prim("tensorize", "p_x", **squares(upd.expr, terms, bool(rows)))]
        prims += [prim("split", "f_w", params.free, outer="w", inner="f_i", name="BANK_F",
                       note="the PSUM banks of a free tile: a matmul each, evicted into its part of the row"),
                  prim("reorder", "w", "p", "f_i")]
    elif ragged or ragged_f:
        prims += ragged_parts.splits(R, params.parts, F, params.free, red)
        if ragged_f:  # each column part a sum of its own
            sq = squares(upd.expr, terms, bool(rows)) if expr else None
            step = layout.perfect_chain(tops[2])[-1].body[0] if epilogue else None
            factor = isinstance(step, Assign) and isinstance(step.expr, Op) and step.expr.name == "*"
            cast = {"cast": unique(f"{S}_tile", taken)} if epilogue and k.buffers()[S].dtype != "f32" else {}
            evict = factor and (dtype != "f32" or R == params.parts)
            return prims + ragged_parts.column_parts(
                S, v, reads, rows, taken, (R, params.parts, F, params.free), (upd.line, init[0].line), terms, sq,
                f"{S} = sum over {', '.join(red)} of {fmt_expr(upd.expr) if expr else A} (ones matmul)",
                (loops, bool(before), [c for c in epilogue if c], cast, evict))
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
            [prim("stage_out", row, "ft", memory="psum", name=acc, line=upd.line,
                  of="rt@a+rt@b" if ragged else "rt")]
    paired = group > 1 and dtype == "f32"
    broadcast = [] if ragged else \
        [p for c in reversed(rows) for p in _broadcast_row(c, v[c], taken, "p#0" if group > 1 else "p")]
    if group > 1:
        for j in range(group):
            prims += [prim("stage", v[B], f"g#{j}", name=unique(f"{B}_r{j}", taken)) for B in reversed(reads)]
        prims += broadcast
        # an expression of a copy's tiles computed into a tile of the source's dtype (TensorE sums it as it would
        # the source), each copy's nest then a sum of that tile
        for j in range(group if expr else 0):
            prims += [prim("bind_expr", acc, f"p#{j}", unique(f"{S}_terms_r{j}", taken), suffix=f"_t{j}",
                           dtype=terms),
                      prim("tensorize", f"p_t{j}", **squares(upd.expr, terms, bool(rows)))]
        # fp32 tiles added in pairs on VectorE first (an fp32 matmul streams at 4.7x the 16-bit cost): each pair
        # of copies one nest `s += A_r0 + A_r1`, its sum bound to a tile of its own, TensorE sums that
        for q in range(group // 2 if paired else 0):
            prims += [prim("pair", f"g#{q}", f"g#{q + 1}"),
                      prim("bind_expr", acc, f"p#{q}", unique(f"{S}_pair{q}", taken), suffix=f"_x{q}"),
                      prim("tensorize", f"p_x{q}", **({"gpsimd": True} if rows else {}))]
    elif ragged:
        prims += ragged_parts.stages(reads, rows, v, taken, R, params.parts)
        if expr:
            prims += ragged_parts.terms(acc, S, terms, taken, R, params.parts, squares(upd.expr, terms, bool(rows)))
    else:
        prims += [prim("stage", v[B], "rt", name=unique(f"{B}_tile", taken)) for B in reversed(reads)] + broadcast
        if expr and W == 1:  # the staged tiles' expression computed into a tile of the source's dtype, then summed
            prims += [prim("bind_expr", acc, "p", unique(f"{S}_terms", taken), dtype=terms),
                      prim("tensorize", "p_x", **squares(upd.expr, terms, bool(rows)))]
    prims += [prim("stage", v[c], "ft", name=unique(f"{c}_row", taken), near=True) for c in columns]
    prims += [prim("tensorize", p, line=init[0].line) for _, p, _ in ragged_parts.regions(R, params.parts)] \
        if ragged else [prim("tensorize", "p", line=init[0].line)]
    # ScalarE evicts, applying a constant factor on the way, when the matmuls do not bound the step (16-bit
    # sources, or one row tile per eviction); fp32 row tiles are TensorE's (4.7x the 16-bit rate): VectorE
    # multiplies after a plain copy (build_colreduce measured it: 16 x 256 x 4096 bf16 mean 261 -> 174 us)
    evict = factor and (k.buffers()[A].dtype != "f32" or R == params.parts or paired)
    if paired and not (evict and factor):  # VectorE adds the pairs: ScalarE evicts (a factor: evict=True below)
        prims.append(prim("tensorize", f"{row}_c0", engine="scalar"))
    elif expr and W > 1 and not epilogue and not columns:
        # the terms' tensor_tensor is VectorE's (with GpSimdE): its evictions of one row tile's banks would queue
        # the next row tile's terms behind this tile's matmuls (VectorE runs in order), so ScalarE evicts
        prims.append(prim("tensorize", f"{row}_c0", engine="scalar"))
    prims += [prim("tensorize", f"{e}_u_r", **({"evict": True} if evict and n == 0 else {}))
              for n, e in enumerate(loops)]
    how = "; row tiles added in pairs on VectorE first" if paired else ""
    what = fmt_expr(upd.expr) if expr else A
    return prims + [prim("block", "o", f"{S} = sum over {', '.join(red)} of {what} (ones matmul{how})")]


def _broadcast_row(c: str, view: str, taken: set[str], part: str) -> list[Prim]:
    """A row the summed expression reads at the kept indices (`c[j]` of `abs(X[i, j] - c[j])`): one load of the
    free tile's part of it, copied to every partition of the row tiles (a ones matmul into PSUM, evicted) once per
    free tile, for all the row tiles the tile's sums take."""
    row = unique(f"{c}_row", taken)
    return [prim("stage", view, "ft", name=row), prim("broadcast", row, "ft", part, name=unique(f"{c}_tile", taken))]


def terms_dtype(source: str, out: str) -> str:
    """The dtype of a column sum's terms tile (`X[i, j] * X[i, j] / M` before TensorE sums it): the source's 16-bit
    dtype when the sum is stored in it too (TensorE sums at its 16-bit rate; the result is rounded to that dtype
    anyway), else f32: a bf16 tile for an f32 sum rounds every term, which the reference does not (core23: bf16 X,
    f32 s at 300 x 2048 was 0.000194 off against a tolerance of 4.98e-05)."""
    return source if source == out else "f32"


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

    def __call__(self, e: Expr, dtype: str, shared: bool = False) -> dict[str, str | bool]:
        x = square(e)
        if x is None:  # (`shared`: fp32 element-wise work split by columns with GpSimdE, shared_with_gpsimd)
            return {"gpsimd": True} if shared else {}
        if isinstance(x, Load) and dtype in ("bf16", "f16"):
            self.loaded += 1
            if self.loaded % 2 == 0:
                return {}
        return {"square": "scalar"}


def _stacked_sum(k: Kernel, params: ReducePlan, sizes: tuple[int, int, int, int, int],
                 names: tuple[list[str], list[str], list[str]], chain: list[Loop], init: Assign, upd: Update,
                 epilogue: list[str | None], v: dict[str, str], taken: set[str], pairs: bool = False) -> list[Prim]:
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
    (K, BANK_F) PSUM tile of its own, the factor on its eviction).

    An expression of stacked o's is bound over the whole stacked (and wide) tile before the banks split the sum:
    `bind_expr(s_v, k, s_terms, merged=True, dtype=<source>)`, `tensorize(k_x)` (a square: square=scalar).

    `pairs` (fp32, build_colreduce.row_pairs): rows 2q and 2q + 1 of an o on one partition, so an o takes R / 2
    partitions (K of them stacked, K = 1 too) and GpSimdE and VectorE add each partition's two rows before TensorE
    sums the partitions; 16 x 128 x 4096 f32, K = 2, W = 4:

        reshape(b, ((o, 8), (k, 2), (q, 64), (l, 2), (f, 4096)), unit=False)   A_v[o, k, q, l, f]
        merge_dims(A_v, 1)                   A_v[o, 64*k + q, l, f]
        split(q, 64, outer=rt, inner=p, name=TILE_P); split(f, 2048, outer=ft, inner=f_w, name=TILE_F)
        reorder(o, ft, rt, l, k, p, f_w); partition(p, summed=True); partition(k)
        unroll(l, copies=True); pair(l#0, l#1)   s_v[o, k, f] += A_v[.., 64*k + p, 0, f] + A_v[.., 64*k + p, 1, f]
        bind_expr(s_v, k, s_pair, merged=True)   s_pair[k_x, f] = (the two rows): one (128, TILE_F) tile
        split(f_w, 512, outer=w, inner=f_i, name=BANK_F); reorder(w, k, p, f_i)   (the banks, as above)
        stage(A_v, rt, name=A_rows)          one (128, 2, TILE_F) load
        tensorize(k_x, gpsimd=True)          the add split by columns between GpSimdE and VectorE
        tensorize(s_row_c0, engine=scalar)   ScalarE evicts (a factor: on the eviction, evict=True)"""
    O, R, F, K, W = sizes
    L = 2 if pairs else 1
    R //= L
    before, red, after = names
    S, reads = upd.dst.buf, list(dict.fromkeys(a.buf for a in loads(upd.expr)))
    A = reads[0]
    dtype = k.buffers()[A].dtype
    terms = terms_dtype(dtype, k.buffers()[S].dtype)
    columns = [c for c in epilogue if c]
    at = {lp.var: lp.line for lp in chain}
    top = chain[0].var + ("#0" if epilogue else "")
    r = "q" if pairs else "r"
    rows = ((r, R), ("l", L)) if pairs else ((r, R),)
    prims = [prim("fold_init", S),
             prim("reshape", top, (("o", O // K), ("k", K)) + rows + (("f", F),),
                  notes=(f"for {', '.join(before)} ({K} at a time, stacked on the partitions)", "",
                         f"for {', '.join(red)}") + (("",) if pairs else ()) + (f"for {', '.join(after)}",),
                  lines=(at[before[0]], at[before[0]], at[red[0]]) + ((at[red[0]],) if pairs else ()) +
                  (at[after[0]] if after else init.line,),
                  views=(*((B, v[B]) for B in reads), (S, v[S])), view_line=init.line, unit=False)]
    prims += [prim("merge_dims", v[B], 1) for B in reads]
    loops = [f"e{n + 1 if n else ''}" for n in range(len(epilogue))]
    tops = [s for s in k.body if isinstance(s, Loop)]
    for n, (e, c) in enumerate(zip(loops, epilogue)):  # each step over the same rows of sums: s_v[o, k, f]
        made = ["o", "k", *(x for x, _ in rows), "f"] + \
            [x for e0 in loops[:n] for x in ([e0] if O > K else []) + [f"{e0}_k", f"{e0}_f"]]
        ref = later_nest(tops[2 + n].var, made, len(epilogue) - n > 1)  # (the reduction's loops come first)
        views = ((S, v[S]),) + (((c, v[c]),) if c else ())
        lead = ((e, O // K),) if O > K else ()  # (one step: the reduction's s_v[k, f] has no o, a row it leaves out)
        prims.append(prim("reshape", ref, lead + ((f"{e}_k", K), (f"{e}_f", F)), views=views, unit=False))
    expr = not isinstance(upd.expr, Load)
    bound = unique(f"{S}_pair", taken) if pairs else unique(f"{S}_terms", taken) if expr else ""
    if bound:  # the pairs' sums or the expression's terms of the whole loaded tile: one (K*R, TILE_F) tile
        fx = "f_w" if W > 1 else "f_i"
        note = f"{L} to a partition: added on GpSimdE/VectorE, then summed in PSUM" if pairs else "summed in PSUM"
        prims += [prim("split", r, R, outer="rt", inner="p", name="TILE_P",
                       note=f"for {', '.join(red)} (the {L * R} rows of each of the {K} o's, {note})"),
                  prim("split", "f", W * params.free, outer="ft", inner=fx, name="TILE_F"),
                  prim("reorder", "o", "ft", "rt", *(["l"] if pairs else []), "k", "p", fx),
                  prim("partition", "p", summed=True), prim("partition", "k")]
        prims += [prim("unroll", "l", copies=True), prim("pair", "l#0", "l#1")] if pairs else []
        prims.append(prim("bind_expr", v[S], "k", bound, merged=True, **({"dtype": terms} if expr else {})))
        prims += [prim("split", "f_w", params.free, outer="w", inner="f_i", name="BANK_F",
                       note="the PSUM banks of a free tile: a matmul each, evicted into its part of the rows"),
                  prim("reorder", "w", "k", "p", "f_i")] if W > 1 else []
    else:
        prims += [prim("split", r, R, outer="rt", inner="p", name="TILE_P",
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
    prims += [prim("stage", v[B], "rt", name=unique(f"{B}_rows" if pairs else f"{B}_tile", taken))
              for B in reversed(reads)]
    prims += [prim("stage", v[c], "ft", name=unique(f"{c}_row", taken), near=True) for c in columns]
    prims += [prim("tensorize", "k_x", gpsimd=True)] if pairs else \
        [prim("tensorize", "k_x", **_Squares()(upd.expr, dtype))] if expr else []
    prims.append(prim("tensorize", "k", line=init.line))
    if pairs and not factor:  # GpSimdE and VectorE add the pairs: ScalarE evicts (a factor: evict=True below)
        prims.append(prim("tensorize", f"{row}_c0", engine="scalar"))
    prims += [prim("tensorize", f"{e}_k_r", **({"evict": True} if factor and n == 0 else {}))
              for n, e in enumerate(loops)]
    how = "; two rows per partition, added on GpSimdE/VectorE first, a block-diagonal ones matrix per o" if pairs \
        else "; a block-diagonal ones matrix sums each o's rows apart"
    what = fmt_expr(upd.expr) if expr else A
    return prims + [prim("block", "o", f"{S} = sum over {', '.join(red)} of {what} (ones matmul{how})")]


def terms_before_pairs(built: tuple[list, list]) -> tuple[list, list]:
    """A group's row tiles' terms first, then their pair adds and matmuls (level B, after lower_tiles): with the
    pairs between, VectorE's add of tiles 0 and 1 waited for ScalarE's abs of tile 1 while tile 2's subtraction,
    queued behind it on VectorE (in order), waited too (column_l1: the engines' bound ~1.25x, the run 1.71x).
    A pair segment (its tile's allocation, the adds writing it, the matmul reading it) reads only terms made before
    it and adds into the PSUM sum, so it may go after the other tiles' terms; statements keep their order
    otherwise. Only a body whose matmuls are all pair segments into a sum allocated outside it (their order, and
    so which one starts the sum, is kept) and has two or more of them."""
    from dataclasses import replace as _replace

    from tilec.compiler import ir

    def body(stmts: tuple) -> tuple:
        out, pairs, seg = [], [], None
        for s in stmts:
            if isinstance(s, ir.Alloc) and "_pair" in s.buf.name and seg is None:
                seg = [s]
                continue
            if seg is not None:
                seg.append(s)
                if isinstance(s, ir.Matmul) and s.moving.buf.name == seg[0].buf.name:
                    pairs += seg
                    seg = None
                elif not (isinstance(s, ir.Binary) and s.dst.buf.name == seg[0].buf.name):
                    return tuple(fix(x) for x in stmts)  # not a plain pair segment: left as it was
                continue
            out.append(fix(s))
        moved = [p for p in pairs if isinstance(p, ir.Matmul)]
        others = [x for x in ir.walk(tuple(out)) if isinstance(x, (ir.Matmul, ir.Alloc)) and
                  (isinstance(x, ir.Matmul) or x.buf.memory == "psum")]
        if seg is not None or len(moved) < 2 or others:  # only pair matmuls into a sum made outside the body
            return tuple(fix(x) for x in stmts)
        return tuple(out + pairs)

    def fix(s):
        if isinstance(s, (ir.Loop, ir.Block)):
            return _replace(s, body=body(s.body))
        return s
    consts, stmts = built
    return consts, [fix(s) for s in stmts]
