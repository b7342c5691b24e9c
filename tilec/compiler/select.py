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

import math
from typing import cast

from dataclasses import replace

from tilec.compiler.exprs import accesses, const_value, fmt_expr, strip_relu, strip_scale
from tilec.compiler.lower import Comp
from tilec.compiler.ops import (ConvOp, EltwiseOp, Op, PoolOp, PoolSpec, ReduceOp, TransposeOp, index_maps,
                                is_permutation, plain, reads, reject)
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
        if comp.red_op is None and not is_copy(comp, program):
            comp = fuse_chain(comps, i, program, consumed)
        op = _select_one(comp, program)
        if isinstance(op, ConvOp):
            op = _fuse_epilogues(op, comps, i, program, consumed)
        ops.append(op)
    for comp in comps:  # after selection, so a statement with no mapping at all is reported as such first
        _check_coverage(comp, program)
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


def _check_coverage(comp: Comp, program) -> None:
    """Kernels move whole tensors between HBM and SBUF: a loop that covers only part of a dimension (a partial
    write, or a read of a slice) has no mapping yet, so it is an error here rather than a verifier failure later."""
    shape = program.tensors[comp.target].shape
    for pos, v in enumerate(comp.out_vars):
        if comp.extent(v) != shape[pos]:
            raise TilecError(
                f"the compiler cannot map `{comp.target}`: `{comp.loop_text(v)}` (line {comp.line_of(v)}) writes "
                f"{comp.extent(v)} of the {shape[pos]} elements of {comp.target}'s dimension {pos}", comp.span,
                f"the compiler writes whole outputs: loop over all of dimension {pos}, or declare {comp.target} "
                f"with the loop's size")
    for expr in (comp.init, comp.update):
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


def _check_operands(comp: Comp, program) -> None:
    """The contraction's two factors are tensor reads (or f32() of one: exact) of one dtype: the builders multiply
    the operand tiles as loaded, so a scale, a function, a negation or a narrowing conversion around a factor would
    be dropped (fuzz3: `Y += relu(X[i, k]) * W[k, j]` ran as `X * W`, `0.5 * X * W` as `X * W`)."""
    assert isinstance(comp.update, sx.BinOp)
    reads = []
    for side in (comp.update.lhs, comp.update.rhs):
        read = side.args[0] if isinstance(side, sx.Call) and side.fn == "f32" else side
        if not isinstance(read, sx.Access):
            raise reject(comp, f"a contraction's factors must be tensor reads, `{fmt_expr(side)}` is computed",
                         side.span, "compute it in a statement of its own first, or apply a scale to the result")
        reads.append(read)
    dtypes = [program.tensors[r.tensor].dtype for r in reads]
    if dtypes[0] != dtypes[1]:
        raise reject(comp, f"the factors {reads[0].tensor} ({dtypes[0]}) and {reads[1].tensor} ({dtypes[1]}) of a "
                           "contraction have different dtypes", comp.update.span,
                     "declare both with one dtype, or convert one in a statement of its own first")


def select_conv(comp: Comp, program) -> ConvOp:
    assert comp.update is not None  # _select_one saw a product in it
    _check_operands(comp, program)
    a, b = accesses(comp.update)
    out_vars = list(comp.out_vars)
    candidates = []
    for s_acc, m_acc in ((a, b), (b, a)):
        s_maps = index_maps(s_acc, comp, program)
        names = [plain(m) for m in s_maps]
        outs = [v for v in names if v in out_vars]
        if None not in names and len(outs) == 1:
            candidates.append((out_vars.index(outs[0]), outs[0], s_acc, m_acc))
    if not candidates:
        raise reject(comp, "no operand can be the matmul's stationary side (indexed by plain loop variables, "
                           "with exactly one output variable)", comp.update.span)
    _, p, s_acc, m_acc = min(candidates, key=lambda t: t[0])
    s_vars = [plain(m) for m in index_maps(s_acc, comp, program)]
    roles: dict[str, str] = {"k": p}
    batch: list[str] = []
    spatial: list[str] = []
    taps: list[str | None] = []
    strides: list[int] = []
    for e, (coefs, const) in zip(m_acc.indices, index_maps(m_acc, comp, program)):
        outs = [v for v in coefs if v in out_vars]
        reds = [v for v in coefs if v in comp.red_vars]
        stride = coefs[outs[0]] if len(outs) == 1 else 1
        if const != 0 or any(c != 1 for v, c in coefs.items() if v not in outs) or stride < 1 or len(outs) > 1 \
                or len(reds) > 1 or (stride > 1 and out_vars.index(outs[0]) < out_vars.index(p)):
            raise reject(comp, f"index `{fmt_expr(e)}` of {m_acc.tensor} is not a (strided) shifted window "
                               f"`stride*y + r`", e.span)
        if reds and not outs:
            if "c" in roles or reds[0] not in s_vars:
                raise reject(comp, "exactly one summed variable must index both operands", e.span)
            roles["c"] = reds[0]
        elif outs and out_vars.index(outs[0]) < out_vars.index(p):
            if reds or batch or "c" in roles:
                raise reject(comp, f"batch index `{fmt_expr(e)}` must come first and not be shifted", e.span)
            batch.append(outs[0])
        elif outs:
            spatial.append(outs[0])
            taps.append(reds[0] if reds else None)
            strides.append(stride)
        else:
            raise reject(comp, f"index `{fmt_expr(e)}` of {m_acc.tensor} is constant", e.span)
    if "c" not in roles:
        raise reject(comp, "no summed variable indexes both operands (nothing to contract)", comp.update.span)
    if len(spatial) > 2 or not spatial:
        raise reject(comp, "the moving operand needs one or two spatial dimensions", m_acc.span)
    if out_vars != batch + [p] + spatial:
        raise reject(comp, f"output indices must be ordered (batch, {p}, spatial...) to match the operands",
                     comp.span)
    _check_moving_order(comp, program, m_acc, roles["c"], batch, spatial)
    tap_vars = [t for t in taps if t]
    if s_vars == [p, roles["c"], *tap_vars]:
        w_layout = "kc"
    elif s_vars == [roles["c"], p, *tap_vars]:
        w_layout = "ck"
    else:
        raise reject(comp, f"{s_acc.tensor} must be indexed [{p}, {roles['c']}, taps...] or "
                           f"[{roles['c']}, {p}, taps...]", s_acc.span)
    conv = _conv_record(comp, program, roles, batch, spatial, taps, s_acc.tensor, m_acc.tensor, w_layout)
    stride_y, stride_x = [1] * (2 - len(strides)) + strides  # one or two spatial dimensions: checked above
    return replace(conv, stride=(stride_y, stride_x))


