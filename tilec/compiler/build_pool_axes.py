"""Pools whose window axes have dimensions after them (pool_axes.py), NHWC first:

    Y[n, y, x, c] max= X[n, 2*y + r - 1, 2*x + q - 1, c] ?? -inf
    partitions   groups of k output rows (n, y) of a block of Wb output columns: partition (block, n, row group)
    free         each group's input rows, (Wb - 1) * sx + wx columns of K contiguous elements each: one DMA per input
                 row slot moves every group's row (runs of columns * K elements, strided by k * sy rows in X)
    passes       along y (wy - 1 tensor_tensor over the slots), then along x (wx - 1 over strided column views),
                 each split by columns between VectorE and GpSimdE; an average's factor on ScalarE into Y's dtype
    store        one DMA per column block: Y's rows are the partitions in order (k rows each)

Padding is the reduction's identity: a tile's slots and columns that some partition reads outside X are first set
to it on every partition (copies from a constant tile made once), then the loads overwrite what is inside X. An
average excluding the padding (count_include_pad=False) multiplies by a tile of scale / count, made once per tile
structure by pooling a tile of ones loaded where X is (`counts`).
"""
from __future__ import annotations

from dataclasses import dataclass

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh
from tilec.compiler.build_util import a, hbm_view, loop, sl, term
from tilec.compiler.ir import DTYPE_BYTES, Act, Aff, Alloc, Binary, Buf, Copy, Dma, Scalar, Sl, Stmt, View, full
from tilec.compiler.ops import PoolOp
from tilec.compiler.rules import Prim, prim
from tilec.compiler.pool_axes_plan import AxesPlan, axes_plan
from tilec.errors import TilecError

Built = tuple[list[tuple[str, int]], list[Stmt]]
IDENTITY = {"maximum": float("-inf"), "minimum": float("inf"), "add": 0.0}


