"""Operation selection: recognise what each lowered computation is and which engines run it.

    Conv      conv[n,k,y,x] (= bias[k]) += X[n,c,y+r,x+s] * W[k,c,r,s]   -> nc_matmul, shifted, PSUM-accumulated
              (a matmul C[m,n] += A[m,k] * B[k,n] is the same pattern with no batch, one spatial dim, 1x1 taps;
              it may also start from a bias along its columns, C[m,n] = b[n]: a linear layer);
              strided windows X[n,c,2y+r,2x+s] read a strided view of the input band as the moving operand
              with fused epilogues: relu (activation), window max/avg pool of the conv output (vector engine);
              the relu may also be written in place, `conv[..] = relu(conv[..])`, in the conv's nest or the next
    Pool      Y[n,k,i,j] max= X[n,k,2i+p,2j+q] (or += ... / 4)           -> tensor_tensor over strided views
    Reduce    s[i] (= 0 | -inf | b[i]) += A[i,j]  (max=, min=, `/ N`)    -> tensor_reduce per free tile, combined
                                                                          (select_reduce.py)
    Transpose B[j,i] = A[i,j]                                             -> nc_transpose (or dma_transpose)
    Eltwise   C[i..] = f(A[i..], B[i..], constants)                       -> tensor_tensor / tensor_scalar / activation
              with broadcast reads of a run of the output's indices (a (P, 1) column, or a row copied to every
              partition) and chains `T = f(..); C = g(T, ..)` fused into one pass (select_eltwise.py)

Anything else is a TilecError that points at the statement, and so is a loop that covers only part of a
dimension of the tensor it writes or reads by a plain index (kernels move whole tensors; `_check_coverage`).
Each op keeps `vars`: role -> the .tl loop variable, so schedule directives can name loops by the user's names
(`conv.y`).
"""
from __future__ import annotations

import itertools
import math
from typing import cast

from dataclasses import replace

import numpy as np

from tilec.compiler.exprs import accesses, const_value, fmt_expr, strip_relu, strip_scale
from tilec.compiler.lower import Comp, affine_index, size_value
from tilec.compiler.schedule import PMAX
from tilec.compiler.ops import (ConvOp, EltwiseOp, Op, PoolOp, PoolSpec, ReduceOp, TransposeOp, Window, index_maps,
                                is_permutation, plain, reads, reject)
from tilec.compiler.select_copy import check_parts, is_data_copy, part_targets, select_copy
from tilec.compiler.select_eltwise import fuse_chain, is_copy, select_eltwise
from tilec.compiler.select_reduce import is_row_reduction, select_reduce
from tilec.errors import TilecError
from tilec.lang import syntax as sx

__all__ = ["ConvOp", "EltwiseOp", "Op", "PoolOp", "PoolSpec", "ReduceOp", "TransposeOp", "reject", "select",
           "print_ops"]


def select(comps: tuple[Comp, ...], program) -> tuple[Op, ...]:
    ops: list[Op] = []
    consumed: set[int] = set()
    for i, comp in enumerate(comps):
        if i in consumed:
            continue
        if is_data_copy(comp, program):  # crop, shift, a part of a concatenation, nearest upsampling
            ops.append(select_copy(comp, program))
            continue
        groups = 1
        if comp.out_index and comp.red_op is not None:  # a merged channel index: a grouped convolution
            comp, groups = ungroup(comp, program)
        elif comp.out_index:
            e = next(e for e in comp.out_index if not isinstance(e, sx.Name))
            raise reject(comp, f"the compiler needs each index of {comp.target} to be a plain loop variable (a "
                               "shifted index is compiled in a copy only, `Y[C1 + c] = B[c]`)", e.span)
        if comp.red_op is None and not is_copy(comp, program):
            comp = fuse_chain(comps, i, program, consumed)
        op = _select_one(comp, program) if groups == 1 else _grouped_conv(comp, groups, program)
        if isinstance(op, PoolOp) and op.window is not None:
            op = fuse_pool_divide(op, comps, i, program, consumed)
        if isinstance(op, ConvOp):
            _fold_operand_relu(ops, comps, comp, program)
            op = _fuse_epilogues(op, comps, i, program, consumed)
        ops.append(op)
    parts = part_targets(comps, program)
    for comp in comps:  # after selection, so a statement with no mapping at all is reported as such first
        # (a grouped convolution's output is checked whole by `ungroup`)
        _check_coverage(comp, program, comp.target in parts or bool(comp.out_index and comp.red_op))
    check_parts(comps, program, parts)
    return tuple(ops)


def _select_one(comp: Comp, program) -> Op:
    if is_row_reduction(comp, program):
        return select_reduce(comp, program)
    if comp.red_op == "+=" and isinstance(comp.update, sx.BinOp) and comp.update.op == "*" \
            and len(accesses(comp.update)) == 2:
        return select_conv(comp, program)
    if comp.red_op in ("max=", "min=", "+="):
        return select_pool(comp, program)
    if comp.red_op is None and isinstance(comp.init, sx.Access) and comp.init.tensor != comp.target:
        if is_permutation(comp, comp.init, program):
            return select_transpose(comp, program)
    if comp.red_op is None:
        return select_eltwise(comp, program)
    raise reject(comp, f"a `{comp.red_op}` reduction of this form is not supported")


def _check_coverage(comp: Comp, program, part: bool = False) -> None:
    """Kernels move whole tensors between HBM and SBUF: a loop that covers only part of a dimension (a partial
    write, or a read of a slice) has no mapping yet, so it is an error here rather than a verifier failure later."""
    shape = program.tensors[comp.target].shape
    copy = is_data_copy(comp, program)  # a copy reads a part; its output may be written in parts (check_parts)
    for pos, v in enumerate(comp.out_vars if not part else ()):
        if comp.extent(v) != shape[pos]:
            raise TilecError(
                f"the compiler cannot map `{comp.target}`: `{comp.loop_text(v)}` (line {comp.line_of(v)}) writes "
                f"{comp.extent(v)} of the {shape[pos]} elements of {comp.target}'s dimension {pos}", comp.span,
                f"the compiler writes whole outputs: loop over all of dimension {pos}, or declare {comp.target} "
                f"with the loop's size")
    for expr in (comp.init, comp.update) if not copy else ():
        for acc in accesses(expr) if expr is not None else ():
            _check_read(comp, acc, program)


