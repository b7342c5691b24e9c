"""One test per NKI 0.6 `nki.isa` call (the 0.1 surface's instructions in their 0.6 form), each checked against
NumPy, and the 0.6 rules with their messages: accumulate= flags, undefined accumulation onto memset PSUM, no dtype=,
dst shapes, dma_copy from PSUM, dma_transpose ranks, transpose dtypes, iota/affine_select patterns."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401  (serves `import nki`)
import nki
import nki.isa as nisa
import nki.language as nl
from tilec.nki.rules import NkiError

RNG = np.random.default_rng(11)
F32 = np.float32


def rand(*shape, dtype=F32):
    return RNG.standard_normal(shape).astype(dtype)


def sbuf_of(src, dtype=None):
    t = nl.ndarray(src.shape, dtype=dtype or src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    return t


def out_of(t, shape=None, dtype=None):
    out = nl.ndarray(shape or t.shape, dtype=dtype or t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def psum_to_sbuf(acc, dtype=nl.float32):
    t = nl.ndarray(acc.shape, dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t, src=acc)
    return t


# ---- data movement ----
def test_dma_copy_casts_through_fp32():
    @nki.jit
    def k(a):
        t = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        return out_of(t, dtype=nl.float32)
    a = rand(128, 64)
    import ml_dtypes
    np.testing.assert_array_equal(k(a), a.astype(ml_dtypes.bfloat16).astype(F32))


def test_dma_transpose_2d_and_rank_rule():
    @nki.jit
    def k(a):
        t = nl.ndarray((a.shape[1], a.shape[0]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=a)
        return out_of(t)
    a = rand(64, 32, dtype=np.float16)
    np.testing.assert_array_equal(k(a), a.T)

    @nki.jit
    def bad(a):
        t = nl.ndarray((a.shape[1], a.shape[0], 1), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=a)
        return out_of(t)
    with pytest.raises(NkiError, match="including rank"):
        bad(a)


# ---- TensorE ----
def test_nc_matmul_accumulate_false_true():
    @nki.jit
    def k(a, b):
        acc = nl.ndarray((64, 256), dtype=nl.float32, buffer=nl.psum)
        for i in range(2):
            nisa.nc_matmul(dst=acc, stationary=sbuf_of(a[i * 128:(i + 1) * 128]),
                           moving=sbuf_of(b[i * 128:(i + 1) * 128]), accumulate=i > 0)
        return out_of(psum_to_sbuf(acc))
    a, b = rand(256, 64), rand(256, 256)
    np.testing.assert_allclose(k(a, b), a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


def test_nc_matmul_accumulate_none_infers_first_write_overwrites():
    @nki.jit
    def k(a, b):
        acc = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.psum)
        for _ in range(3):
            nisa.nc_matmul(acc, sbuf_of(a), sbuf_of(b))
        return out_of(psum_to_sbuf(acc))
    a, b = rand(128, 64), rand(128, 128)
    np.testing.assert_allclose(k(a, b), 3 * (a.T.astype(np.float64) @ b), rtol=1e-4, atol=1e-3)
    assert [i.accumulate for i in k.last_trace.instrs if i.op == "nc_matmul"] == [False, True, True]


def test_nc_matmul_onto_memset_psum_is_undefined_behaviour():
    @nki.jit
    def k(a, b):
        acc = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.memset(dst=acc, value=0.0)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(b), accumulate=True)
        return out_of(psum_to_sbuf(acc))
    with pytest.raises(NkiError, match="value-initialized by a non-matmul instruction") as err:
        k(rand(128, 64), rand(128, 128))
    assert "undefined behavior on hardware" in str(err.value)

    @nki.jit
    def zeros(a, b):  # the 0.1 idiom: nl.zeros in PSUM and an inferred (accumulating) matmul
        acc = nl.zeros((64, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(b))
        return out_of(psum_to_sbuf(acc))
    with pytest.raises(NkiError, match="non-matmul"):
        zeros(rand(128, 64), rand(128, 128))


def test_nc_matmul_accumulate_true_on_uninitialized_psum():
    @nki.jit
    def k(a, b):
        acc = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(b), accumulate=True)
        return out_of(psum_to_sbuf(acc))
    with pytest.raises(NkiError, match="accumulate=True on an uninitialized PSUM location"):
        k(rand(128, 64), rand(128, 128))


def test_nc_matmul_3d_moving_and_dst_shape():
    @nki.jit
    def k(a, x):
        acc = nl.ndarray((32, 2, 100), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(x), accumulate=False)
        return out_of(psum_to_sbuf(acc))
    a, x = rand(128, 32), rand(128, 2, 100)
    np.testing.assert_allclose(k(a, x), np.einsum("km,kyx->myx", a, x), rtol=1e-4, atol=1e-3)

    @nki.jit
    def bad(a, x):
        acc = nl.ndarray((32, 100), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(x), accumulate=False)
        return out_of(psum_to_sbuf(acc))
    with pytest.raises(NkiError, match="dst has shape"):
        bad(a, x)


def test_nc_transpose_into_psum_and_dtype_rule():
    @nki.jit
    def k(a):
        t = nl.ndarray((a.shape[1], a.shape[0]), dtype=a.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=t, data=sbuf_of(a))
        return out_of(psum_to_sbuf(t))
    a = rand(128, 96)
    np.testing.assert_array_equal(k(a), a.T)
    assert [i.engine for i in k.last_trace.instrs if i.op == "nc_transpose"] == ["tensor"]

    @nki.jit
    def bad(a):
        t = nl.ndarray((a.shape[1], a.shape[0]), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.nc_transpose(dst=t, data=sbuf_of(a))
        return out_of(psum_to_sbuf(t))
    with pytest.raises(NkiError, match="same data type"):
        bad(a)


# ---- VectorE / ScalarE / GpSimdE ----
def test_tensor_copy_takes_the_dst_dtype_and_refuses_dtype_kwarg():
    @nki.jit
    def k(a):
        t = nl.ndarray(a.shape, dtype=nl.float16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=sbuf_of(a))
        return out_of(t, dtype=nl.float32)
    a = rand(128, 40)
    np.testing.assert_array_equal(k(a), a.astype(np.float16).astype(F32))

    @nki.jit
    def bad(a):
        t = nl.ndarray(a.shape, dtype=nl.float16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=sbuf_of(a), dtype=nl.float16)
        return out_of(t)
    with pytest.raises(NkiError, match="no dtype= or mask="):
        bad(a)


def test_memset_and_tensor_scalar():
    @nki.jit
    def k(a):
        t = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=2.0)
        s = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=s, data=sbuf_of(a), op0=nl.multiply, operand0=t[:, 0:1], op1=nl.subtract,
                           operand1=1.0, reverse1=True)
        return out_of(s)
    a = rand(128, 30)
    np.testing.assert_allclose(k(a), 1.0 - a * 2.0, rtol=1e-6)


def test_tensor_tensor_and_activation_with_bias_and_scale():
    @nki.jit
    def k(a, b, bias):
        s = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=s, data1=sbuf_of(a), data2=sbuf_of(b), op=nl.maximum)
        r = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=r, op=nl.relu, data=s, bias=sbuf_of(bias), scale=2.0)
        return out_of(r)
    a, b, bias = rand(128, 50), rand(128, 50), rand(128, 1)
    np.testing.assert_allclose(k(a, b, bias), np.maximum(2.0 * np.maximum(a, b) + bias, 0), rtol=1e-6)


def test_tensor_reduce_trailing_axes_only():
    @nki.jit
    def k(a):
        r = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.maximum, data=sbuf_of(a), axis=(1, 2), keepdims=True)
        return out_of(r)
    a = rand(128, 3, 20)
    np.testing.assert_array_equal(k(a)[:, 0], a.max(axis=(1, 2)))

    @nki.jit
    def bad(a):
        r = nl.ndarray((a.shape[0], 20), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.add, data=sbuf_of(a), axis=1)
        return out_of(r)
    with pytest.raises(NkiError, match="reduce only consecutive free axes ending at the last one"):
        bad(a)


def test_iota_and_affine_select_patterns():
    @nki.jit
    def k(a):
        idx = nl.ndarray((128, 64), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=idx, pattern=[[1, 64]], offset=5, channel_multiplier=64)
        masked = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        # causal mask: keep x where partition - column >= 0
        nisa.affine_select(dst=masked, pattern=[[-1, 64]], channel_multiplier=1, on_true_tile=sbuf_of(a),
                           on_false_value=-9.0, cmp_op=nl.greater_equal)
        return out_of(idx), out_of(masked)
    a = rand(128, 64)
    idx, masked = k(a)
    p, j = np.mgrid[0:128, 0:64]
    np.testing.assert_array_equal(idx, 5 + 64 * p + j)
    np.testing.assert_array_equal(masked, np.where(p - j >= 0, a, F32(-9.0)))


def test_tensor_copy_predicated_and_select_reduce():
    @nki.jit
    def k(a, b, pred):
        dst = sbuf_of(a)
        p = sbuf_of(pred)
        nisa.tensor_copy_predicated(dst=dst, src=sbuf_of(b), predicate=p)
        sel = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        mx = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(dst=sel, predicate=p, on_true=sbuf_of(b), on_false=-5.0, reduce_res=mx,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=nl.maximum)
        return out_of(dst), out_of(sel), out_of(mx)
    a, b = rand(64, 32), rand(64, 32)
    pred = (RNG.random((64, 32)) > 0.5).astype(np.uint8)
    copied, sel, mx = k(a, b, pred)
    np.testing.assert_array_equal(copied, np.where(pred != 0, b, a))
    want = np.where(pred != 0, b, F32(-5.0))
    np.testing.assert_array_equal(sel, want)
    np.testing.assert_array_equal(mx[:, 0], want.max(axis=1))


def test_scalar_tensor_tensor_and_tensor_tensor_scan():
    @nki.jit
    def k(a, b):
        s = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=s, data=sbuf_of(a), op0=nl.multiply, operand0=3.0, op1=nl.add,
                                  operand1=sbuf_of(b))
        c = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=c, data0=sbuf_of(a), data1=sbuf_of(b), initial=0.0, op0=nl.multiply,
                                op1=nl.add)
        return out_of(s), out_of(c)
    a, b = rand(32, 16), rand(32, 16)
    s, c = k(a, b)
    np.testing.assert_allclose(s, a * 3 + b, rtol=1e-6)
    want, prev = np.zeros_like(a), np.zeros(32, F32)
    for i in range(16):
        prev = a[:, i] * prev + b[:, i]
        want[:, i] = prev
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-6)


def test_bn_stats_aggr_and_partition_reduce():
    @nki.jit
    def k(a):
        x = sbuf_of(a)
        st = nl.ndarray((a.shape[0], 6), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_stats(dst=st, data=x)
        mv = nl.ndarray((a.shape[0], 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=st)
        col = nl.ndarray((1, a.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(dst=col, op=nl.add, data=x)
        return out_of(mv), out_of(col)
    a = rand(64, 100)
    mv, col = k(a)
    np.testing.assert_allclose(mv[:, 0], a.mean(axis=1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mv[:, 1], a.var(axis=1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(col[0], a.sum(axis=0), rtol=1e-4, atol=1e-4)


# ---- kernel-level 0.6 rules ----
def test_dma_copy_from_psum_is_an_error_in_06_wording():
    @nki.jit
    def k(a, b):
        acc = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(b), accumulate=False)
        out = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=acc)
        return out
    with pytest.raises(NkiError, match="no longer supports reading directly from PSUM"):
        k(rand(128, 64), rand(128, 128))


def test_outputs_must_be_shared_hbm():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.hbm)
        nisa.dma_copy(dst=out, src=sbuf_of(a))
        return out
    with pytest.raises(NkiError, match=r"must be allocated with `buffer=nl.shared_hbm`"):
        k(rand(8, 8))


def test_fresh_allocations_are_nan_and_partial_outputs_show_it():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[0:64], src=sbuf_of(a))
        return out
    with pytest.warns(UserWarning, match="only partly written"):
        got = k(rand(64, 8))
    assert np.isnan(got[64:]).all() and not np.isnan(got[:64]).any()
