"""NKI 0.6: accumulating (nc_matmul accumulate=True) onto PSUM that a non-matmul write holds is undefined behaviour on
NeuronCore-v2/v3 [ISA6 nc_matmul accumulate=]. The interpreter's "last written by a matmul" flags must follow every
write, not only the nisa.* instructions' own: a tile assignment or a `+=` update into PSUM ends the matmul's claim,
and an overwriting matmul restores it (dw18)."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401  (serves `import nki`)
import nki
import nki.isa as nisa
import nki.language as nl
from tilec.nki.rules import NkiError

from test_isa06 import out_of, psum_to_sbuf, rand, sbuf_of


def _chain(write):
    """A matmul sum, `write` onto the tile, then a matmul accumulating onto it."""
    @nki.jit
    def k(a, b):
        acc = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(b), accumulate=False)
        write(acc, b)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(b), accumulate=True)
        return out_of(psum_to_sbuf(acc))
    return k


def _assign(acc, b):
    acc[...] = sbuf_of(b)[0:64, :]


def _add(acc, b):
    acc[...] += sbuf_of(b)[0:64, :]


def _assign_part(acc, b):
    acc[:, 0:32] = sbuf_of(b)[0:64, 0:32]


def _vector_add(acc, b):
    nisa.tensor_tensor(dst=acc, data1=acc, data2=sbuf_of(b)[0:64, :], op=nl.add)


@pytest.mark.parametrize("write", [_assign, _add, _assign_part, _vector_add])
def test_accumulating_onto_psum_a_non_matmul_write_holds_is_undefined(write):
    with pytest.raises(NkiError, match="value-initialized by a non-matmul instruction") as err:
        _chain(write)(rand(128, 64), rand(128, 128))
    assert "matmul_accumulate_non_matmul_init" in str(err.value)
    assert "test_psum_flags06.py" in str(err.value)  # located at the accumulating matmul


def test_an_overwriting_matmul_after_the_write_makes_accumulating_defined_again():
    @nki.jit
    def k(a, b, c):
        acc = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(b), accumulate=False)
        acc[...] += sbuf_of(c)[0:64, :]
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(c), accumulate=False)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(b), accumulate=True)
        return out_of(psum_to_sbuf(acc))
    a, b, c = rand(128, 64), rand(128, 128), rand(128, 128)
    want = a.T.astype(np.float64) @ (b.astype(np.float64) + c)
    np.testing.assert_allclose(k(a, b, c), want, rtol=1e-4, atol=1e-3)


def test_a_write_elsewhere_in_the_tile_leaves_the_matmul_region_accumulable():
    @nki.jit
    def k(a, b):
        acc = nl.ndarray((64, 256), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc[:, 0:128], stationary=sbuf_of(a), moving=sbuf_of(b), accumulate=False)
        nisa.memset(dst=acc[:, 128:256], value=1.0)
        nisa.nc_matmul(dst=acc[:, 0:128], stationary=sbuf_of(a), moving=sbuf_of(b), accumulate=True)
        return out_of(psum_to_sbuf(acc))
    a, b = rand(128, 64), rand(128, 128)
    got = k(a, b)
    np.testing.assert_allclose(got[:, 0:128], 2 * (a.T.astype(np.float64) @ b), rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(got[:, 128:256], np.ones((64, 128), np.float32))
