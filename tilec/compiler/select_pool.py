"""Selection of window pools: `Y[.., i, j] max= X[.., s*i + p - pad, s*j + q - pad] (?? fill)` (also min=, +=, and an
average's `Y = S / D` fused when D is a constant or each window's count of taps inside X) -> PoolOp with its Window
(stride, offset, output size, count), compiled by the window-pool rule (rules_pool.py)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from tilec.compiler.exprs import accesses, const_value, fmt_expr, strip_relu, strip_scale
from tilec.compiler.lower import Comp
from tilec.compiler.pool_axes import inner_pool, pooled_axes, prod
from tilec.compiler.ops import PoolOp, PoolSpec, Window, index_maps, plain, reads, reject
from tilec.lang import syntax as sx
from tilec.lang.functions import ACCUMULATE


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
                           "and reduces windows of two adjacent ones", inner.span)
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
    shape = program.tensors[inner.tensor].shape
    a = pooled_axes(comp, inner, windows, strides, offsets)
    rows = 1
    for d in shape[:a]:
        rows *= d
    if a + 2 < len(shape):  # the window axes have dimensions after them (NHWC): pool_axes.py
        dims_in = shape[:a + 2] + (prod(shape[a + 2:]),)
        return inner_pool(comp, inner, a, (windows, strides, offsets), rows, dims_in, scale, relu)
    assert comp.red_op is not None  # a pool is a reduction
    op = ACCUMULATE[comp.red_op]
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
            extent: tuple[int, ...], at: int = -2) -> Window:
    """The overlapping / strided / padded window of a pool (rules_pool.py), checked: the padding is the reduction's
    identity (it then never counts) and every window reads at least one element of the input."""
    if inner.fill is not None and inner.fill != _IDENTITY[op]:
        want = {"maximum": "-inf", "minimum": "inf", "add": "0"}[op]
        raise reject(comp, f"a padded {'sum' if op == 'add' else op[:3]} pool must pad with {want} (the padding "
                           f"then never counts); here it pads with {inner.fill:g}", inner.span,
                     f"write `{fmt_expr(replace(inner, fill=None))} ?? {want}`")
    at %= len(inner.indices)  # (the position of the first window axis: the last two unless pool_axes.py's)
    out = (comp.extent(comp.out_vars[at]), comp.extent(comp.out_vars[at + 1]))
    for axis in range(2):
        for o in range(out[axis]):
            first = o * strides[axis] + offsets[axis]
            if first + windows[axis] <= 0 or first >= extent[axis]:
                raise reject(comp, f"window {o} of index {at + axis} of {inner.tensor} lies "
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
    written = op
    op = op.windowed()  # (window == stride: the window made explicit, the count evaluated over its outputs)
    assert op.window is not None
    ho, wo = op.window.out
    at = comps[i].out_vars.index(dict(op.vars)["i"])  # (the window axes: the last two, or pool_axes.py's)
    grid = _grid(d, nxt.out_vars[at], nxt.out_vars[at + 1], ho, wo, program.sizes)
    if grid is None or not np.all(grid != 0):
        return written
    scale, count = op.pool.scale, op.window.count
    if np.all(grid == grid.flat[0]):
        scale *= float(grid.flat[0]) if e.op == "*" else 1.0 / float(grid.flat[0])
    elif e.op == "/" and op.pool.op == "add" and np.array_equal(grid, _inside(op)):
        count = "inside"
    else:
        return written
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
