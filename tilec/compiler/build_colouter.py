"""A reduction over a middle dimension with many kept rows before it and a short reduced run: the kept outer rows on
the partitions (build_column_outer).

The source is seen as [O, R, F] (ops.ColumnReduceOp). The ones-matmul layout (build_colreduce) puts the R reduced
rows on the partitions: with R well under 128 most partitions idle, and every o is a load, a matmul, an eviction
and a store of its own (audit15's mean over the height of [8, 256, 56, 56]: 2048 steps of 56 partitions, 28x the
DMA floor on the model). Here 128 o's go on the partitions, each with its R x F elements contiguous in HBM (one
DMA of 128 runs), and the R rows of each partition are added along the free axis by halving:

    A_v[ot, p, r*F + f] = A;  s_v[ot, p, f] = s
    for ot:
      A_tile[p, :] = A_v[ot, p, :]                                    one DMA, R*F contiguous elements per partition
      acc[p, 0:h2*F] = A_tile[p, 0:h2*F] + A_tile[p, (R-h2)*F:R*F]    h2 = R // 2; then h = R - h2 rows left
      acc[p, 0:h2*F] += acc[p, (h-h2)*F:h*F]                          ... until one row of F is left
      s_tile = acc[p, 0:F] * k (ScalarE) + c;  s_v[ot, p, :] = s_tile

Every add reads and writes contiguous runs (no strided access), takes about half the elements of the one before
(R - 1 rows of F in all, as the R - 1 adds of a running sum, in ceil(log2 R) instructions), and is shared between
VectorE and GpSimdE by columns (build_colreduce._vector_columns). An expression of several same-indexed tensors
is computed on the loaded tiles first (expr_instrs.ExprCompiler), as build_colreduce does on its tiles.
"""
from __future__ import annotations

import math

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh
from tilec.compiler.build_reduce import result_tile
from tilec.compiler.build_util import a, hbm_view, loop, sl
from tilec.compiler.expr_instrs import ExprCompiler
from tilec.compiler.exprs import fmt_expr
from tilec.compiler.ir import DTYPE_BYTES, Alloc, Binary, Buf, Dma, Scalar, Stmt, View, full, whole
from tilec.compiler.ops import ColumnReduceOp
from tilec.target import compiled

OUTER_ROWS = 64  # reduced rows: at most this many (half the partitions) leave the ones-matmul layout half idle
OUTER_BYTES = 48 * 1024  # per partition: the loaded R x F run of every input and the terms (two steps in flight)
ALU = {"add": "add", "maximum": "maximum", "minimum": "minimum"}


def outer_layout(O: int, R: int, F: int, dtype: str, inputs: int, init_tensor: bool) -> bool:
    """Whether a reduction of [O, R, F] over R is built with the kept outer rows on the partitions
    (build_column_outer): O a multiple of the partitions, 2 <= R <= OUTER_ROWS (the ones-matmul layout would leave
    at least half of them idle), each o's R x F run of every input (and of the f32 terms of an expression) within
    OUTER_BYTES per partition, and the initial value a constant."""
    P = compiled().pmax
    if init_tensor or O % P or R < 2 or R > OUTER_ROWS:
        return False
    per = R * F * (DTYPE_BYTES[dtype] * inputs + (4 if inputs > 1 else 0))
    return per <= OUTER_BYTES


