"""Issue 13's fusion clause: an element-wise statement that reads a contraction's result (a matmul, matrix-vector
product or convolution into a temporary, or in place on an output) runs on the contraction's PSUM eviction, so the
result never goes to HBM. One mechanism over the element-wise function table: the consumer's expression is read as
a chain of steps from the contraction's element to the statement's value, each step one eviction instruction

    an activation of the function table (relu, exp, tanh, ...)      -> activation, in place
    v op c, c op v, op in + - * / max min, c a constant              -> tensor_scalar with the constant
    v op b[k], b a vector along the out channels (the partitions)    -> tensor_scalar with b's column
    v + b[j], b along a matmul's columns, first                     -> its row bias (broadcast once)
    v + S[..], S a tensor read at the output's element              -> tensor_tensor with S's band (the residual)

The chain's head folds into the eviction's own activation where it can (func(scale * acc + bias): a constant
factor, a bias column, a relu, a relu6 clamp, one residual add), the rest runs after it on the evicted tile
(ConvOp.epilogue). A consumer that is not such a chain (the contraction read twice, at another element, a tensor
other than the residual, a reduction) keeps its own nest, with the contraction's result in HBM (explain says why).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

import numpy as np

from tilec.compiler.exprs import const_value
from tilec.compiler.ir import Act, Binary, Buf, Copy, Scalar, Stmt, View
from tilec.compiler.ops import ConvOp, EpiStep, index_maps, plain
from tilec.lang import syntax as sx
from tilec.lang.functions import FUNCTIONS

_ALU = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide", "max": "maximum", "min": "minimum"}
_COMMUTES = {"add", "multiply", "maximum", "minimum"}


def partition_index(op: ConvOp) -> int:
    """The position of the out-channel (partition) dimension in the contraction's output: after its batch index."""
    return 1 if "n" in dict(op.vars) else 0


def parse_chain(op: ConvOp, c, src: str, program, earlier: frozenset[str] = frozenset()
                ) -> tuple[EpiStep, ...] | None:
    """The steps from src's element to c's value, or None when c is not such a chain over its one read of src
    (earlier: the temporaries written by top-level statements before the contraction, which a row may read)."""
    stored = earlier | {n for n, t in program.tensors.items() if t.kind == "input"}
    if c.red_op is not None or c.init is None or c.out_index:
        return None
    if program.tensors[c.target].shape != program.tensors[src].shape:
        return None
    out_vars = list(c.out_vars)
    k_var = out_vars[partition_index(op)] if len(out_vars) > partition_index(op) else None
    roles = dict(op.vars)
    # a matmul's columns (batched too: a row shared by every batch index, as a key-padding row over heads)
    matmul = not any(role in roles for role in ("y", "r", "s"))
    x_var = out_vars[-1] if matmul and "x" in roles and len(out_vars) == 2 + ("n" in roles) else None

    def same_element(e: sx.Access) -> bool:
        return e.fill is None and [plain(m) for m in index_maps(e, c, program)] == out_vars

    def operand(e: sx.Expr) -> float | tuple[str, str] | None:
        v = constant(e, program.sizes)
        if v is not None:
            return v if math.isfinite(v) else None
        if not isinstance(e, sx.Access) or e.tensor in (src, c.target) or e.fill is not None:
            return None
        ids = [plain(m) for m in index_maps(e, c, program)] if len(e.indices) == 1 else None
        if len(e.indices) == 1 and x_var is not None and ids == [x_var] and e.tensor in stored:
            # b[j] along a matmul's columns: its row bias (_fold_head), else replicated on every partition once
            # and applied by a tensor_tensor on the evicted tile (a temporary written before the contraction:
            # build_rowchain.reads_of counts the epilogue's reads, so a chain producing it stores it)
            return ("row", e.tensor)
        if program.tensors[e.tensor].kind != "input":
            # a column or tensor temporary stays refused: `O / z[i]` on attention's second matmul would hide
            # the attention from attention_find (attn_full 1.45x -> 2.62x when tried)
            return None
        if len(e.indices) == 1 and k_var is not None and ids == [k_var]:
            return ("col", e.tensor)
        if program.tensors[e.tensor].shape == program.tensors[c.target].shape and same_element(e):
            return ("tensor", e.tensor)
        return None

    def reads_src(e: sx.Expr) -> int:
        if isinstance(e, sx.Access):
            return int(e.tensor == src) + sum(reads_src(i) for i in e.indices)
        if isinstance(e, sx.Neg):
            return reads_src(e.x)
        if isinstance(e, sx.BinOp):
            return reads_src(e.lhs) + reads_src(e.rhs)
        if isinstance(e, sx.Call):
            return sum(reads_src(x) for x in e.args)
        return 0

    def binary(name: str, lhs: sx.Expr, rhs: sx.Expr) -> list[EpiStep] | None:
        left = reads_src(lhs)
        inner, other = (lhs, rhs) if left else (rhs, lhs)
        steps, value = walk(inner), operand(other)
        if steps is None or value is None:
            return None
        return steps + [EpiStep("alu", name, value, reverse=not left and name not in _COMMUTES)]

    def walk(e: sx.Expr) -> list[EpiStep] | None:
        if isinstance(e, sx.Access):
            return [] if e.tensor == src and same_element(e) else None
        if isinstance(e, sx.Neg):
            inner = walk(e.x)
            return None if inner is None else inner + [EpiStep("alu", "multiply", -1.0)]
        if isinstance(e, sx.BinOp) and e.op in _ALU:
            return binary(_ALU[e.op], e.lhs, e.rhs)
        if isinstance(e, sx.Call) and e.fn in FUNCTIONS:
            f = FUNCTIONS[e.fn]
            if f.arity == 1 and f.instr == "activation":
                inner = walk(e.args[0])
                return None if inner is None else inner + [EpiStep("func", f.name)]
            if f.arity == 2 and f.name in _ALU:
                return binary(_ALU[f.name], *e.args)
        return None

    if reads_src(c.init) != 1:
        return None
    steps = walk(c.init)
    return None if steps is None else tuple(steps)  # () : a copy (a dtype conversion) of the result


