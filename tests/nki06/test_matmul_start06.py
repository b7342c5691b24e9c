"""A PSUM tile reused for a new sum (dw17): on NKI 0.6 `nc_matmul(..., accumulate=False)` overwrites whatever the
tile holds, a matmul's earlier sum or a VectorE write ("the first nc_matmul instruction overwrites the destination
PSUM bank", v2.26.1 nki/arch trainium_inferentia2_arch.rst; ISA6 nc_matmul accumulate=), and accumulate=True adds to
it. The interpreter must compute that: checked against NumPy on a dirty tile."""
from __future__ import annotations

import numpy as np

import tilec  # noqa: F401  (serves `import nki`)
import nki
import nki.isa as nisa
import nki.language as nl

from test_isa06 import out_of, psum_to_sbuf, rand, sbuf_of


def test_an_overwriting_matmul_on_a_dirty_psum_tile_gives_the_product_and_an_accumulating_one_the_sum():
    @nki.jit
    def k(a, b, c):
        acc = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(b), accumulate=False)  # the first sum
        first = psum_to_sbuf(acc)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(c), accumulate=False)  # a new sum over it
        second = psum_to_sbuf(acc)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(b), accumulate=True)  # added to the new sum
        third = psum_to_sbuf(acc)
        return out_of(first), out_of(second), out_of(third)
    a, b, c = rand(128, 64), rand(128, 128), rand(128, 128)
    first, second, third = k(a, b, c)
    ab, ac = a.T.astype(np.float64) @ b, a.T.astype(np.float64) @ c
    np.testing.assert_allclose(first, ab, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(second, ac, rtol=1e-4, atol=1e-3)  # not ab + ac: the old sum is gone
    np.testing.assert_allclose(third, ac + ab, rtol=1e-4, atol=1e-3)
    assert [i.accumulate for i in k.last_trace.instrs if i.op == "nc_matmul"] == [False, False, True]


def test_an_overwriting_matmul_over_a_vector_engine_write_then_accumulates():
    """A depthwise sum's VectorE adds leave the tile written by a non-matmul instruction; the next sum's first matmul
    overwrites it, after which accumulating is defined again."""
    @nki.jit
    def k(a, b, c):
        acc = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.memset(dst=acc, value=7.0)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(b), accumulate=False)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(c), accumulate=True)
        return out_of(psum_to_sbuf(acc))
    a, b, c = rand(128, 64), rand(128, 128), rand(128, 128)
    np.testing.assert_allclose(k(a, b, c), a.T.astype(np.float64) @ (b + c.astype(np.float64)), rtol=1e-4,
                               atol=1e-3)


def test_an_overwrite_of_part_of_a_tile_keeps_the_rest():
    @nki.jit
    def k(a, b, c):
        acc = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=sbuf_of(a), moving=sbuf_of(b), accumulate=False)
        nisa.nc_matmul(dst=acc[:, 0:32], stationary=sbuf_of(a), moving=sbuf_of(c), accumulate=False)
        return out_of(psum_to_sbuf(acc))
    a, b, c = rand(128, 64), rand(128, 128), rand(128, 32)
    want = a.T.astype(np.float64) @ b
    want[:, 0:32] = a.T.astype(np.float64) @ c
    np.testing.assert_allclose(k(a, b, c), want, rtol=1e-4, atol=1e-3)
