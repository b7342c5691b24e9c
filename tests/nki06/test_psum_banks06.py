"""NKI 0.6's PSUM tile limit (v2.32.0 get-started/about/tiling-overview.rst TC#2: the F dimension of a PSUM tile is
at most psum_bank_fmax == 512, "per PSUM bank per partition, in FP32 elements"; migration/index.rst allocates a
(128, 1024) bf16 PSUM tensor in one bank): 2 KiB per partition whatever the dtype, free dimensions multiplied."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401  (serves `import nki`)
import nki
import nki.isa as nisa
import nki.language as nl
from tilec.nki.rules import NkiError


def zero_psum(shape, dtype, value=0.0, address=None):
    """A kernel setting a PSUM tile (at `address`, NKI 0.6's placement, if given) to `value` and returning it."""
    @nki.jit
    def k(a):
        t = nl.ndarray(shape, dtype=dtype, buffer=nl.psum, address=address)
        nisa.memset(dst=t, value=value)
        s = nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=t)
        out = nl.ndarray(shape, dtype=dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=s)
        return out
    return k


@pytest.mark.parametrize("shape, dtype", [((128, 512), nl.float32), ((128, 1024), nl.bfloat16),
                                          ((128, 2, 256), nl.float32)])
def test_a_psum_tile_of_one_bank_is_accepted(shape, dtype):
    got = zero_psum(shape, dtype)(np.zeros((128, 4), np.float32))
    assert got.shape == shape and not np.any(np.asarray(got, dtype=np.float32))


@pytest.mark.parametrize("shape, dtype", [((128, 1024), nl.float32), ((128, 2, 512), nl.float32),
                                          ((128, 2048), nl.bfloat16)])
def test_a_psum_tile_over_one_bank_is_refused(shape, dtype):
    with pytest.raises(NkiError, match=r"PSUM tile needs 4096 bytes per partition, more than one 2048-byte PSUM "
                                       r"bank \[psum_tile_exceeds_bank\]"):
        zero_psum(shape, dtype)(np.zeros((128, 4), np.float32))
