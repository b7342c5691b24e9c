"""A fused conv2d + bias + maxpool in the style of the course's student kernels (ours, written for issue 15): the
weights are transposed once with nl.transpose into their own SBUF tile, one input-row buffer declared before the
loops is refilled by one small DMA per (row, in-channel tile, filter row) and read by that row's matmuls, the PSUM
accumulator is an nl.zeros per output row, each row is evacuated PSUM -> SBUF into a pooling tile, pooling reduces a
reshaped view over non-trailing axes, and the bias is a (128, 1) column added with tensor_tensor."""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.compiler.skip_middle_end_transformations
@nki.jit
def conv_pool(X, W, bias, pool_size=1):
    _, c_in, h_in, w_in = X.shape
    c_out, _, kh, kw = W.shape
    h_out, w_out = h_in - kh + 1, w_in - kw + 1
    P = nl.tile_size.pmax
    n_in = c_in // P
    out = nl.ndarray((1, c_out, h_out // pool_size, w_out // pool_size), dtype=X.dtype, buffer=nl.hbm)

    w_raw = nl.ndarray((P, P, n_in, kh, kw), dtype=W.dtype, buffer=nl.sbuf)
    w_t = nl.ndarray((n_in, kh, kw, nl.par_dim(P), P), dtype=W.dtype, buffer=nl.sbuf)  # block dimensions
    for t in nl.affine_range(n_in):
        nisa.dma_copy(src=W[:, t * P:(t + 1) * P, :, :], dst=w_raw[:, :, t, :, :])
        for i in nl.sequential_range(kh):
            for j in nl.sequential_range(kw):
                w_t[t, i, j] = nisa.tensor_copy(nl.transpose(w_raw[:, :, t, i, j]))
    bias_sb = nl.ndarray((P, 1), dtype=bias.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=bias, dst=bias_sb)

    x_row = nl.ndarray((P, w_in), dtype=X.dtype, buffer=nl.sbuf)  # one load buffer for every row
    pool_rows = nl.ndarray((P, pool_size, w_out), dtype=X.dtype, buffer=nl.sbuf)
    for ph in nl.sequential_range(h_out // pool_size):
        for p in nl.sequential_range(pool_size):
            acc = nl.zeros((P, w_out), dtype=nl.float32, buffer=nl.psum)
            for t in nl.sequential_range(n_in):
                for i in nl.sequential_range(kh):
                    nisa.dma_copy(src=X[0, t * P:(t + 1) * P, ph * pool_size + p + i, :], dst=x_row)
                    for j in nl.sequential_range(kw):
                        acc += nisa.nc_matmul(w_t[t, i, j], x_row[:, j:j + w_out])
            pool_rows[:, p, :] = nisa.tensor_copy(acc)
        view = pool_rows.reshape((P, pool_size, w_out // pool_size, pool_size))
        pooled = nisa.tensor_reduce(nl.max, view, axis=(1, 3))
        res = nisa.tensor_tensor(pooled, bias_sb, op=nl.add)
        nisa.dma_copy(src=res, dst=out[0, :, ph, :])
    return out
