"""Instruction selection by matching: which NKI instruction of the Target's table computes a level-A statement.

`match(stmt, target)` compares an Assign/Update with the meanings of the instruction table (tilec/target.py) and
returns the instruction and how the statement's loop variables bind to the instruction's roles:

    C[i, j] += A[i, k] * B[k, j]                 nc_matmul      k: k    m: i    n: j
    conv[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
                                                 nc_matmul      k: c, r, s   m: k   n: n, y, x
    s[i] max= A[i, j]                            tensor_reduce  p: i    f: j
    s[i] += (A[i, j] - B[i, j]) * (A[i, j] - B[i, j])
                                                 activation     FN: square  p: i  f: j  reduce_res: s (the row sum)
    B[e, y, x] += (A[e, y + r - 1, x + s - 1] ?? 0) * Wd[e, r, s]
                                                 scalar_tensor_tensor  p: e   f: y, x   taps: r, s
    Y[j, i] = X[i, j]                            nc_transpose   p: i    f: j
    Y[i, j] = exp(X[i, j] - m[i])                activation     (FN from tilec/lang/functions.py)
    Y[i, j] = A[i, j] / B[i, j]                  tensor_tensor
    Y[i, j] = X[i, j] * 2                        tensor_scalar
    z[i] = x[i]                                  dma_copy
    conv[n, k, y, x] = b[k]                      activation     FN: copy, bias: k (the column added on eviction)
    H[i, j] = b[j]                               nc_matmul      n: j (ones[1, P].T @ b: the row on every partition)

The stationary operand of a matmul is the smaller side (a conv's weights, free over the out channels k; on a tie the
operand indexing the output's leading dimension); the limits (k, m <= 128, n <= 512) then say how the loops must be
split. Every example's statements match (tests/compiler/test_tensorize.py); the `nest` stage prints the match of each.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from tilec.compiler import ir
from tilec.compiler.build_util import broadcast_row
from tilec.compiler.expr_instrs import ExprCompiler
from tilec.compiler.fn_chain import nest_read
from tilec.compiler.ir import Aff, View
from tilec.compiler.nest import Access, Assign, Const, Expr, Index, Load, Op, Stmt, Update, loads, map_loads
from tilec.errors import InternalError, Span
from tilec.lang import syntax as sx
from tilec.lang.functions import ACCUMULATE, FUNCTIONS
from tilec.target import Instr, Target, target as get_target


@dataclass(frozen=True)
class Match:
    instr: Instr
    roles: tuple[tuple[str, tuple[str, ...]], ...]  # instruction role -> the statement's loop variables

    def __str__(self) -> str:
        bound = "; ".join(f"{r}: {', '.join(vs)}" for r, vs in self.roles if vs)
        return f"{self.instr.name}({bound})" if bound else self.instr.name


def _vars(a: Access) -> list[str]:
    out: list[str] = []
    for i in a.index:
        out += [t.var for t in i.terms if t.var not in out]
    return out



def match(s: Stmt, target: Target | str | None = None) -> Match | None:
    t = get_target(target)
    if isinstance(s, Update):
        return _match_update(s, t)
    if isinstance(s, Assign):
        return _match_assign(s, t)
    return None


def _match_update(s: Update, t: Target) -> Match | None:
    out = _vars(s.dst)
    e = s.expr
    operands = [a for a in map(_operand, e.args) if a is not None] if isinstance(e, Op) else []
    if s.op == "+=" and isinstance(e, Op) and e.name == "*" and len(operands) == len(e.args) \
            and len({a.buf for a in operands}) == 2:  # a contraction of two different tensors
        a, b = operands
        va, vb = _vars(a), _vars(b)
        k = tuple(v for v in va if v in vb and v not in out)
        fa, fb = [v for v in va if v not in k], [v for v in vb if v not in k]
        if k and set(fa) | set(fb) == set(out) and not set(fa) & set(fb):
            stat, mov = (fa, fb) if _leads(fa, fb, out) else (fb, fa)
            return Match(t.instr("nc_matmul"), (("k", k), ("m", tuple(stat)), ("n", tuple(mov))))
    mac = _multiply_accumulate(s, t)
    if mac is not None:
        return mac
    reads = loads(e)
    if s.op == "+=" and square(e) is not None and reads and \
            all(_vars(r)[:len(out)] == out and len(_vars(r)) > len(out) for r in reads):  # rows of a square summed
        free = tuple(v for v in _vars(reads[0]) if v not in out)
        return Match(t.instr("activation"), (("FN", ("square",)), ("p", tuple(out)), ("f", free),
                                             ("reduce_res", (s.dst.buf,))))
    if reads and all(set(out) < set(_vars(r)) for r in reads):  # whole dimensions reduced
        free = tuple(v for v in _vars(reads[0]) if v not in out)
        return Match(t.instr("tensor_reduce"), (("p", tuple(out)), ("f", free)))
    return None


def square(e: Expr) -> Expr | None:
    """x when the expression is `x * x` (both operands the same expression), else None."""
    return e.args[0] if isinstance(e, Op) and e.name == "*" and len(e.args) == 2 and e.args[0] == e.args[1] else None


def _operand(x: Expr) -> Access | None:
    """The one access a contraction operand reads: a load, or a function of one load and constants
    (`relu(T[..] ?? 0)`, `min(relu(B[..]), 6)`: applied to the operand as it is staged, before the matmul)."""
    reads = loads(x)
    return reads[0] if len(reads) == 1 and not _uses_index(x) else None


def _uses_index(x: Expr) -> bool:
    return isinstance(x, Index) or (isinstance(x, Op) and any(_uses_index(a) for a in x.args))


def _multiply_accumulate(s: Update, t: Target) -> Match | None:
    """`dst[.., p, ..] += data[..] * col[p, taps]`: a per-partition multiply-accumulate, one instruction per tap
    (a depthwise conv: no sum over channels, the weights a column per tap). `data` may be any expression whose reads
    cover the output's loops."""
    out, e = _vars(s.dst), s.expr
    if s.op != "+=" or not isinstance(e, Op) or e.name != "*" or len(e.args) != 2:
        return None
    for data, col in (e.args, e.args[::-1]):
        reads = loads(data)
        if not isinstance(col, Load) or not reads or not all(set(out) <= set(_vars(r)) for r in reads):
            continue
        p = tuple(v for v in _vars(col.access) if v in out)
        taps = tuple(v for v in _vars(col.access) if v not in out)
        if p and set(p) < set(out) and taps:
            return Match(t.instr("scalar_tensor_tensor"), (("p", p), ("f", tuple(v for v in out if v not in p)),
                                                          ("taps", taps)))
    return None


