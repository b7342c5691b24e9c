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

from dataclasses import dataclass, replace
from typing import AbstractSet, Callable

from tilec.compiler import build_util, ir
from tilec.compiler.build_conv import hbm_view
from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.depthwise_explain import plural
from tilec.compiler.depthwise_kernel import DepthwiseBuilder, clamp_evict
from tilec.compiler.depthwise_layout import DTYPE, PRODUCT_TRIES, PRODUCTS, PSUM_FP32, Layout, choose_routes
from tilec.compiler.ir import Act, Alloc, Binary, Buf, Dma, Matmul, Scalar, Stmt, Transpose, View, full
from tilec.compiler.named import name
from tilec.compiler.ops import ConvOp
from tilec.compiler.psum_share import shared_sums
from tilec.compiler.schedule import PMAX
from tilec.target import Target, compiled

SBUF_SHARE = 0.9  # of the kernel's SBUF budget (as counted by every allocation): the bands, A, B, the weights
LAYOUT_TRIES = 6
IMAGE_TRIES = (4, 2)  # images per pipeline, tried in order for each layout: a pipeline's end drains the engines
# (its last image's project waits for its last eviction, the next pipeline's first expand for that); bf16 b8 170.0 ->
# 158.0 us with 4 (8 did not fit SBUF); f32 b8 keeps 2 (4 does not fit its layout)
UNROLL_GROUPS = 8  # at most this many channel groups are unrolled as a software pipeline (else a loop of pairs)


@dataclass(frozen=True)
class BlockLayout:
    nb: int  # row blocks per image (on the partitions, beside the channels)
    rb: int  # output rows per block
    cg: int  # expanded channels per group
    products: int = PRODUCTS  # the depthwise taps' product buffers per chunk tag (choose: PRODUCTS_MORE if they fit)
    images: int = 2  # images per software pipeline (the loop body; choose: IMAGE_TRIES, the first that fits)


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
    if any(o.scale != 1.0 or o.w_relu is not None or o.epilogue for o in (e, d, p)):
        return "a conv of the chain is negated, rectifies its weights or has a fused element-wise epilogue"
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
    if e.residual or e.bias_role != "k" or p.bias or p.relu or p.clamp is not None or p.post_relu:
        return "the expand conv has a residual, or the project conv a bias or an epilogue other than a residual add"
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


def expand_on_vector(e: ConvOp) -> bool:
    """Whether the expand's eviction is one VectorE instruction (a clamp, no bias): else ScalarE's activation."""
    return e.clamp is not None and not e.bias


