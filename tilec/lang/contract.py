"""Sum-of-products contractions for the evaluator, as one batched matmul where possible.

`contract(a, b, out)` computes sum over the shared axes not in `out` of a * b, for arrays with named axes. When the
output axes split as batch + (axes only in one factor) + (axes only in the other), the product is one `np.matmul`
whose result is already in output order (no transposed copy), and whose operands and result live in scratch buffers
reused from call to call (a conv tap loop otherwise allocates and page-faults hundreds of MB per tap).
Anything else goes to `np.einsum`.
"""
from __future__ import annotations

import math
import string
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Split:
    left: int  # index of the factor that goes on the left of the matmul
    batch: tuple[str, ...]
    rows: tuple[str, ...]  # output axes only in the left factor
    cols: tuple[str, ...]  # output axes only in the right factor
    inner: tuple[str, ...]  # contracted axes (in both factors, not in the output)


def find_split(axes: tuple[tuple[str, ...], tuple[str, ...]], out: tuple[str, ...]) -> Split | None:
    """The matmul form of a two-factor contraction, preferring one with both rows and columns (a GEMM)."""
    best = None
    for left in (0, 1):
        la, ra = axes[left], axes[1 - left]
        inner = tuple(x for x in la if x in ra and x not in out)
        if any(x not in out and x not in inner for x in la + ra):
            return None  # an axis summed in one factor only: leave it to einsum
        for i in range(len(out) + 1):
            for j in range(i, len(out) + 1):
                rows, cols = out[i:j], out[j:]
                if all(x in la and x not in ra for x in rows) and all(x in ra and x not in la for x in cols):
                    cand = Split(left, out[:i], rows, cols, inner)
                    if best is None or (bool(rows) and bool(cols)) > (bool(best.rows) and bool(best.cols)):
                        best = cand
    return best


class Contractor:
    """Holds the scratch buffers; one per evaluator run."""

    def __init__(self) -> None:
        self.scratch: dict[tuple, np.ndarray] = {}

    def buffer(self, key: str, shape: tuple[int, ...]) -> np.ndarray:
        if (key, shape) not in self.scratch:
            self.scratch[(key, shape)] = np.empty(shape, dtype=np.float32)
        return self.scratch[(key, shape)]

    def contract(self, data: tuple[np.ndarray, np.ndarray], axes: tuple[tuple[str, ...], tuple[str, ...]],
                 out: tuple[str, ...], extent: dict[str, int]) -> np.ndarray:
        """The result has one axis per name in out, in that order. It may be a scratch buffer: use it before the
        next call."""
        split = find_split(axes, out)
        if split is None:
            return einsum(list(data), list(axes), out)
        left = self.operand("left", data[split.left], axes[split.left], split.batch, split.rows, split.inner, extent)
        right = self.operand("right", data[1 - split.left], axes[1 - split.left], split.batch, split.inner,
                             split.cols, extent)
        shape = np.broadcast_shapes(left.shape[:-2], right.shape[:-2]) + (left.shape[-2], right.shape[-1])
        result = np.matmul(left, right, out=self.buffer("out", shape))
        return result.reshape(tuple(extent[x] for x in out))

    def operand(self, key: str, data: np.ndarray, axes: tuple[str, ...], batch: tuple[str, ...],
                first: tuple[str, ...], second: tuple[str, ...], extent: dict[str, int]) -> np.ndarray:
        """data as (batch..., prod(first), prod(second)); batch axes it lacks become length 1."""
        order = [axes.index(x) for x in batch + first + second if x in axes]
        moved = np.transpose(np.asarray(data, dtype=np.float32), order)
        shape = tuple(extent[x] if x in axes else 1 for x in batch)
        shape += (math.prod(extent[x] for x in first), math.prod(extent[x] for x in second))
        try:
            return np.reshape(moved, shape, copy=False)
        except ValueError:  # not expressible as a view: stage it in a reused contiguous buffer
            buf = self.buffer(key, shape)
            np.copyto(buf.reshape(moved.shape), moved)
            return buf


def einsum(data: list[np.ndarray], axes: list[tuple[str, ...]], out: tuple[str, ...]) -> np.ndarray:
    """sum of products by np.einsum (BLAS inside where it can); axes are named, letters are assigned here."""
    names = sorted({x for a in axes for x in a} | set(out))
    letter = {x: string.ascii_letters[i] for i, x in enumerate(names)}
    spec = ",".join("".join(letter[x] for x in a) for a in axes) + "->" + "".join(letter[x] for x in out)
    return np.einsum(spec, *(np.asarray(d, dtype=np.float32) for d in data), optimize=True)