def _leads(fa: list[str], fb: list[str], out: list[str]) -> bool:
    """Whether the first operand is the stationary one: the smaller side (a conv's weights, free over k only), or on
    a tie the one indexing the output's leading dimension (A in C[i, j] += A[i, k] * B[k, j])."""
    if len(fa) != len(fb):
        return len(fa) < len(fb)
    return min(out.index(v) for v in fa) < min(out.index(v) for v in fb)


def _match_assign(s: Assign, t: Target) -> Match | None:
    out, e = _vars(s.dst), s.expr
    if isinstance(e, Load):
        src = _vars(e.access)
        if src == out:
            return Match(t.instr("dma_copy"), ())
        if src and set(src) < set(out) and src == out[len(out) - len(src):]:  # a row, copied to every partition
            return Match(t.instr("nc_matmul"), (("k", ()), ("m", ("ones",)), ("n", tuple(src))))
        if set(src) < set(out):  # a per-partition column: the bias of an activation (a copy)
            return Match(t.instr("activation"), (("FN", ("copy",)), ("bias", tuple(src))))
        if sorted(src) == sorted(out):
            k = next(i for i, (x, y) in enumerate(zip(src, out)) if x != y)
            return Match(t.instr("nc_transpose"), (("batch", tuple(out[:k])), ("p", tuple(src[k:k + 1])),
                                                   ("f", tuple(v for v in src[k:] if v != src[k]))))
        return None
    read = _transposed_read(s)
    if read is not None:  # work around a permuted read: transposed, then done on the eviction (fn_chain.py)
        return _match_assign(replace(s, expr=read), t)
    if isinstance(e, Const):  # a fill: the constant added to a zeroed tile
        return Match(t.instr("tensor_scalar"), (("OP", ("add to zeros",)),))
    if isinstance(e, Op) and e.name in FUNCTIONS and FUNCTIONS[e.name].instr == "activation":
        return Match(t.instr("activation"), (("FN", (e.name,)),))
    if isinstance(e, Op) and (e.name in ("+", "-", "*", "/") or e.name in FUNCTIONS):
        consts = [x for x in e.args if isinstance(x, (Const, Index))]
        name = "tensor_scalar" if consts or any(_narrower(x, out) for x in e.args) else "tensor_tensor"
        return Match(t.instr(name), (("OP", (e.name,)),))
    if isinstance(e, Op) and e.name == "neg":
        return Match(t.instr("tensor_scalar"), (("OP", ("multiply by -1",)),))
    return None


