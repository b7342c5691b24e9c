"""Loop-nest builder for a MobileNetV2 inverted residual block kept on chip: a 1x1 expand conv (C -> E channels,
relu6 fused), a "same" depthwise conv over its output (relu6 fused) and a 1x1 project conv (E -> C) that adds the
block's input:

    A[n, e, y, x] = relu6(sum_c We[e, c] * X[n, c, y, x])
    B[n, e, y, x] = relu6(sum_rs Wd[e, r, s] * A[n, e, y + r - R/2, x + s - S/2])      (A ?? 0 outside)
    Y[n, k, y, x] = X[n, k, y, x] + sum_e Wp[k, e] * B[n, e, y, x]

A and B never go to HBM. The partitions hold (row block, channel) pairs, the same layout in all three stages:

    X_ext[b*C + c, j, x] = X[n, c, b*RB - R/2 + j, x]     one DMA per row block, rows outside X are zeros
    for each group of GROUP expanded channels (a block-diagonal stationary per group, built once):
      A_pad[b*GROUP + e, j, x] = relu6(We_bd.T @ X_ext)    1x1 expand: one matmul per PSUM chunk covers every
                                                           row block; rows outside X come out 0 (no bias)
      B_all[b*GROUP + e, g, y, x] = relu6(depthwise taps of A_pad)   the depthwise kernel's chunks
                                                           (build_depthwise), taps split over the engines
    Y_acc[b*C + k, y, x] = sum over groups Wp_bd.T @ B_all[:, g, y, x]   1x1 project, one PSUM chunk at a time,
                                                           evicted with + X_ext (the residual, already on chip)
    Y[n, :, block b rows] = Y_band[b*C:(b+1)*C]            one DMA per row block

Block-diagonal weights: row block b's channels sit at partitions b*C.. of X_ext and b*GROUP.. of A, so the expand's
stationary is diag(We_g.T, ..., We_g.T) (nb blocks) and the project's diag(Wp_g.T, ...): one matmul serves every
row block. They are made by one PE transpose per group of a zeroed tile holding We_g (Wp_g) on its diagonal blocks.

`match` says whether three ops form such a block (else each op takes its own builder and A, B go through HBM;
`why_not` says why for `tilec explain`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Callable

from tilec.compiler import ir
from tilec.compiler.build_depthwise import DEPTH, PSUM_FP32, DepthwiseBuilder, Layout, choose_routes, plural
from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.ir import Act, Alloc, Binary, Buf, Dma, Matmul, Scalar, Stmt, Transpose, View, full
from tilec.compiler.ops import ConvOp
from tilec.compiler.schedule import PMAX
from tilec.target import Target

SBUF_SHARE = 0.75  # of the kernel's SBUF budget: the block's bands, A, every group's B and the weights
LAYOUT_TRIES = 6


@dataclass(frozen=True)
class BlockLayout:
    nb: int  # row blocks per image (on the partitions, beside the channels)
    rb: int  # output rows per block
    cg: int  # expanded channels per group


def _plain_1x1(op: ConvOp) -> bool:
    return (op.w_layout == "kc" and op.dim("R") == op.dim("S") == 1 and op.stride == (1, 1) and op.offset == (0, 0)
            and op.pool is None and not op.w_batch and not op.x_transposed and op.groups == 1
            and op.dim("Ho") == op.dim("H") and op.dim("Wo") == op.dim("W"))


def why_not(ops: tuple, i: int, hbm: dict[str, Buf], scheduled: AbstractSet[str], outputs: AbstractSet[str],
            reads: Callable[[object], list[str]]) -> str:
    """"" when ops[i:i+3] form a block this builder keeps on chip; else the reason (for `tilec explain`)."""
    if i + 2 >= len(ops) or not all(isinstance(o, ConvOp) for o in ops[i:i + 3]):
        return "not an expand -> depthwise -> project chain of three convs"
    e, d, p = ops[i:i + 3]
    if not _plain_1x1(e) or not _plain_1x1(p) or d.w_layout != "dw":
        return "not an expand 1x1 -> depthwise -> project 1x1 chain"
    if d.x != e.out or p.x != d.out or e.out != e.name or d.out != d.name:
        return "the depthwise conv does not read the expand conv's output, or the project conv the depthwise's"
    R, S = d.dim("R"), d.dim("S")
    if (d.stride, d.dilation) != ((1, 1), (1, 1)) or R % 2 == 0 or S % 2 == 0 or \
            d.offset != (-(R // 2), -(S // 2)) or (d.dim("Ho"), d.dim("Wo")) != (d.dim("H"), d.dim("W")):
        return "the depthwise conv is not a stride-1 'same' conv of odd window"
    if d.pool or d.residual or d.w_batch or d.bias_role != "k":
        return "the depthwise conv has a fused pool or residual"
    if e.bias or e.residual or p.bias or p.relu or p.clamp is not None or p.post_relu:
        return "the expand conv has a bias or residual, or the project conv an epilogue other than a residual add"
    if p.residual is not None and (p.residual != e.x or p.dim("K") != e.dim("C")):
        return "the project conv's residual is not the block's input"
    if e.dim("K") != d.dim("C") or d.dim("C") != p.dim("C") or d.dim("W") > PSUM_FP32:
        return "channel counts differ between the stages, or rows are wider than a PSUM bank"
    names = {o.name for o in (e, d, p)}
    if names & set(scheduled):
        return "a directive names one of its convs (each then follows its own schedule)"
    if {e.out, d.out} & set(outputs) or any(t in reads(o) for o in ops if o not in (e, d, p) for t in (e.out, d.out)):
        return "another op or the kernel's outputs read an intermediate"
    if d.dim("W") < 2:
        return "the image is one column wide"
    dtypes = {hbm[t].dtype for t in (e.x, e.w, d.w, p.w, e.out, d.out, p.out) + ((d.bias,) if d.bias else ())}
    if len(dtypes) != 1:
        return "its tensors have different dtypes"
    if e.dim("C") > PMAX or p.dim("K") > PMAX:
        return f"the block's input has more than {PMAX} channels"
    return ""


def layouts(e: ConvOp, d: ConvOp, p: ConvOp, elem: int) -> list[BlockLayout]:
    """Candidate layouts, best estimate first: per group pass, the busiest of TensorE (expand, project) and the
    other engines (the depthwise chunks' busiest engine, plus the evictions), times the passes."""
    from tilec.perf.params import target_params
    prm = {name: value for name, value, _ in target_params("trn2").table()}
    C, E, H, W = e.dim("C"), e.dim("K"), d.dim("H"), d.dim("W")
    K = p.dim("K")
    R, S = d.dim("R"), d.dim("S")
    rc = max(1, PSUM_FP32 // W)
    mm = prm["mm_fp32_factor"] if elem == 4 else 1
    found = []
    for nb in range(1, min(H, PMAX // max(C, K)) + 1):
        rb = -(-H // nb)
        if -(-H // rb) != nb:
            continue
        cg_max = min(E, PMAX // nb)
        groups = -(-E // cg_max)
        cg = -(-E // groups)
        chunks = [min(rc, rb - y0) for y0 in range(0, rb, rc)]
        xchunks = [min(rc, rb + R - 1 - y0) for y0 in range(0, rb + R - 1, rc)]
        taps = sum(choose_routes(R * S, r * W, True, False, elem == 4).ns for r in chunks)
        act = sum((max(prm["min_ii_cycles"], r * W) + prm["scalar_static_cycles"]) / prm["scalar_ghz"]
                  for r in xchunks)
        vec = sum((max(prm["min_ii_cycles"], r * W) + prm["vector_static_cycles"]) / prm["vector_ghz"]
                  for r in xchunks + chunks)  # the expand's clamp, the project's residual add
        pe = sum((max(prm["mm_min_cycles"], r * W) + prm["mm_fixed_cycles"]) * mm / prm["tensor_ghz"]
                 for r in xchunks + chunks)
        per_pass = max(taps + (act + vec) / 2, pe)
        found.append((groups * per_pass, nb, BlockLayout(nb, rb, cg)))
    found.sort(key=lambda f: f[:2])
    return [f[2] for f in found]


class BlockBuilder:
    def __init__(self, e: ConvOp, d: ConvOp, p: ConvOp, hbm: dict[str, Buf], fresh: Callable[[str], str],
                 lay: BlockLayout) -> None:
        self.e, self.d, self.p, self.hbm, self.fresh, self.lay = e, d, p, hbm, fresh, lay
        self.N, self.C, self.E, self.H, self.W = e.dim("N"), e.dim("C"), e.dim("K"), d.dim("H"), d.dim("W")
        self.K = p.dim("K")
        self.R, self.S = d.dim("R"), d.dim("S")
        self.IR = lay.rb + self.R - 1  # rows of A behind a block of output rows
        self.G, self.CR = self.E // lay.cg, self.E % lay.cg
        self.rc = max(1, PSUM_FP32 // self.W)
        self.dtype = hbm[e.x].dtype
        self.dw = DepthwiseBuilder(d, hbm, fresh, Layout(lay.cg, lay.nb, lay.rb, 1, self.rc), False)
        assert self.dw.clip and self.dw.BC == self.W and self.dw.IR == self.IR
        v = dict(d.vars)
        self.ename, self.nname = v.get("k", "e"), dict(e.vars).get("n", "n")
        self.gv, self.nv = fresh(f"{self.ename}_g"), fresh(f"{self.nname}_i")
        self.cn = fresh("GROUP")

    def consts(self) -> list[tuple[str, int]]:
        return [(self.cn, self.lay.cg)]

    # ---- once: the weights ----------------------------------------------------------------------------------------

    def block_diag(self, w: View, line: int, expand: bool) -> tuple[Buf, list[Stmt]]:
        """self.<name>[:, g, :] = diag(M.T, ..., M.T) (one block per row block) for M the group's slice of the
        weights: We[group's rows, :] (expand: cg x C) or Wp[:, group's columns] (project: K x cg). A zeroed tile
        gets M on its diagonal blocks by DMA, one PE transpose makes the stationary."""
        lay, nb = self.lay, self.lay.nb
        groups = self.G + (1 if self.CR else 0)

        def dims(cg: int) -> tuple[int, int]:  # (rows, columns) of the group's slice M
            return (cg, self.C) if expand else (self.K, cg)
        m_max, k_max = dims(lay.cg)
        bd = Buf(self.fresh(f"{w.buf.name}_bd"), "sbuf", w.buf.dtype, (nb * k_max, groups, nb * m_max))
        src = Buf(self.fresh(f"{w.buf.name}_blocks"), "sbuf", w.buf.dtype, (nb * m_max, nb * k_max))
        # a PE transpose is an identity matmul in transpose mode: bit-exact, the PSUM tile keeps the input dtype
        tp = Buf(self.fresh(f"{w.buf.name}_tp"), "psum", w.buf.dtype, (nb * k_max, nb * m_max))

        def part(gi: ir.Aff, e0: ir.Aff, cg: int) -> list[Stmt]:
            m, k = dims(cg)
            hsrc = View(w.buf, (sl(e0, cg), full(self.C))) if expand else View(w.buf, (full(self.K), sl(e0, cg)))
            body: list[Stmt] = [Alloc(src, zero=True, line=line)]
            body += [Dma(View(src, (sl(b * m, m), sl(b * k, k))), hsrc, line) for b in range(nb)]
            return body + [Alloc(tp, line=line),
                           Transpose(View(tp, (sl(0, nb * k), sl(0, nb * m))),
                                     View(src, (sl(0, nb * m), sl(0, nb * k))), "pe", line),
                           ir.Copy(View(bd, (sl(0, nb * k), gi, sl(0, nb * m))),
                                   View(tp, (sl(0, nb * k), sl(0, nb * m))), line)]
        out: list[Stmt] = [Alloc(bd, line=line)]
        wv = self.fresh(f"{self.ename}_w")
        out += loop(wv, self.G, part(a(wv), a(term(wv, lay.cg, self.cn)), lay.cg), line=line,
                    note=f"for {self.ename} (groups of {self.cn} channels)")
        if self.CR:
            out += part(a(self.G), a(self.G * lay.cg), self.CR)
        return bd, out

    def build(self) -> list[Stmt]:
        from tilec.compiler.build_conv import hbm_view
        e, d, p, fresh, lay = self.e, self.d, self.p, self.fresh, self.lay
        nb, line = lay.nb, e.line
        self.x4, s1 = hbm_view(self.hbm[e.x], (self.N, self.C, self.H, self.W), fresh(f"{e.x}_v"), line)
        self.o4, s2 = hbm_view(self.hbm[p.out], (self.N, self.K, self.H, self.W), fresh(f"{p.out}_v"), line)
        we, s3 = hbm_view(self.hbm[e.w], (self.E, self.C), fresh(f"{e.w}_v"), line)
        wp, s4 = hbm_view(self.hbm[p.w], (self.K, self.E), fresh(f"{p.w}_v"), line)
        self.dw.w4, s5 = hbm_view(self.hbm[d.w], (self.E, self.R, self.S), fresh(f"{d.w}_v"), d.line)
        stmts: list[Stmt] = s1 + s2 + s3 + s4 + s5
        if d.bias:
            self.dw.b2, s6 = hbm_view(self.hbm[d.bias], (self.E, 1), fresh(f"{d.bias}_v"), d.line)
            stmts += s6
        self.we_bd, prep = self.block_diag(ir.whole(we), e.line, True)
        stmts.append(ir.Block(f"{e.w} as block-diagonal stationaries (one {self.C} x {self.cn} block per row block)",
                              tuple(prep), e.line))
        stmts.append(ir.Block(f"{d.w}: each {self.ename}'s taps as fp32 columns on every row block's partitions",
                              tuple(self.dw.weights()), d.line))
        self.wp_bd, prep = self.block_diag(ir.whole(wp), p.line, False)
        stmts.append(ir.Block(f"{p.w} as block-diagonal stationaries (one {self.cn} x {self.K} block per row block)",
                              tuple(prep), p.line))
        self.zeros = Buf(fresh(f"{e.x}_zeros"), "sbuf", self.dtype, (nb * self.C, self.IR, self.W))
        stmts.append(Alloc(self.zeros, zero=True, line=line))
        note = f"for {self.nname} in 0..{self.N}"
        body = loop(self.nv, self.N, self.image(a(self.nv)), note=note, line=dict(e.lines).get("n", line))
        label = (f"main: {e.name} -> {d.name} -> {p.name} on chip, partitions hold (row block, channel) pairs: "
                 f"{plural(nb, 'block')} of {lay.rb} rows")
        return stmts + [ir.Block(label, tuple(body), line)]

    # ---- per image ------------------------------------------------------------------------------------------------

    def image(self, n: ir.Aff) -> list[Stmt]:
        e, d, p, lay, nb = self.e, self.d, self.p, self.lay, self.lay.nb
        C, top = self.C, self.R // 2
        line = e.line
        xe = Buf(self.fresh(f"{e.x}_ext"), "sbuf", self.dtype, (nb * C, self.IR, self.W))
        out: list[Stmt] = [Alloc(xe, line=line)]
        for b in range(nb):
            start = b * lay.rb - top
            lo, hi = max(0, start), min(self.H, start + self.IR)
            if lo > start:
                out.append(Dma(View(xe, (sl(b * C, C), sl(0, lo - start), full(self.W))),
                               View(self.zeros, (sl(b * C, C), sl(0, lo - start), full(self.W))), line))
            if hi < start + self.IR:
                rest = start + self.IR - hi
                out.append(Dma(View(xe, (sl(b * C, C), sl(self.IR - rest, rest), full(self.W))),
                               View(self.zeros, (sl(b * C, C), sl(self.IR - rest, rest), full(self.W))), line))
            if hi > lo:
                out.append(Dma(View(xe, (sl(b * C, C), sl(lo - start, hi - lo), full(self.W))),
                               View(self.x4, (n, full(C), sl(lo, hi - lo), full(self.W))), line))
        groups = self.G + (1 if self.CR else 0)
        b_all = Buf(self.fresh(f"{d.name}_all"), "sbuf", self.hbm[d.out].dtype, (nb * lay.cg, groups, lay.rb, self.W))
        out.append(Alloc(b_all, line=d.line))
        out += loop(self.gv, self.G, self.group(xe, b_all, a(self.gv), lay.cg, ""), line=d.line,
                    note=f"for {self.ename} (groups of {self.cn} channels)")
        if self.CR:
            out += self.group(xe, b_all, a(self.G), self.CR, "_rest")
        out += self.project(xe, b_all, n)
        return out

    def group(self, xe: Buf, b_all: Buf, gi: ir.Aff, cg: int, tag: str) -> list[Stmt]:
        e, d, lay, nb = self.e, self.d, self.lay, self.lay.nb
        parts = nb * cg
        apad = Buf(self.fresh(f"{e.out}_pad{tag}"), "sbuf", self.hbm[e.out].dtype, (parts, self.IR, self.W))
        out: list[Stmt] = [Alloc(apad, line=e.line)]
        # expand: A rows of every block at once (rows outside X read zeros: A is 0 there, the depthwise halo)
        ex: list[Stmt] = []
        for i, y0 in enumerate(range(0, self.IR, self.rc)):
            rows = min(self.rc, self.IR - y0)
            acc = Buf(self.fresh(f"{e.name}_acc{'ab'[i % 2]}"), "psum", "f32", (nb * lay.cg, rows, self.W))
            av = View(acc, (sl(0, parts) if parts < nb * lay.cg else full(parts), full(rows), full(self.W)))
            ex += [Alloc(acc, zero=True, line=e.line),
                   Matmul(av, View(self.we_bd, (full(nb * self.C), gi, sl(0, parts))),
                          View(xe, (full(nb * self.C), sl(y0, rows), full(self.W))), e.line)]
            ex += self.evict_expand(View(apad, (full(parts), sl(y0, rows), full(self.W))), av)
        out.append(ir.Block(f"{e.name} = {e.w} . {e.x} (1x1, all row blocks in one matmul per chunk), "
                            f"{self.epilogue(e)} on the eviction, into the depthwise band", tuple(ex), e.line))
        # depthwise: the depthwise kernel's chunks over the band, evicted into B_all[:, g]
        dw = self.dw
        dw.wsel = (dw.w_all, gi)
        dw.diags = {}
        dw.allocated = set()
        bias = View(dw.b_all, (sl(0, parts), sl(gi, 1))) if d.bias else None
        pending: list[list[Stmt]] = []
        for i, y0 in enumerate(range(0, lay.rb, self.rc)):
            rows = min(self.rc, lay.rb - y0)
            ctag = f"{tag}_{'abcd'[i % (DEPTH + 1)]}" + ("" if rows == self.rc else "_end")
            ptag = f"_{'abcd'[i % (DEPTH + 1)]}" + ("" if rows == self.rc else "_end")
            taps, finish = dw.chunk(apad, parts, y0, rows, ctag, (ptag, nb * lay.cg))
            span = f"{d.name} rows {y0}..{y0 + rows} of each block"
            out.append(ir.Block(f"{span}, {self.R * self.S} taps: {dw.taps_note(rows)}", tuple(taps), d.line))
            out += pending.pop(0) if len(pending) == DEPTH else []
            dst = View(b_all, (sl(0, parts), gi, sl(y0, rows), full(self.W)))
            pending.append([ir.Block(f"{span}: evicted ({dw.epilogue_note() or 'a copy'})", tuple(
                finish + dw.evict(dst, dw.acc_view, bias, ctag)), d.line)])
        out += [s for pend in pending for s in pend]
        return out

    def evict_expand(self, dst: View, acc: View) -> list[Stmt]:
        e, line = self.e, self.e.line
        if e.clamp is not None:  # min(relu(z), c) = relu(min(z, c)): the clamp in PSUM, relu on the eviction
            return [Scalar(acc, acc, "minimum", e.clamp, line), Act(dst, acc, "relu" if e.relu else "copy", None,
                                                                     1.0, line)]
        return [Act(dst, acc, "relu" if e.relu else "copy", None, 1.0, line)]

    @staticmethod
    def epilogue(op: ConvOp) -> str:
        if op.clamp is not None:
            return f"min(relu(.), {op.clamp:g})" if op.relu else f"min(., {op.clamp:g})"
        return "relu" if op.relu else "a copy"

    def project(self, xe: Buf, b_all: Buf, n: ir.Aff) -> list[Stmt]:
        p, lay, nb, line = self.p, self.lay, self.lay.nb, self.p.line
        K, top = self.K, self.R // 2
        yb = Buf(self.fresh(f"{p.out}_band"), "sbuf", self.hbm[p.out].dtype, (nb * K, lay.rb, self.W))
        out: list[Stmt] = [Alloc(yb, line=line)]
        for i, y0 in enumerate(range(0, lay.rb, self.rc)):
            rows = min(self.rc, lay.rb - y0)
            acc = Buf(self.fresh(f"{p.name}_acc{'ab'[i % 2]}"), "psum", "f32", (nb * K, rows, self.W))
            av = ir.whole(acc)
            body: list[Stmt] = [Alloc(acc, zero=True, line=line)]

            def mm(gi: ir.Aff, cg: int) -> list[Stmt]:
                return [Matmul(av, View(self.wp_bd, (sl(0, nb * cg), gi, full(nb * K))),
                               View(b_all, (sl(0, nb * cg), gi, sl(y0, rows), full(self.W))), line)]
            body += loop(self.gv, self.G, mm(a(self.gv), lay.cg), line=line,
                         note=f"for {self.ename} (groups of {self.cn} channels)")
            if self.CR:
                body += mm(a(self.G), self.CR)
            dst = View(yb, (full(nb * K), sl(y0, rows), full(self.W)))
            if p.residual:
                body.append(Binary(dst, av, View(xe, (full(nb * K), sl(top + y0, rows), full(self.W))), "add", line))
            else:
                body.append(Act(dst, av, "copy", None, 1.0, line))
            what = f" + {p.residual}" if p.residual else ""
            out.append(ir.Block(f"{p.name} rows {y0}..{y0 + rows} of each block = {p.w} . {self.d.name}{what}",
                                tuple(body), line))
        for b in range(nb):
            valid = min(lay.rb, self.H - b * lay.rb)
            if valid > 0:
                out.append(Dma(View(self.o4, (n, full(K), sl(b * lay.rb, valid), full(self.W))),
                               View(yb, (sl(b * K, K), sl(0, valid), full(self.W))), line))
        return out


def choose(ops: tuple, i: int, hbm: dict[str, Buf], target: Target) -> BlockLayout | None:
    """The best-estimated layout whose dry build fits the SBUF and PSUM budgets (None: none does)."""
    from tilec.compiler import passes
    from tilec.compiler.schedule import sbuf_budget
    e, d, p = ops[i:i + 3]
    elem = ir.DTYPE_BYTES[hbm[e.x].dtype]
    for lay in layouts(e, d, p, elem)[:LAYOUT_TRIES]:
        sbuf, psum = passes.peak_usage(tuple(BlockBuilder(e, d, p, hbm, lambda name: name, lay).build()))
        if sbuf <= sbuf_budget(target) * SBUF_SHARE and psum <= target.psum_banks:
            return lay
    return None


def build_block(ops: tuple, i: int, hbm: dict[str, Buf], fresh: Callable[[str], str], target: Target,
                scheduled: AbstractSet[str], outputs: AbstractSet[str], reads: Callable[[object], list[str]]
                ) -> tuple[list[tuple[str, int]], list[Stmt]] | None:
    """The block ops[i:i+3] built on chip (None: not such a block, or it does not fit; each op then takes its own
    builder)."""
    if why_not(ops, i, hbm, scheduled, outputs, reads):
        return None
    lay = choose(ops, i, hbm, target)
    if lay is None:
        return None
    b = BlockBuilder(*ops[i:i + 3], hbm, fresh, lay)
    stmts = b.build()
    return b.consts(), stmts