def _check_read(comp: Comp, acc: sx.Access, program) -> None:
    shape = program.tensors[acc.tensor].shape
    for pos, m in enumerate(index_maps(acc, comp, program)):
        v = plain(m)
        if v is not None and comp.extent(v) != shape[pos]:
            raise TilecError(
                f"the compiler cannot map `{comp.target}`: `{comp.loop_text(v)}` (line {comp.line_of(v)}) reads "
                f"{comp.extent(v)} of the {shape[pos]} elements of {acc.tensor}'s dimension {pos}",
                acc.indices[pos].span,
                f"the compiler reads whole tensors along plain loop indices: loop over all of dimension {pos}, or "
                f"pass {acc.tensor} with the loop's size")


# ---- contraction ---------------------------------------------------------------------------------------------------


def select_conv(comp: Comp, program) -> ConvOp:
    assert comp.update is not None  # _select_one saw a product in it
    a, b = accesses(comp.update)
    _check_operands(comp, program, a, b)
    out_vars = list(comp.out_vars)
    candidates = []
    for s_acc, m_acc in ((a, b), (b, a)):
        s_maps = index_maps(s_acc, comp, program)
        names = [plain(m) for m in s_maps]
        outs = [v for v in names if v in out_vars]
        # leading batch indices shared with the moving operand (a batched matmul's A[n, i, k]), then one output
        # variable: the partitions of the result
        lead = len(outs) - 1
        if None not in names and outs and names[:lead] == outs[:-1] == out_vars[:lead]:
            candidates.append((out_vars.index(outs[-1]), outs[-1], s_acc, m_acc))
    if not candidates:
        raise reject(comp, "no operand can be the matmul's stationary side (indexed by plain loop variables, "
                           "with exactly one output variable after the batch indices)", comp.update.span)
    _, p, s_acc, m_acc = min(candidates, key=lambda t: t[0])
    relu_acc = (_relu_operand(comp) or (None, None))[0]
    if relu_acc is not None and relu_acc is not m_acc:
        raise reject(comp, f"relu of the stationary operand `{fmt_expr(relu_acc)}` is not compiled", relu_acc.span,
                     "compute it into a tensor first (`T[..] = relu(...)`), then contract T")
    if s_acc.fill is not None:
        raise reject(comp, f"the stationary operand `{s_acc.tensor}` may not be a padded read", s_acc.span,
                     "pad the input (the operand indexed by output rows/columns plus filter taps) instead")
    s_vars = [plain(m) for m in index_maps(s_acc, comp, program)]
    # the stationary operand's own batch indices (one matrix per batch): its leading output variables before p
    w_batch = list(itertools.takewhile(lambda v: v in out_vars and v != p, s_vars))
    s_vars = s_vars[len(w_batch):]
    roles: dict[str, str] = {"k": p}
    batch: list[str] = []
    spatial: list[str] = []
    taps: list[str | None] = []
    strides: list[int] = []
    offsets: list[int] = []
    dilations: list[int] = []
    depthwise = False
    for e, (coefs, const) in zip(m_acc.indices, index_maps(m_acc, comp, program)):
        outs = [v for v in coefs if v in out_vars]
        reds = [v for v in coefs if v in comp.red_vars]
        stride = coefs[outs[0]] if len(outs) == 1 else 1
        window = len(outs) == 1 and out_vars.index(outs[0]) > out_vars.index(p)  # a spatial index
        if (const != 0 and not window) or any(c < 1 for c in coefs.values()) or len(outs) > 1 \
                or len(reds) > 1 or (any(coefs[v] != 1 for v in reds) and not window) \
                or (stride > 1 and not window):
            raise reject(comp, f"index `{fmt_expr(e)}` of {m_acc.tensor} is not a (strided, dilated, shifted) "
                               f"window `stride*y + dilation*r + offset`", e.span)
        if reds and not outs:
            if "c" in roles or reds[0] not in s_vars:
                raise reject(comp, "exactly one summed variable must index both operands", e.span)
            roles["c"] = reds[0]
        elif outs and out_vars.index(outs[0]) < out_vars.index(p):
            if reds or batch or "c" in roles:
                raise reject(comp, f"batch index `{fmt_expr(e)}` must come first and not be shifted", e.span)
            batch.append(outs[0])
        elif outs == [p] and not reds and not depthwise:
            depthwise = True  # X[n, k, ..] * W[k, ..]: each output channel reads its own input channel
        elif outs:
            spatial.append(outs[0])
            taps.append(reds[0] if reds else None)
            strides.append(stride)
            offsets.append(const)
            dilations.append(coefs[reds[0]] if reds else 1)
        else:
            raise reject(comp, f"index `{fmt_expr(e)}` of {m_acc.tensor} is constant", e.span)
    if "c" not in roles and not depthwise:
        raise reject(comp, "no summed variable indexes both operands (nothing to contract)", comp.update.span)
    if "c" in roles and depthwise:
        raise reject(comp, f"a depthwise window reads channel `{p}` of {m_acc.tensor}; it cannot also sum over "
                           f"`{roles['c']}`", m_acc.span)
    if len(spatial) > 2:
        raise reject(comp, "the moving operand has at most two spatial dimensions", m_acc.span)
    if w_batch and w_batch != batch:
        raise reject(comp, f"the batch indices of {s_acc.tensor} must be those of {m_acc.tensor}", s_acc.span)
    if out_vars != batch + [p] + spatial:
        raise reject(comp, f"output indices must be ordered (batch, {p}, spatial...) to match the operands",
                     comp.span)
    x_transposed = _check_moving_order(comp, program, m_acc, roles.get("c", p), batch, spatial, taps)
    tap_vars = [t for t in taps if t]
    if depthwise:
        if s_vars != [p, *tap_vars] or w_batch:
            raise reject(comp, f"a depthwise convolution's weights must be indexed {s_acc.tensor}[{p}, taps...]",
                         s_acc.span)
        w_layout = "dw"
    elif s_vars == [p, roles["c"], *tap_vars]:
        w_layout = "kc"
    elif s_vars == [roles["c"], p, *tap_vars]:
        w_layout = "ck"
    else:
        raise reject(comp, f"{s_acc.tensor} must be indexed [{p}, {roles['c']}, taps...] or "
                           f"[{roles['c']}, {p}, taps...]", s_acc.span)
    conv = _conv_record(comp, program, roles, batch, spatial, taps, s_acc.tensor, m_acc.tensor, w_layout)
    conv = replace(conv, w_batch=bool(w_batch), x_transposed=x_transposed)
    if x_transposed:  # B[j, k]: its columns (the output's) are its rows
        conv = replace(conv, dims=tuple((d, conv.dim("Wo") if d == "W" else v) for d, v in conv.dims))
    pad = 2 - len(strides)  # one or two spatial dimensions: checked above
    stride_y, stride_x = [1] * pad + strides
    off_y, off_x = [0] * pad + offsets
    dil_y, dil_x = [1] * pad + dilations
    return replace(conv, stride=(stride_y, stride_x), offset=(off_y, off_x), dilation=(dil_y, dil_x))