@dataclass
class _Geometry:
    op: PoolOp
    plan: AxesPlan

    def __post_init__(self) -> None:
        op, w = self.op, self.op.window
        assert w is not None
        self.O, self.H, self.W, self.K = op.dim("B"), op.dim("H"), op.dim("W"), op.dim("K")
        (self.sy, self.sx), (self.oy, self.ox) = w.stride, w.offset
        self.Ho, self.Wo = w.out
        self.wy, self.wx = op.pool.wy, op.pool.wx
        k, Wb = self.plan.k, self.plan.wb
        self.Ri, self.Ci = (k - 1) * self.sy + self.wy, (Wb - 1) * self.sx + self.wx
        self.G = self.Ho // k  # row groups per image

    def slot_groups(self, r: int) -> tuple[int, int]:
        """The row groups [g_lo, g_hi) of an image whose input row in slot r lies inside X."""
        step, first = self.plan.k * self.sy, self.oy + r
        lo = max(0, -(-(-first) // step)) if first < 0 else 0
        hi = min(self.G, (self.H - 1 - first) // step + 1) if self.H - 1 - first >= 0 else 0
        return lo, max(lo, hi)

    def block_cols(self, xb: int) -> tuple[int, int, int]:
        """(first input column of block xb, its columns [c_lo, c_hi) inside X)."""
        start = xb * self.plan.wb * self.sx + self.ox
        return start, max(0, -start), min(self.Ci, self.W - start)


def build_pool_axes(op: PoolOp, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    x, y = hbm[op.src], hbm[op.out]
    refuse(op)
    plan = axes_plan(op, x.dtype, y.dtype)
    g = _Geometry(op, plan)
    line = op.line
    xv, body = hbm_view(x, (g.O * g.H, g.W, g.K), fresh(f"{op.src}_v"), line)
    yv, more = hbm_view(y, (g.O * g.G, plan.k, g.Wo, g.K), fresh(f"{op.out}_v"), line)
    body += more
    b = _Body(g, x, y, xv, yv, fresh)
    once = b.fills()
    nest: list[Stmt] = []
    imgs, xs = plan.images, plan.xs
    XB = g.Wo // plan.wb
    inside = op.window is not None and op.window.count == "inside"

    def factor(imgs: int, g0: int, g1: int, xbs: range, key: str) -> Buf | None:
        if not inside:
            return None
        made, buf = b.counts(imgs, g0, g1, *b.order(xbs), key)
        nest.extend(made)
        return buf

    for j in range(-(-XB // xs)):  # column-block groups (static: the edge blocks' columns differ)
        xbs = range(j * xs, min(XB, (j + 1) * xs))
        if g.G <= plan.rows:  # whole images per tile: a loop over chunks of `imgs` images, then the rest
            full_chunks, rest = divmod(g.O, imgs)
            f = factor(imgs, 0, g.G, xbs, f"{j}") if full_chunks else None
            nest += loop("t", full_chunks, b.tile(a(term("t", imgs)), imgs, 0, g.G, xbs, f),
                         note=f"for {dict(op.vars).get('b', 'n')} (chunks of {imgs} images)", line=line)
            if rest:
                nest += b.tile(a(full_chunks * imgs), rest, 0, g.G, xbs, factor(rest, 0, g.G, xbs, f"{j}r"))
        else:  # an image's row groups over several tiles
            chunks = -(-g.G // plan.rows)
            size = -(-g.G // chunks)
            tiles = [t for c in range(chunks) for t in b.tile(
                a("t"), 1, c * size, min(g.G, (c + 1) * size), xbs,
                factor(1, c * size, min(g.G, (c + 1) * size), xbs, f"{j}c{c}"))]
            nest += loop("t", g.O, tiles, note=f"for {dict(op.vars).get('b', 'n')} (images)", line=line)
    label = f"{op.out} = {op.pool.op} pool {g.wy}x{g.wx} of {op.src} over axes with {g.K} elements after them, " \
            f"stride {g.sy}x{g.sx}, offset {g.oy},{g.ox}; partitions: {plan.xs} column blocks of {plan.wb} x " \
            f"groups of {plan.k} output rows"
    return [], body + [ir.Block(label, tuple(once + b.once + nest), line)]


def axes_prims(op: PoolOp, dtypes: tuple[str, str]) -> list[Prim]:
    """The layout as primitives (`tilec explain`)."""
    w = op.window
    assert w is not None
    plan = axes_plan(op, *dtypes)
    g = _Geometry(op, plan)
    return [prim("partition", "b", plan.parts, layout=f"{plan.xs} column blocks x {plan.images} images x row groups"),
            prim("split", "i", plan.k, name="rows per partition"), prim("split", "j", plan.wb, name="block columns"),
            prim("stage", op.src, rows=g.Ri, columns=g.Ci, elements=g.K),
            prim("window", "i", taps=g.wy, stride=g.sy, offset=g.oy, op=op.pool.op),
            prim("window", "j", taps=g.wx, stride=g.sx, offset=g.ox, op=op.pool.op),
            *([prim("scale", float(f"{op.pool.scale:.6g}"))] if op.pool.scale != 1.0 else []),
            prim("stage_out", op.out)]


def refuse(op: PoolOp) -> None:
    """What this builder does not take, as the user's error at the pool's statement."""
    assert op.window is not None
    if op.pool.op != "add" and op.pool.scale < 0:
        raise TilecError(f"a {op.pool.op[:3]} pool of values scaled by a negative factor over axes with dimensions "
                         "after them is not supported", op.span, "scale the pooled result instead")


class _Body:
    def __init__(self, g: _Geometry, x: Buf, y: Buf, xv: Buf, yv: Buf, fresh: Fresh) -> None:
        self.g, self.x, self.y, self.xv, self.yv, self.fresh = g, x, y, xv, yv, fresh
        self.line = g.op.line
        self.ident = IDENTITY[g.op.pool.op]
        self.fill: dict[str, Buf] = {}
        self.ones: Buf | None = None  # (an average excluding the padding: its counts' source)
        self.once: list[Stmt] = []
        self.sum = g.op.pool.op == "add"

    def fills(self) -> list[Stmt]:
        """The constant tiles padding is copied from (made once): the identity on every partition, one tile the
        size of the row strips and one of the column strips (a tile the size of the input's took a 5.5 us memset
        and as long an add of -inf before the first load, model, 3x3 s2 NHWC in groups of 4 rows)."""
        g = self.g
        top, bottom, left, right = self.pads()
        out: list[Stmt] = []
        for rows, cols, key in ((max(top, bottom), g.Ci, "rows"), (g.Ri, max(left, right), "cols")):
            if not rows or not cols:
                continue
            buf = Buf(self.fresh(f"{g.op.src}_pad_{key}"), "sbuf", self.x.dtype, (g.plan.parts, rows, cols, g.K))
            self.fill[key] = buf
            out.append(Alloc(buf, zero=True, line=self.line))
            if self.ident:
                out.append(Scalar(ir.whole(buf), ir.whole(buf), "add", self.ident, self.line))
        return out

    def pads(self) -> tuple[int, int, int, int]:
        """Slots at the top and bottom, columns at the left and right that some partition reads outside X."""
        g = self.g
        top = sum(1 for r in range(g.Ri) if g.slot_groups(r)[0] > 0)
        bottom = sum(1 for r in range(g.Ri) if g.slot_groups(r)[1] < g.G) if top < g.Ri else 0
        blocks = g.Wo // g.plan.wb
        left = g.block_cols(0)[1]
        right = g.Ci - g.block_cols(blocks - 1)[2]
        return top, bottom, left, right

    def pass_dtype(self, factor: Buf | None) -> str:
        """The pooled tile's dtype: fp32 when a factor or relu follows, else Y's (the last pass writes it)."""
        g = self.g
        return "f32" if factor is not None or g.op.pool.scale != 1.0 or g.op.relu else self.y.dtype

    def tile(self, o: Aff, imgs: int, g0: int, g1: int, xbs: range, factor: Buf | None = None) -> list[Stmt]:
        g, ln = self.g, self.line
        n = g1 - g0
        P = len(xbs) * imgs * n
        # (every tile's buffers have the largest tile's partitions: a ragged last tile uses the first P)
        xt = Buf(self.fresh(f"{g.op.src}_rows"), "sbuf", self.x.dtype, (g.plan.parts, g.Ri, g.Ci, g.K))
        out: list[Stmt] = [Alloc(xt, line=ln)]
        out += self.pad_copies(xt, P)
        # the blocks whose columns lie inside X first (from partition 0, where a DMA over more than 64 partitions
        # may start: dma_merge makes each of their loops one DMA), the edge blocks after them
        order, inner = self.order(xbs)
        out += self.loads(xt, o, imgs, g0, g1, order, inner)
        passes, ot = self.passes(xt, P, dtype=self.pass_dtype(factor))
        done, self.result = self.finish(ot, P, factor)
        out += passes + done
        # a store per block, the inner ones in a loop (one DMA: the blocks' columns of Y interleave in HBM, so
        # separate stores would be ordered one after another)
        return out + self.stores(o, imgs, g0, g1, order, inner)

    def order(self, xbs: range) -> tuple[list[int], int]:
        """The tile's blocks in partition order, and how many of them come first with their columns inside X."""
        inner = [xb for xb in xbs if self.g.block_cols(xb)[1:] == (0, self.g.Ci)]
        return inner + [xb for xb in xbs if xb not in inner], len(inner)

    def stores(self, o: Aff, imgs: int, g0: int, g1: int, order: list[int], looped: int) -> list[Stmt]:
        g, n = self.g, g1 - g0
        rows = Sl(_scaled(o, g.G).plus(g0), imgs * n)
        looped = looped if looped > 1 else 0
        out: list[Stmt] = []
        for bi, xb in enumerate(order):
            if bi and bi < looped:
                continue
            var = [term("xb", g.plan.wb)] if bi < looped else []
            cols = Sl(a(*var, xb * g.plan.wb), g.plan.wb)
            dst = View(self.yv, (rows, full(g.plan.k), cols, full(g.K)))
            part = Sl(a(*([term("xb", imgs * n)] if var else []), bi * imgs * n), imgs * n)
            src = View(self.result, (part, full(g.plan.k), full(g.plan.wb), full(g.K)))
            out += loop("xb", looped, [Dma(dst, src, self.line)], kind="static") if var else \
                [Dma(dst, src, self.line)]
        return out

    def pad_copies(self, xt: Buf, P: int) -> list[Stmt]:
        """The tile's slots and columns some partition reads outside X set to the identity (ScalarE copies),
        before the loads overwrite what lies inside X."""
        g, ln = self.g, self.line
        top, bottom, left, right = self.pads()
        out: list[Stmt] = []
        for r0, nr in ((0, top), (g.Ri - bottom, bottom)):
            if nr:
                fill = self.fill["rows"]
                out.append(Act(View(xt, (full(P), sl(r0, nr), full(g.Ci), full(g.K))),
                               View(fill, (full(P), sl(0, nr), full(g.Ci), full(g.K))), line=ln))
        for c0, nc in ((0, left), (g.Ci - right, right)):
            if nc:
                fill = self.fill["cols"]
                out.append(Act(View(xt, (full(P), full(g.Ri), sl(c0, nc), full(g.K))),
                               View(fill, (full(P), full(g.Ri), sl(0, nc), full(g.K))), line=ln))
        return out

    def loads(self, xt: Buf, o: Aff, imgs: int, g0: int, g1: int, order: list[int], inner: int,
              ones: Buf | None = None) -> list[Stmt]:
        """One DMA per input row slot and column block (per image where the slot's rows leave X in some group):
        partition (block, image i, group g) reads row (o + i) * H + g * k * sy + oy + r. The first `inner` blocks
        of `order` (consecutive, their columns inside X) are a loop of one DMA where every group's row is in X."""
        g = self.g
        n, step = g1 - g0, g.plan.k * g.sy
        uniform = g.H == g.G * step  # images follow each other at the row groups' stride
        out: list[Stmt] = []
        for r in range(g.Ri):
            lo, hi = g.slot_groups(r)
            lo, hi = max(lo, g0), min(hi, g1)
            if hi <= lo:
                continue
            whole = (lo, hi) == (g0, g1) and uniform
            for bi, xb in enumerate(order):
                if whole and inner > 1 and bi < inner:
                    if bi == 0:
                        out += loop("xb", inner, [self.load(xt, o, imgs, n, (lo, hi, g0), r, None, (xb, 0), True,
                                                            ones)], kind="static")
                    continue
                for i in ([None] if whole else range(imgs)):
                    out.append(self.load(xt, o, imgs, n, (lo, hi, g0), r, i, (xb, bi), False, ones))
        return out

    def load(self, xt: Buf, o: Aff, imgs: int, n: int, groups: tuple[int, int, int], r: int, i: int | None,
             block: tuple[int, int], looped: bool = False, ones: Buf | None = None) -> Dma:
        """Slot r of groups [lo, hi) of image i (None: every image) of block xb (at position bi in the tile), or of
        block xb + loop variable `xb` (bi likewise) when inside a loop over blocks."""
        g = self.g
        lo, hi, g0 = groups
        xb, bi = block
        step = g.plan.k * g.sy
        start, c_lo, c_hi = g.block_cols(xb)
        count = imgs * n if i is None else hi - lo
        part = a(bi * imgs * n + (i or 0) * n + lo - g0)
        col = a(start + c_lo)
        if looped:  # (in a loop over blocks: the variable steps both)
            part = part.plus(a(term("xb", imgs * n)))
            col = col.plus(a(term("xb", g.plan.wb * g.sx)))
        row = _scaled(o, g.H).plus((i or 0) * g.H + lo * step + g.oy + r)
        dst = View(xt, (Sl(part, count), sl(r, 1), sl(c_lo, c_hi - c_lo), full(g.K)))
        src = View(self.xv, (Sl(row, count, step), Sl(col, c_hi - c_lo), full(g.K)))
        return Dma(dst, View(ones, dst.idx) if ones is not None else src, self.line)

    def passes(self, xt: Buf, P: int, tag: str = "", dtype: str = "") -> tuple[list[Stmt], Buf]:
        """Along y into an fp32 (a sum) or X-typed tile, then along x into a tile of `dtype` (Y's unless given);
        each pass split between VectorE and GpSimdE. `tag` names a second use's buffers (the counts)."""
        g, ln, k, Wb = self.g, self.line, self.g.plan.k, self.g.plan.wb
        op = "add" if tag else g.op.pool.op
        out: list[Stmt] = []
        src = xt
        if g.wy > 1 or g.sy > 1 or g.Ri != k:
            yt = Buf(self.fresh(f"{g.op.src}_ypass{tag}"), "sbuf", "f32" if op == "add" else self.x.dtype,
                     (g.plan.parts, k, g.Ci, g.K))
            out.append(Alloc(yt, line=ln))
            for (j0, nj), (c0, nc), eng in self.split(g.Ci):
                def slot(r: int) -> View:
                    return View(xt, (full(P), Sl(a(r + j0 * g.sy), nj, g.sy), sl(c0, nc), full(g.K)))
                dst = View(yt, (full(P), sl(j0, nj), sl(c0, nc), full(g.K)))
                if g.wy == 1:
                    out.append(Copy(dst, slot(0), ln, eng))
                for r in range(1, g.wy):
                    out.append(Binary(dst, slot(0) if r == 1 else dst, slot(r), op, ln, eng))
            src = yt
        ot = Buf(self.fresh(f"{g.op.out}_tile{tag}"), "sbuf", dtype or self.y.dtype, (g.plan.parts, k, Wb, g.K))
        out.append(Alloc(ot, line=ln))
        for (j0, nj), (c0, nc), eng in self.split(Wb):
            def col(q: int) -> View:
                return View(src, (full(P), sl(j0, nj), Sl(a(c0 * g.sx + q), nc, g.sx), full(g.K)))
            dst = View(ot, (full(P), sl(j0, nj), sl(c0, nc), full(g.K)))
            if g.wx == 1:
                out.append(Copy(dst, col(0), ln, eng))
            for q in range(1, g.wx):
                out.append(Binary(dst, col(0) if q == 1 else dst, col(q), op, ln, eng))
        return out, ot

    def finish(self, ot: Buf, P: int, factor: Buf | None) -> tuple[list[Stmt], Buf]:
        """The pooled tile as Y's values: times the average's factor (a constant on ScalarE while it casts, or the
        tile of each window's scale / count), relu'd if asked."""
        g, ln, k, Wb = self.g, self.line, self.g.plan.k, self.g.plan.wb
        scale = g.op.pool.scale
        if ot.dtype == self.y.dtype and scale == 1.0 and not g.op.relu and factor is None:
            return [], ot
        res = Buf(self.fresh(f"{g.op.out}_out"), "sbuf", self.y.dtype, (g.plan.parts, k, Wb, g.K))
        every = (full(P), full(k), full(Wb), full(g.K))
        out: list[Stmt] = [Alloc(res, line=ln)]
        if factor is not None:
            out.append(Binary(View(res, every), View(ot, every), View(factor, every), "multiply", ln))
        else:
            out.append(Act(View(res, every), View(ot, every), "relu" if g.op.relu else "copy", scale=scale, line=ln))
        return out, res

    def counts(self, imgs: int, g0: int, g1: int, order: list[int], inner: int, key: str) -> tuple[list[Stmt], Buf]:
        """An average excluding the padding: scale / (each window's taps inside X) for a tile of this structure,
        made once before the tiles: a tile of ones loaded (SBUF -> SBUF DMAs) where the tile's loads put X, the
        padding 0, summed by the same passes. (Every partition of every element of K: the passes need equal
        shapes; twice the passes' work, once per tile structure.)"""
        g, ln = self.g, self.line
        P = len(order) * imgs * (g1 - g0)
        if self.ones is None:
            self.ones = Buf(self.fresh(f"{g.op.src}_ones"), "sbuf", "f32", (g.plan.parts, g.Ri, g.Ci, g.K))
            self.once += [Alloc(self.ones, zero=True, line=ln),
                          Scalar(ir.whole(self.ones), ir.whole(self.ones), "add", 1.0, ln)]
        ct = Buf(self.fresh(f"{g.op.src}_inside{key}"), "sbuf", "f32", (g.plan.parts, g.Ri, g.Ci, g.K))
        out: list[Stmt] = [Alloc(ct, line=ln)] + self.pad_copies(ct, P)
        out += self.loads(ct, a(), imgs, g0, g1, order, inner, self.ones)
        passes, total = self.passes(ct, P, f"_count{key}", "f32")
        fac = Buf(self.fresh(f"{g.op.out}_factor{key}"), "sbuf", "f32", (g.plan.parts, g.plan.k, g.plan.wb, g.K))
        every = (full(P), full(g.plan.k), full(g.plan.wb), full(g.K))
        out += passes + [Alloc(fac, line=ln), Scalar(View(fac, every), View(total, every), "divide",
                                                     g.op.pool.scale, ln, reverse=True)]
        return out, fac

    def split(self, n: int) -> list[tuple[tuple[int, int], tuple[int, int], str]]:
        """A pass's (rows, columns) as VectorE's part and GpSimdE's (the plan's share): by rows when a group has
        several (each part then a contiguous range of its tile: parts of columns across rows would overlap in the
        dependence tracking's byte ranges and run one after the other), else by columns [0, n)."""
        k = self.g.plan.k
        total = k if k > 1 else n
        cut = round(total * self.g.plan.vector_share)
        if cut >= total or cut <= 0:
            return [((0, k), (0, n), "")]
        if k > 1:
            return [((0, cut), (0, n), ""), ((cut, k - cut), (0, n), "gpsimd")]
        return [((0, k), (0, cut), ""), ((0, k), (cut, n - cut), "gpsimd")]


def _scaled(o: Aff, f: int) -> Aff:
    return Aff(tuple(ir.Term(t.var, t.coef * f, "") for t in o.terms), o.const * f)
