"""dma_transpose at a copy's rate (ARCH3: up to 90 % of a copy's DMA throughput HBM -> SBUF), and the dtypes it
refuses (ARCH3 documents 2- and 4-byte elements), in both NKI dialects; values against NumPy's transpose."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401  (installs the neuronxcc / nki shims)
import neuronxcc.nki as nki01
import neuronxcc.nki.isa as nisa01
import neuronxcc.nki.language as nl01
import nki
import nki.isa as nisa
import nki.language as nl
from tilec.nki import api
from tilec.nki.rules import NkiError
from tilec.perf.api import estimate

RNG = np.random.default_rng(13)


@nki01.jit
def block_transposed(a):
    out = nl01.ndarray((128, 128), a.dtype, buffer=nl01.shared_hbm)
    nl01.store(out, nisa01.dma_transpose(a[0:128, 128:256]))
    return out


@nki01.jit
def block_copied(a):
    out = nl01.ndarray((128, 128), a.dtype, buffer=nl01.shared_hbm)
    nl01.store(out, nl01.load(a[0:128, 128:256]))
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_block_transpose_costs_about_a_copy(dtype):
    a = RNG.standard_normal((512, 512)).astype(dtype)
    out, trace = api.simulate_traced(block_transposed, a)
    np.testing.assert_array_equal(out, a[0:128, 128:256].T)
    ins = trace.instrs[0]
    assert ins.op == "dma_transpose" and ins.dma_chunks == 128  # the source's 128 rows, not 16384 elements
    _, copy_trace = api.simulate_traced(block_copied, a)
    t_transpose, t_copy = estimate(trace).total_us, estimate(copy_trace).total_us
    assert t_copy <= t_transpose <= t_copy * 1.2


def test_one_byte_elements_are_refused_in_both_dialects():
    a = RNG.integers(-5, 5, (64, 32)).astype(np.int8)

    @nki01.jit
    def k01(a):
        out = nl01.ndarray((32, 64), a.dtype, buffer=nl01.shared_hbm)
        nl01.store(out, nisa01.dma_transpose(a))
        return out

    @nki.jit
    def k06(a):
        t = nl.ndarray((a.shape[1], a.shape[0]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=a)
        out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    for kernel in (lambda: api.simulate(k01, a), lambda: k06(a)):
        with pytest.raises(NkiError, match="2- or 4-byte"):
            kernel()
    b = a.astype(np.float16)  # the same shape in a 2-byte dtype goes through
    np.testing.assert_array_equal(api.simulate(k01, b), b.T)
    np.testing.assert_array_equal(k06(b), b.T)
