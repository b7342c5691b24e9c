"""Statistics over axis 0 and the element-wise op using them, with X read from HBM once (build_column_chain):
softmax over columns (`m[j] max= X[i, j]`, `s[j] += exp(X[i, j] - m[j])`, `Y = exp(X - m[j]) / s[j]`),
standardising columns (`mu[j] += X[i, j] / M`, `v[j] += (X - mu[j])^2 / M`, `Y = (X - mu[j]) * rsqrt(v[j] + e)`).

Built as separate ops, each statistic reads X from HBM and Y reads it once more: three passes and a store, four
units of traffic against the floor's two (audit15 column_standardize 2.43x, gaps15 softmax_axis0 2.63x). Column
statistics of one block of columns need only that block, so here the columns are cut into blocks of TILE_F and a
block of every row stays in SBUF while the chain runs over it:

    for ct in range(F / TILE_F):
        X_res[p, rt, :] = X[p*T + rt, ct*TILE_F : ..]                   every row of the block, one DMA (T = R / 128)
        per statistic m:  run = fold over rt of terms(X_res[:, rt])      element-wise, VectorE and GpSimdE by columns
                          m_b[p, :] = m for every partition p            a sum: ones[P, P].T @ run on TensorE;
                                                                         a max/min: per 128 columns a transpose,
                                                                         a reduce, the column spread and turned back
        Y[p*T + rt, block] = expr(X_res[:, rt], m_b, ..)               per row tile; row-only parts once per block

A part of a statistic's terms that every later reader of X reads X through (softmax's exp(X - m), the centred
X - mu) is computed once, in place in X_res; for a 16-bit X (whose X_res would round it) into an fp32 working copy
of the block, so its blocks are narrower (COPY_BYTES for both). A statistic the kernel
outputs or another op reads is stored from row 0 of its broadcast tile. Two or more statistics of one X with no
element-wise user after them (a column variance) make a chain of their own. Taken for f32/bf16 X of whole row
tiles whose block of RESIDENT_BYTES per partition holds at least 128 columns (or all of them), and no directive on
the chain's ops; anything else keeps the ops apart.

With a batch index (statistics over a middle or leading axis: `m[a, c] max= X[a, b, c]`, ConvNeXt's LayerNorm
over C of NCHW) the same nest runs per batch (`batched`): `for sb in sub-blocks of TF columns: for ct in batches`,
the batches software-pipelined; a sum whose terms read another statistic, which reduce_split writes to HBM as an
element-wise op first, is taken back as one statistic (`statistics`), and the user may read per-row columns
(`* g[c] + b[c]`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import AbstractSet

from tilec.compiler import ir
from tilec.compiler.build_colreduce import SHARE_MIN
from tilec.compiler.build_conv import Fresh
from tilec.compiler.build_util import a, hbm_view, loop, sl, term
from tilec.compiler.colchain_find import IDENTITY, ColChain
from tilec.compiler.colchain_parts import (column_chunks, common, constants, evicted_through, reads, reads_of,
                                           replaced, row_parts, without_constants)
from tilec.compiler.expr_instrs import ExprCompiler, balanced
from tilec.compiler.exprs import fmt_expr
from tilec.compiler.ir import Alloc, Binary, Buf, Dma, Stmt, View, full, whole
from tilec.compiler.ops import ColumnReduceOp, EltwiseOp
from tilec.lang import syntax as sx
from tilec.target import compiled

OUTPUT_NOTE = "the output per row tile"
STORED_NOTE = "an extreme's rows stored (the second stage of a software-pipelined block)"
LAST_NOTE = "the last statistic (the second stage of a software-pipelined batch)"


def build_column_chain(ch: ColChain, ops: tuple, hbm: dict[str, Buf], stored: AbstractSet[str],
                       fresh: Fresh) -> tuple[list[tuple[str, int]], list[Stmt]]:
    """The nest of the module docstring; `stored`: the statistics the kernel needs in HBM. Built once with every
    sum on TensorE to count VectorE/GpSimdE's passes, then again with the first `folded` row tiles of each sum
    added on VectorE/GpSimdE (one matmul of their total) so that the two sides finish together (_balance)."""
    del ops  # (the chain's members are ch.members)
    names: dict[str, int] = {}

    def counting(base: str) -> str:  # the first build's names are thrown away with it
        names[base] = names.get(base, 0) + 1
        return f"{base}_{names[base]}"
    part = (ch.TF, ch.subs) if ch.O > 1 else None
    first = _Builder(ch, hbm, stored, counting, part=part)
    first.build()
    q = _balance(first)
    work = Work(first.work.sbuf + first.sums * max(0, q - 1) * ch.TF, first.work.psum)
    return _Builder(ch, hbm, stored, fresh, q, work.shares(compiled()), frozenset(first.read_whole), part).build()


def psum_fits(ch: ColChain, built: tuple[list[tuple[str, int]], list[Stmt]]) -> bool:
    """Whether the built chain's PSUM tiles fit the banks when every tile lives to the end of its loop body (NKI 0.1's
    interpreter counts them so: a bank each); else the unpipelined chain, else the ops apart. Checked for batched
    chains (softmax_mid holds 6: two blocks' max, its transposes and the sum); 2-D chains are built as before."""
    from tilec.compiler.passes import peak_usage
    return ch.O == 1 or peak_usage(tuple(built[1]))[1] <= compiled().psum_banks


def stage_b(ch: ColChain, ops: tuple):
    """Where the second half of a block's work begins (for pair_tiles.skew_row_tiles): at the output's loop over
    the row tiles, so that the next block's load, statistics and in-place parts are issued before this block's
    output and store, and the engines work on both blocks at once. Model (trn2, start-up excluded), split there /
    at the last statistic / after the loads only: softmax_axis0 2048^2 152.0 / 178.5 / 186.7 us, column_standardize
    4096 x 2048 339.0 / 379.2 / 378.6 us. Statistics without a user: after the load (a column variance 4096 x 2048,
    there / at the centring: 176.3 / 176.8 us; 2048^2 93.3 / 90.6)."""
    del ops

    def split(body: tuple) -> int | None:
        if not ch.user:  # at an extreme's rows (extreme_stored), else after the block's loads
            loads = max(i for i, s in enumerate(body) if isinstance(s, Dma) and s.src.buf.memory == "hbm") + 1
            return next((i for i, s in enumerate(body) if isinstance(s, ir.Loop) and s.note == STORED_NOTE), loads)
        return next((i for i, s in enumerate(body) if isinstance(s, ir.Loop) and (s.note.startswith(OUTPUT_NOTE)
                                                                                 or s.note == LAST_NOTE)), None)
    return split


@dataclass(frozen=True)
class Work:
    """A block's tensor_tensor elements per partition on VectorE/GpSimdE: `sbuf` with both inputs in SBUF (2 cycles
    per element on either engine), `psum` reading a statistic's PSUM accumulator (1 cycle on VectorE, nki-spec
    §1.10.4 [NISA tensor_tensor]: one input in PSUM; GpSimdE cannot read PSUM, so its share reads the SBUF copy at
    2 cycles)."""
    sbuf: float = 0.0
    psum: float = 0.0

    def shares(self, t) -> tuple[float, float]:
        """VectorE's fraction of the sbuf and of the psum elements so that both engines finish together: the psum
        work goes to VectorE first (twice its SBUF rate), GpSimdE takes the SBUF work first."""
        v, g = t.vector_ghz, t.gpsimd_ghz
        Wf, Wp = self.sbuf, self.psum
        if not t.vector_gpsimd_split:  # each kind of work on its faster engine (Target.vector_part)
            return t.vector_part(), t.vector_part(1, 2)
        if Wf + Wp == 0:
            return v / (v + g), 1.0
        if Wp / v >= 2 * Wf / g:
            return 0.0, (2 * Wf / g + 2 * Wp / g) / (Wp / v + 2 * Wp / g)
        return (2 * Wf / g - Wp / v) / (2 * Wf / v + 2 * Wf / g), 1.0

    def ns(self, t) -> float:
        """The time of this work on VectorE and GpSimdE together, shared as `shares` says."""
        f, p = self.shares(t)
        vector = (f * 2 * self.sbuf + p * self.psum) / t.vector_ghz
        if t.vector_gpsimd_split:
            return vector
        return vector + ((1 - f) * 2 * self.sbuf + (1 - p) * 2 * self.psum) / t.gpsimd_ghz  # (serialised)


def _balance(b: "_Builder") -> int:
    """Row tiles of each sum to fold on VectorE/GpSimdE: q minimising max(A + S (q - 1) c_vg, S (T - q + 1) c_pe),
    A the chain's other VectorE/GpSimdE work per block (its tensor_tensor passes shared as Work.shares says), S the
    sums, c_vg one tile's add on the two engines together, c_pe one tile's matmul (tilec/perf/costs.py: tensor_tensor 2
    cycles per element on either engine plus each instruction's static overhead; nc_matmul (N + fixed) cycles times
    the fp32 factor, halved by the ones' onezero hint). The steady state of the software-pipelined blocks balances
    the engines' whole work per block, the output's included. Model (trn2, start-up excluded), column_standardize
    4096 x 2048, q = 0 / 2 / 6 / 10: 222.2 / 232.6 / 273.9 / 271.2 us; 2048^2 q = 0 / 2 / 4: 114.2 / 122.1 / 130.0;
    512 x 2048 (4 row tiles) q = 0 / 2: 41.7 / 40.7. Pipelined blocks take q = 0 outright: without the onezero rate
    (fp32 matmuls at the full factor) this formula would pick q = 8 for 4096 x 2048 (366.1 us), where q = 0 / 13 / 18
    give 318.0 / 339.0 / 315.9 (cols19's rule, leaving the output out of A, picked 18); at 2048^2 q = 0 gives 164.6
    against the formula's 188.8."""
    from tilec.perf.costs import Costs
    from tilec.perf.params import target_params
    t = compiled()
    c = Costs(target_params(t.name))
    TF, T, S = b.TF, b.T, b.sums
    if not S or T < 3:
        return 0
    ghz = t.vector_ghz + t.gpsimd_ghz
    static = c.static["vector"] + c.static["gpsimd"]  # a pass is one instruction on each engine
    if not t.vector_gpsimd_split:  # one instruction on the faster engine (Target.vector_part)
        on = "vector" if t.vector_part() else "gpsimd"
        ghz, static = 1 / c.engine_ns[on], c.static[on]
    c_vg = (2 * TF + static) / ghz
    fp32 = c.fp32_onezero if b.res.dtype == "f32" or b.terms_f32 else 1.0  # the ones matmuls are marked onezero
    c_pe = (TF + c.mm_fixed) * fp32 / t.tensor_ghz
    A = b.work.ns(t) + (b.work.sbuf + b.work.psum) / TF * static / ghz
    nb = b.ch.blocks
    if nb >= 4 and nb % 2 == 0:  # software-pipelined (stage_b): the sums on TensorE whatever its fp32 rate
        return 0
    q = (S * (T + 1) * c_pe - A + S * c_vg) / (S * (c_vg + c_pe))
    # statistics without a user: no folds. Their sums are TensorE's whole work, but a fold ahead of a block's
    # centring holds VectorE/GpSimdE's in-order queues behind the next block's load (column variance 4096 x 2048,
    # q = 0 / 4 / 8: 176.3 / 182.1 / 203.1 us; folding only the last sum, q = 11: 210.4)
    return 0 if q < 2 or b.user is None else min(T, round(q))


class _Builder:
    def __init__(self, ch: ColChain, hbm: dict[str, Buf], stored: AbstractSet[str], fresh: Fresh,
                 folded: int = 0, shares: tuple[float, float] | None = None,
                 read_whole: AbstractSet[str] = frozenset(), part: tuple[int, int] | None = None):
        self.ch, self.hbm, self.stored, self.given = ch, hbm, stored, fresh
        self.bases: dict[str, int] = {}
        self.ones: dict[tuple[str, float], Buf] = {}
        self.fold_tiles = folded  # row tiles of each sum added on VectorE/GpSimdE before one matmul (_balance)
        self.work = Work()  # VectorE/GpSimdE tensor_tensor elements per partition over the whole block
        t = compiled()
        # VectorE's fraction of the SBUF tensor_tensors and of those reading a statistic in PSUM (Work.shares)
        self.shares = shares or Work().shares(t)
        self.twins: dict[str, Buf] = {}  # a statistic's SBUF row (on every partition) -> its PSUM accumulator
        self.side: Buf  # the PSUM tile of an extreme's last group of transposed chunks (_reduced)
        self.twin_stat: dict[str, str] = {}  # that row -> the statistic's name (read_whole: both builds name it so)
        self.read_whole: set[str] = set(read_whole)  # rows an instruction other than a cut tensor_tensor reads
        self.sums = 0
        self.terms_f32 = False
        members = list(ch.members)
        self.stats: list[ColumnReduceOp] = members[:-1] if ch.user else members
        self.user: EltwiseOp | None = members[-1] if ch.user else None
        self.P = min(compiled().pmax, ch.R)  # (a batched chain may have fewer rows than partitions: one tile)
        self.T = ch.R // self.P
        self.line = self.stats[0].line
        self.TF = ch.TF
        self.cols = sl(a(term("ct", ch.TF, "TILE_F")), ch.TF, name="TILE_F") if ch.F > ch.TF else full(ch.F)
        self.at: tuple[ir.Aff, ...] = ()  # the batch index of the HBM views
        if part is not None:  # a batched chain (batched): sub-block sb of batch ct
            self.cols = full(ch.F) if part[1] == 1 else sl(a(term("sb", ch.TF, "TILE_F")), ch.TF, name="TILE_F")
            self.at = (a("ct"),)

    def build(self) -> tuple[list[tuple[str, int]], list[Stmt]]:
        ch, ln = self.ch, self.line
        pre = self.views()
        head, tail = self.block()
        pre += self.ones_init() + constants(head) + constants(tail)
        head, tail = without_constants(head), without_constants(tail)
        if not self.at:
            nest = loop("ct", ch.F // self.TF, head + tail, note="for the blocks of TILE_F columns", line=ln)
            return [("TILE_F", self.TF)], pre + [ir.Block(self.what(), tuple(nest), ln)]
        nest = loop("sb", ch.subs, loop("ct", ch.O, head + tail, note="for the batches", line=ln),
                    note="for the sub-blocks of TILE_F columns of a batch", line=ln)
        what = self.what().replace("one block of TILE_F columns", "a sub-block of TILE_F columns of one batch")
        return [("TILE_F", self.TF)], pre + [ir.Block(what, tuple(nest), ln)]

    def views(self) -> list[Stmt]:
        """X and Y seen as (O,) P x T x F: rows p * T .. p * T + T - 1 on partition p, so that a block of every row
        is one DMA of T runs per partition."""
        ch, P, T, ln = self.ch, self.P, self.T, self.line
        lead = (ch.O,) if self.at else ()
        self.xv, pre = hbm_view(self.hbm[ch.src], lead + (P, T, ch.F), self.fresh(f"{ch.src}_v"), ln)
        self.yv: Buf | None = None
        self.colbufs: dict[str, Buf] = {}  # the user's columns, (P, T) each
        if self.user is not None:
            self.yv, st = hbm_view(self.hbm[self.user.out], lead + (P, T, ch.F), self.fresh(f"{self.user.out}_v"),
                                   ln)
            pre += st
            for c in self.user.columns:  # once: row p * T + rt's value on partition p, column rt
                cv, st = hbm_view(self.hbm[c], (P, T), self.fresh(f"{c}_v"), ln)
                tile = Buf(self.fresh(f"{c}_cols"), "sbuf", self.hbm[c].dtype, (P, T))
                pre += st + [Alloc(tile, line=ln), Dma(whole(tile), whole(cv), ln)]
                self.colbufs[c] = tile
        return pre

    def ones_init(self) -> list[Stmt]:
        return [x for (_, value), o in self.ones.items()
                for x in (Alloc(o, zero=True, line=self.line), ir.Scalar(whole(o), whole(o), "add", value, self.line))]

    def what(self) -> str:
        names = ", ".join(s.out for s in self.stats) + (f", {self.user.out}" if self.user is not None else "")
        return f"{names} = statistics over the rows of {self.ch.src}" + \
            (" and the element-wise op reading them" if self.user is not None else "") + \
            ", one block of TILE_F columns of every row kept in SBUF (X read once)"

    def block(self) -> tuple[list[Stmt], list[Stmt]]:
        """(the block's load and statistics, its output)."""
        ch, P, T, ln = self.ch, self.P, self.T, self.line
        self.res = Buf(self.fresh(f"{ch.src}_res"), "sbuf", self.hbm[ch.src].dtype, (P, T, self.TF))
        self.copy: Buf | None = None  # a 16-bit block's fp32 working copy (in_place)
        body: list[Stmt] = [Alloc(self.res, line=ln)]
        body.append(Dma(whole(self.res), View(self.xv, self.at + (full(P), full(T), self.cols)), ln))
        self.rows: dict[str, View] = {}
        exprs = [s.expr if s.expr is not None else sx.Access(ch.src, ()) for s in self.stats]
        exprs += [self.user.expr] if self.user is not None else []
        last: list[Stmt] | None = []  # stored-only extremes, issued after the other statistics (extreme_stored)
        staged = 0  # where the last statistic begins (stage B of a batch of one row tile: staged_last)
        for j, s in enumerate(self.stats):
            mark = len(body)
            exprs = self.in_place(j, exprs, body)
            if last and len(body) > mark:  # X_res changes in place here: the extremes read it before
                body[mark:mark] = last
                last = None
            if s.op != "add" and s.out in self.stored and not any(reads(e, s.out) for e in exprs[j + 1:]):
                (body if last is None else last).extend(self.extreme_stored(s, self.folded(s, exprs[j])))
                continue
            staged = len(body)
            body += self.statistic(s, exprs[j])
        body += last or []
        later = {id(x) for x in body[staged:]}
        head, tail = evicted_through(body, self.output(exprs[-1]) if self.user is not None else [])
        return self.staged_last(head, tail, next((i for i, x in enumerate(head) if id(x) in later), len(head)))

    def staged_last(self, head: list[Stmt], tail: list[Stmt], at: int) -> tuple[list[Stmt], list[Stmt]]:
        """A batched chain with a user and two or more sums (a standardisation): the last statistic and the row
        parts in a static loop of one (LAST_NOTE), where stage_b splits the block, so that the next batch's first
        statistics and in-place part are issued before this batch's last statistic on every engine's in-order
        queue (ScalarE's mean eviction, square and rsqrt of one batch otherwise wait in turn for TensorE and
        VectorE). Model (trn2, run), split at the output / here: channel_layernorm 8 x 128 x 28 x 28 39.07 / 31.73
        us, C = 256 57.1 / 53.9, 8 x 96 x 56 x 56 141.4 / 112.1; softmax_mid (a max, then a sum) 170.7 / 172.5: left
        at the output."""
        if not (self.at and self.user is not None and len(self.stats) > 1 and 0 < at < len(head)
                and all(s.op == "add" for s in self.stats)):
            return head, tail
        rows = next((i for i, x in enumerate(tail) if isinstance(x, ir.Loop)), len(tail))  # (the row parts with it)
        staged = head[at:] + tail[:rows]
        allocs = [x for x in staged if isinstance(x, Alloc)]  # (before the loop: the output reads its tiles too)
        body = tuple(x for x in staged if not isinstance(x, Alloc))
        return head[:at] + allocs + [ir.Loop("st", 1, body, "static", "", self.line, LAST_NOTE)], tail[rows:]

    def fold_columns(self) -> int:
        """The columns of an element-wise fold VectorE takes (GpSimdE the rest), as Work.shares says."""
        TF = self.TF
        return TF if TF < SHARE_MIN else round(TF * self.shares[0])

    def fresh(self, base: str) -> str:
        """A new name per request: the allocator's names are stable per base, and this chain makes several
        buffers of one base live at once (the first two row tiles' terms)."""
        k = self.bases[base] = self.bases.get(base, 0) + 1
        return self.given(base if k == 1 else f"{base}{k}")

    def tile(self, rt: ir.Aff, buf: Buf | None = None) -> View:
        """Row tile rt of the resident block (rows p * T + rt of the block on partition p): of its fp32 working
        copy once in_place made one."""
        return View(buf or self.copy or self.res, (full(self.P), rt, full(self.TF)))

    def emit(self, tiles: dict[str, View], prefix: str, e: sx.Expr, dst: View,
             columns: AbstractSet[str] = frozenset()) -> list[Stmt]:
        """The expression's instructions, each tensor_tensor cut by columns between GpSimdE and VectorE
        (_cut) and constant tensor_scalars balanced onto ScalarE (expr_instrs.balanced): with X resident,
        VectorE's passes over the block, not the DMAs, bound the chain. `columns`: tiles that are (P, 1) columns."""
        t = compiled()
        made = ExprCompiler(tiles, (self.P, self.TF), self.line, self.fresh, set(columns),
                            prefix=self.fresh(prefix)).emit(e, dst)
        per_tile = self.T if any("rt" in ir.view_vars(v) for v in (dst, *tiles.values())) else 1
        out: list[Stmt] = []
        for x in made:
            twin = self.twin_of(x)
            if twin is not None and isinstance(x, Binary):
                out += self.twin_cut(x, *twin)
                self.work = Work(self.work.sbuf, self.work.psum + x.dst.shape()[-1] * per_tile)
                continue
            self.read_whole |= {self.twin_stat[r.buf.name] for r in reads_of(x) if r.buf.name in self.twins}
            if isinstance(x, Binary) and not x.engine:
                cut = _cut(x, t, self.shares[0])
                out += cut
                if isinstance(cut[0], Binary):
                    self.work = Work(self.work.sbuf + x.dst.shape()[-1] * per_tile, self.work.psum)
            else:
                out.append(x)
        return balanced(out, t)

    def twin_of(self, x: Stmt) -> tuple[int, Buf] | None:
        """(the operand, the PSUM accumulator) of a tensor_tensor over SBUF tiles one of whose operands is a
        statistic's row with an accumulator holding it: VectorE reads that instead at its 1x rate."""
        if not isinstance(x, Binary) or x.engine or x.scale0 != 1.0:
            return None
        rows = [k for k, v in enumerate((x.a, x.b)) if v.buf.name in self.twins and v == whole(v.buf)]
        views = (x.dst, x.a, x.b)
        if len(rows) != 1 or x.a == x.b or any(v.buf.memory != "sbuf" or v.perm or v.shape() != x.dst.shape()
                                               or not isinstance(v.idx[-1], ir.Sl) or v.idx[-1].step != 1
                                               for v in views):
            return None
        k = rows[0]
        return k, self.twins[(x.a, x.b)[k].buf.name]

    def twin_cut(self, x: Binary, k: int, acc: Buf) -> list[Stmt]:
        """x's first columns on VectorE reading the accumulator, the rest on GpSimdE reading the SBUF row."""
        n = x.dst.shape()[-1]
        cut = _twin_columns(n, self.shares[1])
        out: list[Stmt] = []
        if cut < n:
            out += [g for g in _fold(x.dst, x.a, x.b, x.op, cut, x.line) if isinstance(g, Binary) and g.engine]
        if cut:
            ops = [x.a, x.b]
            ops[k] = whole(acc)
            out += [v for v in _fold(x.dst, ops[0], ops[1], x.op, cut, x.line)
                    if isinstance(v, Binary) and not v.engine]
        return out

    def in_place(self, j: int, exprs: list[sx.Expr], body: list[Stmt]) -> list[sx.Expr]:
        """The largest part of statistic j's terms through which every later expression reads X, computed once in
        place in X_res, and X read instead of it from then on. A 16-bit X_res would round it: its first such part
        goes into an fp32 working copy of the block (X_f32), read as X from then on."""
        X = self.ch.src
        part = common(exprs[j], exprs[j + 1:], X)
        if part is None:
            return exprs
        rt = a("rt")
        into = self.copy
        if self.hbm[X].dtype != "f32" and into is None:
            into = Buf(self.fresh(f"{X}_f32"), "sbuf", "f32", self.res.shape)
            body.append(Alloc(into, line=self.line))
        body += loop("rt", self.T, self.emit({X: self.tile(rt), **self.rows}, "pre", part, self.tile(rt, into)),
                     note=f"{fmt_expr(part)} in place (every later reader of {X} reads it)", line=self.line)
        self.copy = into
        key = fmt_expr(part)
        return exprs[:j] + [replaced(e, key, sx.Access(X, ())) for e in exprs[j:]]

    def statistic(self, s: ColumnReduceOp, expr: sx.Expr) -> list[Stmt]:
        """The statistic on every partition (self.rows[s.out]): a sum accumulated over the row tiles' terms on
        TensorE (summed), a max/min folded over them element-wise, then across the partitions (extreme)."""
        P, TF, ln = self.P, self.TF, s.update_line
        bcast = Buf(self.fresh(f"{s.out}_b"), "sbuf", self.hbm[s.out].dtype, (P, TF))
        out: list[Stmt] = [Alloc(bcast, line=ln)]
        out += self.summed(s, expr, bcast) if s.op == "add" else self.extreme(s, self.folded(s, expr), bcast)
        if s.out in self.stored:
            lead = (self.ch.O,) if self.at else ()
            ov, st = hbm_view(self.hbm[s.out], lead + (1, self.ch.F), self.fresh(f"{s.out}_v"), ln)
            out = st + out + [Dma(View(ov, self.at + (full(1), self.cols)), View(bcast, (full(1), full(TF))), ln)]
        self.rows[s.out] = whole(bcast)
        return out

    def terms(self, s: ColumnReduceOp, expr: sx.Expr, rt: ir.Aff) -> tuple[View, list[Stmt]]:
        """Row tile rt's terms: the resident tile itself, or the expression computed into a tile of its own."""
        X = self.ch.src
        if isinstance(expr, sx.Access) and expr.tensor == X:
            return self.tile(rt), []
        t = Buf(self.fresh(f"{s.out}_terms"), "sbuf", "f32", (self.P, self.TF))
        return whole(t), [Alloc(t, line=s.update_line)] + self.emit({X: self.tile(rt), **self.rows}, "t", expr,
                                                                     whole(t))

    def folded(self, s: ColumnReduceOp, expr: sx.Expr) -> Buf:
        """run = the max/min of the row tiles' terms, element-wise (VectorE and GpSimdE by columns)."""
        P, TF, ln = self.P, self.TF, s.update_line
        run = Buf(self.fresh(f"{s.out}_run"), "sbuf", "f32", (P, TF))
        cut = self.fold_columns()
        first, made = self.terms(s, expr, a(0))
        body = [Alloc(run, line=ln)] + made + [ir.Copy(whole(run), first, ln)] if self.T == 1 else []
        if self.T > 1:
            second, made2 = self.terms(s, expr, a(1))
            body = [Alloc(run, line=ln)] + made + made2 + _fold(whole(run), first, second, s.op, cut, ln)
        if self.T > 2:
            nxt, made = self.terms(s, expr, a("rt", 2))
            body += loop("rt", self.T - 2, made + _fold(whole(run), whole(run), nxt, s.op, cut, ln),
                         note="the row tiles folded element-wise", line=ln)
        self.work = Work(self.work.sbuf + (self.T - 1) * TF, self.work.psum)
        self.pending = body
        return run

    def summed(self, s: ColumnReduceOp, expr: sx.Expr, bcast: Buf) -> list[Stmt]:
        """ones[P, P].T @ terms accumulated over the row tiles in one PSUM bank: every partition gets the column
        sums (TensorE), scaled on the way out of PSUM. The ones carry the onezero hint (an fp32 matmul at up to
        twice the rate, ISA1/ISA6 nc_matmul). The first fold_tiles row tiles are added element-wise on
        VectorE/GpSimdE first, their total one more matmul."""
        P, TF, ln, T = self.P, self.TF, s.update_line, self.T
        self.sums += 1
        q = self.fold_tiles
        acc, out = self.psum(f"{s.out}_acc", (P, TF), ln)
        if q:
            run = Buf(self.fresh(f"{s.out}_run"), "sbuf", "f32", (P, TF))
            first, made = self.terms(s, expr, a(0))
            second, made2 = self.terms(s, expr, a(1))
            cut = self.fold_columns()
            out += [Alloc(run, line=ln)] + made + made2 + _fold(whole(run), first, second, "add", cut, ln)
            nxt, made = self.terms(s, expr, a("rt", 2))
            out += [] if q == 2 else loop("rt", q - 2, made + _fold(whole(run), whole(run), nxt, "add", cut, ln),
                                          note="row tiles added element-wise (VectorE, GpSimdE)", line=ln)
        moved = 1.0  # the part of the statistic's scale the ones carry
        if q < T:  # the first matmul starts the sum: the accumulator may be allocated once for every block
            terms, made = self.terms(s, expr, a(q))
            self.terms_f32 = self.terms_f32 or terms.buf.dtype == "f32"
            # a mean of 16-bit terms: 1/M in the ones (exact for M = 2^k), so that the accumulator holds the mean
            # and VectorE reads it from PSUM (twinned); fp32 terms keep plain ones for their onezero rate
            if not q and terms.buf.dtype != "f32" and _power_of_two(s.scale) and s.init == 0.0:
                moved = s.scale
            ones = self.ones_for(terms.buf.dtype, moved)
            out += made + [ir.Matmul(whole(acc), whole(ones), terms, ln, start=True, ones=moved == 1.0)]
        if q + 1 < T:
            terms, made = self.terms(s, expr, a("rt", q + 1))
            out += loop("rt", T - q - 1, made + [ir.Matmul(whole(acc), whole(ones), terms, ln, ones=moved == 1.0)],
                        note="the row tiles' terms summed into PSUM (ones matmul)", line=ln)
        if q:
            out.append(ir.Matmul(whole(acc), whole(self.ones_for("f32")), whole(run), ln, start=q == T, ones=True))
        if self.twinned(s, bcast, acc, moved):
            return out + self.evicted(s, bcast, acc)
        out.append(ir.Act(whole(bcast), whole(acc), "copy", scale=s.scale / moved, line=ln))
        if s.init != 0.0:
            out.append(ir.Scalar(whole(bcast), whole(bcast), "add", float(s.init), ln))
        return out

    def twinned(self, s: ColumnReduceOp, bcast: Buf, acc: Buf, scaled: float = 1.0) -> bool:
        """Whether the accumulator holds the statistic itself (no scale, or the scale in the ones: `scaled`; no
        start beyond the identity): then VectorE's tensor_tensors read it there (twin_of)."""
        if s.init != IDENTITY[s.op] or (s.op == "add" and s.scale != scaled):
            return False
        self.twins[bcast.name] = acc
        self.twin_stat[bcast.name] = s.out
        return True

    def evicted(self, s: ColumnReduceOp, bcast: Buf, acc: Buf) -> list[Stmt]:
        """The columns of the statistic's SBUF row that a reader needs: GpSimdE's share of the tensor_tensors, or
        all of them for a stored statistic or another reader. Copied by VectorE: VectorE and ScalarE must not use one
        PSUM bank at once on NC-v3 (nki-spec §1.4 [ARCH3]), and VectorE reads this one."""
        TF = self.TF
        cut = 0 if s.out in self.stored or s.out in self.read_whole else _twin_columns(TF, self.shares[1])
        if cut == TF:
            return []
        return [ir.Copy(View(bcast, (full(self.P), sl(cut, TF - cut))), View(acc, (full(self.P), sl(cut, TF - cut))),
                        s.update_line)]

    def psum(self, base: str, shape: tuple[int, ...], line: int) -> tuple[Buf, list[Stmt]]:
        """An fp32 PSUM tile and its allocation."""
        buf = Buf(self.fresh(base), "psum", "f32", shape)
        return buf, [Alloc(buf, line=line)]

    def ones_for(self, dtype: str, value: float = 1.0) -> Buf:
        """The (P, P) ones of a matmul's moving dtype (nc_matmul wants both operands fp32 or neither), or that
        matrix times a mean's power-of-two scale (exact in any float dtype)."""
        key = (dtype, value)
        if key not in self.ones:
            name = f"ones_{dtype}" if value == 1.0 else f"scaled_{dtype}"
            self.ones[key] = Buf(self.fresh(name), "sbuf", dtype, (self.P, self.P))
        return self.ones[key]

    def extreme(self, s: ColumnReduceOp, run: Buf, bcast: Buf) -> list[Stmt]:
        """Per chunk of 128 columns: transposed into PSUM, reduced along the free axis (one value per column on its
        partition), spread along a row of P (the ones times the column) and turned back: every partition holds
        the chunk's extremes (_extreme_chunks)."""
        ln = s.update_line
        acc, made = self.psum(f"{s.out}_acc", (self.P, self.TF), ln)
        out: list[Stmt] = self.pending + made + self._extreme_chunks(s, run, acc, self.ones_for("f32"))
        if self.twinned(s, bcast, acc):
            return out + self.evicted(s, bcast, acc)
        out.append(ir.Copy(whole(bcast), whole(acc), ln))
        out.append(ir.Scalar(whole(bcast), whole(bcast), s.op, float(s.init), ln))
        return out

    def extreme_stored(self, s: ColumnReduceOp, run: Buf) -> list[Stmt]:
        """An extreme only stored: the chunks' reduced columns (CB, k) turned into rows (k, CB) by one transpose and
        stored row by row, instead of spread to every partition (k spreads and transposes, a copy of the whole
        block's row) for row 0 to be stored. The columns of a narrower last chunk are zeroed first: its unused rows
        go through the transpose too. The rows are turned into the PSUM tile of the last group of chunks (its reduce
        has read it): a PSUM tile of its own waited on the model's bank placement (channel_max_mean 36.95 -> 33.95
        us). The transpose, copy and stores are the second stage of pipelined blocks (STORED_NOTE, stage_b)."""
        P, TF, ln = self.P, self.TF, s.update_line
        chunks = column_chunks(TF, P)
        CB, k = chunks[0][1], len(chunks)
        cols = Buf(self.fresh(f"{s.out}_col"), "sbuf", "f32", (CB, k))
        out: list[Stmt] = self.pending + [Alloc(cols, zero=chunks[-1][1] < CB, line=ln)]
        group = compiled().psum_bank_bytes // (4 * P)
        for g0 in range(0, k, group):
            out += self._reduced(s, run, cols, chunks[g0:g0 + group], g0)
        # the rows turned into the last group's PSUM tile, which its reduce has read (one PSUM tile less a block),
        # when its CB partitions hold the k rows (fewer rows than chunks: a PSUM tile of their own)
        made: list[Stmt] = []
        turned = View(self.side, (sl(0, k), a(0), sl(0, CB)))
        if k > CB:
            own, made = self.psum(f"{s.out}_rowsT", (k, CB), ln)
            turned = whole(own)
        rows = Buf(self.fresh(f"{s.out}_rows"), "sbuf", self.hbm[s.out].dtype, (k, CB))
        last: list[Stmt] = [ir.Transpose(turned, whole(cols), "pe", ln), ir.Copy(whole(rows), turned, ln)]
        if s.init != IDENTITY[s.op]:
            last.append(ir.Scalar(whole(rows), whole(rows), s.op, float(s.init), ln))
        lead = (self.ch.O,) if self.at else ()
        ov, st = hbm_view(self.hbm[s.out], lead + (1, self.ch.F), self.fresh(f"{s.out}_v"), ln)
        for c, (lo, n) in enumerate(chunks):
            dst = View(ov, self.at + (full(1), _sub(self.cols, lo, n)))
            last.append(Dma(dst, View(rows, (sl(c, 1), sl(0, n))), ln))
        return st + out + made + [Alloc(rows, line=ln), ir.Loop("st", 1, tuple(last), "static", "", ln, STORED_NOTE)]

    def _extreme_chunks(self, s: ColumnReduceOp, run: Buf, acc: Buf, ones: Buf) -> list[Stmt]:
        """The chunks' transposes side by side in one PSUM tile per bank (4 chunks of 128 rows, more of a batched
        chain's fewer rows; NKI 0.1 gives each PSUM tile a bank to the loop body's end: psum_fits), one reduce each,
        the spreads on ScalarE (the ones scaled by each column), otherwise idle in the chains, not VectorE. Model
        (trn2, run), a PSUM tile, a reduce and a VectorE spread per chunk before: softmax_mid 16 x 256 x 1024 218.2
        us, spreads on ScalarE 212.1, one reduce 183.6; softmax_axis0 2048^2 129.2 -> 125.7, bf16 122.0 -> 118.4."""
        P, TF, ln = self.P, self.TF, s.update_line
        chunks = column_chunks(TF, P)
        CB, k = chunks[0][1], len(chunks)
        cols = Buf(self.fresh(f"{s.out}_col"), "sbuf", "f32", (CB, k))
        out: list[Stmt] = [Alloc(cols, line=ln)]
        group = compiled().psum_bank_bytes // (4 * P)  # chunks per bank (4 of 128 rows; more with fewer rows)
        for g0 in range(0, k, group):
            out += self._reduced(s, run, cols, chunks[g0:g0 + group], g0)
        for c, (lo, n) in enumerate(chunks):
            spread = Buf(self.fresh(f"{s.out}_spread"), "sbuf", "f32", (n, P))
            scale = View(cols, (sl(0, n), sl(c, 1)))
            out += [Alloc(spread, line=ln),
                    ir.Act(whole(spread), View(ones, (sl(0, n), full(P))), "copy", scale=scale, line=ln),
                    ir.Transpose(View(acc, (full(P), sl(lo, n))), whole(spread), "pe", ln)]
        return out

    def _reduced(self, s: ColumnReduceOp, run: Buf, cols: Buf, chunks: list[tuple[int, int]], c0: int) -> list[Stmt]:
        """Chunks c0.. of run transposed side by side into one PSUM tile and reduced into columns c0.. of cols."""
        P, CB, ln = self.P, cols.shape[0], s.update_line
        k, whole_chunks = len(chunks), sum(n == CB for _, n in chunks)
        side, out = self.psum(f"{s.out}_T", (CB, k, P), ln)
        self.side = side
        for c, (lo, n) in enumerate(chunks):
            out.append(ir.Transpose(View(side, (sl(0, n), a(c), full(P))), View(run, (full(P), sl(lo, n))), "pe", ln))
        if whole_chunks:
            out.append(ir.Reduce(View(cols, (full(CB), sl(c0, whole_chunks))),
                                 View(side, (full(CB), sl(0, whole_chunks), full(P))), s.op, ln))
        if whole_chunks < k:  # a narrower last chunk (a sub-block not 128k wide): its rows only
            n = chunks[-1][1]
            out.append(ir.Reduce(View(cols, (sl(0, n), sl(c0 + k - 1, 1))), View(side, (sl(0, n), a(k - 1), full(P))),
                                 s.op, ln))
        return out

    def output(self, expr: sx.Expr) -> list[Stmt]:
        """The row-only parts of the expression once per block, then per row tile the expression and its store."""
        user, yv = self.user, self.yv
        assert user is not None and yv is not None
        P, TF, ln, X = self.P, self.TF, user.line, self.ch.src
        out: list[Stmt] = []
        for part in row_parts(expr, set(self.rows)):
            t = Buf(self.fresh(f"{user.out}_row"), "sbuf", "f32", (P, TF))
            out += [Alloc(t, line=ln)] + self.emit(dict(self.rows), "r", part, whole(t))
            expr = replaced(expr, fmt_expr(part), sx.Access(t.name, ()))
            self.rows[t.name] = whole(t)
        cols = {c: View(b, (full(P), sl(a("rt"), 1))) for c, b in self.colbufs.items()}
        tiles = {X: self.tile(a("rt")), **self.rows, **cols}
        if self.hbm[user.out].dtype == self.res.dtype:  # Y in place of X (each tile read only by its own Y), one store
            step = self.emit(tiles, "tmp", expr, self.tile(a("rt"), self.res), set(cols))
            store = Dma(View(yv, self.at + (full(P), full(self.T), self.cols)), whole(self.res), ln)
            if not step:  # Y is the part computed in place (`Y = (X - mu)^2` after a variance's terms): stored as is
                return out + [store]
            return out + self.rows_loop(step, f"{OUTPUT_NOTE}, in place") + [store]
        res = Buf(self.fresh(f"{user.out}_tile"), "sbuf", self.hbm[user.out].dtype, (P, TF))
        step = [Alloc(res, line=ln)]
        step += self.emit(tiles, "tmp", expr, whole(res), set(cols))
        step.append(Dma(View(yv, self.at + (full(P), a("rt"), self.cols)), whole(res), ln))
        return out + self.rows_loop(step, f"{OUTPUT_NOTE} of the block")

    def rows_loop(self, body: list[Stmt], note: str) -> list[Stmt]:
        """The output's loop over the row tiles. A batched chain keeps a loop of one row tile (static) too: stage_b
        splits the block there (channel_layernorm 8 x 128 x 28 x 28, software-pipelined: see the note)."""
        if self.at and self.T == 1:
            return [ir.Loop("rt", 1, tuple(body), "static", "", self.line, note)]
        return loop("rt", self.T, body, note=note, line=self.line)


def _fold(dst: View, x: View, y: View, alu: str, cut: int, line: int) -> list[Stmt]:
    """dst = alu(x, y): columns [0, cut) on VectorE, the rest on GpSimdE (first in program order, as
    build_colreduce._fold says why)."""
    n = dst.shape()[-1]

    def part(v: View, lo: int, k: int) -> View:
        return View(v.buf, v.idx[:-1] + (_sub(v.idx[-1], lo, k),))
    out: list[Stmt] = []
    if cut < n:
        out.append(Binary(part(dst, cut, n - cut), part(x, cut, n - cut), part(y, cut, n - cut), alu, line,
                          engine="gpsimd"))
    if cut:
        out.append(Binary(part(dst, 0, cut), part(x, 0, cut), part(y, 0, cut), alu, line))
    return out


def _cut(x: Binary, t, share: float) -> list[Stmt]:
    """x with its columns cut between GpSimdE and VectorE, VectorE taking `share` of them (Work.shares: with no
    PSUM reads, the two finish together, expr_instrs.shared_binary's rule, for views of any rank). Kept whole:
    an operand outside SBUF, narrower than SHARE_MIN, a square x * x (lower_tiles moves it to ScalarE), all
    16-bit operands (VectorE's fast mode)."""
    views = (x.dst, x.a, x.b)
    n = x.dst.shape()[-1]
    if x.a == x.b and x.op == "multiply" and all(v.buf.memory == "sbuf" for v in views):
        return [ir.Act(x.dst, x.a, "square", line=x.line)]  # ScalarE, otherwise idle in the chain
    if any(v.buf.memory != "sbuf" or v.perm or not isinstance(v.idx[-1], ir.Sl) or v.idx[-1].step != 1
           or v.shape() != x.dst.shape() for v in views) or n < SHARE_MIN or x.a == x.b \
            or all(v.buf.dtype in ("f16", "bf16") for v in views):
        return [x]
    return _fold(x.dst, x.a, x.b, x.op, round(n * share), x.line)


def _power_of_two(x: float) -> bool:
    """A scale the ones of a 16-bit sum can carry exactly (1/M of a mean over M = 2^k rows), within bf16's
    normal range."""
    m, e = math.frexp(x)
    return x > 0 and m == 0.5 and -100 < e < 100


def _twin_columns(n: int, share: float) -> int:
    """VectorE's columns of a tensor_tensor reading a PSUM accumulator: all of them when GpSimdE's part would be
    narrower than SHARE_MIN / 2 (its instruction's fixed cost outweighs the columns)."""
    cut = round(n * share)
    return n if n - cut < SHARE_MIN // 2 else cut


def _sub(s, lo: int, k: int) -> ir.Sl:
    assert isinstance(s, ir.Sl)
    return ir.Sl(s.start.plus(lo), k)