def build_column_outer(op: ColumnReduceOp, hbm: dict[str, Buf], fresh: Fresh) -> tuple[list[tuple[str, int]],
                                                                                        list[Stmt]]:
    """The loop nest of the module docstring for `s[o, f] = c; s[o, f] op= expr(A[o, r, f], ..) * k`."""
    from tilec.compiler.build_colreduce import _vector_columns
    P = compiled().pmax
    O, R, F = op.dim("O"), op.dim("R"), op.dim("F")
    line, ln = op.line, op.update_line
    dtype, out_dtype = hbm[op.src].dtype, hbm[op.out].dtype
    stmts: list[Stmt] = []
    tiles: dict[str, View] = {}
    body: list[Stmt] = []
    for name in op.inputs or (op.src,):
        v, st = hbm_view(hbm[name], (O // P, P, R * F), fresh(f"{name}_v"), line)
        stmts += st
        t = Buf(fresh(f"{name}_tile"), "sbuf", hbm[name].dtype, (P, R * F))
        body += [Alloc(t, line=ln), Dma(whole(t), View(v, (a("ot"), full(P), full(R * F))), ln)]
        tiles[name] = whole(t)
    out_v, st = hbm_view(hbm[op.out], (O // P, P, F), fresh(f"{op.out}_v"), line)
    stmts += st
    src = tiles[op.src].buf
    if op.expr is not None:
        src = Buf(fresh(f"{op.out}_terms"), "sbuf", "f32" if op.inputs else dtype, (P, R * F))
        body.append(Alloc(src, line=ln))
        body += ExprCompiler(tiles, src.shape, ln, fresh, set()).emit(op.expr, whole(src))
    acc = Buf(fresh(f"{op.out}_acc"), "sbuf", "f32", (P, (R - R // 2) * F))
    body.append(Alloc(acc, line=ln))
    if R % 2:  # the middle row of an odd R has no partner in the first add: ScalarE (idle here) copies it over
        mid = (R // 2) * F
        body.append(ir.Act(View(acc, (full(P), sl(mid, F))), View(src, (full(P), sl(mid, F))), "copy", line=ln))
    alu = ALU[op.op]
    vc = _vector_columns((R // 2) * F, "f32", folds=max(1, math.ceil(math.log2(R))))
    h, first = R, True
    while h > 1:
        h2 = h // 2
        n = h2 * F
        x = src if first else acc
        cut = min(n, max(0, round(vc * n / ((R // 2) * F))))
        body += _add(acc, x, x, (h - h2) * F, n, cut, alu, ln)
        h, first = h - h2, False
    res = _finish(op, hbm, fresh, acc, F, out_dtype, body)
    body.append(Dma(View(out_v, (a("ot"), full(P), full(F))), whole(res), ln))
    outer = ", ".join(v for role, v in op.vars if role.startswith("o"))
    red = ", ".join(v for role, v in op.vars if role.startswith("r"))
    nest = loop("ot", O // P, body, note=f"for {outer} (TILE_P at a time, on the partitions)",
                line=op.line_of("o0"))
    summed = op.src if op.expr is None else fmt_expr(op.expr)
    word = {"add": "sum", "maximum": "max", "minimum": "min"}[op.op]
    what = f"{op.out} = {word} over {red} of {summed} (the outer rows on the partitions, the {R} rows " \
           "halved along the free axis on VectorE and GpSimdE)"
    return [("TILE_P", P)], stmts + [ir.Block(what, tuple(nest), line)]


def _add(acc: Buf, x: Buf, y: Buf, lo: int, n: int, cut: int, alu: str, line: int) -> list[Stmt]:
    """acc[:, 0:n] = alu(x[:, 0:n], y[:, lo:lo+n]): columns [0, cut) on VectorE, the rest on GpSimdE, whose part
    comes first in program order (build_colreduce._fold says why)."""
    P = acc.shape[0]
    part = lambda b, s, k: View(b, (full(P), sl(s, k)))  # noqa: E731
    out: list[Stmt] = []
    if cut < n:
        out.append(Binary(part(acc, cut, n - cut), part(x, cut, n - cut), part(y, lo + cut, n - cut), alu, line,
                          engine="gpsimd"))
    if cut:
        out.append(Binary(part(acc, 0, cut), part(x, 0, cut), part(y, lo, cut), alu, line))
    return out


def _finish(op: ColumnReduceOp, hbm, fresh: Fresh, acc: Buf, F: int, out_dtype: str, body: list[Stmt]) -> Buf:
    """The first F columns of acc with the constant factor (on ScalarE's copy) and the initial value applied, in the
    output's dtype."""
    P, ln = acc.shape[0], op.update_line
    row = View(acc, (full(P), sl(0, F)))
    if op.op != "add":  # max/min: the initial value is one more operand of the reduction
        res = Buf(fresh(f"{op.out}_row"), "sbuf", "f32", (P, F))
        body += [Alloc(res, line=ln), Scalar(whole(res), row, ALU[op.op], float(op.init), op.line)]
        return result_tile(op, hbm, fresh, res, body)
    narrow = op.init == 0.0
    res = Buf(fresh(f"{op.out}_tile" if narrow else f"{op.out}_row"), "sbuf", out_dtype if narrow else "f32", (P, F))
    body += [Alloc(res, line=ln), ir.Act(whole(res), row, "copy", scale=op.scale, line=ln)]
    if not narrow:
        body.append(Scalar(whole(res), whole(res), "add", float(op.init), op.line))
        res = result_tile(op, hbm, fresh, res, body)
    return res
