"""Does an fp32 matmul whose stationary is marked ones/zeros (is_stationary_onezero=True) run faster on Trn2?

NKI 0.1 kernels (Neuron SDK 2.21-2.26), written for benchmarks/trn2_onezero.py, which times them on hardware and runs
them on tilec's interpreter and model. The nc_matmul docstrings (ISA1 v2.26.1 and ISA6 v2.32.0) say the hint "could
lead to 2x better performance" for fp32; the model charges an fp32 matmul so marked half the fp32 factor
(tilec/perf/params.py onezero_fp32_speedup = 2, the documented best case, not measured; docs/notes/cols20.md).

Every kernel loads x (128, F) fp32 once, makes a ones column (128, 1) and a copy of x in the kernel's dtype, sums
x's columns into one PSUM row with a matmul (stationary the ones, moving x), then repeats that matmul REPS times
(each overwrites the row: no data flows between them) and stores the row:

    none            no matmul in the loop (the fixed cost to subtract)
    fp32            fp32 ones and x, no hint
    fp32_onezero    the same with is_stationary_onezero=True
    bf16            bf16 ones and x (the 1-pass rate, the control)
    bf16_onezero    bf16 with the hint (no speed-up documented: a second control)

Expected result (NumPy): the column sums of x in the kernel's dtype, x.astype(dtype).astype(float32).sum(axis=0).
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

REPS = 64  # matmuls in the loop; benchmarks/trn2_onezero.py --reps changes it before the kernels are traced
KINDS = {"none": (nl.float32, False, False), "fp32": (nl.float32, False, True),
         "fp32_onezero": (nl.float32, True, True), "bf16": (nl.bfloat16, False, True),
         "bf16_onezero": (nl.bfloat16, True, True)}


def _run(kind, x):
    dtype, onezero, loop = KINDS[kind]
    xs = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=x, dst=xs)
    xd = nl.ndarray(x.shape, dtype=dtype, buffer=nl.sbuf)
    xd[...] = nisa.tensor_copy(xs, dtype=dtype)
    ones = nl.ndarray((x.shape[0], 1), dtype=dtype, buffer=nl.sbuf)
    ones[...] = nisa.memset((x.shape[0], 1), 1.0, dtype=dtype)
    acc = nl.ndarray((1, x.shape[1]), dtype=nl.float32, buffer=nl.psum)
    acc[...] = nisa.nc_matmul(ones, xd, is_stationary_onezero=onezero)
    if loop:
        for _ in nl.sequential_range(REPS):
            acc[...] = nisa.nc_matmul(ones, xd, is_stationary_onezero=onezero)
    row = nl.ndarray((1, x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    row[...] = nisa.tensor_copy(acc)
    out = nl.ndarray((1, x.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(src=row, dst=out)
    return out


@nki.jit
def none(x):
    return _run("none", x)


@nki.jit
def fp32(x):
    return _run("fp32", x)


@nki.jit
def fp32_onezero(x):
    return _run("fp32_onezero", x)


@nki.jit
def bf16(x):
    return _run("bf16", x)


@nki.jit
def bf16_onezero(x):
    return _run("bf16_onezero", x)
