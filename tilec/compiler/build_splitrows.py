"""A 16-bit (bf16, f16) layernorm over rows too long for two row tiles and b to fit SBUF: each row on two partitions.

    mu[i] += X[i, j] / N;  d = X - mu;  v[i] += d * d / N;  r = rsqrt(v + eps);  Y = d * r * g + b

At bf16 rows of 32768 (M = 512) chunk_pipe's kernel has four row tiles of 128 x 32768 and ScalarE's two statistics
passes (~55 us a tile) bound it: the pipeline's fill and drain are half the run (1.96x the floor; act18, rows18).
Here X and Y are viewed as (2M, N / 2), a plain reshape of the HBM tensors: partition p of a row tile holds half
p % 2 of row p // 2, so a row tile is 64 rows and there are twice as many, each the size of the bf16 16384 kernel's.
Only the statistics cross partitions (rows18's hand kernel, docs/notes/rows18/split_rows.py):

    A(t)  ScalarE only: per half-row its own mean m_h (copy * -1/H with row sum, H = N / 2) and its sum of squares
          about it M2_h (square(X - m_h) with row sum)
    C(t)  TensorE: one fp32 matmul by PAIR (k // 2 == m // 2) sums both halves on both partitions of a row;
          VectorE on (P, 1) columns: mean, mu = round(mean), v = (M2_a + M2_b) / N + (mu - mean)^2 + (m_own -
          mean)^2 (Chan's parallel variance: the mean of (X - mu)^2, summed in fp32 as chunk_pipe does),
          r = round((round(v) + eps) ^ -0.5): the power on GpSimdE (tensor_tensor with a column of -0.5: nki-spec
          §1.10.4 runs nl.power on GpSimdE; the NKI ALU table lists power for GpSimdE only), r on its parity's
          column of MASK2
    B(t)  d = X - mu (VectorE, 16-bit), r x g on TensorE with a K = 2 stationary (row h: r on the partitions of
          parity h; g's two halves as the moving rows), d * (r x g) on VectorE from PSUM, + b on GpSimdE (b broadcast
          per parity once before the loop by the K = 2 selector SEL), store
    order A(0); for t < T - 1 (pairs of them in a loop): A(t + 1) C(t) B(t); the last tile: C, B, its centring on
          ScalarE. B(t)'s last chunk is shifted by b and stored after C(t + 1): GpSimdE runs in program order, and
          its power of C(t + 1) then waits only for B(t)'s other chunks' + b (after them all: 1.59x the floor)

Stage C comes after the next tile's stage A in program order and has no ScalarE instruction: each engine runs in
program order, so a ScalarE rsqrt there would hold the next tile's passes (rows18: 2.34x), and a cross-partition
step inside stage A would put TensorE's stage A work ahead of the previous tile's r x g matmuls (1.87x). The first
tile's passes go chunk by chunk (ScalarE starts after one chunk's load). The constants are built on chip from one
identity (ir.Identity): MASK2[:, h] = the row sums of I[:, h::2], SEL = MASK2 turned, PAIR[:, h::2] = I[:, 0::2] +
I[:, 1::2].

Chosen where chunk_pipe would have to broadcast b again (two whole-row tiles and b do not fit the budget together):
on the trn2 model bf16 rows of 32768 go from 1.96x to ~1.5x the floor; at rows of 16384 (which fit) rows18 measured
the layout a little worse than chunk_pipe's kernel, which stays.
"""
from __future__ import annotations

from dataclasses import dataclass

from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.ir import (Act, Aff, Alloc, Binary, Buf, Copy, Dma, Identity, Matmul, Reduce, Reshape, Scalar,
                               Stmt, Transpose, View, full, whole)
from tilec.compiler.ops import EltwiseOp, Op, ReduceOp
from tilec.compiler.schedule import PMAX, PSUM_BANK
from tilec.lang import syntax as sx

P = PMAX
CHUNK = 2048  # columns a load, a store and stage B's work per chunk (chunk_pipe.PIPE_CHUNK_BYTES of bf16)
PASS = 8192  # columns one ScalarE pass instruction covers after the first tile (rows18)
BANK = PSUM_BANK // 4  # fp32 columns of one PSUM bank: one r x g matmul
HALF = ("bf16", "f16")
Built = tuple[list[tuple[str, int]], list[Stmt]]


