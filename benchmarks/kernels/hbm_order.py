"""Do two DMAs writing disjoint but interleaved elements of one HBM tensor wait for each other on Trn2?

NKI 0.1 kernels (Neuron SDK 2.21-2.26, the course toolchain), written for benchmarks/trn2_hbm_order.py, which times
them on hardware and runs them on tilec's interpreter and model. Every kernel loads one (128, 2F) tile x once and
then, for each of BANDS bands, stores it to HBM. They differ only in where the two halves of the tile go:

    one         out[k] <- x                                    one DMA per band (128 rows of 2F)
    rows        out[k, :, 0:F] <- x[:, 0:F]; out[k, :, F:2F] <- x[:, F:2F]
                                                               two DMAs per band, interleaved rows: their byte
                                                               ranges overlap, their elements do not
    blocks      out[k, 0] <- x[:, 0:F]; out[k, 1] <- x[:, F:2F]
                                                               the same two DMAs (128 rows of F each) into two
                                                               separate blocks: byte ranges disjoint
    tensors     a[k] <- x[:, 0:F]; b[k] <- x[:, F:2F]          the same two DMAs into two output tensors
    overwrite   out[k, :, 0:F] <- x[:, F:2F]; out[k] <- x      the first DMA of `rows`, then one that overwrites
                                                               it: a true write-after-write (the control)
    roundtrip   h[k, :, 0:F] <- x[:, 0:F]; h[k, :, F:2F] <- x[:, F:2F]; t <- h[k]; out[k] <- t
                                                               read-after-write through an HBM intermediate h
                                                               (a correctness question too: t must see both)

Each comes with an affine_range loop (name_affine) and a sequential_range loop (name_seq). Expected results
(NumPy): out[k] == x for one/rows/overwrite/roundtrip; out[k, 0] == x[:, :F], out[k, 1] == x[:, F:] for blocks;
a[k] == x[:, :F], b[k] == x[:, F:] for tensors.
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

BANDS = 16  # stores per kernel; benchmarks/trn2_hbm_order.py --bands changes it before the kernels are traced


def _tile(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=x, dst=t)
    return t


@nki.compiler.skip_middle_end_transformations
@nki.jit
def one_affine(x):
    out = nl.ndarray((BANDS, x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    for k in nl.affine_range(BANDS):
        nisa.dma_copy(src=t, dst=out[k])
    return out


@nki.compiler.skip_middle_end_transformations
@nki.jit
def one_seq(x):
    out = nl.ndarray((BANDS, x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    for k in nl.sequential_range(BANDS):
        nisa.dma_copy(src=t, dst=out[k])
    return out


@nki.compiler.skip_middle_end_transformations
@nki.jit
def rows_affine(x):
    f = x.shape[1] // 2
    out = nl.ndarray((BANDS, x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    for k in nl.affine_range(BANDS):
        nisa.dma_copy(src=t[:, 0:f], dst=out[k, :, 0:f])
        nisa.dma_copy(src=t[:, f:2 * f], dst=out[k, :, f:2 * f])
    return out


@nki.compiler.skip_middle_end_transformations
@nki.jit
def rows_seq(x):
    f = x.shape[1] // 2
    out = nl.ndarray((BANDS, x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    for k in nl.sequential_range(BANDS):
        nisa.dma_copy(src=t[:, 0:f], dst=out[k, :, 0:f])
        nisa.dma_copy(src=t[:, f:2 * f], dst=out[k, :, f:2 * f])
    return out


@nki.compiler.skip_middle_end_transformations
@nki.jit
def blocks_affine(x):
    f = x.shape[1] // 2
    out = nl.ndarray((BANDS, 2, x.shape[0], f), dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    for k in nl.affine_range(BANDS):
        nisa.dma_copy(src=t[:, 0:f], dst=out[k, 0])
        nisa.dma_copy(src=t[:, f:2 * f], dst=out[k, 1])
    return out


@nki.compiler.skip_middle_end_transformations
@nki.jit
def blocks_seq(x):
    f = x.shape[1] // 2
    out = nl.ndarray((BANDS, 2, x.shape[0], f), dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    for k in nl.sequential_range(BANDS):
        nisa.dma_copy(src=t[:, 0:f], dst=out[k, 0])
        nisa.dma_copy(src=t[:, f:2 * f], dst=out[k, 1])
    return out


@nki.compiler.skip_middle_end_transformations
@nki.jit
def tensors_affine(x):
    f = x.shape[1] // 2
    a = nl.ndarray((BANDS, x.shape[0], f), dtype=x.dtype, buffer=nl.hbm)
    b = nl.ndarray((BANDS, x.shape[0], f), dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    for k in nl.affine_range(BANDS):
        nisa.dma_copy(src=t[:, 0:f], dst=a[k])
        nisa.dma_copy(src=t[:, f:2 * f], dst=b[k])
    return a, b


@nki.compiler.skip_middle_end_transformations
@nki.jit
def tensors_seq(x):
    f = x.shape[1] // 2
    a = nl.ndarray((BANDS, x.shape[0], f), dtype=x.dtype, buffer=nl.hbm)
    b = nl.ndarray((BANDS, x.shape[0], f), dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    for k in nl.sequential_range(BANDS):
        nisa.dma_copy(src=t[:, 0:f], dst=a[k])
        nisa.dma_copy(src=t[:, f:2 * f], dst=b[k])
    return a, b


@nki.compiler.skip_middle_end_transformations
@nki.jit
def overwrite_affine(x):
    f = x.shape[1] // 2
    out = nl.ndarray((BANDS, x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    for k in nl.affine_range(BANDS):
        nisa.dma_copy(src=t[:, f:2 * f], dst=out[k, :, 0:f])  # overwritten by the next line
        nisa.dma_copy(src=t, dst=out[k])
    return out


@nki.compiler.skip_middle_end_transformations
@nki.jit
def overwrite_seq(x):
    f = x.shape[1] // 2
    out = nl.ndarray((BANDS, x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    for k in nl.sequential_range(BANDS):
        nisa.dma_copy(src=t[:, f:2 * f], dst=out[k, :, 0:f])  # overwritten by the next line
        nisa.dma_copy(src=t, dst=out[k])
    return out


@nki.compiler.skip_middle_end_transformations
@nki.jit
def roundtrip_affine(x):
    f = x.shape[1] // 2
    out = nl.ndarray((BANDS, x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.hbm)
    h = nl.ndarray((BANDS, x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    for k in nl.affine_range(BANDS):
        nisa.dma_copy(src=t[:, 0:f], dst=h[k, :, 0:f])
        nisa.dma_copy(src=t[:, f:2 * f], dst=h[k, :, f:2 * f])
        back = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(src=h[k], dst=back)  # must see both stores above
        nisa.dma_copy(src=back, dst=out[k])
    return out


@nki.compiler.skip_middle_end_transformations
@nki.jit
def roundtrip_seq(x):
    f = x.shape[1] // 2
    out = nl.ndarray((BANDS, x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.hbm)
    h = nl.ndarray((BANDS, x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    for k in nl.sequential_range(BANDS):
        nisa.dma_copy(src=t[:, 0:f], dst=h[k, :, 0:f])
        nisa.dma_copy(src=t[:, f:2 * f], dst=h[k, :, f:2 * f])
        back = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(src=h[k], dst=back)  # must see both stores above
        nisa.dma_copy(src=back, dst=out[k])
    return out
