"""A PSUM tile reused for a new sum (dw17), NKI 0.1: `acc[...] = nisa.nc_matmul(..)` writes the product over whatever
the tile holds (an assignment: a matmul that opens its own accumulation group, "the first nc_matmul instruction
overwrites the destination PSUM bank", v2.26.1 nki/arch/trainium_inferentia2_arch.rst; the form AWS's kernels use for
PSUM tiles, e.g. nki/api/nki/compiler/psum.py `psum[i_block, :, :] = nisa.nc_matmul(...)`), and `acc += ...` adds to
it. Checked against NumPy on a dirty tile."""
from __future__ import annotations

import numpy as np

import tilec  # noqa: F401  (installs the neuronxcc shim)
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from tilec.nki import api

RNG = np.random.default_rng(17)


@nki.jit
def reuse(a, b, c):
    """acc = a.T @ b; then a new sum over it: acc = a.T @ c; then acc += a.T @ b; each state copied out."""
    out = nl.ndarray((3, 64, 128), dtype=nl.float32, buffer=nl.shared_hbm)
    at, bt, ct = nl.load(a), nl.load(b), nl.load(c)
    acc = nl.zeros((64, 128), dtype=nl.float32, buffer=nl.psum)
    acc += nisa.nc_matmul(at, bt)
    s = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.sbuf)
    s[...] = nisa.tensor_copy(acc)
    nl.store(out[0], s)
    acc[...] = nisa.nc_matmul(at, ct)
    s2 = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.sbuf)
    s2[...] = nisa.tensor_copy(acc)
    nl.store(out[1], s2)
    acc += nisa.nc_matmul(at, bt)
    s3 = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.sbuf)
    s3[...] = nisa.tensor_copy(acc)
    nl.store(out[2], s3)
    return out


@nki.jit
def uninitialised_start(a, b):
    """An uninitialised PSUM tile (nl.ndarray) whose first matmul is an assignment, then one that adds."""
    out = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.shared_hbm)
    at, bt = nl.load(a), nl.load(b)
    acc = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.psum)
    acc[...] = nisa.nc_matmul(at, bt)
    acc += nisa.nc_matmul(at, bt)
    s = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.sbuf)
    s[...] = nisa.tensor_copy(acc)
    nl.store(out, s)
    return out


def test_an_assigned_matmul_on_a_dirty_psum_tile_overwrites_and_a_plus_equal_one_adds():
    a = RNG.standard_normal((128, 64)).astype(np.float32)
    b = RNG.standard_normal((128, 128)).astype(np.float32)
    c = RNG.standard_normal((128, 128)).astype(np.float32)
    got = api.simulate(reuse, a, b, c)
    ab, ac = a.T.astype(np.float64) @ b, a.T.astype(np.float64) @ c
    np.testing.assert_allclose(got[0], ab, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got[1], ac, rtol=1e-4, atol=1e-3)  # not ab + ac: the old sum is gone
    np.testing.assert_allclose(got[2], ac + ab, rtol=1e-4, atol=1e-3)


def test_an_assigned_matmul_starts_a_sum_in_an_uninitialised_tile():
    a = RNG.standard_normal((128, 64)).astype(np.float32)
    b = RNG.standard_normal((128, 128)).astype(np.float32)
    np.testing.assert_allclose(api.simulate(uninitialised_start, a, b), 2 * (a.T.astype(np.float64) @ b), rtol=1e-4,
                               atol=1e-3)
