"""Small kernels that each break one hardware or API rule (the line that breaks it carries a `# <- NAME` marker),
plus look-alikes that are legal and must pass (strided disjoint writes, PSUM accumulation in affine loops)."""

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def psum_tile_too_big(a):
    acc = nl.zeros((128, 1024), nl.float32, buffer=nl.psum)  # <- PSUM_BANK_SIZE
    return a


@nki.jit
def nine_psum_banks(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    tiles = []
    for i in range(9):
        tiles.append(nl.zeros((128, 512), nl.float32, buffer=nl.psum))  # <- PSUM_BANKS
    return out


@nki.jit
def eight_psum_banks_in_loop(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    for j in nl.affine_range(3):  # each iteration's 8 PSUM tiles die at its end
        tiles = [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
    t = nl.load(a)
    nl.store(out, t)
    return out


@nki.jit
def sbuf_overflow(a):
    big = nl.ndarray((128, 40000), nl.float32, buffer=nl.sbuf)
    more = nl.ndarray((128, 20000), nl.float32, buffer=nl.sbuf)  # <- SBUF_FULL
    return a


def _mm_operands(a):
    t = nl.ndarray((128, 512), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    return t


@nki.jit
def stationary_too_wide(a):
    t = _mm_operands(a)
    r = nisa.nc_matmul(t[:, 0:256], t[:, 0:128])  # <- STATIONARY
    return a


@nki.jit
def moving_too_wide(a, b):
    t = nl.ndarray((128, 1024), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=b)
    r = nisa.nc_matmul(t[:, 0:128], t[:, 0:1024])  # <- MOVING
    return a


@nki.jit
def matmul_fp32_with_fp16(a):
    t = _mm_operands(a)
    h = nisa.tensor_copy(t[:, 0:128], dtype=nl.float16)
    r = nisa.nc_matmul(t[:, 0:128], h)  # <- FP32_MIXED
    return a


@nki.jit
def matmul_both_fp16(a):
    out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
    t = _mm_operands(a)
    h = nisa.tensor_copy(t[:, 0:128], dtype=nl.float16)
    s = nisa.tensor_copy(t[:, 128:256], dtype=nl.float16)
    nisa.dma_copy(dst=out, src=nisa.tensor_copy(nisa.nc_matmul(s, h)))
    return out


@nki.jit
def contraction_mismatch(a):
    t = _mm_operands(a)
    r = nisa.nc_matmul(t[:, 0:128], t[0:64, 0:128])  # <- CONTRACTION
    return a


@nki.jit
def matmul_reads_psum(a):
    t = _mm_operands(a)
    p = nl.ndarray((128, 128), t.dtype, buffer=nl.psum)  # placed in PSUM by the kernel, not by the compiler
    p[...] = nisa.nc_transpose(t[:, 0:128])
    r = nisa.nc_matmul(t[:, 0:128], p)  # <- TENSORE_READS_PSUM
    return a


@nki.jit
def matmul_into_sbuf(a):
    t = _mm_operands(a)
    s = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
    s[...] = nisa.nc_matmul(t[:, 0:128], t[:, 0:128])  # <- TENSORE_WRITES_SBUF
    return a


@nki.jit
def dma_from_psum(a):
    out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
    t = _mm_operands(a)
    p = nisa.nc_matmul(t[:, 0:128], t[:, 0:128])
    nisa.dma_copy(dst=out, src=p)  # <- DMA_PSUM
    return out


@nki.jit
def two_psum_operands(a):
    t = _mm_operands(a)
    p = nisa.nc_matmul(t[:, 0:128], t[:, 0:128])
    q = nisa.nc_matmul(t[:, 0:128], t[:, 128:256])
    r = nisa.tensor_tensor(p, q, op=nl.add)  # <- TWO_PSUM
    return a


@nki.jit
def partition_mismatch(a):
    t = _mm_operands(a)
    r = nisa.tensor_tensor(t[:, 0:64], t[0:1, 0:64], op=nl.add)  # <- PARTITION_MISMATCH
    return a


@nki.jit
def vector_free_size(a):
    big = nl.zeros((128, 4, 17500), nl.float16, buffer=nl.sbuf)  # each dimension fits an access pattern
    r = nisa.tensor_copy(big)  # <- FREE_SIZE
    return a


@nki.jit
def slice_out_of_bounds(a):
    t = nl.ndarray((128, 1), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[128:256])  # <- OOB
    return a


@nki.jit
def read_unwritten(a):
    t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    u = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, 0:32], src=a[:, 0:32])
    r = nisa.tensor_tensor(t, u[:, 0:64], op=nl.add)  # <- UNWRITTEN
    return a


@nki.jit
def read_partly_written(a):
    out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, 0:32], src=a[:, 0:32])
    nisa.dma_copy(dst=out, src=t)  # <- PARTLY_WRITTEN
    return out