def _narrower(e: Expr, out: list[str]) -> bool:
    """An operand that reads a leading run of the output's indices only: a per-partition column (tensor_scalar's
    operand). A trailing run is a row, copied to every partition first and then a full operand."""
    reads = loads(e)
    return bool(reads) and all(len(_vars(r)) < len(out) and _vars(r) == out[:len(_vars(r))] for r in reads)


# ---- emission: a tensorized nest -> level-B statements ---------------------------------------------------------------


def local(s: Assign, nest: set[str]) -> Assign:
    """The statement as the instruction sees it: indices over the nest's own loops only (outer loops are fixed for
    one instruction, they only place its operands)."""
    def acc(a: Access) -> Access:
        return Access(a.buf, tuple(Aff(tuple(t for t in i.terms if t.var in nest)) for i in a.index))
    return replace(s, dst=acc(s.dst), expr=map_loads(s.expr, acc))


def to_syntax(e: Expr) -> sx.Expr:
    """A level-A expression as the .tl expression it came from (same spans: instructions keep their lines)."""
    span = e.span if not isinstance(e, Index) and e.span is not None else _NO_SPAN
    if isinstance(e, Const):
        return sx.Num(e.value, span)
    if isinstance(e, Load):
        return sx.Access(e.access.buf, (), span)
    if isinstance(e, Op) and e.name == "neg":
        return sx.Neg(to_syntax(e.args[0]), span)
    if isinstance(e, Op) and e.name in ("+", "-", "*", "/"):
        return sx.BinOp(e.name, to_syntax(e.args[0]), to_syntax(e.args[1]), span)
    if isinstance(e, Op):
        return sx.Call(e.name, tuple(to_syntax(x) for x in e.args), span)
    raise TypeError(f"a loop index as a value has no tile instruction: {e}")


_NO_SPAN = Span("", 0, 0, 0, 0)


@dataclass
class Emit:
    """What an emission needs from the lowering: the level-B view of an access inside the nest, fresh names, and
    a ones row per dtype (the stationary side of a partition broadcast, made once per kernel part)."""
    view: Callable[[Access], View]
    fresh: Callable[[str], str]
    ones: Callable[[str, int, int], ir.Buf]  # (dtype, partitions, .tl line)
    memory: Callable[[str], str]
    ones_col: Callable[[str, int], ir.Buf] | None = None  # (buffer summed, partitions): a column of its dtype
    ones_block: Callable[[str, int, int], ir.Buf] | None = None  # (buffer summed, blocks, rows each): block-diagonal


