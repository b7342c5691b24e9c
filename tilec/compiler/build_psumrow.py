"""`Y[i, j] = X[i, j] * f(beta[j] * X[i, j])` (swish with a per-column slope: f = sigmoid) with beta's broadcast kept
in PSUM.

The element-wise builder copies beta's broadcast (TensorE's ones-matmul into PSUM) to SBUF in fp32, so both products
of a tile are tensor_tensors of two SBUF operands, one fp32: 2N cycles each (nki-spec 1.10.4), shared by VectorE and
GpSimdE, which bound it (audit15 swish_bcast bf16 4096^2: 1.77x the floor on the trn2 model). Here the broadcast
stays in PSUM, where the matmul wrote it (N fp32 columns a partition: N <= 4096, the eight banks), so

    z = beta * X     VectorE, one operand in PSUM: N cycles (GpSimdE cannot read PSUM), a bank at a time
    s = f(z)         ScalarE, fp32
    Y = X * s        GpSimdE, and VectorE for the first VEC_SHARE of the columns (it also has the z's), stored

over tiles of 128 whole rows. The instructions and values are those of the element-wise kernel (products in fp32, f
of the fp32 product, Y rounded once), so the output bits are the same; only where beta's broadcast is read from
changes. Each engine runs in program order and the model triggers a load on the stream of the engine that first
reads it (VectorE here), so the order is skewed: X's load two tiles ahead, VectorE's z one tile ahead of its share
of Y (tile u: load(u + 2), z(u + 1), then s, Y and the store of u). In plain order the same instructions take
384-396 us at 4096^2. X's tiles rotate through three buffers, the others through two: the loop covers six tiles an
iteration, the rest written out (docs/notes/ln19/swish_psum.py is the hand experiment this follows: 1.17x at tiles
of 128 x 2048; whole rows here: 1.18x at 4096^2).
"""
from __future__ import annotations

from tilec.compiler.build_util import a, hbm_view, loop, ones_row, sl, term
from tilec.compiler.ir import Act, Aff, Alloc, Binary, Buf, Dma, Matmul, Stmt, View, full, whole
from tilec.compiler.ops import EltwiseOp
from tilec.compiler.schedule import PMAX, PSUM_BANKS as BANKS, PSUM_F32 as BANK
from tilec.lang import syntax as sx
from tilec.lang.functions import ACTIVATIONS

P = PMAX
VEC_SHARE = 8  # VectorE's part of Y = X * s: 1 / VEC_SHARE of the columns (hand experiment: 1/8 best of 1/16 .. 1/4)
HALF = ("bf16", "f16")  # beta's broadcast by a ones-matmul is exact for 16-bit rows
Built = tuple[list[tuple[str, int]], list[Stmt]]


def _read(e: sx.Expr, name: str, idx: tuple[str, ...]) -> bool:
    return isinstance(e, sx.Access) and e.tensor == name and e.fill is None and \
        tuple(x.id if isinstance(x, sx.Name) else None for x in e.indices) == idx


def matched(op, hbm: dict[str, Buf]) -> tuple[str, str, str] | None:
    """(X, beta, f) of `X[i, j] * f(beta[j] * X[i, j])` (either order of each product), else None."""
    if not isinstance(op, EltwiseOp) or op.copy or op.columns or op.out_index or len(op.vars) != 2 or \
            len(op.rows) != 1 or not isinstance(op.expr, sx.BinOp) or op.expr.op != "*":
        return None
    i, j = (v for _, v in op.vars)
    beta = op.rows[0]
    for x_read, call in ((op.expr.lhs, op.expr.rhs), (op.expr.rhs, op.expr.lhs)):
        if not (isinstance(x_read, sx.Access) and _read(x_read, x_read.tensor, (i, j))):
            continue
        x = x_read.tensor
        if not (isinstance(call, sx.Call) and call.fn in ACTIVATIONS and len(call.args) == 1):
            continue
        arg = call.args[0]
        if isinstance(arg, sx.BinOp) and arg.op == "*" and any(
                _read(p, beta, (j,)) and _read(q, x, (i, j)) for p, q in ((arg.lhs, arg.rhs), (arg.rhs, arg.lhs))):
            return x, beta, call.fn
    return None


def applies(op, hbm: dict[str, Buf]) -> tuple[str, str, str] | None:
    """The match, for 16-bit tensors whose rows fill whole PSUM banks (N <= 4096) over at least three row tiles."""
    found = matched(op, hbm)
    if found is None:
        return None
    x, beta, _ = found
    shape = hbm[x].shape
    if len(shape) != 2 or hbm[op.out].shape != shape or hbm[beta].shape != (shape[1],) or x == op.out:
        return None
    rows, cols = shape
    if any(hbm[t].dtype not in HALF for t in (x, beta, op.out)) or rows % P or rows // P < 3 or cols % BANK or \
            cols > BANK * BANKS:
        return None
    return found


