"""Documented rejections the interpreter missed until session 21 (fid21), each beside the accepted form checked against
NumPy: activation's reduce_op (nl.add only), its scalar bias (NeuronCore-v3 only), a bias with op=nl.reciprocal
(not on NeuronCore-v2), and tensor_scalar's two operators of different kinds (bitvec with arithmetic). Sources: the
comments at the checks (tilec/nki/isa.py, tilec/target.py)."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401  (serves `import nki`)
import nki
import nki.isa as nisa
import nki.language as nl
from tilec.nki.rules import NkiError

RNG = np.random.default_rng(21)
F32 = np.float32


def sbuf_of(src):
    t = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    return t


def out_of(t):
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def summed(reduce_op):
    @nki.jit
    def k(a):
        y = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=y, op=nl.exp, data=sbuf_of(a), reduce_op=reduce_op, reduce_res=s)
        return out_of(s)
    return k


def test_activation_reduces_with_add_only():
    a = RNG.standard_normal((32, 48)).astype(F32)
    np.testing.assert_allclose(summed(nl.add)(a)[:, 0], np.exp(a).sum(axis=1), rtol=1e-5)
    with pytest.raises(NkiError, match=r"activation reduces with nl.add only, got reduce_op=nl.maximum"):
        summed(nl.maximum)(a)


def biased(op, bias):
    @nki.jit
    def k(a):
        y = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=y, op=op, data=sbuf_of(a), bias=bias)
        return out_of(y)
    return k


def column(a, value):
    @nki.jit
    def k(x):
        b = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=b, value=value)
        y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=y, op=nl.exp, data=sbuf_of(x), bias=b)
        return out_of(y)
    return k(a)


def test_scalar_bias_needs_neuroncore_v3(monkeypatch):
    a = RNG.standard_normal((16, 40)).astype(F32)
    np.testing.assert_allclose(biased(nl.exp, 0.5)(a), np.exp(a + F32(0.5)), rtol=1e-5)  # trn2 (the default)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(NkiError, match=r"bias must be a \(P, 1\) vector on NeuronCore-v2 \(trn1\)"):
        biased(nl.exp, 0.5)(a)
    np.testing.assert_allclose(column(a, 0.5), np.exp(a + F32(0.5)), rtol=1e-5)  # the vector form is fine


def reciprocal(with_bias: bool):
    @nki.jit
    def k(a):
        y = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        if with_bias:
            b = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=b, value=1.0)
            nisa.activation(dst=y, op=nl.reciprocal, data=sbuf_of(a), bias=b)
        else:
            nisa.activation(dst=y, op=nl.reciprocal, data=sbuf_of(a))
        return out_of(y)
    return k


def test_reciprocal_takes_no_bias_on_neuroncore_v2(monkeypatch):
    a = (RNG.random((16, 24)) + 0.5).astype(F32)
    np.testing.assert_allclose(reciprocal(True)(a), 1 / (a + 1), rtol=1e-5)  # trn2 accepts it
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(NkiError, match=r"op=nl.reciprocal\) takes no bias on NeuronCore-v2"):
        reciprocal(True)(a)
    np.testing.assert_allclose(reciprocal(False)(a), 1 / a, rtol=1e-5)


def two_ops(op0, op1):
    @nki.jit
    def k(a):
        y = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=sbuf_of(a), op0=op0, operand0=12, op1=op1, operand1=3)
        return out_of(y)
    return k


def test_tensor_scalar_operators_of_one_kind():
    a = RNG.integers(0, 1000, (8, 20)).astype(np.int32)
    np.testing.assert_array_equal(two_ops(nl.bitwise_and, nl.bitwise_or)(a), (a & 12) | 3)
    with pytest.raises(NkiError, match=r"must both be bitvec or both arithmetic operators: got nl.bitwise_and"):
        two_ops(nl.bitwise_and, nl.add)(a)


def matmul_of(dtype):
    @nki.jit
    def k(a, b):
        acc = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.psum)
        sa = nl.ndarray(a.shape, dtype=dtype, buffer=nl.sbuf)
        sb = nl.ndarray(b.shape, dtype=dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=sa, src=a)
        nisa.dma_copy(dst=sb, src=b)
        nisa.nc_matmul(dst=acc, stationary=sa, moving=sb)
        y = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=y, src=acc)
        return out_of(y)
    return k


def test_matmul_inputs_are_floats():
    a, b = RNG.integers(-4, 5, (32, 16)).astype(F32), RNG.integers(-4, 5, (32, 24)).astype(F32)
    np.testing.assert_array_equal(matmul_of(nl.bfloat16)(a, b), a.T @ b)  # small integers: exact in bf16
    with pytest.raises(NkiError, match=r"nc_matmul stationary is int8; TensorE multiplies float8_e4m3"):
        matmul_of(nl.int8)(a, b)


def filled(engine):
    @nki.jit
    def k(a):
        t = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=2.5, engine=engine)
        return out_of(t)
    return k


def test_memset_runs_on_vector_or_gpsimd():
    a = np.zeros((8, 12), F32)
    for engine in (nisa.engine.vector, nisa.engine.gpsimd):
        np.testing.assert_array_equal(filled(engine)(a), np.full(a.shape, 2.5, F32))
    with pytest.raises(NkiError, match=r"memset runs on the vector or gpsimd engine, not scalar"):
        filled(nisa.engine.scalar)(a)


def copied(**how):
    @nki.jit
    def k(a):
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a, **how)
        return out_of(t)
    return k


def test_hardware_dge_and_its_trigger_engine(monkeypatch):
    a = RNG.standard_normal((16, 10)).astype(F32)
    hw = dict(dge_mode=nisa.dge_mode.hwdge)
    for how in (hw, dict(hw, engine=nisa.engine.sync), dict(hw, engine=nisa.engine.scalar)):
        np.testing.assert_array_equal(copied(**how)(a), a)
    with pytest.raises(NkiError, match=r"engine= names the hardware DGE's trigger .* only valid with dge_mode=hwdge"):
        copied(engine=nisa.engine.sync)(a)
    with pytest.raises(NkiError, match=r"engine= names the hardware DGE's trigger"):
        copied(dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.vector)(a)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(NkiError, match=r"dma_copy with dge_mode=hwdge needs NeuronCore-v3 or newer; trn1"):
        copied(**hw)(a)
    np.testing.assert_array_equal(copied()(a), a)


def powered(engine):
    @nki.jit
    def k(a, b):
        y = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y, data1=sbuf_of(a), data2=sbuf_of(b), op=nl.power, engine=engine)
        return out_of(y)
    return k


def test_power_runs_on_gpsimd():
    a, b = (RNG.random((8, 16)) + 0.5).astype(F32), RNG.standard_normal((8, 16)).astype(F32)
    for engine in (nisa.engine.unknown, nisa.engine.gpsimd):
        np.testing.assert_allclose(powered(engine)(a, b), np.power(a, b), rtol=1e-5)
    with pytest.raises(NkiError, match=r"op=nl.power runs on the gpsimd engine, not vector"):
        powered(nisa.engine.vector)(a, b)
