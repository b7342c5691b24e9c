"""A reduction of a few long rows (`s[b] += (A[b, i, j] - P[b, i, j])^2 / (M N)`: a loss per sample, a norm per
head): each row's elements over the partitions, one row after another (build_few_long_rows).

The row layout of rules.reduce puts the R rows on R partitions: with R well under 128 most partitions, and their
DMA queues, idle (audit15's per-sample MSE of [16, 512, 1024]: 16 partitions, 8x the DMA floor on the model).
build_reduce.build_long_row spreads one plain row over the partitions; this does the same for R rows and for a
reduced expression of same-indexed tensors:

    A_v[r, p, g] = A (row r's F = P * G elements, partition p holding p*G ..);  s_v[0, r] = s
    cols[p, r] = identity
    for r, ft:
      A_tile[p, :] = A_v[r, p, ft*TILE_F:+TILE_F]  (each input)     one DMA of 128 contiguous runs
      terms = expr(A_tile, ..)                                      expr_instrs.ExprCompiler, as build_colreduce
      part[p] = OP over terms[p, :];  cols[p, r] OP= part[p]
    add:      total[0, r] = ones[P, 1].T @ cols[P, R]               one matmul for all the rows (TensorE, PSUM)
    max/min:  t[r, p] = cols[p, r] (TensorE transpose); total[r] = OP over t[r, :]
    total = total * k OP c;  s_v = total
"""
from __future__ import annotations

import dataclasses

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh
from tilec.compiler.build_util import a, hbm_view, loop, sl, term
from tilec.compiler.expr_instrs import ExprCompiler, shared_binary
from tilec.compiler.exprs import fmt_expr
from tilec.compiler.ir import DTYPE_BYTES, Alloc, Binary, Buf, Dma, Reduce, Scalar, Stmt, View, full, whole
from tilec.compiler.ops import ReduceOp
from tilec.compiler.schedule import PMAX, best_divisor
from tilec.target import compiled

FEW_ROWS = 64  # rows: at most this many (half the partitions) leave the row layout's partitions half idle
LONG = 128 * 128  # elements per row at least: a run of 128 or more per partition
TILE_BYTES = 16 * 1024  # per partition and input of a loaded tile (build_reduce.LONG_TILE_BYTES)
MIN_STEPS = 8  # loaded tiles per input at least: one row of 1M f32 in two 16 KiB tiles left the first load and
# the last tile's compute exposed (gaps15 dot_product 32.6 -> 27.3 us run in 8 tiles; 4: 29.0, 16: 28.6)
MIN_TILE = 512  # elements per partition: smaller loads are mostly their fixed cost
_IDENTITY = {"add": 0.0, "maximum": float("-inf"), "minimum": float("inf")}
_WORD = {"add": "sum", "maximum": "max", "minimum": "min"}