def ungroup(comp: Comp, program) -> tuple[Comp, int]:
    """A grouped convolution `Y[n, g*Kg + k, ..] += X[n, g*Cg + c, ..] * W[g*Kg + k, c, ..]` as one contraction of
    all G*Cg input channels into all G*Kg output channels: the merged indices become the plain variables k (now
    0..G*Kg) and c (0..G*Cg), while W keeps its [k, c] index (c runs over one group's Cg there); the builder puts
    each group's block on the diagonal of a zeroed stationary (ConvOp.groups). Returns (the comp, G)."""
    hint = ("a merged index is compiled for a grouped convolution: `Y[n, g*Kg + k, y, x] += X[n, g*Cg + c, y + r, "
            "x + s] * W[g*Kg + k, c, r, s]` with k in 0..Kg and c in 0..Cg")
    pos = [i for i, e in enumerate(comp.out_index) if not isinstance(e, sx.Name)]
    update = comp.update
    if comp.red_op != "+=" or len(pos) != 1 or not (isinstance(update, sx.BinOp) and update.op == "*"
                                                     and len(accesses(update)) == 2):
        e = comp.out_index[pos[0]] if pos else comp.span
        raise reject(comp, f"the compiler needs each index of {comp.target} to be a plain loop variable, or one "
                           "merged channel index of a grouped convolution", getattr(e, "span", comp.span), hint)
    names = {v for v, _ in comp.extents}
    k = comp.out_vars[pos[0]]
    coefs, _ = affine_index(comp.out_index[pos[0]], names, program.sizes)
    g = next(v for v in coefs if v != k)
    kg, G = coefs[g], comp.extent(g)
    found: dict[str, int] = {}  # the input-channel variable c -> Cg

    def index(e: sx.Expr) -> sx.Expr:
        cf, const = affine_index(e, names, program.sizes)
        if g not in cf:
            return e
        if (cf, const) == ({g: kg, k: 1}, 0):
            return sx.Name(k, e.span)
        c = next((v for v, n in cf.items() if v != g and n == 1 and v in comp.red_vars), None)
        if const == 0 and len(cf) == 2 and c is not None and cf[g] == comp.extent(c) \
                and found.get(c, cf[g]) == cf[g]:
            found[c] = cf[g]
            return sx.Name(c, e.span)
        raise reject(comp, f"index `{fmt_expr(e)}` uses the group variable `{g}`: a grouped convolution reads "
                           f"{g}*{kg} + {k} (output channels) or {g}*Cg + c (input channels, c summed in 0..Cg)",
                     e.span, hint)
    init = _map_indices(comp.init, index) if comp.init is not None else None
    new_update = _map_indices(update, index)
    if len(found) != 1:
        raise reject(comp, f"no operand is read at an input channel `{g}*Cg + c` (c summed): not a grouped "
                           "convolution", update.span, hint)
    (c, cg), = found.items()
    if _shape(comp.target, program)[pos[0]] != G * kg:
        raise reject(comp, f"`{fmt_expr(comp.out_index[pos[0]])}` writes {G * kg} channels of {comp.target}, not "
                           "all of them", comp.out_index[pos[0]].span, hint)
    ext = {k: G * kg, c: G * cg}
    stops = dict(comp.stops)
    return replace(comp, out_index=(), update=new_update, init=init,
                   extents=tuple((v, ext.get(v, n)) for v, n in comp.extents if v != g),
                   red_vars=tuple(v for v in comp.red_vars if v != g),
                   stops=tuple((v, f"{stops.get(g, G)}*{stops.get(v, n)}" if v in ext else s)
                               for v, s in comp.stops if v != g for n in [comp.extent(v)])), G


def _shape(tensor: str, program) -> list[int]:
    return [d if isinstance(d, int) else size_value(d, program.sizes) for d in program.tensors[tensor].shape]


def _map_indices(e: sx.Expr, fn) -> sx.Expr:
    """The expression with every read's indices mapped by fn."""
    if isinstance(e, sx.Access):
        return replace(e, indices=tuple(fn(i) for i in e.indices))
    if isinstance(e, sx.BinOp):
        return replace(e, lhs=_map_indices(e.lhs, fn), rhs=_map_indices(e.rhs, fn))
    if isinstance(e, sx.Call):
        return replace(e, args=tuple(_map_indices(x, fn) for x in e.args))
    if isinstance(e, sx.Neg):
        return replace(e, x=_map_indices(e.x, fn))
    return e