def _check_moving_order(comp: Comp, program, m_acc: sx.Access, c: str, batch: list, spatial: list) -> None:
    """The moving operand is read as [batch..., contraction, spatial...] (X[n, c, y, x], B[k, j]); another order
    (B[j, k]: the weights of a linear layer stored [out, in]) would be reshaped, not transposed: reject it."""
    order = []
    for coefs, _ in index_maps(m_acc, comp, program):
        order.append("c" if c in coefs and not any(v in coefs for v in batch + spatial) else
                     "n" if any(v in coefs for v in batch) else "s")
    if order != ["n"] * len(batch) + ["c"] + ["s"] * len(spatial):
        want = ", ".join(batch + [c] + spatial)
        raise reject(comp, f"{m_acc.tensor} is read with the summed index `{c}` after an output index; the "
                           f"compiler reads the moving operand as {m_acc.tensor}[{want}]", m_acc.span,
                     f"store {m_acc.tensor} transposed (as [{want}]), or compute it with a transpose statement "
                     f"first (`T[{c}, ...] = {m_acc.tensor}[..., {c}]`)")


def _conv_record(comp, program, roles, batch, spatial, taps, w, x, w_layout) -> ConvOp:
    ext = comp.extent
    if len(spatial) == 1:
        spatial, taps = [None] + spatial, [None] + taps
    names = {"n": batch[0] if batch else None, "y": spatial[0], "x": spatial[1], "r": taps[0], "s": taps[1]}
    roles.update({k: v for k, v in names.items() if v})
    x_shape = program.tensors[x].shape
    hx = x_shape[-2] if spatial[0] else 1
    dims = {"N": ext(batch[0]) if batch else 1, "C": ext(roles["c"]), "K": ext(roles["k"]),
            "H": hx, "W": x_shape[-1],
            "Ho": ext(spatial[0]) if spatial[0] else 1, "Wo": ext(spatial[1]),
            "R": ext(taps[0]) if taps[0] else 1, "S": ext(taps[1]) if taps[1] else 1}
    bias, bias_role = _bias(comp, roles, program)
    lines = tuple((role, comp.line_of(var)) for role, var in sorted(roles.items())) + \
        (("update", comp.update_line or comp.line),)
    texts = tuple((role, comp.loop_text(var)) for role, var in sorted(roles.items()))
    return ConvOp(comp.target, comp.target, x, w, bias, tuple(dims.items()), w_layout,
                  tuple(sorted(roles.items())), line=comp.line, lines=lines, texts=texts, span=comp.span,
                  bias_role=bias_role)


def _bias(comp: Comp, roles: dict[str, str], program) -> tuple[str | None, str]:
    """The initial value: 0, a column b[k] (one value per output partition), or for a matmul a row b[x] along its
    output columns (broadcast across the partitions once, added on PSUM eviction)."""
    if comp.init is None or const_value(comp.init) == 0.0:
        return None, "k"
    init, k, x = comp.init, roles["k"], roles["x"]
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
        if fused is None and in_place and program.tensors[current].kind != "temp":
            raise _in_place_error(nxt)
        if fused is None:
            break
        op, current = fused, nxt.target
        consumed.add(j)
    return op


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
    return replace(op, out=c.target, relu=True, fused=op.fused + (c.target,),
                   lines=op.lines + (("relu", c.update_line or c.line),))


