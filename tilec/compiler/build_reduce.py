"""Loop-nest builder for reductions along the trailing dimensions (`s[i] += A[i, j]`, max=, min=).

The source is seen as [R, F] (kept indices flattened onto rows, reduced ones onto the free dimension), the output
as [R, 1]. Per partition tile of TILE_P rows: one fp32 (TILE_P, 1) accumulator column; per free tile of TILE_F
elements: load, tensor_reduce on VectorE into a (TILE_P, 1) column, combine it into the accumulator (tensor_tensor);
then the constant factor and the initial value once, a cast to the output dtype, one store.
"""
from __future__ import annotations

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh, hbm_view
from tilec.compiler.expr_instrs import ExprCompiler
from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.exprs import fmt_expr
from tilec.compiler.ir import Alloc, Binary, Buf, Dma, Reduce, Scalar, Stmt, View, full, whole
from tilec.compiler.ops import ColumnReduceOp, ReduceOp
from tilec.compiler.schedule import ReducePlan

Built = tuple[list[tuple[str, int]], list[Stmt]]
_IDENTITY = {"add": 0.0, "maximum": float("-inf"), "minimum": float("inf")}


def build_reduce(op: ReduceOp, plan: ReducePlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    line, TP, TF = op.line, plan.parts, plan.free
    R, F = op.dim("R"), op.dim("F")
    src_v: dict[str, Buf] = {}  # [R, F] views of what is read: the source, or each input of the expression
    stmts: list[Stmt] = []
    for name in op.inputs or (op.src,):
        src_v[name], st = hbm_view(hbm[name], (R, F), fresh(f"{name}_v"), line)
        stmts += st
    out_v, st = hbm_view(hbm[op.out], (R, 1), fresh(f"{op.out}_v"), line)
    stmts += st
    init_v = None
    if isinstance(op.init, str):
        init_v, st = hbm_view(hbm[op.init], (R, 1), fresh(f"{op.init}_v"), line)
        stmts += st
    rows = sl(a(term("pt", TP, "TILE_P")), TP)
    acc = Buf(fresh(f"{op.out}_acc"), "sbuf", "f32", (TP, 1))
    tiles = F // TF
    body = _accumulate(op, plan, hbm, fresh, acc, src_v, rows) if tiles > 1 else \
        _single(op, plan, hbm, fresh, acc, src_v, rows)
    body += _finish(op, hbm, fresh, acc, init_v, rows, TP)
    body.append(Dma(View(out_v, (rows, full(1))), whole(result_tile(op, hbm, fresh, acc, body)), line))
    var = ", ".join(v for role, v in op.vars if role.startswith("k"))
    nest = loop("pt", R // TP, body, note=f"for {var} (tiles of TILE_P)", line=op.line_of("k0"))
    what = f"{op.out} = {op.op} over the last dims of {op.src if op.expr is None else fmt_expr(op.expr)}"
    return [("TILE_P", TP), ("TILE_F", TF)], stmts + [ir.Block(what, tuple(nest), line)]


def _load(op: ReduceOp, plan: ReducePlan, hbm: dict[str, Buf], fresh: Fresh, views: dict[str, Buf], rows
          ) -> tuple[list, Buf]:
    """One [TILE_P, TILE_F] tile of what is reduced: the source loaded, or the expression of the loaded inputs."""
    cols = sl(a(term("ft", plan.free, "TILE_F")), plan.free)
    out, tiles = [], {}
    for name in (op.src,) if op.expr is None else op.inputs:
        tile = Buf(fresh(f"{name}_tile"), "sbuf", hbm[name].dtype, (plan.parts, plan.free))
        out += [Alloc(tile, line=op.update_line), Dma(whole(tile), View(views[name], (rows, cols)), op.update_line)]
        tiles[name] = whole(tile)
    if op.expr is None:
        return out, tiles[op.src].buf
    value = Buf(fresh(f"{op.out}_terms"), "sbuf", "f32", (plan.parts, plan.free))
    out.append(Alloc(value, line=op.update_line))
    out += ExprCompiler(tiles, value.shape, op.update_line, fresh, set()).emit(op.expr, whole(value))
    return out, value


def _single(op: ReduceOp, plan: ReducePlan, hbm, fresh: Fresh, acc: Buf, src_v: dict[str, Buf], rows
            ) -> list[Stmt]:
    """One free tile: its tensor_reduce is the whole row's value."""
    load, tile = _load(op, plan, hbm, fresh, src_v, rows)
    return loop("ft", 1, load + [Alloc(acc, line=op.update_line),  # extent 1: the free index becomes 0
                                 Reduce(whole(acc), whole(tile), op.op, op.update_line)])


def _accumulate(op: ReduceOp, plan: ReducePlan, hbm, fresh: Fresh, acc: Buf, src_v: dict[str, Buf], rows
                ) -> list[Stmt]:
    """Several free tiles: the accumulator starts at the op's identity; each tile's column folds into it."""
    ln = op.update_line
    start: list[Stmt] = [Alloc(acc, zero=True, line=ln)]
    if _IDENTITY[op.op]:  # max/min: zeros + (-)inf
        start.append(Scalar(whole(acc), whole(acc), "add", _IDENTITY[op.op], ln))
    load, tile = _load(op, plan, hbm, fresh, src_v, rows)
    part = Buf(fresh(f"{op.out}_part"), "sbuf", "f32", (plan.parts, 1))
    step = load + [Alloc(part, line=ln), Reduce(whole(part), whole(tile), op.op, ln),
                   Binary(whole(acc), whole(acc), whole(part), op.op, ln)]
    var = ", ".join(v for role, v in op.vars if role.startswith("r"))
    return start + loop("ft", op.dim("F") // plan.free, step, note=f"for {var} (tiles of TILE_F)",
                        line=op.line_of("r0"))


def _finish(op: ReduceOp, hbm, fresh: Fresh, acc: Buf, init_v: Buf | None, rows, TP: int) -> list[Stmt]:
    """The constant factor (a mean), then the initial value, once per row tile (the sum starts from it)."""
    ln = op.update_line
    out: list[Stmt] = []
    if op.scale != 1.0:
        out.append(Scalar(whole(acc), whole(acc), "multiply", op.scale, ln))
    if init_v is not None:
        col = Buf(fresh(f"{op.init}_col"), "sbuf", hbm[op.init].dtype, (TP, 1))
        out += [Alloc(col, line=op.line), Dma(whole(col), View(init_v, (rows, full(1))), op.line),
                Binary(whole(acc), whole(acc), whole(col), op.op, op.line)]
    elif op.init != _IDENTITY[op.op]:
        assert not isinstance(op.init, str)  # a tensor initial value has its view (init_v)
        out.append(Scalar(whole(acc), whole(acc), op.op, op.init, op.line))
    return out


def result_tile(op: ReduceOp | ColumnReduceOp, hbm: dict[str, Buf], fresh: Fresh, acc: Buf, body: list[Stmt]) -> Buf:
    """The accumulator, or (for a narrower output dtype) its cast into a tile of that dtype, appended to body."""
    if hbm[op.out].dtype == acc.dtype:
        return acc
    res = Buf(fresh(f"{op.out}_tile"), "sbuf", hbm[op.out].dtype, acc.shape)
    body += [Alloc(res, line=op.update_line), ir.Copy(whole(res), whole(acc), op.update_line)]
    return res
