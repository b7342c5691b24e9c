"""The depthwise kernel's builder (see build_depthwise.py for the kernel's outline): weights as per-partition
columns, TensorE's diagonal matrices, then per channel group and tile of images the band (loaded in pieces of rows,
halos copied from a zero tile), chunks of output rows whose taps go to the engines `choose_routes` picked,
software-pipelined, evicted with the fused epilogue, and the stores; the grouped hybrid's own parts are in
depthwise_hybrid.py."""
from __future__ import annotations

from typing import Callable

from tilec.compiler import depthwise_hybrid as hy
from tilec.compiler import build_util, ir
from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.depthwise_layout import (DEPTH, DEPTH_BATCH, STORE_SPLIT, Layout, Routes, choose_routes,
                                             fan_in, hybrid, hybrid_routes, multiplier)
from tilec.compiler.ir import Act, Alloc, Binary, Buf, Dma, Matmul, Reshape, Scalar, Stmt, View, full
from tilec.compiler.ops import ConvOp
from tilec.compiler.schedule import PMAX
from tilec.target import compiled


class DepthwiseBuilder:
    def __init__(self, op: ConvOp, hbm: dict[str, Buf], fresh: Callable[[str], str], lay: Layout, pe: bool,
                 extra: Callable[[int], tuple[float, float, float]] | None = None, vector_evict: bool = False,
                 exact_evict: bool = False) -> None:
        self.extra = extra  # rows of a chunk -> the engines' other work per chunk (choose_routes)
        # relu6 without a bias evicted by one VectorE tensor_scalar (max 0, then min 6) instead of a VectorE clamp in
        # PSUM and a ScalarE eviction (the MobileNet block); `exact_evict`: the taps' routes count it so (at 16 bits)
        self.vector_evict = vector_evict
        self.exact_evict = exact_evict  # the routes count that eviction on VectorE (else on ScalarE, as before)
        from tilec.compiler.build_conv import conv_loop_vars
        self.op, self.hbm, self.fresh, self.line = op, hbm, fresh, op.line
        d = dict(op.dims)
        self.N, self.C, self.H, self.W = d["N"], d["C"], d["H"], d["W"]
        self.Ho, self.Wo, self.R, self.S = d["Ho"], d["Wo"], d["R"], d["S"]
        self.sy, self.sx = op.stride
        self.dy, self.dx = op.dilation
        self.oy, self.ox = op.offset
        self.pe, self.fp32, self.lay = pe, hbm[op.x].dtype == "f32", lay
        self.M = max(1, multiplier(op))  # outputs per input channel (each partition computes M output channels)
        self.CI = fan_in(op)  # inputs per output channel (each partition sums CI input channels' taps)
        self.C = self.C // self.CI  # the channels on the partitions
        # the hybrid (grouped conv, Cg == Kg): partitions hold output channels in (m, group) order per slot, the band
        # holds each one's group's input channels rotated, band[(m, g), j] = X[g*Kg + (m + j) % Kg], so that band
        # slot 0 over all partitions is every input channel once (TensorE's operand)
        self.HY = hybrid(op)
        if self.HY:
            self.CI, self.C = self.HY, d["K"]
            self.NG = lay.cg // self.HY  # conv groups per channel group
        self.depth = DEPTH_BATCH if self.N > 1 and not self.HY else DEPTH  # chunks in flight (`chunk`'s pipeline)
        self.m = 0  # the output channel of its input channel being built (M > 1)
        self.G, self.CR = self.C // lay.cg, self.C % lay.cg
        self.NT, self.NR = self.N // lay.k, self.N % lay.k  # whole tiles of images, images left over
        chunk_rows = {min(lay.rc, lay.rb - y0) for y0 in range(0, lay.rb, lay.rc)}
        self.pe_taps = max(self.routes(rows).pe for rows in chunk_rows)
        self.IR = (lay.rb - 1) * self.sy + (self.R - 1) * self.dy + 1  # input rows behind a row block
        self.IC = (self.Wo - 1) * self.sx + (self.S - 1) * self.dx + 1  # input columns behind a row
        # a padded read's column halo: skipped by the taps when two taps (the two sums' first) read no halo column
        self.clip = False
        if any(self.cols_halo()):
            self.clip = True
            full_taps = sum(1 for s in range(self.S) if self.tap_cols(s)[1] == self.Wo) * self.R
            self.clip = full_taps >= 2
        self.BC = min(self.W, self.ox + self.IC) - max(0, self.ox) if self.clip else self.IC
        self.var = conv_loop_vars(op, fresh)
        v = dict(op.vars)
        k = v.get("c" if multiplier(op) > 1 else "k", "c")  # the channel on the partitions
        self.names = {"k": k, "n": v.get("n", "n"), "y": v.get("y", "y")}
        self.gv, self.nv = fresh(f"{self.names['k']}_g"), fresh(f"{self.names['n']}_t")
        lines = dict(op.lines)
        self.L = {role: lines.get(role, op.line) for role in ("n", "k", "y", "update", "relu")}
        self.cn = {"cg": fresh("GROUP"), "k": fresh("IMAGES")}
        if self.HY:
            self.cn["ng"] = fresh("CONV_GROUPS")

    def routes(self, rows: int) -> Routes:
        if self.HY:
            return hybrid_routes(self.R * self.S, self.HY, rows * self.Wo, self.op.clamp is not None, self.fp32)
        return choose_routes(self.R * self.S * self.CI, rows * self.Wo, self.op.clamp is not None, self.pe,
                             self.fp32, self.extra(rows) if self.extra else (0.0, 0.0, 0.0), self.drain(),
                             self.evicts_on_vector() and self.exact_evict, self.split_evict())

    def drain(self) -> float:
        """The share of chunks whose ScalarE -> VectorE -> ScalarE chain is not hidden (choose_routes): the last of
        each output's pipeline (the MobileNet block pipelines its groups into each other: 0)."""
        return 0.0 if self.extra or self.CI > 1 else 1 / -(-self.lay.rb // self.lay.rc)

    def consts(self) -> list[tuple[str, int]]:
        ng = [(self.cn["ng"], self.NG)] if self.HY else []
        return [(self.cn["cg"], self.lay.cg), (self.cn["k"], self.lay.k)] + ng

    def build(self) -> list[Stmt]:
        from tilec.compiler.build_conv import hbm_view
        op, fresh, line, lay = self.op, self.fresh, self.line, self.lay
        mult = (self.M,) if self.M > 1 else ()  # output channel c*M + m seen as [c, m]
        if self.HY:  # channel g*Kg + j of X, W (output channel) and Y seen as [g, j]
            G, kg = self.C // self.HY, self.HY
            self.x4, s1 = hbm_view(self.hbm[op.x], (self.N, G, kg, self.H, self.W), fresh(f"{op.x}_v"), line)
            self.w4, s2 = hbm_view(self.hbm[op.w], (G, kg, kg, self.R, self.S), fresh(f"{op.w}_v"), line)
            self.o4, s3 = hbm_view(self.hbm[op.out], (self.N, G, kg, self.Ho, self.Wo), fresh(f"{op.out}_v"), line)
        else:
            self.x4, s1 = hbm_view(self.hbm[op.x], (self.N, self.C, self.H, self.W), fresh(f"{op.x}_v"), line)
            fan = (self.CI,) if self.CI > 1 else ()  # input channel k*CI + c of output channel k seen as [k, c]
            self.x4, s1 = hbm_view(self.hbm[op.x], (self.N, self.C) + fan + (self.H, self.W), fresh(f"{op.x}_v"),
                                   line)
            self.w4, s2 = hbm_view(self.hbm[op.w], (self.C,) + mult + fan + (self.R, self.S), fresh(f"{op.w}_v"),
                                   line)
            self.o4, s3 = hbm_view(self.hbm[op.out], (self.N, self.C) + mult + (self.Ho, self.Wo),
                                   fresh(f"{op.out}_v"), line)
        stmts: list[Stmt] = s1 + s2 + s3
        if op.bias and self.HY:
            self.b2, s4 = hbm_view(self.hbm[op.bias], (self.C // self.HY, self.HY), fresh(f"{op.bias}_v"), line)
            stmts += s4
        elif op.bias:
            self.b2, s4 = hbm_view(self.hbm[op.bias], (self.C, self.M if mult else 1), fresh(f"{op.bias}_v"), line)
            stmts += s4
        if self.has_halo():  # zeros for the bands' halos, copied in by DMA (zero_halo)
            fan = (self.CI,) if self.CI > 1 else ()
            self.zeros = Buf(self.fresh(f"{op.x}_zeros"), "sbuf", self.hbm[op.x].dtype,
                             self.band_idx(PMAX, fan, self.IR, self.BC))
            stmts.append(Alloc(self.zeros, zero=True, line=line))
        if self.pe_taps:
            stmts.append(ir.Block("identity matrix (the diagonal weights of TensorE's taps are scaled copies of it)",
                                  tuple(self.identity()), line))
        k = self.names["k"]
        tensors = op.w + (f" and {op.bias}" if op.bias else "")
        stmts.append(ir.Block(f"{tensors}: each {k}'s weights as fp32 columns (one per tap) on every "
                              f"{self.slot_word()}'s partitions", tuple(self.weights()), line))
        diags = self.diagonals(scalar=None)  # VectorE and ScalarE by turns: the first taps wait for half
        if diags and self.HY:
            stmts.append(ir.Block(f"{op.w}[g*{self.HY} + m, m', r, s] at row m'*{self.NG} + g, column m*{self.NG} + g "
                                  "(TensorE's positions): identity blocks summed, scaled", tuple(diags), line))
        elif diags:
            stmts.append(ir.Block(f"diag({op.w}[{k}, r, s]) for the taps TensorE runs: the identity scaled per "
                                  "partition", tuple(diags), line))
        blocks = f", {lay.nb} blocks of {lay.rb} rows per image" if lay.nb > 1 else ""
        note = f"for {k} (groups of {self.cn['cg']} channels{blocks})"
        c0 = a(term(self.gv, self.NG, self.cn["ng"])) if self.HY else a(term(self.gv, lay.cg, self.cn["cg"]))
        body = loop(self.gv, self.G, self.group(c0, lay.cg, "", a(self.gv)),
                    note=note,
                    line=self.L["k"])
        if self.CR:
            body += self.group(a(self.G * lay.cg), self.CR, "_rest", a(self.G))
        label = f"main: depthwise {op.name} (no sum over {k}), partitions hold ({self.slot_word()}, {k}) pairs"
        return stmts + [ir.Block(label, tuple(body), line)]

    def slot_word(self) -> str:
        """What one slot of partitions holds: an image, or a block of output rows of one."""
        return "row block" if self.lay.nb > 1 else "image"

    def identity(self) -> list[Stmt]:
        """I[p, q] = (p == q), f32, built on chip once per kernel (build_util.identity)."""
        self.ident, body = build_util.identity(self.fresh("ident"), "f32", self.line)
        return body

    def weights(self) -> list[Stmt]:
        """w_all[slot*CG + c, group, r, s] = W[group*CG + c, r, s] (the remainder group: its own slot width), all
        loaded before the main loop: small DMAs that lead their queues instead of waiting behind stores."""
        op, line, lay = self.op, self.line, self.lay
        images = min(lay.k, self.N)
        groups = self.G + (1 if self.CR else 0)
        mult = (self.M,) if self.M > 1 else ()  # a channel multiplier: every output channel of the input channel
        axis = mult or ((self.CI,) if self.CI > 1 else ())  # ... or every input channel of the output channel
        self.w_all = Buf(self.fresh(f"{op.w}_cols"), "sbuf", "f32",
                         (images * lay.nb * lay.cg, groups) + axis + (self.R, self.S))
        out: list[Stmt] = [Alloc(self.w_all, line=line)]
        if op.bias:
            self.b_all = Buf(self.fresh(f"{op.bias}_cols"), "sbuf", "f32", (images * lay.nb * lay.cg, groups) + mult)
            out.append(Alloc(self.b_all, line=line))
        gw = self.gw = self.fresh(f"{self.names['k']}_w")
        if self.HY and self.pe_taps:
            self.w_pe = Buf(self.fresh(f"{op.w}_pe_cols"), "sbuf", "f32",
                            (images * lay.nb * lay.cg, groups, self.HY, self.R, self.S))
            out.append(Alloc(self.w_pe, line=line))
        if self.HY:
            return out + loop(gw, self.G, hy.weights(self, a(gw), a(term(gw, self.NG, self.cn["ng"]))),
                              note=f"for {self.names['k']} (groups of {self.cn['cg']} channels)", line=line)

        def part(gi: ir.Aff, c0: ir.Aff, cg: int) -> list[Stmt]:
            body: list[Stmt] = []
            for j in range(images * lay.nb):  # every slot's partitions hold the group's weights
                ms = (full(axis[0]),) if axis else ()
                body.append(Dma(View(self.w_all, (sl(j * cg, cg), gi) + ms + (full(self.R), full(self.S))),
                                View(self.w4, (sl(c0, cg),) + ms + (full(self.R), full(self.S))), line))
                if op.bias:
                    body.append(Dma(View(self.b_all, (sl(j * cg, cg), gi, full(self.M)) if mult else
                                         (sl(j * cg, cg), sl(gi, 1))), View(self.b2, (sl(c0, cg), full(self.M))),
                                    line))
            return body
        out += loop(gw, self.G, part(a(gw), a(term(gw, lay.cg, self.cn["cg"])), lay.cg),
                    note=f"for {self.names['k']} (groups of {self.cn['cg']} channels)", line=line)
        if self.CR:
            out += part(a(self.G), a(self.G * lay.cg), self.CR)
        if op.w_relu is not None:  # `X * relu(Wd[c, r, s])`: the weight columns rectified once, after their loads
            wv = ir.whole(self.w_all)
            out.append(Act(wv, wv, "relu", line=line))
            out += [Scalar(wv, wv, "minimum", op.w_relu, line)] if op.w_relu != float("inf") else []
        return out

    def diagonals(self, scalar: bool | None = False) -> list[Stmt]:
        """d_all[:, group, i, :] = diag(w[:, tap i]) for TensorE's taps: the identity scaled per partition by the
        weight column, every group's before the main loop; `scalar`: on ScalarE (True), VectorE (False), or the two
        by turns (None: the first taps wait for half of them on each engine)."""
        taps = self.pe_taps_list()
        if not taps:
            return []
        op, line, lay, gw = self.op, self.line, self.lay, self.gw
        groups = self.G + (1 if self.CR else 0)
        parts = min(lay.k, self.N) * lay.nb * lay.cg
        self.d_all = Buf(self.fresh(f"{op.w}_diags"), "sbuf", self.hbm[op.x].dtype,
                         (parts, groups, self.M * len(taps), parts))
        if self.HY:
            return hy.diagonals(self, taps, parts, scalar)

        def part(gi: ir.Aff, p: int) -> list[Stmt]:
            def diag(dst: View, ident: View, w: View, on_scalar: bool) -> Stmt:  # ScalarE: a copy scaled per partition
                return Act(dst, ident, "copy", None, w, line) if on_scalar else Scalar(dst, ident, "multiply", w, line)
            out = []
            for m in range(self.M):  # (a channel multiplier: each output channel's taps, m-major)
                self.m = m
                out += [diag(View(self.d_all, (sl(0, p), gi, a(m * len(taps) + i), sl(0, p))),
                             View(self.ident, (sl(0, p), sl(0, p))), self.w_col(p, r, s, gi, c),
                             i % 2 == 1 if scalar is None else scalar)
                        for i, (c, r, s) in enumerate(taps)]
            return out
        out: list[Stmt] = [Alloc(self.d_all, line=line)]
        # the same, group by group (unrolled; the MobileNet block builds each group's before its taps)
        self.diag_groups = [part(a(g), parts) for g in range(self.G)] + (
            [part(a(self.G), min(lay.k, self.N) * lay.nb * self.CR)] if self.CR else [])
        out += loop(gw, self.G, part(a(gw), parts), note=f"for {self.names['k']} (groups of {self.cn['cg']} channels)",
                    line=line)
        if self.CR:
            out += part(a(self.G), min(lay.k, self.N) * lay.nb * self.CR)
        return out

    def tap_order(self, routes: list[str]) -> list[tuple[int, int, int]]:
        """The tap each route computes: the PSUM sum's first (route 0) and the GpSimdE sum's first write every
        output column (taps reading no halo column); the others in a fixed order, so that TensorE's taps are the
        same prefix in every chunk (their diagonal matrices are built once per group)."""
        taps = [(c, r, s) for c in range(self.CI) for r in range(self.R) for s in range(self.S)]  # c: fan_in
        if self.HY:  # TensorE's positions first (all input channels at once: c = -1), then the vector taps
            pe = routes.count("pe")
            head, taps = hy.positions(self, pe)
            routes = routes[pe:]
            if not routes:
                return head
        else:
            head = []
        whole = [t for t in taps if self.tap_cols(t[2])[1] == self.Wo][:2]
        rest = iter([t for t in taps if t not in whole] + whole[1:])
        g = routes.index("g") if "g" in routes and len(whole) > 1 else -1
        order = [whole[0] if i == 0 else whole[1] if i == g else next(rest) for i in range(len(routes))]
        return head + order

    def pe_taps_list(self) -> list[tuple[int, int, int]]:
        if self.HY:
            return hy.positions(self, self.pe_taps)[0]
        taps = self.R * self.S * self.CI
        return self.tap_order(["pe"] * self.pe_taps + ["sv"] * (taps - self.pe_taps))[:self.pe_taps]

    def w_col(self, parts: int, r: int, s: int, gi: ir.Aff | None = None, c: int = 0) -> View:
        """The current group's weight column of tap (r, s) (of output channel m of each input channel, for a
        multiplier; of input channel c, for a fan-in): the per-partition scale of a product."""
        wall, g = self.wsel if gi is None else (self.w_all, gi)
        axis = (a(self.m),) if self.M > 1 else (a(c),) if self.CI > 1 else ()
        return View(wall, (sl(0, parts), g) + axis + (a(r), sl(s, 1)))

    # ---- one channel group: its weights, then the images ------------------------------------------------------------

    def slots(self, images: int) -> list[tuple[int, int]]:
        """(image in the tile, row block) of each slot, in partition order."""
        return [(i, b) for i in range(images) for b in range(self.lay.nb)]

    def group(self, c0: ir.Aff, cg: int, tag: str, gi: ir.Aff) -> list[Stmt]:
        """`tag` names the buffers of a part whose shapes differ (the remainder group, images, chunk)."""
        op, lay = self.op, self.lay
        images = min(lay.k, self.N)
        parts = images * lay.nb * cg
        self.wsel = (self.w_all, gi)
        out: list[Stmt] = []
        bias = View(self.b_all, (sl(0, parts), sl(gi, 1))) if op.bias else None
        self.diags = {t: View(self.d_all, (sl(0, parts), gi, a(i), sl(0, parts)))
                      for i, t in enumerate(self.pe_taps_list())}
        note = f"for {self.names['n']} (tiles of {self.cn['k']} images)"
        n0 = a(term(self.nv, lay.k, self.cn["k"]))
        out += loop(self.nv, self.NT, self.tile(c0, cg, n0, lay.k, bias, tag), note=note, line=self.L["n"])
        if self.NR:
            out += self.tile(c0, cg, a(self.NT * lay.k), self.NR, bias, tag + "_last")
        return out

    def block_rows(self, b: int) -> tuple[int, int, int]:
        """(first input row, halo rows before, halo rows after) of row block b."""
        start = b * self.lay.rb * self.sy + self.oy
        return start, max(0, -start), max(0, start + self.IR - self.H)

    def cols_halo(self) -> tuple[int, int]:
        return max(0, -self.ox), max(0, self.ox + self.IC - self.W)

    def has_halo(self) -> bool:
        cols = any(self.cols_halo()) and not self.clip
        return cols or any(self.block_rows(b)[1:] != (0, 0) for b in range(self.lay.nb))

    def tap_cols(self, s: int) -> tuple[int, int, int]:
        """(first output column, output columns, first band column) tap column s reaches inside X: a padded read's
        taps skip the output columns whose input column is outside X (`clip`), instead of reading a zeroed halo."""
        col0 = s * self.dx + self.ox  # input column of output column 0
        if not self.clip:
            return 0, self.Wo, s * self.dx
        xa = max(0, -(col0 // self.sx)) if col0 < 0 else 0
        while xa < self.Wo and xa * self.sx + col0 < 0:
            xa += 1
        xb = self.Wo
        while xb > xa and (xb - 1) * self.sx + col0 > self.W - 1:
            xb -= 1
        return xa, xb - xa, xa * self.sx + col0 - max(0, self.ox)

    def zero_halo(self, band: Buf, cg: int, images: int) -> list[Stmt]:
        """The band's halo (rows and columns outside X) copied from the zero tile by DMA: a memset would wait in
        VectorE's or GpSimdE's in-order stream behind the previous tile's taps, and the loads behind it."""
        if not self.has_halo():
            return []
        line, parts, z = self.L["update"], band.shape[0], self.zeros
        regions: list[tuple] = []
        left, right = self.cols_halo() if not self.clip else (0, 0)
        for start, size in ((0, left), (self.IC - right, right)):
            if size:
                regions.append((sl(0, parts), full(self.IR), sl(start, size)))
        for j, (_, b) in enumerate(self.slots(images)):
            _, top, bottom = self.block_rows(b)
            for start, size in ((0, min(top, self.IR)), (self.IR - min(bottom, self.IR), min(bottom, self.IR))):
                if size:
                    regions.append((sl(j * cg, cg), sl(start, size), full(self.BC)))
        fan = (full(self.CI),) if self.CI > 1 else ()  # (every input channel of a fan-in)
        return [Dma(View(band, self.band_idx(idx[0], fan, *idx[1:])), View(z, self.band_idx(idx[0], fan, *idx[1:])),
                    line) for idx in regions]

    def band_idx(self, p, c: tuple, rows, cols) -> tuple:
        """A band's index (or shape) in its axis order: [partition, c (a fan-in's input channels), rows, cols]."""
        return (p,) + c + (rows, cols)

    def tile(self, c0: ir.Aff, cg: int, n0: ir.Aff, images: int, bias: View | None, tag: str
             ) -> list[Stmt]:
        op, line, lay = self.op, self.L["update"], self.lay
        parts = images * lay.nb * cg
        fan = (self.CI,) if self.CI > 1 else ()  # a fan-in: the input channels of each output channel
        band = Buf(self.fresh(f"{op.x}_band{tag}"), "sbuf", self.hbm[op.x].dtype,
                   self.band_idx(parts, fan, self.IR, self.BC))
        fs = tuple(full(f) for f in fan)
        left, right = self.cols_halo()
        out: list[Stmt] = [Alloc(band, line=line)] + self.zero_halo(band, cg, images)
        cols_src = sl(self.ox + left, self.IC - left - right)
        cols_dst = full(self.BC) if not (left or right) or self.clip else sl(left, self.IC - left - right)
        # the band's rows in pieces, one per chunk of output rows (the rows it reads first): a chunk's taps wait for
        # its own rows only, so the first chunk starts before the whole band is in (a fan-in's piece is one DMA per
        # input channel: one piece of rows of every input channel would span the others' bytes of the partition, and
        # the pieces would wait on each other)
        ends = sorted({min(self.IR, (y0 + min(lay.rc, lay.rb - y0) - 1) * self.sy + (self.R - 1) * self.dy + 1)
                       for y0 in range(0, lay.rb, lay.rc)})
        pieces = list(zip([0] + ends[:-1], ends))
        self.late: list[list[Stmt]] = []  # the hybrid's pieces after the first two, issued one per chunk (below)
        for k, (lo, hi) in enumerate(pieces):
            if self.HY and k >= 2:
                out, self.late = [], self.late + [out]
            for j, (i, b) in enumerate(self.slots(images)):
                start, top, bottom = self.block_rows(b)
                lo2, hi2 = max(lo, top), min(hi, self.IR - bottom)  # the piece's rows inside X
                if hi2 <= lo2:
                    continue
                whole = (lo2, hi2) == (0, self.IR)
                if self.HY:  # band[(m, g), j] = X[g*Kg + (m + j) % Kg]: a DMA per (m, j), so that a piece of rows
                    rows = full(self.IR) if whole else sl(lo2, hi2 - lo2)  # is one range of each partition's bytes
                    for m in range(self.HY):
                        for jj in range(self.HY):
                            out.append(Dma(View(band, (sl(j * cg + m * self.NG, self.NG), a(jj), rows, cols_dst)),
                                           View(self.x4, (n0.plus(i), sl(c0, self.NG), a((m + jj) % self.HY),
                                                          sl(start + lo2, hi2 - lo2), cols_src)), line))
                    continue
                rows = full(self.IR) if whole else sl(lo2, hi2 - lo2)
                # a fan-in's piece: one DMA per input channel, each a range of the partition's bytes of its own
                per_c: list[tuple[ir.Aff | ir.Sl, ...]] = [(a(c),) for c in range(self.CI)]
                for ci in (per_c if self.CI > 1 and not whole else [fs]):
                    out.append(Dma(View(band, (sl(j * cg, cg),) + ci + (rows, cols_dst)),
                                   View(self.x4, (n0.plus(i), sl(c0, cg)) + ci + (sl(start + lo2, hi2 - lo2),
                                                                                  cols_src)), line))
        if self.late:  # the hybrid: its 16 DMAs a piece are issued just ahead of the chunk reading them
            out, self.late = self.late[0], self.late[1:] + [out]
        self.allocated: set[Buf] = set()
        for m in range(self.M):  # a channel multiplier: the band's M output channels, one after another
            self.m = m
            if self.M > 1:
                gi = self.wsel[1]
                bias = View(self.b_all, (sl(0, parts), gi, sl(m, 1))) if op.bias else None
                taps = self.pe_taps_list()
                self.diags = {t: View(self.d_all, (sl(0, parts), gi, a(m * len(taps) + i), sl(0, parts)))
                              for i, t in enumerate(taps)}
            out += self.outputs(band, c0, cg, n0, images, bias, tag + (f"_m{m}" if self.M > 1 else ""))
        return out

    def outputs(self, band: Buf, c0: ir.Aff, cg: int, n0: ir.Aff, images: int, bias: View | None, tag: str
                ) -> list[Stmt]:
        """The band's output channel (of each input channel: self.m) computed chunk by chunk and stored."""
        op, line, lay = self.op, self.L["update"], self.lay
        parts = images * lay.nb * cg
        ob = Buf(self.fresh(f"{op.out}_band{tag}"), "sbuf", self.hbm[op.out].dtype, (parts, lay.rb, self.Wo))
        out: list[Stmt] = [Alloc(ob, line=line)]
        # chunks of output rows, software-pipelined: chunk i's taps are issued before chunk i-depth's eviction, so no
        # engine's in-order stream waits on the end of a chunk's GpSimdE sum; that chunk's final add (VectorE) comes
        # before chunk i's taps, so that VectorE does not hold it behind adds of products ScalarE has yet to make
        # while ScalarE waits for it to evict (not a fan-in's: its TensorE taps lead, see below)
        starts = list(range(0, lay.rb, lay.rc))
        pending: list[tuple[list[Stmt], list[Stmt]]] = []
        name = op.name + (f" (output {self.m} of each {self.names['k']})" if self.M > 1 else "")
        # a fan-in's many TensorE taps lead by one chunk: chunk i+1's matmuls are issued before chunk i's other
        # taps (a matmul cannot accumulate onto a sum VectorE wrote, so within a chunk they come first)
        lead = self.CI > 1
        early = self.CI == 1
        chunks = []
        for i, y0 in enumerate(starts):
            rows = min(lay.rc, lay.rb - y0)
            ctag = f"{tag}_{'abcde'[i % (self.depth + 1 + lead)]}" + ("" if rows == lay.rc else "_end")
            taps, finish = self.chunk(band, parts, y0, rows, ctag)
            head = 1 + next((k for k, st in enumerate(taps[1:]) if not isinstance(st, Matmul)), len(taps) - 1)
            chunks.append((y0, rows, ctag, taps[:head] if lead else [], taps[head:] if lead else taps, finish,
                           self.acc_view))
        for i, (y0, rows, ctag, head_taps, taps, finish, accv) in enumerate(chunks):
            dst = View(ob, (full(parts), sl(y0, rows), full(self.Wo)))
            span = f"{name} rows {y0}..{y0 + rows}"
            if i and self.late:  # the hybrid's band: chunk i+1's first rows, before its TensorE taps
                out.append(ir.Block(f"{op.x}: the band's rows for chunk {i + 1}", tuple(self.late.pop(0)), line))
            for k in ((0, 1) if i == 0 else (i + 1,)) if lead else ():
                if k < len(chunks):
                    y, r = chunks[k][:2]
                    out.append(ir.Block(f"{name} rows {y}..{y + r}: TensorE's taps", tuple(chunks[k][3]), line))
            due = pending.pop(0) if len(pending) == self.depth else ([], [])
            out += due[0] if early else []
            out += [ir.Block(f"{span}, {self.R * self.S * self.CI} taps: {self.taps_note(rows)}", tuple(taps), line)]
            out += due[1] if early else due[0] + due[1]
            if self.HY and i == len(chunks) - STORE_SPLIT and i >= self.depth:  # the rows evicted so far are stored
                out += hy.stores(self, ob, c0, n0, images, 0, chunks[i - self.depth + 1][0])  # while the last run
            epilogue = f" ({self.epilogue_note()})" if self.epilogue_note() else ""
            added: list[Stmt] = [ir.Block(f"{span}: the GpSimdE sum added into PSUM", tuple(finish), line)] \
                if finish else []
            pending.append((added, [ir.Block(f"{span}: evicted{epilogue}", tuple(self.evict(dst, accv, bias, ctag)),
                                             line)]))
        out += [s for p in pending for s in p[0] + p[1]]
        if self.HY:
            first = len(chunks) - STORE_SPLIT - self.depth + 1  # the first chunk stored at the end
            split = chunks[first][0] if len(chunks) - STORE_SPLIT >= self.depth else 0
            return out + hy.stores(self, ob, c0, n0, images, split, lay.rb)
        return out + self.stores(ob, c0, cg, n0, images)

    def stores(self, ob: Buf, c0: ir.Aff, cg: int, n0: ir.Aff, images: int) -> list[Stmt]:
        """The output band stored: partition (image, row block, channel) -> Y[n0 + image, c0 + channel, [m,] block's
        rows]. With row blocks of equal height an image's blocks are one DMA (ir.View.blocks: the blocks a leading
        axis of its HBM access pattern; the images too when the group is every channel), one DMA's fixed cost (nki-spec §2.5: ~1.3 us
        semaphore-to-start, ~600 ns issue) where a store per (row block, channel) paid it cg times per block. It
        writes one contiguous range of Y with one output per channel; with a multiplier, output m's range spans the
        other outputs' channels, which the model orders after m's store, issued a band earlier (no latency change:
        depthwise_mult3x3 f32 29.78 / 187.18 us, 266 -> 12 DMAs at b1). Otherwise one store per (row block,
        channel): a DMA of several blocks would span the shorter last block's rows, and the model orders that
        store behind it (tilec/perf/deps.py, the "range" rule; depthwise3x3 bf16 b1, 3 blocks of 19 rows, 20.58 ->
        22.44 us)."""
        lay, line = self.lay, self.L["update"]
        if self.Ho % lay.rb == 0:
            ms = (a(self.m),) if self.M > 1 else ()
            row = 2 + len(ms)  # Y's row axis in self.o4
            every = cg == self.C and images > 1 and self.M == 1  # the images' ranges join
            blocks: tuple[tuple[int, int, int], ...] = ((0, images, 1),) if every else ()
            blocks += ((row, lay.nb, lay.rb),) if lay.nb > 1 else ()
            return [Dma(View(self.o4, (n0.plus(i), sl(c0, cg)) + ms + (sl(0, lay.rb), full(self.Wo)), blocks=blocks),
                        View(ob, (sl(i * lay.nb * cg, (images if every else 1) * lay.nb * cg), full(lay.rb),
                                  full(self.Wo))), line)
                    for i in (range(1) if every else range(images))]
        return self.channel_stores(ob, c0, cg, n0, images)

    def channel_stores(self, ob: Buf, c0: ir.Aff, cg: int, n0: ir.Aff, images: int) -> list[Stmt]:
        """One store per slot, or with row blocks per (row block, channel): the stores issue in order, so
        consecutive ones go to different DMA engines (8 partitions each): channel e*8 + q of every block for e,
        then the next q."""
        lay, line = self.lay, self.L["update"]
        ms = (a(self.m),) if self.M > 1 else ()
        out: list[Stmt] = []
        if lay.nb == 1:
            for j, (i, b) in enumerate(self.slots(images)):
                valid = min(lay.rb, self.Ho - b * lay.rb)
                out.append(Dma(View(self.o4, (n0.plus(i), sl(c0, cg)) + ms + (sl(b * lay.rb, valid), full(self.Wo))),
                               View(ob, (sl(j * cg, cg), full(lay.rb) if valid == lay.rb else sl(0, valid),
                                         full(self.Wo))), line))
            return out
        ppe = PMAX // compiled().dma_engines
        qv, ev = self.fresh(f"{self.names['k']}_q"), self.fresh(f"{self.names['k']}_e")
        engines, q = (cg // ppe, a(qv)) if cg % ppe == 0 else (cg, a())
        for j, (i, b) in enumerate(self.slots(images)):
            valid = min(lay.rb, self.Ho - b * lay.rb)
            c = a(term(ev, ppe)).plus(q) if cg % ppe == 0 else a(ev)
            store = Dma(View(self.o4, (n0.plus(i), sl(c0.plus(c), 1)) + ms + (sl(b * lay.rb, valid), full(self.Wo))),
                        View(ob, (sl(c.plus(j * cg), 1), full(lay.rb) if valid == lay.rb else sl(0, valid),
                                  full(self.Wo))), line)
            out += loop(ev, engines, [store], note=f"one store per channel of row block {b}", line=line)
        if cg % ppe == 0:
            out = loop(qv, ppe, out, note=f"channel {self.names['k']}_e*{ppe} + {qv}: consecutive stores on "
                       "different DMA engines", line=line)
        return out

    # ---- one chunk of output rows: the taps, then the final add ----------------------------------------------------

    def chunk(self, band: Buf, parts: int, y0: int, rows: int, tag: str, psum: tuple[str, int] | None = None
              ) -> tuple[list[Stmt], list[Stmt]]:
        """(the taps into the PSUM accumulator self.acc_view, the add of the GpSimdE sum into it); `psum`: (tag,
        partitions) of a PSUM accumulator shared with chunks of more partitions (a group of fewer channels uses its
        first `parts` partitions)."""
        op, line = self.op, self.L["update"]
        rt = self.routes(rows)
        # the band's first reader picks the DMA queue its loads go on, the output's last writer the stores' queue:
        # keep them apart (a load waits behind the stores issued before it on its queue)
        first = "v" if self.evicts_on_scalar() else "s"
        shape = (parts, rows, self.Wo)
        whole = (full(parts), full(rows), full(self.Wo))
        ptag, pparts = psum if psum is not None else (tag, parts)
        acc = Buf(self.fresh(f"{op.name}_acc{ptag}"), "psum", "f32", (pparts, rows, self.Wo))
        accv = self.acc_view = View(acc, whole if pparts == parts else (sl(0, parts),) + whole[1:])
        # issue order (each engine runs its stream in order): VectorE's own taps first, then ScalarE's products
        # alternating between the GpSimdE and the VectorE sums, so that both adders are fed from the start
        g, sv = ["g"] * rt.g, ["sv"] * rt.sv
        mixed = [route for pair in zip(g, sv) for route in pair] + g[len(sv):] + sv[len(g):]
        routes = ["pe"] * rt.pe + ([first] if not rt.pe else []) + ["vv"] * rt.v + mixed
        # the two sums' first taps must write every output column: they take taps that read no halo column
        order = self.tap_order(routes)
        out: list[Stmt] = [Alloc(acc, zero=rt.pe > 0, line=line)]
        gacc: View | None = None
        products = 0
        for (c, r, s), route in zip(order, routes):
            xa, nx, bc = self.tap_cols(s)
            if nx == 0:  # a tap whose every input column is in the halo adds nothing (a 3x3 tap beside W = 1)
                continue
            part = (full(parts), full(rows), full(self.Wo) if nx == self.Wo else sl(xa, nx))
            window = View(band, self.band_idx(full(parts), (a(max(c, 0)),) if self.CI > 1 else (),
                                              sl(y0 * self.sy + r * self.dy, rows, self.sy), sl(bc, nx, self.sx)))
            w = self.w_col(parts, r, s, None, c)
            accp = View(acc, part if pparts == parts else (sl(0, parts),) + part[1:])
            if route == "pe":  # acc[p] += diag(w)[p, p] * window[p]
                out.append(Matmul(accp, self.diags[(c, r, s)], window, line))
                continue
            if route in ("s", "v"):  # the first tap starts the PSUM sum
                out.append(Act(accv, window, "copy", None, w, line) if route == "s" else
                           Scalar(accv, window, "multiply", w, line))
                continue
            if route == "g" and gacc is None:  # the first GpSimdE tap starts its SBUF sum
                gbuf = Buf(self.fresh(f"{op.name}_gacc{tag}"), "sbuf", "f32", shape)
                gacc = View(gbuf, whole)
                out += self.alloc_once(gbuf) + [Act(gacc, window, "copy", None, w, line)]
                continue
            # products rotate through the layout's buffers, shared by the tile's chunks of one tag (each product is
            # added before its buffer is written again)
            prod = Buf(self.fresh(f"{op.name}_prod{products % self.lay.products}{tag}"), "sbuf", "f32", shape)
            out += self.alloc_once(prod)
            products += 1
            pv = View(prod, part)
            out.append(Scalar(pv, window, "multiply", w, line) if route == "vv" else
                       Act(pv, window, "copy", None, w, line))
            if route == "g":
                assert gacc is not None
                gp = View(gacc.buf, part)
                out.append(Binary(gp, gp, pv, "add", line, engine="gpsimd"))
            else:
                out.append(Binary(accp, accp, pv, "add", line))
        finish: list[Stmt] = [Binary(accv, accv, gacc, "add", line)] if gacc is not None else []
        return out, finish

    def taps_note(self, rows: int) -> str:
        """Which engine computes how many of the chunk's taps (a comment for the kernel's reader): a sum's first tap
        writes it, every other product is added (VectorE into the PSUM sum, GpSimdE into its SBUF sum)."""
        rt = self.routes(rows)
        first = ("v" if self.evicts_on_scalar() else "s") if not rt.pe else ""
        scalar, vector = rt.sv + rt.g + (first == "s"), rt.v + (first == "v")
        engines = [f"TensorE {rt.pe}"] if rt.pe else []
        products = [f"ScalarE {scalar}"] if scalar else []
        products += [f"VectorE {vector}"] if vector else []
        adds = [f"VectorE {rt.sv + rt.v}"] if rt.sv + rt.v else []
        adds += [f"GpSimdE {rt.g - 1}"] if rt.g > 1 else []
        return ", ".join(engines + [f"products {' + '.join(products)}"] * bool(products) +
                         [f"adds {' + '.join(adds)}"] * bool(adds))

    def epilogue_note(self) -> str:
        """What the eviction applies to the sum, in the program's terms ("" for a plain copy)."""
        op = self.op
        words = ([f"+ {op.bias}"] if op.bias else []) + (["relu"] if op.relu else []) + \
            ([f"min(., {op.clamp:g})"] if op.clamp is not None else [])
        return ", ".join(words)

    def evicts_on_vector(self) -> bool:
        """Whether one VectorE instruction evicts (vector_evict: relu6 or a clamp without a bias or a scale)."""
        op = self.op
        return self.vector_evict and op.clamp is not None and op.bias is None and op.scale == 1.0 and \
            not self.narrow()

    def split_evict(self) -> bool:
        """Whether the routes may evict relu6 by ScalarE's relu into the 16-bit output and VectorE's min(., 6) on it
        (choose_routes' `split_evict`): the block's 16-bit relu6, whose evictions load VectorE most."""
        return self.evicts_on_vector() and self.exact_evict and self.op.relu and \
            self.hbm[self.op.out].dtype in ("bf16", "f16")

    def evicts_on_scalar(self) -> bool:
        """Whether ScalarE writes the output band last (its stores then go on ScalarE's DMA queue)."""
        # (a clamp in PSUM before the eviction: not before a negated product's sign)
        return not self.narrow() and (self.op.clamp is None or (self.op.bias is None and self.op.scale == 1.0))

    def alloc_once(self, buf: Buf) -> list[Stmt]:
        """The tile's SBUF temporaries are allocated at their first use in the tile and reused by its later chunks
        of the same tag (the SBUF budget counts every allocation statement)."""
        if buf in self.allocated:
            return []
        self.allocated.add(buf)
        return [Alloc(buf, line=self.L["update"])]

    def narrow(self) -> list[tuple[str, str]]:
        """(name, dtype) of the f16/bf16 tensors this fused op computes but never stores, in program order."""
        op = self.op
        chain = [nm for nm in (op.name,) + tuple(op.fused) if nm != op.out]
        return [(nm, self.hbm[nm].dtype) for nm in dict.fromkeys(chain)
                if nm in self.hbm and self.hbm[nm].dtype != "f32"]

    def evict(self, dst: View, acc: View, bias: View | None, tag: str, scalar: bool = False) -> list[Stmt]:
        """PSUM -> the output band: bias and relu on ScalarE, relu6's upper clamp on VectorE; f16/bf16 tensors the
        fusion never stores still round to their dtype in between (the program's meaning). `scalar`: the chunk's
        routes evict relu6 on ScalarE (`Routes.scalar_evict`)."""
        op, line = self.op, self.line
        func = "relu" if op.relu else "copy"
        narrow = self.narrow()
        if scalar:  # relu into the 16-bit output, then min(., 6) on it: rounding is monotonic and 6 exact, so the
            assert op.clamp is not None and dst.buf.dtype in ("bf16", "f16")  # same values as the one clamp
            return [Act(dst, acc, "relu", None, 1.0, line), Scalar(dst, dst, "minimum", op.clamp, line)]
        if self.evicts_on_vector():  # min(relu(z), 6) = min(max(z, 0), 6): both operators of one tensor_scalar
            assert op.clamp is not None
            return [clamp_evict(dst, acc, op.relu, op.clamp, line)]
        if self.evicts_on_scalar():  # relu6 without a bias: min(relu(z), 6) = relu(min(z, 6)), clamped in PSUM
            clamp: list[Stmt] = [Scalar(acc, acc, "minimum", op.clamp, line)] if op.clamp is not None else []
            return clamp + [Act(dst, acc, func, bias, op.scale, line)]
        if not narrow:  # relu6 with a bias: the clamp after the eviction (VectorE)
            assert op.clamp is not None  # evicts_on_scalar() covers every op without a clamp
            return [Act(dst, acc, func, bias, op.scale, line), Scalar(dst, dst, "minimum", op.clamp, line)]
        ev = Buf(self.fresh(f"{op.name}_act{tag}"), "sbuf", "f32", acc.buf.shape)
        src = View(ev, acc.idx)
        out: list[Stmt] = self.alloc_once(ev) + [Act(src, acc, func, bias, op.scale, line)]
        if op.clamp is not None:
            out.append(Scalar(src, src, "minimum", op.clamp, line))
        for name, dtype in narrow:
            tile = Buf(self.fresh(f"{name}_{dtype}{tag}"), "sbuf", dtype, ev.shape)
            out += self.alloc_once(tile) + [ir.Copy(View(tile, acc.idx), src, line)]
            src = View(tile, acc.idx)
        return out + [ir.Copy(dst, src, line)]


def clamp_evict(dst: View, acc: View, relu: bool, clamp: float, line: int) -> Stmt:
    """PSUM -> SBUF as min(relu(z), clamp) (or min(z, clamp)) by one VectorE tensor_scalar of two operators."""
    if relu:
        return Scalar(dst, acc, "maximum", 0.0, line, op1="minimum", value1=clamp)
    return Scalar(dst, acc, "minimum", clamp, line)