def _grouped_conv(comp: Comp, groups: int, program) -> ConvOp:
    """select_conv of an ungrouped comp, with its group count: the weights must be W[g*Kg + k, c, taps...] (each
    output channel's row holds its group's Cg input channels), the output and input cover their channels."""
    op = select_conv(comp, program)
    assert comp.update is not None  # ungroup checked it is a product of two reads
    w_acc = next(acc for acc in accesses(comp.update) if acc.tensor == op.w)
    if op.w_layout != "kc" or op.w_batch:
        raise reject(comp, f"a grouped convolution's weights must be indexed {op.w}[g*Kg + k, c, taps...]",
                     w_acc.span)
    cg, kg = op.dim("C") // groups, op.dim("K") // groups
    x_acc = next(acc for acc in accesses(comp.update) if acc.tensor == op.x)
    if _shape(op.x, program)[1 if "n" in dict(op.vars) else 0] != op.dim("C"):
        raise reject(comp, f"the groups read {op.dim('C')} channels of {op.x}, not all of them", x_acc.span,
                     f"declare {op.x} with G*Cg = {op.dim('C')} channels")
    if _shape(op.w, program)[1] != cg:
        raise reject(comp, f"{op.w}'s dimension 1 has {_shape(op.w, program)[1]} elements, one group has {cg} "
                           "input channels",
                     w_acc.span)
    if kg > PMAX:  # a group's output channels on one partition tile (the builder's block-diagonal stationary)
        raise reject(comp, f"groups of {kg} output channels (more than {PMAX}) are not compiled", comp.span,
                     f"split each group's output channels into groups of at most {PMAX}")
    return replace(op, groups=groups)


def strip_activation(e: sx.Expr) -> tuple[sx.Expr, float | None]:
    """`relu(x)` -> (x, inf), `min(relu(x), 6)` (relu6) -> (x, 6.0), else (e, None): the functions of an operand that
    keep 0 at 0 (so a padded read's halo is unchanged) and fold into the producer's eviction as relu + minimum."""
    if isinstance(e, sx.Call) and e.fn == "min" and len(e.args) == 2:
        for x, c in (e.args, e.args[::-1]):
            upper = const_value(c)
            inner, relu = strip_relu(x)
            if relu and upper is not None and upper >= 0:
                return inner, upper
    inner, relu = strip_relu(e)
    return (inner, math.inf) if relu else (e, None)


def _check_operands(comp: Comp, program, a: sx.Access, b: sx.Access) -> None:
    """Each factor of the product is a read, f32() of one (exact: a product of two 16-bit floats fits in fp32), or
    relu / relu6 of the moving operand (folded into its producer: see `_relu_operand`); both reads have one dtype;
    a zero-padded read (`?? 0`) is the moving operand (its halo is zeroed in SBUF). The builders multiply the
    operand tiles as loaded, so anything else around a factor would be dropped (a scale, a function, a negation,
    a narrowing conversion: `relu(X) * W` of an input once ran as `X * W`, found by the fuzzer and by tests)."""
    update = comp.update
    assert isinstance(update, sx.BinOp)
    reads = []
    for factor in (update.lhs, update.rhs):
        widened = factor.args[0] if isinstance(factor, sx.Call) and factor.fn == "f32" else factor
        inner, _ = strip_activation(widened)
        if not isinstance(inner, sx.Access):
            raise reject(comp, f"`{fmt_expr(factor)}` is not a tensor read: a contraction multiplies two reads "
                               f"(one may be under relu or `min(relu(..), c)`)", factor.span,
                         "compute the operand into a tensor first (`T[..] = ...`), then contract T; apply a scale "
                         "to the result")
        reads.append(inner)
    dtypes = [program.tensors[r.tensor].dtype for r in reads]
    if dtypes[0] != dtypes[1]:
        raise reject(comp, f"the factors {reads[0].tensor} ({dtypes[0]}) and {reads[1].tensor} ({dtypes[1]}) of a "
                           "contraction have different dtypes", update.span,
                     "declare both with one dtype, or convert one in a statement of its own first")
    for acc in (a, b):
        if acc.fill is not None and acc.fill != 0:
            raise reject(comp, f"a contraction's padded read fills with 0, not {acc.fill:g}", acc.span,
                         f"write `{acc.tensor}[...] ?? 0`")


def _relu_operand(comp: Comp) -> tuple[sx.Access, float] | None:
    """The read a contraction takes the relu (or relu6) of, `relu(T[..] ?? 0) * W[..]`, and its upper bound."""
    update = comp.update
    if not isinstance(update, sx.BinOp):
        return None
    for factor in (update.lhs, update.rhs):
        inner, upper = strip_activation(factor)
        if upper is not None and isinstance(inner, sx.Access):
            return inner, upper
    return None


def _check_moving_order(comp: Comp, program, m_acc: sx.Access, c: str, batch: list, spatial: list,
                        taps: list) -> bool:
    """The moving operand is read as [batch..., contraction, spatial...] (X[n, c, y, x], B[k, j]), or, for a
    matmul's one output column index without window, as [batch..., j, k] (A B^T: B[j, k], the weights of a linear
    layer stored [out, in]; transposed on TensorE as it is loaded): True for the latter."""
    order = []
    for coefs, _ in index_maps(m_acc, comp, program):
        order.append("c" if c in coefs and not any(v in coefs for v in batch + spatial) else
                     "n" if any(v in coefs for v in batch) else "s")
    if order == ["n"] * len(batch) + ["s", "c"] and len(spatial) == 1 and taps == [None] \
            and m_acc.fill is None and all(m == ({v: 1}, 0) for m, v in
                                           zip(index_maps(m_acc, comp, program), batch + spatial)):
        return True
    if order != ["n"] * len(batch) + ["c"] + ["s"] * len(spatial):
        want = ", ".join(batch + [c] + spatial)
        raise reject(comp, f"{m_acc.tensor} is read with the summed index `{c}` after an output index; the "
                           f"compiler reads the moving operand as {m_acc.tensor}[{want}]", m_acc.span,
                     f"store {m_acc.tensor} transposed (as [{want}]), or compute it with a transpose statement "
                     f"first (`T[{c}, ...] = {m_acc.tensor}[..., {c}]`)")
    return False


