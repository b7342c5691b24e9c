"""Overlapping window access patterns in NKI 0.6 on the interpreter (pool18): `.ap()` with a window's step smaller
than its taps, `t.ap(pattern=[[F, P], [W, R], [2, O], [1, 3]])` (v2.32.0 nki/deep-dives/nki-aps.rst: a [step, num]
pair per dimension, the partition pair first with the step of the tile's whole free size, up to four free pairs);
five free pairs that do not merge are refused."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401
import nki
import nki.isa as nisa
import nki.language as nl
from tilec.nki.rules import NkiError

RNG = np.random.default_rng(18)


@nki.jit
def window_sum(a):
    """Y[p, r, o] = sum over k < 3 of a[p, r, 2*o + k]."""
    P, R, W = a.shape
    O = (W - 3) // 2 + 1
    out = nl.ndarray((P, R, O), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, R, W), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    r = nl.ndarray((P, R, O), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=r, op=nl.add, data=t.ap(pattern=[[R * W, P], [W, R], [2, O], [1, 3]], offset=0), axis=3,
                       keepdims=False)
    nisa.dma_copy(dst=out, src=r)
    return out


@nki.jit
def five_free_pairs(a):
    P, F = a.shape
    out = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    r = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=r, op=nl.add, data=t.ap(pattern=[[F, P], [40, 2], [13, 2], [5, 2], [3, 2], [1, 2]],
                                                   offset=0), axis=(1, 2, 3, 4, 5), keepdims=False)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_an_engine_sums_overlapping_windows():
    a = RNG.standard_normal((100, 4, 21)).astype(np.float32)
    want = sum(a[:, :, k:k + 19:2].astype(np.float64) for k in range(3))
    np.testing.assert_allclose(window_sum(a), want, rtol=1e-6, atol=1e-6)


def test_five_free_pairs_are_refused():
    with pytest.raises(NkiError, match="at most 4 per partition"):
        five_free_pairs(RNG.standard_normal((64, 64)).astype(np.float32))
