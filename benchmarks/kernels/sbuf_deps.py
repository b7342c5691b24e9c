"""Does an engine writing one part of an SBUF tile wait for another engine writing a disjoint part of it on Trn2?

NKI 0.1 kernels (Neuron SDK 2.21-2.26), written for benchmarks/trn2_sbuf_deps.py, which times them on hardware and
runs them on tilec's interpreter and model. The docs say only that "the Neuron Compiler will insert the required
synchronizations during compilation, based on data dependencies identified in the NKI kernel" (v2.26.1
nki/arch/trainium_inferentia2_arch.rst, NeuronCore-v2 overview; the same text in v2.32.0 guides/architecture), not
whether a dependency is found per tile, per byte range or per element.

Every kernel loads x (128, 2F) fp32 and c (128, 2) fp32 (the loads are the same whatever the kind), then runs REPS
iterations in which ScalarE adds c[:, 0] to region A in place (activation copy with a bias) and VectorE adds
c[:, 1] to region B in place (tensor_scalar): no data flows between the two engines, only the regions may share a
tile. The kinds differ in where A and B are (T is x's (128, 2F) tile):

    none         no engine work (the loads, the store and the start-up: the fixed cost to subtract)
    scalar_i     ScalarE's work alone on A = T[:, 0::2]      vector_i   VectorE's alone on B = T[:, 1::2]
    scalar_h     ScalarE's work alone on A = T[:, 0:F]       vector_h   VectorE's alone on B = T[:, F:2F]
    interleaved  both: A = T[:, 0::2], B = T[:, 1::2] (interleaved strided columns of one tile: move10's case)
    halves       both: A = T[:, 0:F], B = T[:, F:2F] (disjoint byte ranges of one tile)
    tiles        both: A = a tile T1 <- x[:, 0:F], B = another tile T2 <- x[:, F:2F] (the control: nothing shared;
                 its two loads and two stores cost a little more than the others' one)
    same         both on A = B = T[:, 0:F] (a true dependence: the two engines' adds must alternate)

The output is T (tiles: [T1 | T2]). Expected (NumPy): A = x[A] + REPS * c[:, 0], B = x[B] + REPS * c[:, 1], the rest
as loaded; for `same`, x[:, 0:F] + REPS * (c[:, 0] + c[:, 1]) and x[:, F:2F]. Inputs are small integers: every sum
is exact.
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

REPS = 64  # iterations; benchmarks/trn2_sbuf_deps.py --reps changes it before the kernels are traced


SCALAR = ("scalar_i", "scalar_h", "interleaved", "halves", "tiles", "same")
VECTOR = ("vector_i", "vector_h", "interleaved", "halves", "tiles", "same")


def _run(kind, x, c):
    p, f2 = x.shape
    f = f2 // 2
    out = nl.ndarray((p, f2), dtype=x.dtype, buffer=nl.shared_hbm)
    c_t = nl.ndarray((p, 2), dtype=c.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=c, dst=c_t)
    if kind == "tiles":
        t1 = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
        t2 = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(src=x[:, 0:f], dst=t1)
        nisa.dma_copy(src=x[:, f:f2], dst=t2)
        a, b = t1, t2
    else:
        t = nl.ndarray((p, f2), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(src=x, dst=t)
        if kind in ("scalar_i", "vector_i", "interleaved"):
            a, b = t[:, 0:f2:2], t[:, 1:f2:2]
        else:
            a, b = t[:, 0:f], t[:, f:f2]
        if kind == "same":
            b = a
    for _ in nl.sequential_range(REPS):
        if kind in SCALAR:
            a[...] = nisa.activation(op=nl.copy, data=a, bias=c_t[:, 0:1], scale=1.0)
        if kind in VECTOR:
            b[...] = nisa.tensor_scalar(b, op0=nl.add, operand0=c_t[:, 1:2], engine=nisa.vector_engine)
    if kind == "tiles":
        nisa.dma_copy(src=t1, dst=out[:, 0:f])
        nisa.dma_copy(src=t2, dst=out[:, f:f2])
    else:
        nisa.dma_copy(src=t, dst=out)
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