def constant(e: sx.Expr, sizes) -> float | None:
    """The value of a constant expression, functions of the table included (`abs(2)`, `relu(0.5)`), computed in
    float32 as the program computes it; None when e reads a tensor or a loop variable."""
    v = const_value(e, sizes)
    if v is not None or not isinstance(e, sx.Call) or e.fn not in FUNCTIONS:
        return v
    args = [constant(x, sizes) for x in e.args]
    if len(args) != FUNCTIONS[e.fn].arity:
        return None
    values = [np.float32(x) for x in args if x is not None]
    return float(FUNCTIONS[e.fn](*values)) if len(values) == len(args) else None


def try_chain(op: ConvOp, c, src: str, program, earlier: frozenset[str] = frozenset()) -> ConvOp | None:
    """op with the consumer statement c (reading op's result src) fused onto its eviction, or None."""
    if op.pool is not None:
        return None
    steps = parse_chain(op, c, src, program, earlier)
    if steps is None:
        return None
    dtypes = [program.tensors[n].dtype for n in (op.name,) + op.fused if n in program.tensors]
    before = op
    if op.epilogue and program.tensors[src].dtype != "f32":  # src's store rounds it, after the steps before
        steps = (EpiStep("round", program.tensors[src].dtype, src),) + steps
    elif not op.epilogue:  # (a narrow intermediate is rounded before the residual add, not before a bias)
        op, steps = _fold_head(op, steps, program, all(d == "f32" for d in dtypes))
    if any(isinstance(s.operand, tuple) and s.operand[0] == "tensor" for s in steps):
        return None  # a tensor other than the one residual (its band is the only one loaded)
    if steps and op.w_layout == "dw":  # the depthwise kernel evicts with its activation only (DW_CHAIN)
        return None
    at = c.update_line or c.line  # the instructions' `# tl:` line: the statement they compute
    roles = [role for role, new in (("residual", op.residual != before.residual),
                                    ("relu", op.relu != before.relu or op.post_relu != before.post_relu
                                     and op.residual == before.residual),  # (as _try_residual: its own line)
                                    ("epilogue", bool(steps))) if new]
    return replace(op, out=c.target, fused=op.fused + (c.target,), epilogue=op.epilogue + steps,
                   lines=op.lines + tuple((role, at) for role in roles))