@dataclass(frozen=True)
class Layernorm:
    """The five ops' tensors and sizes (rows M, columns N), eps and the .tl lines of the statements."""
    x: str
    g: str
    b: str
    y: str
    rows: int
    cols: int
    eps: float
    lines: tuple[int, ...]


def _acc(e: sx.Expr, name: str, n: int) -> bool:
    """e reads tensor `name` indexed by the first n of (i, j) as the chain's ops index them."""
    return isinstance(e, sx.Access) and e.tensor == name and e.fill is None and len(e.indices) == n and \
        all(isinstance(x, sx.Name) for x in e.indices)


def _bin(e: sx.Expr, op: str) -> tuple[sx.Expr, sx.Expr] | None:
    return (e.lhs, e.rhs) if isinstance(e, sx.BinOp) and e.op == op else None


def _mean(op: Op, src: str, n: int) -> bool:
    return type(op) is ReduceOp and op.op == "add" and op.init == 0.0 and op.scale == 1.0 / n and op.src == src


def layernorm(ops: list[Op], hbm: dict[str, Buf], keep: set[str]) -> Layernorm | None:
    """The chain as the five ops of the module docstring, exactly (other spellings keep the row-chain builders)."""
    if len(ops) != 5:
        return None
    mu, d, v, r, y = ops
    if not (type(mu) is ReduceOp and mu.expr is None and isinstance(d, EltwiseOp) and type(v) is ReduceOp
            and isinstance(r, EltwiseOp) and isinstance(y, EltwiseOp)):
        return None
    x, (rows, cols) = mu.src, (mu.dims[0][1], mu.dims[1][1])
    centred = _bin(d.expr, "-")
    if not (_mean(mu, x, cols) and centred and _acc(centred[0], x, 2) and _acc(centred[1], mu.out, 1)):
        return None
    sq = _bin(v.expr, "*") if v.expr is not None else None
    if not (_mean(v, d.out, cols) and sq and _acc(sq[0], d.out, 2) and _acc(sq[1], d.out, 2)):
        return None
    call = r.expr
    plus = _bin(call.args[0], "+") if isinstance(call, sx.Call) and call.fn == "rsqrt" and len(call.args) == 1 \
        else None
    if not (plus and _acc(plus[0], v.out, 1) and isinstance(plus[1], sx.Num) and float(plus[1].value) > 0):
        return None
    shift = _bin(y.expr, "+")
    scaled = _bin(shift[0], "*") if shift else None
    inner = _bin(scaled[0], "*") if scaled else None
    if not (shift and scaled and inner and _acc(inner[0], d.out, 2) and _acc(inner[1], r.out, 1)
            and isinstance(scaled[1], sx.Access) and isinstance(shift[1], sx.Access)):
        return None
    g, b = scaled[1].tensor, shift[1].tensor
    if not (_acc(scaled[1], g, 1) and _acc(shift[1], b, 1) and set(y.rows) == {g, b}):
        return None
    names = (x, mu.out, d.out, v.out, r.out, y.out, g, b)
    if any(hbm[t].dtype not in HALF for t in names) or keep != {y.out} or len({x, g, b, y.out}) < 4:
        return None
    if hbm[g].shape != (cols,) or hbm[b].shape != (cols,) or hbm[x].shape != (rows, cols):
        return None
    return Layernorm(x, g, b, y.out, rows, cols, float(plus[1].value), tuple(o.line for o in ops))


def long_rows(ln: Layernorm, budget: int) -> bool:
    """The choice: rows whose two whole-row tiles and b (16-bit) do not fit `budget` together, where chunk_pipe
    would broadcast b again chunk by chunk (bf16 rows of 32768: 1.96x the floor on the trn2 model)."""
    return 3 * ln.cols * 2 >= budget


def sizes(ln: Layernorm) -> tuple[int, int] | None:
    """(columns a chunk, columns a ScalarE pass) of the half-rows, or None where the layout does not divide the
    tensor evenly: row tiles of 64 rows, at least three, half-rows in whole PSUM banks."""
    half, tiles = ln.cols // 2, 2 * ln.rows // P
    chunk, span = min(CHUNK, half), min(PASS, half)
    if ln.cols % 2 or half % span or span % chunk or chunk % BANK or (2 * ln.rows) % P or tiles < 3:
        return None
    return chunk, span


