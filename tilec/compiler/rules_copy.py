"""Padded copies (issue 13 item 5): `Y[i, j] = X[i - 2, j + 1] ?? 0` (torch's F.pad then a crop, a shifted image
with zeros entering, a padded copy into a larger tensor, any constant fill). The copy rule's schedule for them:

    cut each loop where its read index enters and leaves X      the nest as boxes: one interior box, whose read
                                                                stays inside X, and fill boxes, each wholly outside
    resolve_fill()                                              the interior read loses its `?? fill`; a read
                                                                wholly outside becomes the constant
    the interior box: HBM -> HBM DMAs (rules._hbm_copy)         as a crop or shift
    each fill box: split/reorder/partition, then                a constant tile in SBUF, set once at the start of
    fill_from(p, tile)                                          the kernel, stored into the box (one DMA per block
                                                                of partitions)

X is never padded in HBM, and no element of X goes through SBUF. The primitives here (`resolve_fill`, `fill_from`)
keep the nest's meaning (evaluate before, evaluate after: tests/compiler/test_padded_copy.py).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from tilec.compiler import layout
from tilec.compiler.ir import Aff, Term
from tilec.compiler.names import unique
from tilec.compiler.nest import Access, Alloc, Assign, Buffer, Const, Expr, Kernel, Load, Loop, Op, Stmt
from tilec.compiler.primitives import _fail, find_loop
from tilec.compiler.schedule import best_divisor
from tilec.errors import Span
from tilec.lang.evaluator import round_to
from tilec.target import Target

FILL_TILE_BYTES = 16 * 1024  # SBUF per partition a constant fill tile may take; larger fill boxes are stored in parts
STAGE_TILE_BYTES = 64 * 1024  # SBUF per partition of a block of padded rows made on chip (larger: HBM -> HBM)


# ---- primitives ----------------------------------------------------------------------------------------------------


def _range(a: Aff, ext: dict[str, int]) -> tuple[int, int]:
    """[lowest, highest] value of an affine index over the loops' extents."""
    lo = hi = a.const
    for t in a.terms:
        lo += min(0, t.coef * (ext[t.var] - 1))
        hi += max(0, t.coef * (ext[t.var] - 1))
    return lo, hi


def resolve_fill(k: Kernel, span: Span | None = None) -> Kernel:
    """Each padded read (`X[i - 2] ?? 0`) whose indices stay inside X over its loops loses its fill; one with an
    index wholly outside X becomes the fill (rounded to X's dtype, as the reference does). A read that is partly
    inside and partly outside is an error: cut its loops first (golden: tests/compiler/test_padded_copy.py)."""
    bufs = k.buffers()

    def expr(e: Expr, ext: dict[str, int]) -> Expr:
        if isinstance(e, Load) and e.access.fill is not None:
            a = e.access
            ranges = [_range(i, ext) for i in a.index]
            shape = bufs[a.buf].shape
            if all(0 <= lo and hi < n for (lo, hi), n in zip(ranges, shape)):
                return replace(e, access=replace(a, fill=None))
            if any(hi < 0 or lo >= n for (lo, hi), n in zip(ranges, shape)):
                value = float(round_to(bufs[a.buf].dtype, np.asarray(a.fill, np.float32)))
                return Const(value, e.span)
            raise _fail(f"resolve_fill: the padded read of {a.buf} is partly inside it over these loops", span,
                        "cut the loops where the read index enters and leaves the buffer first")
        if isinstance(e, Op):
            return replace(e, args=tuple(expr(x, ext) for x in e.args))
        return e

    def visit(s: Stmt, ext: dict[str, int]) -> Stmt:
        if isinstance(s, Loop):
            inner = {**ext, s.var: s.extent}
            return replace(s, body=tuple(visit(x, inner) for x in s.body))
        if isinstance(s, Assign):
            return replace(s, expr=expr(s.expr, ext))
        return s
    return replace(k, body=tuple(visit(s, {}) for s in k.body))


def fill_from(k: Kernel, part: str, tile: str, target: Target | str | None = None, span: Span | None = None
              ) -> Kernel:
    """The constant store under partition loop `part` (`Y[.., p, f..] = c`) reads a constant tile instead:
    `tile[p, f..]`, an SBUF buffer of the partitions x the free loops' extents set to c once at the start of the
    kernel (its nest `tile_p`, `tile_f1`..: tensorize `tile_p`). A tile of that name already made (of the dtype and
    value, at least as large in every dimension) is reused: the store reads its first elements."""
    loop = find_loop(k, part, span)
    if loop.kind != "partition":
        raise _fail(f"fill_from {part}: the loop is not on the partitions (partition it first)", span)
    chain = layout.perfect_chain(loop)
    body = chain[-1].body
    if len(body) != 1 or not isinstance(body[0], Assign) or not isinstance(body[0].expr, Const):
        raise _fail(f"fill_from {part}: the nest does not store one constant", span)
    store, value = body[0], body[0].expr.value
    dtype = k.buffers()[store.dst.buf].dtype
    shape = tuple(lp.extent for lp in chain)
    if isinstance(target, Target):
        per_partition = (4 if dtype == "f32" else 2) * math.prod(shape[1:])
        if shape[0] > target.pmax or per_partition > target.sbuf_usable:
            raise _fail(f"fill_from {part}: a tile {list(shape)} of {dtype} does not fit {target.name}'s SBUF", span)
    names = [f"{tile}_p"] + [f"{tile}_f{n + 1}" for n in range(len(shape) - 1)]
    unit = (Aff(()),) if len(shape) == 1 else ()  # a tile has a free dimension: (P, 1) for a store of columns
    read = Load(Access(tile, tuple(Aff((Term(lp.var),)) for lp in chain) + unit))
    made = k.buffers().get(tile)
    if made is None:
        buf = Buffer(tile, "sbuf", dtype, shape + (1,) * len(unit))
        fill: Stmt = Assign(Access(tile, tuple(Aff((Term(v),)) for v in names) + unit), Const(value), store.line)
        for v, n in reversed(list(zip(names[1:], shape[1:]))):
            fill = Loop(v, n, (fill,), "serial", store.line)
        start: tuple[Stmt, ...] = (Alloc(buf, store.line), Loop(names[0], shape[0], (fill,), "partition", store.line,
                                                                   note=f"{tile}: the fill value {value:g}, set once"))
        k = replace(k, body=start + k.body)
    elif len(made.shape) != len(shape) + len(unit) or any(m < n for m, n in zip(made.shape, shape)) \
            or made.dtype != dtype or _tile_value(k, tile) != value:
        raise _fail(f"fill_from {part}: {tile} is not a constant tile of {value:g} covering {list(shape)}", span)
    new = replace(store, expr=read)
    return _replace_stmt(k, store, new)


