"""Kernels for the less common nisa instructions (test_isa_extra.py, test_trace_only.py): the documented uses, and
one rule violation per kernel marked with a trailing `# <- NAME` comment."""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


# ---- tensor_copy_predicated ----
@nki.jit
def copy_predicated(src, pred, old):
    out = nl.ndarray((3, 128, 64), nl.float32, buffer=nl.shared_hbm)
    s, p = nl.load(src), nl.load(pred)
    d0, d1, d2 = nl.load(old), nl.load(old), nl.load(old)
    nisa.tensor_copy_predicated(src=s, dst=d0, predicate=p)
    nisa.tensor_copy_predicated(src=2.5, dst=d1, predicate=p, reverse_pred=True)
    ps = nl.ndarray((128, 64), nl.float32, buffer=nl.psum)
    ps[...] = nisa.tensor_copy(s)
    nisa.tensor_copy_predicated(src=ps, dst=d2, predicate=p)  # src from PSUM: the N-cycle case
    for i, d in enumerate((d0, d1, d2)):
        nl.store(out[i], d)
    return out


@nki.jit
def copy_predicated_float_pred(src, pred, old):
    s, d = nl.load(src), nl.load(old)
    p = nl.load(src)
    nisa.tensor_copy_predicated(src=s, dst=d, predicate=p)  # <- PRED_DTYPE
    return src


@nki.jit
def copy_predicated_dtypes_differ(src, pred, old):
    s, p = nl.load(src), nl.load(pred)
    d = nl.load(old, dtype=nl.bfloat16)
    nisa.tensor_copy_predicated(src=s, dst=d, predicate=p)  # <- SRC_DST_DTYPE
    return src


@nki.jit
def copy_predicated_unwritten_dst(src, pred, old):
    s, p = nl.load(src), nl.load(pred)
    d = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy_predicated(src=s, dst=d, predicate=p)  # <- DST_UNWRITTEN
    return src


@nki.jit
def copy_predicated_shape(src, pred, old):
    s, p, d = nl.load(src), nl.load(pred), nl.load(old)
    nisa.tensor_copy_predicated(src=s[:, 0:32], dst=d, predicate=p)  # <- PRED_SHAPE
    return src


@nki.jit
def masked_forms(src, pred, old, col):
    """mask= on the element-wise ones: only the first 40 columns are computed (written)."""
    out = nl.ndarray((2, 128, 40), nl.float32, buffer=nl.shared_hbm)
    s, p, d, v = nl.load(src), nl.load(pred), nl.load(old), nl.load(col)
    i_p, i_f = nl.mgrid[0:128, 0:64]
    nisa.tensor_copy_predicated(src=s, dst=d, predicate=p, mask=(i_f < 40))
    r = nisa.scalar_tensor_tensor(data=s, op0=nl.multiply, operand0=v, op1=nl.add, operand1=d, mask=(i_f < 40))
    nl.store(out[0], d[:, 0:40])
    nl.store(out[1], r[:, 0:40])
    return out


# ---- scalar_tensor_tensor ----
@nki.jit
def scalar_tensor_tensor_forms(a, col, b):
    out = nl.ndarray((2, 128, 64), a.dtype, buffer=nl.shared_hbm)
    t, v, u = nl.load(a), nl.load(col), nl.load(b)
    r0 = nisa.scalar_tensor_tensor(data=t, op0=nl.subtract, operand0=v, op1=nl.multiply, operand1=u)
    r1 = nisa.scalar_tensor_tensor(data=t, op0=nl.add, operand0=2.0, op1=nl.subtract, operand1=u,
                                   reverse0=True, reverse1=True)
    nl.store(out[0], r0)
    nl.store(out[1], r1)
    return out


@nki.jit
def stt_operand1_shape(a, col, b):
    t, v, u = nl.load(a), nl.load(col), nl.load(b)
    r = nisa.scalar_tensor_tensor(data=t, op0=nl.add, operand0=v, op1=nl.add, operand1=u[:, 0:32])  # <- STT_SHAPE
    return a


@nki.jit
def stt_bitvec(a, col, b):
    t, v, u = nl.load(a), nl.load(col), nl.load(b)
    r = nisa.scalar_tensor_tensor(data=t, op0=nl.bitwise_and, operand0=v, op1=nl.add, operand1=u)  # <- STT_BITVEC
    return a


