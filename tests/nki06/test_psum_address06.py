"""NKI 0.6 PSUM addresses (MIG v2.32.0 nki/migration/index.rst, "Improved allocation API": "The allocation for PSUM
tensors must start at the beginning of each bank — the compiler will throw an error otherwise"; its example puts a
(128, 1024) bf16 tensor on bank 3 with address=(0, 3 * 2048), so the free offset is in bytes)."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401  (serves `import nki`)
import nki.language as nl
from test_psum_banks06 import zero_psum
from tilec.nki.rules import NkiError


def at(address, shape=(128, 1024), dtype=nl.bfloat16):
    return zero_psum(shape, dtype, value=2.0, address=address)


@pytest.mark.parametrize("bank", [0, 3, 7])
def test_a_psum_tensor_at_a_bank_start_runs(bank):
    got = at((0, bank * 2048))(np.zeros((128, 4), np.float32))
    assert np.array_equal(np.asarray(got, dtype=np.float32), np.full((128, 1024), 2.0, np.float32))


@pytest.mark.parametrize("free", [1024, 3 * 1024, 6 * 1024 + 2])
def test_a_psum_tensor_inside_a_bank_is_refused(free):
    with pytest.raises(NkiError, match=rf"PSUM tensor '.*' must start at the beginning of a bank: free offset {free} "
                                       r"is not one of the 8 bank starts .*\[psum_address\]"):
        at((0, free), shape=(128, 256), dtype=nl.float32)(np.zeros((128, 4), np.float32))


def test_a_psum_address_past_the_eighth_bank_is_refused():
    with pytest.raises(NkiError, match=r"free offset 16384 is not one of the 8 bank starts"):
        at((0, 8 * 2048))(np.zeros((128, 4), np.float32))


def test_a_psum_address_over_the_partitions_is_refused():
    with pytest.raises(NkiError, match=r"partition offset 64 with 128 partitions exceeds the 128 partitions"):
        at((64, 0))(np.zeros((128, 4), np.float32))
    got = at((64, 0), shape=(64, 512), dtype=nl.float32)(np.zeros((128, 4), np.float32))
    assert np.array_equal(np.asarray(got), np.full((64, 512), 2.0, np.float32))


def test_a_psum_address_must_be_a_pair_of_integers():
    with pytest.raises(NkiError, match=r"must be a \(partition offset, free offset\) pair of integers"):
        at(2048)(np.zeros((128, 4), np.float32))
