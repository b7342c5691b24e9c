"""A window pool's pass along x through PSUM (rules_pool.py): TensorE copies X's rows into PSUM for VectorE,
or sums the taps of a 16-bit sum itself (and whole windows of some output rows), ScalarE evicting."""

from __future__ import annotations

from tilec.compiler import build_util, ir, passes
from tilec.compiler import pool_knobs as knobs
from tilec.compiler.build_util import a, sl
from tilec.compiler.ir import Act, Alloc, Buf, Matmul, Sl, Stmt, View, full, whole
from tilec.compiler.pool_costs import psum_choice
from tilec.compiler.pool_passes import WindowPasses
from tilec.compiler.pool_segments import Segment, eviction_runs
from tilec.target import compiled


class TensorPasses(WindowPasses):
    """The passes that use TensorE and PSUM."""

    def choose_psum(self, peeled: bool = True) -> None:
        """Whether the pass along x reads X through PSUM (psum_choice); peeled: the first tile is peeled."""
        if self.G == 1 and self.chip is None:  # (from an on-chip input: no PSUM copies, the passes read it)
            choice = psum_choice(self.op, self.OB, self.B // self.plan.tile_b * -(-self.Rb // self.OB), self.x3.dtype,
                                 self.o3.dtype, self.B // self.plan.tile_b, peeled)
            if choice is not None:
                self.psum, self.y_share, self.taps = choice.rows, choice.y_share, choice.taps
                self.full_rows_n = choice.whole

    def identity(self) -> list[Stmt]:
        """The identity matrix of TensorE's copies (X's dtype), once per kernel, built on chip (build_util.identity)."""
        if self.shared.ident is not None:
            return []
        self.shared.ident, body = build_util.identity(self.fresh("ident"), self.x3.dtype, self.op.line)
        return [ir.Block("identity matrix (TensorE copies X's rows into PSUM with it)", tuple(body), self.op.line)]

    def psum_x_pass(self, xb: Buf, src: View, dst: Buf, segs: list[Segment], stride: int, shift: int,
                    window: int, final: View | None = None) -> list[Stmt]:
        """The pass along x with X read through PSUM: per chunk of the band's input rows (one PSUM bank), an
        identity matmul copies them (exact: each output is one input times 1), then the pass combines them on
        VectorE at 1 cycle per element into the same rows of dst."""
        line, P, rows = self.op.line, xb.shape[0], xb.shape[1]
        ident = self.shared.ident
        assert self.psum is not None and ident is not None and src.buf == xb
        out: list[Stmt] = []
        for r0 in range(0, rows, self.psum):
            cr = min(self.psum, rows - r0)
            ps = Buf(self.name(f"{self.op.src}_psum", (cr,)), "psum", "f32", (P, cr, self.W))
            out += [Alloc(ps, zero=True, line=line),
                    Matmul(whole(ps), View(ident, (sl(0, P), sl(0, P))), View(xb, (full(P), sl(r0, cr), full(self.W))),
                           line)]
            rows_of = (full(P), sl(r0, cr), full(self.Wo))
            out += self.window_pass(whole(ps), View(dst, rows_of), 2, segs, stride, shift, window,
                                    View(xb, (full(P), sl(r0, cr), full(self.W))),
                                    View(final.buf, rows_of) if final is not None else None)
        return out

    def tensor_x_pass(self, xb: Buf, dst: Buf, segs: list[Segment], stride: int, shift: int, window: int,
                      scale: float, counted: bool = False, whole_rows: int = 0) -> list[Stmt]:
        """The pass along x of a sum on TensorE: per chunk of the band's input rows (one PSUM bank), one identity
        matmul per tap accumulates the tap's strided view of the rows into the outputs it reaches (the tap every
        output has first, over all of them: it starts the accumulation), exact in fp32 PSUM; ScalarE evicts the
        chunk into the same rows of dst times `scale` (the average's 1 / count, when it is folded here); counted
        (count_include_pad=False): each run of columns with as many taps inside X times window / its taps.
        whole_rows: the rows `full_rows` sums next; when they fit in the last chunk's bank beside its rows, that
        chunk's PSUM tile takes them too (self.shared_bank), so a tile's sums take one bank fewer: with two tiles
        per step (`peeled`) the body's PSUM tiles then fit the 8 banks two buffers each, and no tile waits for the
        eviction of another site's tile (tilec/perf/schedule.py place_psum)."""
        line, P, rows, n = self.op.line, xb.shape[0], xb.shape[1], sum(g.size for g in segs)
        ident = self.shared.ident
        assert self.psum is not None and ident is not None
        every = [t for t in range(window) if all(t in g.taps for g in segs)]
        first = every[len(every) // 2]
        reach = {t: [g for g in segs if t in g.taps] for t in range(window) if t != first}
        spans = [(first, 0, n)] + [(t, gs[0].start, sum(g.size for g in gs)) for t, gs in reach.items() if gs]
        out: list[Stmt] = []
        self.shared_bank = None
        for r0 in range(0, rows, self.psum):
            cr = min(self.psum, rows - r0)
            extra = whole_rows if knobs.SHARE_BANK and r0 + cr == rows and \
                (cr + whole_rows) * n * 4 <= compiled().psum_bank_bytes else 0
            ps = Buf(self.name(f"{self.op.src}_taps", (cr + extra,)), "psum", "f32", (P, cr + extra, n))
            self.shared_bank = (ps, cr) if extra else None
            mine = full(cr) if not extra else sl(0, cr)  # the chunk's rows of ps
            out.append(Alloc(ps, zero=True, line=line))
            for t, o0, size in spans:
                step = stride if size > 1 else 1
                moving = View(xb, (full(P), sl(r0, cr), Sl(a(o0 * stride + t + shift), size, step)))
                out.append(Matmul(View(ps, (full(P), mine, sl(o0, size))), View(ident, (sl(0, P), sl(0, P))),
                                  moving, line))
            for cols, factor in eviction_runs(segs, window, counted):
                cols = cols if cols.size < n else full(n)
                out.append(Act(View(dst, (full(P), sl(r0, cr), cols)), View(ps, (full(P), mine, cols)), "copy",
                               None, scale * factor, line))
        return out

    def full_block(self, segs: list[Segment], n: int) -> tuple[int, int] | None:
        """(first output row, rows) of the band's outputs whose whole window TensorE sums (`full_rows`): the last
        FULL_ROWS of the run of rows with every tap inside X, as many as one PSUM bank and one matmul's moving
        columns hold; None without a pass along x through TensorE's taps."""
        inner = [g for g in segs if len(g.taps) == self.op.pool.wy]
        if not inner or self.G != 1 or self.w.out[1] * self.op.pool.wy == 0:
            return None
        t = compiled()
        k = min(self.full_rows_n, inner[0].size, min(t.psum_bank_bytes // 4, t.moving_fmax) // self.Wo)
        return (inner[0].start + inner[0].size - k, k) if k > 0 else None

    def full_rows(self, xb: Buf, ob: Buf, m0: int, k: int, shift_y: int, xsegs: list[Segment], scale: float,
                  counted: bool, bank: tuple[Buf, int] | None = None) -> list[Stmt]:
        """Output rows m0..m0+k (every window row inside X) summed whole on TensorE: one accumulating identity
        matmul per window row and column tap (the tap every output has first, over all of them: it starts the
        accumulation), the moving data a (row, column) strided view of the band; ScalarE evicts them into Y's band
        with the scale (and the columns' counts) folded in. TensorE, faster than the vector engines at 16-bit
        data, so takes rows off the pass along y. bank: (the PSUM tile, first row) where the pass along x's last
        chunk left room for them (tensor_x_pass), else a tile of their own."""
        (sy, sx), ox = self.w.stride, self.w.offset[1]
        line, P, n, wx = self.op.line, xb.shape[0], self.Wo, self.op.pool.wx
        ident = self.shared.ident
        assert ident is not None
        every = [t for t in range(wx) if all(t in g.taps for g in xsegs)]
        lead = every[len(every) // 2]
        reach = {t: [g for g in xsegs if t in g.taps] for t in range(wx) if t != lead}
        spans = [(lead, 0, n)] + [(t, gs[0].start, sum(g.size for g in gs)) for t, gs in reach.items() if gs]
        if bank is not None and bank[0].shape[1] - bank[1] == k:
            ps, mine = bank[0], sl(bank[1], k)
            out: list[Stmt] = []
        else:
            ps, mine = Buf(self.name(f"{self.op.src}_full", (k,)), "psum", "f32", (P, k, n)), full(k)
            out = [Alloc(ps, zero=True, line=line)]
        for p in range(self.op.pool.wy):
            for t, o0, size in spans:
                rows = Sl(a(m0 * sy + p + shift_y), k, sy if k > 1 else 1)
                moving = View(xb, (full(P), rows, Sl(a(o0 * sx + t + ox), size, sx if size > 1 else 1)))
                out.append(Matmul(View(ps, (full(P), mine, sl(o0, size))), View(ident, (sl(0, P), sl(0, P))),
                                  moving, line))
        for cols, factor in eviction_runs(xsegs, wx, counted):
            cols = cols if cols.size < n else full(n)
            out.append(Act(View(ob, (full(P), sl(m0, k), cols)), View(ps, (full(P), mine, cols)), "copy", None,
                           scale * factor, line))
        return out

    def tensor_rows(self, src: View, dst: View, segs: list[Segment], stride: int, shift: int, window: int,
                    k: int) -> list[Stmt]:
        """The pass along x of a sum's first k input rows on TensorE, beside the vector engines' share of the other
        rows (reduce_split): per chunk of rows (one PSUM bank), one identity matmul per tap accumulates the tap's
        strided view of the rows into the outputs it reaches (exact in fp32 PSUM), ScalarE evicts the chunk into
        dst's rows unscaled (the pass along y reads them like the vector engines' rows)."""
        line, xb, n = self.op.line, src.buf, sum(g.size for g in segs)
        P, ident = xb.shape[0], self.shared.ident
        assert ident is not None and src == whole(xb)
        every = [t for t in range(window) if all(t in g.taps for g in segs)]
        first = every[len(every) // 2]
        reach = {t: [g for g in segs if t in g.taps] for t in range(window) if t != first}
        spans = [(first, 0, n)] + [(t, gs[0].start, sum(g.size for g in gs)) for t, gs in reach.items() if gs]
        chunk = max(1, min(compiled().psum_bank_bytes // 4, compiled().moving_fmax) // n)
        out: list[Stmt] = []
        for r0 in range(0, k, chunk):
            cr = min(chunk, k - r0)
            ps = Buf(self.name(f"{self.op.src}_share", (cr,)), "psum", "f32", (P, cr, n))
            out.append(Alloc(ps, zero=True, line=line))
            for t, o0, size in spans:
                cols = Sl(a(o0 * stride + t + shift), size, stride if size > 1 else 1)
                moving = View(xb, (full(P), sl(r0, cr), cols))
                out.append(Matmul(View(ps, (full(P), full(cr), sl(o0, size))), View(ident, (sl(0, P), sl(0, P))),
                                  moving, line))
            out.append(Act(self._rows(dst, r0, cr), whole(ps), "copy", None, 1.0, line))
        return out

