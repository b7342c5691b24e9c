"""Reversed access patterns in NKI 0.1 on the interpreter (gaps14): what the hardware computes and what it refuses.

- An engine may read a tile's free axis backwards: an affine index of nl.arange with coefficient -1 (the engine
  access pattern's free strides are signed int16 [ARCH: trainium_inferentia2_arch, access patterns]).
- An engine access covers a contiguous, ascending range of partitions: a tile read with its partitions backwards
  is refused.
- A DMA whose HBM pattern walks memory backwards is refused in 0.1: runtimes before Neuron Runtime 2.33 (SDK 2.32
  release notes, runtime fixes) computed negative-stride DMA addresses with an unsigned step. Rows are reversed
  with an indirect DMA instead (an iota index tile): its rows are index arithmetic, known to a trace-only run too,
  which therefore records what the full run does (an index tile read from HBM still needs numerics)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tilec  # noqa: F401  (installs the neuronxcc shim)
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from tilec.nki import api
from tilec.nki.rules import NkiError
from tilec.perf.api import estimate
from tilec.trace import Instr

RNG = np.random.default_rng(14)
F32 = np.float32


@nki.jit
def _flip_free(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    P, F = a.shape
    r = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    r[...] = nisa.tensor_scalar(t[nl.arange(P)[:, None], F - 1 - nl.arange(F)[None, :]], nl.add, 1.0, dtype=F32)
    nisa.dma_copy(dst=out, src=r)
    return out


@nki.jit
def _flip_partitions_on_engine(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    P, F = a.shape
    r = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    r[...] = nisa.tensor_scalar(t[P - 1 - nl.arange(P)[:, None], nl.arange(F)[None, :]], nl.add, 1.0, dtype=F32)
    nisa.dma_copy(dst=out, src=r)
    return out


@nki.jit
def _flip_rows_negative_dma(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    P, F = a.shape
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[P - 1 - nl.arange(P)[:, None], nl.arange(F)[None, :]])
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def _flip_rows_indirect(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    P, F = a.shape
    rows = nisa.iota(P - 1 - nl.arange(P)[:, None], dtype=nl.int32)
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[rows, nl.arange(F)[None, :]])
    nisa.dma_copy(dst=out, src=t)
    return out


def test_an_engine_reads_a_free_axis_backwards():
    a = RNG.standard_normal((64, 40), F32)
    np.testing.assert_array_equal(api.simulate(_flip_free, a), a[:, ::-1] + 1)


def test_an_engine_cannot_read_partitions_backwards():
    with pytest.raises(NkiError, match="walks its partitions backwards"):
        api.simulate(_flip_partitions_on_engine, RNG.standard_normal((64, 40), F32))


def test_a_negative_stride_dma_is_refused_in_0_1():
    with pytest.raises(NkiError, match="Runtime 2.33"):
        api.simulate(_flip_rows_negative_dma, RNG.standard_normal((64, 40), F32))


def test_rows_reversed_by_an_indirect_dma_and_its_trace_only_record():
    a = RNG.standard_normal((100, 70), F32)
    got, full = api.simulate_traced(_flip_rows_indirect, a)
    np.testing.assert_array_equal(got, a[::-1])
    _, only = api.simulate_traced(_flip_rows_indirect, a.copy(), numerics=False)
    dma = [i for i in only.instrs if i.engine == "dma"][0]
    assert dma.dma_chunks == 100 and dma.dma_chunk_bytes == 70 * 4  # one descriptor per row
    _assert_same_trace(full, only)


def test_a_compiled_reversed_read_traces_alike_with_and_without_numerics():
    """The tuner's trace-only run of a compiled flip (0.1: iota + indirect DMA) records what the full run does."""
    prog = lang.load("""\
kernel flip(A: f32[N, M]) -> Y
  default N = 301, M = 90
  Y: f32[N, M]
  for i in 0..N, j in 0..M:
    Y[i, j] = A[N - 1 - i, M - 1 - j] * 2
""")
    c = compile_loaded(prog, nki="0.1")
    a = RNG.standard_normal((301, 90), F32)
    out, full = c.run_traced(A=a)
    np.testing.assert_array_equal(out["Y"], a[::-1, ::-1] * 2)
    _, only = c.run_traced(A=a, numerics=False)
    _assert_same_trace(full, only)


def _assert_same_trace(full, only) -> None:
    assert len(only.instrs) == len(full.instrs) > 0
    for x, y in zip(full.instrs, only.instrs):
        for f in dataclasses.fields(Instr):
            assert getattr(y, f.name) == getattr(x, f.name), f"instr {x.seq} ({x.op}) differs in {f.name}"
    assert estimate(only).total_us == estimate(full).total_us