def emit(s: Assign, nest: dict[str, int], target: Target, e: Emit, fold: bool = False,
         regroup: bool = False, psum: str = "", engine: str = "", temps: str = "tmp",
         once: tuple[str, ...] = ()) -> list[ir.Stmt]:
    """The instructions computing `s` over the loops `nest` (partition loop first): matched against the target's
    instruction table, then written with that instruction's operands. `engine` "scalar": an on-chip copy runs on
    ScalarE (activation copy) instead of VectorE, so a rule can share copies between the engines. `temps` names
    the expression's temporaries (tmp1, tmp2..; each region of a ragged nest has its own, of its own shape).
    `once`: operand tiles made on chip once (broadcast rows), not loaded with each tile."""
    m = match(local(s, set(nest)), target)
    if m is None:
        raise InternalError(f"tensorize: no instruction of {target.name} computes {s}")
    if any(a.fill is not None for a in loads(s.expr)):  # a rule stages a padded read's halo before it gets here
        raise InternalError(f"tensorize: a padded read reaches instruction emission unstaged: {s}")
    dst = e.view(s.dst)
    if m.instr.name == "dma_copy" and isinstance(s.expr, Load):
        src = e.view(s.expr.access)
        if "hbm" in (e.memory(s.dst.buf), e.memory(s.expr.access.buf)):
            return [ir.Dma(dst, src, s.line)]
        if engine == "scalar":
            return [ir.Act(dst, src, "copy", line=s.line)]
        return [ir.Copy(dst, src, s.line)]
    if m.instr.name == "nc_matmul" and dict(m.roles).get("m") == ("ones",) and isinstance(s.expr, Load):
        if dst.shape()[0] == 1:  # a row "broadcast" to one partition is the row itself: a copy, no PSUM tile
            src = e.view(s.expr.access)
            hbm = "hbm" in (e.memory(s.dst.buf), e.memory(s.expr.access.buf))
            return [ir.Dma(dst, src, s.line) if hbm else ir.Copy(dst, src, s.line)]
        return _partition_broadcast(s, dst, e)
    if m.instr.name == "nc_transpose" and isinstance(s.expr, Load):
        return _transpose(s, dst, e, psum)
    if m.instr.name == "nc_transpose":  # work around the read (fn_chain): transposed, then done on the eviction
        return _transpose_work(s, list(nest), dst, e, psum, temps, target)
    # each read its own operand: one buffer read at two places (a pair of rows `A[p, 0, f] + A[p, 1, f]`) is two
    names: dict[Access, str] = {}
    for a in loads(s.expr):
        if a not in names:
            seen = sum(b.buf == a.buf for b in names)
            names[a] = a.buf if not seen else f"{a.buf}#{seen}"
    expr = map_loads(s.expr, lambda a: replace(a, buf=names[a]))
    tiles = {names[a]: e.view(a) for a in names}
    free = set(list(nest)[1:])  # a column's index uses none of the free loops (only the partitions)
    columns = {names[a] for a in names if not any(t.var in free for i in a.index for t in i.terms)}
    shape = dst.shape()
    return ExprCompiler(tiles, (shape[0], math.prod(shape[1:])), s.line, e.fresh, columns, fold=fold,
                        prefix=temps, regroup=regroup, share=target, once=set(once)).emit(to_syntax(expr), dst)


def _partition_broadcast(s: Assign, dst: View, e: Emit) -> list[ir.Stmt]:
    """tile[p, f] = row[0, f]: ones[1, P].T @ row[1, F] on TensorE into one PSUM bank, copied out to the tile."""
    assert isinstance(s.expr, Load)
    row = e.view(s.expr.access)
    parts, free = dst.shape()[0], math.prod(dst.shape()[1:])
    base = s.dst.buf.removesuffix("_tile")
    acc = ir.Buf(e.fresh(f"{base}_bcast"), "psum", "f32", (parts, free))
    return broadcast_row(acc, e.ones(row.buf.dtype, parts, s.line), row, s.line) + [ir.Copy(dst, ir.whole(acc), s.line)]


def _transposed_read(s: Assign) -> Load | None:
    """The permuted read of a value that does work on the way through a transpose (fn_chain.py), else None."""
    if isinstance(s.expr, Load):
        return None
    out = _vars(s.dst)
    read = nest_read(s.expr, out, out)
    return read if read is not None and _vars(read.access) != out else None


