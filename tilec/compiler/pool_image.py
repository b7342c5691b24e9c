"""Row blocks whose input rows are loaded once (pool21's next step 1): a pool with few channel rows puts G blocks of
output rows on the partitions (pool_window.py); band by band, its rows used to be a fresh buffer of the band's input
rows with the halo rows (wy - sy) loaded again and passed along x again. Here the block's input rows are one SBUF
image loaded band by band (only the rows no band before loaded), the pass along x runs once per input row into one
image of its results, and each band's pass along y reads a view of that image: no halo row is loaded or combined
twice, so the bands can be small and the engines start after a small first load."""

from __future__ import annotations

from typing import Callable

from tilec.compiler import pool_knobs as knobs
from tilec.compiler.build_util import a, sl
from tilec.compiler.ir import DTYPE_BYTES, Act, Alloc, Buf, Copy, Stmt, View, full, whole
from tilec.compiler.pool_costs import reduce_costs
from tilec.compiler.pool_passes import WindowPasses
from tilec.compiler.pool_segments import Segment, segments
from tilec.compiler.schedule import sbuf_budget
from tilec.target import compiled


class ImageBands(WindowPasses):
    """WindowPool's bands over block images (`image_body`); the loads and stores are WindowPool's."""

    block_loads: Callable[..., list[Stmt]]  # (pool_window.WindowPool)
    block_store: Callable[..., list[Stmt]]
    block_step: Callable[[], int | None]

    def image_rows(self) -> int:
        """A block's input rows when its bands read one image of them, else 0: row blocks (G > 1, one partition
        tile) with a pass along each axis from SBUF on the vector engines, more than one band, and the two images
        within 1 / IMAGE_SBUF_PART of SBUF. knob IMAGE (False: per-band buffers; tests, measures)."""
        op, w = self.op, self.w
        (sy, sx), (oy, ox) = w.stride, w.offset
        rows = (self.Rb - 1) * sy + op.pool.wy
        both = (op.pool.wx, sx, ox, self.Wo) != (1, 1, 0, self.W) and (op.pool.wy, sy, oy) != (1, 1, 0)
        tmp = 4 if op.pool.op == "add" else DTYPE_BYTES[self.x3.dtype]
        size = rows * (self.W * DTYPE_BYTES[self.x3.dtype] + self.Wo * tmp)
        if not knobs.IMAGE or self.G == 1 or self.w.count != "window" or self.chip is not None or op.relu or \
                self.psum is not None or self.share_rows or not both or self.OB >= self.Rb or self.row0:
            return 0
        return rows if size <= sbuf_budget(compiled()) // knobs.IMAGE_SBUF_PART else 0

    def image_body(self, rows: int) -> list[Stmt]:
        """Every band of the one partition tile over the block images (image_rows rows each)."""
        op, line, P, G = self.op, self.op.line, self.plan.tile_b, self.G
        sy, oy = self.w.stride[0], self.w.offset[0]
        tmp = "f32" if op.pool.op == "add" else self.x3.dtype
        xi = Buf(self.name(f"{op.src}_image", (rows,)), "sbuf", self.x3.dtype, (P * G, rows, self.W))
        ci = Buf(self.name(f"{op.out}_cols", (rows,)), "sbuf", tmp, (P * G, rows, self.Wo))
        out: list[Stmt] = [Alloc(xi, line=line), Alloc(ci, line=line)]
        done = 0
        o = 0
        for n in self.image_bands():
            lo, hi = o * sy, o * sy + (n - 1) * sy + op.pool.wy
            out += self.block_loads(xi, oy + done, hi - done, None, at=done)
            out += self.image_x_pass(xi, ci, done, hi - done)
            out += self.image_y_pass(ci, o, n, lo, hi)
            done = hi
            o += n
        return out

    def image_bands(self) -> list[int]:
        """The bands' output rows: of the candidates (a first band of 1..BAND rows, so the engines start after a
        short load, then either one band of the rest, or BAND-row bands with the remainder second), the one whose
        finish `image_estimate` puts first (the first candidate of the fewest bands on a tie)."""
        cands = []
        for first in range(1, min(self.OB, self.Rb - 1) + 1):
            rest = self.Rb - first
            cands += [[first, rest], [first] + ([rest % self.OB] if rest % self.OB else []) + [self.OB] *
                      (rest // self.OB)]
        return min(cands, key=lambda sizes: (round(self.image_estimate(sizes)), len(sizes)))

    def image_estimate(self, sizes: list[int]) -> float:
        """When the last store of the image's bands `sizes` ends (ns): each band loads and passes along x only the
        input rows no band before did, and stores its rows (`pipeline`)."""
        sy, wy, done, o = self.w.stride[0], self.op.pool.wy, 0, 0
        bands = []
        for n in sizes:
            hi = o * sy + (n - 1) * sy + wy
            bands.append((hi - done, n))
            done, o = hi, o + n
        return self.pipeline(bands, False)

    def bands_estimate(self, once: bool) -> float:
        """The same for per-band buffers (BAND rows and their halo rows each), stored per band or once per block
        after the last band (once: pool_window.block_stores)."""
        sy, wy = self.w.stride[0], self.op.pool.wy
        return self.pipeline([((n - 1) * sy + wy, n) for n in (min(self.OB, self.Rb - o)
                                                              for o in range(0, self.Rb, self.OB))], once)

    def pipeline(self, bands: list[tuple[int, int]], once: bool) -> float:
        """When the last store ends (ns), from the model's costs (tilec/perf/costs.py, params.py), for bands of
        (input rows loaded and passed along x, output rows): the loads one after another (Costs.dma_transfer_ns, a
        run per partition); a band's passes after its load and the band before (pool_costs.reduce_costs: the
        busiest engine, static cycles included); the stores (a band's rows, or once: each block's rows after the
        last band; one DMA for all blocks when they are evenly spaced, `one_store`, else one per block), each a DMA
        latency after the passes it needs and, as the model orders stores to Y whose byte ranges interleave
        (tilec/perf/deps.py), a DMA latency after the store before has moved its bytes; the last one's write
        acknowledgement."""
        from tilec.compiler.build_matvec import model_costs
        costs = model_costs()
        op, w, parts = self.op, self.w, self.plan.tile_b * self.G
        engines = min(costs.n_dma, -(-parts // costs.ppe))
        xsegs = segments(self.Wo, w.offset[1], w.stride[1], op.pool.wx, self.W)
        tmp = "f32" if op.pool.op == "add" else self.x3.dtype
        xbytes, obytes = DTYPE_BYTES[self.x3.dtype], DTYPE_BYTES[self.o3.dtype]
        per = [parts] if self.block_step() is not None else [self.plan.tile_b] * self.G  # a store's partitions
        loaded = computed = stored = 0.0

        def store(after: float, rows: int) -> float:
            for p in per:
                after = max(after, stored) + costs.dma_latency + \
                    costs.dma_transfer_ns(p, p * rows * self.Wo * obytes, min(costs.n_dma, -(-p // costs.ppe)))
            return after
        for rows, n in bands:
            loaded += costs.dma_transfer_ns(parts, parts * rows * self.W * xbytes, engines)
            band = reduce_costs(op, self.x3.dtype, tmp, self.o3.dtype, rows, n, self.Wo, xsegs, True)
            computed = max(loaded, computed) + (band[1] if self.reduce_x else band[0])
            stored = stored if once else store(computed, n)
        stored = store(computed, self.Rb) if once else stored
        return stored + costs.dma_write_ack

    def image_x_pass(self, xi: Buf, ci: Buf, r0: int, n: int) -> list[Stmt]:
        """The pass along x over image rows r0..r0+n (the rows this band loaded)."""
        op, w = self.op, self.w
        segs = segments(self.Wo, w.offset[1], w.stride[1], op.pool.wx, self.W)
        src, dst = self._rows(whole(xi), r0, n), self._rows(whole(ci), r0, n)
        if self.reduce_x:
            return self.reduce_split(src, dst, segs, w.stride[1], w.offset[1], op.pool.wx, None)
        return self.window_pass(src, dst, 2, segs, w.stride[1], w.offset[1], op.pool.wx)

    def image_y_pass(self, ci: Buf, o: int, n: int, lo: int, hi: int) -> list[Stmt]:
        """Output rows o..o+n of every block: the pass along y over the x results' rows lo..hi, the scale, the
        store (pool_window.band's last steps)."""
        op, line, P, G = self.op, self.op.line, self.plan.tile_b, self.G
        ob = Buf(self.name(f"{op.out}_band", (n,)), "sbuf", self.o3.dtype, (P * G, n, self.Wo))
        out: list[Stmt] = [Alloc(ob, line=line)]
        scale = op.pool.scale
        final = whole(ob) if scale == 1.0 and op.pool.op == "add" and ob.dtype in knobs.HALF and op.pool.wy > 2 \
            else None
        if scale == 1.0 and final is None:
            dst = ob
        else:
            shape = (P * G, n, self.Wo)
            dst = Buf(self.name(f"{op.out}_rows", shape), "sbuf", "f32" if op.pool.op == "add" else ob.dtype, shape)
            out.append(Alloc(dst, line=line))
        out += self.window_pass(self._rows(whole(ci), lo, hi - lo), whole(dst), 1,
                                [Segment(0, n, tuple(range(op.pool.wy)))], self.w.stride[0], 0, op.pool.wy,
                                final=final)
        if final is None and dst != ob:
            out.append(Act(whole(ob), whole(dst), "copy", None, scale, line) if scale != 1.0 else
                       Copy(whole(ob), whole(dst), line))
        return out + self.block_store(a(o), n, ob, o)