def _try_pool(op: ConvOp, c: Comp, src: str, program) -> ConvOp | None:
    if op.pool is not None or "y" not in dict(op.vars):  # a matmul's rows are its partitions: no row windows
        return None
    if c.red_op is None:  # an element-wise statement (select_pool needs a reduction)
        return None
    try:
        pool = select_pool(c, program)
    except TilecError:
        return None
    if pool.src != src:
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
    windows = []
    for pos, ((coefs, const), v) in enumerate(zip(maps, comp.out_vars)):
        reds = [r for r in coefs if r in comp.red_vars]
        if const or coefs.get(v) is None or len(coefs) != 1 + len(reds) or len(reds) > 1:
            raise reject(comp, f"index {pos} of {inner.tensor} is not a pooling window", inner.indices[pos].span)
        wnd = comp.extent(reds[0]) if reds else 1
        if coefs[v] != wnd or (reds and coefs[reds[0]] != 1):
            why = (f" (pooling windows of {wnd} may not overlap or leave gaps; here the stride is {coefs[v]})"
                   if coefs[v] != wnd else "")
            raise reject(comp, f"index {pos} of {inner.tensor} must be {wnd}*{v} + window offset{why}",
                         inner.indices[pos].span)
        windows.append(wnd)
    if len(windows) < 2 or any(w != 1 for w in windows[:-2]):
        raise reject(comp, "only the last two dimensions may be pooled", inner.span)
    shape = program.tensors[inner.tensor].shape
    rows = 1
    for d in shape[:-2]:
        rows *= d
    assert comp.red_op is not None  # a pool is a reduction
    pool = PoolSpec(windows[-2], windows[-1], {"max=": "maximum", "min=": "minimum", "+=": "add"}[comp.red_op], scale)
    dims = (("B", rows), ("H", shape[-2]), ("W", shape[-1]))
    roles = tuple(zip(("b", "i", "j"), (comp.out_vars[0], comp.out_vars[-2], comp.out_vars[-1])))
    return PoolOp(comp.target, comp.target, inner.tensor, dims, pool, roles, relu, comp.line, comp.span,
                  comp.lines)


# ---- transpose ---------------------------------------------------------------------------------------------


def select_transpose(comp: Comp, program) -> TransposeOp:
    """`Y[j, i] = X[i, j]`, and any permutation that is one swap of two runs of dimensions after leading batch
    dimensions (`Y[b, j, i] = X[b, i, j]`, NCHW -> NHWC `Y[n, h, w, c] = X[n, c, h, w]`): a batch of 2-D
    transposes of X seen as [B, M, N]."""
    acc = comp.init
    assert isinstance(acc, sx.Access)  # _select_one checked it is a permuted read
    names = [plain(m) for m in index_maps(acc, comp, program)]
    out = list(comp.out_vars)
    k = next((i for i, (x, y) in enumerate(zip(names, out)) if x != y), len(out))
    rest, want = names[k:], out[k:]
    cut = next((c for c in range(1, len(rest)) if rest[c:] + rest[:c] == want), None)
    if cut is None:
        raise reject(comp, f"`{fmt_expr(acc)}` permutes its dimensions in a way that is not one swap of two runs "
                           f"of dimensions after leading batch dimensions (e.g. Y[b, j, i] = X[b, i, j])", acc.span,
                     "write it as two statements, each swapping two runs of dimensions")
    ext = comp.extent
    size = lambda vs: math.prod(ext(v) for v in vs)  # noqa: E731
    # a permutation of the output's loop variables: no None among them (is_permutation checked it)
    batch, first, second = cast(list[str], names[:k]), cast(list[str], rest[:cut]), cast(list[str], rest[cut:])
    if (batch or len(first) > 1 or len(second) > 1) and 1 in (size(first), size(second)):
        # the data keeps its order (a copy); the permute rule's views cannot place a side of size 1 yet
        raise reject(comp, f"`{fmt_expr(acc)}` swaps a run of dimensions of size 1 with another run: it moves no "
                           "data, and such a batched permute is not compiled yet", acc.span,
                     "declare the tensors without their dimensions of size 1 (the data is the same) and copy or "
                     "transpose what remains")
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
            lines.append(f"  stationary {op.w} (layout {op.w_layout}), moving {op.x}{stride}, "
                         f"bias {op.bias or '-'}{row}")
            epi = [f"relu" if op.relu else ""] + ([f"pool {op.pool.op} {op.pool.wy}x{op.pool.wx} "
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
        else:
            lines.append(f"  {op.out} = {fmt_expr(op.expr)}  ({op.size} elements)" +
                         (f"  (fused {', '.join(op.fused)})" if op.fused else ""))
            if op.layout:
                layout = " ".join(f"{k}={v}" for k, v in op.layout)
                lines.append(f"  broadcast columns {', '.join(op.columns) or '-'} (one scalar per partition), rows "
                             f"{', '.join(op.rows) or '-'} (one row for all partitions), layout {layout}")
    return "\n".join(lines) + "\n"
