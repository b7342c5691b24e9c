"""The kernels of hbm_order.py for NKI 0.6 (Neuron SDK 2.29+, `import nki`): the same stores, outputs in shared_hbm,
Python `range` loops (NKI 0.6 unrolls them at specialization time; affine_range and sequential_range are deprecated
aliases of range, v2.32.0 nki/get-started/about/index.rst), no skip_middle_end_transformations (gone since 0.2).
benchmarks/trn2_hbm_order.py --nki06 runs them; hbm_order.py's docstring says what each one stores.
"""
import nki
import nki.isa as nisa
import nki.language as nl

BANDS = 16  # stores per kernel; benchmarks/trn2_hbm_order.py --bands changes it before the kernels are traced


def _tile(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return t


@nki.jit
def one(x):
    out = nl.ndarray((BANDS, x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    t = _tile(x)
    for k in range(BANDS):
        nisa.dma_copy(dst=out[k], src=t)
    return out


@nki.jit
def rows(x):
    f = x.shape[1] // 2
    out = nl.ndarray((BANDS, x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    t = _tile(x)
    for k in range(BANDS):
        nisa.dma_copy(dst=out[k, :, 0:f], src=t[:, 0:f])
        nisa.dma_copy(dst=out[k, :, f:2 * f], src=t[:, f:2 * f])
    return out


@nki.jit
def blocks(x):
    f = x.shape[1] // 2
    out = nl.ndarray((BANDS, 2, x.shape[0], f), dtype=x.dtype, buffer=nl.shared_hbm)
    t = _tile(x)
    for k in range(BANDS):
        nisa.dma_copy(dst=out[k, 0], src=t[:, 0:f])
        nisa.dma_copy(dst=out[k, 1], src=t[:, f:2 * f])
    return out


@nki.jit
def tensors(x):
    f = x.shape[1] // 2
    a = nl.ndarray((BANDS, x.shape[0], f), dtype=x.dtype, buffer=nl.shared_hbm)
    b = nl.ndarray((BANDS, x.shape[0], f), dtype=x.dtype, buffer=nl.shared_hbm)
    t = _tile(x)
    for k in range(BANDS):
        nisa.dma_copy(dst=a[k], src=t[:, 0:f])
        nisa.dma_copy(dst=b[k], src=t[:, f:2 * f])
    return a, b


@nki.jit
def overwrite(x):
    f = x.shape[1] // 2
    out = nl.ndarray((BANDS, x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    t = _tile(x)
    for k in range(BANDS):
        nisa.dma_copy(dst=out[k, :, 0:f], src=t[:, f:2 * f])  # overwritten by the next line
        nisa.dma_copy(dst=out[k], src=t)
    return out


@nki.jit
def roundtrip(x):
    f = x.shape[1] // 2
    out = nl.ndarray((BANDS, x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    h = nl.ndarray((BANDS, x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    for k in range(BANDS):
        nisa.dma_copy(dst=h[k, :, 0:f], src=t[:, 0:f])
        nisa.dma_copy(dst=h[k, :, f:2 * f], src=t[:, f:2 * f])
        back = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=back, src=h[k])  # must see both stores above
        nisa.dma_copy(dst=out[k], src=back)
    return out
