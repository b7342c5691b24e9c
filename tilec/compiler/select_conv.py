"""Selection of contractions: a matmul or convolution statement -> ConvOp (stationary and moving operands, batch,
spatial and tap loops, stride, dilation, padding, groups, bias), and the element-wise statements after it that run
on its PSUM eviction (relu, relu6 of an operand folded into its producer, a residual add, a pool)."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import cast

from tilec.compiler import eviction_fusion
from tilec.compiler.exprs import accesses, const_value, fmt_expr, product_factors, strip_relu
from tilec.compiler.lower import Comp, affine_index, size_value
from tilec.compiler.schedule import PMAX
from tilec.compiler.ops import SUPPORTED, ConvOp, Op, index_maps, plain, reads, reject
from tilec.compiler.select_pool import select_pool
from tilec.compiler.tconv_split import names_in, trailing_outputs
from tilec.errors import TilecError
from tilec.lang import syntax as sx


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
        elif trailing_rows(comp, program, s_acc, names):
            candidates.append((out_vars.index(outs[0]), outs[0], s_acc, m_acc))
    if not candidates:
        _vector_times_matrix(comp, program, out_vars)
        raise reject(comp, "no operand can be the matmul's stationary side (indexed by plain loop variables, "
                           "with exactly one output variable after the batch indices)", comp.update.span,
                     "a batched matmul's batch indices come first in the output and in both operands, in the "
                     "same order (`C[b, h, i, j] += A[b, h, i, k] * B[b, h, k, j]`); for another output order, "
                     "write C so, then permute it in its own statement (`Y[b, i, h, j] = C[b, h, i, j]`)")
    _, p, s_acc, m_acc = min(candidates, key=lambda t: t[0])
    w_relu = next((upper for inner, upper in _relu_operands(comp) if inner is s_acc), None)
    if s_acc.fill is not None:
        raise reject(comp, f"the stationary operand `{s_acc.tensor}` may not be a padded read", s_acc.span,
                     "pad the input (the operand indexed by output rows/columns plus filter taps) instead")
    s_vars = [plain(m) for m in index_maps(s_acc, comp, program)]
    tail = trailing_rows(comp, program, s_acc, s_vars)  # [p, a, b] of W[c, p, a, b], or none
    s_vars = s_vars[:len(s_vars) + 1 - len(tail)] if tail else s_vars
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
            if reds or "c" in roles or const != 0 or coefs[outs[0]] != 1 \
                    or out_vars.index(outs[0]) != len(batch):
                raise reject(comp, f"batch index `{fmt_expr(e)}` must come first and not be shifted", e.span,
                             "batch indices are the output's first indices, in the same order and unshifted in "
                             "both operands (`P[b, h, i, j] += Q[b, h, i, d] * K[b, h, j, d]`)")
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
        # `y[b, m] += A[b, m, k] * x[b, k]`: the output's leading index read by both operands is a batch, and the
        # batched matmul is the form that compiles (its right operand a [B, K, 1] matrix)
        batched = out_vars.index(p) == 0 and len(out_vars) == 2
        vector = min((s_acc, m_acc), key=lambda a: len(a.indices)).tensor
        raise reject(comp, f"a depthwise window reads channel `{p}` of {m_acc.tensor}; it cannot also sum over "
                           f"`{roles['c']}`", m_acc.span,
                     f"a batched matrix-vector product compiles as a batched matmul: declare {vector} with a "
                     f"last dimension of 1 and the result likewise, and index both with a loop `for z in 0..1` "
                     f"(`y[b, m, z] += A[b, m, k] * x[b, k, z]`)" if batched else SUPPORTED)
    if len(spatial) > 2:
        raise reject(comp, "the moving operand has at most two spatial dimensions", m_acc.span)
    rows: list[str] = []  # the stationary's leading output indices merged with p into the result's rows
    row_vars = [v for v in w_batch if v is not None]  # (plain output variables: takewhile stopped at None)
    if row_vars and not batch and _mergeable_rows(comp, program, row_vars + [p], s_acc):
        # `Y[n, y, x, k] += X[n, y, x, c] * W[c, k]` (a 1x1 conv in NHWC): a matmul of X seen as [N*H*W, C]
        rows, w_batch = row_vars + [p], []
    rows = tail or rows
    if w_batch and w_batch != batch:
        raise reject(comp, f"the batch indices of {s_acc.tensor} must be those of {m_acc.tensor}", s_acc.span)
    if out_vars != batch + (rows or [p]) + spatial:
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
    if len(batch) > 1:
        _check_merged_batch(comp, program, batch, (m_acc, s_acc) if w_batch else (m_acc,))
    conv = _conv_record(comp, program, roles, batch, spatial, taps, s_acc.tensor, m_acc.tensor, w_layout, tail)
    conv = replace(conv, w_batch=bool(w_batch), x_transposed=x_transposed)
    # the bias column would be read as [prod(rows), 1] (fuzz23); trailing rows' bias is indexed by them all (_bias)
    if rows and not tail and conv.bias and conv.bias_role == "k":
        init = cast(sx.Access, comp.init)
        raise reject(comp, f"a bias `{fmt_expr(init)}` indexed by `{p}` alone cannot start rows merged with "
                           f"`{', '.join(rows[:-1])}` (the stationary operand {s_acc.tensor} is seen as one matrix)",
                     init.span, f"start from 0 and add the bias in a statement of its own "
                                f"(`D[..] = {comp.target}[..] + {init.tensor}[{p}]`)")
    if rows:  # K is every merged row; its loop's text names them all
        merged = "for " + ", ".join(comp.loop_text(v)[4:] for v in rows) + " (the rows)"
        conv = replace(conv, dims=tuple((d, math.prod(comp.extent(v) for v in rows) if d == "K" else n)
                                        for d, n in conv.dims),
                       texts=tuple((role, merged if role == "k" else text) for role, text in conv.texts))
    if x_transposed:  # B[j, k]: its columns (the output's) are its rows
        conv = replace(conv, dims=tuple((d, conv.dim("Wo") if d == "W" else v) for d, v in conv.dims))
    pad = 2 - len(strides)  # one or two spatial dimensions: checked above
    stride_y, stride_x = [1] * pad + strides
    off_y, off_x = [0] * pad + offsets
    dil_y, dil_x = [1] * pad + dilations
    return replace(conv, stride=(stride_y, stride_x), offset=(off_y, off_x), dilation=(dil_y, dil_x), w_relu=w_relu)


def split_sign(comp: Comp) -> tuple[Comp, float]:
    """A contraction with a constant factor or a sign, `-(A[i, k] * B[k, j])`, `A[i, k] * (-B[k, j])`, `0.5 * A[i, k]
    * B[k, j]`, `A[i, k] * B[k, j] / 4`, as the product of the two reads and the constant: the builders scale the
    PSUM eviction by it (ConvOp.scale, before the bias). (comp, 1.0) unchanged when the update is not such a
    product."""
    update = comp.update
    if comp.red_op != "+=" or update is None or len(accesses(update)) != 2:
        return comp, 1.0
    factors, scale = product_factors(update)
    if len(factors) != 2 or scale == 0.0 or not math.isfinite(scale):
        return comp, 1.0
    product = sx.BinOp("*", factors[0], factors[1], update.span)
    return (comp, 1.0) if product == comp.update else (replace(comp, update=product), scale)


TCONV_HINT = ("transposed convolutions of stride 2 compile as `Y[n, k, 2 * y + a, 2 * x + b] += X[n, c, y, x] * "
              "Wt[c, k, a, b]` (kernel 2) and `.. += (X[n, c, y + a - t, x + b - u] ?? 0) * Wt[c, k, 2 * t + 1 - a, "
              "2 * u + 1 - b]` (kernel 4, padding 1), a, b, t, u in 0..2 (docs/language.md)")


def _strided_store(comp: Comp, pos: list[int], program) -> bool:
    """Two or more store indices of the form `s * y + a` (s > 1) while the reads use a summed variable together with
    an output variable in one index (`X[n, c, y + a - t, ..]`): the phase form of a transposed conv that
    tconv_pad.py could not rewrite."""
    names = {v for v, _ in comp.extents}
    if len(pos) < 2 or comp.update is None:
        return False
    for i in pos:
        try:
            coefs, _ = affine_index(comp.out_index[i], names, program.sizes)
        except TilecError:
            return False
        if len(coefs) != 2 or max(coefs.values()) < 2:
            return False
    summed = names - set(comp.out_vars)
    out = set(comp.out_vars)
    return any(names_in(ix) & summed and names_in(ix) & out for a in accesses(comp.update) for ix in a.indices)


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
        if _strided_store(comp, pos, program):
            raise reject(comp, f"{comp.target}'s store `{fmt_expr(comp.out_index[pos[0]])}` with a summed tap is a "
                               "transposed convolution in a form not compiled: each output phase must read one "
                               "tap per input offset", getattr(e, "span", comp.span), TCONV_HINT)
        raise reject(comp, f"the compiler needs each index of {comp.target} to be a plain loop variable, or one "
                           "merged channel index of a grouped convolution", getattr(e, "span", comp.span), hint)
    names = {v for v, _ in comp.extents}
    k = comp.out_vars[pos[0]]
    coefs, _ = affine_index(comp.out_index[pos[0]], names, program.sizes)
    g = next(v for v in coefs if v != k)
    kg, G = coefs[g], comp.extent(g)
    found: dict[str, int] = {}  # the input-channel variable c -> Cg
    # a depthwise multiplier reads input channel g itself (Cg = 1): a summed variable of extent 1 stands for c
    one = next(v for v in ("c", "c1", "c_in", "c_one") if v not in names)

    def index(e: sx.Expr) -> sx.Expr:
        cf, const = affine_index(e, names, program.sizes)
        if g not in cf:
            return e
        if (cf, const) == ({g: kg, k: 1}, 0):
            return sx.Name(k, e.span)
        if (cf, const) == ({g: 1}, 0) and found.get(one, 1) == 1 and kg > 1:
            found[one] = 1
            return sx.Name(one, e.span)
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
    if c == one:  # W[g*Kg + k, taps...] is W[k, c, taps...] with c in 0..1: its channel index is inserted
        new_update = _multiplier_weights(new_update, k, one, update.span)
    if _shape(comp.target, program)[pos[0]] != G * kg:
        raise reject(comp, f"`{fmt_expr(comp.out_index[pos[0]])}` writes {G * kg} channels of {comp.target}, not "
                           "all of them", comp.out_index[pos[0]].span, hint)
    ext = {k: G * kg, c: G * cg}
    stops = dict(comp.stops)
    extents, red_vars, stop_list = comp.extents, comp.red_vars, comp.stops
    if c == one:
        extents, red_vars, stop_list = extents + ((one, 1),), red_vars + (one,), stop_list + ((one, "1"),)
    return replace(comp, out_index=(), update=new_update, init=init,
                   extents=tuple((v, ext.get(v, n)) for v, n in extents if v != g),
                   red_vars=tuple(v for v in red_vars if v != g),
                   stops=tuple((v, f"{stops.get(g, G)}*{stops.get(v, n)}" if v in ext else s)
                               for v, s in stop_list if v != g for n in [dict(extents)[v]])), G


def _multiplier_weights(update: sx.Expr, k: str, c: str, span) -> sx.Expr:
    """The product with its weights' read `W[k, taps...]` (the read without the input channel c) as `W[k, c,
    taps...]`: the block-diagonal builder views W as [G*Kg, 1, taps...] (the same elements)."""
    def widen(e: sx.Expr) -> sx.Expr:
        first = e.indices[0] if isinstance(e, sx.Access) and e.indices else None
        if isinstance(e, sx.Access) and isinstance(first, sx.Name) and first.id == k \
                and not any(isinstance(i, sx.Name) and i.id == c for i in e.indices):
            return replace(e, indices=(e.indices[0], sx.Name(c, span)) + tuple(e.indices[1:]))
        if isinstance(e, sx.Call):
            return replace(e, args=tuple(widen(x) for x in e.args))
        return e
    assert isinstance(update, sx.BinOp)
    return replace(update, lhs=widen(update.lhs), rhs=widen(update.rhs))


def ungroup_single(comp: Comp, program) -> tuple[Comp, int]:
    """A grouped convolution whose groups have one output channel, `Y[n, g, ..] += X[n, g*Cg + c, ..] * W[g, c, ..]`
    (Kg = 1, so the output index is the plain group variable g): as `ungroup`, one contraction of all G*Cg input
    channels into the G output channels, g in the role of k and `g*Cg + c` read as c. Returns (the comp, G); (comp,
    1) unchanged when no read has such an index."""
    update = comp.update
    if comp.red_op != "+=" or not (isinstance(update, sx.BinOp) and update.op == "*"
                                   and len(accesses(update)) == 2):
        return comp, 1
    names = {v for v, _ in comp.extents}
    merged: set[tuple[str, str]] = set()  # (g, c) of every read index g*Cg + c
    for acc in accesses(update):
        for e in acc.indices:
            if isinstance(e, sx.Name):
                continue
            try:
                cf, const = affine_index(e, names, program.sizes)
            except TilecError:
                return comp, 1
            gs = [v for v in cf if v in comp.out_vars]
            cs = [v for v in cf if v in comp.red_vars]
            if const == 0 and len(cf) == 2 and len(gs) == 1 and len(cs) == 1 and cf[cs[0]] == 1 \
                    and cf[gs[0]] == comp.extent(cs[0]) > 1:
                merged.add((gs[0], cs[0]))
    if len(merged) != 1:
        return comp, 1
    (g, c), = merged
    # the weights read the group plainly (W[g, c, ..]); a strided window whose stride equals its taps
    # (`X[.., 2*y + r, ..] * W[k, c, r, ..]`, a patchify conv) has the same form but no read of `y`
    if not any(isinstance(i, sx.Name) and i.id == g for acc in accesses(update) for i in acc.indices):
        return comp, 1
    cg, G = comp.extent(c), comp.extent(g)

    def index(e: sx.Expr) -> sx.Expr:
        if isinstance(e, sx.Name):
            return e
        cf, const = affine_index(e, names, program.sizes)
        return sx.Name(c, e.span) if (cf, const) == ({g: cg, c: 1}, 0) else e
    stops = dict(comp.stops)
    return replace(comp, update=_map_indices(update, index),
                   extents=tuple((v, G * cg if v == c else n) for v, n in comp.extents),
                   stops=tuple((v, f"{stops.get(g, G)}*{s}" if v == c else s) for v, s in comp.stops)), G


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


def grouped_conv(comp: Comp, groups: int, program) -> ConvOp:
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
    w_dims = _shape(op.w, program)
    if len(w_dims) == len(w_acc.indices) - 1:  # a depthwise multiplier's W[g*Kg + k, taps...] (see ungroup)
        w_dims = w_dims[:1] + [1] + w_dims[1:]
    if w_dims[1] != cg:
        raise reject(comp, f"{op.w}'s dimension 1 has {w_dims[1]} elements, one group has {cg} "
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
    """Each factor of the product is a read, f32() of one (exact: a product of two 16-bit floats fits in fp32) or a
    conversion of one to its own dtype (the identity), or
    relu / relu6 of one (the moving operand's folded into its producer, `_relu_operand`; the stationary's applied
    after its load, ConvOp.w_relu); a negation was taken off by `split_sign`; both reads have one dtype;
    a zero-padded read (`?? 0`) is the moving operand (its halo is zeroed in SBUF). The builders multiply the
    operand tiles as loaded, so anything else around a factor would be dropped (a scale, a function, a negation,
    a narrowing conversion: `relu(X) * W` of an input once ran as `X * W`, found by the fuzzer and by tests)."""
    update = comp.update
    assert isinstance(update, sx.BinOp)
    reads = []
    for factor in (update.lhs, update.rhs):
        inner = operand_read(factor, program)
        if inner is None:
            raise reject(comp, f"`{fmt_expr(factor)}` is not a tensor read: a contraction multiplies two reads "
                               f"(each may be under relu or `min(relu(..), c)`; a constant factor or a sign goes "
                               f"on the result)", factor.span,
                         "compute the operand into a tensor first (`T[..] = ...`), then contract T")
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


def operand_read(factor: sx.Expr, program) -> sx.Access | None:
    """The read a contraction's factor multiplies as loaded (under an exact conversion, relu or relu6), or None."""
    widened = factor.args[0] if isinstance(factor, sx.Call) and _exact_conversion(factor, program) else factor
    inner, _ = strip_activation(widened)
    return inner if isinstance(inner, sx.Access) else None


def _exact_conversion(call: sx.Call, program) -> bool:
    """`f32(x)` (a widening) or a conversion of a read to its own dtype (`bf16(A[i, k])` of a bf16 A): the value is
    unchanged, so the operand is the read as loaded."""
    if call.fn == "f32":
        return True
    arg = call.args[0] if len(call.args) == 1 else None
    return isinstance(arg, sx.Access) and call.fn == program.tensors[arg.tensor].dtype


def _relu_operands(comp: Comp) -> list[tuple[sx.Access, float]]:
    """The reads a contraction takes the relu (or relu6) of, `relu(T[..] ?? 0) * W[..]`, with their upper bounds."""
    update = comp.update
    if not isinstance(update, sx.BinOp):
        return []
    found = []
    for factor in (update.lhs, update.rhs):
        inner, upper = strip_activation(factor)
        if upper is not None and isinstance(inner, sx.Access):
            found.append((inner, upper))
    return found


def _relu_operand(comp: Comp, op: ConvOp) -> tuple[sx.Access, float] | None:
    """The moving operand's relu (or relu6), `relu(T[..] ?? 0) * W[..]`, and its upper bound: a relu'd factor left
    once the stationary operand's (ConvOp.w_relu, applied after its load) is set aside."""
    found = _relu_operands(comp)
    if op.w_relu is not None:
        mine = next(i for i, (inner, upper) in enumerate(found) if inner.tensor == op.w and upper == op.w_relu)
        found = found[:mine] + found[mine + 1:]
    return found[0] if found else None


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


def _mergeable_rows(comp: Comp, program, rows: list[str], s_acc: sx.Access) -> bool:
    """Whether the output's first indices `rows` (the stationary's leading plain indices) each run over the whole of
    their dimension in the output and in the stationary operand, so both are seen as [prod(rows), ..] (a free
    reshape of contiguous HBM). The stationary's indices must begin with `rows` (`A[b, k, i]` is not [B*M, K]: its
    rows are apart; fuzz23's wrong answer when K == M let the extents match)."""
    if [plain(m) for m in index_maps(s_acc, comp, program)][:len(rows)] != rows:
        return False
    for name in (comp.target, s_acc.tensor):
        shape = [size_value(d, program.sizes) if not isinstance(d, int) else d for d in program.tensors[name].shape]
        if any(shape[pos] != comp.extent(v) for pos, v in enumerate(rows)):
            return False
    return True


def trailing_rows(comp: Comp, program, s_acc: sx.Access, names: list[str | None]) -> list[str]:
    """The stationary's last indices when they are two or more output variables, in the output's order and next to
    each other there, each over its whole dimension of both tensors, and no other index of it is an output
    variable: `T[n, k, a, b, y, x] += X[n, c, y, x] * W[c, k, a, b]` (a transposed conv's taps as output channels)
    is a matmul with [C, K*2*2] stationary rows (a free reshape of contiguous HBM, as _mergeable_rows'). [] if not."""
    out_vars = list(comp.out_vars)
    tail = trailing_outputs(names, out_vars)
    if not tail:
        return []
    at = out_vars.index(tail[0])
    if out_vars[at:at + len(tail)] != tail:
        return []
    for name, first in ((comp.target, at), (s_acc.tensor, len(names) - len(tail))):
        shape = [size_value(d, program.sizes) if not isinstance(d, int) else d for d in program.tensors[name].shape]
        if any(shape[first + i] != comp.extent(v) for i, v in enumerate(tail)):
            return []
    return tail


def _check_merged_batch(comp: Comp, program, batch: list[str], operands: tuple[sx.Access, ...]) -> None:
    """Several batch indices (attention's `P[b, h, i, j] += Q[b, h, i, d] * K[b, h, j, d]`) are one batch of their
    product's size when each runs over the whole of its dimension of every tensor that has it (the output and the
    operands with batch indices): the leading dimensions [B, G, ..] are then one contiguous [B * G, ..] the builder
    views the tensors with (build_util.hbm_view, a free reshape of HBM)."""
    for name, span in [(comp.target, comp.span)] + [(a.tensor, a.span) for a in operands]:
        shape = [size_value(d, program.sizes) if not isinstance(d, int) else d for d in program.tensors[name].shape]
        for pos, v in enumerate(batch):
            if shape[pos] != comp.extent(v):
                raise reject(comp, f"batch index `{v}` runs over part of dimension {pos} of {name} ({comp.extent(v)} "
                                   f"of {shape[pos]}): several batch indices are compiled when each covers its "
                                   "whole dimension", span, "run the loop over the whole dimension, or write one "
                                   "statement per batch range")


def _conv_record(comp, program, roles, batch, spatial, taps, w, x, w_layout, tail=()) -> ConvOp:
    ext = comp.extent
    spatial, taps = [None] * (2 - len(spatial)) + spatial, [None] * (2 - len(taps)) + taps
    names = {"n": batch[0] if batch else None, "y": spatial[0], "x": spatial[1], "r": taps[0], "s": taps[1]}
    roles.update({k: v for k, v in names.items() if v})
    x_shape = program.tensors[x].shape
    hx = x_shape[-2] if spatial[0] else 1
    dims = {"N": math.prod(ext(v) for v in batch), "C": ext(roles.get("c", roles["k"])), "K": ext(roles["k"]),
            "H": hx, "W": x_shape[-1] if spatial[1] else 1,  # a matrix-vector product: one column
            "Ho": ext(spatial[0]) if spatial[0] else 1, "Wo": ext(spatial[1]) if spatial[1] else 1,
            "R": ext(taps[0]) if taps[0] else 1, "S": ext(taps[1]) if taps[1] else 1}
    residual = _init_residual(comp, program, batch, roles)
    shared = residual is not None and program.tensors[residual].shape != program.tensors[comp.target].shape
    bias, bias_role = (None, "k") if residual else _bias(comp, roles, program, list(tail))
    lines = tuple((role, comp.line_of(var)) for role, var in sorted(roles.items())) + \
        (("update", comp.update_line or comp.line),)
    texts = tuple((role, comp.loop_text(var)) for role, var in sorted(roles.items()))
    if len(batch) > 1:  # one loop over the merged batch: its text names every batch loop
        merged = "for " + ", ".join(comp.loop_text(v)[4:] for v in batch) + " (one batch)"
        texts = tuple((role, merged if role == "n" else text) for role, text in texts)
    return ConvOp(comp.target, comp.target, x, w, bias, tuple(dims.items()), w_layout,
                  tuple(sorted(roles.items())), line=comp.line, lines=lines, texts=texts, span=comp.span,
                  bias_role=bias_role, residual=residual, residual_shared=shared)


def _init_residual(comp: Comp, program, batch: list[str] | None = None, roles: dict[str, str] | None = None
                   ) -> str | None:
    """An initial value read from another tensor at the output's element, `Y[n, k, y, x] = X[n, k, y, x]` then
    `Y[..] += ...` (the MobileNetV2 block's skip connection): added on the PSUM eviction like a residual. For a
    batched matmul also one read at every index but the batch ones (rows21: a causal mask `Mk[i, j]` shared by the
    heads h of `P[h, i, j]`): build_conv reads its band at batch index 0 for every n."""
    init = comp.init
    if not isinstance(init, sx.Access) or init.fill is not None or init.tensor == comp.target:
        return None
    names, outs = [plain(m) for m in index_maps(init, comp, program)], list(comp.out_vars)
    shape, out = program.tensors[init.tensor].shape, program.tensors[comp.target].shape
    if names == outs:
        return init.tensor if shape == out else None
    batch = batch or []
    shared = bool(batch) and roles is not None and not any(r in roles for r in ("y", "r", "s")) and \
        outs[:len(batch)] == list(batch) and names == outs[len(batch):] and tuple(shape) == tuple(out[len(batch):])
    return init.tensor if shared else None


def _bias(comp: Comp, roles: dict[str, str], program, tail: list[str]) -> tuple[str | None, str]:
    """The initial value: 0, a column b[k] (one value per output partition; b[k, a, b] over trailing rows k, a, b),
    or for a matmul a row b[x] along its output columns (broadcast across the partitions once, added on PSUM
    eviction)."""
    if comp.init is None or const_value(comp.init) == 0.0:
        return None, "k"
    init, k, x = comp.init, roles["k"], roles.get("x")
    names = [plain(m) for m in index_maps(init, comp, program)] if isinstance(init, sx.Access) else None
    tensor = init.tensor if isinstance(init, sx.Access) else None  # (names is None unless init is a read)
    if names == (tail or [k]):
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


def fuse_epilogues(op: ConvOp, comps, i: int, program, consumed: set[int]) -> ConvOp:
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
        if op.epilogue:  # after an element-wise chain, only more of it (eviction_fusion)
            pass
        elif len(reads(nxt)) == 1:
            fused = _try_relu(op, nxt, current, program) or _try_pool(op, nxt, current, program)
        earlier = frozenset(c.target for c in comps[:i])  # (a row b[j] may be a temporary written before)
        fused = fused or eviction_fusion.try_chain(op, nxt, current, program, earlier)  # (b[k]: a column)
        if fused is None and len(reads(nxt)) == 2 and not in_place and not op.epilogue:
            fused = _try_residual(op, nxt, current, program)
        if fused is None and in_place and program.tensors[current].kind != "temp":
            raise _in_place_error(nxt)
        if fused is None:
            break
        op, current = fused, nxt.target
        consumed.add(j)
    return op


def fold_operand_relu(ops: list[Op], comps, comp: Comp, program, op: ConvOp) -> None:
    """`Y[..] += relu(T[..] ?? 0) * W[..]` (or `min(relu(T[..]), 6)`) where T is a temporary written by an earlier
    contraction and read only under that function: T is stored rectified (relu, then the minimum, on T's PSUM
    eviction; both keep 0 at 0, so the padding is unchanged)."""
    found = _relu_operand(comp, op)
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
        f"{c.target}, a statement may update it in place only as an element-wise chain of the same element "
        f"(`{elem} = f({elem})`: activations, + - * / max min with constants, a vector along the output "
        "channels or one tensor read at the same element), which runs on the PSUM eviction", c.span,
        f"compute the contraction into a temporary (`T[{', '.join(c.out_vars)}] += ...`), then write "
        f"`{elem} = f(T[{', '.join(c.out_vars)}])` as its own statement")


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


def _vector_times_matrix(comp: Comp, program, out_vars: list[str]) -> None:
    """A vector times a matrix with no batch (`Y[t, d] += w[l] * Hs[l, t, d]`, ELMo's scalar mix): the vector reads
    no output index, so neither operand can be the stationary side; say the form that compiles (user24)."""
    reads = accesses(comp.update) if comp.update is not None else []
    vec = next((a for a in reads if not any(plain(m) in out_vars for m in index_maps(a, comp, program))), None)
    if vec is None or len(reads) != 2:
        return
    idx = ", ".join(fmt_expr(ix) for ix in vec.indices)
    outs = ", ".join(out_vars)
    raise reject(comp, f"`{fmt_expr(vec)}` is a vector read with none of the output's indices [{outs}] (a vector "
                       "times a matrix): a matmul's stationary side needs one", vec.span,
                 f"give both a unit first dimension: `{vec.tensor}_1[z, {idx}] = {fmt_expr(vec)}` (z in 0..1), "
                 f"`{comp.target}_1[z, {outs}] += {vec.tensor}_1[z, {idx}] * ..`, then "
                 f"`{comp.target}[{outs}] = {comp.target}_1[0, {outs}]`; with a batch, its indices come first in "
                 "the output and both operands (for another output order, write it so, then permute it)")