def _conv_record(comp, program, roles, batch, spatial, taps, w, x, w_layout) -> ConvOp:
    ext = comp.extent
    spatial, taps = [None] * (2 - len(spatial)) + spatial, [None] * (2 - len(taps)) + taps
    names = {"n": batch[0] if batch else None, "y": spatial[0], "x": spatial[1], "r": taps[0], "s": taps[1]}
    roles.update({k: v for k, v in names.items() if v})
    x_shape = program.tensors[x].shape
    hx = x_shape[-2] if spatial[0] else 1
    dims = {"N": ext(batch[0]) if batch else 1, "C": ext(roles.get("c", roles["k"])), "K": ext(roles["k"]),
            "H": hx, "W": x_shape[-1] if spatial[1] else 1,  # a matrix-vector product: one column
            "Ho": ext(spatial[0]) if spatial[0] else 1, "Wo": ext(spatial[1]) if spatial[1] else 1,
            "R": ext(taps[0]) if taps[0] else 1, "S": ext(taps[1]) if taps[1] else 1}
    residual = _init_residual(comp, program)
    bias, bias_role = (None, "k") if residual else _bias(comp, roles, program)
    lines = tuple((role, comp.line_of(var)) for role, var in sorted(roles.items())) + \
        (("update", comp.update_line or comp.line),)
    texts = tuple((role, comp.loop_text(var)) for role, var in sorted(roles.items()))
    return ConvOp(comp.target, comp.target, x, w, bias, tuple(dims.items()), w_layout,
                  tuple(sorted(roles.items())), line=comp.line, lines=lines, texts=texts, span=comp.span,
                  bias_role=bias_role, residual=residual)


def _init_residual(comp: Comp, program) -> str | None:
    """An initial value read from another tensor at the output's element, `Y[n, k, y, x] = X[n, k, y, x]` then
    `Y[..] += ...` (the MobileNetV2 block's skip connection): added on the PSUM eviction like a residual."""
    init = comp.init
    if not isinstance(init, sx.Access) or init.fill is not None or init.tensor == comp.target:
        return None
    if [plain(m) for m in index_maps(init, comp, program)] != list(comp.out_vars):
        return None
    return init.tensor if program.tensors[init.tensor].shape == program.tensors[comp.target].shape else None


def _bias(comp: Comp, roles: dict[str, str], program) -> tuple[str | None, str]:
    """The initial value: 0, a column b[k] (one value per output partition), or for a matmul a row b[x] along its
    output columns (broadcast across the partitions once, added on PSUM eviction)."""
    if comp.init is None or const_value(comp.init) == 0.0:
        return None, "k"
    init, k, x = comp.init, roles["k"], roles.get("x")
    names = [plain(m) for m in index_maps(init, comp, program)] if isinstance(init, sx.Access) else None
    tensor = init.tensor if isinstance(init, sx.Access) else None  # (names is None unless init is a read)
    if names == [k]:
        return tensor, "k"
    matmul = not any(role in roles for role in ("n", "y", "r", "s"))
    if names == [x] and matmul:
        return tensor, "x"
    if names == [x]:
        raise reject(comp, f"a bias along the output columns `{fmt_expr(init)}` is supported for a matmul only "
                           f"(no batch, output rows or filter taps); a convolution takes a per-output-channel bias "
                           f"`{tensor}[{k}]`", init.span)
    row = f", or a bias along the output columns `b[{x}]`" if matmul else ""
    raise reject(comp, f"the initial value must be 0, a per-output-channel bias `b[{k}]`{row}, read as it is "
                       f"(no arithmetic on it, no other index)", init.span)


# ---- epilogue fusion -----------------------------------------------------------------------------------------------


def _fuse_epilogues(op: ConvOp, comps, i: int, program, consumed: set[int]) -> ConvOp:
    """Fold relu and pooling of a temporary conv output into the conv (it then never goes to HBM), and an in-place
    relu `conv[..] = relu(conv[..])` of any conv output, written in the conv's own nest or in a following one: the
    relu then runs on the PSUM eviction and the output is written once, already rectified."""
    current = op.out
    for j in range(i + 1, len(comps)):
        nxt = comps[j]
        readers = [c for c in comps[j:] if any(a.tensor == current for a in reads(c))]
        in_place = nxt.target == current  # `conv[..] = relu(conv[..])`
        # a kernel output must reach HBM, so only an in-place relu (which leaves it the final value) may fold in
        foldable = program.tensors[current].kind == "temp" or (in_place and nxt.red_op is None)
        if not foldable or not readers or readers[0] is not nxt or (len(readers) > 1 and not in_place):
            break
        fused = None
        if len(reads(nxt)) == 1:
            fused = _try_relu(op, nxt, current, program) or _try_pool(op, nxt, current, program)
        elif len(reads(nxt)) == 2 and not in_place:
            fused = _try_residual(op, nxt, current, program)
        if fused is None and in_place and program.tensors[current].kind != "temp":
            raise _in_place_error(nxt)
        if fused is None:
            break
        op, current = fused, nxt.target
        consumed.add(j)
    return op


def _fold_operand_relu(ops: list[Op], comps, comp: Comp, program) -> None:
    """`Y[..] += relu(T[..] ?? 0) * W[..]` (or `min(relu(T[..]), 6)`) where T is a temporary written by an earlier
    contraction and read only under that function: T is stored rectified (relu, then the minimum, on T's PSUM
    eviction; both keep 0 at 0, so the padding is unchanged)."""
    found = _relu_operand(comp)
    if found is None:
        return
    acc, upper = found
    producer = next((j for j, o in enumerate(ops) if isinstance(o, ConvOp) and o.out == acc.tensor), None)
    same = all(_reads_only_under(c, acc.tensor, upper) for c in comps if c.target != acc.tensor)
    conv = cast(ConvOp, ops[producer]) if producer is not None else None
    if conv is None or producer is None or program.tensors[acc.tensor].kind != "temp" or not same or conv.pool is not None \
            or conv.residual is not None:
        raise reject(comp, f"relu of the operand `{fmt_expr(acc)}` is compiled only for a temporary written by an "
                           f"earlier matmul or convolution (no pool or residual) and read only under the same "
                           f"function", acc.span,
                     f"write the relu where {acc.tensor} is computed (`{acc.tensor}[..] = relu({acc.tensor}[..])`)"
                     if program.tensors[acc.tensor].kind == "temp" else
                     f"compute it into a tensor first (`R[..] = relu({acc.tensor}[..])`), then contract R")
    clamp = None if math.isinf(upper) else upper
    ops[producer] = replace(conv, relu=True, clamp=clamp,
                            lines=conv.lines + (("relu", comp.update_line or comp.line),))