@nki.jit
def affine_read_after_write(a):
    out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((128, 64), nl.float32, buffer=nl.sbuf)
    x = nl.load(a)
    for i in nl.affine_range(4):
        acc[...] = nl.add(acc, x)  # <- RACE_RW
    nl.store(out, acc)
    return out


@nki.jit
def sequential_read_after_write(a):
    out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((128, 64), nl.float32, buffer=nl.sbuf)
    x = nl.load(a)
    for i in nl.sequential_range(4):
        acc[...] = nl.add(acc, x)
    nl.store(out, acc)
    return out


@nki.jit
def affine_same_output(a):
    out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
    for i in nl.affine_range(2):
        t = nl.load(a)
        nisa.dma_copy(dst=out[:, 0:64], src=t)  # <- RACE_WW
    return out


@nki.jit
def affine_strided_disjoint(a):
    out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
    for i in nl.affine_range(4):
        t = nl.load(a[:, i::4])
        nisa.dma_copy(dst=out[:, i::4], src=t)
    return out


@nki.jit
def affine_tail_overlap(a):
    out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
    for i in nl.affine_range(4):
        t = nl.load(a[:, i * 16:i * 16 + 20 if i < 3 else 64])
        nisa.dma_copy(dst=out[:, i * 16:i * 16 + t.shape[1]], src=t)  # <- RACE_TAIL
    return out


@nki.jit
def gpsimd_reads_psum(a):
    t = _mm_operands(a)
    p = nisa.nc_matmul(t[:, 0:128], t[:, 0:128])
    r = nisa.tensor_copy(p, engine=nisa.gpsimd_engine)  # <- GPSIMD_PSUM
    return a


@nki.jit
def partition_not_first(a):
    t = _mm_operands(a)
    r = nisa.tensor_copy(t[0])  # <- PARTITION_FIRST
    return a


@nki.jit
def hbm_with_init(a):
    out = nl.zeros((128, 64), nl.float32, buffer=nl.shared_hbm)  # <- HBM_INIT
    return out


@nki.jit
def shared_hbm_in_loop(a):
    for i in nl.affine_range(2):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)  # <- SHARED_HBM_LOOP
    return a


@nki.jit
def tile_out_of_scope(a):
    out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
    for i in nl.affine_range(2):
        t = nl.load(a)
    nisa.dma_copy(dst=out, src=t)  # <- OUT_OF_SCOPE
    return out


@nki.jit
def compute_on_hbm(a):
    r = nisa.tensor_scalar(a, nl.multiply, 2.0)  # <- HBM_OPERAND
    return a


@nki.jit
def tensor_truth(a):
    t = nl.load(a)
    if t:  # <- TRUTH
        pass
    return a


@nki.jit
def reduce_partition_axis(a):
    t = nl.load(a)
    r = nisa.tensor_reduce(nl.add, t, axis=0)  # <- REDUCE_AXIS
    return a


@nki.jit
def activation_scale_fp16(a):
    t = nl.load(a)
    s = nl.full((128, 1), 2.0, nl.float16, buffer=nl.sbuf)
    r = nisa.activation(nl.exp, t, scale=s)  # <- ACT_SCALE
    return a


