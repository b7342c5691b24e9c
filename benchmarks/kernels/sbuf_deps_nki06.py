"""The NKI 0.6 twin of benchmarks/kernels/sbuf_deps.py (Neuron SDK 2.29+, `import nki`): the same kinds, the same
regions and results, Python range loops (NKI 0.6 unrolls them). Written for benchmarks/trn2_sbuf_deps.py --nki06; the
question and the expected results are in sbuf_deps.py's docstring.
"""
import nki
import nki.isa as nisa
import nki.language as nl

REPS = 64  # iterations; benchmarks/trn2_sbuf_deps.py --reps changes it before the kernels are traced
SCALAR = ("scalar_i", "scalar_h", "interleaved", "halves", "tiles", "same")
VECTOR = ("vector_i", "vector_h", "interleaved", "halves", "tiles", "same")


def _run(kind, x, c):
    p, f2 = x.shape
    f = f2 // 2
    out = nl.ndarray((p, f2), dtype=x.dtype, buffer=nl.shared_hbm)
    c_t = nl.ndarray((p, 2), dtype=c.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=c_t, src=c)
    if kind == "tiles":
        t1 = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
        t2 = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t1, src=x[:, 0:f])
        nisa.dma_copy(dst=t2, src=x[:, f:f2])
        a, b = t1, t2
    else:
        t = nl.ndarray((p, f2), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        if kind in ("scalar_i", "vector_i", "interleaved"):
            a, b = t[:, 0:f2:2], t[:, 1:f2:2]
        else:
            a, b = t[:, 0:f], t[:, f:f2]
        if kind == "same":
            b = a
    for _ in range(REPS):
        if kind in SCALAR:
            nisa.activation(dst=a, op=nl.copy, data=a, bias=c_t[:, 0:1], scale=1.0)
        if kind in VECTOR:
            nisa.tensor_scalar(dst=b, data=b, op0=nl.add, operand0=c_t[:, 1:2], engine=nisa.engine.vector)
    if kind == "tiles":
        nisa.dma_copy(dst=out[:, 0:f], src=t1)
        nisa.dma_copy(dst=out[:, f:f2], src=t2)
    else:
        nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def none(x, c):
    return _run("none", x, c)


@nki.jit
def scalar_i(x, c):
    return _run("scalar_i", x, c)


@nki.jit
def vector_i(x, c):
    return _run("vector_i", x, c)


@nki.jit
def scalar_h(x, c):
    return _run("scalar_h", x, c)


@nki.jit
def vector_h(x, c):
    return _run("vector_h", x, c)


@nki.jit
def interleaved(x, c):
    return _run("interleaved", x, c)


@nki.jit
def halves(x, c):
    return _run("halves", x, c)


@nki.jit
def tiles(x, c):
    return _run("tiles", x, c)


@nki.jit
def same(x, c):
    return _run("same", x, c)
