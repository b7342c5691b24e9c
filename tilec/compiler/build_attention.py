"""Loop-nest builder for one attention head kept on chip: the six ops of

    sc[i, j] = sum_d Q[i, d] * K[j, d]            (or K stored [d, j])
    m[i] = max_j sc[i, j]
    e[i, j] = exp(a * sc[i, j] + b * m[i] + c)    (e.g. exp((sc - m) * 0.125))
    z[i] = sum_j e[i, j]
    O_acc[i, d] = sum_j e[i, j] * V[j, d]
    O[i, d] = O_acc[i, d] / z[i]

as one pass over tiles of 128 query rows. Through HBM (each op by its own builder) sc and e are written and read
back (4 MiB each at S = 1024 in f32) and e is loaded again to be transposed: gaps15 attn_full ran DMA-bound at
3.3x its floor. Here, per query tile:

    scores   sc_rows[128, S] = Q_T[:, tile].T @ K_T      TensorE into PSUM (512 columns a bank), evicted in sc's
                                                         dtype (the reference rounds there)
    softmax  m = max(sc_rows) (VectorE), bias = b * m + c, e_rows = exp(a * sc_rows + bias) with z summed by the
             same activation (ScalarE accum)
    P^T      e_T[128 keys, kb, 128 queries]: e_rows' 128 x 128 blocks turned by SBUF -> SBUF DMA transposes when
             TensorE is the bottleneck (fp32), else on TensorE (a PSUM bank of blocks evicted by one copy): `plan`
    P V      O_ps[128, Dv] = sum_kb e_T[:, kb].T @ V_tiles[:, kb]   accumulated in one PSUM bank
    O        O_ps / z on the eviction (VectorE), one store

The tiles are software-pipelined (`tiles`): tile u's scores and softmax are issued before tile u - ahead's P^T and
P V, with ahead + 1 sets of buffers. Q_T and K_T (contraction-major, D partitions) are written once by DMA
transposes of Q's and K's row blocks from HBM; V's key blocks are loaded once by one DMA. Only Q, K, V in and O
out touch HBM; sc, m, e, z and O_acc never do. Roundings follow the program's dtypes: sc, e, z and O_acc are stored
in their own dtype before they are read (copies for z and O_acc when that is not fp32).

gaps15 attn_full (S = 1024, D = 128, fp32), model time without start-up: 90.4 us through HBM, 39.5 us here (floor
27.3 us: TensorE's fp32 matmuls alone are 33.5 us of it in this model).

attn22: scores may start from an additive mask (`sc[i, j] = Mk[i, j]`, a causal mask: its rows loaded a step before
the scores, added on the eviction); P V may read V's exact f32 copy (attention written inline, operand_split.py),
then P is carried in V's 16-bit dtype when O has it (attention_find.weights, named in tilec/tolerance.py), else P V
runs in fp32; the bf16 (PE-transpose) path runs 3 tiles deep (`lags`).

attention_find.py says what such a head is and why a run of ops is not one (each op then takes its own builder,
as before), and plans it.
"""
from __future__ import annotations

from typing import AbstractSet, Callable

from tilec.compiler import ir
from tilec.compiler.attention_find import (AHEAD_PE, ITEM, OPS, PSUM_F32, P, exponent, head, plan, raw_scale,
                                           refusals, source, span, weights, why_not)
from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.ir import Act, Alloc, Binary, Buf, Copy, Dma, Matmul, Reduce, Scalar, Stmt, Transpose, View, full
from tilec.compiler.ops import EltwiseOp
from tilec.compiler.schedule import PSUM_BANK
from tilec.target import compiled

__all__ = ["OPS", "build_head", "note", "refusals", "span"]  # (span, refusals: the fusers' and explain's entries)