def _reads_only_under(c: Comp, tensor: str, upper: float) -> bool:
    """Every read of `tensor` in c is under the same relu / relu6 (`upper`)."""
    def walk(e, under: float | None) -> bool:
        if isinstance(e, sx.Access):
            return e.tensor != tensor or under == upper
        inner, bound = strip_activation(e)
        if bound is not None:
            return walk(inner, bound)
        if isinstance(e, sx.BinOp):
            return walk(e.lhs, None) and walk(e.rhs, None)
        if isinstance(e, sx.Neg):
            return walk(e.x, None)
        if isinstance(e, sx.Call):
            return all(walk(x, None) for x in e.args)
        return True
    return all(walk(e, None) for e in (c.init, c.update) if e is not None)


def _in_place_error(c: Comp) -> TilecError:
    elem = f"{c.target}[{', '.join(c.out_vars)}]"
    return TilecError(
        f"the compiler cannot map `{c.target}`: after a matmul or convolution writes the kernel output "
        f"{c.target}, the only statement that may update it in place is `{elem} = relu({elem})` (the same "
        "element), which runs on the PSUM eviction", c.span,
        f"write any other epilogue into a new tensor, e.g. `Y[{', '.join(c.out_vars)}] = f({elem})`, and return Y")


def _try_relu(op: ConvOp, c: Comp, src: str, program) -> ConvOp | None:
    if c.red_op is not None or c.init is None or op.pool is not None:
        return None
    inner, relu = strip_relu(c.init)
    if not relu or not isinstance(inner, sx.Access) or inner.tensor != src:
        return None
    if [plain(m) for m in index_maps(inner, c, program)] != list(c.out_vars):
        return None
    if op.residual:  # relu(conv + S), written as two statements
        return replace(op, out=c.target, post_relu=True, fused=op.fused + (c.target,),
                       lines=op.lines + (("relu", c.update_line or c.line),))
    return replace(op, out=c.target, relu=True, fused=op.fused + (c.target,),
                   lines=op.lines + (("relu", c.update_line or c.line),))


def _try_residual(op: ConvOp, c: Comp, src: str, program) -> ConvOp | None:
    """`Y[..] = conv[..] + S[..]` (or `relu(...)` of it), S another tensor read at the same element: added on the
    PSUM eviction (S loaded band by band beside the output band), so conv never goes to HBM."""
    if c.red_op is not None or c.init is None or op.pool is not None or op.residual or op.bias_role != "k":
        return None
    inner, relu = strip_relu(c.init)
    if not isinstance(inner, sx.BinOp) or inner.op != "+":
        return None
    terms = [inner.lhs, inner.rhs]
    if not all(isinstance(t, sx.Access) and t.fill is None and
               [plain(m) for m in index_maps(t, c, program)] == list(c.out_vars) for t in terms):
        return None
    names = [cast(sx.Access, t).tensor for t in terms]
    if names.count(src) != 1:
        return None
    other = names[1 - names.index(src)]
    if program.tensors[other].shape != program.tensors[c.target].shape:
        return None
    return replace(op, out=c.target, residual=other, post_relu=relu, fused=op.fused + (c.target,),
                   lines=op.lines + (("residual", c.update_line or c.line),))


def _try_pool(op: ConvOp, c: Comp, src: str, program) -> ConvOp | None:
    if op.residual is not None:
        return None
    if op.pool is not None or "y" not in dict(op.vars):  # a matmul's rows are its partitions: no row windows
        return None
    if c.red_op is None:  # an element-wise statement (select_pool needs a reduction)
        return None
    try:
        pool = select_pool(c, program)
    except TilecError:
        return None
    if pool.src != src or pool.window is not None:  # overlapping / padded windows: a pool of their own
        return None
    pool_vars = tuple((f"pool_{role}", var) for role, var in pool.vars)
    return replace(op, out=c.target, relu=op.relu or pool.relu, pool=pool.pool, fused=op.fused + (c.target,),
                    vars=op.vars + pool_vars, lines=op.lines + (("pool", c.update_line or c.line),))


# ---- pooling -------------------------------------------------------------------------------------------------------


def select_pool(comp: Comp, program) -> PoolOp:
    assert comp.update is not None  # a reduction (red_op) always has its update
    inner, scale = strip_scale(comp.update)
    inner, relu = strip_relu(inner)
    if not isinstance(inner, sx.Access):
        raise reject(comp, "a reduction must read one tensor (window pooling) or a product (contraction)",
                     comp.update.span)
    init = const_value(comp.init) if comp.init is not None else None
    if comp.red_op == "max=" and init != float("-inf") and comp.init is not None:
        raise reject(comp, "a max pool must start from -inf", comp.init.span)
    if comp.red_op == "min=" and init != float("inf") and comp.init is not None:
        raise reject(comp, "a min pool must start from inf", comp.init.span)
    if comp.red_op == "+=" and init not in (0.0, None) and comp.init is not None:  # (init is None if comp.init is)
        raise reject(comp, "a sum pool must start from 0", comp.init.span)
    if comp.init is None:
        raise reject(comp, "the pooled tensor needs an initial value (-inf, inf or 0)")
    maps = index_maps(inner, comp, program)
    if len(maps) != len(comp.out_vars):  # e.g. a row sum s[i] += A[i, j]: zip below would silently drop j
        raise reject(comp, f"a reduction over a whole dimension ({inner.tensor} has {len(maps)} indices, "
                           f"{comp.target} {len(comp.out_vars)}) is not supported; a pool keeps every dimension "
                           "and reduces windows of its last two", inner.span)
    windows, strides, offsets = [], [], []
    for pos, ((coefs, const), v) in enumerate(zip(maps, comp.out_vars)):
        reds = [r for r in coefs if r in comp.red_vars]
        if coefs.get(v) is None or len(coefs) != 1 + len(reds) or len(reds) > 1 or coefs[v] < 1 \
                or (reds and coefs[reds[0]] != 1) or (const and not reds):
            raise reject(comp, f"index {pos} of {inner.tensor} is not a pooling window (stride*{v} + window "
                               "offset - padding)", inner.indices[pos].span)
        windows.append(comp.extent(reds[0]) if reds else 1)
        strides.append(coefs[v])
        offsets.append(const)
    if len(windows) < 2 or any(w != 1 for w in windows[:-2]):
        raise reject(comp, "only the last two dimensions may be pooled", inner.span)
    shape = program.tensors[inner.tensor].shape
    rows = 1
    for d in shape[:-2]:
        rows *= d
    assert comp.red_op is not None  # a pool is a reduction
    op = {"max=": "maximum", "min=": "minimum", "+=": "add"}[comp.red_op]
    pool = PoolSpec(windows[-2], windows[-1], op, scale)
    dims: tuple[tuple[str, int], ...] = (("B", rows), ("H", shape[-2]), ("W", shape[-1]))
    roles = tuple(zip(("b", "i", "j"), (comp.out_vars[0], comp.out_vars[-2], comp.out_vars[-1])))
    window = None
    if strides[-2:] != windows[-2:] or any(offsets) or inner.fill is not None:
        window = _window(comp, inner, op, windows[-2:], strides[-2:], offsets[-2:], shape[-2:])
        dims += (("Ho", window.out[0]),)
    return PoolOp(comp.target, comp.target, inner.tensor, dims, pool, roles, relu, comp.line, comp.span,
                  comp.lines, window)


