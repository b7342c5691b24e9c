"""Small kernels exercising the NKI API surface, in the spellings people use (positional and keyword)."""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def scalar_forms(a, v):
    out = nl.ndarray((4, 128, 64), nl.float32, buffer=nl.shared_hbm)
    t = nl.load(a)
    col = nl.load(v)  # (128, 1)
    r0 = nisa.tensor_scalar(t, nl.subtract, 1.0, reverse0=True)  # 1 - t
    r1 = nisa.tensor_scalar(data=t, op0=nl.multiply, operand0=col, op1=nl.add, operand1=2.5)  # t*v + 2.5
    r2 = nisa.tensor_scalar(t, nl.subtract, col, reverse0=False, op1=nl.divide, operand1=4.0, reverse1=True)
    r3 = nisa.tensor_scalar(t, nl.multiply, col, op1=nl.add, operand1=0.5, engine=nisa.scalar_engine)
    for i, r in enumerate((r0, r1, r2, r3)):
        nl.store(out[i], r)
    return out


@nki.jit
def reduce_and_activation(a, bias):
    out_max = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
    out_sum = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
    out_act = nl.ndarray((128, 4, 16), nl.float32, buffer=nl.shared_hbm)
    out_acc = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
    t = nl.load(a.reshape((128, 4, 16)))
    b = nl.load(bias)
    m = nisa.tensor_reduce(nl.max, t, axis=(1, 2), keepdims=True)
    nl.store(out_max, m.reshape((128, 1)))
    s = nisa.tensor_reduce(op=nl.add, data=t, axis=2, negate=True)
    nl.store(out_sum, s)
    acc = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
    e = nisa.activation(op=nl.exp, data=t, bias=b, scale=0.5, reduce_op=nl.add, reduce_res=acc)
    nl.store(out_act, e)
    nl.store(out_acc, acc)
    return out_max, out_sum, out_act, out_acc


@nki.jit
def causal_mask():
    out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(128)[None, :]
    pos = nisa.iota(i_p * 1000 + i_f, dtype=nl.float32)
    masked = nisa.affine_select(i_f <= i_p, pos, -1.0)
    nl.store(out, masked)
    return out


@nki.jit
def transposes(a, small):
    out1 = nl.ndarray((64, 128), a.dtype, buffer=nl.shared_hbm)
    out2 = nl.ndarray((32, 32), small.dtype, buffer=nl.shared_hbm)
    t = nisa.dma_transpose(a)  # (128, 64) HBM -> (64, 128) SBUF
    nl.store(out1, t)
    s = nl.load(small)
    st = nisa.nc_transpose(s, engine=nisa.vector_engine)
    nl.store(out2, st)
    return out1, out2


@nki.jit
def gather_with_mgrid(a):
    out = nl.ndarray((128, 32), a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:32]
    t = nl.load(a[i_p, 2 * i_f + 1])  # odd columns
    nl.store(out[i_p, i_f], t)
    return out


@nki.jit
def matmul_3d_moving(w, x):
    out = nl.ndarray((128, 2, 100), nl.float32, buffer=nl.shared_hbm)
    w_sb = nl.load(w)
    x_sb = nl.ndarray((128, 2, 100), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=x)
    acc = nl.zeros((128, 2, 100), nl.float32, buffer=nl.psum)
    acc += nisa.nc_matmul(w_sb, x_sb)
    acc += nisa.nc_matmul(w_sb[...], x_sb[:, :, :])
    res = nl.copy(acc)
    nisa.dma_copy(dst=out, src=res)
    return out


@nki.jit
def casts(a):
    out_bf = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.shared_hbm)
    out_f8 = nl.ndarray(a.shape, nl.float8_e4m3, buffer=nl.shared_hbm)
    out_dma = nl.ndarray(a.shape, nl.float16, buffer=nl.shared_hbm)
    t = nl.load(a)
    nl.store(out_bf, nisa.tensor_copy(t, dtype=nl.bfloat16))
    nl.store(out_f8, nisa.tensor_copy(t, dtype=nl.float8_e4m3))
    h = nl.ndarray(a.shape, nl.float16, buffer=nl.sbuf)
    nisa.dma_copy(dst=h, src=a)  # casts through fp32
    nisa.dma_copy(dst=out_dma, src=h)
    return out_bf, out_f8, out_dma


