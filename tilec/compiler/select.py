"""Operation selection: recognise what each lowered computation is and which engines run it.

    Conv      conv[n,k,y,x] (= bias[k]) += X[n,c,y+r,x+s] * W[k,c,r,s]   -> nc_matmul, shifted, PSUM-accumulated
              (a matmul C[m,n] += A[m,k] * B[k,n] is the same pattern with no batch, one spatial dim, 1x1 taps;
              it may also start from a bias along its columns, C[m,n] = b[n]: a linear layer);
              strided windows X[n,c,2y+r,2x+s] read a strided view of the input band as the moving operand
              with fused epilogues: relu (activation), window max/avg pool of the conv output (vector engine);
              the relu may also be written in place, `conv[..] = relu(conv[..])`, in the conv's nest or the next
              (select_conv.py)
    Pool      Y[n,k,i,j] max= X[n,k,2i+p,2j+q] (or += ... / 4)           -> tensor_tensor over strided views
              (any window, stride, padding: select_pool.py, rules_pool.py)
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

import math
from dataclasses import replace
from typing import cast

from tilec.compiler.exprs import accesses, const_value, fmt_expr
from tilec.compiler.fn_chain import syntax_fused
from tilec.compiler.ir import DTYPE_BYTES
from tilec.compiler.lower import Comp, size_value
from tilec.compiler.names import unique
from tilec.compiler.ops import (ColumnReduceOp, ConvOp, EltwiseOp, Op, PoolOp, PoolSpec, ReduceOp, TransposeOp, index_maps,
                                is_permutation, plain, reject)
from tilec.compiler.select_copy import check_parts, is_data_copy, part_targets, select_copy
from tilec.compiler import permute_onchip
from tilec.compiler.select_permute import plan
from tilec.compiler.select_eltwise import fuse_chain, is_copy, select_eltwise
from tilec.compiler import eviction_fusion
from tilec.compiler.select_conv import (fold_operand_relu, fuse_epilogues, grouped_conv, select_conv, split_sign,
                                         ungroup, ungroup_single)
from tilec.compiler.select_pool import fuse_pool_divide, select_pool
from tilec.compiler.global_axes import fuse_reduce_divide
from tilec.compiler.select_reduce import is_row_reduction, select_reduce
from tilec.errors import TilecError
from tilec.target import compiled
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
        try:
            comp, op = _select_at(comps, i, comp, program, consumed)
        except TilecError as err:  # `W[k, 0, r, s]` of a unit dimension (torch's [C, 1, R, S] depthwise weights)?
            alt = drop_unit_indices(comp, program)
            if alt is comp:
                raise
            try:
                comp, op = _select_at(comps[:i] + (alt,) + comps[i + 1:], i, alt, program, consumed)
            except TilecError:
                raise err from None
            if not isinstance(op, (ConvOp, EltwiseOp)) or isinstance(op, EltwiseOp) and op.copy:
                raise err from None  # a contraction or an element-wise op reads its operands through reshaped views
        if isinstance(op, PoolOp):
            op = fuse_pool_divide(op, comps, i, program, consumed)
        if isinstance(op, ColumnReduceOp):
            op = fuse_reduce_divide(op, comps, i, program, consumed)
        if isinstance(op, ConvOp):
            fold_operand_relu(ops, comps, comp, program, op)
            op = fuse_epilogues(op, comps, i, program, consumed)
        ops.append(op)
    parts = part_targets(comps, program)
    for comp in comps:  # after selection, so a statement with no mapping at all is reported as such first
        # (a grouped convolution's output is checked whole by `ungroup`)
        _check_coverage(comp, program, comp.target in parts or bool(comp.out_index and comp.red_op))
    check_parts(comps, program, parts)
    return tuple(ops)


def _select_at(comps: tuple[Comp, ...], i: int, comp: Comp, program, consumed: set[int]) -> tuple[Comp, Op]:
    """The op of comps[i] (given as `comp`) and the comp it was selected from (a contraction's product without its
    constant factor, a grouped convolution's merged indices taken apart, a fused chain)."""
    groups = 1
    comp = forward_reduced(comp, program)
    written = comp
    comp, sign = split_sign(comp)  # `-(A * B)`, `0.5 * A * B`: the product, the constant on the eviction (scale)
    if comp.out_index and comp.red_op is not None:  # a merged channel index: a grouped convolution
        comp, groups = ungroup(comp, program)
    elif comp.out_index:
        e = next(e for e in comp.out_index if not isinstance(e, sx.Name))
        raise reject(comp, f"the compiler needs each index of {comp.target} to be a plain loop variable (a "
                           "shifted index is compiled in a copy only, `Y[C1 + c] = B[c]`)", e.span)
    elif comp.red_op is not None:  # a grouped convolution with one output channel per group (Kg = 1)?
        comp, groups = ungroup_single(comp, program)
    if comp.red_op is None and not is_copy(comp, program):
        comp = fuse_chain(comps, i, program, consumed)
    op = _select_one(comp, program) if groups == 1 else grouped_conv(comp, groups, program)
    if sign != 1.0 and not isinstance(op, ConvOp):  # only a contraction carries the sign: the statement as written
        comp = written
        op = _select_one(comp, program)
    return comp, (replace(op, scale=sign) if isinstance(op, ConvOp) else op)


def forward_reduced(comp: Comp, program) -> Comp:
    """A reduction that reads a reduced loop backwards, `s[i] += A[i, M - 1 - j]` (a flipped operand, summed): the
    same statement over j' = M - 1 - j, which runs over the same values, `s[i] += A[i, j]` (a sum in another order,
    the same max and min; a contraction `A[i, K - 1 - k] * B[K - 1 - k, j]` likewise). `comp` itself when no read
    has such an index, or when the loop appears in an index in any other form (`j`, `j + 1`, `2 * j`)."""
    if comp.red_op is None or comp.update is None:
        return comp
    try:
        maps = {a: index_maps(a, comp, program) for a in accesses(comp.update)}
    except TilecError:  # an index that is not affine: reported where the statement is selected
        return comp
    turn = {v for m in maps.values() for coefs, const in m for v in comp.red_vars
            if coefs == {v: -1} and const == comp.extent(v) - 1}
    if not turn:
        return comp
    for a, m in maps.items():
        for coefs, const in m:
            for v in turn & set(coefs):
                if not (coefs == {v: -1} and const == comp.extent(v) - 1):
                    return comp  # read forward too (`A[i, M - 1 - j] * B[i, j]`): not a flipped sum

    def flip(e: sx.Access) -> sx.Expr:
        out = []
        for ix, (coefs, const) in zip(e.indices, maps[e]):
            v = next(iter(coefs)) if len(coefs) == 1 else None
            out.append(sx.Name(v, ix.span) if v in turn else ix)
        return replace(e, indices=tuple(out))
    return replace(comp, update=sx.map_reads(comp.update, flip))


def drop_unit_indices(comp: Comp, program) -> Comp:
    """A contraction whose operand reads a dimension of one element at the constant 0, `Y[n, g*M + m, y, x] +=
    X[n, g, y + r, x + s] * W[g*M + m, 0, r, s]` (torch's depthwise weights [C*M, 1, R, S]), with those indices
    left out (`W[g*M + m, r, s]`): the builders read the operands through views reshaped to their own dimensions,
    which hold the same elements. An element-wise read (`Y[i, j] = f(A[i, 0, j])`) drops them too: its nest reads
    the tensor through an HBM view without those dimensions (lower_tiles._read_shape). `comp` itself when there is
    no such index."""
    if comp.red_op is None and comp.init is not None:  # an element-wise read, `Y[i, j] = f(A[i, 0, j])`
        init = _drop_units(comp.init, program)
        return comp if init == comp.init else replace(comp, init=init)
    update = comp.update
    if comp.red_op != "+=" or update is None or len(accesses(update)) != 2:
        return comp
    new = _drop_units(update, program)
    return comp if new == update else replace(comp, update=new)


def _drop_units(e: sx.Expr, program) -> sx.Expr:
    """e with every constant-0 index of a one-element dimension left out of its reads (a read keeps one index)."""

    def drop(e: sx.Access) -> sx.Expr:
        shape = [d if isinstance(d, int) else size_value(d, program.sizes) for d in program.tensors[e.tensor].shape]
        kept = tuple(ix for ix, d in zip(e.indices, shape) if not (const_value(ix) == 0.0 and d == 1))
        return replace(e, indices=kept) if kept and kept != e.indices else e
    return sx.map_reads(e, drop)


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
    value = comp.init if comp.red_op is None else None
    reads = accesses(value) if value is not None else []
    read = syntax_fused(value, tuple(comp.out_vars), reads) if value is not None and reads else None
    if read is not None and all(a.tensor != comp.target for a in reads) and is_permutation(comp, read, program):
        op = select_transpose(replace(comp, init=read), program, copy_only=False)
        if isinstance(op, TransposeOp) and not op.steps and not op.out_vars:  # one swap of runs (permute_split)
            others = (a.tensor for a in reads if a.tensor != read.tensor)  # (X[i, j] beside X[j, i]: the source)
            return replace(op, value=value, vectors=tuple(dict.fromkeys(others)))
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


# ---- transpose ---------------------------------------------------------------------------------------------


def select_transpose(comp: Comp, program, copy_only: bool = True) -> TransposeOp | EltwiseOp:
    """`Y[j, i] = X[i, j]`, and any permutation that is one swap of two runs of dimensions after leading batch
    dimensions (`Y[b, j, i] = X[b, i, j]`, NCHW -> NHWC `Y[n, h, w, c] = X[n, c, h, w]`): a batch of 2-D
    transposes of X seen as [B, M, N]; or a swap of two single dimensions around dimensions that stay in place
    (`Y[c, b, a] = X[a, b, c]`): a batch of 2-D transposes of strided slices; or, keeping the last dimension, HBM
    -> HBM DMAs of slices (a copy op). Any other permutation, or one these would move slowly, is a chain of such
    steps through HBM intermediates (select_permute.py): an op whose `steps` are the steps' ops. `copy_only`:
    the statement is the copy alone (work on the way needs the one-step transpose where there is one)."""
    acc = comp.init
    assert isinstance(acc, sx.Access)  # _select_one checked it is a permuted read
    # a permutation of the output's loop variables: no None among them (is_permutation checked it)
    names = tuple(cast(list[str], [plain(m) for m in index_maps(acc, comp, program)]))
    out = tuple(comp.out_vars)
    ext = {v: comp.extent(v) for v in out}
    itemsize = DTYPE_BYTES[program.tensors[acc.tensor].dtype]
    if permute_onchip.chosen(names, out, ext, itemsize, compiled(), copy_only):
        return _permute_dma(comp, acc.tensor, comp.target, names, out)  # interleaved on chip (permute_onchip.py)
    steps = plan(names, out, ext, itemsize)
    if steps is None:
        raise reject(comp, f"`{fmt_expr(acc)}` permutes {len(out)} dimensions and no chain of permute steps was "
                           "found (a compiler bug: every permute has one)", acc.span,
                     "write it as two statements, each permuting fewer dimensions")
    taken = set(program.tensors)
    bufs = [acc.tensor] + [unique(f"{comp.target}_perm", taken) for _ in steps[1:]] + [comp.target]
    orders = [names] + [order for _, order in steps]
    ops = [_permute_dma(comp, a, b, x, y) if kind == "dma" else _permute_step(comp, a, b, x, y)
           for (kind, _), a, b, x, y in zip(steps, bufs, bufs[1:], orders, orders[1:])]
    if len(ops) == 1:
        return ops[0]
    first = next(op for op in ops if isinstance(op, TransposeOp))  # two DMA steps are never chained
    return replace(first, name=comp.target, out=comp.target, src=acc.tensor, steps=tuple(ops))


def _permute_dma(comp: Comp, src: str, dst: str, names: tuple[str, ...], out: tuple[str, ...]) -> EltwiseOp:
    """The op of a DMA step `dst[out] = src[names]` that keeps the last dimension: a copy (rules.copy)."""
    read = sx.Access(src, tuple(sx.Name(v, comp.span) for v in names), comp.span)
    loops = tuple((v, comp.extent(v)) for v in out)
    return EltwiseOp(dst, dst, read, (src,), math.prod(n for _, n in loops),
                     tuple((f"d{i}", v) for i, v in enumerate(out)), comp.line, comp.span, loop_lines=comp.lines,
                     copy=True, loops=loops)


def _permute_step(comp: Comp, src: str, dst: str, names: tuple[str, ...], out: tuple[str, ...]) -> TransposeOp:
    """The op of one step `dst[out] = src[names]` (select_permute.one_step holds)."""
    ext = comp.extent
    k = next((i for i, (x, y) in enumerate(zip(names, out)) if x != y), len(out))
    rest, want = names[k:], out[k:]
    cut = next((c for c in range(1, len(rest)) if rest[c:] + rest[:c] == want), None)
    if cut is None:  # two single dimensions swap, the others stay: a batch of 2-D transposes
        swap = [p for p, (x, y) in enumerate(zip(names, out)) if x != y]
        a, c = names[swap[0]], names[swap[1]]
        around = [v for v in out if v not in (a, c)]
        dims = (("M", ext(a)), ("N", ext(c))) + ((("B", math.prod(ext(v) for v in around)),) if around else ())
        roles = (("i", a), ("j", c)) + ((("b", around[0]),) if around else ())
        return TransposeOp(dst, dst, src, dims, roles, comp.line, comp.span, comp.lines, names, comp.extents, out)
    size = lambda vs: math.prod(ext(v) for v in vs)  # noqa: E731
    batch, first, second = names[:k], rest[:cut], rest[cut:]
    roles = (("i", first[0]), ("j", second[0])) + ((("b", batch[0]),) if batch else ())
    dims = (("M", size(first)), ("N", size(second))) + ((("B", size(batch)),) if batch else ())
    return TransposeOp(dst, dst, src, dims, roles, comp.line, comp.span, comp.lines, names, comp.extents)


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
            w_fn = "relu" if op.w_relu is None or math.isinf(op.w_relu) else f"min(relu, {op.w_relu:g})"
            epi = ([f"stationary {w_fn} after load"] if op.w_relu is not None else []) + \
                ["negated" if op.scale == -1.0 else f"scaled by {op.scale:g}" if op.scale != 1.0 else ""] + \
                ["relu" if op.relu else ""] + ([f"min(., {op.clamp:g})"] if op.clamp is not None else []) + \
                ([f"+ {op.residual}"] if op.residual else []) + \
                (["relu"] if op.post_relu else []) + ([f"pool {op.pool.op} {op.pool.wy}x{op.pool.wx} "
                                                   f"scale {op.pool.scale:g}"] if op.pool else []) + \
                ([f"then {eviction_fusion.describe(op)}"] if op.epilogue else [])  # (eviction_fusion.py)
            lines.append("  epilogue " + (", ".join(e for e in epi if e) or "-") +
                         (f"  (fused {', '.join(op.fused)})" if op.fused else ""))
        elif isinstance(op, PoolOp):
            lines.append(f"  src {op.src} pool {op.pool.op} {op.pool.wy}x{op.pool.wx} scale {op.pool.scale:g}"
                         + (" relu" if op.relu else ""))
        elif isinstance(op, TransposeOp):
            lines.append(f"  src {op.src}" + (f" computing {fmt_expr(op.value)}" if op.value is not None else ""))
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