def _transpose_work(s: Assign, nest: list[str], dst: View, e: Emit, psum: str, temps: str, target: Target
                    ) -> list[ir.Stmt]:
    """The value of a transposed read that does work on the way (fn_chain.py), its other reads per-partition
    columns: over the result's partitions, the read transposed into PSUM (or by a DMA transpose into dst) and the
    value computed from that tile into dst; over the source's (the nest's partition loop), the value computed on
    the source block into an f32 SBUF tile, which is transposed into PSUM and copied out (rounding once)."""
    loc = local(s, set(nest))
    found = _transposed_read(loc)  # as matched: over the nest's own loops
    assert found is not None  # _match_assign matched it
    read = Load(loads(s.expr)[loads(loc.expr).index(found.access)])
    names = {a: f"{a.buf}#{n}" for n, a in enumerate(dict.fromkeys(loads(s.expr))) if a != read.access}
    out = _vars(loc.dst)
    tiles = {a for a, b in zip(loads(s.expr), loads(loc.expr)) if a in names and _vars(b) == out}  # like dst
    before = any(nest[0] in _vars(b) for a, b in zip(loads(s.expr), loads(loc.expr)) if a in names and a not in tiles)
    value = to_syntax(map_loads(s.expr, lambda a: replace(a, buf="t" if a == read.access else names[a])))
    columns = {names[a]: e.view(a) for a in names if a not in tiles}
    operands = {**columns, **{names[a]: e.view(a) for a in tiles}}
    if before:
        src = e.view(read.access)
        tmp = ir.Buf(e.fresh(f"{s.dst.buf}_pre"), "sbuf", "f32", src.shape())
        # fold: column terms on ScalarE (FN(x * scale + bias)), so the eviction's copy on VectorE overlaps them
        work = ExprCompiler({"t": src, **columns}, (src.shape()[0], math.prod(src.shape()[1:])), s.line, e.fresh,
                            set(columns), fold=True, prefix=temps, share=target).emit(value, ir.whole(tmp))
        tp = ir.Buf(e.fresh(psum or f"{s.dst.buf}_tp"), "psum", "f32", dst.shape())
        return [ir.Alloc(tmp, line=s.line), *work, ir.Alloc(tp, line=s.line),
                ir.Transpose(ir.whole(tp), ir.whole(tmp), "pe", s.line), ir.Copy(dst, ir.whole(tp), s.line)]
    moved = _transpose(replace(s, expr=read), dst, e, psum)
    tile = moved[-1].src if isinstance(moved[-1], ir.Copy) else dst  # the PSUM tile, or dst (a DMA transpose)
    work = ExprCompiler({"t": tile, **operands}, (dst.shape()[0], math.prod(dst.shape()[1:])), s.line, e.fresh,
                        set(columns), prefix=temps, share=target).emit(value, dst)
    return (moved[:-1] if isinstance(moved[-1], ir.Copy) else moved) + _off_vector(work)


def _off_vector(work: list[ir.Stmt]) -> list[ir.Stmt]:
    """A block's eviction work with its tensor_tensors on SBUF tiles moved whole to GpSimdE when VectorE has
    another instruction there (the one reading PSUM: GpSimdE cannot): a block is too narrow to cut one in two
    (expr_instrs.SHARE_MIN), and `A[b, i, j] * A[b, j, i] + c[j, i]` in bf16 had two per block on VectorE."""
    vector = [x for x in work if isinstance(x, (ir.Binary, ir.Scalar)) and not x.engine]
    if len(vector) < 2 or not any(v.buf.memory == "psum" for x in vector for v in ir.views(x)[1:]):
        return work  # (after a DMA transpose nothing reads PSUM: the work stays whole on VectorE)

    def off(x: ir.Stmt) -> ir.Stmt:
        if isinstance(x, ir.Binary) and not x.engine and x.scale0 == 1.0 and \
                all(v.buf.memory == "sbuf" for v in (x.dst, x.a, x.b)):
            return replace(x, engine="gpsimd")
        return x
    return [off(x) for x in work]


def _transpose(s: Assign, dst: View, e: Emit, psum: str) -> list[ir.Stmt]:
    """dst[f, p] = src[p, f]: from HBM a DMA transpose (dma_transpose) straight into the tile; from SBUF TensorE's
    nc_transpose into a PSUM tile (named `psum`; it keeps the input dtype), copied out (converting) to the tile."""
    assert isinstance(s.expr, Load)
    src = e.view(s.expr.access)
    if e.memory(s.expr.access.buf) == "hbm":
        return [ir.Transpose(dst, src, "dma", s.line)]
    tp = ir.Buf(e.fresh(psum or f"{s.dst.buf}_tp"), "psum", src.buf.dtype, dst.shape())
    return [ir.Alloc(tp, line=s.line), ir.Transpose(ir.whole(tp), src, "pe", s.line),
            ir.Copy(dst, ir.whole(tp), s.line)]




