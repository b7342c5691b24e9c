"""What the course's harness needs before any kernel runs (issue 15): `logging.OFF`, which the Neuron environment
provides (the harness calls `logging.disable(logging.OFF)` at its line 18), and `tile.reshape(shape=...)`."""
from __future__ import annotations

import logging

import numpy as np
import pytest

import tilec  # noqa: F401  (installs the neuronxcc shim)
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from tilec.errors import KernelError
from tilec.nki import api


def test_logging_off_silences_every_level() -> None:
    assert logging.OFF > logging.CRITICAL
    logger = logging.getLogger("tilec-test-harness")
    try:
        logging.disable(logging.OFF)
        assert not logger.isEnabledFor(logging.CRITICAL)
    finally:
        logging.disable(logging.NOTSET)
    assert logger.isEnabledFor(logging.CRITICAL)


@nki.jit
def _pool_rows(x):  # x: (128, 2, 6) -> max over the 2 rows and pairs of columns -> (128, 3)
    out = nl.ndarray((128, 3), x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    pooled = nisa.tensor_reduce(nl.max, t.reshape(shape=(128, 2, 3, 2)), axis=(1, 3))
    nl.store(out, pooled)
    return out


@nki.jit
def _hbm_reshape(x):  # an HBM argument reshaped with the keyword too
    flat = x.reshape(shape=(128, 4))
    out = nl.ndarray((128, 4), x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(flat))
    return out


@nki.jit
def _bad_keyword(x):
    return x.reshape(size=(4, 128))


def test_reshape_takes_the_documented_keyword() -> None:
    x = np.random.default_rng(0).random((128, 2, 6), dtype=np.float32)
    with pytest.warns(UserWarning, match="Neuron SDK 2.29"):
        got = api.simulate(_pool_rows, x)
    np.testing.assert_array_equal(got, x.reshape(128, 2, 3, 2).max(axis=(1, 3)))
    y = np.arange(512, dtype=np.float32)
    np.testing.assert_array_equal(api.simulate(_hbm_reshape, y), y.reshape(128, 4))


def test_reshape_rejects_other_keywords() -> None:
    with pytest.raises(KernelError, match=r"shape positionally or as shape=.*\['size'\]"):
        api.simulate(_bad_keyword, np.zeros(512, np.float32))
