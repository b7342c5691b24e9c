"""Hand-written NKI 0.6 kernels of the tutorial kind (kernels06.py) run unmodified on tilec's interpreter and match
NumPy: a tiled matmul with accumulate=, the hoisted one with inferred accumulation, a conv whose moving operands are
3-D windows, a fused conv + bias + relu + 2x2 max pool, and a reduction over trailing free axes."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401  (serves `import nki` from the interpreter)
import nki
import kernels06 as k06

RNG = np.random.default_rng(6)


def _conv(X, Wt):
    C, H, W = X.shape
    _, K, R, _ = Wt.shape
    out = np.zeros((K, H - R + 1, W - R + 1), np.float64)
    for r in range(R):
        for s in range(R):
            out += np.einsum("ck,cyx->kyx", Wt[:, :, r, s], X[:, r:r + H - R + 1, s:s + W - R + 1])
    return out


@pytest.mark.parametrize("kernel", [k06.matmul_accumulate, k06.matmul_hoisted], ids=lambda k: k.__name__)
def test_matmul_kernels_match_numpy(kernel):
    lhsT = RNG.standard_normal((256, 256), np.float32)
    rhs = RNG.standard_normal((256, 1024), np.float32)
    got = kernel(lhsT, rhs)  # standalone: called with NumPy arrays
    np.testing.assert_allclose(got, lhsT.T.astype(np.float64) @ rhs, rtol=1e-4, atol=1e-3)


def test_matmul_through_nki_simulate_and_its_trace():
    lhsT = RNG.standard_normal((256, 128), np.float32)
    rhs = RNG.standard_normal((256, 512), np.float32)
    got = nki.simulate(k06.matmul_accumulate)(lhsT, rhs)
    np.testing.assert_allclose(got, lhsT.T.astype(np.float64) @ rhs, rtol=1e-4, atol=1e-3)
    matmuls = [i for i in k06.matmul_accumulate.last_trace.instrs if i.op == "nc_matmul"]
    assert [i.accumulate for i in matmuls] == [False, True]  # the unrolled chain: overwrite, then add


def test_conv_with_3d_moving_operands_matches_numpy():
    X = RNG.standard_normal((128, 10, 12), np.float32)
    Wt = RNG.standard_normal((128, 128, 3, 3), np.float32)
    got = k06.conv2d(X, Wt)
    np.testing.assert_allclose(got, _conv(X, Wt), rtol=1e-4, atol=1e-2)
    moving = [i.reads[1] for i in k06.conv2d.last_trace.instrs if i.op == "nc_matmul"]
    assert len(moving) == 4 * 9


def test_fused_bias_relu_pool_matches_numpy():
    X = RNG.standard_normal((128, 10, 14), np.float32)
    Wt = RNG.standard_normal((128, 128, 3, 3), np.float32) * 0.1
    b = RNG.standard_normal(128).astype(np.float32)
    got = k06.conv_bias_relu_pool(X, Wt, b)
    act = np.maximum(_conv(X, Wt) + b[:, None, None], 0)
    want = act.reshape(128, 4, 2, 6, 2).max(axis=(2, 4))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    ops = [i.op for i in k06.conv_bias_relu_pool.last_trace.instrs]
    assert ops.count("activation") == 4 and ops.count("tensor_tensor") == 8


def test_reduce_over_trailing_free_axes():
    A = RNG.standard_normal((128, 4, 64), np.float32)
    np.testing.assert_allclose(k06.block_sums(A)[:, 0], A.sum(axis=(1, 2)), rtol=1e-4, atol=1e-4)
