"""How fast is an fp32 DMA transpose, SBUF -> SBUF and HBM -> SBUF, against a DMA copy of the same bytes, on Trn2?

NKI 0.1 kernels (Neuron SDK 2.21-2.26), written for benchmarks/trn2_dma_transpose.py, which times them on hardware
and runs them on tilec's interpreter and model. ARCH3 (v2.32.0 trainium2_arch.rst, DMA transposes of 2- and 4-byte
elements) gives "up to" 90 % of a copy's throughput from HBM and 50 % SBUF -> SBUF; the model charges exactly those
(tilec/perf/params.py dma_transpose_factor, dma_transpose_sbuf_factor). The fp32 SBUF -> SBUF case is the one
xpose20's rows_dma (an NHWC 1x1 conv's fp32 stationary) rests on.

Every kernel loads x (128, 128) fp32 into SBUF, writes y (128, 128) once with its operation, then repeats the
operation REPS times into y (the same values each time) and stores y:

    none              y = x by one SBUF -> SBUF copy, no loop (the fixed cost to subtract)
    copy_sbuf         dma_copy of x's SBUF tile into y
    transpose_sbuf    dma_transpose of x's SBUF tile into y
    copy_hbm          dma_copy of x from HBM into y
    transpose_hbm     dma_transpose of x from HBM into y

Expected results (NumPy): x for none and the copies, x.T for the transposes.
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

REPS = 32  # operations in the loop; benchmarks/trn2_dma_transpose.py --reps changes it before the kernels are traced
KINDS = {"none": (False, "sbuf", False), "copy_sbuf": (False, "sbuf", True), "transpose_sbuf": (True, "sbuf", True),
         "copy_hbm": (False, "hbm", True), "transpose_hbm": (True, "hbm", True)}


def _step(transpose, src, y):
    if transpose:
        y[...] = nisa.dma_transpose(src)
    else:
        nisa.dma_copy(src=src, dst=y)


def _run(kind, x):
    transpose, origin, loop = KINDS[kind]
    xs = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=x, dst=xs)
    src = xs if origin == "sbuf" else x
    y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    _step(transpose, src, y)
    if loop:
        for _ in nl.sequential_range(REPS):
            _step(transpose, src, y)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(src=y, dst=out)
    return out


@nki.jit
def none(x):
    return _run("none", x)


@nki.jit
def copy_sbuf(x):
    return _run("copy_sbuf", x)


@nki.jit
def transpose_sbuf(x):
    return _run("transpose_sbuf", x)


@nki.jit
def copy_hbm(x):
    return _run("copy_hbm", x)


@nki.jit
def transpose_hbm(x):
    return _run("transpose_hbm", x)