class _Split:
    def __init__(self, ln: Layernorm, hbm: dict[str, Buf], fresh, chunk: int, span: int) -> None:
        self.ln, self.hbm, self.fresh, self.chunk, self.span = ln, hbm, fresh, chunk, span
        self.H = ln.cols // 2
        self.T = 2 * ln.rows // P
        self.lmu, self.ld, self.lv, self.lr, self.ly = ln.lines
        self.out: list[Stmt] = []
        self.used: dict[str, int] = {}
        self.dt = hbm[ln.x].dtype

    def name(self, base: str) -> str:
        """A name of its own for each use of `base` (the allocator gives one op's base the same name each time)."""
        n = self.used[base] = self.used.get(base, 0) + 1
        return self.fresh(base if n == 1 else f"{base}_{n}")

    def buf(self, base: str, memory: str, dtype: str, shape: tuple[int, ...], line: int = 0) -> Buf:
        b = Buf(self.name(base), memory, dtype, shape)
        self.out.append(Alloc(b, line=line or self.lmu))
        return b

    def emit(self, *stmts: Stmt) -> None:
        self.out.extend(stmts)

    def nested(self, fn, *args) -> list[Stmt]:
        """The statements fn adds, taken out of the current body (a loop's body)."""
        saved, self.out = self.out, []
        fn(*args)
        body, self.out = self.out, saved
        return body

    def views(self) -> None:
        ln, H = self.ln, self.H
        self.x2 = Buf(self.name(f"{ln.x}_halves"), "hbm", self.dt, (2 * ln.rows, H))
        self.y2 = Buf(self.name(f"{ln.y}_halves"), "hbm", self.dt, (2 * ln.rows, H))
        self.g2 = Buf(self.name(f"{ln.g}_halves"), "hbm", self.dt, (2, H))
        self.b2 = Buf(self.name(f"{ln.b}_halves"), "hbm", self.dt, (2, H))
        self.emit(Reshape(self.x2, self.hbm[ln.x], self.lmu), Reshape(self.y2, self.hbm[ln.y], self.ly),
                  Reshape(self.g2, self.hbm[ln.g], self.ly), Reshape(self.b2, self.hbm[ln.b], self.ly))

    def constants(self) -> None:
        """MASK2 (p % 2 == h), SEL = MASK2 turned, PAIR (k // 2 == m // 2), from one identity built on chip."""
        # the two small PSUM tiles every row tile uses, allocated once (tiles allocated outside a loop stay live
        # to the kernel's end: PSUM's eight banks would not hold the epilogue's)
        self.turn_ps = self.buf("turned_ps", "psum", self.dt, (2, P), self.lr)
        self.tot_ps = self.buf("pair_tot", "psum", "f32", (P, 2), self.lv)
        ident = self.buf("ident", "sbuf", "f32", (P, P))
        self.emit(Identity(whole(ident), self.lmu))
        self.neg_half = self.buf("neg_half", "sbuf", "f32", (P, 1), self.lr)  # the exponent of the rsqrt
        self.emit(Scalar(whole(self.neg_half), View(ident, (full(P), sl(0, 1))), "multiply", 0.0, self.lr, op1="add",
                         value1=-0.5))
        self.mask2 = self.buf("parity_mask", "sbuf", self.dt, (P, 2))
        self.pair = self.buf("pair_sum", "sbuf", "f32", (P, P))
        for h in range(2):
            self.emit(Reduce(View(self.mask2, (full(P), sl(h, 1))), View(ident, (full(P), sl(h, P // 2, 2))), "add",
                             self.lmu),
                      Binary(View(self.pair, (full(P), sl(h, P // 2, 2))), View(ident, (full(P), sl(0, P // 2, 2))),
                             View(ident, (full(P), sl(1, P // 2, 2))), "add", self.lmu))
        self.sel = self.turned(self.mask2, "parity_sel", self.ly)

    def turned(self, src: Buf, base: str, line: int) -> Buf:
        ps = self.turn_ps
        self.emit(Transpose(whole(ps), whole(src), "pe", line))
        out = self.buf(base, "sbuf", self.dt, (2, P), line)
        self.emit(Copy(whole(out), whole(ps), line))
        return out

    def broadcast_b(self) -> None:
        """b_tile[p, :] = b's half p % 2, made once: SEL.T @ (2, BANK) blocks of b's halves."""
        line = self.ly
        self.b_tile = self.buf(f"{self.ln.b}_tile", "sbuf", self.dt, (P, self.H), line)
        c = "bc"

        def body() -> None:
            part = self.buf(f"{self.ln.b}_part", "sbuf", self.dt, (2, BANK), line)
            self.emit(Dma(whole(part), View(self.b2, (full(2), sl(a(term(c, BANK)), BANK))), line))
            ps = self.buf(f"{self.ln.b}_bcast", "psum", "f32", (P, BANK), line)
            self.emit(Matmul(whole(ps), whole(self.sel), whole(part), line, start=True),
                      Copy(View(self.b_tile, (full(P), sl(a(term(c, BANK)), BANK))), whole(ps), line))
        self.emit(*loop(c, self.H // BANK, self.nested(body), note=f"{self.ln.b} on both parities", line=line))

    def state(self) -> None:
        """The tiles that cross stages, one per row-tile parity, and the passes' discarded outputs."""
        line, H = self.lmu, self.H
        self.xt = [self.buf(f"{self.ln.x}_tile", "sbuf", self.dt, (P, H), line) for _ in range(2)]
        self.st = [self.buf("half_stats", "sbuf", "f32", (P, 2), line) for _ in range(2)]
        self.mu_neg = [self.buf("mu_neg", "sbuf", "f32", (P, 1), self.ld) for _ in range(2)]
        self.r_mask = [self.buf("r_parity", "sbuf", self.dt, (P, 2), self.lr) for _ in range(2)]
        # the products of a tile's last chunk, kept until the next tile's stage C: one buffer (the next tile writes
        # it again at its own last chunk, long after the + b read it)
        last = self.buf("scaled_last", "sbuf", "f32", (P, self.chunk), self.ly)
        self.prod_last = [last, last]
        # that chunk's other tiles, allocated once too: inside the loop they would be allocation sites of their own
        # beside the chunk loop's, whose rotation buffers then no longer fit (the model's "fit" rule: 1.80x)
        self.g_last = self.buf(f"{self.ln.g}_chunk_last", "sbuf", self.dt, (2, self.chunk), self.ly)
        self.d_last = self.buf(f"{self.ln.x}_centred_last", "sbuf", self.dt, (P, self.chunk), self.ld)
        self.y_last = self.buf(f"{self.ln.y}_chunk_last", "sbuf", self.dt, (P, self.chunk), self.ly)
        self.discard = self.buf("pass_discarded", "sbuf", self.dt, (P, self.span), line)
        self.junk = self.buf("fold_discarded", "sbuf", "f32", (P, H // self.chunk), line)

    def stage_a(self, t: Aff, par: int, width: int) -> None:
        """ScalarE: the half-rows' means and sums of squares about them (width: columns per pass instruction)."""
        line, H, x, s = self.lmu, self.H, self.xt[par], self.st[par]
        n = H // width
        parts = self.buf("mean_parts", "sbuf", "f32", (P, n), line)
        cc, ck = self.name("cc"), self.name("ck")
        col = a(term(cc, width), term(ck, self.chunk))
        load = Dma(View(x, (full(P), sl(col, self.chunk))), View(self.x2, (self._rows(t), sl(col, self.chunk))), line)
        mean = Act(View(self.discard, (full(P), sl(0, width))), View(x, (full(P), sl(a(term(cc, width)), width))),
                   "copy", scale=-1.0 / H, line=line, total=View(parts, (full(P), sl(a(cc), 1))))
        self.emit(*loop(cc, n, loop(ck, width // self.chunk, [load], note="chunks of a pass", line=line) + [mean],
                        note="mean passes", line=line))
        self.emit(Act(View(self.junk, (full(P), sl(0, n))), whole(parts), "copy", line=line,
                      total=View(s, (full(P), sl(0, 1)))))
        vparts = self.buf("sq_parts", "sbuf", "f32", (P, H // self.span), self.lv)
        cv = self.name("cv")
        span = self.span
        sq = Act(View(self.discard, (full(P), sl(0, span))), View(x, (full(P), sl(a(term(cv, span)), span))),
                 "square", bias=View(s, (full(P), sl(0, 1))), line=self.lv,
                 total=View(vparts, (full(P), sl(a(cv), 1))))
        self.emit(*loop(cv, H // self.span, [sq], note="squares about the half-row's mean", line=self.lv))
        self.emit(Act(View(self.junk, (full(P), sl(0, H // self.span))), whole(vparts), "copy", line=self.lv,
                      total=View(s, (full(P), sl(1, 1)))))

    def _rows(self, t: Aff):
        return sl(Aff(tuple(term(x.var, x.coef * P) for x in t.terms), t.const * P), P)

    def col(self, base: str, dtype: str = "f32", line: int = 0) -> Buf:
        return self.buf(base, "sbuf", dtype, (P, 1), line or self.lv)

    def stage_c(self, par: int) -> None:
        """TensorE + VectorE: the halves combined, mu, v and r (no ScalarE instruction: see the docstring)."""
        lv, st = self.lv, self.st[par]
        tot = self.tot_ps
        self.emit(Matmul(whole(tot), whole(self.pair), whole(st), lv, start=True))
        c0, c1 = (full(P), sl(0, 1)), (full(P), sl(1, 1))
        mean_neg, mu = self.col("mean_neg"), self.col("mu_rounded", self.dt, self.lmu)
        e1, e2, dl, dl2 = self.col("mu_off"), self.col("mu_off_sq"), self.col("half_off"), self.col("half_off_sq")
        w, w2, vb = self.col("var_within"), self.col("var_sum"), self.col("var_rounded", self.dt)
        r, r32 = self.col("r_rounded", self.dt, self.lr), self.col("r_col", "f32", self.lr)
        vpe = self.col("var_eps", "f32", self.lr)
        self.emit(Scalar(whole(mean_neg), View(tot, c0), "multiply", 0.5, lv),
                  Scalar(whole(mu), whole(mean_neg), "multiply", -1.0, self.lmu),
                  Scalar(whole(self.mu_neg[par]), whole(mu), "multiply", -1.0, self.ld),
                  Binary(whole(e1), whole(mean_neg), whole(mu), "add", lv),
                  Binary(whole(dl), View(st, c0), whole(mean_neg), "subtract", lv),
                  Binary(whole(e2), whole(e1), whole(e1), "multiply", lv),
                  Binary(whole(dl2), whole(dl), whole(dl), "multiply", lv),
                  Scalar(whole(w), View(tot, c1), "multiply", 1.0 / self.ln.cols, lv),
                  Binary(whole(w2), whole(w), whole(e2), "add", lv),
                  Binary(whole(vb), whole(w2), whole(dl2), "add", lv),
                  Scalar(whole(vpe), whole(vb), "add", self.ln.eps, self.lr),
                  Binary(whole(r), whole(vpe), whole(self.neg_half), "power", self.lr, "gpsimd"),
                  Copy(whole(r32), whole(r), self.lr),
                  Scalar(whole(self.r_mask[par]), whole(self.mask2), "multiply", whole(r32), self.lr))

    def stage_b(self, t: Aff, par: int, last: bool) -> None:
        """d, d * (r x g), + b, stored chunk by chunk (ScalarE centres the last tile: it has no next tile). The last
        chunk's + b and store wait for the next tile's stage C (`shifted`) unless this is the last tile."""
        rows = self.turned(self.r_mask[par], "r_rows", self.ly)
        n, cc = self.H // self.chunk, self.name("cb")

        def chunk() -> None:
            c0 = a(term(cc, self.chunk))
            self.shifted(t, c0, self.steps(par, last, rows, c0, None))
        if n > 1:
            self.emit(*loop(cc, n - 1, self.nested(chunk), note="chunks of the half-rows", line=self.ly))
        end = a((n - 1) * self.chunk)
        self.steps(par, last, rows, end, self.prod_last[par])
        if last:
            self.shifted(t, end, self.prod_last[par])

    def steps(self, par: int, last: bool, rows: Buf, c0: Aff, prod: Buf | None) -> Buf:
        """The centring and the products r x g (TensorE) times d of the chunk at column c0, into prod (a new tile
        if None)."""
        ly, cols, ct = self.ly, sl(c0, self.chunk), self.name("ct")
        kept = prod is not None  # the tile's last chunk: its tiles allocated once (state)
        gc = self.g_last if kept else self.buf(f"{self.ln.g}_chunk", "sbuf", self.dt, (2, self.chunk), ly)
        self.emit(Dma(whole(gc), View(self.g2, (full(2), cols)), ly))
        d = self.d_last if kept else self.buf(f"{self.ln.x}_centred", "sbuf", self.dt, (P, self.chunk), self.ld)
        xv, mu = View(self.xt[par], (full(P), cols)), whole(self.mu_neg[par])
        self.emit(Act(whole(d), xv, "copy", bias=mu, line=self.ld) if last else
                  Scalar(whole(d), xv, "add", mu, self.ld))
        prod = prod or self.buf("scaled", "sbuf", "f32", (P, self.chunk), ly)

        def bank() -> None:
            f = sl(a(term(ct, BANK)), BANK)
            gs = self.buf("rg", "psum", "f32", (P, BANK), ly)
            self.emit(Matmul(whole(gs), whole(rows), View(gc, (full(2), f)), ly, start=True),
                      Binary(View(prod, (full(P), f)), View(d, (full(P), f)), whole(gs), "multiply", ly))
        self.emit(*loop(ct, self.chunk // BANK, self.nested(bank), note="PSUM banks", line=ly))
        return prod

    def shifted(self, t: Aff, c0: Aff, prod: Buf) -> None:
        """+ b on GpSimdE and the store of the chunk at column c0."""
        ly, cols = self.ly, sl(c0, self.chunk)
        y = self.y_last if prod is self.prod_last[0] else \
            self.buf(f"{self.ln.y}_chunk", "sbuf", self.dt, (P, self.chunk), ly)
        self.emit(Binary(whole(y), whole(prod), View(self.b_tile, (full(P), cols)), "add", ly, "gpsimd"),
                  Dma(View(self.y2, (self._rows(t), cols)), whole(y), ly))

    def step(self, t: Aff, par: int, first: bool = False) -> None:
        """A(t + 1), C(t), the previous tile's last chunk shifted and stored, B(t). GpSimdE's rsqrt of stage C thus
        comes before that last + b in its program order: it waits only for the previous tile's other chunks."""
        self.stage_a(t.plus(1), 1 - par, self.span)
        self.stage_c(par)
        if not first:
            self.shifted(t.plus(-1), a((self.H // self.chunk - 1) * self.chunk), self.prod_last[1 - par])
        self.stage_b(t, par, False)

    def build(self) -> list[Stmt]:
        self.views()
        self.constants()
        self.broadcast_b()
        self.state()
        self.stage_a(a(0), 0, self.chunk)
        self.step(a(0), 0, first=True)
        pt, rest = self.name("pt"), self.T - 2  # the steps t = 1 .. T - 2: pairs of them in a loop, an odd one after

        def pair() -> None:
            for k in range(2):
                self.step(a(term(pt, 2), 1 + k), (1 + k) % 2)
        if rest >= 2:
            self.emit(*loop(pt, rest // 2, self.nested(pair), "sequential", note="pairs of row tiles", line=self.ly))
        if rest % 2:
            self.step(a(self.T - 2), (self.T - 2) % 2)
        last, par = a(self.T - 1), (self.T - 1) % 2
        self.stage_c(par)
        self.shifted(last.plus(-1), a((self.H // self.chunk - 1) * self.chunk), self.prod_last[1 - par])
        self.stage_b(last, par, True)
        return self.out


def build_split(ops: list[Op], hbm: dict[str, Buf], fresh, keep: set[str], budget: int) -> Built | None:
    """The layernorm chain with its rows on two partitions, or None where it does not apply (module docstring)."""
    ln = layernorm(ops, hbm, keep)
    split = None if ln is None or not long_rows(ln, budget) else sizes(ln)
    if ln is None or split is None:
        return None
    return [], _Split(ln, hbm, fresh, *split).build()
