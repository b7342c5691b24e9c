"""Reversed access patterns in NKI 0.6 on the interpreter (gaps14): `.ap()` with a negative step.

- An engine reads a tile's free axis backwards, `t.ap(pattern=[[F, P], [-1, F]], offset=F - 1)` (free strides are
  signed int16 in the engine access pattern [ARCH: trainium_inferentia2_arch]; nki-aps: the SBUF pattern's first
  pair is the partition pair, contiguous).
- A partition pair with a negative step is refused on an engine (partitions are a contiguous ascending range).
- A DMA may walk HBM backwards (`A.ap(pattern=[[-F, P], [1, F]], offset=(P - 1) * F)`): supported by the runtimes
  of the 0.6 era (Neuron Runtime 2.33 fixed negative-stride DMA patterns; SDK 2.32 release notes)."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401
import nki
import nki.isa as nisa
import nki.language as nl
from tilec.nki.rules import NkiError

RNG = np.random.default_rng(14)
F32 = np.float32


@nki.jit
def flip_both(a):
    P, F = a.shape
    out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a.ap(pattern=[[-F, P], [1, F]], offset=(P - 1) * F))  # rows reversed by the DMA
    r = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=r, data=t.ap(pattern=[[F, P], [-1, F]], offset=F - 1), op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out, src=r)
    return out


@nki.jit
def flip_partitions_on_engine(a):
    P, F = a.shape
    out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    r = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=r, data=t.ap(pattern=[[-F, P], [1, F]], offset=(P - 1) * F), op0=nl.multiply,
                       operand0=2.0)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_rows_reversed_by_the_dma_and_columns_by_the_engine():
    a = RNG.standard_normal((100, 70), F32)
    np.testing.assert_array_equal(flip_both(a), a[::-1, ::-1] * 2)


def test_an_engine_cannot_walk_partitions_backwards():
    with pytest.raises(NkiError, match="walks its partitions backwards"):
        flip_partitions_on_engine(RNG.standard_normal((100, 70), F32))