_IDENTITY = {"maximum": float("-inf"), "minimum": float("inf"), "add": 0.0}


def _window(comp: Comp, inner: sx.Access, op: str, windows: list[int], strides: list[int], offsets: list[int],
            extent: tuple[int, ...]) -> Window:
    """The overlapping / strided / padded window of a pool (rules_pool.py), checked: the padding is the reduction's
    identity (it then never counts) and every window reads at least one element of the input."""
    if inner.fill is not None and inner.fill != _IDENTITY[op]:
        want = {"maximum": "-inf", "minimum": "inf", "add": "0"}[op]
        raise reject(comp, f"a padded {'sum' if op == 'add' else op[:3]} pool must pad with {want} (the padding "
                           f"then never counts); here it pads with {inner.fill:g}", inner.span,
                     f"write `{fmt_expr(replace(inner, fill=None))} ?? {want}`")
    out = (comp.extent(comp.out_vars[-2]), comp.extent(comp.out_vars[-1]))
    for axis in range(2):
        for o in range(out[axis]):
            first = o * strides[axis] + offsets[axis]
            if first + windows[axis] <= 0 or first >= extent[axis]:
                raise reject(comp, f"window {o} of index {len(inner.indices) - 2 + axis} of {inner.tensor} lies "
                                   "wholly in the padding (no element of the input)", inner.span,
                             "pad by less than the window: padding <= window / 2, as torch requires")
    return Window((strides[0], strides[1]), (offsets[0], offsets[1]), out)


def fuse_pool_divide(op: PoolOp, comps: tuple[Comp, ...], i: int, program, consumed: set[int]) -> PoolOp:
    """`S = window sum; Y = S / D` as one pool writing Y when S is read nowhere else: D a constant (a scale), or
    the number of each window's taps inside the input (count_include_pad=False), however it is written (checked by
    evaluating D over the output grid)."""
    s, nxt = op.out, comps[i + 1] if i + 1 < len(comps) else None
    if nxt is None or nxt.red_op is not None or nxt.init is None or nxt.fused or s in program.kernel.outputs \
            or any(a.tensor == s for j, c in enumerate(comps) if j not in (i, i + 1) for a in reads(c)):
        return op
    e = nxt.init
    if not isinstance(e, sx.BinOp) or e.op not in "*/":
        return op
    pairs = [(e.lhs, e.rhs)] + ([(e.rhs, e.lhs)] if e.op == "*" else [])
    found = [(acc, d) for acc, d in pairs if isinstance(acc, sx.Access) and acc.tensor == s and not accesses(d)]
    if not found or program.tensors[nxt.target].shape != program.tensors[s].shape:
        return op
    acc, d = found[0]
    if [plain(m) for m in index_maps(acc, nxt, program)] != list(nxt.out_vars):
        return op
    assert op.window is not None
    ho, wo = op.window.out
    grid = _grid(d, nxt.out_vars[-2], nxt.out_vars[-1], ho, wo, program.sizes)
    if grid is None or not np.all(grid != 0):
        return op
    scale, count = op.pool.scale, op.window.count
    if np.all(grid == grid.flat[0]):
        scale *= float(grid.flat[0]) if e.op == "*" else 1.0 / float(grid.flat[0])
    elif e.op == "/" and op.pool.op == "add" and np.array_equal(grid, _inside(op)):
        count = "inside"
    else:
        return op
    consumed.add(i + 1)
    return replace(op, out=nxt.target, pool=replace(op.pool, scale=scale), window=replace(op.window, count=count))


def _inside(op: PoolOp) -> np.ndarray:
    """The number of taps of each output's window inside the input, (Ho, Wo)."""
    assert op.window is not None
    per_axis = []
    for axis, (w, n) in enumerate(((op.pool.wy, op.dim("H")), (op.pool.wx, op.dim("W")))):
        s, off, out = op.window.stride[axis], op.window.offset[axis], op.window.out[axis]
        per_axis.append(np.array([sum(0 <= o * s + t + off < n for t in range(w)) for o in range(out)], float))
    return per_axis[0][:, None] * per_axis[1][None, :]


def _grid(e: sx.Expr, yv: str, xv: str, ho: int, wo: int, sizes) -> np.ndarray | None:
    """A value written with the output's row and column variables, evaluated at every (row, column); None when it
    uses anything else."""
    env = {yv: np.arange(ho, dtype=float)[:, None], xv: np.arange(wo, dtype=float)[None, :]}

    def ev(x: sx.Expr):
        if isinstance(x, sx.Num):
            return float(x.value)
        if isinstance(x, sx.Name):
            return env.get(x.id, float(sizes[x.id]) if x.id in sizes else None)
        if isinstance(x, sx.Neg):
            v = ev(x.x)
            return None if v is None else -v
        if isinstance(x, sx.BinOp) and x.op in "+-*/":
            a, b = ev(x.lhs), ev(x.rhs)
            if a is None or b is None:
                return None
            return {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide}[x.op](a, b)
        if isinstance(x, sx.Call) and x.fn in ("min", "max") and len(x.args) == 2:
            a, b = ev(x.args[0]), ev(x.args[1])
            return None if a is None or b is None else (np.minimum if x.fn == "min" else np.maximum)(a, b)
        return None
    v = ev(e)
    return None if v is None else np.broadcast_to(np.asarray(v, float), (ho, wo))


