"""Does VectorE's 16-bit performance mode slow GpSimdE down on Trn2 (or the other way round)?

NKI 0.1 kernels (Neuron SDK 2.21-2.26), written for benchmarks/trn2_shared_bus.py, which times them on hardware and
runs them on tilec's interpreter and model. ARCH3 (v2.32.0 trainium2_arch.rst, Data Movement Updates 1b): "VectorE's
performance mode leverages a shared memory bus between the VectorE and GpsimdE engines ... including arbitrating
between GpsimdE and relevant VectorE instructions"; what the arbitration costs is not documented.

Every kernel loads x16 (128, FV) bf16, x32 (128, FV) fp32 and y (128, FG) fp32 once, runs REPS iterations of
independent work on VectorE and/or GpSimdE (no data flows between the two engines), and stores v (VectorE's last
result) and g (GpSimdE's running sum):

    none        no engine work: v <- x16 and g <- y by DMA only (the fixed cost to subtract)
    vector16    VectorE: v = tensor_copy(x16) bf16 -> bf16, SBUF -> SBUF (performance mode, 4x)
    vectortt16  VectorE: v = tensor_tensor(x16, x16, add) bf16 from SBUF (performance mode, 2x)
    vector32    VectorE: v = tensor_copy(x32) fp32 (no performance mode)
    gpsimd      GpSimdE: g = tensor_tensor(g, y, add) fp32
    both16      vector16 and gpsimd interleaved in one loop
    bothtt16    vectortt16 and gpsimd interleaved
    both32      vector32 and gpsimd interleaved (the control: NC-v3 lets VectorE and GpSimdE use SBUF in parallel)

Expected results (NumPy): v == x16 (vector16, both16, none), x16 + x16 rounded to bf16 (vectortt16, bothtt16),
x32 (vector32, both32); g == (REPS + 1) * y with GpSimdE work, y without.
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

REPS = 64  # iterations; benchmarks/trn2_shared_bus.py --reps changes it before the kernels are traced
VECTOR = {"none": None, "vector16": "copy16", "vectortt16": "add16", "vector32": "copy32", "gpsimd": None,
          "both16": "copy16", "bothtt16": "add16", "both32": "copy32"}


def _tile(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=x, dst=t)
    return t


def _run(kind, x16, x32, y):
    vec = VECTOR[kind]
    gps = kind == "gpsimd" or kind.startswith("both")
    src = _tile(x32 if vec == "copy32" else x16)
    v_out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
    g_out = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.shared_hbm)
    ys = _tile(y)
    g = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.sbuf)
    if gps:
        g[...] = nisa.tensor_copy(ys, engine=nisa.gpsimd_engine)
    v = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
    if vec is None:
        nisa.dma_copy(src=src, dst=v_out)
    for _ in nl.sequential_range(REPS):
        if vec in ("copy16", "copy32"):
            v[...] = nisa.tensor_copy(src, engine=nisa.vector_engine)
        elif vec == "add16":
            v[...] = nisa.tensor_tensor(src, src, op=nl.add, engine=nisa.vector_engine)
        if gps:
            g[...] = nisa.tensor_tensor(g, ys, op=nl.add, engine=nisa.gpsimd_engine)
    if vec is not None:
        nisa.dma_copy(src=v, dst=v_out)
    nisa.dma_copy(src=g if gps else ys, dst=g_out)
    return v_out, g_out


@nki.compiler.skip_middle_end_transformations
@nki.jit
def none(x16, x32, y):
    return _run("none", x16, x32, y)


@nki.compiler.skip_middle_end_transformations
@nki.jit
def vector16(x16, x32, y):
    return _run("vector16", x16, x32, y)


@nki.compiler.skip_middle_end_transformations
@nki.jit
def vectortt16(x16, x32, y):
    return _run("vectortt16", x16, x32, y)


@nki.compiler.skip_middle_end_transformations
@nki.jit
def vector32(x16, x32, y):
    return _run("vector32", x16, x32, y)


@nki.compiler.skip_middle_end_transformations
@nki.jit
def gpsimd(x16, x32, y):
    return _run("gpsimd", x16, x32, y)


@nki.compiler.skip_middle_end_transformations
@nki.jit
def both16(x16, x32, y):
    return _run("both16", x16, x32, y)


@nki.compiler.skip_middle_end_transformations
@nki.jit
def bothtt16(x16, x32, y):
    return _run("bothtt16", x16, x32, y)


@nki.compiler.skip_middle_end_transformations
@nki.jit
def both32(x16, x32, y):
    return _run("both32", x16, x32, y)
