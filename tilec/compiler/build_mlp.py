"""Loop-nest builder for a two-layer MLP (a transformer's feed-forward block) kept on chip: the two matmuls of

    h[i, j] = f(b1[j] + sum_k X[i, k] * W1[k, j])      f: gelu, relu, ... (or none), b1 optional
    Y[i, e] = b2[e] + sum_j h[i, j] * W2[j, e]          b2 optional

Built op by op, both matmuls take the rows i as their output partitions: h is stored to HBM, read back, and both
X and h are turned into the contraction layout by 128 x 128 PE transposes (M = 2048, D = 256, H = 512, E = 256:
96 of them; trn2 model 1.96x the TensorE floor in fp32, 4.9x in bf16). Here, per block of MB rows of X:

    X^T      X_T[D (partitions, tiles of 128), MB]: DMA transposes of X's 128 x 128 blocks straight from HBM
    op 1     h_T[128 hidden units, MB] = W1[:, d-tile, h-tile].T @ X_T[:, d-tile]  (stationary W1 as stored: its
             rows are the contraction), evicted by ScalarE as f(acc + b1) in one activation: the hidden units are
             on the partitions, so b1 is a per-partition bias column
    op 2     Y[128 rows, E] = sum over h-tiles of h_T[:, h-tile, rows].T @ W2[h-tile rows, E]: h_T is already the
             contraction-major stationary operand, and Y comes out in its row layout (stored as it is); b2 a row
             broadcast to the partitions once, added on the eviction (VectorE)

h never reaches HBM and nothing is transposed on TensorE. The other orientation of op 2 (Y^T = W2-tile.T @ h_T,
h_T moving) moves the same matmul columns through TensorE but needs Y^T turned back before the store (E x M / 128^2
transposes and their evictions), so it is not built. W1 and W2 stay resident in SBUF (W1 in a few buffers, the
first matmuls waiting for the first only); MB is the widest of 512, 256, 128 rows whose buffers fit the SBUF budget
(two blocks in flight), else the MLP is built op by op, as it is when the model's costs (`estimate`) favour that.
`place h, hbm` (any directive naming h or Y) keeps the op-by-op path. Op 2 of a block runs one block behind op 1
(`steps`). ffn19.md has the model's numbers (BERT-base FFN: 1.06x-1.31x of the floor).

`why_not` says why two ops are not such an MLP.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import AbstractSet, Callable

from tilec.compiler import ir, passes
from tilec.compiler.build_util import a, loop, ones_row, sl, term
from tilec.compiler.ir import DTYPE_BYTES, Act, Alloc, Binary, Buf, Copy, Dma, Matmul, Stmt, Transpose, View, full
from tilec.compiler.ops import ConvOp
from tilec.compiler.schedule import PMAX, PSUM_F32
from tilec.lang.functions import FUNCTIONS
from tilec.target import compiled

P = PMAX
BLOCKS = (512, 256, 128)  # rows of X per block, widest first (op 1's moving columns: a PSUM bank at 512)
H_TILES = 4  # PSUM tiles of op 1 (at most): TensorE runs ahead of ScalarE's evictions by up to this many tiles
SLAB = 512  # hidden units of W1's first buffer (the first matmuls wait for it, not the whole weight)


def _matmul(op) -> bool:
    """A plain 2-D matmul A[i, k] @ B[k, j] (A stored row-major), an optional bias row along j."""
    return (isinstance(op, ConvOp) and op.w_layout == "kc" and op.dim("N") == op.dim("H") == op.dim("Ho") == 1
            and op.dim("R") == op.dim("S") == 1 and op.dim("W") == op.dim("Wo") and op.pool is None
            and op.residual is None and op.clamp is None and op.groups == 1 and op.w_relu is None
            and op.scale == 1.0 and not op.w_batch and not op.x_transposed and op.out == op.name
            and (op.bias is None or op.bias_role == "x"))


def first_of_two(op, ops: tuple) -> bool:
    """Whether op is a plain matmul whose output the next op reads as its first operand (a plain matmul)."""
    at = [o.name for o in ops].index(op.name) if op in ops else -1
    return 0 <= at < len(ops) - 1 and _matmul(op) and _matmul(ops[at + 1]) and ops[at + 1].w == op.out


def funcs(op: ConvOp) -> list[str] | None:
    """The element-wise functions op 1 applies after its bias, in order (None: something else is fused)."""
    steps = (["relu"] if op.relu else []) + [s.op for s in op.epilogue if s.kind == "func"]
    if any(s.kind != "func" for s in op.epilogue) or not all(f in FUNCTIONS and FUNCTIONS[f].evicts for f in steps):
        return None
    return steps


def why_not(ops: tuple, i: int, hbm: dict[str, Buf], scheduled: AbstractSet[str], outputs: AbstractSet[str],
            reads: Callable[[object], list[str]], budget: int) -> str:
    """"" when ops[i], ops[i + 1] form an MLP this builder keeps on chip; else the reason."""
    if i + 2 > len(ops):
        return "not two matmuls"
    p, c = ops[i], ops[i + 1]
    if not (_matmul(p) and _matmul(c) and c.w == p.out):
        return f"not two plain matmuls with {p.out} the first operand of the second"
    if funcs(p) is None or funcs(c) is None:
        return "an epilogue other than element-wise functions on a matmul"
    if (c.dim("K"), c.dim("C")) != (p.dim("K"), p.dim("W")):
        return "the shapes of the two matmuls do not chain"
    if p.dim("C") % P or p.dim("W") % P:
        return f"the contraction or the hidden size is not a multiple of {P}"
    banks = compiled().psum_banks - 2
    if -(-c.dim("W") // PSUM_F32) > banks:
        return f"{c.out} is wider than {banks} PSUM banks of fp32 (one accumulator each, beside op 1's two)"
    if {p.name, c.name} & set(scheduled):
        return f"a directive names {p.name} or {c.name} (`place {p.out}, hbm` keeps it in HBM)"
    if p.out in outputs or any(p.out in reads(o) for o in ops if o is not c):
        return f"another op or the kernel's outputs read {p.out}"
    dt = {t: hbm[t].dtype for t in (p.w, p.x, p.out, c.x)}
    if dt[p.w] != dt[p.x] or dt[p.out] != dt[c.x]:
        return "the operands of a matmul have different dtypes"
    if block_rows(p, c, hbm, budget) is None:
        return "W1, W2 and two blocks of 128 rows do not fit the SBUF budget"
    hbm_ns, chip_ns = estimate(p, c, hbm)
    if chip_ns > hbm_ns:
        return f"the model's costs give {chip_ns / 1000:.1f} us on chip vs {hbm_ns / 1000:.1f} us through HBM"
    return ""


def estimate(p: ConvOp, c: ConvOp, hbm: dict[str, Buf]) -> tuple[float, float]:
    """(op by op, on chip) in ns, each the busier of TensorE and the DMA queues, from the performance model's own
    constants (build_matvec.model_constants). Both paths run the same matmuls (the FLOPs at the array's rate, x
    the fp32 factor); op by op adds the PE transposes of X and of h (128 x 128 blocks, transpose mode's rate for
    fp32) and h's store and reload, on chip X arrives by DMA transposes (at `dma_transpose_factor` of a copy) and
    h stays. So on chip wins unless X is far larger than h (H < D / 18 or so) and the DMAs bound the kernel."""
    from tilec.compiler.build_matvec import model_constants  # late: the model reads kernels
    prm = model_constants()
    M, D, H, E = p.dim("K"), p.dim("C"), p.dim("W"), c.dim("W")
    f, ft = (prm["fp32_matmul"], prm["fp32_transpose"]) if hbm[p.x].dtype == "f32" else (1.0, 1.0)
    matmuls = (M * D * H + M * H * E) / (P * P) * f / prm["tensor_ghz"]
    turns = -(-M // P) * (D // P + H // P) * (P + prm["mm_fixed_cycles"]) * ft / prm["tensor_ghz"]
    size = {t: math.prod(hbm[t].shape) * DTYPE_BYTES[hbm[t].dtype] for t in (p.w, p.x, c.x, c.out, p.out)}
    bw = prm["dma_engines"] * prm["dma_engine_bw"]
    common = size[p.x] + size[c.x] + size[c.out]
    by_op = max(matmuls + turns, (common + size[p.w] + 2 * size[p.out]) / bw)
    return by_op, max(matmuls, (common + size[p.w] / prm["dma_transpose_factor"]) / bw)


def block_rows(p: ConvOp, c: ConvOp, hbm: dict[str, Buf], budget: int) -> int | None:
    """Rows of X per block: the widest of BLOCKS (or M when fewer) whose buffers fit `budget`, or None."""
    M = p.dim("K")
    for mb in sorted({min(b, M) for b in BLOCKS}, reverse=True):
        built = MlpBuilder(p, c, hbm, lambda base: base, mb).build()
        if passes.peak_usage(tuple(built))[0] <= budget:
            return mb
    return None


class MlpBuilder:
    def __init__(self, p: ConvOp, c: ConvOp, hbm: dict[str, Buf], fresh: Callable[[str], str], mb: int) -> None:
        self.p, self.c, self.hbm, self.given = p, c, hbm, fresh
        self.made: dict[str, int] = {}
        self.M, self.D, self.H, self.E = p.dim("K"), p.dim("C"), p.dim("W"), c.dim("W")
        self.DT, self.HT, self.MB = self.D // P, self.H // P, mb
        self.ec = min(self.E, PSUM_F32)  # Y's columns per PSUM bank
        self.funcs = funcs(p) or []
        self.views: list[Stmt] = []
        self.mb_var, self.ht_var, self.dt_var, self.mt_var = (self.fresh(n) for n in ("m_b", "h_t", "d_t", "m_t"))

    def dtype(self, t: str) -> str:
        return self.hbm[t].dtype

    def fresh(self, base: str) -> str:
        """A new name at each call (the allocator names one base once; the last block and the last PSUM bank of
        columns repeat a buffer in another shape)."""
        n = self.made[base] = self.made.get(base, 0) + 1
        return self.given(base if n == 1 else f"{base}{n}")

    def build(self) -> list[Stmt]:
        pre = self.weights() + self.psum_tiles() + self.block_sets()
        label = (f"MLP {self.p.out} -> {self.c.out} by blocks of {self.MB} rows, the second matmul one block "
                 f"behind the first: {self.p.out} kept in SBUF transposed (hidden units on the partitions), never "
                 "in HBM")
        main = ir.Block(label, tuple(self.steps()), self.p.line)  # (the steps add the HBM views)
        return self.views + pre + [main]

    def steps(self) -> list[Stmt]:
        """Block u's X_T and op 1 are issued before block u - 1's op 2 (two sets of block buffers), so TensorE
        multiplies the next block while ScalarE evicts this one's last hidden tiles (each in program order). The
        steady steps are a loop over pairs of full blocks; the first, the leftover and the last are written out."""
        full_blocks, rest = divmod(self.M, self.MB)
        count = full_blocks + (1 if rest else 0)

        def at(u: int) -> tuple[ir.Aff, int]:
            return a(u * self.MB), self.MB if u < full_blocks else rest
        # the first block's loads before the weights, and W2 (and b2) after its op 1: TensorE starts after one
        # slab of W1 instead of both weights (BERT FFN bf16, M = 512: the weights are 30 us of DMA)
        out = self.x_loads(*at(0), 0) + self.b1_col() + self.slabs(1) + self.first(*at(0), 0, load=False) + \
            self.slabs(2) + self.b2_rows()
        groups = max(full_blocks - 1, 0) // 2
        if groups:
            q = self.mb_var
            body = [st for r in range(2) for st in self.first(a(term(q, 2 * self.MB), (1 + r) * self.MB), self.MB,
                                                              (1 + r) % 2)
                    + self.second(a(term(q, 2 * self.MB), r * self.MB), self.MB, r)]
            out += loop(q, groups, body, "sequential", note=f"pairs of blocks of {self.MB} rows of {self.p.w}",
                        line=self.p.line)
        for u in range(1 + 2 * groups, count):
            out += self.first(*at(u), u % 2) + self.second(*at(u - 1), (u - 1) % 2)
        return out + self.second(*at(count - 1), (count - 1) % 2)

    def psum_tiles(self) -> list[Stmt]:
        """PSUM tiles allocated once (tiles allocated per use rotate two buffers per allocation site, and the
        written-out steps have many): op 1's (two to H_TILES), used in turn by the hidden tiles; op 2's one per
        bank of Y's columns, two when Y has one bank (used in turn by the row tiles)."""
        p, c = self.p, self.c
        chunks = -(-self.E // self.ec)
        n = max(2, min(H_TILES, compiled().psum_banks - max(2, chunks), self.HT))
        self.h_ps = [Buf(self.fresh(f"{p.out}_ps"), "psum", "f32", (P, self.MB)) for _ in range(n)]
        self.y_ps = [Buf(self.fresh(f"{c.out}_ps"), "psum", "f32", (P, self.ec)) for _ in range(max(2, chunks))]
        return [Alloc(b, line=p.line) for b in self.h_ps + self.y_ps]

    def block_sets(self) -> list[Stmt]:
        """Two sets of a block's buffers (block u uses set u % 2): X_T, h_T and Y's rows (a tile of 128 rows is
        written again two blocks later: its store has long been acknowledged; with a row tile reused two tiles
        later, the evictions waited for the stores' acknowledgements, M = 2048, D = 256 bf16: TensorE idle)."""
        p, c = self.p, self.c
        self.x_t = [Buf(self.fresh(f"{p.w}_T"), "sbuf", self.dtype(p.w), (P, self.DT, self.MB)) for _ in range(2)]
        self.h_t = [Buf(self.fresh(f"{p.out}_T"), "sbuf", self.dtype(p.out), (P, self.HT, self.MB)) for _ in range(2)]
        self.y = [Buf(self.fresh(f"{c.out}_rows"), "sbuf", self.dtype(c.out), (P, -(-self.MB // P), self.E))
                  for _ in range(2)]
        return [Alloc(b, line=p.line) for b in self.x_t + self.h_t + self.y]

    def alternate(self, var: str, count: int, make: Callable[[ir.Aff, int], list[Stmt]], note: str, line: int,
                  n: int = 2) -> list[Stmt]:
        """make(index, k) for index 0..count - 1, k = index % n (which of n buffers): a loop over groups of n, and
        the last count % n indices written out."""
        group = [st for k in range(n) for st in make(a(term(var, n), k), k)]
        out = loop(var, count // n, group, "sequential", note=note, line=line) if count >= n else []
        return out + [st for i in range(count - count % n, count) for st in make(a(i), i % n)]

    def blocks(self, t: str, n: int, cols: int) -> View:
        """t [n * 128, cols] in HBM seen as [128, n, cols] (row p of block b at [p, b]): one DMA loads all."""
        view = Buf(self.fresh(f"{t}_blocks"), "hbm", self.dtype(t), (n, P, cols))
        self.views.append(ir.Reshape(view, self.hbm[t], self.p.line))
        return View(view, (full(n), full(P), full(cols)), perm=(1, 0, 2))

    def weights(self) -> list[Stmt]:
        """W1 [D, H] and W2 [H, E], contraction rows on the partitions, resident (loaded by `slabs`). W1 is a few
        buffers, its first SLAB hidden units, then each as wide as all before it: the model orders a loop's matmul
        after every write to the buffer it reads, and the first matmuls need the first slab only (BERT FFN fp32,
        M = 512: W1 is 26 us of DMA; TensorE waited 25 us with W1 in one piece, 16 us in two)."""
        p, c = self.p, self.c
        parts, h0 = [], 0
        while h0 < self.H:  # SLAB, then each buffer as wide as all before it
            parts.append((h0, min(max(SLAB, h0), self.H - h0)))
            h0 += parts[-1][1]
        self.w1 = [(Buf(self.fresh(f"{p.x}_tiles"), "sbuf", self.dtype(p.x), (P, self.DT, cols)), h0)
                   for h0, cols in parts]
        self.w2 = Buf(self.fresh(f"{c.x}_tiles"), "sbuf", self.dtype(c.x), (P, self.HT, self.E))
        out: list[Stmt] = [Alloc(w, line=p.line) for w, _ in self.w1]
        return out + [Alloc(self.w2, line=c.line)]

    def slabs(self, which: int) -> list[Stmt]:
        """W1 (which = 1), each of its buffers by one DMA, or W2 by one DMA."""
        p, c = self.p, self.c
        if which == 1:
            src = self.blocks(p.x, self.DT, self.H)
            return [Dma(ir.whole(w), View(src.buf, (full(self.DT), full(P), sl(h0, w.shape[2])), perm=src.perm),
                        p.line) for w, h0 in self.w1]
        return [Dma(ir.whole(self.w2), self.blocks(c.x, self.HT, self.E), c.line)]

    def b1_col(self) -> list[Stmt]:
        """b1 as one fp32 column per tile of hidden units (an activation's bias is per partition, fp32)."""
        p = self.p
        self.b1: Buf | None = None
        if p.bias is None:
            return []
        view = Buf(self.fresh(f"{p.bias}_cols"), "hbm", self.dtype(p.bias), (self.HT, P))
        self.views.append(ir.Reshape(view, self.hbm[p.bias], p.line))
        raw = Buf(self.fresh(f"{p.bias}_col"), "sbuf", self.dtype(p.bias), (P, self.HT))
        # a DMA transpose of b1's HT rows of 128: HT descriptors; the strided copy's H one-element descriptors kept
        # every DMA engine busy for 2.7 us at H = 3072, holding up W1 (BERT FFN fp32)
        load = Transpose(ir.whole(raw), View(view, (full(self.HT), full(P))), "dma", p.line) if self.HT <= P \
            else Dma(ir.whole(raw), View(view, (full(self.HT), full(P)), perm=(1, 0)), p.line)
        out: list[Stmt] = [Alloc(raw, line=p.line), load]
        self.b1 = raw
        if raw.dtype != "f32":
            self.b1 = Buf(self.fresh(f"{p.bias}_f32"), "sbuf", "f32", raw.shape)
            out += [Alloc(self.b1, line=p.line), Copy(ir.whole(self.b1), ir.whole(raw), p.line)]
        return out

    def b2_rows(self) -> list[Stmt]:
        """b2 as an fp32 row on every partition, broadcast once by a ones matmul in op 2's PSUM tiles (before
        their first use); an fp32 b2 is loaded into the first partition of that row itself."""
        c = self.c
        self.b2: Buf | None = None
        if c.bias is None:
            return []
        bt = self.dtype(c.bias)
        ones, out = ones_row(self.fresh(f"ones_{bt}"), bt, P, c.line)
        self.b2 = Buf(self.fresh(f"{c.bias}_bc"), "sbuf", "f32", (P, self.E))
        out.append(Alloc(self.b2, line=c.line))
        row = self.b2
        if bt != "f32":
            row = Buf(self.fresh(f"{c.bias}_row"), "sbuf", bt, (1, self.E))
            out.append(Alloc(row, line=c.line))
        out.append(Dma(View(row, (sl(0, 1), full(self.E))), View(self.hbm[c.bias], (full(self.E),)), c.line))
        for j, e0 in enumerate(range(0, self.E, self.ec)):
            n = min(self.ec, self.E - e0)
            acc = View(self.y_ps[j], (full(P), sl(0, n)))
            out += [Matmul(acc, View(ones, (full(1), full(P))), View(row, (sl(0, 1), sl(e0, n))), c.line,
                           start=True), Copy(View(self.b2, (full(P), sl(e0, n))), acc, c.line)]
        return out

    def x_loads(self, m0: ir.Aff, mb: int, par: int) -> list[Stmt]:
        """X_T of the block of mb rows from m0 (buffer set par): DMA transposes of X's 128 x 128 blocks."""
        p, x_t = self.p, self.x_t[par]
        return [Transpose(View(x_t, (full(P), a(dt), sl(r0, min(P, mb - r0)))),
                          View(self.hbm[p.w], (sl(m0.plus(r0), min(P, mb - r0)), sl(dt * P, P))), "dma", p.line)
                for dt in range(self.DT) for r0 in range(0, mb, P)]

    def first(self, m0: ir.Aff, mb: int, par: int, load: bool = True) -> list[Stmt]:
        """Block of mb rows from m0, buffer set par: X_T (unless loaded already), then h_T."""
        out = self.x_loads(m0, mb, par) if load else []
        for w, h0 in self.w1:
            def make(t: ir.Aff, k: int, w: Buf = w, h0: int = h0) -> list[Stmt]:
                return self.hidden(self.x_t[par], self.h_t[par], mb, t, w, h0, k)
            n = len(self.h_ps)
            out += self.alternate(self.ht_var, w.shape[2] // P, make, f"groups of {n} tiles of {P} hidden units",
                                  self.p.line, n)
        return out

    def second(self, m0: ir.Aff, mb: int, par: int) -> list[Stmt]:
        """Y's rows of the block: tiles of 128 rows (the last may have fewer), stored."""
        full_tiles, rest = divmod(mb, P)
        out = self.alternate(self.mt_var, full_tiles, lambda t, k: self.rows(par, m0, t, P, k),
                             f"pairs of tiles of {P} rows", self.c.line)
        if rest:
            out += self.rows(par, m0, a(full_tiles), rest, full_tiles % 2)
        return out

    def hidden(self, x_t: Buf, h_t: Buf, mb: int, t: ir.Aff, w1: Buf, h0: int, k: int) -> list[Stmt]:
        """h_T[:, ht] = f(W1[:, :, ht].T @ X_T + b1[ht]) for the hidden tile t of the W1 buffer w1 (ht = t +
        h0 / 128), accumulated in PSUM tile k."""
        p, dt, ht = self.p, self.dt_var, t.plus(h0 // P)
        acc = View(self.h_ps[k], (full(P), sl(0, mb)))

        def mm(d: ir.Aff, start: bool) -> Matmul:
            return Matmul(acc, View(w1, (full(P), d, sl(_times(t, P), P))),
                          View(x_t, (full(P), d, sl(0, mb))), p.line, start=start)
        body: list[Stmt] = [mm(a(0), True)]
        if self.DT > 1:
            body += loop(dt, self.DT - 1, [mm(a(dt, 1), False)], note=f"contraction tiles of {P}", line=p.line)
        dst = View(h_t, (full(P), ht, sl(0, mb)))
        first = self.funcs[0] if self.funcs else "copy"
        bias = View(self.b1, (full(P), sl(ht, 1))) if self.b1 is not None else None
        body.append(Act(dst, acc, first, bias, 1.0, p.line))
        return body + [Act(dst, dst, f, None, 1.0, p.line) for f in self.funcs[1:]]

    def rows(self, par: int, m0: ir.Aff, t: ir.Aff, n: int, k: int) -> list[Stmt]:
        """Row tile t of the block (rows r0 = 128 t .. + n from m0): Y[m0 + r0 .., :] = h_T[:, :, r0 ..].T @ W2
        (+ b2), a PSUM bank of columns at a time (PSUM tile k when Y has one bank), stored."""
        c, h_t, r0 = self.c, self.h_t[par], _times(t, P)
        out: list[Stmt] = []
        for j, e0 in enumerate(range(0, self.E, self.ec)):
            w = min(self.ec, self.E - e0)
            part = View(self.y_ps[j if self.E > self.ec else k], (sl(0, n), sl(0, w)))

            def mm(h: ir.Aff, start: bool, acc: View = part, e0: int = e0, w: int = w) -> Matmul:
                return Matmul(acc, View(h_t, (full(P), h, sl(r0, n))), View(self.w2, (full(P), h, sl(e0, w))),
                              c.line, start=start)
            out.append(mm(a(0), True))
            if self.HT > 1:
                out += loop(self.ht_var, self.HT - 1, [mm(a(self.ht_var, 1), False)],
                            note=f"tiles of {P} hidden units", line=c.line)
            dst = View(self.y[par], (sl(0, n), t, sl(e0, w)))
            after = funcs(c) or []  # Y's own functions (a third layer reads it): VectorE's sum, then ScalarE
            if self.b2 is not None:
                out.append(Binary(dst, part, View(self.b2, (sl(0, n), sl(e0, w))), "add", c.line))
            elif not after:
                out.append(Copy(dst, part, c.line))
            out += [Act(dst, part if self.b2 is None and f == 0 else dst, fn, None, 1.0, c.line)
                    for f, fn in enumerate(after)]
        rows = View(self.hbm[c.out], (sl(m0.plus(r0), n), full(self.E)))
        return out + [Dma(rows, View(self.y[par], (sl(0, n), t, full(self.E))), c.line)]


def _times(x: ir.Aff, k: int) -> ir.Aff:
    """x * k (an index scaled to the start of its tile)."""
    return ir.Aff(tuple(replace(t, coef=t.coef * k) for t in x.terms), x.const * k)


def build_mlp(ops: tuple, i: int, hbm: dict[str, Buf], fresh: Callable[[str], str], scheduled: AbstractSet[str],
              outputs: AbstractSet[str], reads: Callable[[object], list[str]], budget: int
              ) -> tuple[list[tuple[str, int]], list[Stmt]] | None:
    """The MLP ops[i], ops[i + 1] built on chip (None: not such an MLP; each op then takes its own builder)."""
    if not budget or why_not(ops, i, hbm, scheduled, outputs, reads, budget):
        return None
    mb = block_rows(ops[i], ops[i + 1], hbm, budget)
    assert mb is not None  # (why_not checked it)
    return [], MlpBuilder(ops[i], ops[i + 1], hbm, fresh, mb).build()


def note(ops: tuple, chain, hbm: dict[str, Buf], budget: int) -> str:
    """The schedule line of an MLP kept on chip (`tilec explain`, the kernel's docstring)."""
    p, c = (next(o for o in ops if o.name == n) for n in chain)
    mb = block_rows(p, c, hbm, budget) or 0
    hbm_ns, chip_ns = estimate(p, c, hbm)
    return (f"# MLP {p.name} -> {c.name} on chip by blocks of {mb} rows ({p.out} transposed in SBUF, never in HBM; "
            f"the model's costs: {chip_ns / 1000:.1f} us vs {hbm_ns / 1000:.1f} us op by op; `place {p.out}, hbm` "
            "builds them op by op)")


def refusals(program, ops: tuple, scheduled: AbstractSet[str], chains: list,
             reads: Callable[[object], list[str]], budget: int) -> str:
    """Schedule lines for two chained matmuls built op by op, and why (`tilec explain`)."""
    hbm = {name: Buf(name, "hbm", t.dtype, t.shape) for name, t in program.tensors.items()}
    fused = {ch.members for ch in chains}
    out = []
    for i in range(len(ops) - 1):
        p, c = ops[i], ops[i + 1]
        if not (_matmul(p) and _matmul(c) and c.w == p.out) or (p.name, c.name) in fused:
            continue
        out.append(f"# MLP {p.name} -> {c.name} built op by op: "
                   f"{why_not(ops, i, hbm, scheduled, set(program.kernel.outputs), reads, budget)}")
    return "".join(line + "\n" for line in out)