def _fold_head(op: ConvOp, steps: tuple[EpiStep, ...], program, wide: bool
               ) -> tuple[ConvOp, tuple[EpiStep, ...]]:
    """The steps at the chain's head that the eviction's activation (func(scale * acc + bias)) and the residual
    add already compute, moved into op's fields: what every contraction builder reads. Not wide (a 16-bit
    intermediate, rounded after the activation): the residual add and the relu after it only."""
    i = 0
    while i < len(steps):
        s = steps[i]
        value = s.operand
        plain_evict = not op.relu and op.residual is None and op.clamp is None and wide
        if s.kind == "alu" and s.op == "multiply" and isinstance(value, float) and plain_evict and op.bias is None:
            op = replace(op, scale=op.scale * value)
        elif s.kind == "alu" and s.op == "add" and isinstance(value, tuple) and value[0] == "col" and plain_evict \
                and op.bias is None and op.bias_role == "k":
            op = replace(op, bias=value[1])
        elif s.kind == "alu" and s.op == "subtract" and s.reverse and isinstance(value, tuple) and value[0] == "col" \
                and plain_evict and op.bias is None:  # b[k] - v: the factor's sign turned, b the bias column
            op = replace(op, scale=-op.scale, bias=value[1])
        elif s.kind == "alu" and s.op == "add" and isinstance(value, tuple) and value[0] == "row" and plain_evict \
                and op.bias is None and "n" not in dict(op.vars):  # a linear layer's bias b[j]: broadcast, added
            # on eviction (a batched matmul's row stays a chain step: select_conv._bias takes rows unbatched only)
            op = replace(op, bias=value[1], bias_role="x")
        elif s.kind == "alu" and s.op == "add" and isinstance(value, tuple) and value[0] == "tensor" \
                and op.residual is None and not op.relu and op.clamp is None and op.bias_role == "k" \
                and value[1] != op.x:
            op = replace(op, residual=value[1])
        elif (s.kind == "func" and s.op == "relu" or s.kind == "alu" and s.op == "maximum" and value == 0.0) \
                and op.residual is None and not op.relu and wide:
            op = replace(op, relu=True)
        elif (s.kind == "func" and s.op == "relu" or s.kind == "alu" and s.op == "maximum" and value == 0.0) \
                and op.residual is not None and not op.post_relu:
            op = replace(op, post_relu=True)
        elif s.kind == "alu" and s.op == "minimum" and isinstance(value, float) and value >= 0.0 and op.relu \
                and op.residual is None and op.clamp is None and wide:
            op = replace(op, clamp=value)
        else:
            break
        i += 1
    return op, steps[i:]


def chain_stmts(steps: tuple[EpiStep, ...], src: View, dst: View, column: Callable[[str], View],
                work: Callable[[str], View], line: int, row: Callable[[str], View] | None = None) -> list[Stmt]:
    """The steps applied to src's values (an evicted tile, or the PSUM accumulator itself), written into dst: in
    place on dst when it is fp32, else on an fp32 tile (`work(dtype)`: a view of a fresh tile of that dtype, shaped
    as src) with the last instruction writing dst (its store's one rounding); a "round" step passes through a
    tile of its dtype. A factor, then a vector added, then an activation (`relu(v * g[k] + b[k])`) are one
    activation instruction, func(scale * v + bias) (`packed`)."""
    out: list[Stmt] = []
    scratch = dst if dst.buf.dtype == "f32" else None
    cur = src
    i = 0
    while i < len(steps):
        s = steps[i]
        if s.kind == "round":
            tile = work(s.op)
            out.append(Copy(tile, cur, line))
            cur = tile
            if i == len(steps) - 1:
                out.append(Copy(dst, cur, line))
            i += 1
            continue
        n, scale, bias, func = packed(steps, i, column)
        last = i + n == len(steps)
        if last:
            into = dst
        else:
            if scratch is None:
                scratch = work("f32")
            into = scratch
        value = s.operand
        if n > 1 or s.kind == "func":
            out.append(Act(into, cur, func, bias, scale, line))
        else:
            assert not (isinstance(value, tuple) and value[0] == "tensor")  # (try_chain refuses them)
            assert not isinstance(value, str)  # (a tensor name: round steps only)
            if isinstance(value, tuple) and value[0] == "row":  # the replicated row's columns of this tile
                assert row is not None, "a row operand needs its builder's replicated rows"
                bc = row(value[1])
                out.append(Binary(into, bc, cur, s.op, line) if s.reverse else Binary(into, cur, bc, s.op, line))
            else:
                v: float | View = column(value[1]) if isinstance(value, tuple) else float(value or 0.0)
                out.append(Scalar(into, cur, s.op, v, line, reverse=s.reverse))
        cur = into
        i += n
    return out


