"""A plain matmul's fp32 stationary rows transposed by the DMA engines, one tile of rows at a time: a linear layer
over many rows, `Y[m, n] += X[m, k] * W[k, n]`, or an NHWC 1x1 conv (a linear layer over the flattened pixels,
`Y[n, h, w, k] += X[n, h, w, c] * Wt[c, k]`). X is the stationary: its rows (M) are the output's partitions, and its
contraction dimension must be on the partitions too, so every 128-row tile of X is transposed. On TensorE, those
fp32 transposes cost the fp32 transpose factor beside fp32 matmuls that already bound the kernel, and a resident
stationary (prepared whole before the matmuls) puts every transpose ahead of the first matmul in TensorE's program
order. Here the stationary is prepared per row tile (`hoist_w = "k"`) by DMA transposes straight from HBM
(dma_transpose: bit-exact for 4-byte dtypes on Trn2, up to 90 % of a copy's throughput from HBM [ARCH3,
nki-spec 1.10.12]), so TensorE runs matmuls only and the DMA queues, idle beside them, do the transposes.

Chosen by the model's own rates (build_matvec.model_constants), as conv_weights.rows_by_dma does for batched
matmuls: per row tile, the busier of TensorE (matmuls + PE transposes) and the DMA queues (rows + the tile's
store) against the busier of TensorE (matmuls) and the DMA queues (rows at the transpose's share + the store).
16-bit stationaries keep TensorE's transposes (2.35 times cheaper; the DMA path does not pay there).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tilec.compiler.ir import DTYPE_BYTES
from tilec.compiler.ops import ConvOp
from tilec.compiler.schedule import MOVING_FMAX, PMAX

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder


def plain_rows(op: ConvOp, w_elem: int) -> bool:
    """A plain (not batched, not grouped, 1x1, k-major) matmul whose stationary is fp32 and big enough for its
    preparation to matter (two or more row tiles)."""
    return (not op.w_batch and op.w_layout == "kc" and op.groups == 1 and op.dim("R") == op.dim("S") == 1
            and op.w_relu is None and w_elem == 4 and op.dim("K") >= 2 * PMAX and not op.pool
            and op.stride == (1, 1) and op.dilation == (1, 1))


def pays(op: ConvOp, tile_k: int, item: int, out_item: int, moving_item: int) -> bool:
    """Whether the DMA transposes beat TensorE's: per row tile of `tile_k` rows (the module docstring), summed over
    the row tiles, by more than the moving operand's load, which the first tile's transposes then wait behind on
    the DMA queues (TensorE's transposes of a resident stationary ran beside it: examples/matmul.tl, B of 3 MiB
    loaded in 8.6 us before A's first transposes, 75.5 -> 75.8 us with them by DMA)."""
    from tilec.compiler.build_matvec import model_constants  # late: the model reads kernels
    prm = model_constants()
    f, ft = (prm["fp32_matmul"], prm["fp32_transpose"]) if item == 4 else (1.0, 1.0)
    ghz, fixed = prm["tensor_ghz"], prm["mm_fixed_cycles"]
    C = op.dim("C")
    ct = -(-C // PMAX)
    cols = op.dim("Ho") * op.dim("Wo")  # the moving operand's columns
    matmuls = ct * -(-cols // MOVING_FMAX) * (min(cols, MOVING_FMAX) + fixed) * f / ghz
    transposes = ct * (tile_k + fixed) * ft / ghz
    bw = prm["dma_engines"] * prm["dma_engine_bw"]  # bytes per ns
    rows, store = tile_k * C * item, tile_k * cols * out_item
    pe = max(matmuls + transposes, (rows + store) / bw)
    dma = max(matmuls, (rows / prm["dma_transpose_factor"] + store) / bw)
    moving = C * cols * moving_item / bw
    return -(-op.dim("K") // tile_k) * (pe - dma) > moving


def by_dma(b: _ConvBuilder) -> bool:
    """The builder's stationary rows by DMA transposes: a plain fp32 matmul prepared per row tile, when it pays."""
    op, p = b.op, b.p
    item = DTYPE_BYTES[b.hbm[op.w].dtype]
    return (plain_rows(op, item) and p.hoist_w == "k" and b.fold == 1 and b.pair == 1 and p.w_split != "c"
            and b.KT > 0 and not b.CR and b.dup == 1 and b.src_chip is None
            and pays(op, p.tile_k, item, DTYPE_BYTES[b.hbm[op.out].dtype], DTYPE_BYTES[b.hbm[op.x].dtype]))
