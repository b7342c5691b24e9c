"""Do VectorE and ScalarE slow each other down when they read one PSUM bank at the same time on Trn2?

NKI 0.1 kernels (Neuron SDK 2.21-2.26), written for benchmarks/trn2_psum_bank.py, which times them on hardware and
runs them on tilec's interpreter and model. ARCH3 (v2.32.0 trainium2_arch.rst l. 271-273): "Both VectorE and ScalarE
can access PSUM at full bandwidth in parallel, as long as their accesses do not collide on the same PSUM bank"; what
a collision costs is not documented (the model serialises it: tilec/target.py NC_V3_EXCLUSIONS).

Every kernel loads x (128, F) fp32 once, copies it into two PSUM tiles a and b (one bank each, F <= 512) on
VectorE, then runs REPS iterations of independent reads of PSUM (no data flows between the engines), and stores v
(VectorE's last copy) and s (ScalarE's last copy):

    none        no engine work in the loop (the fixed cost to subtract)
    vector      VectorE: v = tensor_copy(a)
    scalar      ScalarE: s = activation(copy, a)
    same        vector and scalar interleaved, both reading a (one bank)
    apart       vector reading a and scalar reading b (two banks: the control, full bandwidth per ARCH3)

Expected results (NumPy): v == x and s == x (none: v, s == x by a DMA of the loaded tile).
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

REPS = 64  # iterations; benchmarks/trn2_psum_bank.py --reps changes it before the kernels are traced
WORK = {"none": (False, None), "vector": (True, None), "scalar": (False, "a"), "same": (True, "a"),
        "apart": (True, "b")}


def _run(kind, x):
    vec, act = WORK[kind]
    xs = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=x, dst=xs)
    a = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
    b = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
    a[...] = nisa.tensor_copy(xs, engine=nisa.vector_engine)
    b[...] = nisa.tensor_copy(xs, engine=nisa.vector_engine)
    v = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    s = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    for _ in nl.sequential_range(REPS):
        if vec:
            v[...] = nisa.tensor_copy(a, engine=nisa.vector_engine)
        if act is not None:
            s[...] = nisa.activation(op=nl.copy, data=a if act == "a" else b)
    v_out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    s_out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(src=v if vec else xs, dst=v_out)
    nisa.dma_copy(src=s if act is not None else xs, dst=s_out)
    return v_out, s_out


@nki.compiler.skip_middle_end_transformations
@nki.jit
def none(x):
    return _run("none", x)


@nki.compiler.skip_middle_end_transformations
@nki.jit
def vector(x):
    return _run("vector", x)


@nki.compiler.skip_middle_end_transformations
@nki.jit
def scalar(x):
    return _run("scalar", x)


@nki.compiler.skip_middle_end_transformations
@nki.jit
def same(x):
    return _run("same", x)


@nki.compiler.skip_middle_end_transformations
@nki.jit
def apart(x):
    return _run("apart", x)