@nki.jit
def stt_two_psum(a, col, b):
    t, v = nl.load(a), nl.load(col)
    p = nl.ndarray((128, 64), nl.float32, buffer=nl.psum)
    q = nl.ndarray((128, 64), nl.float32, buffer=nl.psum)
    p[...] = nisa.tensor_copy(t)
    q[...] = nisa.tensor_copy(t)
    r = nisa.scalar_tensor_tensor(data=p, op0=nl.add, operand0=v, op1=nl.add, operand1=q)  # <- STT_PSUM
    return a


# ---- tensor_tensor_scan ----
@nki.jit
def scan_two_halves(a_tensor, b_tensor):
    """The reference's example: a (128, 1024) multiply-add scan as two 512-element scans chained by `initial`."""
    c_tensor = nl.ndarray(a_tensor.shape, nl.float32, buffer=nl.shared_hbm)
    a, b = nl.load(a_tensor), nl.load(b_tensor)
    c = nl.ndarray((128, 1024), nl.float32, buffer=nl.sbuf)
    c[:, 0:512] = nisa.tensor_tensor_scan(a[:, 0:512], b[:, 0:512], initial=0, op0=np.multiply, op1=np.add)
    c[:, 512:1024] = nisa.tensor_tensor_scan(a[:, 512:1024], b[:, 512:1024], initial=c[:, 511],
                                             op0=np.multiply, op1=np.add)
    nl.store(c_tensor, c)
    return c_tensor


@nki.jit
def scan_reversed(a_tensor, b_tensor, init):
    out = nl.ndarray((128, 64), nl.float16, buffer=nl.shared_hbm)
    a, b, i = nl.load(a_tensor), nl.load(b_tensor), nl.load(init)
    r = nisa.tensor_tensor_scan(a, b, i, nl.subtract, nl.maximum, reverse0=True, reverse1=True, dtype=nl.float16)
    nl.store(out, r)
    return out


@nki.jit
def scan_masked(a_tensor, b_tensor, init):
    a, b = nl.load(a_tensor), nl.load(b_tensor)
    i_p, i_f = nl.mgrid[0:128, 0:64]
    r = nisa.tensor_tensor_scan(a, b, 0.0, nl.add, nl.add, mask=(i_f < 32))  # <- SCAN_MASK
    return a_tensor


@nki.jit
def scan_wide_initial(a_tensor, b_tensor, init):
    a, b = nl.load(a_tensor), nl.load(b_tensor)
    r = nisa.tensor_tensor_scan(a, b, a[:, 0:2], nl.add, nl.add)  # <- SCAN_INITIAL
    return a_tensor


# ---- bn_stats / bn_aggr ----
@nki.jit
def bn_mean_var(b_tensor):
    """The reference's example 2: 1024 elements per partition as two bn_stats, one bn_aggr."""
    mean_var = nl.ndarray((128, 2), nl.float32, buffer=nl.shared_hbm)
    b = nl.load(b_tensor)
    stats = nl.ndarray((128, 12), nl.float32, buffer=nl.sbuf)
    for i in range(2):
        stats[:, i * 6:(i + 1) * 6] = nisa.bn_stats(b[:, i * 512:(i + 1) * 512], dtype=nl.float32)
    nl.store(mean_var, nisa.bn_aggr(stats))
    return mean_var


@nki.jit
def bn_stats_raw(a_tensor):
    out = nl.ndarray((a_tensor.shape[0], 6), nl.float32, buffer=nl.shared_hbm)
    nl.store(out, nisa.bn_stats(nl.load(a_tensor), dtype=nl.float32))
    return out


@nki.jit
def bn_low_precision(a_tensor):
    out = nl.ndarray((128, 2), a_tensor.dtype, buffer=nl.shared_hbm)
    a = nl.load(a_tensor)
    nl.store(out, nisa.bn_aggr(nisa.bn_stats(a)))  # bf16 stats, bf16 result
    return out


@nki.jit
def bn_stats_too_wide(a_tensor):
    s = nisa.bn_stats(nl.load(a_tensor))  # <- BN_WIDE
    return a_tensor