def emit_update(s: Update, nest: dict[str, int], target: Target, e: Emit, accumulate: bool = False
                ) -> list[ir.Stmt]:
    """`acc[p, 0] OP= src[p, f..]` over the nest (partition loop first): one tensor_reduce over the free loops into
    the (P, 1) accumulator column. Without `accumulate` it writes the column rather than combining into it (the
    rule folded the reduction's identity initial value into the only free tile); with it, the reduce goes into a
    new column `BASE_part` combined into the accumulator (tensor_tensor OP), which starts at the identity. An
    update that the partition loop does not index sums the partitions: ones[P, 1].T @ src on TensorE into the PSUM
    row (`s_acc[0, f] += A_tile[p, f]`, a column sum; the ones column in src's dtype, made once)."""
    pvar = next(iter(nest))
    stacked = _stacked(s, nest)
    if stacked is not None and e.ones_block is not None:  # K blocks of R partitions, each summed into its row
        K, R, blocks = stacked
        ones = e.ones_block(s.expr.access.buf, K, R)  # type: ignore[union-attr]
        return [ir.Matmul(e.view(s.dst), ir.whole(ones), blocks(e), s.line)]
    if s.op == "+=" and isinstance(s.expr, Load) and e.ones_col is not None and \
            not any(t.var == pvar for i in s.dst.index for t in i.terms):  # the partitions summed (a column sum)
        ones = e.ones_col(s.expr.access.buf, nest[pvar])
        # (the last part of a cut sums fewer partitions: the first rows of the column)
        col = ir.whole(ones) if ones.shape[0] == nest[pvar] else \
            ir.View(ones, (ir.Sl(ir.Aff(), nest[pvar]), ir.full(1)))
        return [ir.Matmul(e.view(s.dst), col, e.view(s.expr.access), s.line)]
    m = match(local_update(s, set(nest)), target)
    if m is None or m.instr.name != "tensor_reduce" or not isinstance(s.expr, Load):
        raise InternalError(f"tensorize: no reduce instruction of {target.name} computes {s}")
    acc, src, op = e.view(s.dst), e.view(s.expr.access), ACCUMULATE[s.op]
    if not accumulate:
        return [ir.Reduce(acc, src, op, s.line)]
    part = ir.Buf(e.fresh(f"{s.dst.buf.removesuffix('_acc')}_part"), "sbuf", "f32", acc.shape())
    return [ir.Alloc(part, line=s.line), ir.Reduce(ir.whole(part), src, op, s.line),
            ir.Binary(acc, acc, ir.whole(part), op, s.line)]


def _stacked(s: Update, nest: dict[str, int]) -> tuple[int, int, Callable[[Emit], View]] | None:
    """(K, R, the summed tile's view) when the update sums K blocks of R partitions into K rows, `acc[k, f] +=
    A_tile[R*k + p, f]` over k (K partitions) and p (R, summed): o's stacked on the partitions, one matmul by a
    (K*R, K) block-diagonal ones matrix (rules.colreduce); None otherwise."""
    loops = list(nest)
    if s.op != "+=" or not isinstance(s.expr, Load) or len(loops) < 3:
        return None
    k, p = loops[0], loops[1]
    K, R = nest[k], nest[p]
    first, rest = s.expr.access.index[0], s.expr.access.index[1:]
    inner = sorted((t.var, t.coef) for t in first.terms if t.var in nest)
    if inner != sorted([(k, R), (p, 1)]) or s.dst.index[0] != Aff((ir.Term(k),)) or \
            any(t.var in (k, p) for i in (*rest, *s.dst.index[1:]) for t in i.terms):
        return None
    outer = Aff(tuple(t for t in first.terms if t.var not in nest), first.const)
    plain = replace(s.expr.access, index=(Aff((ir.Term(p),)),) + rest)

    def src(e: Emit) -> View:
        v = e.view(plain)
        return View(v.buf, (ir.Sl(outer, K * R),) + v.idx[1:])
    return K, R, src


def local_update(s: Update, nest: set[str]) -> Update:
    def acc(a: Access) -> Access:
        return Access(a.buf, tuple(Aff(tuple(t for t in i.terms if t.var in nest)) for i in a.index))
    return replace(s, dst=acc(s.dst), expr=map_loads(s.expr, acc))
