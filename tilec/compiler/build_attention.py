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

`why_not` says why six ops are not such a head (each op then takes its own builder, as before).
"""
from __future__ import annotations

from typing import AbstractSet, Callable

from tilec.compiler import ir
from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.ir import Act, Alloc, Binary, Buf, Copy, Dma, Matmul, Reduce, Scalar, Stmt, Transpose, View, full
from tilec.compiler.ops import ConvOp, EltwiseOp, ReduceOp
from tilec.compiler.schedule import PMAX, PSUM_BANK, sbuf_budget
from tilec.lang import syntax as sx
from tilec.target import target as get_target

P = PMAX  # query rows per tile, keys per block (partitions)
PSUM_F32 = PSUM_BANK // 4  # fp32 columns of one PSUM bank
OPS = 6
ITEM = {"f32": 4, "bf16": 2, "f16": 2}
AHEAD_PE, AHEAD_DMA = 3, 2  # query tiles the P V of a tile runs behind its scores (plan; PE falls back to 1)
SBUF_SHARE = 0.6  # of the kernel's SBUF budget: Q_T, K_T, V and the tiles' buffers


def _plain(op, masked: bool = False) -> bool:
    """A plain matmul; with `masked`, also one whose initial value is a tensor read at its own element (an additive
    mask, `sc[i, j] = Mk[i, j]` before `sc[i, j] += ...`: select_conv's residual)."""
    return (isinstance(op, ConvOp) and op.w_layout == "kc" and op.dim("N") == op.dim("H") == op.dim("Ho") == 1
            and op.dim("R") == op.dim("S") == 1 and op.dim("W") == op.dim("Wo") and op.bias is None
            and not op.relu and op.pool is None and not op.fused and op.clamp is None
            and (op.residual is None or masked and not op.residual_shared and not op.post_relu)
            and op.groups == 1 and op.w_relu is None and op.scale > 0.0 and not op.epilogue and not op.w_batch
            and op.out == op.name)


def raw_scale(s: ConvOp) -> float:
    """The factor the stored scores are of the matmul's raw sums, as the exponent sees them: with a mask the
    eviction applies the scale (sc = scale * sums + mask, stored), else the exponent does (`exponent`)."""
    return 1.0 if s.residual is not None else s.scale


def linear(e: sx.Expr, x: str, y: str) -> tuple[float, float, float] | None:
    """e as (a, b, c) with e = a * x + b * y + c, x and y reads of two tensors named x and y; None if it is not
    such a form (a product of two reads, a function, a division by a read)."""
    if isinstance(e, sx.Num):
        return 0.0, 0.0, float(e.value)
    if isinstance(e, sx.Access):
        return (1.0, 0.0, 0.0) if e.tensor == x else (0.0, 1.0, 0.0) if e.tensor == y else None
    if isinstance(e, sx.Neg):
        f = linear(e.x, x, y)
        return None if f is None else (-f[0], -f[1], -f[2])
    if not isinstance(e, sx.BinOp):
        return None
    lhs, rhs = linear(e.lhs, x, y), linear(e.rhs, x, y)
    if lhs is None or rhs is None:
        return None
    if e.op in "+-":
        s = 1.0 if e.op == "+" else -1.0
        return lhs[0] + s * rhs[0], lhs[1] + s * rhs[1], lhs[2] + s * rhs[2]
    if e.op == "*" and (lhs[:2] == (0.0, 0.0) or rhs[:2] == (0.0, 0.0)):
        k, f = (lhs[2], rhs) if lhs[:2] == (0.0, 0.0) else (rhs[2], lhs)
        return f[0] * k, f[1] * k, f[2] * k
    if e.op == "/" and rhs[:2] == (0.0, 0.0) and rhs[2] != 0.0:
        return lhs[0] / rhs[2], lhs[1] / rhs[2], lhs[2] / rhs[2]
    return None


def _reads(e: sx.Expr) -> list[sx.Access]:
    if isinstance(e, sx.Access):
        return [e]
    if isinstance(e, sx.BinOp):
        return _reads(e.lhs) + _reads(e.rhs)
    if isinstance(e, sx.Call):
        return [r for x in e.args for r in _reads(x)]
    if isinstance(e, sx.Neg):
        return _reads(e.x)
    return []


def _indexed(e: sx.Expr, var_of: dict[str, tuple[str, ...]]) -> bool:
    """Every read of e indexes its tensor by exactly the loop variables given for it (no shifts, no constants)."""
    return all(tuple(i.id if isinstance(i, sx.Name) else "" for i in r.indices) == var_of.get(r.tensor, ("?",))
               for r in _reads(e))


def exponent(op: EltwiseOp, sc: str, m: str, scale: float = 1.0) -> tuple[float, float, float] | None:
    """(a, b, c) of e = exp(a * sc + b * m + c), or None; sc and m counted unscaled when the scores are the
    matmul's sums times `scale` > 0 (`S += Q * K * 0.125`: the row max of the scaled scores is the scaled max, so
    the builder applies the scale in the exponent, on the raw sums in PSUM)."""
    if not (isinstance(op.expr, sx.Call) and op.expr.fn == "exp" and len(op.expr.args) == 1):
        return None
    i, j = dict(op.vars).get("d0"), dict(op.vars).get("d1")
    if i is None or j is None or not _indexed(op.expr, {sc: (i, j), m: (i,)}):
        return None
    f = linear(op.expr.args[0], sc, m)
    return None if f is None or f[0] == 0.0 else (f[0] * scale, f[1] * scale, f[2])


def conversion(op, x: str) -> str | None:
    """The input op copies exactly into x, converted to f32 (`V_f32[j, d] = f32(V[j, d])`: operand_split's copy of a
    16-bit operand beside its f32 temporary of weights), else None."""
    if not isinstance(op, EltwiseOp) or op.out != x or op.columns or op.rows or op.copy or len(op.inputs) != 1:
        return None
    e, v = op.expr, dict(op.vars)
    if not (isinstance(e, sx.Call) and e.fn == "f32" and len(e.args) == 1 and isinstance(e.args[0], sx.Access)):
        return None
    return op.inputs[0] if len(v) == 2 and _indexed(e, {op.inputs[0]: (v["d0"], v["d1"])}) else None


def span(ops: tuple, i: int) -> int:
    """How many ops from ops[i] a head would cover: six, or seven with an exact f32 copy of V before P V."""
    k = i + OPS - 2
    if i + OPS < len(ops) and isinstance(ops[k + 1], ConvOp) and conversion(ops[k], ops[k + 1].x) is not None:
        return OPS + 1
    return OPS


def head(ops: tuple, i: int) -> tuple[tuple, EltwiseOp | None]:
    """(the six ops of a head from ops[i], the f32 copy of V between its row sum and P V or None)."""
    n = span(ops, i)
    picked = ops[i:i + n]
    return (picked, None) if n == OPS else (picked[:4] + picked[5:], picked[4])


def source(o: ConvOp, cv: EltwiseOp | None) -> str:
    """The tensor the head loads as V: the copied input itself when P V reads its exact f32 copy."""
    return cv.inputs[0] if cv is not None else o.x


def weights(e: EltwiseOp, o: ConvOp, hbm: dict[str, Buf], cv: EltwiseOp | None) -> str:
    """The dtype P is carried in: e's own; or V's 16-bit dtype when P V reads V's exact f32 copy (operand_split's
    f32 weights beside a 16-bit V) and sums into that 16-bit dtype. TensorE multiplies operands of one dtype: P
    rounded to V's dtype by the exp that writes it (z summed from the unrounded values) is the head's own rounding,
    which tilec/tolerance.py names (`rounded_operand`: a computed factor beside a 16-bit read, in a sum rounded to
    that dtype); else P V runs in fp32 with V converted on chip (attn_inline_bf16 S = 1024, model: 38.07 us run
    with fp32 P V and fp32 P^T by DMA transposes, 28.11 with P in bf16)."""
    if cv is None:
        return hbm[e.out].dtype
    narrow = hbm[cv.inputs[0]].dtype
    return narrow if hbm[o.out].dtype == narrow else hbm[e.out].dtype


def why_not(ops: tuple, i: int, hbm: dict[str, Buf], scheduled: AbstractSet[str], outputs: AbstractSet[str],
            reads: Callable[[object], list[str]]) -> str:
    """"" when the ops from ops[i] form an attention head this builder keeps on chip (`span` of them); else the
    reason."""
    if i + OPS > len(ops):
        return "not six ops from the scores on (sc, its row max, exp, row sum, P V, the division)"
    six, cv = head(ops, i)
    s, m, e, z, o, fin = six
    if not (_plain(s, masked=True) and _plain(o) and type(m) is ReduceOp and type(z) is ReduceOp and isinstance(e, EltwiseOp)
            and isinstance(fin, EltwiseOp)):
        return "not matmul -> row max -> exp -> row sum -> matmul -> division"
    if (m.src, m.op, m.init, m.scale, m.expr) != (s.out, "maximum", float("-inf"), 1.0, None) or \
            (z.src, z.op, z.init, z.scale, z.expr) != (e.out, "add", 0.0, 1.0, None):
        return "the row reductions are not max(sc) and sum(e)"
    if e.inputs != (s.out,) or e.columns != (m.out,) or e.rows or e.copy or exponent(e, s.out, m.out, raw_scale(s)) is None:
        return "e is not exp of a linear form of sc and its row max"
    if o.w != e.out or o.x_transposed or fin.inputs != (o.out,) or fin.columns != (z.out,) or fin.rows or \
            not _division(fin, o.out, z.out):
        return "the second matmul does not read e as e[i, j] * V[j, d], or O is not O_acc / z"
    K, W, C, Dv = s.dim("K"), s.dim("W"), s.dim("C"), o.dim("W")
    sv, mv = dict(s.vars), dict(m.vars)
    if (o.dim("K"), o.dim("C")) != (K, W) or sv.get("k") != mv.get("k0") or sv.get("x") != mv.get("r0") or \
            len(mv) != 2:
        return "the shapes of the two matmuls do not chain"
    if K % P or W % P or C > P or Dv > PSUM_F32:
        return f"queries or keys not a multiple of {P}, head size above {P} or value size above {PSUM_F32}"
    members = ops[i:i + span(ops, i)]
    if {x.name for x in members} & set(scheduled):
        return "a directive names one of its ops"
    inner = {s.out, m.out, e.out, z.out, o.out} | ({cv.out} if cv is not None else set())
    if inner & set(outputs) or any(t in reads(x) for x in ops if x not in members for t in inner):
        return "another op or the kernel's outputs read an intermediate"
    dt = {t: hbm[t].dtype for t in (s.w, s.x, o.x, e.out)}
    if dt[s.w] != dt[s.x] or dt[e.out] != dt[o.x]:
        return "the operands of a matmul have different dtypes"
    if plan(six, hbm, cv) is None:
        return f"the rows of 2 query tiles do not fit in {SBUF_SHARE} of the SBUF budget"
    return ""


def plan(ops: tuple, hbm: dict[str, Buf], cv: EltwiseOp | None = None) -> tuple[bool, int] | None:
    """(P^T by DMA transposes, tiles ahead) for the head `ops`, or None when its buffers do not fit.

    Per query tile TensorE computes the scores and P V; P^T is either 128 x 128 PE transposes on TensorE too (fp32
    in transpose mode), or SBUF -> SBUF DMA transposes at half a copy's throughput [ARCH3, nki-spec 1.10.12] on the
    otherwise idle DMA queues. The DMA is chosen when the busier of TensorE (without transposes) and the DMA
    transposes beats TensorE with them, from the model's own constants (build_matvec.model_constants): fp32 at
    S = 1024: 4.2 us of matmuls + 1.1 us of PE transposes per tile against 2.8 us of DMA transposes; bf16: 0.9 +
    0.5 against 1.4, so PE. DMA transposes lengthen each tile's chain (exp, then P^T, then P V), so that path runs
    AHEAD_DMA tiles ahead (attn_full S = 1024 fp32, model: PE 1 ahead 65.2 us, 2 ahead 64.9; DMA 1 ahead 64.2,
    2 ahead 56.8, 3 ahead 56.8). The scores and P V each run at their own operands' rate (bf16 scores, fp32 P V
    when the weights are an f32 temporary and V their exact copy `cv`)."""
    from tilec.compiler.build_matvec import model_constants  # late: the model reads kernels
    s, e, o = ops[0], ops[2], ops[4]
    K, W, C, Dv = s.dim("K"), s.dim("W"), s.dim("C"), o.dim("W")
    NK = W // P
    ie = ITEM[weights(e, o, hbm, cv)]
    prm = model_constants()
    fs, fo = (prm["fp32_matmul"] if n == 4 else 1.0 for n in (ITEM[hbm[s.w].dtype], ie))
    ft = prm["fp32_transpose"] if ie == 4 else 1.0
    ghz, fixed = prm["tensor_ghz"], prm["mm_fixed_cycles"]
    chunks = -(-W // PSUM_F32)
    matmuls = ((W + chunks * fixed) * fs + NK * (max(Dv, prm["mm_min_cycles"]) + fixed) * fo) / ghz
    pe = NK * (P + fixed) * ft / ghz
    dma = NK * P * P * ie / (prm["dma_engines"] * prm["dma_engine_bw"] * prm["dma_transpose_sbuf_factor"])
    by_dma = max(matmuls, dma) < matmuls + pe
    masked = s.residual is not None
    rows = W * (ITEM[hbm[s.out].dtype] + 2 * ie + (ITEM[hbm[s.residual].dtype] if masked else 0)) + 16  # sc, e,
    # P^T (and the mask) of one tile, its columns
    v_bytes = NK * Dv * (ITEM[hbm[source(o, cv)].dtype] + (ie if cv is not None and ie == 4 else 0))
    fixed_bytes = K * ITEM[hbm[s.w].dtype] + W * ITEM[hbm[s.x].dtype] + v_bytes  # Q_T K_T V (and V's f32 copy)
    budget = SBUF_SHARE * sbuf_budget(get_target())
    for ahead in ((AHEAD_DMA, 1) if by_dma else (AHEAD_PE, 1)):
        if fixed_bytes + (ahead + 1 + masked) * rows <= budget:  # (a mask's load one step earlier: a set more)
            return by_dma, ahead
    return None


def _division(fin: EltwiseOp, acc: str, z: str) -> bool:
    e = fin.expr
    v = dict(fin.vars)
    return isinstance(e, sx.BinOp) and e.op == "/" and isinstance(e.lhs, sx.Access) and e.lhs.tensor == acc and \
        isinstance(e.rhs, sx.Access) and e.rhs.tensor == z and "d1" in v and \
        _indexed(e, {acc: (v["d0"], v["d1"]), z: (v["d0"],)})


class HeadBuilder:
    def __init__(self, ops: tuple, hbm: dict[str, Buf], fresh: Callable[[str], str],
                 cv: EltwiseOp | None = None) -> None:
        self.s, self.m, self.e, self.z, self.o, self.fin = ops
        self.cv, self.pdt = cv, weights(self.e, self.o, hbm, cv)
        self.hbm, self.fresh = hbm, fresh
        self.K, self.W, self.C, self.Dv = self.s.dim("K"), self.s.dim("W"), self.s.dim("C"), self.o.dim("W")
        self.NQ, self.NK = self.K // P, self.W // P
        self.a, self.b, self.c = exponent(self.e, self.s.out, self.m.out, raw_scale(self.s)) or (1.0, -1.0, 0.0)
        self.qt, self.kb = fresh("q_p"), fresh("k_b")
        self.row, self.par = a(0), 0
        self.views: list[Stmt] = []  # HBM reshapes, first in the kernel
        self.by_dma, self.depth = plan(ops, hbm, cv) or (False, AHEAD_PE)
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
        banks = get_target().psum_banks
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


def refusals(program, ops: tuple, scheduled: AbstractSet[str], chains: list,
             reads: Callable[[object], list[str]]) -> str:
    """Schedule lines for what looks like an attention head (a matmul whose output's row max is the next op) but is
    built op by op, and why (`tilec explain`)."""
    hbm = {name: Buf(name, "hbm", t.dtype, t.shape) for name, t in program.tensors.items()}
    fused = {c.members for c in chains}
    out = []
    for i in range(len(ops) - 1):
        s, m = ops[i], ops[i + 1]
        if not (isinstance(s, ConvOp) and type(m) is ReduceOp and m.src == s.out and m.op == "maximum"):
            continue
        if tuple(o.name for o in ops[i:i + span(ops, i)]) in fused:
            continue
        why = why_not(ops, i, hbm, scheduled, set(program.kernel.outputs), reads)
        out.append(f"# attention from {s.name} built op by op: {why}")
    return "".join(line + "\n" for line in out)