# ---- transpose ---------------------------------------------------------------------------------------------


def select_transpose(comp: Comp, program) -> TransposeOp:
    """`Y[j, i] = X[i, j]`, and any permutation that is one swap of two runs of dimensions after leading batch
    dimensions (`Y[b, j, i] = X[b, i, j]`, NCHW -> NHWC `Y[n, h, w, c] = X[n, c, h, w]`): a batch of 2-D
    transposes of X seen as [B, M, N]; or a swap of two single dimensions around dimensions that stay in place
    (`Y[c, b, a] = X[a, b, c]`): a batch of 2-D transposes of strided slices."""
    acc = comp.init
    assert isinstance(acc, sx.Access)  # _select_one checked it is a permuted read
    names = [plain(m) for m in index_maps(acc, comp, program)]
    out = list(comp.out_vars)
    k = next((i for i, (x, y) in enumerate(zip(names, out)) if x != y), len(out))
    rest, want = names[k:], out[k:]
    cut = next((c for c in range(1, len(rest)) if rest[c:] + rest[:c] == want), None)
    swap = [p for p, (x, y) in enumerate(zip(names, out)) if x != y]
    if cut is None and len(swap) == 2:  # two single dimensions swap, the others stay: a batch of 2-D transposes
        ext = comp.extent
        a, c = cast(str, names[swap[0]]), cast(str, names[swap[1]])
        batch = [v for v in out if v not in (a, c)]
        B = math.prod(ext(v) for v in batch)
        dims = (("M", ext(a)), ("N", ext(c))) + ((("B", B),) if batch else ())
        roles = (("i", a), ("j", c)) + ((("b", batch[0]),) if batch else ())
        return TransposeOp(comp.target, comp.target, acc.tensor, dims, roles, comp.line, comp.span, comp.lines,
                           tuple(str(n) for n in names), comp.extents, tuple(out))
    if cut is None:
        raise reject(comp, f"`{fmt_expr(acc)}` permutes its dimensions in a way that is not one swap of two runs "
                           f"of dimensions after leading batch dimensions (e.g. Y[b, j, i] = X[b, i, j])", acc.span,
                     "write it as two statements, each swapping two runs of dimensions")
    ext = comp.extent
    size = lambda vs: math.prod(ext(v) for v in vs)  # noqa: E731
    # a permutation of the output's loop variables: no None among them (is_permutation checked it)
    batch, first, second = cast(list[str], names[:k]), cast(list[str], rest[:cut]), cast(list[str], rest[cut:])
    roles = (("i", first[0]), ("j", second[0])) + ((("b", batch[0]),) if batch else ())
    dims = (("M", size(first)), ("N", size(second))) + ((("B", size(batch)),) if batch else ())
    return TransposeOp(comp.target, comp.target, acc.tensor, dims, roles, comp.line, comp.span, comp.lines,
                       tuple(str(n) for n in names), comp.extents)


def print_ops(ops: tuple[Op, ...]) -> str:
    lines = []
    for op in ops:
        kind = type(op).__name__.removesuffix("Op").lower()
        dims = " ".join(f"{k}={v}" for k, v in getattr(op, "dims", ()))
        lines.append(f"{kind} {op.name} -> {op.out}  # tl:{op.line}  {dims}".rstrip())
        lines.append("  vars " + ", ".join(f"{r}={v}" for r, v in op.vars))
        if isinstance(op, ConvOp):
            stride = f", stride {op.stride[0]}x{op.stride[1]}" if op.stride != (1, 1) else ""
            row = f" (a row along {dict(op.vars)['x']})" if op.bias and op.bias_role == "x" else ""
            groups = f", {op.groups} groups (block diagonal)" if op.groups > 1 else ""
            lines.append(f"  stationary {op.w} (layout {op.w_layout}{groups}), moving {op.x}{stride}, "
                         f"bias {op.bias or '-'}{row}")
            epi = ["relu" if op.relu else ""] + ([f"+ {op.residual}"] if op.residual else []) + \
                (["relu"] if op.post_relu else []) + ([f"pool {op.pool.op} {op.pool.wy}x{op.pool.wx} "
                                                   f"scale {op.pool.scale:g}"] if op.pool else [])
            lines.append("  epilogue " + (", ".join(e for e in epi if e) or "-") +
                         (f"  (fused {', '.join(op.fused)})" if op.fused else ""))
        elif isinstance(op, PoolOp):
            lines.append(f"  src {op.src} pool {op.pool.op} {op.pool.wy}x{op.pool.wx} scale {op.pool.scale:g}"
                         + (" relu" if op.relu else ""))
        elif isinstance(op, TransposeOp):
            lines.append(f"  src {op.src}")
        elif isinstance(op, ReduceOp):
            init = op.init if isinstance(op.init, str) else f"{op.init:g}"
            lines.append(f"  src {op.src} reduce {op.op} from {init} scale {op.scale:g}"
                         + (f" of {fmt_expr(op.expr)}" if op.expr is not None else ""))
        elif op.copy:
            index = ", ".join(fmt_expr(e) for e in op.out_index) or ", ".join(v for v, _ in op.loops)
            lines[-2] = lines[-2].replace("eltwise ", "copy ", 1)
            lines.append(f"  {op.out}[{index}] = {fmt_expr(op.expr)}  ({op.size} elements)")
        else:
            lines.append(f"  {op.out} = {fmt_expr(op.expr)}  ({op.size} elements)" +
                         (f"  (fused {', '.join(op.fused)})" if op.fused else ""))
            if op.layout:
                layout = " ".join(f"{k}={v}" for k, v in op.layout)
                lines.append(f"  broadcast columns {', '.join(op.columns) or '-'} (one scalar per partition), rows "
                             f"{', '.join(op.rows) or '-'} (one row for all partitions), layout {layout}")
    return "\n".join(lines) + "\n"