def few_long_rows(R: int, F: int, dtype: str, plain_src: bool, init_tensor: bool) -> int | None:
    """TILE_F of a reduction of R <= FEW_ROWS rows of F >= LONG elements (F a multiple of the partitions) that
    build_few_long_rows spreads over the partitions, or None. One plain row is build_reduce.long_row's; a tensor
    initial value stays with the row layout."""
    if init_tensor or R > FEW_ROWS or F < LONG or F % PMAX or (R == 1 and plain_src):
        return None
    G = F // PMAX  # (at least MIN_STEPS loads in all, of at least MIN_TILE elements, to overlap loads and compute)
    return best_divisor(G, min(TILE_BYTES // DTYPE_BYTES[dtype], max(MIN_TILE, R * G // MIN_STEPS)))


def few_rows_tile(op: ReduceOp, dtype: str) -> int | None:
    """few_long_rows for an op (a max/min has no factor: select_reduce keeps those for sums)."""
    return few_long_rows(op.dim("R"), op.dim("F"), dtype, op.expr is None, isinstance(op.init, str))


def build_few_long_rows(op: ReduceOp, TF: int, hbm: dict[str, Buf], fresh: Fresh) -> tuple[list[tuple[str, int]],
                                                                                            list[Stmt]]:
    """The loop nest of the module docstring."""
    P, R, F = PMAX, op.dim("R"), op.dim("F")
    G = F // P
    ln, line = op.update_line, op.line
    stmts: list[Stmt] = []
    views: dict[str, Buf] = {}
    for name in op.inputs or (op.src,):
        views[name], st = hbm_view(hbm[name], (R, P, G), fresh(f"{name}_v"), line)
        stmts += st
    add = op.op == "add"
    out_v, st = hbm_view(hbm[op.out], (1, R) if add else (R, 1), fresh(f"{op.out}_v"), line)
    stmts += st
    cols = Buf(fresh(f"{op.out}_cols"), "sbuf", "f32", (P, R))
    body: list[Stmt] = [Alloc(cols, zero=True, line=ln)]
    if not add:
        body.append(Scalar(whole(cols), whole(cols), "add", _IDENTITY[op.op], ln))
    step: list[Stmt] = []
    tiles: dict[str, View] = {}
    for name, v in views.items():
        t = Buf(fresh(f"{name}_tile"), "sbuf", hbm[name].dtype, (P, TF))
        step += [Alloc(t, line=ln),
                 Dma(whole(t), View(v, (a("r"), full(P), sl(a(term("ft", TF, "TILE_F")), TF))), ln)]
        tiles[name] = whole(t)
    src = tiles[op.src]
    part = Buf(fresh(f"{op.out}_part"), "sbuf", "f32", (P, 1))
    col = View(cols, (full(P), sl(a("r"), 1)))
    if op.expr is not None:
        terms = Buf(fresh(f"{op.out}_terms"), "sbuf", "f32", (P, TF))
        step += [Alloc(terms, line=ln), Alloc(part, line=ln)]
        # fold: a square (and a column's scale and shift) on ScalarE; a sum whose last instruction is ScalarE's
        # then sums its output on the way (reduce_res), which takes the reduce off VectorE, busy with the rest
        made = ExprCompiler(tiles, terms.shape, ln, fresh, set(), fold=True).emit(op.expr, whole(terms))
        last = made[-1]
        if op.op == "add" and isinstance(last, ir.Act) and last.dst == whole(terms) and last.total is None:
            step += made[:-1] + [dataclasses.replace(last, total=whole(part))]
        elif op.op == "add" and isinstance(last, (Binary, Scalar, ir.Act)) and last.dst == whole(terms):
            # a product's terms (a dot product): each tensor_tensor cut between GpSimdE and VectorE, and ScalarE
            # sums the terms (an activation copy with reduce_res) in place of VectorE's tensor_reduce; VectorE did
            # the multiply and the reduce alone (gaps15 dot_product, 1M elements: see docs/notes/cols17.md)
            tgt = compiled()
            step += [x for m in made for x in (shared_binary(m.dst, m.a, m.b, m.op, m.line, tgt)
                                                if isinstance(m, Binary) and not m.engine else [m])]
            step.append(ir.Act(whole(terms), whole(terms), "copy", line=ln, total=whole(part)))
        else:
            step += made + [Reduce(whole(part), whole(terms), op.op, ln)]
    else:
        step += [Alloc(part, line=ln), Reduce(whole(part), tiles[op.src], op.op, ln)]
    step.append(Binary(col, col, whole(part), op.op, ln))
    red = ", ".join(v for role, v in op.vars if role.startswith("r"))
    kept = ", ".join(v for role, v in op.vars if role.startswith("k"))
    inner = loop("ft", G // TF, step, note=f"for {red} (TILE_P partitions x tiles of TILE_F)", line=op.line_of("r0"))
    body += loop("r", R, inner, note=f"for {kept}" if kept else "", line=op.line_of("k0") if kept else line)
    body += across_partitions(op, cols, fresh, hbm, out_v)
    how = "ones matmul" if add else "transpose"
    summed = op.src if op.expr is None else fmt_expr(op.expr)
    what = f"{op.out} = {_WORD[op.op]} over {red} of {summed} (each of the {R} rows over the partitions, then " \
           f"across them: {how})"
    return [("TILE_P", P), ("TILE_F", TF)], stmts + [ir.Block(what, tuple(body), line)]


def across_partitions(op: ReduceOp, cols: Buf, fresh: Fresh, hbm: dict[str, Buf], out_v: Buf) -> list[Stmt]:
    """The per-partition results of every row (cols: P x R, a column per row; R = 1 for one long row, build_reduce)
    reduced across the partitions (a sum by a ones matmul, max/min by a transpose and a reduce), scaled, started
    and stored."""
    from tilec.compiler.build_reduce import _scale_and_init, result_tile
    P, R = cols.shape
    ln = op.update_line
    add = op.op == "add"
    total = Buf(fresh(f"{op.out}_total"), "psum", "f32", (1, R) if add else (R, P))
    res = Buf(fresh(f"{op.out}_acc"), "sbuf", "f32", (1, R) if add else (R, 1))
    out: list[Stmt] = [Alloc(total, zero=True, line=ln)]
    if add:
        ones = Buf(fresh("ones_f32"), "sbuf", "f32", (P, 1))
        out += [Alloc(ones, zero=True, line=ln), Scalar(whole(ones), whole(ones), "add", 1.0, ln),
                ir.Matmul(whole(total), whole(ones), whole(cols), ln), Alloc(res, line=ln),
                ir.Copy(whole(res), whole(total), ln)]
    else:
        out += [ir.Transpose(whole(total), whole(cols), line=ln), Alloc(res, line=ln),
                Reduce(whole(res), whole(total), op.op, ln)]
    out += _scale_and_init(op, whole(res), None, ln)
    result = result_tile(op, hbm, fresh, res, out)
    out.append(Dma(whole(out_v), whole(result), ln))
    return out
