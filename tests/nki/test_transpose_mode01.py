"""NKI 0.1's spelling of TensorE transpose mode: `psum[...] = nisa.nc_matmul(data, identity, is_transpose=True)`
(AWS's 2.26 attention kernels transpose v so, with is_moving_onezero=True). The result is a PSUM tile of fp32
(ISA1: matmul "results are always in float32"); on trn2 its values are the input's, bit for bit (ARCH3)."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401  (installs the neuronxcc shim)
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from tilec.nki import api
from tilec.nki.rules import NkiError

RNG = np.random.default_rng(29)


@nki.jit
def _transpose(a, eye):
    out = nl.ndarray((a.shape[1], a.shape[0]), a.dtype, buffer=nl.shared_hbm)
    tp = nl.ndarray((a.shape[1], a.shape[0]), nl.float32, buffer=nl.psum)
    tp[...] = nisa.nc_matmul(nl.load(a), nl.load(eye), is_transpose=True, is_moving_onezero=True)
    nl.store(out, nisa.tensor_copy(tp, dtype=a.dtype))
    return out


@pytest.mark.parametrize("dtype", [np.float32, nl.bfloat16])
def test_is_transpose_keeps_every_bit_on_trn2(dtype):
    a = RNG.standard_normal((128, 80)).astype(dtype)
    a[1, 2], a[50, 3], a[7, 7] = np.nan, -np.inf, -0.0
    eye = np.eye(128, dtype=dtype)
    got, trace = api.simulate_traced(_transpose, a, eye)
    np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(a.T).view(np.uint8))
    mm = [i for i in trace.instrs if i.op == "nc_matmul"]
    assert [i.attr("is_transpose") for i in mm] == [True] and mm[0].out_dtype == "float32"


def test_is_transpose_checks_its_identity_and_the_double_row_mode():
    a = RNG.standard_normal((128, 80)).astype(np.float32)
    eye = np.eye(128, dtype=np.float32)
    eye[4, 4] = 2.0
    with pytest.raises(NkiError, match=r"identity matrix: element \[4, 4\] is 2.0"):
        api.simulate(_transpose, a, eye)

    @nki.jit(platform_target="trn2")
    def double(s, m):
        out = nl.ndarray((8, 8), np.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(nisa.nc_matmul(nl.load(s), nl.load(m), is_transpose=True,
                                             perf_mode="double_row_gen3")))
        return out
    f8 = np.zeros((128, 2, 8), dtype=nl.float8_e5m2)
    with pytest.raises(NkiError, match="cannot be combined with transpose mode"):
        api.simulate(double, f8, f8)
