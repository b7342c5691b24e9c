"""Small NKI kernels for tests/perf/test_hbm_deps.py: DMAs touching one HBM tensor in disjoint or common elements.

x is a (128, 2F) tile; `h` and `out` are HBM tensors of the same shape. "Halves" are the interleaved row halves
out[:, 0:F] and out[:, F:2F]: their byte ranges overlap, their elements do not.
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


def _tile(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=x, dst=t)
    return t


@nki.jit
def halves(x):  # two stores into interleaved halves: disjoint elements
    f = x.shape[1] // 2
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    nisa.dma_copy(src=t[:, 0:f], dst=out[:, 0:f])
    nisa.dma_copy(src=t[:, f:2 * f], dst=out[:, f:2 * f])
    return out


@nki.jit
def blocks(x):  # the same two stores into two separate blocks: disjoint byte ranges
    f = x.shape[1] // 2
    out = nl.ndarray((2, x.shape[0], f), dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    nisa.dma_copy(src=t[:, 0:f], dst=out[0])
    nisa.dma_copy(src=t[:, f:2 * f], dst=out[1])
    return out


@nki.jit
def overwrite(x):  # a store into the first halves, then one over everything: common elements (write after write)
    f = x.shape[1] // 2
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    nisa.dma_copy(src=t[:, f:2 * f], dst=out[:, 0:f])
    nisa.dma_copy(src=t, dst=out)
    return out


@nki.jit
def read_one_half(x):  # two stores into the halves of h, then a load of the first half only (read after write)
    f = x.shape[1] // 2
    out = nl.ndarray((x.shape[0], f), dtype=x.dtype, buffer=nl.hbm)
    h = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    nisa.dma_copy(src=t[:, 0:f], dst=h[:, 0:f])
    nisa.dma_copy(src=t[:, f:2 * f], dst=h[:, f:2 * f])
    back = nl.ndarray((x.shape[0], f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=h[:, 0:f], dst=back)
    nisa.dma_copy(src=back, dst=out)
    return out


@nki.jit
def read_after_strided(x):  # a store of all of h, a store into its first halves, a load of its second halves
    f = x.shape[1] // 2
    out = nl.ndarray((x.shape[0], f), dtype=x.dtype, buffer=nl.hbm)
    h = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    nisa.dma_copy(src=t, dst=h)
    nisa.dma_copy(src=t[:, f:2 * f], dst=h[:, 0:f])
    back = nl.ndarray((x.shape[0], f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=h[:, f:2 * f], dst=back)  # written only by the first store
    nisa.dma_copy(src=back, dst=out)
    return out


@nki.jit
def bands_affine(x):  # an affine loop whose iterations store interleaved halves of one output (legal: disjoint)
    f = x.shape[1] // 2
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    for i in nl.affine_range(2):
        nisa.dma_copy(src=t[:, i * f:(i + 1) * f], dst=out[:, i * f:(i + 1) * f])
    return out


@nki.jit
def bands_affine_clash(x):  # an affine loop whose iterations both store the first halves (illegal: common elements)
    f = x.shape[1] // 2
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.hbm)
    t = _tile(x)
    for i in nl.affine_range(2):
        nisa.dma_copy(src=t[:, i * f:(i + 1) * f], dst=out[:, 0:f])
    return out
