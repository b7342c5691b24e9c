"""An instruction's second output (an activation's or a tensor_scalar_reduce's reduce_res) is a recorded write: the
model starts a reader on another engine only after the instruction that wrote it (rows18 found the model letting a
VectorE copy of an activation's row sums start 11 us before the activation). Both NKI dialects: 0.6's `dst=` moves
the output's write to dst and must keep the second one."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401  (serves `import nki` and the neuronxcc shim)
import nki
import nki.isa as nisa
import nki.language as nl
import neuronxcc.nki as nki01
import neuronxcc.nki.isa as nisa01
import neuronxcc.nki.language as nl01
from tilec.nki import api
from tilec.perf.api import estimate

COLS = 8192


@nki.jit
def activation_then_vector_reader(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    e = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    sums = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=e, op=nl.exp, data=t, reduce_op=nl.add, reduce_res=sums)
    copy = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=copy, src=sums)  # VectorE reads what ScalarE's activation wrote
    out = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=copy)
    return out


@nki01.jit
def scalar_reduce_then_gpsimd_reader_01(x):  # NKI 0.1: tensor_scalar_reduce has no 0.6 form
    out = nl01.ndarray((x.shape[0], 1), dtype=nl01.float32, buffer=nl01.shared_hbm)
    t = nl01.load(x)
    mx = nl01.ndarray((x.shape[0], 1), dtype=nl01.float32, buffer=nl01.sbuf)
    nisa01.tensor_scalar_reduce(data=t, op0=nl01.multiply, operand0=2.0, reduce_op=nl01.max, reduce_res=mx)
    nl01.store(out, nisa01.tensor_copy(mx, engine=nisa01.gpsimd_engine))
    return out


@nki01.jit
def activation_then_vector_reader_01(x):
    out = nl01.ndarray((x.shape[0], 1), dtype=nl01.float32, buffer=nl01.shared_hbm)
    sums = nl01.ndarray((x.shape[0], 1), dtype=nl01.float32, buffer=nl01.sbuf)
    nisa01.activation(op=nl01.exp, data=nl01.load(x), reduce_op=nl01.add, reduce_res=sums)
    nl01.store(out, nisa01.tensor_copy(sums, engine=nisa01.vector_engine))
    return out


def _reader_after_writer(kernel, writer: str, x: np.ndarray, want: np.ndarray) -> None:
    out, trace = api.simulate_traced(kernel, x)
    np.testing.assert_allclose(np.asarray(out)[:, 0], want, rtol=1e-5)
    items = estimate(trace).timeline
    wrote = next(i for i in items if i.op == writer)
    read = next(i for i in items if i.op == "tensor_copy")
    assert read.start_ns >= wrote.end_ns, (wrote, read)


@pytest.mark.parametrize("kernel", [activation_then_vector_reader, activation_then_vector_reader_01],
                         ids=["nki06", "nki01"])
def test_a_vector_reader_of_an_activations_row_sums_waits_for_it(kernel):
    x = np.random.default_rng(0).standard_normal((128, COLS)).astype(np.float32) * 0.1
    _reader_after_writer(kernel, "activation", x, np.exp(x).sum(axis=1))


def test_a_reader_of_tensor_scalar_reduce_res_waits_for_it():
    x = np.random.default_rng(1).standard_normal((128, COLS)).astype(np.float32)
    _reader_after_writer(scalar_reduce_then_gpsimd_reader_01, "tensor_scalar", x, (2 * x).max(axis=1))