class HeadBuilder:
    def __init__(self, ops: tuple, hbm: dict[str, Buf], fresh: Callable[[str], str],
                 cv: EltwiseOp | None = None, choice: tuple[bool, int] | None = None) -> None:
        self.s, self.m, self.e, self.z, self.o, self.fin = ops
        self.cv, self.pdt = cv, weights(self.e, self.o, hbm, cv)
        self.hbm, self.fresh = hbm, fresh
        self.K, self.W, self.C, self.Dv = self.s.dim("K"), self.s.dim("W"), self.s.dim("C"), self.o.dim("W")
        self.NQ, self.NK = self.K // P, self.W // P
        self.a, self.b, self.c = exponent(self.e, self.s.out, self.m.out, raw_scale(self.s)) or (1.0, -1.0, 0.0)
        self.qt, self.kb = fresh("q_p"), fresh("k_b")
        self.row, self.par = a(0), 0
        self.views: list[Stmt] = []  # HBM reshapes, first in the kernel
        self.by_dma, self.depth = choice or plan(ops, hbm, cv) or (False, AHEAD_PE)  # (choice: plan's trial)
        self.mask = self.s.residual  # an additive mask, loaded a step before its tile's scores
        self.ahead = self.depth + (self.mask is not None)

    def buf(self, base: str, memory: str, dtype: str, shape: tuple[int, ...]) -> Buf:
        return Buf(self.fresh(base + (f"_{self.par + 1}" if self.par else "")), memory, dtype, shape)

    # a query tile's buffers (one set per parity: `buf` names them apart)
    @property
    def sc(self) -> Buf:
        return self.buf(f"{self.s.out}_rows", "sbuf", self.dtype(self.s.out), (P, self.W))

    @property
    def rows(self) -> Buf:
        return self.buf(f"{self.e.out}_rows", "sbuf", self.pdt, (P, self.W))

    @property
    def e_t(self) -> Buf:
        return self.buf(f"{self.e.out}_T", "sbuf", self.pdt, (P, self.NK, P))

    def dtype(self, t: str) -> str:
        return self.hbm[t].dtype

    def build(self) -> list[Stmt]:
        out: list[Stmt] = self.operands()
        v = source(self.o, self.cv)
        self.v = self.buf(f"{v}_tiles", "sbuf", self.dtype(v), (P, self.NK, self.Dv))
        load: list[Stmt] = [Alloc(self.v, line=self.o.line),
                            Dma(ir.whole(self.v), self.blocks(v, self.NK, self.Dv), self.o.line)]
        if self.dtype(v) != self.pdt:  # V's exact f32 copy, on chip (one conversion of the resident blocks)
            loaded, self.v = self.v, self.buf(f"{self.o.x}_tiles", "sbuf", self.pdt, self.v.shape)
            load += [Alloc(self.v, line=self.o.line), Copy(ir.whole(self.v), ir.whole(loaded), self.o.line)]
        out.append(ir.Block(f"{v}: every key block, resident in SBUF", tuple(load), self.o.line))
        out += self.psum_tiles()
        return self.views + out + [ir.Block(f"attention {self.s.out} -> {self.fin.out} by tiles of {P} query rows: "
                               f"{self.s.out}, {self.e.out} never in HBM", tuple(self.tiles()), self.s.line)]

    def tiles(self) -> list[Stmt]:
        """Every query tile, software-pipelined `ahead` tiles deep with ahead + 1 sets of buffers: step u issues
        each part of the tile `lags` puts there (`order`): tile u's scores, tile u - lag's softmax (and its DMA
        transposes), tile u - ahead's PE transposes, P V and store. Each engine issues in program order, so TensorE
        computes tile u's scores while ScalarE and VectorE work on the tiles before it (one tile per iteration,
        unpipelined, measured 101.6 us at S = 1024). The steady steps are a loop of ahead + 1 steps (one per buffer
        set); the first `ahead` steps and the steps after the loop are written out."""
        L, n = self.ahead, self.ahead + 1
        q, out = self.qt, []
        for u in range(L):
            out += self.step(u)
        groups = max(self.NQ - L, 0) // n
        if groups:
            body = [st for r in range(n) for st in self.step(L + r, term(q, n * P))]
            out += loop(q, groups, body, note=f"query tiles of {P}, {n} at a time", line=self.s.line)
        for u in range(L + groups * n, self.NQ + L):
            out += self.step(u)
        return out

    def lags(self) -> dict[str, int]:
        """Steps each part of a tile runs after its scores. DMA path (fp32, TensorE-bound): the softmax and its DMA
        transposes in the same step, P V `ahead` later. PE path (bf16), 3 ahead: the softmax one step behind the
        scores, the PE transposes two, P V three, so that neither ScalarE (the scores' evictions, then the exp of
        scores evicted a step earlier) nor VectorE (the row max before the copy of P^T out of PSUM) nor TensorE
        (the scores before P V) waits in its in-order queue for another engine's work on the same tile. attn22,
        model, attn_full_bf16 S = 1024 run: 28.11 us with everything but P^T and P V in one step (1 ahead),
        22.32 here; lags (1, 3, 4): 21.68, with one more buffer set; (1, 2, 2): 24.58; (1, 1, 2): 30.77. The DMA
        path with the softmax a step behind: 39.15-43.84 against 39.50, so it stays."""
        d = self.depth
        if self.by_dma or d < 3:
            lags = {"S": 0, "M": 0, "T": 0 if self.by_dma else d, "V": d}
        else:
            lags = {"S": 0, "M": 1, "T": d - 1, "V": d}
        if self.mask is None:
            return lags
        return {"L": 0, **{k: v + 1 for k, v in lags.items()}}  # L: the mask's rows loaded a step before the scores

    def step(self, u: int, base: ir.Term | None = None) -> list[Stmt]:
        """Step `base + u` (base: the loop's first step, a multiple of ahead + 1): each part of the tile it runs,
        those of tiles that exist; the softmax before the transposes (of an older tile) unless both run in the
        same step on the PE path (1 ahead), where TensorE's transposes of the tile before come first."""
        lags = self.lags()
        order = "L" * (self.mask is not None) + ("SMTV" if self.by_dma or lags["M"] > lags["S"] else "STMV")
        out: list[Stmt] = []
        for k in order:
            t = u - lags[k]
            if base is None and not 0 <= t < self.NQ:
                continue
            out += self.part(a(t * P) if base is None else a(base, t * P), t % (self.ahead + 1), k)
        return out

    def part(self, row: ir.Aff, par: int, steps: str) -> list[Stmt]:
        """Steps of the query tile whose rows start at `row` (`par` names its buffers): S scores, M softmax,
        T P^T, V P V and the store."""
        self.row, self.par = row, par
        made = {"L": self.mask_rows, "S": self.scores, "M": self.softmax, "T": self.turned, "V": self.values}
        return [st for k in steps for st in made[k]()]

    def blocks(self, t: str, n: int, cols: int) -> View:
        """t [n * 128, cols] in HBM seen as [128, n, cols] (row p of block b at [p, b]): one DMA loads every block."""
        view = Buf(self.fresh(f"{t}_blocks"), "hbm", self.dtype(t), (n, P, cols))
        self.views.append(ir.Reshape(view, self.hbm[t], self.s.line))
        return View(view, (full(n), full(P), full(cols)), perm=(1, 0, 2))

    def psum_tiles(self) -> list[Stmt]:
        """The PSUM tiles, allocated once (at most seven banks, none rotating): the scores' chunks and the blocks of
        P^T (PE transposes only), two each, used in turn; P V's sum, one per buffer set. Tiles allocated per use
        rotate two buffers per allocation site, and the written-out steps have many sites: they did not fit the 8
        banks and waited for each other (attn_full S = 1024: 78.3 us; 69.6 us with PSUM placement off)."""
        line = self.s.line
        width = min(self.W, PSUM_F32)
        self.sc_ps = [Buf(self.fresh(f"{self.s.out}_ps{c}"), "psum", "f32", (P, width))
                      for c in range(min(2, -(-self.W // width)))]
        dt = self.pdt
        self.group = min(self.NK, PSUM_BANK // (P * ITEM[dt]))
        while self.NK % self.group:
            self.group -= 1
        self.tp = [] if self.by_dma else [Buf(self.fresh(f"{self.e.out}_tp{g}"), "psum", dt, (P, self.group, P))
                                          for g in range(min(2, self.NK // self.group))]
        banks = compiled().psum_banks
        sums = min(self.ahead + 1, banks - len(self.sc_ps) - len(self.tp))  # (a tile's P V: o_ps[par % sums])
        self.o_ps = [Buf(self.fresh(f"{self.o.out}_ps{h}"), "psum", "f32", (P, self.Dv)) for h in range(sums)]
        return [Alloc(b, line=line) for b in self.sc_ps + self.tp + self.o_ps]

    def operands(self) -> list[Stmt]:
        """Q_T [D, SQ] and K_T [D, SK] in SBUF, contraction-major, written by DMA transposes of 128-row blocks
        straight from HBM (at up to 90 % of a copy's throughput [ARCH3, nki-spec 1.10.12]; no TensorE or VectorE
        work). The blocks the first scores need go first: K's first PSUM bank of columns, then Q's first tile,
        then the rest (attn_full S = 1024 fp32: loads, PE transposes and copies put the first matmul at 5.4 us)."""
        line = self.s.line
        self.q_t = self.buf(f"{self.s.w}_T", "sbuf", self.dtype(self.s.w), (self.C, self.K))
        self.k_t = self.buf(f"{self.s.x}_T", "sbuf", self.dtype(self.s.x), (self.C, self.W))
        out: list[Stmt] = [Alloc(self.k_t, line=line), Alloc(self.q_t, line=line)]

        def block(tt: Buf, t: str, b: int) -> Stmt:
            return Transpose(View(tt, (full(self.C), sl(b * P, P))), View(self.hbm[t], (sl(b * P, P), full(self.C))),
                             "dma", line)
        q = [block(self.q_t, self.s.w, b) for b in range(self.NQ)]
        if not self.s.x_transposed:  # K stored [d, j]: already contraction-major, one load
            return out + [Dma(ir.whole(self.k_t), ir.whole(self.hbm[self.s.x]), line)] + q
        k = [block(self.k_t, self.s.x, b) for b in range(self.NK)]
        first = min(self.NK, PSUM_F32 // P)
        return out + k[:first] + q[:1] + k[first:] + q[1:]

    @property
    def mask_tile(self) -> Buf:
        return self.buf(f"{self.mask}_rows", "sbuf", self.dtype(str(self.mask)), (P, self.W))

    def mask_rows(self) -> list[Stmt]:
        """The mask's rows of this query tile, loaded a step before its scores (their eviction adds them)."""
        rows = View(self.hbm[str(self.mask)], (sl(self.row, P), full(self.W)))
        return [Alloc(self.mask_tile, line=self.s.line), Dma(ir.whole(self.mask_tile), rows, self.s.line)]

    def scores(self) -> list[Stmt]:
        """sc_rows = this query tile's scores, a PSUM bank of 512 columns at a time, evicted by ScalarE; with a mask,
        scaled into fp32 by ScalarE and the mask added by GpSimdE (SBUF only, idle here), rounded once to sc's dtype
        as the program stores it. (VectorE's one scalar_tensor_tensor from PSUM, 1.17 us a bank in the model, made
        the bf16 head VectorE-bound: attn_causal_bf16 S = 1024, run 40.71 us, 38.49 with P^T's copies on ScalarE,
        27.87 this way; the f32 head, DMA-bound, 62.9 -> 64.1 us total.)"""
        s, line = self.s, self.s.line
        out: list[Stmt] = [Alloc(self.sc, line=line)]
        width = self.sc_ps[0].shape[1]
        for c, j0 in enumerate(range(0, self.W, width)):
            n = min(width, self.W - j0)  # the last bank may be part full (SK = 640: 512 + 128)
            acc = View(self.sc_ps[c % len(self.sc_ps)], (full(P), sl(0, n)))
            dst = View(self.sc, (full(P), sl(j0, n)))
            out += [Matmul(acc, View(self.q_t, (full(self.C), sl(self.row, P))),
                           View(self.k_t, (full(self.C), sl(j0, n))), line, start=True)]
            if self.mask is None:
                out.append(Act(dst, acc, "copy", line=line))
                continue
            raw = self.buf(f"{s.out}_f32", "sbuf", "f32", (P, width))
            out += [Alloc(raw, line=line), Act(View(raw, (full(P), sl(0, n))), acc, "copy", scale=s.scale, line=line),
                    Binary(dst, View(raw, (full(P), sl(0, n))), View(self.mask_tile, (full(P), sl(j0, n))), "add", line,
                           engine="gpsimd")]
        return out

    def softmax(self) -> list[Stmt]:
        """m, the exponent's bias column, e_rows and z (summed by the activation itself)."""
        mo, eo = self.m, self.e
        mcol = self.buf(f"{mo.out}_col", "sbuf", self.dtype(mo.out), (P, 1))
        bias = self.buf(f"{eo.out}_bias", "sbuf", "f32", (P, 1))
        zsum = self.zsum
        out: list[Stmt] = [Alloc(mcol, line=mo.line), Reduce(ir.whole(mcol), ir.whole(self.sc), "maximum", mo.line),
                           Alloc(bias, line=eo.line)]
        out.append(Scalar(ir.whole(bias), ir.whole(mcol), "multiply", self.b, eo.line, op1="add", value1=self.c)
                   if self.c else Scalar(ir.whole(bias), ir.whole(mcol), "multiply", self.b, eo.line))
        out += [Alloc(self.rows, line=eo.line), Alloc(zsum, line=self.z.line),
                Act(ir.whole(self.rows), ir.whole(self.sc), "exp", ir.whole(bias), self.a, eo.line,
                    total=ir.whole(zsum))]
        return out

    @property
    def zsum(self) -> Buf:
        return self.buf(f"{self.z.out}_sum", "sbuf", "f32", (P, 1))

    def zcol(self) -> tuple[View, list[Stmt]]:
        """z of the current tile as the division reads it (fp32, rounded to z's dtype), and the copies making it."""
        return self.rounded(self.zsum, self.dtype(self.z.out), self.z.line)

    def rounded(self, col: Buf, dtype: str, line: int) -> tuple[View, list[Stmt]]:
        """col as the program stores it, in fp32 (a per-partition operand is fp32 [ISA6 tensor_scalar]): copied to
        dtype and back when that is not fp32, on GpSimdE (SBUF only, idle here; VectorE carries the row max and the
        PSUM copies: attn_full_bf16 S = 1024, model, 28.45 -> 28.11 us)."""
        if dtype == "f32":
            return ir.whole(col), []
        r = self.buf(f"{col.name}_{dtype}", "sbuf", dtype, col.shape)
        back = self.buf(f"{col.name}_r", "sbuf", "f32", col.shape)
        return ir.whole(back), [Alloc(r, line=line), Copy(ir.whole(r), ir.whole(col), line, "gpsimd"),
                                Alloc(back, line=line), Copy(ir.whole(back), ir.whole(r), line, "gpsimd")]

    def turned(self) -> list[Stmt]:
        """e_T[:, kb] = block kb of e_rows transposed: a PSUM bank's worth of blocks, then one copy out."""
        line, dt = self.o.line, self.pdt
        group = self.group
        out: list[Stmt] = [Alloc(self.e_t, line=line)]
        if self.by_dma:
            return out + [Transpose(View(self.e_t, (full(P), a(k), full(P))), View(self.rows, (full(P), sl(k * P, P))),
                                    "dma", line) for k in range(self.NK)]
        for n, g0 in enumerate(range(0, self.NK, group)):
            tp = self.tp[n % len(self.tp)]
            for k in range(group):
                out.append(Transpose(View(tp, (full(P), a(k), full(P))),
                                     View(self.rows, (full(P), sl((g0 + k) * P, P))), "pe", line))
            out.append(Copy(View(self.e_t, (full(P), sl(g0, group), full(P))), ir.whole(tp), line))
        return out

    def values(self) -> list[Stmt]:
        """O_ps = e_rows @ V over the key blocks in one PSUM bank, divided by z on the eviction, stored."""
        o, fin = self.o, self.fin
        acc = self.o_ps[self.par % len(self.o_ps)]
        kb = self.kb

        def mm(k: ir.Aff, start: bool) -> Matmul:
            return Matmul(ir.whole(acc), View(self.e_t, (full(P), k, full(P))),
                          View(self.v, (full(P), k, full(self.Dv))), o.line, start=start)
        out: list[Stmt] = [mm(a(0), True)]
        if self.NK > 1:
            out += loop(kb, self.NK - 1, [mm(a(kb, 1), False)], note=f"key blocks of {P}", line=o.line)
        src = ir.whole(acc)
        if self.dtype(o.out) != "f32":  # O_acc rounded as the program stores it
            r = self.buf(f"{o.out}_rows", "sbuf", self.dtype(o.out), (P, self.Dv))
            out += [Alloc(r, line=o.line), Copy(ir.whole(r), src, o.line)]
            src = ir.whole(r)
        res = self.buf(f"{fin.out}_tile", "sbuf", self.dtype(fin.out), (P, self.Dv))
        zcol, rounding = self.zcol()  # (here, not after the exp: VectorE would wait for ScalarE's exp in between)
        out += rounding + [Alloc(res, line=fin.line), Scalar(ir.whole(res), src, "divide", zcol, fin.line),
                Dma(View(self.hbm[fin.out], (sl(self.row, P), full(self.Dv))), ir.whole(res), fin.line)]
        return out


def build_head(ops: tuple, i: int, hbm: dict[str, Buf], fresh: Callable[[str], str], scheduled: AbstractSet[str],
               outputs: AbstractSet[str], reads: Callable[[object], list[str]]
               ) -> tuple[list[tuple[str, int]], list[Stmt]] | None:
    """The head ops[i:i+6] built on chip (None: not such a head; each op then takes its own builder)."""
    if why_not(ops, i, hbm, scheduled, outputs, reads):
        return None
    six, cv = head(ops, i)
    return [], HeadBuilder(six, hbm, fresh, cv).build()


def note(ops: tuple, chain, hbm: dict[str, Buf]) -> str:
    """The schedule line of a head kept on chip (`tilec explain`, the kernel's docstring)."""
    i = [o.name for o in ops].index(chain[0])
    six, cv = head(ops, i)
    by_dma, ahead = plan(six, hbm, cv) or (False, AHEAD_PE)
    return (f"# attention {' -> '.join(chain)} on chip by tiles of {P} query rows ({chain[0]}, {chain[2]} never in "
            f"HBM; P^T by {'DMA' if by_dma else 'PE'} transposes, P V {ahead} tile{'s' * (ahead > 1)} behind the "
            "scores; a directive on one builds them op by op)")