def layouts(e: ConvOp, d: ConvOp, p: ConvOp, elem: int) -> list[BlockLayout]:
    """Candidate layouts, best estimate first: per group pass, the busiest of TensorE (expand, project) and the
    other engines (the depthwise chunks' busiest engine, plus the evictions), times the passes."""
    from tilec.perf.params import target_params
    prm = {name: value for name, value, _ in target_params(compiled().name).table()}
    C, E, H, W = e.dim("C"), e.dim("K"), d.dim("H"), d.dim("W")
    K = p.dim("K")
    R, S = d.dim("R"), d.dim("S")
    rc = max(1, PSUM_FP32 // W)
    mm = prm["mm_fp32_factor"] if elem == 4 else 1
    found = []
    for nb in range(1, min(H, PMAX // max(C, K)) + 1):
        if H % nb:
            continue  # (Y's rows in HBM order on the partitions: one store)
        rb = H // nb
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
                 lay: BlockLayout, pe: bool = False) -> None:
        self.e, self.d, self.p, self.hbm, self.fresh, self.lay = e, d, p, hbm, fresh, lay
        self.N, self.C, self.E, self.H, self.W = e.dim("N"), e.dim("C"), e.dim("K"), d.dim("H"), d.dim("W")
        self.K = p.dim("K")
        self.R, self.S = d.dim("R"), d.dim("S")
        self.IR = lay.rb + self.R - 1  # rows of A behind a block of output rows
        self.G, self.CR = self.E // name(lay.cg, fresh("GROUP")), self.E % lay.cg  # SIZE_E // GROUP groups
        self.rc = max(1, PSUM_FP32 // self.W)
        self.dtype = hbm[e.x].dtype
        self.dw = DepthwiseBuilder(d, hbm, fresh, Layout(lay.cg, lay.nb, lay.rb, 1, self.rc, lay.products), pe,
                                   self.other_work, vector_evict=True, exact_evict=self.exact_costs())
        self.dw.allocated = set()  # the taps' SBUF products, allocated once, shared by the groups of a parity
        assert self.dw.clip and self.dw.BC == self.W and self.dw.IR == self.IR
        v = dict(d.vars)
        self.ename, self.nname = v.get("k", "e"), dict(e.vars).get("n", "n")
        self.gv, self.nv = fresh(f"{self.ename}_g"), fresh(f"{self.nname}_i")
        self.cn = fresh("GROUP")
        self.psum_overflow = False  # a pipeline's sums needed more PSUM tiles than banks (shared_sums)

    def other_work(self, rows: int) -> tuple[float, float, float]:
        """ns that TensorE, ScalarE and VectorE spend beside the depthwise taps per chunk of `rows` output rows, as
        the block builds them (the model's costs): a share of the group's expand matmuls and eviction (one VectorE
        clamp-and-evict, `expand_on_vector`, else ScalarE's activation and VectorE's clamp), the group's project
        matmuls, and with several images a share of the image's project evictions (a ScalarE copy, or VectorE's add
        of the residual) and TensorE's residual matmuls (`residual_on_pe`), which come once per image after its last
        group and overlap the next image's taps. With one image they run after every tap and are not counted
        (counted, 28x28 N=1 bf16 ran 12.60 -> 12.79 us, 56x56 27.35 -> 27.59)."""
        from tilec.perf.params import target_params
        prm = {name: value for name, value, _ in target_params(compiled().name).table()}
        mm = prm["mm_fp32_factor"] if self.dtype == "f32" else 1
        xchunks = [min(self.rc, self.IR - y0) for y0 in range(0, self.IR, self.rc)]
        chunks = [min(self.rc, self.lay.rb - y0) for y0 in range(0, self.lay.rb, self.rc)]
        share = rows / self.lay.rb

        def cost(rs: list[int], fixed: str, ghz: str, lo: str = "min_ii_cycles", factor: float = 1.0) -> float:
            return sum((max(prm[lo], r * self.W) + prm[fixed]) * factor / prm[ghz] for r in rs)
        pe = cost(xchunks + chunks, "mm_fixed_cycles", "tensor_ghz", "mm_min_cycles", mm)
        # at f32 the tally of dw20 (`exact_costs`): the expand's eviction charged to ScalarE
        act = 0.0 if expand_on_vector(self.e) and self.exact_costs() else \
            cost(xchunks, "scalar_static_cycles", "scalar_ghz")
        vec = cost(xchunks, "vector_static_cycles", "vector_ghz") if self.e.clamp is not None else 0.0
        if self.N > 1 and self.exact_costs():  # an image's project evictions, spread over its groups' chunks
            per_group = 1 / (self.G + (1 if self.CR else 0))
            vector_add = bool(self.p.residual) and not self.residual_on_pe()
            pe += self.residual_on_pe() * per_group * cost(chunks, "mm_fixed_cycles", "tensor_ghz", "mm_min_cycles")
            act += (not vector_add) * per_group * cost(chunks, "scalar_static_cycles", "scalar_ghz")
            vec += vector_add * per_group * cost(chunks, "vector_static_cycles", "vector_ghz")
        return pe * share, act * share, vec * share

    def exact_costs(self) -> bool:
        """Whether the taps' routes see every engine's other work as built (`other_work`, the depthwise eviction on
        VectorE): at 16 bits. At f32, where most taps are ScalarE products feeding VectorE/GpSimdE adds, the exact
        tally lets the per-chunk search load ScalarE fully and the model runs the products' chains slower
        (56x56 b1 44.54 -> 46.91 us, b8 305.70 -> 321.95): there the tally of dw20 stays, ScalarE charged the
        expand's and the depthwise's evictions it no longer does."""
        return self.dtype != "f32"

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
        # one zeroed tile per group (zeroed once): the groups' DMAs and transposes do not wait for each other
        src = Buf(self.fresh(f"{w.buf.name}_blocks"), "sbuf", w.buf.dtype, (nb * m_max, groups, nb * k_max))
        # a PE transpose is an identity matmul in transpose mode: bit-exact, the PSUM tile keeps the input dtype
        tp = Buf(self.fresh("weights_tp"), "psum", w.buf.dtype, (PMAX, PMAX))  # one PSUM bank for both

        def part(gi: ir.Aff, e0: ir.Aff, cg: int) -> list[Stmt]:
            m, k = dims(cg)
            hsrc = View(w.buf, (sl(e0, cg), full(self.C))) if expand else View(w.buf, (full(self.K), sl(e0, cg)))
            body: list[Stmt] = [Dma(View(src, (sl(b * m, m), gi, sl(b * k, k))), hsrc, line) for b in range(nb)]
            return body + [Alloc(tp, line=line),
                           Transpose(View(tp, (sl(0, nb * k), sl(0, nb * m))),
                                     View(src, (sl(0, nb * m), gi, sl(0, nb * k))), "pe", line),
                           ] + (
                [Act(View(bd, (sl(0, nb * k), gi, sl(0, nb * m))), View(tp, (sl(0, nb * k), sl(0, nb * m))),
                     "copy", None, 1.0, line)] if expand else
                # the project's output columns in (k, block) order: Y's partitions k*nb + b are then its rows in
                # HBM order (one load of the residual, one store)
                [Act(View(bd, (sl(0, nb * k), gi, sl(b, m, nb))), View(tp, (sl(0, nb * k), sl(b * m, m))),
                     "copy", None, 1.0, line) for b in range(nb)])
        out: list[Stmt] = [Alloc(bd, line=line), Alloc(src, zero=True, line=line)]
        # the same, group by group (unrolled): the allocations, then each group's part
        self.by_group = (list(out), [part(a(g), a(g * lay.cg), lay.cg) for g in range(self.G)] + (
            [part(a(self.G), a(self.G * lay.cg), self.CR)] if self.CR else []))
        wv = self.fresh(f"{self.ename}_w")
        out += loop(wv, self.G, part(a(wv), a(term(wv, lay.cg, self.cn)), lay.cg), line=line,
                    note=f"for {self.ename} (groups of {self.cn} channels)")
        if self.CR:
            # a loop of one iteration: its PSUM tile dies with it (PSUM holds the main loop's sums)
            rv = self.fresh(f"{self.ename}_r")
            out.append(ir.Loop(rv, 1, tuple(part(a(self.G), a(self.G * lay.cg), self.CR)), "static", line=line,
                               note=f"the last group of {self.CR} {self.ename} channels"))
        return bd, out

    def expand_bias(self) -> list[Stmt]:
        """be_all[b*cg + e, g] = bias[g*cg + e]: the expand's bias as a column on every row block's partitions."""
        e, lay, nb, line = self.e, self.lay, self.lay.nb, self.e.line
        assert e.bias
        groups = self.G + (1 if self.CR else 0)
        b2, out = hbm_view(self.hbm[e.bias], (self.E, 1), self.fresh(f"{e.bias}_v"), line)
        self.be_all = Buf(self.fresh(f"{e.bias}_cols"), "sbuf", "f32", (nb * lay.cg, groups))
        out.append(Alloc(self.be_all, line=line))
        for g in range(groups):
            cg = lay.cg if g < self.G else self.CR
            out += [Dma(View(self.be_all, (sl(b * cg, cg), sl(g, 1))), View(b2, (sl(g * lay.cg, cg), full(1))), line)
                    for b in range(nb)]
        return out

    def build(self) -> list[Stmt]:
        e, d, p, fresh, lay = self.e, self.d, self.p, self.fresh, self.lay
        nb, line = lay.nb, e.line
        self.x4, s1 = hbm_view(self.hbm[e.x], (self.N, self.C, self.H, self.W), fresh(f"{e.x}_v"), line)
        self.o4, s2 = hbm_view(self.hbm[p.out], (self.N, self.K, self.H, self.W), fresh(f"{p.out}_v"), line)
        we, s3 = hbm_view(self.hbm[e.w], (self.E, self.C), fresh(f"{e.w}_v"), line)
        wp, s4 = hbm_view(self.hbm[p.w], (self.K, self.E), fresh(f"{p.w}_v"), line)
        self.dw.w4, s5 = hbm_view(self.hbm[d.w], (self.E, self.R, self.S), fresh(f"{d.w}_v"), d.line)
        stmts: list[Stmt] = s1 + s2 + s3 + s4 + s5
        # Y and the residual seen as [K * nb, RB, W]: partition k*nb + b holds row block b of channel k
        self.o6, s6 = hbm_view(self.hbm[p.out], (self.N, self.K * nb, lay.rb, self.W), fresh(f"{p.out}_blocks"),
                               line)
        stmts += s6
        self.res: dict[str, Buf] = {}
        if p.residual:
            self.r6, s7 = hbm_view(self.hbm[p.residual], (self.N, self.K * nb, lay.rb, self.W),
                                   fresh(f"{p.residual}_blocks"), line)
            stmts += s7
        if d.bias:
            self.dw.b2, s6 = hbm_view(self.hbm[d.bias], (self.E, 1), fresh(f"{d.bias}_v"), d.line)
            stmts += s6
        self.we_bd, prep = self.block_diag(ir.whole(we), e.line, True)
        if e.bias:
            prep += self.expand_bias()
        stmts.append(ir.Block(f"{e.w} as block-diagonal stationaries (one {self.C} x {self.cn} block per row block)",
                              tuple(prep), e.line))
        after_we = len(stmts)
        stmts.append(ir.Block(f"{d.w}: each {self.ename}'s taps as fp32 columns on every row block's partitions",
                              tuple(self.dw.weights()), d.line))
        if self.dw.pe_taps:  # built on chip (two instructions), after the loads and stationaries it would delay
            stmts.append(ir.Block("identity matrix (the diagonal weights of TensorE's taps are scaled copies of it)",
                                  tuple(self.dw.identity()), d.line))
        diags = self.dw.diagonals(scalar=None)  # ScalarE and VectorE by turns (bf16 b1: 40.94 -> 38.09 us)
        what = f"diag({d.w}[{self.ename}, r, s]) for the taps TensorE runs: the identity scaled per partition"
        groups = self.G + (1 if self.CR else 0)
        self.diag_later: list[list[Stmt]] = []
        count = sum(map(len, self.dw.diag_groups)) if diags else 0  # diagonal matrices, every group's
        if diags and self.N == 1 and groups <= UNROLL_GROUPS and self.diags_outlast_load(count):
            # one image whose diagonals take longer than its first band's load: each group's just before its
            # expand, so the first taps wait for group 0's only (bf16 b1: 32.76 -> 31.05 us)
            self.diag_later = [[ir.Block(f"{what}, {self.ename} group {g}", tuple(part), d.line)]
                               for g, part in enumerate(self.dw.diag_groups)]
            diags = diags[:1]  # the allocation
        if diags:
            stmts.append(ir.Block(what, tuple(diags), d.line))
        self.wp_bd, prep = self.block_diag(ir.whole(wp), p.line, False)
        what = f"{p.w} as block-diagonal stationaries (one {self.cn} x {self.K} block per row block)"
        self.wp_prep: list[Stmt] = [ir.Block(what, tuple(prep), p.line)]
        allocs, parts = self.by_group
        self.wp_groups: list[list[Stmt]] = [
            [ir.Block(f"{what}, {self.ename} group {g}", tuple((allocs if g == 0 else []) + part), p.line)]
            for g, part in enumerate(parts)]
        if self.N > 1:  # right after the expand's: TensorE transposes both before its first expand, and the project's
            # loads and evictions then come before the depthwise weights' (bf16 b8 158.0 -> 156.6 us, f32 306.6 -> 305.7)
            stmts[after_we:after_we] = self.wp_prep
        top = self.R // 2  # rows of zeros above block 0 and below the last block (a full-size last block)
        self.zeros = Buf(fresh(f"{e.x}_zeros"), "sbuf", self.dtype,
                         (nb * (max(self.C, lay.cg) if e.bias else self.C), max(top, nb * lay.rb - self.H + top),
                          self.W))
        stmts.append(Alloc(self.zeros, zero=True, line=line))
        self.rid: Buf | None = None  # the residual's identity stationary (`residual_on_pe`)
        if self.residual_on_pe():
            self.rid, ident = build_util.identity(fresh("ident_res"), self.dtype, p.line)
            stmts.append(ir.Block(f"identity matrix ({p.residual} added into the project's sums by TensorE)",
                                  tuple(ident), p.line))
        # the project's PSUM sums, one per chunk of rows (one PSUM bank each)
        self.yacc = []
        for i, y0 in enumerate(range(0, lay.rb, self.rc)):
            rows = min(self.rc, lay.rb - y0)
            acc = Buf(fresh(f"{p.name}_acc{i}"), "psum", "f32", (self.K * nb, rows, self.W))
            self.yacc.append((acc, y0, rows))
        body = self.images()
        label = (f"main: {e.name} -> {d.name} -> {p.name} on chip, partitions hold (row block, channel) pairs: "
                 f"{plural(nb, 'block')} of {lay.rb} rows")
        return stmts + [ir.Block(label, tuple(body), line)]

    def diags_outlast_load(self, count: int) -> bool:
        """Whether building `count` diagonal matrices (ScalarE and VectorE by turns, each one instruction of a
        partition's width) takes longer than loading the first image's input band (a DMA latency + its bytes over
        the DMA engines of its partitions): the model's costs (spec §2.4, §2.5)."""
        from tilec.perf.params import target_params
        prm = {name: value for name, value, _ in target_params(compiled().name).table()}
        parts = self.lay.nb * self.lay.cg
        act = (max(prm["min_ii_cycles"], parts) + prm["scalar_static_cycles"]) / prm["scalar_ghz"]
        vec = (max(prm["min_ii_cycles"], parts) + prm["vector_static_cycles"]) / prm["vector_ghz"]
        build = max(act * (count // 2), vec * (count - count // 2))
        rows = self.lay.nb * self.C
        engines = min(prm["dma_engines"], -(-rows // prm["dma_partitions_per_engine"]))
        band = rows * self.IR * self.W * DTYPE[self.dtype]
        return build > prm["dma_latency_ns"] + band / (engines * prm["dma_engine_bw"])

    # ---- per image ------------------------------------------------------------------------------------------------

    def pipelined_groups(self) -> bool:
        """Whether the groups of an image are unrolled as one software pipeline (else a loop of pairs)."""
        return self.G + (1 if self.CR else 0) <= UNROLL_GROUPS

    def images(self) -> list[Stmt]:
        """Every image: one software pipeline over the groups of `lay.images` images at a time (an image's loads,
        expands and taps overlap the one before's last evictions); one image at a time when the groups are many."""
        seq = [(a(g), self.lay.cg) for g in range(self.G)] + ([(a(self.G), self.CR)] if self.CR else [])
        note = f"for {self.nname} in 0..{self.N}"
        line = dict(self.e.lines).get("n", self.e.line)
        if not self.pipelined_groups():
            return loop(self.nv, self.N, self.image(a(self.nv), seq), note=note, line=line)
        k = self.per_pipeline()
        tags = [f"_{chr(ord('a') + i)}" for i in range(k)]
        if self.N == 1:
            return self.pipelined([(a(0), tags[0])], seq)
        body = self.pipelined([(a(term(self.nv, k), i), tags[i]) for i in range(k)], seq)
        what = "pairs of images" if k == 2 else f"{k} images at a time"
        rest = self.N % k
        return loop(self.nv, self.N // k, body, note=f"{note} ({what})", line=line) + (
            self.pipelined([(a(self.N - rest + i), tags[i]) for i in range(rest)], seq) if rest else [])

    def per_pipeline(self) -> int:
        """Images per software pipeline (the loop body's)."""
        return max(1, min(self.N, self.lay.images))

    def image_start(self, n: ir.Aff, it: str) -> tuple[list[Stmt], Buf, Buf]:
        """The image's input band (with its zero halo rows), its residual, its B: (statements, X_ext, B_all)."""
        e, d, lay, nb = self.e, self.d, self.lay, self.lay.nb
        C, top = self.C, self.R // 2
        line = e.line
        xe = Buf(self.fresh(f"{e.x}_ext{it}"), "sbuf", self.dtype, (nb * C, self.IR, self.W))
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
                               View(self.zeros, (sl(b * C, C), sl(0, rest), full(self.W))), line))
            if hi > lo:
                out.append(Dma(View(xe, (sl(b * C, C), sl(lo - start, hi - lo), full(self.W))),
                               View(self.x4, (n, full(C), sl(lo, hi - lo), full(self.W))), line))
        out += self.residual(n, it)
        groups = self.G + (1 if self.CR else 0)
        b_all = Buf(self.fresh(f"{d.name}_all{it}"), "sbuf", self.hbm[d.out].dtype,
                    (nb * lay.cg, groups, lay.rb, self.W))
        out.append(Alloc(b_all, line=d.line))
        return out, xe, b_all

    def project_sums(self) -> list[Stmt]:
        """The project's PSUM sums, one per chunk of rows (each stays live while every group's B is added)."""
        return [Alloc(acc, zero=True, line=self.p.line) for acc, _, _ in self.yacc]

    def image(self, n: ir.Aff, seq: list[tuple[ir.Aff, int]]) -> list[Stmt]:
        """One image, its groups in a loop of pairs (the two A bands alternate)."""
        d, lay = self.d, self.lay
        out, xe, b_all = self.image_start(n, "")
        self.dw.allocated = set()
        out += self.project_sums()
        ga = self.group(xe, b_all, a(term(self.gv, 2)), lay.cg, "_a")
        gb = self.group(xe, b_all, a(term(self.gv, 2), 1), lay.cg, "_b")
        pair = ga[0] + ga[1] + gb[0] + ga[4] + gb[1] + ga[2] + ga[3] + gb[4] + gb[2] + gb[3]  # (as `pipelined`)
        if self.N == 1:
            out += self.wp_prep
        out += loop(self.gv, self.G // 2, pair, line=d.line,
                    note=f"for {self.ename} (pairs of groups of {self.cn} channels)")
        for k, (gi, cg) in enumerate(seq[self.G // 2 * 2:]):
            expand, taps, evicts, proj, added = self.group(xe, b_all, gi, cg, ("_a", "_b")[k])
            out += expand + taps + added + evicts + proj
        return out + self.project(n, "")

    def group(self, xe: Buf, b_all: Buf, gi: ir.Aff, cg: int, tag: str
              ) -> tuple[list[Stmt], list[Stmt], list[Stmt], list[Stmt], list[Stmt]]:
        """One group of expanded channels: its expand into a band of A, the depthwise taps over it into B_all[:, g];
        `tag` ("_a" | "_b") picks the band (and the PSUM sums) of alternate groups. (expand, taps, evictions, the
        project's matmuls, the GpSimdE sums' adds into PSUM)."""
        e, d, lay, nb = self.e, self.d, self.lay, self.lay.nb
        parts = nb * cg
        # the band of A (the depthwise input with its halo rows): a full group's size, a smaller group uses its
        # first partitions
        apad = Buf(self.fresh(f"{e.out}_pad{tag}"), "sbuf", self.hbm[e.out].dtype, (nb * lay.cg, self.IR, self.W))
        expand: list[Stmt] = [Alloc(apad, line=e.line)]
        # expand: A rows of every block at once (rows outside X read zeros: A is 0 there, the depthwise halo)
        ex: list[Stmt] = []
        for i, y0 in enumerate(range(0, self.IR, self.rc)):
            rows = min(self.rc, self.IR - y0)
            acc, av = self.mm_acc(i, parts, rows)
            ex += [Alloc(acc, zero=True, line=e.line),
                   Matmul(av, View(self.we_bd, (full(nb * self.C), gi, sl(0, parts))),
                          View(xe, (full(nb * self.C), sl(y0, rows), full(self.W))), e.line)]
            bias = View(self.be_all, (sl(0, parts), sl(gi, 1))) if e.bias else None
            ex += self.evict_expand(View(apad, (full(parts), sl(y0, rows), full(self.W))), av, bias)
        if e.bias:  # the bias made the rows outside X nonzero: the padding is 0 (from the zero tile, by DMA)
            for b in range(nb):
                start = b * lay.rb - self.R // 2
                for j0, j1 in ((0, min(self.IR, -start)), (max(0, self.H - start), self.IR)):
                    if j1 > j0:
                        idx = (sl(b * cg, cg), sl(j0, j1 - j0), full(self.W))
                        ex.append(Dma(View(apad, idx), View(self.zeros, (sl(b * cg, cg), sl(0, j1 - j0), full(self.W))),
                                      e.line))
        expand.append(ir.Block(f"{e.name} = {e.w} . {e.x} for {self.ename} group {ir.fmt_aff(gi)} (1x1, all row "
                               f"blocks in one matmul per chunk), {self.epilogue(e)} on the eviction, into the "
                               "depthwise band", tuple(ex), e.line))
        out: list[Stmt] = []
        # depthwise: the depthwise kernel's chunks over the band, evicted into B_all[:, g]
        dw = self.dw
        dw.wsel = (dw.w_all, gi)
        dw.diags = {t: View(dw.d_all, (sl(0, parts), gi, a(i), sl(0, parts)))
                    for i, t in enumerate(dw.pe_taps_list())}
        bias = View(dw.b_all, (sl(0, parts), sl(gi, 1))) if d.bias else None
        added: list[Stmt] = []
        evicts: list[Stmt] = []
        for i, y0 in enumerate(range(0, lay.rb, self.rc)):
            rows = min(self.rc, lay.rb - y0)
            # each chunk's PSUM sum and GpSimdE sum have names of their own: a group's sums are added and evicted
            # after its last chunk's taps (the SBUF products have the group's partitions)
            ptag = f"{tag}_{chr(ord('a') + i) if i < 26 else i}" + ("" if rows == self.rc else "_end")
            ctag = ptag + ("_rest" if cg < lay.cg else "")
            taps, finish = dw.chunk(apad, parts, y0, rows, ctag, (ptag, nb * lay.cg))
            span = f"{d.name} rows {y0}..{y0 + rows} of each block, {self.ename} group {ir.fmt_aff(gi)}"
            out.append(ir.Block(f"{span}, {self.R * self.S} taps: {dw.taps_note(rows)}", tuple(taps), d.line))
            dst = View(b_all, (sl(0, parts), gi, sl(y0, rows), full(self.W)))
            if finish:
                added.append(ir.Block(f"{span}: the GpSimdE sum added into PSUM", tuple(finish), d.line))
            evicts.append(ir.Block(f"{span}: evicted ({dw.epilogue_note() or 'a copy'}) into {b_all.name}", tuple(
                dw.evict(dst, dw.acc_view, bias, ctag, dw.routes(rows).scalar_evict)), d.line))
        p = self.p
        grp = f"{self.ename} group {ir.fmt_aff(gi)}"
        what = f"{p.name} += {p.w}[:, {grp}] . {d.name}[{grp}]"
        proj: list[Stmt] = [ir.Block(what, tuple(
            Matmul(ir.whole(acc), View(self.wp_bd, (sl(0, parts), gi, full(nb * self.K))),
                   View(b_all, (sl(0, parts), gi, sl(y0, rows), full(self.W))), p.line)
            for acc, y0, rows in self.yacc), p.line)]
        return expand, out, evicts, proj, added

    def pipelined(self, images: list[tuple[ir.Aff, str]], seq: list[tuple[ir.Aff, int]]) -> list[Stmt]:
        """The groups of the images unrolled as one software pipeline: group g+1's expand and taps are issued before
        group g's evictions (each engine runs its stream in order; the evictions wait for the GpSimdE sums), whose
        final adds come before group g+1's taps (VectorE would otherwise hold them behind adds of products ScalarE
        has yet to make, while ScalarE waits to evict: 41.96 -> 40.94 us at bf16, batch 1), the project's matmuls
        of a group two behind (TensorE never waits for an eviction); the A bands and PSUM sums
        alternate between even and odd groups. An image's project sums start at its first project matmuls, its
        eviction and store follow its last; the last image's project matmuls all come after its last eviction."""
        out: list[Stmt] = []
        self.dw.allocated = set()  # (a section of its own: its first groups allocate the products)
        parts: list[tuple[list[Stmt], list[Stmt], list[Stmt], list[Stmt], list[Stmt]]] = []
        first, last = {}, {}
        for n, it in images:
            pre, xe, b_all = self.image_start(n, it)
            out += pre  # every image's loads first (their own buffers)
            first[len(parts)] = self.project_sums()
            parts += [self.group(xe, b_all, gi, cg, ("_a", "_b")[(len(parts) + k) % 2])
                      for k, (gi, cg) in enumerate(seq)]
            last[len(parts) - 1] = self.project(n, it)

        final = max(first)  # the pipeline's last image: its project waits until its last group's eviction

        def project(k: int) -> list[Stmt]:
            if k < final:
                return first.get(k, []) + parts[k][3] + last.get(k, [])
            # the last image's project sums start at its last group (its project matmuls back to back): no image
            # follows in this pipeline, so its 2 PSUM banks stay free for the expand and depthwise sums until then
            # (f32 b1 50.55 -> 49.52 us, b8 349.60 -> 348.11; bf16 b1 32.34 -> 31.05, b8 219.41 -> 218.07); an
            # earlier image keeps its project a group behind its evictions (deferred, f32 b8: 349.60 -> 357.86)
            if k not in last:
                return []
            return first[final] + [st for j in range(final, k + 1) for st in parts[j][3]] + last[k]
        # one image: the project's weights group by group, each after its group's expand (every engine runs in
        # order: the first taps do not wait for all of them; 34.92 -> 32.76 us at bf16 batch 1, 50.70 -> 49.52
        # at f32, against all of them after the second group's expand)
        wp: list[list[Stmt]] = self.wp_groups if self.N == 1 and len(images) == 1 else [[] for _ in parts]
        dg: list[list[Stmt]] = self.diag_later if self.diag_later and len(images) == 1 else [[] for _ in parts]
        out += dg[0] + parts[0][0] + wp[0]
        for k in range(len(parts)):
            out += parts[k - 1][4] if k else []
            out += parts[k][1]
            if k + 1 < len(parts):
                out += dg[k + 1] + parts[k + 1][0] + wp[k + 1]
            if k:
                out += parts[k - 1][2]
            if k > 1:
                out += project(k - 2)
        for k in range(max(0, len(parts) - 2), len(parts)):
            out += (parts[k][4] + parts[k][2] if k == len(parts) - 1 else []) + project(k)
        # the sums share the PSUM banks as tiles allocated once and reused in program order: every reuse wait is a
        # true dependence (f32 b8 348.11 -> 317.91 us, bf16 b8 218.07 -> 188.69; a sum per allocation placed by
        # the model's rotation waited on banks other sums had just been given back)
        # (a pipeline followed by another in the same scope, the pairs before the last image, keeps a bank free:
        # NKI 0.1 holds a tile until its name is bound again, after the next tile of that name is allocated)
        k = self.per_pipeline()
        banks = compiled().psum_banks - (1 if len(images) == k > 1 and self.N % k else 0)
        out, tiles = shared_sums(out, banks, self.fresh)
        self.psum_overflow = self.psum_overflow or tiles > banks
        return out

    def mm_acc(self, i: int, parts: int, rows: int) -> tuple[Buf, View]:
        """The PSUM accumulator of the expand's chunks (one: PSUM holds the depthwise and project sums too)."""
        shape = (self.lay.nb * self.lay.cg, self.rc, self.W)
        acc = Buf(self.fresh(f"{self.e.name}_acc"), "psum", "f32", shape)
        part = full(parts) if parts == shape[0] else sl(0, parts)
        return acc, View(acc, (part, full(rows) if rows == self.rc else sl(0, rows), full(self.W)))

    def evict_expand(self, dst: View, acc: View, bias: View | None) -> list[Stmt]:
        e, line = self.e, self.e.line
        func = "relu" if e.relu else "copy"
        if bias is not None:  # min(relu(z + b), c): the bias and relu on the eviction, the clamp after it
            clamp: list[Stmt] = [Scalar(dst, dst, "minimum", e.clamp, line)] if e.clamp is not None else []
            return [Act(dst, acc, func, bias, 1.0, line)] + clamp
        if expand_on_vector(e):  # min(relu(z), c): one VectorE tensor_scalar of two operators
            assert e.clamp is not None
            return [clamp_evict(dst, acc, e.relu, e.clamp, line)]
        if e.clamp is not None:  # min(relu(z), c) = relu(min(z, c)): the clamp in PSUM, relu on the eviction
            return [Scalar(acc, acc, "minimum", e.clamp, line), Act(dst, acc, "relu" if e.relu else "copy", None,
                                                                     1.0, line)]
        return [Act(dst, acc, "relu" if e.relu else "copy", None, 1.0, line)]

    @staticmethod
    def epilogue(op: ConvOp) -> str:
        if op.clamp is not None:
            return f"min(relu(.), {op.clamp:g})" if op.relu else f"min(., {op.clamp:g})"
        return "relu" if op.relu else "a copy"

    def residual_on_pe(self) -> bool:
        """Whether TensorE adds the residual into the project's sums (one identity matmul each, 16-bit: the
        eviction is then a ScalarE copy instead of VectorE's add, VectorE being the busiest engine there); not at
        f32, where TensorE is the busiest (fp32 at the model's fp32 factor), nor for one image (the identity's build
        and the matmul at the very end: 56x56 27.59 -> 27.95 us, 14x14 8.84 -> 9.15)."""
        return bool(self.p.residual) and self.dtype != "f32" and self.N > 1

    def project(self, n: ir.Aff, it: str) -> list[Stmt]:
        """The project's sums evicted (+ the residual) into the Y band, one store."""
        p, lay, nb, line = self.p, self.lay, self.lay.nb, self.p.line
        K = self.K
        yb = Buf(self.fresh(f"{p.out}_band{it}"), "sbuf", self.hbm[p.out].dtype, (K * nb, lay.rb, self.W))
        out: list[Stmt] = [Alloc(yb, line=line)]
        res = self.res.get(it)
        if res is not None and self.rid is not None:  # sum += I . residual (bit-exact: 16-bit values into fp32)
            out.append(ir.Block(f"{p.name} += {p.residual} (an identity matmul per sum)", tuple(
                Matmul(ir.whole(acc), View(self.rid, (sl(0, K * nb), sl(0, K * nb))),
                       View(res, (full(nb * K), sl(y0, rows), full(self.W))), line) for acc, y0, rows in self.yacc),
                line))
            res = None
        for acc, y0, rows in self.yacc:
            dst = View(yb, (full(nb * K), sl(y0, rows), full(self.W)))
            if res is not None:
                ev: Stmt = Binary(dst, ir.whole(acc), View(res, (full(nb * K), sl(y0, rows), full(self.W))), "add",
                                  line)
            else:
                ev = Act(dst, ir.whole(acc), "copy", None, 1.0, line)
            what = f" + {p.residual}" if p.residual and self.rid is None else ""
            out.append(ir.Block(f"{p.name} rows {y0}..{y0 + rows} of each block: evicted{what}", (ev,), line))
        return out + [Dma(View(self.o6, (n, full(K * nb), full(lay.rb), full(self.W))), ir.whole(yb), line)]

    def residual(self, n: ir.Aff, it: str) -> list[Stmt]:
        """The project's residual (the block's input) in the project's (channel, row block) partition order: one
        DMA at the start of the image."""
        p, nb, line = self.p, self.lay.nb, self.p.line
        if not p.residual:
            return []
        res = self.res[it] = Buf(self.fresh(f"{p.residual}_skip{it}"), "sbuf", self.hbm[p.residual].dtype,
                                 (self.K * nb, self.lay.rb, self.W))
        return [Alloc(res, line=line),
                Dma(ir.whole(res), View(self.r6, (n, full(self.K * nb), full(self.lay.rb), full(self.W))), line)]


def choose(ops: tuple, i: int, hbm: dict[str, Buf], target: Target, usage: list | None = None
           ) -> tuple[BlockLayout, bool] | None:
    """The best-estimated layout whose dry build fits the SBUF and PSUM budgets (None: none does; `usage` gets
    (layout, SBUF bytes, PSUM banks) of each layout tried)."""
    from tilec.compiler import passes
    from tilec.compiler.schedule import sbuf_budget
    e, d, p = ops[i:i + 3]
    elem = ir.DTYPE_BYTES[hbm[e.x].dtype]
    n_img = e.dim("N")
    for pe in (True, False):
        for lay in [replace(base, products=n, images=k) for base in layouts(e, d, p, elem)[:LAYOUT_TRIES]
                    for n in PRODUCT_TRIES for k in dict.fromkeys(min(n_img, k) for k in IMAGE_TRIES)]:
            builder = BlockBuilder(e, d, p, hbm, lambda name: name, lay, pe)
            built = tuple(builder.build())
            # each buffer name holds one tile at a time (an allocation of the name again releases it, as the IR
            # verifier counts): the distinct names bound what is live
            tiles = {s.buf.name: s.buf for s in ir.walk(built) if isinstance(s, Alloc) and s.buf.memory != "hbm"}
            sbuf = passes.peak_usage(built)[0]  # (the kernel's capacity check counts every allocation)
            # the main loop's PSUM sums (a pipeline's: the tiles they share), and (groups in a loop) one bank for a
            # sum allocated again while its previous tile is live
            again = set() if builder.pipelined_groups() else {"(again)"}
            psum = {name for name, b in tiles.items() if b.memory == "psum" and name != "weights_tp"} | again
            if builder.psum_overflow:
                psum.add("(more sums live than banks)")
            if usage is not None:
                usage.append((lay, sbuf, len(psum)))
            if sbuf <= sbuf_budget(target) * SBUF_SHARE and len(psum) <= target.psum_banks:
                return lay, pe
    return None


def build_block(ops: tuple, i: int, hbm: dict[str, Buf], fresh: Callable[[str], str], target: Target,
                scheduled: AbstractSet[str], outputs: AbstractSet[str], reads: Callable[[object], list[str]]
                ) -> tuple[list[tuple[str, int]], list[Stmt]] | None:
    """The block ops[i:i+3] built on chip (None: not such a block, or it does not fit; each op then takes its own
    builder)."""
    if why_not(ops, i, hbm, scheduled, outputs, reads):
        return None
    chosen = choose(ops, i, hbm, target)
    if chosen is None:
        return None
    e, d, p = ops[i:i + 3]
    b = BlockBuilder(e, d, p, hbm, fresh, *chosen)
    stmts = b.build()
    return b.consts(), stmts


def note(ops: tuple, chain, hbm: dict[str, Buf], target: Target) -> str:
    """The schedule line of a block kept on chip (`tilec explain`, the kernel's docstring)."""
    i = next(i for i, o in enumerate(ops) if o.name == chain[0])
    chosen = choose(ops, i, hbm, target)
    e, d, p = ops[i:i + 3]
    how = ""
    if chosen is not None:
        lay, pe = chosen
        groups = -(-e.dim("K") // lay.cg)
        how = (f": {lay.nb} x {lay.rb} rows by {lay.cg} {dict(d.vars).get('k', 'e')} on the partitions, "
               f"{plural(groups, 'group')}" + (", TensorE taps" if pe else ""))
    return f"# block {' -> '.join(chain)} on chip ({e.out}, {d.out} never in HBM){how}"


def refusals(program, ops: tuple, scheduled: AbstractSet[str], chains: list, target: Target,
             reads: Callable[[object], list[str]]) -> str:
    """Schedule lines for the expand -> depthwise -> project chains that go through HBM, and why (`tilec explain`)."""
    hbm = {name: Buf(name, "hbm", t.dtype, t.shape) for name, t in program.tensors.items()}
    fused = {c.members for c in chains}
    out = []
    for i in range(len(ops) - 2):
        trio = ops[i:i + 3]
        if not all(isinstance(o, ConvOp) for o in trio) or tuple(o.name for o in trio) in fused:
            continue
        e, d, p = trio
        if not (_plain_1x1(e) and d.w_layout == "dw" and _plain_1x1(p) and d.x == e.out and p.x == d.out):
            continue
        why = why_not(ops, i, hbm, scheduled, set(program.kernel.outputs), reads)
        if not why:
            from tilec.compiler.schedule import sbuf_budget
            tried: list = []
            choose(ops, i, hbm, target, tried)
            lay, sbuf, banks = min(tried, key=lambda t: (t[1], t[2])) if tried else (None, 0, 0)
            why = "no layout of its bands fits SBUF and PSUM" + (
                f" (the smallest, {lay.nb} row blocks x {lay.cg} channels, needs {sbuf // 1024} KiB per partition of "
                f"{int(sbuf_budget(target) * SBUF_SHARE) // 1024} and {banks} PSUM banks of {target.psum_banks})"
                if lay else "")
        out.append(f"# block {e.name} -> {d.name} -> {p.name} not kept on chip ({e.out} and {d.out} go through "
                   f"HBM): {why}")
    return "".join(line + "\n" for line in out)
