"""Overlapping window access patterns in NKI 0.1 on the interpreter (pool18): what an engine instruction may read.

- An engine operand's free access pattern is any affine walk of at most four dimensions per partition, with any
  strides, so windows may overlap: v2.26.1 nki/examples/index-case-3.py reduces a max pool's windows with
  `in_tile[i_0, P*i_1 + i_2, P*i_3 + i_4]` over nl.mgrid; v2.32.0 nki/deep-dives/nki-aps.rst: "accessing elements
  from up to four-dimensional arrays" per partition (target.ap_free_dims).
- A pattern of five free dimensions that do not merge is refused, at the call.
- The model charges a tensor_reduce the elements it reads (each window's taps), not the bytes it spans: N_in
  cycles, N_in / 2 for bf16 -> bf16 max (nki-spec §2.4)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tilec  # noqa: F401  (installs the neuronxcc shim)
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from tilec.nki import api
from tilec.nki.rules import NkiError
from tilec.perf.costs import Costs
from tilec.perf.params import target_params

RNG = np.random.default_rng(18)
BF16 = ml_dtypes.bfloat16


@nki.jit
def _window_max(a):
    """Y[p, r, o] = max over k < 3 of a[p, r, 2*o + k] (3-wide windows with step 2: neighbours share a column)."""
    P, R, W = a.shape
    O = (W - 3) // 2 + 1
    out = nl.ndarray((P, R, O), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, R, W), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    i0, i1, i2, i3 = nl.mgrid[0:P, 0:R, 0:O, 0:3]
    r = nl.ndarray((P, R, O), dtype=a.dtype, buffer=nl.sbuf)
    r[...] = nisa.tensor_reduce(nl.maximum, t[i0, i1, 2 * i2 + i3], axis=3, keepdims=False, dtype=a.dtype)
    nisa.dma_copy(dst=out, src=r)
    return out


@nki.jit
def _five_free_dims(a):
    P, F = a.shape
    out = nl.ndarray((P, 1), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    i0, i1, i2, i3, i4, i5 = nl.mgrid[0:P, 0:2, 0:2, 0:2, 0:2, 0:2]
    r = nl.ndarray((P, 1), dtype=a.dtype, buffer=nl.sbuf)
    r[...] = nisa.tensor_reduce(nl.add, t[i0, 40 * i1 + 13 * i2 + 5 * i3 + 3 * i4 + i5], axis=[1, 2, 3, 4, 5],
                                keepdims=False, dtype=a.dtype)
    nisa.dma_copy(dst=out, src=r)
    return out


def _reference(a: np.ndarray) -> np.ndarray:
    o = (a.shape[2] - 3) // 2 + 1
    return np.max([a[:, :, k:k + 2 * (o - 1) + 1:2] for k in range(3)], axis=0)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_an_engine_reduces_overlapping_windows(dtype):
    a = RNG.standard_normal((96, 5, 23)).astype(dtype)
    np.testing.assert_array_equal(api.simulate(_window_max, a).astype(np.float32),
                                  _reference(a.astype(np.float32)))


def test_five_free_dimensions_are_refused():
    with pytest.raises(NkiError, match="at most 4 per partition") as err:
        api.simulate(_five_free_dims, RNG.standard_normal((64, 64)).astype(np.float32))
    assert err.value.rule == "access_pattern_dims" and err.value.where is not None


def test_the_model_charges_the_elements_a_window_reads():
    a = RNG.standard_normal((128, 5, 23)).astype(BF16)
    _, trace = api.simulate_traced(_window_max, a, numerics=False)
    red = next(i for i in trace.instrs if i.op == "tensor_reduce")
    assert red.attr("in_free") == 5 * 11 * 3  # rows x windows x taps: each shared column counted in both windows
    costs = Costs(target_params("trn2"))
    cycles = costs.engine_cycles(red)
    assert cycles == 5 * 11 * 3 / 2  # bf16 -> bf16 max: N_in / 2 (the span, 5 x 23 elements, would give 57.5)