@nki.jit
def output_never_written(a):
    out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)  # <- NOT_WRITTEN
    for i in nl.affine_range(0):
        nl.store(out, nl.load(a))
    return out


@nki.jit
def vector_transpose_too_big(a):
    t = nl.load(a)
    r = nisa.nc_transpose(t, engine=nisa.vector_engine)  # <- VECTOR_TRANSPOSE


@nki.jit
def scalar_engine_maximum(a):
    t = nl.load(a)
    r = nisa.tensor_scalar(t, nl.maximum, 0.0, engine=nisa.scalar_engine)  # <- SCALAR_ENGINE_OP


@nki.jit
def operator_partition_broadcast(a):
    t = nl.load(a)
    row = nl.load(a[0:1, :])
    r = t + row  # <- OPERATOR_BROADCAST


@nki.jit
def psum_accumulate_affine(a):
    out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
    t = _mm_operands(a)
    acc = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
    for k in nl.affine_range(4):
        acc += nisa.nc_matmul(t[:, k * 128:(k + 1) * 128], t[:, 0:128])
    nisa.dma_copy(dst=out, src=nisa.tensor_copy(acc))
    return out


def api_outside_kernel():
    return nl.ndarray((128, 64), nl.float32)  # <- OUTSIDE


@nki.jit
def partition_start_misaligned(a):
    out = nl.ndarray((32, 64), a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    r = nl.exp(t[16:48, :])  # <- PARTITION_START
    nl.store(out, r)
    return out


@nki.jit
def partition_start_half_at_32(a):
    out = nl.ndarray((64, 64), a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    r = nl.ndarray((64, 64), a.dtype, buffer=nl.sbuf)
    r[...] = nl.add(t[32:96, :], t[0:64, :])  # <- PARTITION_START_64
    nl.store(out, r)
    return out


@nki.jit
def partition_start_aligned_quadrants(a):
    # every start the quadrant wiring allows: 64 rows at 64, 32 rows at 32 and 96, 1 row at 96, 128 rows at 0
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    r = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    r[0:64, :] = nl.multiply(t[64:128, :], 1.0)
    r[64:96, :] = nl.copy(t[32:64, :])
    r[96:128, :] = nl.copy(t[96:128, :])
    r[96:97, :] = nl.copy(t[96:97, :])
    nl.store(out, r)
    return out


@nki.jit
def partition_stride(a):
    out = nl.ndarray((64, 64), a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    r = nl.exp(t[0:128:2, :])  # <- PARTITION_STRIDE
    nl.store(out, r)
    return out


@nki.jit
def partition_start_accumulate(a):
    out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
    t = nl.load(a[:, 0:128])
    acc = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
    acc[16:48, :] += nisa.nc_matmul(t[:, 0:32], t)  # <- PARTITION_START_ACC
    nl.store(out, nl.copy(acc))
    return out


@nki.jit
def ap_dim_dma(a):
    """a: (2, 70000) bf16 in HBM; one flat SBUF dimension of 70000 elements (137 KiB per partition fits SBUF)."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((2, 70000), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)  # <- AP_DIM
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def ap_dim_split(a):
    """The same bytes with the free dimension split in two (4 x 17500, the outer one stepping 17500): legal."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((2, 4, 17500), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a.reshape((2, 4, 17500)))
    nisa.dma_copy(dst=out.reshape((2, 4, 17500)), src=t)
    return out


@nki.jit
def ap_stride(a):
    """(2, 2, 35000): both dimensions fit a uint16, but the outer one steps 35000 elements, past an int16."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((2, 2, 35000), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a.reshape((2, 2, 35000)))  # <- AP_STRIDE
    nisa.dma_copy(dst=out.reshape((2, 2, 35000)), src=t)
    return out


@nki.jit
def ap_dim_engine(a):
    """A VectorE copy inside the engine's 64 K free size whose one dimension has 65536 elements (one too many)."""
    big = nl.zeros((2, 4, 16384), nl.bfloat16, buffer=nl.sbuf)
    flat = big.reshape((2, 65536))
    r = nisa.tensor_copy(flat)  # <- AP_DIM_ENGINE
    return a