class _Builder:
    def __init__(self, op: EltwiseOp, hbm: dict[str, Buf], fresh, found: tuple[str, str, str]) -> None:
        self.op, self.hbm, self.fresh = op, hbm, fresh
        self.x, self.beta, self.func = found
        self.rows, self.cols = hbm[self.x].shape
        self.T = self.rows // P
        self.vec = self.cols // VEC_SHARE
        self.line = op.line
        self.out: list[Stmt] = []
        self.used: dict[str, int] = {}

    def name(self, base: str) -> str:
        """A name of its own for each use of `base` (the allocator gives one op's base the same name each time)."""
        n = self.used[base] = self.used.get(base, 0) + 1
        return self.fresh(base if n == 1 else f"{base}_{n}")

    def buf(self, base: str, memory: str, dtype: str, shape: tuple[int, ...]) -> Buf:
        b = Buf(self.name(base), memory, dtype, shape)
        self.out.append(Alloc(b, line=self.line))
        return b

    def broadcast(self) -> None:
        """beta on every partition in PSUM, one bank at a time (kept to the end)."""
        dt = self.hbm[self.beta].dtype
        row2, views = hbm_view(self.hbm[self.beta], (1, self.cols), self.fresh(f"{self.beta}_2d"), self.line)
        ones, made = ones_row(self.fresh(f"ones_{dt}"), dt, P, self.line)
        self.out += views + made
        brow = self.buf(f"{self.beta}_row", "sbuf", dt, (1, self.cols))
        self.out.append(Dma(whole(brow), whole(row2), self.line))
        self.banks = []
        for c in range(self.cols // BANK):
            bank = self.buf(f"{self.beta}_bank{c}", "psum", "f32", (P, BANK))
            self.out.append(Matmul(whole(bank), whole(ones), View(brow, (full(1), sl(c * BANK, BANK))), self.line,
                                   start=True))
            self.banks.append(bank)

    def load(self, u: Aff, k: int) -> None:
        self.out.append(Dma(whole(self.xt[k % 3]), View(self.hbm[self.x], (self._rows(u), full(self.cols))), self.line))

    def product(self, k: int) -> None:
        x, z = self.xt[k % 3], self.zt[k % 2]
        for c, bank in enumerate(self.banks):
            cols = (full(P), sl(c * BANK, BANK))
            self.out.append(Binary(View(z, cols), View(x, cols), whole(bank), "multiply", self.line))

    def finish(self, u: Aff, k: int) -> None:
        x, z, n, v = self.xt[k % 3], self.zt[k % 2], self.cols, self.vec
        s, y = self.st[k % 2], self.yt[k % 2]
        part = lambda b, c0, w: View(b, (full(P), sl(c0, w)))  # noqa: E731
        # VectorE's share first: GpSimdE writes y last, so the store goes on GpSimdE's stream, not ahead of VectorE's
        # next loads
        self.out += [Act(whole(s), whole(z), self.func, line=self.line),
                     Binary(part(y, 0, v), part(x, 0, v), part(s, 0, v), "multiply", self.line),
                     Binary(part(y, v, n - v), part(x, v, n - v), part(s, v, n - v), "multiply", self.line, "gpsimd"),
                     Dma(View(self.hbm[self.op.out], (self._rows(u), full(n))), whole(y), self.line)]

    def _rows(self, u: Aff):
        return sl(Aff(tuple(term(t.var, t.coef * P) for t in u.terms), u.const * P), P)

    def step(self, u: Aff, k: int, static: int | None) -> None:
        """load(u + 2), z(u + 1), the rest of u; k = u's residue mod 6 (the buffers), static = u when known."""
        if static is None or static + 2 < self.T:
            self.load(u.plus(2), k + 2)
        if static is None or static + 1 < self.T:
            self.product(k + 1)
        self.finish(u, k)

    def build(self) -> list[Stmt]:
        self.broadcast()
        dt = self.hbm[self.x].dtype
        self.xt = [self.buf(f"{self.x}_tile", "sbuf", dt, (P, self.cols)) for _ in range(3)]
        self.zt = [self.buf("z", "sbuf", "f32", (P, self.cols)) for _ in range(2)]
        # allocated once like X's and z's (a tile allocated outside a loop lives to the kernel's end: the steps
        # written out after the loop would each hold their own)
        self.st = [self.buf(f"{self.func}_z", "sbuf", "f32", (P, self.cols)) for _ in range(2)]
        self.yt = [self.buf(f"{self.op.out}_tile", "sbuf", self.hbm[self.op.out].dtype, (P, self.cols))
                   for _ in range(2)]
        self.load(a(0), 0)
        self.load(a(1), 1)
        self.product(0)
        w, groups = self.name("w"), (self.T - 2) // 6  # steps u <= T - 3 load: six of them an iteration
        body: list[Stmt] = []
        saved, self.out = self.out, body
        for k in range(6):
            self.step(a(term(w, 6), k), k, None)
        self.out = saved
        if groups:
            self.out += loop(w, groups, body, "sequential", line=self.line,
                             note="six row tiles (X in three buffers, the others in two)")
        for u in range(6 * groups, self.T):
            self.step(a(u), u % 6, u)
        return self.out


def build_psum_row(op, hbm: dict[str, Buf], fresh) -> Built | None:
    """The op built as the module docstring says, or None where it does not apply."""
    found = applies(op, hbm)
    if found is None:
        return None
    return [], _Builder(op, hbm, fresh, found).build()
