"""Selection of pools whose window axes have dimensions after them (issue 13): a TensorFlow / JAX user's NHWC max
pool `Y[n, y, x, c] max= X[n, 2*y + r - 1, 2*x + q - 1, c] ?? -inf`, an average, a min, over any two adjacent axes.

The op is a PoolOp like the NCHW one (select_pool.py) with one more dimension, K: the product of the dimensions
after the window axes (C for NHWC), which every pass carries along unchanged. build_pool_axes.py compiles it:
output rows on the partitions, (x, K) on the free axis.
"""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.lower import Comp
from tilec.compiler.ops import PoolOp, PoolSpec, reject
from tilec.lang import syntax as sx
from tilec.lang.functions import ACCUMULATE


def prod(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def pooled_axes(comp: Comp, inner: sx.Access, windows: list[int], strides: list[int], offsets: list[int]) -> int:
    """The position of the first of the two adjacent window axes: the last two when they hold every window,
    stride and offset (the NCHW rule's case), else the pair that does."""
    n = len(windows)
    if n < 2:
        raise reject(comp, "a pool reads a tensor of two dimensions or more", inner.span)
    pooled = [i for i in range(n) if (windows[i], strides[i], offsets[i]) != (1, 1, 0)]
    if not pooled or pooled[0] >= n - 2:
        return n - 2
    if pooled[-1] - pooled[0] > 1:
        raise reject(comp, f"the pooled dimensions of {inner.tensor} ({', '.join(map(str, pooled))}) are not two "
                           "adjacent ones", inner.span, "pool over two neighbouring dimensions (NHWC: H and W)")
    return pooled[0] if pooled[0] + 1 < n else n - 2


def inner_pool(comp: Comp, inner: sx.Access, at: int, wso: tuple[list[int], list[int], list[int]], rows: int,
               shape: tuple[int, ...], scale: float, relu: bool) -> PoolOp:
    """The PoolOp of a pool over axes at, at + 1 of a tensor with dimensions after them: dims B (the rows before
    them), H, W, K (the elements after them, contiguous in X and Y), Ho; vars b, i, j, k."""
    from tilec.compiler.select_pool import _window  # (late: select_pool imports this module)
    windows, strides, offsets = (v[at:at + 2] for v in wso)
    assert comp.red_op is not None  # a pool is a reduction
    op = ACCUMULATE[comp.red_op]
    window = _window(comp, inner, op, windows, strides, offsets, shape[at:at + 2], at)
    H, W, K = shape[at], shape[at + 1], shape[-1]
    dims = (("B", rows), ("H", H), ("W", W), ("K", K), ("Ho", window.out[0]))
    names = comp.out_vars
    roles = ((("b", names[0]),) if at else ()) + (("i", names[at]), ("j", names[at + 1]), ("k", names[at + 2]))
    pool = PoolSpec(windows[0], windows[1], op, scale)
    return PoolOp(comp.target, comp.target, inner.tensor, dims, pool, roles, relu, comp.line, comp.span,
                  comp.lines, replace(window))


def is_inner(op) -> bool:
    """A pool of build_pool_axes.py (its window axes have dimensions after them)."""
    return isinstance(op, PoolOp) and "K" in dict(op.dims)
