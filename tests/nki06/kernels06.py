"""Hand-written NKI 0.6 kernels of the tutorial kind, written for tilec's tests from the documented 0.6 semantics
(aws-neuron-sdk v2.32.0 nki/api/nki/isa and nki/api/nki/language docstrings). They import `nki` exactly as a kernel for
Neuron SDK 2.32 does; tilec serves that import from its interpreter."""
import nki
import nki.isa as nisa
import nki.language as nl

TK = nl.tile_size.pmax  # 128 contraction rows per matmul
TM = nl.tile_size.gemm_stationary_fmax  # 128 stationary columns
TN = nl.tile_size.gemm_moving_fmax  # 512 moving columns


@nki.jit
def matmul_accumulate(lhsT, rhs):
    """result = lhsT.T @ rhs, one PSUM accumulation chain per output tile, the first matmul overwriting."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in range(M // TM):
        for n in range(N // TN):
            acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k in range(K // TK):
                a = nl.ndarray((TK, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
                b = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
                nisa.dma_copy(dst=b, src=rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b, accumulate=(k > 0))
            out = nl.ndarray((TM, TN), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=out, src=acc)
            nisa.dma_copy(dst=result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], src=out)
    return result


@nki.jit
def matmul_hoisted(lhsT, rhs):
    """The same product with the stationary tiles loaded once per row block and kept in a list, the deprecated
    nl.affine_range loops, and nc_matmul inferring accumulate= (first write overwrites)."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        stationary = []
        for k in nl.affine_range(K // TK):
            a = nl.ndarray((TK, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=a, src=lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
            stationary.append(a)
        for n in nl.affine_range(N // TN):
            acc = nl.ndarray((TM, TN), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                b = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=b, src=rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                nisa.nc_matmul(acc, stationary[k], b)
            out = nl.ndarray((TM, TN), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=out, src=acc)
            nisa.dma_copy(dst=result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], src=out)
    return result


def _conv_rows(x, w, k0, y0, rows, R, Wo):
    """PSUM tile (K, rows, Wo) of the valid convolution of x (C, H, W) with w (C, K, R, R) at output rows
    y0..y0+rows: R*R matmuls whose moving operand is a 3-D window (C, rows, Wo) of the input."""
    K = w.shape[1]
    acc = nl.ndarray((K, rows, Wo), dtype=nl.float32, buffer=nl.psum)
    for r in range(R):
        for s in range(R):
            nisa.nc_matmul(dst=acc, stationary=w[:, :, r, s], moving=x[:, y0 + r:y0 + r + rows, s:s + Wo],
                           accumulate=(r > 0 or s > 0))
    return acc


@nki.jit
def conv2d(X, Wt):
    """Y[k, y, x] = sum_{c, r, s} X[c, y + r, x + s] * Wt[c, k, r, s] (C = K = 128), row groups of ROWS rows."""
    C, H, W = X.shape
    _, K, R, _ = Wt.shape
    Ho, Wo = H - R + 1, W - R + 1
    ROWS = 2
    Y = nl.ndarray((K, Ho, Wo), dtype=X.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray((C, H, W), dtype=X.dtype, buffer=nl.sbuf)
    w = nl.ndarray((C, K, R, R), dtype=Wt.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=X)
    nisa.dma_copy(dst=w, src=Wt)
    for g in range(Ho // ROWS):
        acc = _conv_rows(x, w, 0, g * ROWS, ROWS, R, Wo)
        out = nl.ndarray((K, ROWS, Wo), dtype=Y.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=acc)
        nisa.dma_copy(dst=Y[:, g * ROWS:(g + 1) * ROWS, :], src=out)
    return Y


@nki.jit
def conv_bias_relu_pool(X, Wt, b):
    """Y = maxpool2x2(relu(conv(X, Wt) + b)): the bias and relu fused into the PSUM eviction (one activation), the
    2x2 max pool as two tensor_tensor maxima over strided views."""
    C, H, W = X.shape
    _, K, R, _ = Wt.shape
    Ho, Wo = H - R + 1, W - R + 1
    Y = nl.ndarray((K, Ho // 2, Wo // 2), dtype=X.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray((C, H, W), dtype=X.dtype, buffer=nl.sbuf)
    w = nl.ndarray((C, K, R, R), dtype=Wt.dtype, buffer=nl.sbuf)
    bias = nl.ndarray((K, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=X)
    nisa.dma_copy(dst=w, src=Wt)
    nisa.dma_copy(dst=bias, src=b.reshape((K, 1)))
    for g in range(Ho // 2):
        acc = _conv_rows(x, w, 0, 2 * g, 2, R, Wo)
        act = nl.ndarray((K, 2, Wo), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=act, op=nl.relu, data=acc, bias=bias)
        rows = nl.ndarray((K, Wo), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=rows, data1=act[:, 0, :], data2=act[:, 1, :], op=nl.maximum)
        pooled = nl.ndarray((K, Wo // 2), dtype=Y.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=pooled, data1=rows[:, 0:Wo - 1:2], data2=rows[:, 1:Wo:2], op=nl.maximum)
        nisa.dma_copy(dst=Y[:, g, :], src=pooled)
    return Y


@nki.jit
def block_sums(A):
    """S[p] = sum over A[p, :, :]: tensor_reduce over the trailing free axes (1, 2) of a 3-D tile."""
    P, F1, F2 = A.shape
    S = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.ndarray((P, F1, F2), dtype=A.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=A)
    s = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=s, op=nl.add, data=a, axis=(1, 2))
    nisa.dma_copy(dst=S, src=s)
    return S
