"""What does a small DMA cost a Trn2 DMA engine: a time per descriptor (one contiguous partition row), a time per
transfer, or neither beyond the bytes? It decides the performance model's `dma_desc_ns` (14 ns, fitted to the tiny-DMA
calibration rows) against nki-spec's ~105 ns per row (a fit to the DMA efficiency figure of v2.32.0
nki/get-started/about/nki-dma-overview.rst, docs/notes/fid14.md).

NKI 0.1 kernels (Neuron SDK 2.21-2.26), written for benchmarks/trn2_dma_desc.py, which times them on hardware and runs
them on tilec's interpreter and model. Each kernel copies x (128, TOTAL) fp32 HBM -> one SBUF tile t (128, TOTAL) by
many independent DMAs (each writes its own columns of t: no DMA waits for another), then t -> out by one DMA. They
differ in how the first copy is cut:

    whole      one DMA of (128, TOTAL): 128 rows, 8 per DMA engine (the fixed cost to subtract)
    rows128    TOTAL / FREE DMAs of (128, FREE): each engine moves 8 rows of FREE * 4 bytes per DMA
    rows8      16 * TOTAL / FREE DMAs of (8, FREE): each on one engine (partitions 8e..8e+7), 8 rows each; per engine
               the same rows and bytes as rows128, in as many DMAs, but 16 times the DMAs in all (every DMA makes all
               16 engines write a semaphore, DMAINTRO)

Expected (NumPy): out == x.
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

TOTAL = 2048  # fp32 elements per partition; benchmarks/trn2_dma_desc.py --total changes it before tracing
FREE = 128  # fp32 elements per partition of each small DMA; --free


def _copy(x, rows):
    p, total = x.shape
    out = nl.ndarray((p, total), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((p, total), dtype=x.dtype, buffer=nl.sbuf)
    if rows == 0:
        nisa.dma_copy(src=x, dst=t)
    else:
        for j in nl.affine_range(total // FREE):
            for g in nl.affine_range(p // rows):  # consecutive DMAs on different engines
                nisa.dma_copy(src=x[g * rows:(g + 1) * rows, j * FREE:(j + 1) * FREE],
                              dst=t[g * rows:(g + 1) * rows, j * FREE:(j + 1) * FREE])
    nisa.dma_copy(src=t, dst=out)
    return out


@nki.jit
def whole(x):
    return _copy(x, 0)


@nki.jit
def rows128(x):
    return _copy(x, 128)


@nki.jit
def rows8(x):
    return _copy(x, 8)
