"""benchmarks/kernels/shared_bus.py in NKI 0.6 (Neuron SDK 2.29+, `import nki`): the same kernels, the same
expected results, Python range loops and every instruction writing its dst (see that file's docstring)."""
import nki
import nki.isa as nisa
import nki.language as nl

REPS = 64  # iterations; benchmarks/trn2_shared_bus.py --reps changes it before the kernels are traced
VECTOR = {"none": None, "vector16": "copy16", "vectortt16": "add16", "vector32": "copy32", "gpsimd": None,
          "both16": "copy16", "bothtt16": "add16", "both32": "copy32"}


def _tile(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
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
        nisa.tensor_copy(dst=g, src=ys, engine=nisa.engine.gpsimd)
    v = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
    if vec is None:
        nisa.dma_copy(dst=v_out, src=src)
    for _ in range(REPS):
        if vec in ("copy16", "copy32"):
            nisa.tensor_copy(dst=v, src=src, engine=nisa.engine.vector)
        elif vec == "add16":
            nisa.tensor_tensor(dst=v, data1=src, data2=src, op=nl.add, engine=nisa.engine.vector)
        if gps:
            nisa.tensor_tensor(dst=g, data1=g, data2=ys, op=nl.add, engine=nisa.engine.gpsimd)
    if vec is not None:
        nisa.dma_copy(dst=v_out, src=v)
    nisa.dma_copy(dst=g_out, src=g if gps else ys)
    return v_out, g_out


@nki.jit
def none(x16, x32, y):
    return _run("none", x16, x32, y)


@nki.jit
def vector16(x16, x32, y):
    return _run("vector16", x16, x32, y)


@nki.jit
def vectortt16(x16, x32, y):
    return _run("vectortt16", x16, x32, y)


@nki.jit
def vector32(x16, x32, y):
    return _run("vector32", x16, x32, y)


@nki.jit
def gpsimd(x16, x32, y):
    return _run("gpsimd", x16, x32, y)


@nki.jit
def both16(x16, x32, y):
    return _run("both16", x16, x32, y)


@nki.jit
def bothtt16(x16, x32, y):
    return _run("bothtt16", x16, x32, y)


@nki.jit
def both32(x16, x32, y):
    return _run("both32", x16, x32, y)