@nki.jit
def language_ops(a, row):
    out = nl.ndarray((3, 128, 64), nl.float32, buffer=nl.shared_hbm)
    t = nl.load(a)
    r = nl.load(row)  # (1, 64): broadcast along partitions
    s1 = t * 2.0 + 1.0
    s2 = nl.add(t, r)
    s3 = nl.exp(nl.subtract(t, nl.max(t, axis=1, keepdims=True)))
    out_view = out[...]
    for i, s in enumerate((s1, s2, s3)):
        nl.store(out_view[i, :, :], s)
    return out


@nki.jit
def six_d_tiles(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    u = nisa.tensor_copy(t[:, :, :, :, :, ::1])
    v = nisa.memset((128, 1), 3.0, nl.float32)
    w = nisa.tensor_scalar(u, nl.multiply, v)
    nisa.dma_copy(dst=out[..., 0:4], src=w)
    return out


@nki.jit
def spmd_rows(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    i = nl.program_id(0)
    t = nl.load(a[i * 128:(i + 1) * 128, :])
    nl.store(out[i * 128:(i + 1) * 128, :], nisa.tensor_scalar(t, nl.add, float(i)))
    return out


@nki.jit
def printing(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    nl.device_print("tile t:", t)
    nl.store(out, t)
    return out


@nki.jit
def masked_and_language_matmul(a, b):
    out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
    out_mm = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:64]
    t = nl.load(a)
    res = nl.zeros((128, 64), nl.float32, buffer=nl.sbuf)
    res[...] = nisa.tensor_scalar(t, nl.multiply, 2.0, mask=(i_f < 32))  # only the first 32 columns change
    nl.store(out, res)
    x = nl.load(a[:, 0:64])  # (128, 64): x @ y with x [M=128, K=64]
    y = nl.load(b)  # (64, 64)
    acc = nl.zeros((128, 64), nl.float32, buffer=nl.psum)
    acc[...] += nl.matmul(x[:, 0:64], y)
    nl.store(out_mm, acc)
    return out, out_mm


@nki.jit
def broadcast_and_transpose(col, sq):
    out = nl.ndarray((128, 16), nl.float32, buffer=nl.shared_hbm)
    out_t = nl.ndarray((64, 128), nl.float32, buffer=nl.shared_hbm)
    c = nl.load(col)  # (128, 1)
    nl.store(out, nisa.tensor_copy(c.broadcast_to((128, 16))))
    s = nl.load(sq)  # (128, 64)
    t = nl.transpose(s)
    nl.store(out_t, nl.copy(t))
    return out, out_t


@nki.jit
def masked_tail_rows(a):
    """Rows in tiles of 128 with a masked tail (the nki-samples idiom for sizes that are not multiples of 128)."""
    n, d = a.shape
    out = nl.ndarray((n, d), a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:d]
    for t in nl.affine_range((n + 127) // 128):
        x = nl.load(a[t * 128 + i_p, i_f], mask=(t * 128 + i_p < n))
        y = nisa.activation(nl.square, x, mask=(t * 128 + i_p < n))
        nl.store(out[t * 128 + i_p, i_f], value=y, mask=(t * 128 + i_p < n))
    return out


@nki.jit
def unmasked_tail_rows(a):
    n, d = a.shape
    out = nl.ndarray((n, d), a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:d]
    for t in nl.affine_range((n + 127) // 128):
        x = nl.load(a[t * 128 + i_p, i_f])  # <- TAIL_NO_MASK
        nl.store(out[t * 128 + i_p, i_f], value=x)
    return out


@nki.jit
def rmsnorm_rows(a, gamma):
    """RMSNorm over the free dim with language-level ops, rows in tiles of 128 (nki-samples style)."""
    n, d = a.shape
    out = nl.ndarray((n, d), a.dtype, buffer=nl.shared_hbm)
    g = nl.load(gamma.reshape((1, d)))
    for t in nl.affine_range(n // 128):
        x = nl.load(a[t * 128:(t + 1) * 128, :])
        ms = nl.mean(nl.square(x), axis=1, keepdims=True)
        r = nl.rsqrt(nl.add(ms, 1e-6))
        y = nl.multiply(nl.multiply(x, r), g)
        nl.store(out[t * 128:(t + 1) * 128, :], value=y)
    return out


@nki.jit
def softmax_rows(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    x = nl.load(a)
    e = nl.exp(nl.subtract(x, nl.max(x, axis=[1], keepdims=True)))
    s = nl.sum(e, axis=1, keepdims=True)
    nl.store(out, nl.divide(e, s))
    return out


@nki.jit
def gather_scatter_rows(table, idx):
    """out[p] = table[idx[p]] (gather); then table2[idx[p]] = out[p] * 2 (scatter)."""
    out = nl.ndarray((128, table.shape[1]), table.dtype, buffer=nl.shared_hbm)
    table2 = nl.ndarray(table.shape, table.dtype, buffer=nl.shared_hbm)
    ids = nl.load(idx)  # (128, 1) int32 in SBUF
    rows = nl.load(table[ids, :])
    nisa.dma_copy(dst=out, src=rows)
    doubled = nisa.tensor_scalar(rows, nl.multiply, 2.0)
    nl.store(table2[ids, :], value=doubled)
    return out, table2


@nki.jit
def gather_out_of_bounds(table, idx, skip):
    out = nl.zeros((128, table.shape[1]), table.dtype, buffer=nl.sbuf)
    ids = nl.load(idx)
    mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
    nisa.dma_copy(dst=out, src=table[ids, :], oob_mode=mode)  # <- GATHER_OOB
    res = nl.ndarray(out.shape, out.dtype, buffer=nl.shared_hbm)
    nl.store(res, out)
    return res


@nki.jit
def matmul_ragged_k(a, b):
    """a.T @ b for a contraction K that is not a multiple of 128: the last K tile masks its partitions, on the
    loads and on the matmul operands (NKI's operand masking)."""
    K, M = a.shape
    _, N = b.shape
    out = nl.ndarray((M, N), nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((M, N), nl.float32, buffer=nl.psum)
    i_p = nl.arange(128)[:, None]
    i_m = nl.arange(M)[None, :]
    i_n = nl.arange(N)[None, :]
    for k in nl.affine_range((K + 127) // 128):
        at = nl.load(a[k * 128 + i_p, i_m], mask=(k * 128 + i_p < K))
        bt = nl.load(b[k * 128 + i_p, i_n], mask=(k * 128 + i_p < K))
        acc += nisa.nc_matmul(at[i_p, i_m], bt[i_p, i_n], mask=(k * 128 + i_p < K))
    nl.store(out, nl.copy(acc))
    return out


@nki.jit
def load_transposed(a):
    """nl.load_transpose2d: HBM [64, 128] -> SBUF [128, 64]."""
    out = nl.ndarray((a.shape[1], a.shape[0]), a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load_transpose2d(a))
    return out


@nki.jit
def tensor_add_masked(a_input, b_input):
    """The NKI tutorial's tensor add for shapes that are not multiples of the tile: every call carries the mask,
    including the language-level compute (nl.add, nl.multiply)."""
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    M, N = a_input.shape
    TILE_M, TILE_N = 128, 512
    for m in nl.affine_range((M + TILE_M - 1) // TILE_M):
        for n in nl.affine_range((N + TILE_N - 1) // TILE_N):
            i_p = m * TILE_M + nl.arange(TILE_M)[:, None]
            i_f = n * TILE_N + nl.arange(TILE_N)[None, :]
            a_tile = nl.load(a_input[i_p, i_f], mask=(i_p < M) & (i_f < N))
            b_tile = nl.load(b_input[i_p, i_f], mask=(i_p < M) & (i_f < N))
            c_tile = nl.add(a_tile, b_tile, mask=(i_p < M) & (i_f < N))
            c_tile = nl.multiply(c_tile, 2.0, mask=(i_p < M) & (i_f < N))
            nl.store(c_output[i_p, i_f], value=c_tile, mask=(i_p < M) & (i_f < N))
    return c_output


@nki.jit
def where_masked(a):
    """nl.where on a tile whose columns past N were never loaded: the mask keeps them out of every read."""
    M, N = a.shape
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.arange(128)[:, None], nl.arange(512)[None, :]
    t = nl.load(a[i_p, i_f], mask=(i_f < N))
    r = nl.where(nl.greater(t, 0.5, mask=(i_f < N)), t, 0.0, mask=(i_f < N))
    nl.store(out[i_p, i_f], value=r, mask=(i_f < N))
    return out
