"""Probe (pool22, model only): what loading a pool's input costs with its rows H on partitions, the layout a banded
TensorE sum along H needs (the contraction runs over partitions), against the channel-on-partition load the pool
kernels use. With H on partitions each partition reads one run of W elements per channel (W * 4 bytes for f32), so
the transfer is descriptor-bound when W is small. Run (subtract the model's 13 us start-up):

    tilec profile benchmarks/kernels/pool_h_layout.py --kernel chan_layout --shape 1x192x28x28
    tilec profile benchmarks/kernels/pool_h_layout.py --kernel h_layout --shape 1x192x28x28

Both kernels only load X (and write one element so the kernel has an output); docs/notes/pool22.md has the numbers."""
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def chan_layout(X):
    # X (1, C, H, W): channels (x row blocks) on partitions, one contiguous run of H*W per partition (as today)
    n, c, h, w = X.shape
    Y = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    X_v = X.reshape((c, h * w))
    if c >= 128:
        for b in range(c // 128):
            t = nl.ndarray((128, h * w), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=X_v[b * 128:(b + 1) * 128])
    else:
        g = 128 // c
        t = nl.ndarray((128, h // g * w), dtype=nl.float32, buffer=nl.sbuf)
        for b in range(g):
            nisa.dma_copy(dst=t[b * c:(b + 1) * c], src=X_v[:, b * (h // g) * w:(b + 1) * (h // g) * w])
    o = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=o, value=0.0)
    nisa.dma_copy(dst=Y, src=o)
    return Y


@nki.jit
def h_layout(X):
    # X (1, C, H, W): partition = (channel group, row h), each partition reads C/G runs of W elements
    n, c, h, w = X.shape
    Y = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    g = max(1, 128 // h)
    per = c // g
    t = nl.ndarray((g * h, per, w), dtype=nl.float32, buffer=nl.sbuf)
    for k in range(g):
        nisa.dma_copy(dst=t[k * h:(k + 1) * h], src=X.ap(pattern=[[w, h], [h * w, per], [1, w]],
                                                        offset=k * per * h * w))
    o = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=o, value=0.0)
    nisa.dma_copy(dst=Y, src=o)
    return Y