@nki.jit
def bn_aggr_not_triples(a_tensor):
    s = nisa.bn_aggr(nl.load(a_tensor[:, 0:7]))  # <- BN_TRIPLES
    return a_tensor


# ---- tensor_partition_reduce ----
@nki.jit
def partition_reduce_forms(a_tensor, bits):
    out_sum = nl.ndarray((1, 32, 4), nl.float32, buffer=nl.shared_hbm)
    out_max = nl.ndarray((1, 128), nl.float32, buffer=nl.shared_hbm)
    out_or = nl.ndarray((1, 16), nl.int32, buffer=nl.shared_hbm)
    a = nl.load(a_tensor)
    nl.store(out_sum, nisa.tensor_partition_reduce(np.add, a))
    nl.store(out_max, nisa.tensor_partition_reduce(nl.maximum, a.reshape((128, 128))))
    nl.store(out_or, nisa.tensor_partition_reduce(nl.bitwise_or, nl.load(bits)))
    return out_sum, out_max, out_or


@nki.jit
def partition_reduce_subtract(a_tensor, bits):
    r = nisa.tensor_partition_reduce(nl.subtract, nl.load(a_tensor))  # <- PR_OP
    return a_tensor


@nki.jit
def partition_reduce_psum(a_tensor, bits):
    p = nl.ndarray((128, 32, 4), nl.float32, buffer=nl.psum)
    p[...] = nisa.tensor_copy(nl.load(a_tensor))
    r = nisa.tensor_partition_reduce(np.add, p)  # <- PR_PSUM
    return a_tensor


@nki.jit
def partition_reduce_bitvec_float(a_tensor, bits):
    r = nisa.tensor_partition_reduce(nl.bitwise_or, nl.load(a_tensor))  # <- PR_BITVEC
    return a_tensor


# ---- select_reduce ----
@nki.jit
def select_forms(pred, on_true_data, on_false_data):
    res = nl.ndarray((3, 128, 64), nl.float32, buffer=nl.shared_hbm)
    red = nl.ndarray((2, 128, 1), nl.float32, buffer=nl.shared_hbm)
    p, t, f = nl.load(pred), nl.load(on_true_data), nl.load(on_false_data)
    d0 = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    d1 = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    d2 = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    r0 = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
    r1 = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=d0, predicate=p, on_true=t, on_false=nl.fp32.min)
    nisa.select_reduce(dst=d1, predicate=p, on_true=t, on_false=f, reduce_cmd=nisa.reduce_cmd.reset_reduce,
                       reduce_res=r0, reduce_op=nl.max)
    nisa.select_reduce(dst=d2, predicate=p, on_true=t, on_false=-1.0, reverse_pred=True,
                       reduce_cmd=nisa.reduce_cmd.reduce, reduce_res=r1)  # the max of both selections
    for i, d in enumerate((d0, d1, d2)):
        nl.store(res[i], d)
    nl.store(red[0], r0)
    nl.store(red[1], r1)
    return res, red


@nki.jit
def select_reduce_without_reset(pred, on_true_data, on_false_data):
    p, t = nl.load(pred), nl.load(on_true_data)
    d = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=d, predicate=p, on_true=t, on_false=0.0, reduce_cmd=nisa.reduce_cmd.reduce)  # <- SR_NORESET
    return pred


@nki.jit
def select_reduce_idle_readout(pred, on_true_data, on_false_data):
    p, t = nl.load(pred), nl.load(on_true_data)
    d = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    r = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=d, predicate=p, on_true=t, on_false=0.0, reduce_res=r)  # <- SR_IDLE
    return pred


@nki.jit
def select_reduce_add(pred, on_true_data, on_false_data):
    p, t = nl.load(pred), nl.load(on_true_data)
    d = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=d, predicate=p, on_true=t, on_false=0.0, reduce_op=nl.add)  # <- SR_OP
    return pred


@nki.jit
def select_reduce_int32(pred, on_true_data, on_false_data):
    p = nl.load(pred)
    t = nl.load(on_true_data, dtype=nl.int32)
    d = nl.ndarray((128, 64), nl.int32, buffer=nl.sbuf)
    nisa.select_reduce(dst=d, predicate=p, on_true=t, on_false=0.0)  # <- SR_INT32
    return pred