def _tile_value(k: Kernel, tile: str) -> float | None:
    for s in k.body:
        if isinstance(s, Loop) and s.var == f"{tile}_p":
            found = [x for x in layout.walk((s,)) if isinstance(x, Assign)]
            return found[0].expr.value if found and isinstance(found[0].expr, Const) else None
    return None


def _replace_stmt(k: Kernel, old: Stmt, new: Stmt) -> Kernel:
    def visit(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        return tuple(new if s is old else replace(s, body=visit(s.body)) if isinstance(s, Loop) else s for s in body)
    return replace(k, body=visit(k.body))


# ---- the rule ------------------------------------------------------------------------------------------------------


def _tag(v: str, tag: str) -> str:
    """A loop's name in a box made by `cut` (layout.cut's convention: NAME@a, then NAME@ab ...)."""
    return v + ("" if "@" in v else "@") + tag


def sub(v: str, suffix: str) -> str:
    """A loop made from v by a split, named so that the kernel shows it as BASE_suffix (`i@b` -> `i_o@b`)."""
    base, at, tag = v.partition("@")
    return f"{base}{suffix}{at}{tag}"


def interior(index: Aff, n: int, extent: int) -> tuple[int, int]:
    """[lo, hi) of the loop (index = v + c) where the read X[.., v + c, ..] is inside X's n elements."""
    c = index.const
    return max(0, -c), min(extent, n - c)


def padded_copy(k: Kernel, target: Target, chain: list[Loop], src: Access) -> list:
    """The copy rule's schedule for a padded read (see the module's docstring)."""
    loops = [lp.var for lp in chain]
    ext = {lp.var: lp.extent for lp in chain}
    shape = k.buffers()[src.buf].shape
    by_var = {i.terms[0].var: (i, n) for i, n in zip(src.index, shape) if i.terms}
    bounds = {v: interior(by_var[v][0], by_var[v][1], ext[v]) if v in by_var else (0, ext[v]) for v in loops}
    prims: list = []
    boxes: list[tuple[list[str], dict[str, int]]] = []  # the fill boxes: loop names, extents
    names, now = {v: v for v in loops}, dict(ext)
    Y = k.outputs[0].name
    box_rule = _Boxes(target, 4 if k.buffers()[Y].dtype == "f32" else 2, set(k.buffers()), src, Y)
    last = loops[-1]
    inside = {v: hi - lo for v, (lo, hi) in bounds.items()}
    staged = all(lo < hi for lo, hi in bounds.values()) and inside[last] < ext[last] and \
        box_rule.staged_part(loops, {**inside, last: ext[last]}) is not None
    if all(lo < hi for lo, hi in bounds.values()):
        for v in loops[:-1] if staged else loops:
            lo, hi = bounds[v]
            for at, fill_first in ((lo, True), (hi - lo, False)):
                if not 0 < at < now[v]:
                    continue
                prims.append(_prim("cut", names[v], at, root=names[loops[0]]))
                a = {u: _tag(names[u], "a") for u in loops}
                b = {u: _tag(names[u], "b") for u in loops}
                box, rest = (a, b) if fill_first else (b, a)
                box_ext = {**now, v: at if fill_first else now[v] - at}
                boxes.append(([box[u] for u in loops], {box[u]: box_ext[u] for u in loops}))
                names, now = rest, {**now, v: now[v] - at if fill_first else at}
        copy_box: tuple[list[str], dict[str, int]] | None = ([names[u] for u in loops],
                                                             {names[u]: now[u] for u in loops})
    else:  # a read wholly outside X (a shift by more than the size): the result is all fill
        copy_box = None
        boxes.append((loops, dict(ext)))
    if copy_box is not None and staged:  # rows padded at both ends in SBUF: whole rows stored
        prims += box_rule.stage(*copy_box, bounds[last])
    else:
        prims.append(_prim("resolve_fill"))
        if copy_box is not None:
            prims += box_rule.schedule(*copy_box, fill=False)
    for box_loops, box_ext in boxes:
        prims += box_rule.schedule(box_loops, box_ext, fill=True)
    return prims


def _prim(primitive: str, /, *args, **kw):
    from tilec.compiler.rules import prim  # (rules imports this module)
    return prim(primitive, *args, **kw)


class _Boxes:
    """The DMAs of one box of a padded copy: a block of partitions each (the loop whose blocks keep the most DMA
    engines busy, then the fewest DMAs; blocks of up to pmax rows, a ragged last block cut off), the loops inside
    the partitions in one descriptor stream. An interior box moves X -> Y in HBM; a fill box stores a constant tile of
    at most FILL_TILE_BYTES per partition (loops that would make it larger are DMAs of their own)."""

    def __init__(self, target: Target, itemsize: int, taken: set[str], src: Access, out: str) -> None:
        self.target, self.itemsize, self.taken, self.src, self.out = target, itemsize, taken, src, out
        self.tiles: list[tuple[str, tuple[int, ...]]] = []

    def moved(self, free: list[tuple[str, int]], fill: bool
              ) -> tuple[list[tuple[str, int, int]], list[tuple[str, int]]]:
        """The free loops a fill tile cannot hold: (loop, iterations outside, inside), and the loops it keeps."""
        moved: list[tuple[str, int, int]] = []
        free = list(free)
        while fill and free and math.prod(n for _, n in free) * self.itemsize > FILL_TILE_BYTES:
            u, n = free[0]
            inner = math.prod(m for _, m in free[1:]) * self.itemsize
            if inner <= FILL_TILE_BYTES:
                part = best_divisor(n, max(1, FILL_TILE_BYTES // inner))
                moved.append((u, n // part, part))
                free[0] = (sub(u, "_i"), part)
            else:
                moved.append((u, n, 1))
                free.pop(0)
        return moved, free

    def staged_part(self, loops: list[str], ext: dict[str, int]) -> str | None:
        """The partition loop of a box staged in SBUF (`stage`), or None when it cannot be: a loop before the last
        whose blocks (of up to pmax rows, a ragged last one cut off) keep the most DMA engines busy, with a tile of
        at most STAGE_TILE_BYTES per partition."""
        pmax, per_engine = self.target.pmax, self.target.pmax // self.target.dma_engines
        best = None
        for pos, v in enumerate(loops[:-1]):
            if math.prod(ext[u] for u in loops[pos + 1:]) * self.itemsize > STAGE_TILE_BYTES:
                continue
            engines = min(self.target.dma_engines, -(-min(ext[v], pmax) // per_engine))
            key = (-engines, math.prod(ext[u] for u in loops[:pos]) * -(-ext[v] // pmax), pos)
            if best is None or key < best[0]:
                best = (key, v)
        return None if best is None else best[1]

    def stage(self, loops: list[str], ext: dict[str, int], inside: tuple[int, int]) -> list:
        """A box whose rows (its last loop) are padded at either end: per block of partitions, the result's rows
        are made in an SBUF tile (the read rows loaded into its middle, the ends set to the fill on VectorE) and
        stored whole: both DMAs move whole rows, where HBM -> HBM DMAs would write the padded ends as one short
        chunk per row. Blocks of pmax rows, and a ragged last block cut off when no divisor does as well."""
        part = self.staged_part(loops, ext)
        assert part is not None
        n, pmax = ext[part], self.target.pmax
        boxes = [(loops, ext, part)]
        cut = []
        if n // best_divisor(n, pmax) > -(-n // pmax):
            m = n // pmax * pmax
            cut = [_prim("cut", part, m, root=loops[0])]
            boxes = [([_tag(u, t) for u in loops], {_tag(u, t): (size if u == part else ext[u]) for u in loops},
                      _tag(part, t)) for t, size in (("a", m), ("b", n - m))]
        heads, tails = [], []
        for box_loops, box_ext, box_part in boxes:
            head, tail = self._staged(box_loops, box_ext, box_part, inside)
            heads += head
            tails += tail
        return cut + heads + [_prim("resolve_fill")] + tails

    def _staged(self, loops: list[str], ext: dict[str, int], part: str, inside: tuple[int, int]
                ) -> tuple[list, list]:
        """One staged box: (its splits and cuts, its staging and tensorize after resolve_fill)."""
        pos, last = loops.index(part), loops[-1]
        d = best_divisor(ext[part], self.target.pmax)
        prims = []
        p_in = part
        if d < ext[part] or pos == 0:  # the tile is staged at the block loop
            p_in, at = sub(part, "_p"), sub(part, "_o")
            prims.append(_prim("split", part, d, outer=at, inner=p_in,
                               note=f"for {part.split('@')[0]} (blocks of {d} partitions)"))
        else:
            at = loops[pos - 1]
        prims.append(_prim("partition", p_in))
        lo, hi = inside
        root, row, parts = p_in, last, []  # the row's boxes under the block: (partition loop, fill or read)
        for cut_at, fill_first in ((lo, True), (hi - lo, False)):
            n = ext[last] - lo if not fill_first else ext[last]
            if not 0 < cut_at < n:
                continue
            prims.append(_prim("cut", row, cut_at, root=root))
            box, rest = ("a", "b") if fill_first else ("b", "a")
            parts.append(_tag(root, box))
            root, row = _tag(root, rest), _tag(row, rest)
        parts.append(root)
        tile = unique(f"{self.out}_tile", self.taken)
        self.taken.add(tile)
        tail = [_prim("stage_out", self.out, at, name=tile)]
        for n, p in enumerate(parts):
            tail.append(_prim("tensorize", p) if p == root else _prim("tensorize", p, temps=f"{tile}_fill{n + 1}"))
        value = self.src.fill
        shown = "-inf" if value == -math.inf else "inf" if value == math.inf else f"{value:g}"
        return prims, tail + [_prim("block", at, f"{self.out} = {self.src.buf} with its rows padded ({shown}) in "
                                                 f"SBUF ({d} partitions), stored whole")]

    def schedule(self, loops: list[str], ext: dict[str, int], fill: bool) -> list:
        pmax = self.target.pmax
        best = None
        for pos, v in enumerate(loops):
            moved, _ = self.moved([(u, ext[u]) for u in loops[pos + 1:]], fill)
            dmas = math.prod(ext[u] for u in loops[:pos]) * -(-ext[v] // pmax) * math.prod(o for _, o, _ in moved)
            per_engine = pmax // self.target.dma_engines  # partitions each DMA engine serves
            engines = min(self.target.dma_engines, -(-min(ext[v], pmax) // per_engine))
            key = (-engines, dmas, pos)  # every DMA engine busy first, then the fewest DMAs
            if best is None or key < best[0]:
                best = (key, v)
        assert best is not None
        part = best[1]
        n = ext[part]
        d = best_divisor(n, pmax)
        if n // d > -(-n // pmax):  # no divisor makes the fewest blocks: full blocks, and the rest cut off
            m = n // pmax * pmax
            a = [_tag(u, "a") for u in loops]
            b = [_tag(u, "b") for u in loops]
            return [_prim("cut", part, m, root=loops[0])] + \
                self.place(a, {_tag(u, "a"): m if u == part else ext[u] for u in loops}, _tag(part, "a"), fill) + \
                self.place(b, {_tag(u, "b"): n - m if u == part else ext[u] for u in loops}, _tag(part, "b"), fill)
        return self.place(loops, ext, part, fill)

    def place(self, loops: list[str], ext: dict[str, int], part: str, fill: bool) -> list:
        pos = loops.index(part)
        d = best_divisor(ext[part], self.target.pmax)
        moved, free = self.moved([(u, ext[u]) for u in loops[pos + 1:]], fill)
        prims = []
        p_in, blocks = part, [part]
        if d < ext[part]:
            p_in = sub(part, "_p")
            blocks = [sub(part, "_o"), p_in]
            prims.append(_prim("split", part, d, outer=blocks[0], inner=p_in,
                               note=f"for {part.split('@')[0]} (blocks of {d} partitions)"))
        outside, split = [], set()
        for u, o, i in moved:
            if i > 1:
                prims.append(_prim("split", u, i, outer=sub(u, "_o"), inner=sub(u, "_i"),
                                   note=f"for {u.split('@')[0]} (parts of {i})"))
                outside.append(sub(u, "_o"))
                split.add(u)
            else:
                outside.append(u)
        order = loops[:pos] + blocks[:-1] + outside + [p_in] + [u for u, _ in free]
        now = [x for u in loops for x in (blocks if u == part else [sub(u, "_o"), sub(u, "_i")] if u in split
                                          else [u])]
        if order != now:
            prims.append(_prim("reorder", *order))
        prims.append(_prim("partition", p_in))
        X, Y = self.src.buf, self.out
        if not fill:
            return prims + [_prim("tensorize", p_in),
                            _prim("block", order[0], f"{Y} = copy of {X} (HBM -> HBM, {d} partitions)")]
        shape = (d, *(n for _, n in free))
        tile = next((t for t, s in self.tiles if len(s) == len(shape) and all(a >= b for a, b in zip(s, shape))),
                    None)
        if tile is None:
            tile = unique("fill", self.taken)
            self.taken.add(tile)
            self.tiles.append((tile, shape))
            prims += [_prim("fill_from", p_in, tile), _prim("tensorize", f"{tile}_p", temps=f"{tile}_zero")]
        else:
            prims.append(_prim("fill_from", p_in, tile))
        value = self.src.fill
        shown = "-inf" if value == -math.inf else "inf" if value == math.inf else f"{value:g}"
        return prims + [_prim("tensorize", p_in),
                        _prim("block", order[0], f"{Y} where {X} is padded: {shown} ({d} partitions)")]


# ---- whole rows on the partitions: (outer unit, row block) pairs (level B) -----------------------------------------

STEP_BYTES = 8192  # SBUF per partition one step of a row-block copy moves at most: several steps pipeline the loads,
# copies and stores of many units; few large stores suit batch 1, where the model orders stores whose HBM byte ranges
# interleave one DMA latency apart (tilec/perf/deps.py): 4 KiB steps made pad1 at batch 1 25.5 µs, 8 KiB 23.6 µs


STAGE_RUN_BYTES = 160  # a crop whose rows are shorter goes through SBUF (row_blocks), a longer one HBM -> HBM. On the
# model's DMA engines (tilec/perf/costs.py) an HBM -> HBM row of b bytes costs hypot(14 ns, b / 23 B/ns) (one
# descriptor per row) and staging moves each row twice at the byte rate, (b_in + b_out) / 23 B/ns (one run per
# partition): they cross near 160 B. The bf16 shift's 110-byte rows: 13.9 µs HBM -> HBM, the f32 one's 220 B: 15.8.


def short_rows(X, Y, Wy: int, cx: int) -> bool:
    """Whether a crop of the last dimension (rows of Wy of X's elements from column cx) moves rows shorter than
    STAGE_RUN_BYTES HBM -> HBM, so that loading X's rows whole and cutting them on chip is cheaper."""
    cropped = X.shape[-1] != Wy or cx != 0  # (a crop keeping less than half of X's rows loads them in pieces)
    return cropped and 2 * Wy >= X.shape[-1] and Wy * (4 if Y.dtype == "f32" else 2) < STAGE_RUN_BYTES


def row_blocks(k: Kernel, hbm: dict, fresh, target: Target) -> tuple[list, list] | None:
    """A padded copy whose rows are padded at either end (`P[n, c, y, x] = X[n, c, y - 1, x - 1] ?? 0`, a zero-filled
    shift), built on level B with every DMA moving long contiguous runs on every DMA engine:

        partitions   (outer unit, row block) pairs: the outer dimensions fused (n, c), and when they are fewer than
                     128, the rows inside X cut into blocks so that the pairs fill the partitions (a partition index
                     of two loops: one DMA per row block, each on its own partitions' engines)
        per step     X's rows loaded whole and contiguous into a load tile; the rows copied on chip into the
                     middle of a tile of whole result rows (VectorE and ScalarE share the rows); the ends of the
                     rows copied from a constant tile; the tile stored whole (one contiguous run per partition)
        fill rows    the result's rows wholly outside X stored from a constant tile

    None when the copy is not of that form (the outer dimensions shifted or cropped, rows not padded, a tile that
    does not fit): the box schedule (`padded_copy`) takes it."""
    from tilec.compiler import ir
    from tilec.compiler.build_util import a, hbm_view, loop, sl, term
    from tilec.compiler import permute_onchip
    from tilec.compiler.copy_strided import strided_rows  # a strided slice of the rows (core17)
    from tilec.compiler.rules import _one_copy  # (rules imports this module)
    found = _one_copy(k)
    if found is None:
        return None
    strided = strided_rows(found, hbm, fresh, target) or permute_onchip.build(found, hbm, fresh, target)
    if strided is not None:  # (a permute moving its last dimension: interleaved on chip, permute_onchip.py)
        return strided
    chain, stmt, src = found
    loops = [lp.var for lp in chain]
    r = len(loops)
    if r == 1 and src.fill is not None and len(src.index) == 1 and stmt.dst.index == (Aff((Term(loops[0]),)),) \
            and src.index[0].terms == (Term(loops[0]),):
        return flat_rows(hbm[src.buf], hbm[stmt.dst.buf], src.index[0].const, src.fill, stmt.line, fresh, target)
    if r < 2 or len(src.index) != r or len(stmt.dst.index) != r:
        return upsampled_rows(stmt, src, {lp.var: lp.extent for lp in chain}, hbm, fresh, target)
    if any(i.terms != (Term(v),) or i.const for i, v in zip(stmt.dst.index, loops)):
        return None
    if any(i.terms != (Term(v),) for i, v in zip(src.index, loops)):
        return None
    X, Y = hbm[src.buf], hbm[stmt.dst.buf]
    ext = [lp.extent for lp in chain]
    if tuple(ext) != Y.shape:
        return None
    if any(i.const or X.shape[d] != ext[d] for d, i in enumerate(src.index[:-2])):
        return None  # an outer dimension shifted or cropped
    (Hy, Wy), (Hx, Wx) = Y.shape[-2:], X.shape[-2:]
    cy, cx = src.index[-2].const, src.index[-1].const
    lo, hi = interior(src.index[-2], Hx, Hy)
    xlo, xhi = interior(src.index[-1], Wx, Wy)
    if lo >= hi or xlo >= xhi:
        return None  # all fill
    if xlo == 0 and xhi == Wy and (src.fill is not None or not short_rows(X, Y, Wy, cx)):
        return None  # rows not padded, and long enough for HBM -> HBM (the box schedule's, rules._hbm_copy)
    O = math.prod(ext[:-2])
    # with fewer units than one DMA engine's partitions, a row block's DMAs would leave engines idle: the box
    # schedule's blocks of rows (one unit, many rows per DMA) do better
    if O < target.pmax // target.dma_engines:
        return None
    Hi, w = hi - lo, xhi - xlo
    xb, yb_ = 4 if X.dtype == "f32" else 2, 4 if Y.dtype == "f32" else 2
    pmax = target.pmax
    # the load tile holds X's rows whole when the copy reads most of them (one contiguous run per partition)
    x0, wl = (0, Wx) if 2 * w >= Wx else (xlo + cx, w)
    if O >= pmax:
        ob = best_divisor(O, pmax)
        if O // ob > -(-O // pmax):
            ob = pmax  # full blocks and a ragged last one
        regions = [(lo, 1, Hi)]  # (first row, row blocks, rows per block)
    else:  # row blocks fill the partitions; the rows left over are blocks of one row
        ob = O
        nb = min(pmax // O, Hi)
        R = Hi // nb
        regions = [(lo, nb, R)] + ([(lo + nb * R, Hi - nb * R, 1)] if Hi - nb * R else [])
    per_row = max(Wy * yb_, wl * xb)

    def rows_per_step(R: int) -> int:
        return max([d for d in range(1, R + 1) if R % d == 0 and d * per_row <= STEP_BYTES] or [1])
    rt_max = max(rows_per_step(R) for _, _, R in regions)
    # one fill row at each end (a "same" pad) is stored by one DMA of row step Hy - 1: the model orders stores whose
    # HBM ranges interleave one DMA latency apart (tilec/perf/deps.py), so each store saved is a latency saved
    both_ends = lo == 1 and Hy - hi == 1
    fill_rows = 2 if both_ends else max(lo, Hy - hi)
    if fill_rows * Wy * yb_ > FILL_TILE_BYTES or rt_max * (Wy * yb_ + wl * xb) > STAGE_TILE_BYTES:
        return None
    value = float(round_to(X.dtype, np.asarray(src.fill or 0, np.float32)))
    line = stmt.line
    xv, s1 = hbm_view(X, (O, Hx, Wx), fresh(f"{X.name}_v"), line)
    yv, s2 = hbm_view(Y, (O, Hy, Wy), fresh(f"{Y.name}_v"), line)
    P = max(ob * nb for _, nb, _ in regions)  # partitions used
    shown = "-inf" if value == -math.inf else "inf" if value == math.inf else f"{value:g}"
    # constant tiles, set once: the row ends (per partition, rt rows of the widest end) and the fill rows
    ends = max(xlo, Wy - xhi)
    cols = ir.Buf(fresh(f"{Y.name}_ends"), "sbuf", Y.dtype, (P, rt_max, ends))
    prep: list = [ir.Alloc(cols, zero=True, line=line)] if ends else []
    if value != 0 and ends:
        prep.append(ir.Scalar(ir.whole(cols), ir.whole(cols), "add", value, line))
    rows_tile = None
    if fill_rows:
        rows_tile = ir.Buf(fresh(f"{Y.name}_fill"), "sbuf", Y.dtype, (ob, fill_rows, Wy))
        prep.append(ir.Alloc(rows_tile, zero=True, line=line))
        if value != 0:
            prep.append(ir.Scalar(ir.whole(rows_tile), ir.whole(rows_tile), "add", value, line))
    consts: list[tuple[str, int]] = []
    made: list[str] = []
    ov = fresh("o_t")
    vec = target.vector_ghz * (2 if xb == yb_ == 2 else 1)  # elements per ns of an on-chip copy
    act = target.scalar_ghz

    def step(o0: Aff, n_o: int, r_lo: int, nb: int, R: int) -> list:
        """Rows [r_lo, r_lo + nb * R) of the result, in nb blocks of R rows, for the outer units [o0, o0 + n_o):
        per step rows [t*rt, (t+1)*rt) of every block."""
        rt = rows_per_step(R)
        k = str(len(made) + 1) if made else ""  # each step's names apart (a fresh name is stable per base)
        made.append(k)
        rows_name = fresh(f"ROWS{k}").upper()
        if rt > 1 and rows_name not in dict(consts):
            consts.append((rows_name, rt))
        rows_name = rows_name if rt > 1 else ""
        bv, tv = fresh(f"rb{k}"), fresh(f"r_t{k}")
        split = round(rt * vec / (vec + act))
        p_n = n_o * nb
        load = ir.Buf(fresh(f"{X.name}_rows{k}"), "sbuf", X.dtype, (p_n, rt, wl))
        tile = ir.Buf(fresh(f"{Y.name}_tile{k}"), "sbuf", Y.dtype, (p_n, rt, Wy))
        row0 = a(term(tv, rt, rows_name))
        blk = term(bv, R)
        part = sl(a(term(bv, n_o)), n_o)
        body: list = [ir.Alloc(load, line=line), ir.Alloc(tile, line=line)]
        body += loop(bv, nb, [ir.Dma(ir.View(load, (part, ir.full(rt), ir.full(wl))),
                                     ir.View(xv, (sl(o0, n_o), sl(row0.plus(a(blk, r_lo + cy)), rt, name=rows_name),
                                                  sl(x0, wl))), line)], note=f"blocks of {R} rows")
        every = ir.full(p_n)
        if xlo:
            body.append(ir.Copy(ir.View(tile, (every, ir.full(rt), sl(0, xlo))),
                                ir.View(cols, (sl(0, p_n), sl(0, rt), sl(0, xlo))), line))
        if xhi < Wy:
            body.append(ir.Copy(ir.View(tile, (every, ir.full(rt), sl(xhi, Wy - xhi))),
                                ir.View(cols, (sl(0, p_n), sl(0, rt), sl(0, Wy - xhi))), line))
        for r0, n, eng in ((0, split, "vector"), (split, rt - split, "scalar")):
            if n <= 0:
                continue
            dst = ir.View(tile, (every, sl(r0, n), sl(xlo, w)))
            srcv = ir.View(load, (every, sl(r0, n), sl(xlo + cx - x0, w)))
            body.append(ir.Copy(dst, srcv, line) if eng == "vector" else ir.Act(dst, srcv, "copy", line=line))
        body += loop(bv, nb, [ir.Dma(ir.View(yv, (sl(o0, n_o), sl(row0.plus(a(blk, r_lo)), rt, name=rows_name),
                                                  ir.full(Wy))),
                                     ir.View(tile, (part, ir.full(rt), ir.full(Wy))), line)],
                     note=f"blocks of {R} rows")
        return loop(tv, R // rt, body, note=f"rows in steps of {rows_name or rt}")

    def fills(o0: Aff, n_o: int) -> list:
        out: list = []
        if rows_tile is None:
            return out
        if both_ends:
            return [ir.Dma(ir.View(yv, (sl(o0, n_o), sl(0, 2, Hy - 1), ir.full(Wy))),
                           ir.View(rows_tile, (sl(0, n_o), ir.full(2), ir.full(Wy))), line)]
        for r0, n in ((0, lo), (hi, Hy - hi)):
            if n:
                out.append(ir.Dma(ir.View(yv, (sl(o0, n_o), sl(r0, n), ir.full(Wy))),
                                  ir.View(rows_tile, (sl(0, n_o), sl(0, n), ir.full(Wy))), line))
        return out

    def units(o0: Aff, n_o: int) -> list:
        return fills(o0, n_o) + [s for r_lo, nb, R in regions for s in step(o0, n_o, r_lo, nb, R)]

    full_blocks, rest = divmod(O, ob)
    main = loop(ov, full_blocks, units(a(term(ov, ob)), ob), note=f"outer units in blocks of {ob}")
    if rest:
        main += units(a(full_blocks * ob), rest)
    nb, R = regions[0][1:]
    units_of = "(" + ", ".join(v.split("@")[0] for v in loops[:-2]) + ")"
    how = (f"(unit, block of {R} row{'s' if R > 1 else ''}) pairs on {P} partitions" if nb > 1 else
           f"one unit of {units_of} per partition, blocks of {ob}")
    if src.fill is None:  # a crop of short rows: no fill, X's rows loaded whole and cut on chip
        label = f"{Y.name} = {X.name} cropped in SBUF (rows of {w} of {Wx}): {how}"
    else:
        label = f"{Y.name} = {X.name} with its rows padded ({shown}) in SBUF: {how}, stored whole"
    fill_block = [ir.Block(f"{Y.name}: the fill value {shown} on chip, set once", tuple(prep), line)] if prep else []
    return consts, s1 + s2 + fill_block + [ir.Block(label, tuple(main), line)]


UPSAMPLE_STEP_BYTES = 32 * 1024  # SBUF per partition of one step's result rows in an upsampled copy (upsampled_rows)


def upsampled_rows(stmt: Assign, src: Access, ext: dict[str, int], hbm: dict, fresh, target: Target
                   ) -> tuple[list, list] | None:
    """Nearest upsampling of the last two dimensions (`Y[n, c, i, j] = X[n, c, i / 2, j / 2]`, each divided loop
    arriving split: i = 2*i_q + i_r) built on level B, every DMA moving one contiguous run per partition:

        partitions   the outer dimensions fused into units (n, c), in blocks of 128 (a ragged last block)
        per step     X's rows loaded whole into a load tile; ki x kj on-chip copies write them to the strided
                     positions of a tile of whole result rows (`tile[:, i_r::ki, j_r::kj]`), VectorE taking the
                     first rows and ScalarE the others (disjoint row ranges: the engines never wait on each other);
                     the tile stored whole

    None when the copy is not of that form (an outer dimension divided or shifted, a read of a shifted index, fewer
    units than partitions): the copy rule's replication (rules.copy) takes it."""
    from tilec.compiler import ir
    from tilec.compiler.build_util import a, hbm_view, loop, sl, term
    X, Y = hbm[src.buf], hbm[stmt.dst.buf]
    D = len(Y.shape)
    if src.fill is not None or D < 3 or len(X.shape) != D or len(src.index) != D or len(stmt.dst.index) != D:
        return None
    if any(i.const for i in (*src.index, *stmt.dst.index)):
        return None
    ks = []
    for d, (di, si) in enumerate(zip(stmt.dst.index, src.index)):
        if len(si.terms) != 1 or si.terms[0].coef != 1:
            return None
        q = si.terms[0].var
        if di.terms == (Term(q),):
            k = 1
        elif len(di.terms) == 2 and di.terms[0].var == q and di.terms[1].coef == 1 \
                and di.terms[0].coef == ext.get(di.terms[1].var):
            k = di.terms[0].coef
        else:
            return None
        if ext.get(q) != X.shape[d] or Y.shape[d] != k * X.shape[d] or (k > 1 and d < D - 2):
            return None
        ks.append(k)
    ki, kj = ks[-2:]
    if ki * kj == 1:
        return None
    O = math.prod(X.shape[:-2])
    pmax = target.pmax
    if O < pmax:
        return None
    (Hx, Wx), Wy = X.shape[-2:], Y.shape[-1]
    xb, yb_ = 4 if X.dtype == "f32" else 2, 4 if Y.dtype == "f32" else 2
    per_row = ki * Wy * yb_  # result bytes per row of X
    rt = max([d for d in range(1, Hx + 1) if Hx % d == 0 and d * per_row <= UPSAMPLE_STEP_BYTES] or [1])
    if rt * (per_row + Wx * xb) > STAGE_TILE_BYTES:
        return None
    line = stmt.line
    xv, s1 = hbm_view(X, (O, Hx, Wx), fresh(f"{X.name}_v"), line)
    yv, s2 = hbm_view(Y, (O, ki * Hx, Wy), fresh(f"{Y.name}_v"), line)
    ob = best_divisor(O, pmax)
    if O // ob > -(-O // pmax):
        ob = pmax  # full blocks and a ragged last one
    consts: list[tuple[str, int]] = []
    rows_name = ""
    if rt > 1 and rt < Hx:
        rows_name = fresh("ROWS").upper()
        consts.append((rows_name, rt))
    # VectorE's share of the rows in proportion to the clocks, its 16-bit copies counted at 2x (strided). Measured
    # (bf16 upsample2x, VectorE rows of 28 at batch 1 / 8): 14: 8.28 / 47.07 µs, 16: 8.10 / 50.56, 18: 7.91 / 55.57
    # (the balance of the copies alone): at batch 8 the DMA queues decide (a block's load waits behind stores)
    vec = target.vector_ghz * (2 if xb == yb_ == 2 else 1)
    split = round(rt * vec / (vec + target.scalar_ghz))
    ov, tv = fresh("o_t"), fresh("r_t")

    made: list[str] = []

    def units(o0, n_o: int) -> list:
        k = str(len(made) + 1) if made else ""  # the ragged block's tiles named apart (a fresh name is stable per base)
        made.append(k)
        load = ir.Buf(fresh(f"{X.name}_rows{k}"), "sbuf", X.dtype, (n_o, rt, Wx))
        tile = ir.Buf(fresh(f"{Y.name}_tile{k}"), "sbuf", Y.dtype, (n_o, ki * rt, Wy))
        row0 = a(term(tv, rt, rows_name))
        body: list = [ir.Alloc(load, line=line), ir.Alloc(tile, line=line),
                      ir.Dma(ir.whole(load), ir.View(xv, (sl(o0, n_o), sl(row0, rt, name=rows_name), ir.full(Wx))),
                             line)]
        every = ir.full(n_o)
        for r0, n, eng in ((0, split, "vector"), (split, rt - split, "scalar")):
            copies = [(ir.View(tile, (every, sl(r0 * ki, n, ki), sl(j_r, Wx, kj))),
                       ir.View(load, (every, sl(r0, n), ir.full(Wx)))) for j_r in range(kj)]
            # the other rows of each group of ki: copies of the first one's whole (contiguous) rows
            copies += [(ir.View(tile, (every, sl(r0 * ki + i_r, n, ki), ir.full(Wy))),
                        ir.View(tile, (every, sl(r0 * ki, n, ki), ir.full(Wy)))) for i_r in range(1, ki)]
            for dst, srcv in copies if n > 0 else []:
                body.append(ir.Copy(dst, srcv, line) if eng == "vector" else ir.Act(dst, srcv, "copy", line=line))
        rows_out = sl(a(term(tv, ki * rt)), ki * rt)
        body.append(ir.Dma(ir.View(yv, (sl(o0, n_o), rows_out, ir.full(Wy))), ir.whole(tile), line))
        return loop(tv, Hx // rt, body, note=f"rows of {X.name} in steps of {rows_name or rt}")

    full_blocks, rest = divmod(O, ob)
    main = loop(ov, full_blocks, units(a(term(ov, ob)), ob), note=f"outer units in blocks of {ob}")
    if rest:
        main += units(a(full_blocks * ob), rest)
    label = (f"{Y.name} = {X.name} upsampled {ki}x{kj} in SBUF: one unit per partition, blocks of {ob}, rows "
             "loaded and stored whole")
    return consts, s1 + s2 + [ir.Block(label, tuple(main), line)]


def row_blocks_note(k: Kernel, target: Target) -> str | None:
    """What `row_blocks` builds for the copy nest k (the label of its main block, for `explain`), or None when the
    box schedule takes it."""
    from tilec.compiler import ir
    hbm = {b.name: ir.Buf(b.name, "hbm", b.dtype, b.shape) for b in (*k.params, *k.outputs)}
    built = row_blocks(k, hbm, lambda base: base, target)
    if built is None:
        return None
    label = built[1][-1].label
    steps = ", ".join(f"{n} = {v}" for n, v in built[0])
    return label + (f" (steps of {steps} rows)" if steps else "")


def flat_rows(X, Y, c: int, fill: float, line: int, fresh, target: Target) -> tuple[list, list] | None:
    """A 1-D padded copy `Y[i] = X[i + c] ?? fill` as rows: X and Y seen as [rows, B] (B a divisor of both sizes,
    Y's rows at most pmax and at least one DMA engine's partitions). With c = q*B + s (0 <= s < B), Y_v[r, f] reads
    X_v[r + q, f + s] for f < B - s and X_v[r + q + 1, f + s - B] for the others: two column ranges, each copied
    HBM -> HBM in one DMA for the rows whose source row is inside X (a contiguous run per row, every DMA engine),
    the other rows of the range stored from a constant tile. (The box schedule moves such a copy as one DMA of 128
    elements per block: 8,191 DMAs for a million elements.) None when no such B exists."""
    from tilec.compiler import ir
    from tilec.compiler.build_util import hbm_view, sl
    n, m, pmax = X.shape[0], Y.shape[0], target.pmax
    g = math.gcd(n, m)
    widths = [b for b in range(1, g + 1) if g % b == 0 and m // b <= pmax]
    if not widths or m // widths[0] < pmax // target.dma_engines:
        return None
    B = widths[0]
    A, Ax = m // B, n // B
    xv, s1 = hbm_view(X, (Ax, B), fresh(f"{X.name}_v"), line)
    yv, s2 = hbm_view(Y, (A, B), fresh(f"{Y.name}_v"), line)
    q, s = divmod(c, B)
    value = float(round_to(X.dtype, np.asarray(fill, np.float32)))
    itemsize = 4 if Y.dtype == "f32" else 2
    copies: list = []
    fills: list[tuple[int, int, int, int]] = []  # rows [r0, r1) x columns [f0, f1) of fill
    for f0, f1, shift in ((0, B - s, q), (B - s, B, q + 1)):
        if f0 >= f1:
            continue
        r0, r1 = max(0, -shift), min(A, Ax - shift)  # rows whose source row r + shift is inside X
        if r0 < r1:
            copies.append(ir.Dma(ir.View(yv, (sl(r0, r1 - r0), sl(f0, f1 - f0))),
                                 ir.View(xv, (sl(r0 + shift, r1 - r0), sl(f0 + s - (B if shift > q else 0),
                                                                         f1 - f0))), line))
        else:
            r0 = r1 = A if shift >= 0 else 0
        fills += [(a, b, f0, f1) for a, b in ((0, min(r0, A)), (max(r1, 0), A)) if a < b]
    body: list = list(s1 + s2)
    shown = "-inf" if value == -math.inf else "inf" if value == math.inf else f"{value:g}"
    if fills:
        cols = min(max(f1 - f0 for _, _, f0, f1 in fills), max(1, FILL_TILE_BYTES // itemsize))
        rows = max(b - a for a, b, _, _ in fills)
        tile = ir.Buf(fresh(f"{Y.name}_fill"), "sbuf", Y.dtype, (rows, cols))
        prep: list = [ir.Alloc(tile, zero=True, line=line)]
        if value != 0:
            prep.append(ir.Scalar(ir.whole(tile), ir.whole(tile), "add", value, line))
        for a, b, f0, f1 in fills:
            for c0 in range(f0, f1, cols):
                w = min(cols, f1 - c0)
                prep.append(ir.Dma(ir.View(yv, (sl(a, b - a), sl(c0, w))), ir.View(tile, (sl(0, b - a), sl(0, w))),
                                   line))
        body.append(ir.Block(f"{Y.name} where {X.name} is padded: {shown}, from a constant tile", tuple(prep), line))
    if copies:
        body.append(ir.Block(f"{Y.name} = {X.name} shifted by {c}: both seen as rows of {B}, HBM -> HBM "
                             f"({len(copies)} DMA{'s' if len(copies) > 1 else ''} of up to {A} rows)",
                             tuple(copies), line))
    return [], body
