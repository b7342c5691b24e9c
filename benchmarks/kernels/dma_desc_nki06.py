"""The NKI 0.6 twin of benchmarks/kernels/dma_desc.py (Neuron SDK 2.29+, `import nki`): the same kernels and result
(out == x), Python range loops (NKI 0.6 unrolls them). Written for benchmarks/trn2_dma_desc.py --nki06; the question
and how to read the times are in dma_desc.py's and the script's docstrings.
"""
import nki
import nki.isa as nisa
import nki.language as nl

TOTAL = 2048  # fp32 elements per partition; benchmarks/trn2_dma_desc.py --total changes it before tracing
FREE = 128  # fp32 elements per partition of each small DMA; --free


def _pieces(rows, p, total):
    """(p0, p1, f0, f1) of each DMA of the first copy: all of x, or (rows, FREE) pieces, consecutive ones on
    different engines (8 partitions per engine)."""
    if rows == 0:
        return [(0, p, 0, total)]
    return [(g * rows, (g + 1) * rows, j * FREE, (j + 1) * FREE) for j in range(total // FREE)
            for g in range(p // rows)]


def _copy(x, pieces):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    for p0, p1, f0, f1 in pieces:
        nisa.dma_copy(dst=t[p0:p1, f0:f1], src=x[p0:p1, f0:f1])
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def whole(x):
    """x in one DMA."""
    return _copy(x, _pieces(0, *x.shape))


@nki.jit
def rows128(x):
    """x in (128, FREE) DMAs."""
    return _copy(x, _pieces(128, *x.shape))


@nki.jit
def rows8(x):
    """x in (8, FREE) DMAs, one engine each."""
    return _copy(x, _pieces(8, *x.shape))
