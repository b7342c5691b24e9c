"""TensorE transpose mode (ARCH3, v2.32.0 trainium2_arch.rst "Built-in Transpose Support"; ISA6 nc_matmul /
nc_transpose): `nc_matmul(..., is_transpose=True)` with an identity as moving, and `nc_transpose` on TensorE, on
NeuronCore-v3 (trn2) move the data bit-exactly (NaN/Inf and -0.0 kept), a 16-bit input may stay 16-bit in PSUM, and
the model charges an fp32 transpose half an fp32 matmul's factor. On NeuronCore-v2 (trn1) is_transpose is a hint:
the matmul sums products with the identity, so a NaN/Inf spreads along its row. References are NumPy transposes."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401  (serves `import nki`)
import nki
import nki.isa as nisa
import nki.language as nl
from test_isa06 import sbuf_of
from tilec.nki.rules import NkiError
from tilec.perf.api import estimate
from tilec.perf.params import TRN1, TRN2

RNG = np.random.default_rng(23)
F32 = np.float32


def rand(*shape, dtype=F32):
    return RNG.standard_normal(shape).astype(dtype)


def evict(acc, dtype):
    t = nl.ndarray(acc.shape, dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t, src=acc)
    out = nl.ndarray(acc.shape, dtype=dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def transposer(psum_dtype=None, accumulate=False, identity=None):
    """a [K, M] -> a.T through nc_matmul(is_transpose=True) into a PSUM tile of psum_dtype (default a's dtype)."""
    @nki.jit
    def k(a):
        kk, m = a.shape
        eye = nl.shared_identity_matrix(kk, dtype=a.dtype) if identity is None else identity(kk, a.dtype)
        dt = psum_dtype or a.dtype
        tp = nl.ndarray((m, kk), dtype=dt, buffer=nl.psum)
        if accumulate:
            nisa.nc_matmul(dst=tp, stationary=sbuf_of(a), moving=eye, is_transpose=True, accumulate=False)
        nisa.nc_matmul(dst=tp, stationary=sbuf_of(a), moving=eye, is_transpose=True, accumulate=accumulate)
        return evict(tp, a.dtype)
    return k


def special(dtype):
    """A [128, 96] tile with NaN, +-Inf and -0.0 among normal values."""
    a = rand(128, 96).astype(dtype)
    a[3, 5], a[70, 5], a[9, 40], a[100, 80] = np.nan, np.inf, -np.inf, -0.0
    return a


@pytest.mark.parametrize("dtype", [np.float32, nl.bfloat16, nl.float16])
def test_is_transpose_matmul_is_bit_exact_on_trn2(dtype):
    a = special(dtype)
    k = transposer()
    got = k(a)
    assert got.dtype == a.dtype
    np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(a.T).view(np.uint8))
    mm = [i for i in k.last_trace.instrs if i.op == "nc_matmul"]
    assert len(mm) == 1 and mm[0].attr("is_transpose") is True


def test_is_transpose_into_fp32_psum_keeps_the_values():
    a = special(nl.bfloat16)
    got = transposer(psum_dtype=nl.float32)(a)
    np.testing.assert_array_equal(got.view(np.uint16), np.ascontiguousarray(a.T).view(np.uint16))


def test_nc_transpose_on_tensor_engine_is_bit_exact_on_trn2():
    @nki.jit
    def k(a):
        t = nl.ndarray((a.shape[1], a.shape[0]), dtype=a.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=t, data=sbuf_of(a), engine=nisa.engine.tensor)
        return evict(t, a.dtype)
    a = special(F32)
    np.testing.assert_array_equal(k(a).view(np.uint32), np.ascontiguousarray(a.T).view(np.uint32))


