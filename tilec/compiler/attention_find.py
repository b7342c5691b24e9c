"""What an attention head is, for build_attention.py: the six ops (seven with V's exact f32 copy) from the scores
on, why a run of ops is not one (`why_not`, `refusals` for `tilec explain`), the dtype P is carried in (`weights`)
and the plan (P^T by DMA or PE transposes, tiles ahead) from the model's own constants."""
from __future__ import annotations

from typing import AbstractSet, Callable

from tilec.compiler.ir import Buf
from tilec.compiler.ops import ConvOp, EltwiseOp, ReduceOp
from tilec.compiler.schedule import PMAX, PSUM_F32, sbuf_budget
from tilec.lang import syntax as sx
from tilec.target import compiled

P = PMAX  # query rows per tile, keys per block (partitions)
OPS = 6
ITEM = {"f32": 4, "bf16": 2, "f16": 2}
AHEAD_PE, AHEAD_DMA = 3, 2  # query tiles the P V of a tile runs behind its scores (plan; PE falls back to 1)
SBUF_SHARE = 0.6  # of the kernel's SBUF budget: Q_T, K_T, V and a buffer set per tile in flight
HEAD_SHARE = 0.95  # of it: every buffer the head allocates, as the capacity check counts them (`built_peak`)


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
        return "the buffers of 2 query tiles in flight do not fit the SBUF budget"
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
    rows = W * (ITEM[hbm[s.out].dtype] + 2 * ie + (ITEM[hbm[s.residual].dtype] + 4 if masked else 0)) + 16  # sc,
    # e, P^T (and the mask, the fp32 scaled scores it is added to) of one tile, its columns
    v_bytes = NK * Dv * (ITEM[hbm[source(o, cv)].dtype] + (ie if cv is not None and ie == 4 else 0))
    fixed_bytes = K * ITEM[hbm[s.w].dtype] + W * ITEM[hbm[s.x].dtype] + v_bytes  # Q_T K_T V (and V's f32 copy)
    budget = sbuf_budget(compiled())
    for ahead in ((AHEAD_DMA, 1) if by_dma else (AHEAD_PE, 1)):
        if fixed_bytes + (ahead + 1 + masked) * rows <= SBUF_SHARE * budget and \
                built_peak(ops, hbm, cv, (by_dma, ahead)) <= HEAD_SHARE * budget:  # (a mask: one set more)
            return by_dma, ahead
    return None


def built_peak(ops: tuple, hbm: dict[str, Buf], cv: EltwiseOp | None, choice: tuple[bool, int]) -> int:
    """SBUF bytes per partition the head built with `choice` needs, as the capacity check counts them
    (passes.peak_usage: the steps written out before and after the pipeline's loop allocate their tiles in
    straight-line code, all counted; a masked bf16 head 4 deep at S = 1536, 11 such steps: 231 KiB)."""
    from tilec.compiler.build_attention import HeadBuilder  # late: the builder reads this module
    from tilec.compiler.passes import peak_usage
    count = iter(range(1 << 30))
    body = HeadBuilder(ops, hbm, lambda base: f"{base}_{next(count)}", cv, choice).build()
    return peak_usage(tuple(body))[0]


def _division(fin: EltwiseOp, acc: str, z: str) -> bool:
    e = fin.expr
    v = dict(fin.vars)
    return isinstance(e, sx.BinOp) and e.op == "/" and isinstance(e.lhs, sx.Access) and e.lhs.tensor == acc and \
        isinstance(e.rhs, sx.Access) and e.rhs.tensor == z and "d1" in v and \
        _indexed(e, {acc: (v["d0"], v["d1"]), z: (v["d0"],)})


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
