"""nc_matmul's ones/zeros hints (ISA1/ISA6 nc_matmul: `is_stationary_onezero` / `is_moving_onezero` "could lead to
2x better performance if [the operand] is in float32"): the interpreter computes the product as without the hint
and refuses an operand that is not all ones and zeros; the model charges an fp32 matmul carrying the hint half the
fp32 factor (the documented upper bound), a 16-bit one nothing less. References are NumPy products."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401  (serves `import nki`)
import nki
import nki.isa as nisa
import nki.language as nl
from test_isa06 import sbuf_of
from tilec.nki.rules import NkiError
from tilec.perf.api import estimate
from tilec.perf.params import TRN2

RNG = np.random.default_rng(20)


def column_sums(flag: str):
    """ones[K, K].T @ x with the hint on `flag` ("stationary", "moving" or ""), and the same without it."""
    @nki.jit
    def k(ones, x):
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
        s, m = sbuf_of(ones), sbuf_of(x)
        if flag == "moving":
            nisa.nc_matmul(dst=acc, stationary=m, moving=s, is_moving_onezero=True)
        else:
            nisa.nc_matmul(dst=acc, stationary=s, moving=m, is_stationary_onezero=flag == "stationary")
        t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=acc)
        nisa.dma_copy(dst=out, src=t)
        return out
    return k


@pytest.mark.parametrize("flag", ["stationary", "moving"])
def test_the_hint_keeps_the_product(flag):
    ones = np.ones((128, 128), np.float32)
    x = RNG.standard_normal((128, 128)).astype(np.float32)
    got = column_sums(flag)(ones, x)
    want = ones.T @ x if flag == "stationary" else x.T @ ones
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("flag", ["stationary", "moving"])
def test_a_broken_promise_is_refused(flag):
    ones = np.ones((128, 128), np.float32)
    ones[5, 7] = 0.5
    with pytest.raises(NkiError, match=rf"is_{flag}_onezero=True\) needs {flag} to hold only 0 and 1: element"):
        column_sums(flag)(ones, RNG.standard_normal((128, 128)).astype(np.float32))


@pytest.mark.parametrize("dtype", [np.float32, nl.bfloat16])
def test_the_model_halves_an_fp32_matmul_only(dtype):
    ones = np.ones((128, 128), dtype)
    x = RNG.standard_normal((128, 256)).astype(dtype)
    busy = {}
    for flag in ("stationary", ""):
        k = column_sums(flag)
        k(ones, x)
        sched = estimate(k.last_trace, target="trn2")
        busy[flag] = [e.end_ns - e.start_ns for e in sched.timeline if e.lane == "tensor"]
    cycles = (256 + TRN2.mm_fixed_cycles.value) / TRN2.tensor_ghz.value
    fp32 = TRN2.mm_fp32_factor.value if dtype == np.float32 else 1.0
    speedup = TRN2.onezero_fp32_speedup.value if dtype == np.float32 else 1.0
    assert busy[""] == pytest.approx([cycles * fp32], rel=1e-9)
    assert busy["stationary"] == pytest.approx([cycles * fp32 / speedup], rel=1e-9)
    assert TRN2.onezero_fp32_speedup.value == 2
