"""Two DMA costs the documents do not give (docs/notes/model14.md), as NKI 0.1 kernels (Neuron SDK 2.21-2.26) for
benchmarks/trn2_dma_sbuf.py, which times them on a Trn2 and runs them on tilec's interpreter and model.

1. Does an SBUF -> SBUF DMA cost the DMA engines its bytes once (as the model charges it, like a load), or twice
   (a read and a write, both on the SBUF side)? Each kernel fills u (128, REPS * TOTAL) with REPS copies of x
   (128, TOTAL) fp32 by REPS independent DMAs (each its own columns of u), then stores u whole:

       loads    REPS loads x -> u[:, k]                             HBM -> SBUF, REPS x B bytes
       copies   one load x -> t, then REPS DMAs t -> u[:, k]        SBUF -> SBUF, REPS x B bytes (after one load)

   The store of u is the same in both (it keeps every copy live for the compiler).

2. What does issuing a DMA cost its trigger engine: about 600 ns per hardware-DGE DMA instruction on NeuronCore-v3
   (v2.32.0 nki/guides/architecture/trainium2_arch.rst, DGE section; nki/deep-dives/nki-dge.rst), serially, or is it
   hidden? Each kernel copies x by TOTAL // SMALL independent small DMAs of (128, SMALL) (each its own columns of t),
   then stores t:

       small_hwdge    dge_mode=hwdge (descriptors made by the DGE block at run time)
       small_static   dge_mode=none (descriptors prebuilt in HBM: no per-instruction generation)

Expected (NumPy): loads, copies -> np.tile(x, REPS); small_hwdge, small_static -> x.
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

TOTAL = 1024  # fp32 elements per partition of x (4 KiB: DMAINTRO's saturation point); --total changes it
REPS = 8  # copies of x in u; --reps
SMALL = 8  # fp32 elements per partition of each small DMA; --small


def _fill(x, on_chip):
    p, total = x.shape
    out = nl.ndarray((p, REPS * total), dtype=x.dtype, buffer=nl.shared_hbm)
    u = nl.ndarray((p, REPS * total), dtype=x.dtype, buffer=nl.sbuf)
    src = x
    if on_chip:
        src = nl.ndarray((p, total), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(src=x, dst=src)
    for k in nl.affine_range(REPS):
        nisa.dma_copy(src=src, dst=u[:, k * total:(k + 1) * total])
    nisa.dma_copy(src=u, dst=out)
    return out


@nki.jit
def loads(x):
    return _fill(x, False)


@nki.jit
def copies(x):
    return _fill(x, True)


def _small(x, mode):
    p, total = x.shape
    out = nl.ndarray((p, total), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((p, total), dtype=x.dtype, buffer=nl.sbuf)
    for j in nl.affine_range(total // SMALL):
        nisa.dma_copy(src=x[:, j * SMALL:(j + 1) * SMALL], dst=t[:, j * SMALL:(j + 1) * SMALL], dge_mode=mode)
    nisa.dma_copy(src=t, dst=out)
    return out


@nki.jit
def small_hwdge(x):
    return _small(x, nisa.dge_mode.hwdge)


@nki.jit
def small_static(x):
    return _small(x, nisa.dge_mode.none)