def packed(steps: tuple[EpiStep, ...], i: int, column: Callable[[str], View]
           ) -> tuple[int, "float | View", View | None, str]:
    """(steps taken, scale, bias, func) of the longest run from steps[i] that one activation computes: a factor
    (a constant or a vector), a vector added, an activation of the table, in that order, each optional."""
    j, bias, func = i, None, "copy"
    scale: float | View = 1.0

    def at(kind: str, op: str) -> EpiStep | None:
        s = steps[j] if j < len(steps) else None
        return s if s is not None and s.kind == kind and s.op == op and not s.reverse else None
    s = at("alu", "multiply")
    if s is not None and (isinstance(s.operand, float) or isinstance(s.operand, tuple) and s.operand[0] == "col"):
        scale, j = (column(s.operand[1]) if isinstance(s.operand, tuple) else s.operand), j + 1
    s = at("alu", "add")
    if s is not None and isinstance(s.operand, tuple) and s.operand[0] == "col":
        bias, j = column(s.operand[1]), j + 1
    s = steps[j] if j < len(steps) else None
    if s is not None and s.kind == "func":
        func, j = s.op, j + 1
    return (j - i, scale, bias, func) if j - i > 1 or func != "copy" else (1, 1.0, None, "copy")


def columns_of(op: ConvOp, kind: str = "col") -> list[str]:
    """The vectors the epilogue reads as per-partition columns (kind "row": as rows replicated on every
    partition), once each, in order."""
    return list(dict.fromkeys(s.operand[1] for s in op.epilogue
                              if isinstance(s.operand, tuple) and s.operand[0] == kind))


def describe(op: ConvOp) -> str:
    """The epilogue's steps in the program's terms, for comments and explain: `* g, + b, relu`."""
    words = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "maximum": "max", "minimum": "min"}
    parts = []
    for s in op.epilogue:
        value = s.operand
        text = value[1] if isinstance(value, tuple) else f"{value:g}" if isinstance(value, float) else ""
        if s.kind == "func":
            parts.append(s.op)
        elif s.kind == "round":
            parts.append(f"round to {s.op}")
        elif s.op in ("maximum", "minimum"):
            parts.append(f"{words[s.op]}(., {text})")
        else:
            parts.append(f"{text} {words[s.op]} ." if s.reverse else f"{words[s.op]} {text}")
    return ", ".join(parts)


# a depthwise conv's consumer beyond its activation's bias, relu and clamp (or a 16-bit intermediate's bias, which
# the rounding must precede): the depthwise kernel (depthwise_kernel.py) has no chain steps, and the general conv
# path that has them is slower than the depthwise kernel plus an HBM round trip (audit13's dw_s2_bias_relu6 bf16
# batch 8: 127 us unfused, 342 us fused on the general path)
DW_CHAIN = ("its producer is a depthwise conv, whose kernel evicts with one activation (bias, relu, relu6 "
            "clamp; with a 16-bit {name} the rounding comes before a bias) and runs no further element-wise steps")


def unfused_reason(name: str, readers: int, depthwise: bool = False) -> str:
    """Why a contraction's result goes to HBM though an element-wise op reads it (for `tilec explain`)."""
    if readers == 1 and depthwise:
        return DW_CHAIN.format(name=name) + f", so the consumer is built as its own loop nest that loads {name} back"
    if readers > 1:
        return (f"{name} has {readers} readers; a consumer runs on the contraction's PSUM eviction only when it is "
                f"the one statement reading {name}, right after it (compute the other uses from that statement's "
                f"result, or give each its own contraction)")
    return (f"the consumer is not an element-wise chain the PSUM eviction computes (one read of {name} at the "
            f"output's element, through activations and + - * / max min with constants, vectors b[k] along the "
            f"out channels or one tensor added at the same element), so it is built as its own loop nest that "
            f"loads {name} back from HBM")


__all__ = ["Buf", "chain_stmts", "columns_of", "describe", "parse_chain", "try_chain", "unfused_reason"]