def test_without_transpose_mode_nan_and_inf_spread_along_the_row(monkeypatch):
    """NeuronCore-v2: a matmul with an identity adds x * 0 for every other row, and Inf * 0 is NaN [ISA6]."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    a = rand(128, 96)
    a[3, 5], a[9, 40] = np.nan, np.inf
    want = a.T.copy()
    want[5, :] = np.nan  # column 5 of a holds a NaN: every element of row 5 of a.T sums a NaN product
    want[40, :] = np.nan
    want[40, 9] = np.inf  # except the Inf itself: Inf * 1 plus finite zeros
    np.testing.assert_array_equal(transposer(psum_dtype=nl.float32)(a), want)

    @nki.jit
    def tp(a):
        t = nl.ndarray((a.shape[1], a.shape[0]), dtype=a.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=t, data=sbuf_of(a))
        return evict(t, a.dtype)
    np.testing.assert_array_equal(tp(a), want)
    finite = rand(128, 96)
    np.testing.assert_array_equal(tp(finite), finite.T)


def test_trn1_is_transpose_needs_fp32_psum(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(NkiError, match="must be a float32 tile in PSUM"):
        transposer()(rand(128, 64).astype(nl.bfloat16))


def test_moving_must_be_an_identity():
    def ones(n, dtype):
        t = nl.ndarray((n, n), dtype=dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=1.0)
        return t
    with pytest.raises(NkiError, match=r"needs moving to be an identity matrix: element \[0, 1\] is 1.0"):
        transposer(identity=ones)(rand(128, 64))

    def wide(n, dtype):
        t = nl.ndarray((n, 2 * n), dtype=dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        return t
    with pytest.raises(NkiError, match=r"moving must be \[128, 128\]"):
        transposer(identity=wide)(rand(128, 64))


def test_sixteen_bit_psum_cannot_accumulate_and_other_dtypes_are_refused():
    with pytest.raises(NkiError, match="accumulates in float32 only"):
        transposer(accumulate=True)(rand(128, 64).astype(nl.bfloat16))
    np.testing.assert_array_equal(transposer(psum_dtype=nl.float32, accumulate=True)(a := rand(128, 64)), 2 * a.T)
    with pytest.raises(NkiError, match="must be a float32 tile in PSUM"):
        transposer(psum_dtype=nl.float16)(rand(128, 64).astype(nl.bfloat16))  # 16-bit, but not the input's
    with pytest.raises(NkiError, match="must be a float32 tile in PSUM"):
        transposer(psum_dtype=nl.bfloat16)(rand(128, 64))  # fp32 input: fp32 out


def test_fp8_transpose_mode_is_refused_with_the_reason():
    a = RNG.integers(-4, 4, (128, 64)).astype(nl.float8_e4m3)
    with pytest.raises(NkiError, match="upper 8 bits zero"):
        transposer(psum_dtype=nl.float32)(a)


def test_fp32_transpose_costs_half_the_fp32_matmul_factor():
    """The model: the same [128, 128] fp32 tile transposed by an identity matmul in transpose mode, by nc_transpose,
    and multiplied by the identity as a plain matmul; only the plain matmul pays the whole fp32 factor on trn2."""
    @nki.jit
    def k(a):
        eye = nl.shared_identity_matrix(128, dtype=a.dtype)
        s = sbuf_of(a)
        outs = []
        for mode in ("is_transpose", "nc_transpose", "matmul"):
            tp = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
            if mode == "nc_transpose":
                nisa.nc_transpose(dst=tp, data=s)
            else:
                nisa.nc_matmul(dst=tp, stationary=s, moving=eye, is_transpose=mode == "is_transpose")
            outs.append(evict(tp, a.dtype))
        return tuple(outs)
    a = rand(128, 128)
    for got in k(a):
        np.testing.assert_array_equal(got, a.T)
    tensor = [i for i in k.last_trace.instrs if i.engine == "tensor"]
    for target, p in (("trn2", TRN2), ("trn1", TRN1)):
        sched = estimate(k.last_trace, target=target)
        busy = [e.end_ns - e.start_ns for e in sched.timeline if e.lane == "tensor"]
        assert len(busy) == len(tensor) == 3
        cycles = (128 + p.mm_fixed_cycles.value) / p.tensor_ghz.value
        fp32 = p.mm_fp32_factor.value
        want = [cycles * fp32 / p.transpose_fp32_speedup.value] * 2 + [cycles * fp32]
        assert busy == pytest.approx(want, rel=1e-9)
    assert TRN2.transpose_fp32_speedup.value == 2 and TRN1.transpose_fp32_speedup.value == 1
