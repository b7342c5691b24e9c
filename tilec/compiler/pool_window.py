"""A window pool's kernel (rules_pool.py): partition tiles (the first and last peeled when TensorE works
through PSUM), bands of output rows, their loads, passes and stores."""

from __future__ import annotations

from tilec.compiler import ir, passes
from tilec.compiler import pool_knobs as knobs
from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.ir import DTYPE_BYTES, Act, Aff, Alloc, Buf, Copy, Dma, Sl, Stmt, View, full, whole
from tilec.compiler.pool_costs import held, identity_ns, reduce_costs, tensor_rows_costs, vector_share
from tilec.compiler.pool_image import ImageBands
from tilec.compiler.pool_segments import Segment, at_value, clip, pad_runs, segments, shifted
from tilec.compiler.pool_stack import y_segments
from tilec.compiler.pool_tensor import TensorPasses
from tilec.compiler.schedule import sbuf_budget
from tilec.target import compiled


class WindowPool(TensorPasses, ImageBands):
    """One pool's partition tiles and bands (`build`)."""

    def read_chip(self, chip: Buf, image: str, channels: int) -> None:
        """Read the input from `chip` (an SBUF image: tile t's channel rows t * H..) instead of loading bands of X:
        one image of `channels` channel rows per iteration of the loop `image`, which the caller builds."""
        assert self.G == 1 and channels % self.plan.tile_b == 0, (self.G, channels, self.plan.tile_b)
        self.chip, self.image, self.per_image, self.views = chip, image, channels, self.y_views

    def rows_of(self, P: int) -> Sl:
        """This partition tile's channel rows of X and Y (image by image when the input is on chip)."""
        return sl(a(term("pb", P, "TILE_P"), *([term(self.image, self.per_image)] if self.chip else [])), P)

    def build(self) -> list[Stmt]:
        ident, body = self.parts()
        return ident + body

    def parts(self) -> tuple[list[Stmt], list[Stmt]]:
        """The kernel's identity matrix when TensorE works for the pool (or []), and the rest."""
        op, G = self.op, self.G
        self.choose_psum()
        self.choose_reduce()
        ident = self.identity() if self.psum is not None or self.share_rows else []
        tiles = (self.B if self.chip is None else self.per_image) // self.plan.tile_b
        note, line = f"for {dict(op.vars)['b']} (channel rows, tiles of TILE_P)", op.line_of("b")
        nest = loop("pb", tiles, self.tile_body(), note=note, line=line)
        if self.psum is not None and tiles >= knobs.PEEL_TILES:
            # the first tile from SBUF while the identity is made, the last with its pass along y shared: kept when
            # the three bodies' buffers fit (the capacity check counts a straight-line block's buffers as all live)
            peeled = self.peeled(tiles, note, line)
            if not peeled and self.taps and self.full_rows_n:  # every tile takes the taps: their band's estimate
                self.choose_psum(peeled=False)
                nest = loop("pb", tiles, self.tile_body(), note=note, line=line)
            nest = peeled or nest
        label = f"{op.out} = {op.pool.op} pool {op.pool.wy}x{op.pool.wx} of {op.src}, stride " \
                f"{self.w.stride[0]}x{self.w.stride[1]}, offset {self.w.offset[0]},{self.w.offset[1]}"
        if G > 1:
            label += f"; {G} blocks of {self.Rb} output rows, each on {self.plan.tile_b} partitions"
        label += self.note
        return ident, self.views + [ir.Block(label, tuple(list(self.once.values()) + nest), op.line)]

    def choose_reduce(self) -> None:
        """Whether the pass along x (from SBUF) is window reductions on VectorE (reduce_pass), the pass along y then
        shared at VectorE's part `y_share`: when the model's costs make a band's busiest engine faster that way
        (pool_costs.reduce_costs; knob REDUCE)."""
        op, w = self.op, self.w
        if self.psum is not None or knobs.REDUCE == "off" or (op.pool.wx, w.stride[1], w.offset[1], self.Wo) == \
                (1, 1, 0, self.W):
            return
        sy, wy = w.stride[0], op.pool.wy
        rows, tmp = (self.OB - 1) * sy + wy, "f32" if op.pool.op == "add" else self.x3.dtype
        xsegs = segments(self.Wo, w.offset[1], w.stride[1], op.pool.wx, self.W)
        y_pass = (wy, sy, w.offset[0]) != (1, 1, 0)
        tt, red, cut, share = reduce_costs(op, self.x3.dtype if not op.relu else "f32", tmp, self.o3.dtype, rows,
                                           self.OB, self.Wo, xsegs, y_pass)
        if knobs.REDUCE == "on" or red < tt:
            self.reduce_x, self.x_cut, self.y_share = True, cut / rows, share if y_pass else None
            if op.pool.op == "add" and self.G == 1 and self.chip is None and not op.relu and knobs.TENSOR_ROWS != 0 \
                    and knobs.PSUM != "off":  # (the share goes through PSUM)
                self.choose_share(rows, xsegs, y_pass, tmp, red)

    def choose_share(self, rows: int, xsegs: list[Segment], y_pass: bool, tmp: str, red: float) -> None:
        """How many of a band's input rows TensorE sums along x beside the vector engines (`tensor_rows`): the k
        whose busiest engine (TensorE, ScalarE with its evictions and the band's scale, or the vector engines'
        passes over the other rows: reduce_costs) is least, when it beats the vector engines alone by more than
        the identity matrix's set-up; candidates up to half the rows, every rows // 16 (the estimate is a double
        loop per candidate). knob TENSOR_ROWS: None (the costs decide), 0 (off), or the rows."""
        op, w = self.op, self.w
        x, n, wo = self.x3.dtype, self.OB, self.Wo
        spans = [sum(g.size for g in xsegs if t in g.taps) for t in range(op.pool.wx)]
        spans = [size for size in spans if size]
        if wo not in spans:  # no tap every output has, to start the PSUM accumulation over all of them
            return
        scaled = n * wo if op.pool.scale != 1.0 or w.count == "inside" else 0  # the 1 / count, on ScalarE
        best: tuple[float, int, float, float] = (red, 0, self.x_cut * rows, (self.y_share or 0.0) * n)
        ks = [knobs.TENSOR_ROWS] if knobs.TENSOR_ROWS is not None else range(1, rows // 2 + 1, max(1, rows // 16))
        for k in ks:
            _, vec, cut, share = reduce_costs(op, x, tmp, self.o3.dtype, rows - k, n, wo, xsegs, y_pass)
            tensor, scalar = tensor_rows_costs(x, k, wo, spans, scaled)
            best = min(best, (max(vec, held(tensor, max(vec, scalar)), scalar), k, cut, share * n))
        tiles = self.B // self.plan.tile_b
        bands = tiles * -(-w.out[0] // self.OB)
        if knobs.TENSOR_ROWS is None and (tiles < knobs.PEEL_TILES or (red - best[0]) * bands <=
                                          identity_ns(DTYPE_BYTES[x])):
            # with few tiles the first one's pass along x waits for the identity and TensorE's warm-up, on the
            # kernel's path (measured, model, f32 batch 1, 2 tiles: avgpool 3x3 s1 11.10 -> 11.73 us, 5x5 s1
            # 14.93 -> 16.28)
            return
        if best[1]:
            self.share_rows = best[1]
            self.x_cut, self.y_share = best[2] / (rows - best[1]), best[3] / n if y_pass else None

    def peeled(self, tiles: int, note: str, line: int) -> list[Stmt]:
        """The partition-tile loop of a pool through PSUM with its first tile from SBUF (both passes shared between
        VectorE and GpSimdE: they start as soon as its rows arrive, while TensorE's identity is built and its first
        chunk is copied) and its last tile's pass along y shared (GpSimdE alone takes it in the other tiles, and VectorE
        would idle at the end); [] when the three bodies' buffers take more than 1 / PEEL_SBUF_PART of SBUF (the rest
        is left to the kernel's other operations)."""
        chosen = self.psum, self.y_share, self.taps
        self.psum, self.y_share, self.taps = None, None, False
        self.first_tile = chosen[2]  # (before TensorE's taps: ScalarE's evictions of the next tile are next)
        first = at_value(self.tile_body(), "pb", 0)
        self.first_tile = False
        self.psum, self.y_share, self.taps = chosen
        half = (tiles - 2) // 2
        if self.full_rows_n and self.taps and half >= 2:
            # the middle tiles in two halves, a tile of each per step: each body's allocations are their own sites,
            # so Y's band rotates through four buffers, and a tile's band does not wait for the store of the tile
            # two before to be acknowledged (with TensorE's whole windows the pass along y no longer sets the pace)
            body = shifted(self.tile_body(), "pb", 1) + shifted(self.tile_body(), "pb", 1 + half)
            middle = loop("pb", half, body, line=line,
                          note=note + f", from the second: tiles 1 + pb and 1 + pb + {half} per step")
            middle += at_value(self.tile_body(), "pb", tiles - 2) if (tiles - 2) % 2 else []
        else:
            middle = loop("pb", tiles - 2, shifted(self.tile_body(), "pb", 1), note=note + ", from the second",
                          line=line)
        self.y_share, self.last_tile = None, True
        last = at_value(self.tile_body(), "pb", tiles - 1)
        self.y_share, self.last_tile = chosen[1], False
        nest = [ir.Block("the first channel-row tile from SBUF (TensorE's identity is not ready yet)", tuple(first),
                         line), *middle,
                ir.Block("the last channel-row tile, its pass along y on VectorE and GpSimdE (both free by then)",
                         tuple(last), line)]
        return nest if passes.peak_usage(tuple(nest))[0] <= sbuf_budget(compiled()) // knobs.PEEL_SBUF_PART else []

    def tile_body(self) -> list[Stmt]:
        """Every band of one partition tile (loop variable pb), in the form self.psum / self.y_share say."""
        op, OB = self.op, self.OB
        sy, oy = self.w.stride[0], self.w.offset[0]
        wy = op.pool.wy
        nb = -(-self.Rb // OB)

        def regular(k: int) -> bool:  # a whole band inside X in every block: the band loop's body
            first, last = k * OB * sy + oy, self.starts[-1] * sy + k * OB * sy + oy
            return (k < nb - 1 or self.Rb % OB == 0) and first >= 0 and last + (OB - 1) * sy + wy <= self.H \
                and k * OB >= self.overlap
        regs = [k for k in range(nb) if regular(k)]
        body: list[Stmt] = []
        self.tile_out = None
        if self.G > 1 and nb > 1 and not self.row0 and knobs.BLOCK_STORES and self.block_stores(nb):
            self.tile_out = Buf(self.name(f"{op.out}_tile", (self.Rb,)), "sbuf", self.o3.dtype,
                                (self.plan.tile_b * self.G, self.Rb, self.Wo))
            body.append(Alloc(self.tile_out, line=op.line))
        image = self.image_rows()
        if image and self.image_estimate(self.image_bands()) >= self.bands_estimate(self.tile_out is not None):
            image = 0  # (the estimates of both forms from the model's costs: pool_image.pipeline)
        if image:
            self.tile_out = None
            return self.image_body(image)
        k0, k1 = (regs[0], regs[-1] + 1) if regs else (nb, nb)
        for k in range(k0):
            body += self.band(k, a(k * OB), OB if k < nb - 1 else self.Rb - k * OB, None)
        if k1 > k0:
            o0 = Aff((term("yb", OB, "BAND"),), k0 * OB)
            lo = Aff((term("yb", OB * sy),), k0 * OB * sy + oy)
            body += loop("yb", k1 - k0, self.band(k0, o0, OB, lo), note=f"for {dict(op.vars)['i']} (bands of BAND "
                         "rows)", line=op.line_of("i"))
        for k in range(k1, nb):
            body += self.band(k, a(k * OB), OB if k < nb - 1 else self.Rb - k * OB, None)
        if self.tile_out is not None:  # one store per block (the last block without the rows it redoes)
            P, G = self.plan.tile_b, self.G
            pb = sl(a(term("pb", P, "TILE_P")), P)
            one = self.one_store(a(0), self.Rb, self.tile_out, full(self.Rb))
            if one is not None:
                return body + one
            skip = [0] * (G - 1) + [self.overlap]
            body += [Dma(View(self.o3, (pb, Sl(a(self.starts[g] + skip[g]), self.Rb - skip[g]), full(self.Wo))),
                         View(self.tile_out, (sl(g * P, P), sl(skip[g], self.Rb - skip[g]), full(self.Wo))), op.line)
                     for g in range(G) if skip[g] < self.Rb]
        return body

    def block_stores(self, bands: int) -> bool:
        """Whether the blocks' rows are stored once per block after every band rather than per band. The model
        orders stores to one tensor whose HBM byte ranges interleave (tilec/perf/deps.py): each starts a DMA latency
        after the one before has moved its bytes, so per band the G blocks' stores cost bands * G latencies where
        once per block they cost G, after the last band's compute (the first band's stores would start after its
        compute instead); with the blocks evenly spaced a band's stores are one DMA (`one_store`): one latency.
        Once per block when the latencies it saves exceed the compute it waits for: the passes' combines of the
        bands after the first on VectorE and GpSimdE (tensor_tensor: 2 cycles per element, 1 on VectorE with every
        operand 16-bit; tilec/perf/costs.py)."""
        from tilec.perf.params import target_params
        prm = {name: value for name, value, _ in target_params(compiled().name).table()}
        (sy, sx), Wo = self.w.stride, self.Wo
        per_row = ((self.op.pool.wx - 1) * sy + self.op.pool.wy - 1) * Wo  # combined elements per output row
        # (sums: fp32 partials)
        half = self.x3.dtype in knobs.HALF and self.o3.dtype in knobs.HALF and self.op.pool.op != "add"
        rate = prm["vector_ghz"] / (1 if half else 2) + prm["gpsimd_ghz"] / 2  # elements per ns, both engines
        later = (self.Rb - self.OB) * per_row / rate
        fits = self.Rb * Wo * DTYPE_BYTES[self.o3.dtype] <= sbuf_budget(compiled()) // knobs.BLOCK_STORES_SBUF_PART
        stores = 1 if self.block_step() is not None else self.G  # a band's stores: one DMA for all blocks (one_store)
        return fits and (bands - 1) * stores * prm["dma_latency_ns"] > later

    def band(self, k: int, o0: Aff, n: int, lo_aff: Aff | None) -> list[Stmt]:
        """Output rows o0..o0+n of every partition tile (of every block): the input rows they read (lo_aff: a
        regular band's first row, affine in the band loop; None: a peeled band, clipped to X), the two passes, the
        store."""
        op, line, P, G, B = self.op, self.op.line, self.plan.tile_b, self.G, self.plan.tile_b
        (sy, sx), (oy, ox) = self.w.stride, self.w.offset
        first = k * self.OB * sy + oy
        if G == 1:
            lo, hi = max(first, 0), min(first + (n - 1) * sy + op.pool.wy, self.H)
        else:  # every block reads its whole window rows; rows outside X hold the identity (filled below)
            lo, hi = first, first + (n - 1) * sy + op.pool.wy
        rows = hi - lo
        pb = self.rows_of(P)
        xb = Buf(self.name(f"{op.src}_band", (rows,)), "sbuf", self.x3.dtype, (P * G, rows, self.W))
        ob = Buf(self.name(f"{op.out}_band", (n,)), "sbuf", self.o3.dtype, (P * G, n, self.Wo))
        obv = whole(ob)  # the band's output rows
        if self.tile_out is not None:
            ob = self.tile_out
            obv = View(ob, (full(P * G), Sl(o0, n), full(self.Wo)))
        out: list[Stmt] = []
        start = lo_aff if lo_aff is not None else a(lo)
        if G == 1 and self.chip is None:  # (an on-chip input's band is a view of its image: nothing to load)
            out += [Alloc(xb, line=line)]
            for r0, r1 in self.load_parts(rows):  # VectorE's rows of the pass along x first: it starts sooner
                out.append(Dma(View(xb, (full(P), sl(r0, r1 - r0), full(self.W))) if (r0, r1) != (0, rows) else
                               whole(xb), View(self.x3, (pb, Sl(start.plus(r0), r1 - r0), full(self.W))), line))
        elif G > 1:
            out += self.block_loads(xb, first, rows, lo_aff)
        out += [Alloc(ob, line=line)] if self.tile_out is None else []
        cur = whole(xb) if self.chip is None else \
            View(self.chip, (full(P), Sl(start.plus(a(term("pb", self.H))), rows), full(self.W)))
        if op.relu:
            rb = Buf(self.name(f"{op.src}_relu", xb.shape), "sbuf", "f32", xb.shape)
            out += [Alloc(rb, line=line), Act(whole(rb), cur, "relu", None, 1.0, line)]
            cur = whole(rb)
        tmp = "f32" if op.pool.op == "add" else cur.buf.dtype
        scale = op.pool.scale / (op.pool.wy * op.pool.wx if self.w.count == "inside" else 1)
        passes = []  # along x first (over every input row of the band), then along y over the x results
        if (op.pool.wx, sx, ox, self.Wo) != (1, 1, 0, self.W):
            passes.append((2, segments(self.Wo, ox, sx, op.pool.wx, self.W)))
        if (op.pool.wy, sy, first - lo, n) != (1, 1, 0, rows):
            passes.append((1, y_segments(n, first, sy, op.pool.wy, self.H // self.plan.images, self.plan.images,
                                         oy) if G == 1 else
                           [Segment(0, n, tuple(range(op.pool.wy)))]))
        if self.plan.images > 1:
            share = self.y_share if self.y_share is not None else vector_share(tmp, self.o3.dtype)
            self.stack_cut = round(n * share)
        folded = 1.0  # the scale TensorE's evictions apply (then none after the passes)
        counted = self.w.count == "inside" and self.psum is not None and self.taps
        if self.psum is not None and self.taps:
            folded, scale = scale, 1.0
        for i, (axis, segs) in enumerate(passes):
            shape = (P * G, rows, self.Wo) if axis == 2 else (P * G, n, self.Wo)
            last = i == len(passes) - 1 and scale == 1.0 and (self.w.count != "inside" or counted)
            shift = ox if axis == 2 else first - lo
            stride, window = (sx, op.pool.wx) if axis == 2 else (sy, op.pool.wy)
            taps = axis == 2 and self.psum is not None and self.taps
            # a sum into 16-bit Y: the pass's partial sums stay fp32, only its last combine rounds (into Y's band);
            # count_include_pad=False through TensorE's taps: the outputs with fewer taps are scaled on the way there
            final = obv if last and op.pool.op == "add" and not taps and \
                ((ob.dtype in knobs.HALF and window > 2) or counted) else None
            dst = ob if last and final is None else \
                Buf(self.name(f"{op.out}_{'cols' if axis == 2 else 'rows'}", shape), "sbuf", tmp, shape)
            out += [] if dst == ob else [Alloc(dst, line=line)]
            dview = obv if dst == ob else whole(dst)
            block = self.full_block(segs, n) if axis == 1 and self.psum is not None and self.taps else None
            if taps:  # TensorE sums the taps, ScalarE evicts
                ahead = self.full_block(passes[1][1], n) if i + 1 < len(passes) and passes[1][0] == 1 else None
                out += self.tensor_x_pass(xb, dst, segs, stride, shift, window, folded, counted,
                                          ahead[1] if ahead is not None else 0)
            elif block is not None:  # TensorE sums whole windows for a block of rows, the pass along y the others
                m0, k = block
                out += self.full_rows(xb, ob, m0, k, shift, passes[0][1], folded, counted, self.shared_bank)
                parts = [part for part in (clip(segs, 0, m0), clip(segs, m0 + k, n)) if part]
                if knobs.PAIR_ENDS and counted and final is not None and len(parts) == 2 and \
                        all(len(g.taps) < window for g in parts[1]):
                    # only border rows after the whole ones: one pass over both sides, so that counted_pass sums
                    # and scales the two ends of a padding of one as one instruction each (not two)
                    out += self.counted_pass(cur, dview, final, axis, parts[0] + parts[1], stride, shift, window,
                                             None)
                else:
                    for part in parts:
                        out += self.window_pass(cur, dview, axis, part, stride, shift, window, final=final,
                                                counted=counted)
            elif axis == 2 and self.reduce_x and 0 < self.share_rows < rows and final is None:
                # TensorE sums the first rows, VectorE reduces the next ones, GpSimdE combines the last
                k = self.share_rows
                out += self.tensor_rows(cur, dview, segs, stride, shift, window, k)
                out += self.reduce_split(self._rows(cur, k, rows - k), self._rows(dview, k, rows - k), segs, stride,
                                         shift, window)
            elif axis == 2 and self.reduce_x:  # window reductions on VectorE, the last rows GpSimdE's combines
                out += self.reduce_split(cur, dview, segs, stride, shift, window, final)
            elif axis == 2 and self.psum is not None:  # X through PSUM: VectorE reads it at 1 cycle per element
                out += self.psum_x_pass(xb, cur, dst, segs, stride, shift, window, final)
            else:
                out += self.window_pass(cur, dview, axis, segs, stride, shift, window, final=final,
                                        counted=counted)
            cur = final or dview
        if cur.buf != ob and self.w.count == "inside":  # each region of the tile by its own count (ScalarE)
            out += self.count_regions(cur, ob, [g for axis, g in passes if axis == 1], [g for axis, g in passes
                                                                                       if axis == 2], scale)
        elif cur.buf != ob:
            out.append(Act(obv, cur, "copy", None, scale, line) if scale != 1.0 else Copy(obv, cur, line))
        if G == 1:
            return out + [Dma(View(self.o3, (pb, Sl(o0.plus(self.row0), n), full(self.Wo))), whole(ob), line)]
        if self.tile_out is not None:  # stored once per block after the bands (tile_body)
            return out
        return out + self.block_store(o0, n, ob, k * self.OB if lo_aff is None else None)

    def block_store(self, o0: Aff, n: int, ob: Buf, first: int | None) -> list[Stmt]:
        """A band's output rows o0..o0+n of every block from ob: one DMA (`one_store`) or one per block, the last
        block without the rows it redoes of the one before (first: the band's first row, a constant; None in the
        band loop, whose bands never reach them)."""
        one = self.one_store(o0, n, ob, full(n))
        if one is not None:
            return one
        P, G = self.plan.tile_b, self.G
        pb = self.rows_of(P)
        skip = [0] * (G - 1) + [max(0, self.overlap - first) if first is not None else 0]
        return [Dma(View(self.o3, (pb, Sl(o0.plus(self.starts[g] + skip[g]), n - skip[g]), full(self.Wo))),
                    View(ob, (sl(g * P, P), sl(skip[g], n - skip[g]), full(self.Wo))), self.op.line)
                for g in range(G) if skip[g] < n]

    def block_step(self) -> int | None:
        """The rows between one block's first output row and the next's when they are evenly spaced (always with
        two blocks), else None."""
        steps = {b - a for a, b in zip(self.starts, self.starts[1:])}
        return steps.pop() if len(steps) == 1 and min(steps) > 0 and knobs.ONE_BLOCK_DMA else None

    def one_store(self, o0: Aff, n: int, src: Buf, rows: Sl) -> list[Stmt] | None:
        """Output rows o0..o0+n of every block (src's rows `rows` on the G blocks' partitions) as a loop over the
        blocks of one equal DMA each, which dma_merge.py makes one DMA (the HBM side's blocks an access-pattern
        axis), else None. One DMA instead of G: one fixed cost, and no order between stores of one tensor whose
        HBM byte ranges interleave, which the model's default "range" rule (tilec/perf/deps.py) imposes one DMA
        latency apart (small20: an undocumented question on hardware that one DMA avoids). When the last block
        redoes rows of the one before (`overlap`: Ho not a multiple of G), those rows are written twice with the
        same values (both blocks compute them from the same input rows by the same instructions)."""
        step = self.block_step()
        if step is None:
            return None
        P = self.plan.tile_b
        dst = View(self.o3, (self.rows_of(P), Sl(o0.plus(a(term("gb", step), self.starts[0] + self.row0)), n),
                             full(self.Wo)))
        return loop("gb", self.G, [Dma(dst, View(src, (sl(a(term("gb", P)), P), rows, full(self.Wo))),
                                       self.op.line)], note="row blocks (one DMA: dma_merge)")

    def load_parts(self, rows: int) -> list[tuple[int, int]]:
        """A band's input rows in two loads, cut where the pass along x splits them between VectorE and GpSimdE
        (combine_shared), so each engine waits only for its own rows: in an Interleave (few channel rows, so
        one partition tile, whose first band's load the engines otherwise wait for whole); one load when that pass
        is not shared."""
        op = self.op
        if self.psum is not None:  # each PSUM copy waits only for its own rows
            return [(r0, min(r0 + self.psum, rows)) for r0 in range(0, rows, self.psum)]
        if self.reduce_x:  # the rows VectorE reduces first, then GpSimdE's
            cut = round(rows * self.x_cut)
            return [(0, cut), (cut, rows)] if 0 < cut < rows and self.split_loads else [(0, rows)]
        if (op.pool.wx, self.w.stride[1], self.w.offset[1], self.Wo) == (1, 1, 0, self.W) or \
                rows * self.Wo < knobs.SHARE_MIN or op.relu or not self.split_loads:
            return [(0, rows)]
        tmp = "f32" if op.pool.op == "add" else self.x3.dtype
        cut = round(rows * vector_share(self.x3.dtype, tmp))
        return [(0, cut), (cut, rows)] if 0 < cut < rows else [(0, rows)]

    def block_loads(self, xb: Buf, first: int, rows: int, lo_aff: Aff | None, at: int | None = None) -> list[Stmt]:
        """Block g's band rows onto partitions g*B..: one DMA for all blocks when their rows lie inside X and the
        blocks are evenly spaced (a loop over the blocks that dma_merge.py makes one DMA, as `one_store`), else one
        DMA each; a row outside X (only in a peeled band) holds the identity: 0 for a sum (`zero_rows`), rows of X
        for a max or min that every window reading the row also reads, so they never change the result
        (`pad_runs`: a run of them per DMA). at: xb is a block image (pool_image.py), allocated by the caller, and
        the rows go to its rows at.. (else xb is the band's buffer, allocated here)."""
        B, line, pad = self.plan.tile_b, self.op.line, []
        alloc, at = ([] if at is not None else [Alloc(xb, line=line)]), at or 0
        pb = sl(a(term("pb", B, "TILE_P")), B)
        step, sy = self.block_step(), self.w.stride[0]
        inside = all(0 <= first + g * sy and first + g * sy + rows <= self.H for g in self.starts)
        if step is not None and (lo_aff is not None or inside):  # a whole band inside X in every block: one DMA
            row0 = (lo_aff if lo_aff is not None else a(first)).plus(a(term("gb", step * sy), self.starts[0] * sy))
            blocks = View(self.x3, (pb, Sl(row0, rows), full(self.W)))
            return alloc + loop("gb", self.G, [Dma(View(xb, (sl(a(term("gb", B)), B), sl(at, rows), full(self.W))),
                                                   blocks, line)], note="row blocks (one DMA: dma_merge)")
        out: list[Stmt] = []
        for g in range(self.G):
            start = first + self.starts[g] * self.w.stride[0]
            lo, hi = max(start, 0), min(start + rows, self.H)
            src = lo_aff.plus(self.starts[g] * self.w.stride[0]) if lo_aff is not None else a(lo)
            part = sl(g * B, B)
            if hi > lo:  # (an image's last rows of a block may all lie outside X)
                out.append(Dma(View(xb, (part, sl(at + lo - start, hi - lo), full(self.W))),
                               View(self.x3, (pb, Sl(src, hi - lo), full(self.W))), line))
            if self.op.pool.op == "add":
                pad += [(part, at + r, 1, 0) for r in range(rows) if not lo <= r + start < hi]
            else:  # (rows of X a window reads anyway: pad_runs)
                w = self.w
                pad += [(part, at + r, n, q) for r, n, q in pad_runs(start, rows, self.H, self.op.pool.wy,
                                                                     w.stride[0], w.offset[0], w.out[0])]
        if pad and self.op.pool.op == "add":
            return alloc + self.zero_rows(xb, [(part, r, q) for part, r, _, q in pad]) + out
        return alloc + out + [Dma(View(xb, (part, sl(r, n), full(self.W))),
                                  View(self.x3, (pb, sl(q, n), full(self.W))), line) for part, r, n, q in pad]

    def zero_rows(self, xb: Buf, pad: list[tuple[Sl, int, int]]) -> list[Stmt]:
        """A sum's band rows outside X set to 0: a small zeroed tile, made once before the tiles (a memset per band
        took 0.17 us of VectorE each), copied by ScalarE into each run of such rows of a block. Zeroing the whole
        band instead (a memset of every row) made each of the band's loads wait for it: avgpool5x5s2 f32 batch 1
        in row blocks, a 3.6 us VectorE memset of 128 x 31 x 112 per band (model). SBUF -> SBUF DMAs instead of
        ScalarE's copies moved kernels both ways by up to 0.8 us (pool26's note), so not taken."""
        line, runs = self.op.line, list[tuple[Sl, int, int]]()
        for part, r, _ in pad:  # runs of consecutive rows of one block (pad lists them in order per block)
            if runs and runs[-1][0] == part and runs[-1][1] + runs[-1][2] == r:
                runs[-1] = (part, runs[-1][1], runs[-1][2] + 1)
            else:
                runs.append((part, r, 1))
        rows = max(n for _, _, n in runs)
        zero = Buf(self.name(f"{self.op.src}_zero", (rows,)), "sbuf", xb.dtype, (xb.shape[0], rows, self.W))
        self.once.setdefault(zero.name, Alloc(zero, zero=True, line=line))  # (read only: made once, in build)
        parts = dict.fromkeys((engine_part(part, xb.shape[0]), r, n) for part, r, n in runs)
        return [Act(View(xb, (p, sl(r, n), full(self.W))), View(zero, (p, sl(0, n), full(self.W))), "copy", None,
                    1.0, line) for p, r, n in parts]


def engine_part(part: Sl, P: int) -> Sl:
    """`part`, or all P partitions when an engine may not start an access of its size there (nki-spec §1.6: 33 to
    64 partitions start at 0 or 64, up to 32 at a multiple of 32): the copy then also zeroes other blocks' rows,
    which their loads (after it) overwrite."""
    start, n = part.start.const, part.size
    return part if start in ((0,) if n > 64 else (0, 64) if n > 32 else (0, 32, 64, 96)) else full(P)
