"""A window pool's state and its passes along x and y on the vector engines (rules_pool.py): per segment
of outputs one instruction per tap, shared between VectorE and GpSimdE, the border taps copied, the
counts of an average that excludes the padding."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from tilec.compiler import pool_knobs as knobs
from tilec.compiler.build_conv import Fresh, hbm_view
from tilec.compiler.build_util import a
from tilec.compiler.ir import Act, Alloc, Binary, Buf, Copy, Reduce, Scalar, Sl, Stmt, View, full, whole
from tilec.compiler.ops import PoolOp
from tilec.compiler.pool_costs import vector_share
from tilec.compiler.pool_doubling import doubling_pass
from tilec.compiler.pool_segments import Segment, border_pairs, merged, within
from tilec.compiler.schedule import PoolPlan
from tilec.errors import InternalError


@dataclass
class PoolShared:
    names: dict[str, str] = field(default_factory=dict)  # role and shape -> kernel name
    small: int = 0  # combines too small to share, so far
    ident: Buf | None = None  # the identity matrix of TensorE's copies into PSUM, once made


class WindowPasses:
    """A window pool's state (one partition tile's bands) and its passes on the vector engines."""

    def __init__(self, op: PoolOp, plan: PoolPlan, hbm: dict[str, Buf], fresh: Fresh,
                 out_rows: tuple[int, int] | None = None, shared: "PoolShared | None" = None,
                 starts: tuple[int, ...] = ()) -> None:
        """out_rows: (rows of Y per channel row, the first of them this pool writes) when the pool computes only
        some of Y's rows (a seam or the interleaved part of an Interleave); shared: what the pools of one
        Interleave share (the kernel names given so far, the turn of small combines); starts: the first output
        row of each block of plan.band rows, when the blocks are given (an Interleave's seams)."""
        assert op.window is not None
        self.op, self.plan, self.fresh, self.w = op, plan, fresh, op.window
        self.shared = PoolShared() if shared is None else shared
        self.names = self.shared.names
        self.B, self.H, self.W = op.dim("B"), op.dim("H"), op.dim("W")
        self.Ho, self.Wo = op.window.out
        self.G = len(starts) or plan.row_blocks(op)
        y_rows, self.row0 = out_rows or (self.Ho, 0)
        xs, ys = (self.B, self.H, self.W), (self.B, y_rows, self.Wo)
        self.x3, s1 = hbm_view(hbm[op.src], xs, self.name(f"{op.src}_v", xs), op.line)
        self.o3, s2 = hbm_view(hbm[op.out], ys, self.name(f"{op.out}_v", ys), op.line)
        self.views = s1 + s2
        self.y_views = s2
        # the pool's input already in SBUF (pool_chain.py: a conv's output kept on chip, image by image): the
        # buffer [channels of a tile, tile t's rows from t * H on, W] and the images' loop variable; set by read_chip
        self.chip: Buf | None = None
        self.image = ""
        self.Rb = plan.band if starts else -(-self.Ho // self.G)  # output rows per block
        # block g's first output row; the last block ends with the output (it may redo a few rows of the one before)
        self.starts = list(starts) or [min(g * self.Rb, self.Ho - self.Rb) for g in range(self.G)]
        self.overlap = self.starts[-2] + self.Rb - self.starts[-1] if self.G > 1 else 0  # rows it must not store
        self.OB = min(plan.band, self.Rb)
        self.note = ""  # more of the block's label
        self.split_loads = False  # a band's input rows in two loads (load_parts)
        self.psum: int | None = None  # input rows per PSUM copy when the pass along x reads X through PSUM
        self.y_share: float | None = None  # VectorE's part of the pass along y then (the rest on GpSimdE)
        self.last_tile = False  # building the peeled last tile of a pool through PSUM (edge copies on VectorE)
        self.first_tile = False  # building the peeled first tile before TensorE's taps (border counts on VectorE)
        self.shared_bank: tuple[Buf, int] | None = None  # (PSUM tile, row): room left for full_rows (tensor_x_pass)
        self.taps = False  # TensorE sums the pass along x's taps into PSUM (16-bit sums; PsumChoice.taps)
        self.full_rows_n = 0  # output rows per band TensorE sums whole (with the taps; `full_block`)
        self.y_cut: int | None = None  # where the last split combine along y changed engines (combine_shared)
        # stacked images (pool_stack.py): the row of the pass along y where every combine changes engines, small ones
        # too (each image's border rows are small combines; alternating them would make each engine wait on the
        # other's rows)
        self.stack_cut: int | None = None
        self.reduce_x = False  # the pass along x as window reductions on VectorE (reduce_pass; choose_reduce)
        self.share_rows = 0  # input rows per band whose pass along x TensorE sums (pool_window.build)
        self.x_cut = 1.0  # ...over this part of a band's input rows, GpSimdE's combines over the rest
        self.on_gpsimd = False  # every combine of the pass along x on GpSimdE (reduce_split)
        # blocks of output rows (few channel rows, not interleaved): each band writes its rows of one tile-wide output
        # buffer, stored once per block after the bands (`block_stores`)
        self.tile_out: Buf | None = None
        self.once: dict[str, Stmt] = {}  # allocations made once before the partition tiles (zero_rows' zero tile)

    def name(self, base: str, shape: tuple[int, ...]) -> str:  # one kernel name per role and shape
        key = f"{base}{shape}p{self.plan.tile_b * self.G}"  # buffers of one shape on as many partitions
        if key not in self.names:
            n = sum(k.startswith(base + "(") for k in self.names)
            self.names[key] = self.fresh(base if not n else f"{base}{n + 1}")
        return self.names[key]

    def window_pass(self, src: View, dst: View, axis: int, segs: list[Segment], stride: int, shift: int,
                    window: int, alone: View | None = None, final: View | None = None,
                    counted: bool = False) -> list[Stmt]:
        """dst = op over the window taps of src along `axis` (1: rows, 2: columns). With a tap t0 inside the input
        for every output: dst = op(t0, t1) where t1 reaches, t0 alone elsewhere (the border), then each other tap
        combined into the outputs it reaches; the large instructions are cut in row ranges between VectorE and
        GpSimdE so both finish together. Without such a tap (a 2-wide window padded on both sides), each segment
        is combined on its own. alone: src is in PSUM, which GpSimdE cannot read, and alone the same rows in SBUF:
        every combine on VectorE, the first one's second tap read from SBUF (at most one PSUM operand). final: the
        pass's result goes there (a 16-bit tile) and dst holds the partial sums (fp32): only the last combine, and
        copies of the outputs it does not reach, write final, so each output is rounded once. counted
        (count_include_pad=False, final given): see `counted_pass`. segs: consecutive, from any output on."""
        line, n, begin = self.op.line, sum(g.size for g in segs), segs[0].start
        every = [t for t in range(window) if all(t in g.taps for g in segs)]
        if counted and final is not None and len(every) < window:
            return self.counted_pass(src, dst, final, axis, segs, stride, shift, window, alone)
        doubled = None if alone is not None or src.buf.memory != "sbuf" or not knobs.DOUBLING else \
            doubling_pass(self, src, dst, axis, segs, stride, shift, final)
        if doubled is not None:  # windows of 4 taps or more: pairs, pairs of pairs.. (pool_doubling.py)
            return doubled
        out: list[Stmt] = []
        if every and self.plan.images > 1 and axis == 1:  # stacked images: a tap reaches runs of outputs
            return self.stacked_pass(src, dst, segs, stride, shift, window, every[len(every) // 2], alone)
        if every:
            t0 = every[len(every) // 2]
            reach = {t: [g for g in segs if t in g.taps] for t in range(window) if t != t0}
            ranges = {t: Segment(gs[0].start, sum(g.size for g in gs), (t,)) for t, gs in reach.items() if gs}
            order = sorted(ranges, key=lambda t: -ranges[t].size)
            if order:
                first = ranges[order[0]]
                into = final if final is not None and len(order) == 1 else dst
                out += self.combine_shared(into, axis, first, self._tap(src, axis, t0, shift, stride),
                                           self._tap(src if alone is None else alone, axis, order[0], shift, stride),
                                           alone is not None, src.buf.dtype)
                # the later combines change engines there too
                cut = self.y_cut if axis == 1 and knobs.ALIGN_CUTS else None
                for lo, hi in ((begin, first.start), (first.start + first.size, begin + n)):  # t0 alone at the borders
                    if hi > lo:
                        edge = Segment(lo, hi - lo, (t0,))
                        out.append(self.edge_copy(self._view(into, axis, edge, 0, 1),
                                                  self._view(src, axis, edge, t0 + shift, stride)))
                for t in order[1:]:
                    if final is not None and t == order[-1]:  # the last combine: partial sums + tap t into final
                        partial = self._tap(dst, axis, 0, 0, 1)
                        out += self.combine_shared(final, axis, ranges[t], partial,
                                                   self._tap(src, axis, t, shift, stride), alone is not None,
                                                   src.buf.dtype, cut)
                        r = ranges[t]
                        for lo, hi in ((begin, r.start), (r.start + r.size, begin + n)):  # outputs tap t misses
                            if hi > lo:
                                edge = Segment(lo, hi - lo, ())
                                out.append(self.edge_copy(self._view(final, axis, edge, 0, 1),
                                                          self._view(dst, axis, edge, 0, 1), partial=True))
                    else:
                        out += self.combine_shared(dst, axis, ranges[t], None, self._tap(src, axis, t, shift, stride),
                                                   alone is not None, src.buf.dtype, cut)
            else:
                out.append(Copy(self._view(final or dst, axis, Segment(begin, n, (t0,)), 0, 1),
                                self._view(src, axis, Segment(begin, n, (t0,)), t0 + shift, stride), line))
        else:
            for seg in segs:
                out += self.combine(src if alone is None else alone, dst, axis, seg, stride, shift)
            if final is not None:
                out += [Copy(self._view(final, axis, g, 0, 1), self._view(dst, axis, g, 0, 1), line) for g in segs]
        return out

    def stacked_pass(self, src: View, dst: View, segs: list[Segment], stride: int, shift: int, window: int,
                     t0: int, alone: View | None) -> list[Stmt]:
        """window_pass's tap-by-tap form along y over stacked images (pool_stack.py), where a tap other than t0
        (which every output has) reaches a run of outputs in each image rather than one run: dst = op(t0, t1)
        over t1's runs, t0 alone between them, then each other tap combined into its runs. A max or min only (a
        sum's partial sums into a 16-bit `final` are not stacked)."""
        line = self.op.line
        runs: dict[int, list[Segment]] = {}
        for t in range(window):
            for g in (g for g in segs if t in g.taps and t != t0):
                got = runs.setdefault(t, [])
                if got and got[-1].start + got[-1].size == g.start:
                    got[-1] = Segment(got[-1].start, got[-1].size + g.size, (t,))
                else:
                    got.append(Segment(g.start, g.size, (t,)))
        order = sorted(runs, key=lambda t: -sum(r.size for r in runs[t]))
        if not order:
            g = Segment(segs[0].start, sum(g.size for g in segs), (t0,))
            return [Copy(self._view(dst, 1, g, 0, 1), self._view(src, 1, g, t0 + shift, stride), line)]
        out: list[Stmt] = []
        t1, at = order[0], segs[0].start
        for r in runs[t1] + [Segment(segs[-1].start + segs[-1].size, 0, ())]:
            if r.start > at:  # t0 alone between the runs (the borders)
                edge = Segment(at, r.start - at, (t0,))
                out.append(self.edge_copy(self._view(dst, 1, edge, 0, 1), self._view(src, 1, edge, t0 + shift,
                                                                                      stride)))
            if r.size:
                out += self.combine_shared(dst, 1, r, self._tap(src, 1, t0, shift, stride),
                                           self._tap(src if alone is None else alone, 1, t1, shift, stride),
                                           alone is not None, src.buf.dtype)
            at = r.start + r.size
        for t in order[1:]:
            for r in runs[t]:
                out += self.combine_shared(dst, 1, r, None, self._tap(src, 1, t, shift, stride), alone is not None,
                                           src.buf.dtype)
        return out

    def reduce_split(self, src: View, dst: View, segs: list[Segment], stride: int, shift: int, window: int,
                     final: View | None = None) -> list[Stmt]:
        """The pass along x with its first input rows (x_cut of them) as window reductions on VectorE
        (reduce_pass), the others as GpSimdE's combines (window_pass on those rows)."""
        rows = src.shape()[1]
        cut = round(rows * self.x_cut)
        out = self.reduce_pass(self._rows(src, 0, cut), self._rows(dst, 0, cut), segs, stride, shift,
                               self._rows(final, 0, cut) if final is not None else None) if cut else []
        if cut < rows:
            self.on_gpsimd = True
            out += self.window_pass(self._rows(src, cut, rows - cut), self._rows(dst, cut, rows - cut), 2, segs,
                                    stride, shift, window,
                                    final=self._rows(final, cut, rows - cut) if final is not None else None)
            self.on_gpsimd = False
        return out

    @staticmethod
    def _rows(v: View, r0: int, n: int) -> View:
        idx = list(v.idx)
        idx[1] = within(idx[1], r0, n, 1)
        return View(v.buf, tuple(idx))

    def reduce_pass(self, src: View, dst: View, segs: list[Segment], stride: int, shift: int,
                    final: View | None = None) -> list[Stmt]:
        """The pass along x as one VectorE tensor_reduce per segment of outputs over a window view of src's
        columns (ir.Reduce.window: outputs o of the segment = op over taps k of column o * stride + k + its first
        tap's column, the windows overlapping when stride < taps), every input row at once; fp32 inside, so a sum
        writes `final` (16-bit Y) directly, rounded once."""
        out: list[Stmt] = []
        into = final if final is not None else dst
        pairs = border_pairs(segs)
        for left, right in pairs:  # two border outputs as one window of the same taps, `step` columns apart
            c0, c1 = (g.start * stride + g.taps[0] + shift for g in (left, right))
            idx = list(src.idx)
            idx[2] = within(idx[2], c0, c1 - c0 + len(left.taps), 1)
            out.append(Reduce(self._pair(into, 2, left.start, right.start), View(src.buf, tuple(idx)),
                              self.op.pool.op, self.op.line, (c1 - c0, len(left.taps))))
        for g in segs[len(pairs):len(segs) - len(pairs)]:
            if list(g.taps) != list(range(g.taps[0], g.taps[0] + len(g.taps))):
                raise InternalError(f"window taps {g.taps} of a pool's segment are not contiguous")
            target = self._view(into, 2, g, 0, 1)
            if len(g.taps) == 1:  # a border's lone tap
                out.append(self.edge_copy(target, self._view(src, 2, g, g.taps[0] + shift, stride)))
                continue
            first = g.start * stride + g.taps[0] + shift
            span = (g.size - 1) * stride + len(g.taps)
            idx = list(src.idx)
            idx[2] = within(idx[2], first, span, 1)
            out.append(Reduce(target, View(src.buf, tuple(idx)), self.op.pool.op, self.op.line,
                              (stride, len(g.taps))))
        return out

    def counted_pass(self, src: View, dst: View, final: View, axis: int, segs: list[Segment], stride: int,
                     shift: int, window: int, alone: View | None) -> list[Stmt]:
        """A pass of an average excluding the padding (count_include_pad=False) whose other pass's counts are
        already folded in (TensorE's taps: the columns' in the evictions): the outputs with every tap inside X
        (one run, the interior) as `window_pass` makes them, their last combine writing final; each border segment
        summed apart first (on GpSimdE: small; the two ends of a padding of one as one instruction, into a tile of
        their own so that their stepped view does not order them with the interior's) and written to final times
        window / its taps last (VectorE)."""
        line, engine = self.op.line, "gpsimd" if alone is None else ""
        inner = [g for g in segs if len(g.taps) == window]
        borders = [g for g in segs if not inner or g.start != inner[0].start]
        pair = len(borders) == 2 and all(g.size == 1 for g in borders) and \
            len(borders[0].taps) == len(borders[1].taps) and all(
                borders[1].start * stride + t1 > borders[0].start * stride + t0
                for t0, t1 in zip(borders[0].taps, borders[1].taps))
        sums: list[Stmt] = []
        scaled: list[Stmt] = []
        for g in [None] if pair else borders:
            if g is None:
                first, last = borders
                target = self._pair(final, axis, first.start, last.start)
                factor = window / len(first.taps)
                taps = [self._pair(src if alone is None else alone, axis, first.start * stride + t0 + shift,
                                   last.start * stride + t1 + shift) for t0, t1 in zip(first.taps, last.taps)]
                shape = tuple(2 if i == axis else n for i, n in enumerate(dst.shape()))
                ends = Buf(self.name(f"{self.op.out}_ends", shape), "sbuf", dst.buf.dtype, shape)
                sums.append(Alloc(ends, line=line))
                acc = whole(ends)
            else:
                target, factor = self._view(final, axis, g, 0, 1), window / len(g.taps)
                taps = [self._view(src if alone is None else alone, axis, g, t + shift, stride) for t in g.taps]
                acc = self._view(dst, axis, g, 0, 1)
            if len(taps) > 1:
                sums.append(Binary(acc, taps[0], taps[1], self.op.pool.op, line, engine))
                sums += [Binary(acc, acc, t, self.op.pool.op, line, engine) for t in taps[2:]]
                taps = [acc]
            scaled.append(Scalar(target, taps[0], "multiply", factor, line) if factor != 1.0 else
                          Copy(target, taps[0], line))
        inside = self.window_pass(src, dst, axis, inner[:1], stride, shift, window, alone, final) if inner else []
        return sums + inside + scaled

    @staticmethod
    def _pair(v: View, axis: int, p0: int, p1: int) -> View:
        """Elements p0 and p1 (> p0) of v along `axis` as one view (a step of p1 - p0)."""
        idx = list(v.idx)
        idx[axis] = Sl(a(p0), 2, p1 - p0)
        return View(v.buf, tuple(idx))

    def edge_copy(self, dst: View, src: View, partial: bool = False) -> Stmt:
        """A border's lone tap: on ScalarE, which has room (it only scales each tile once) unless the per-region
        counts of count_include_pad=False keep it busy, or the tap is in PSUM (the pass along x from PSUM: ScalarE,
        in order, would hold the next band's pass behind this band's scale) or the tile is the last of a peeled
        pool (its pass along y would wait behind the tile before's scale), or it copies the partial sums of a pass
        along y (`partial`) of 4 rows or more beside TensorE's taps: ScalarE, in order, would hold the next tile's
        evictions behind the vector engines' pass (measured, model, bf16 batch 8 through the taps: avgpool 5x5 s1
        45.83 -> 37.95 us, 5x5 s2 77.51 -> 71.45; 3x3 s1, whose pass is two combines, 28.98 on ScalarE against
        31.01 on VectorE, 30.27 on GpSimdE); else VectorE."""
        if self.w.count == "inside" or src.buf.memory == "psum" or self.last_tile or \
                (partial and self.taps and self.op.pool.wy >= 4):
            return Copy(dst, src, self.op.line)
        return Act(dst, src, "copy", None, 1.0, self.op.line)

    def _tap(self, src: View, axis: int, t: int, shift: int,
             stride: int) -> Callable[[Segment, tuple[int, int] | None], View]:
        return lambda seg, part: self._view(src, axis, seg, t + shift, stride, part)

    def combine_shared(self, dst: View, axis: int, seg: Segment, a_tap: Callable | None, b_tap: Callable,
                       alone: bool = False, src: str = "", cut_at: int | None = None,
                       pair: Segment | None = None) -> list[Stmt]:
        """dst[seg] = op(a_tap or dst, b_tap) over seg, in row ranges: VectorE the first, GpSimdE the rest (rows are
        the other free axis of a pass along x, the pass's own axis along y: either way each engine writes whole
        rows, which the dependence tracking sees as disjoint); src: the taps' dtype (VectorE's rate doubles when it
        and dst's are 16-bit). cut_at (a pass along y): the output row where the pass's first combine changed
        engines, so that this one changes there too and each engine reads back only the rows it wrote (a cut of
        its own, from its own segment's size, can give VectorE a row GpSimdE wrote: a wait across the engines
        every band; measured, bf16 avgpool 3x3 s1 batch 8, 4 whole rows: 44.54 -> 42.62 us). The cut of a pass
        along y that splits is left in `self.y_cut` for the pass's later combines. pair: a border output mirroring
        seg's (a single one, border_pairs), combined by the same instructions (views stepping from one to the other;
        along y not split: one engine takes both rows)."""
        share = vector_share(src or dst.buf.dtype, dst.buf.dtype)
        if axis == 1 and self.y_share is not None:  # VectorE also runs the pass along x (psum_x_pass)
            share = self.y_share

        engine = ""
        if self.on_gpsimd and axis == 2:  # GpSimdE's rows of a pass along x beside VectorE's reductions
            share, engine = 0.0, "gpsimd"
        elif alone:
            share = 1.0
        elif seg.size * dst.shape()[3 - axis] * (1 if pair is None else 2) < knobs.SHARE_MIN or \
                (pair is not None and axis == 1):  # small: a second instruction's fixed cost dominates
            share, engine = 1.0, self.small_engine()
            if pair is not None:  # (both outputs' turns: the later small combines keep their engines)
                self.small_engine()
        jobs: list[tuple[Segment, tuple[int, int] | None, str]] = []
        if axis == 1 and self.stack_cut is not None and not alone:  # stacked images: one cut for every combine
            cut = min(max(self.stack_cut - seg.start, 0), seg.size)
            jobs = [(g, None, eng) for g, eng in ((Segment(seg.start, cut, seg.taps), ""),
                                                  (Segment(seg.start + cut, seg.size - cut, seg.taps), "gpsimd"))
                    if g.size]
        elif axis == 2:
            rows = dst.shape()[1]
            cut = round(rows * share)
            jobs = [(seg, (0, cut), ""), (seg, (cut, rows - cut), "gpsimd")] if 0 < cut < rows else \
                [(seg, None, engine)]
        else:
            cut = round(seg.size * share)
            if cut_at is not None and not engine and share != 1.0 and cut > cut_at - seg.start:
                cut = min(max(cut_at - seg.start, 0), seg.size)
            self.y_cut = seg.start + cut if 0 < cut < seg.size else None
            jobs = [(Segment(seg.start, cut, seg.taps), None, ""),
                    (Segment(seg.start + cut, seg.size - cut, seg.taps), None, "gpsimd")] \
                if 0 < cut < seg.size else [(seg, None, "gpsimd" if cut == 0 and share == 0 else engine)]
        out: list[Stmt] = []
        for part_seg, part, eng in jobs:
            target, first, second = self._combined(part_seg, part, dst, axis, a_tap, b_tap)
            if pair is not None:
                t2, f2, s2 = self._combined(pair, part, dst, axis, a_tap, b_tap)
                target, first, second = merged(target, t2, axis), merged(first, f2, axis), merged(second, s2, axis)
            out.append(Binary(target, first, second, self.op.pool.op, self.op.line, eng))
        return out

    def _combined(self, g: Segment, part: tuple[int, int] | None, dst: View, axis: int, a_tap: Callable | None,
                  b_tap: Callable) -> tuple[View, View, View]:
        """(dst, first operand, second operand) of one combine over outputs g (combine_shared)."""
        target = self._view(dst, axis, g, 0, 1, part)
        return target, a_tap(g, part) if a_tap is not None else target, b_tap(g, part)

    def small_engine(self) -> str:
        """The engine of a combine too small to share: VectorE and GpSimdE in turn (within an Interleave's pools
        too), so neither collects them all."""
        self.shared.small += 1
        return "gpsimd" if self.shared.small % 2 == 0 else ""

    def count_regions(self, src: View, ob: Buf, ysegs: list[list[Segment]], xsegs: list[list[Segment]],
                      scale: float) -> list[Stmt]:
        """count_include_pad=False: the result scaled on ScalarE region by region, each (row segment, column
        segment) by scale * (wy / its row taps) * (wx / its column taps): one instruction for the interior, small
        ones for the borders, none on the vector engines; in the peeled first tile before TensorE's taps the borders'
        on VectorE (idle until the next tile's evictions, which ScalarE, in order, would hold behind them)."""
        ys = ysegs[0] if ysegs else [Segment(0, ob.shape[1], (0,))]
        xs = xsegs[0] if xsegs else [Segment(0, ob.shape[2], (0,))]
        wy, wx = (self.op.pool.wy, self.op.pool.wx)
        out: list[Stmt] = []
        for y, ry in _runs(ys):  # (mirrored borders have as many taps: one factor, one instruction for both)
            for x, rx in _runs(xs):
                idx = (full(ob.shape[0]), ry, rx)
                factor = scale * (wy / len(y.taps) if ysegs else 1) * (wx / len(x.taps) if xsegs else 1)
                border = len(y.taps) < wy or len(x.taps) < wx
                out.append(Scalar(View(ob, idx), View(src.buf, idx), "multiply", factor, self.op.line)
                           if self.first_tile and border else
                           Act(View(ob, idx), View(src.buf, idx), "copy", None, factor, self.op.line))
        return out

    def _view(self, v: View, axis: int, seg: Segment, offset: int, step: int,
              part: tuple[int, int] | None = None) -> View:
        """Outputs seg of a pass as a view of v: along `axis` from seg.start * step + offset by step; along the
        other free axis `part` (start, size), else all of it. Positions count from v's own slices (a band's rows of
        a tile-wide output, `tile_out`)."""
        idx = list(v.idx)
        idx[axis] = within(idx[axis], seg.start * step + offset, seg.size, step)
        if part is not None:
            idx[3 - axis] = within(idx[3 - axis], part[0], part[1], 1)
        return View(v.buf, tuple(idx))

    def combine(self, src: View, dst: View, axis: int, seg: Segment, stride: int, shift: int) -> list[Stmt]:
        """dst's outputs of one segment = op over its taps (VectorE)."""
        op, line = self.op, self.op.line
        target = self._view(dst, axis, seg, 0, 1)
        taps = [self._view(src, axis, seg, t + shift, stride) for t in seg.taps]
        if len(taps) == 1:
            return [Copy(target, taps[0], line)]
        out: list[Stmt] = [Binary(target, taps[0], taps[1], op.pool.op, line)]
        return out + [Binary(target, target, t, op.pool.op, line) for t in taps[2:]]


def _runs(segs: list[Segment]) -> list[tuple[Segment, Sl]]:
    """Each segment with its outputs as a slice, a pair of mirrored border outputs (border_pairs) as one stepped
    slice of both."""
    pairs = border_pairs(segs, reduced=False)
    return [(g, Sl(a(g.start), 2, h.start - g.start)) for g, h in pairs] + \
        [(g, Sl(a(g.start), g.size)) for g in segs[len(pairs):len(segs) - len(pairs)]]
