"""Every example, at random small sizes, agrees with a direct NumPy formulation written here independently
(conv by explicit sliding windows, pooling by reshape-max/mean: the semantics of torch conv2d / max_pool2d)."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilec.lang import api

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
FAST = settings(max_examples=10, deadline=None)


def run(example: str, sizes: dict[str, int], seed: int) -> tuple[dict, dict]:
    prog = api.load(EXAMPLES / f"{example}.tl", sizes)
    inputs = api.random_inputs(prog, seed)
    return inputs, api.evaluate(prog, inputs)


def conv_ref(X: np.ndarray, Wt: np.ndarray) -> np.ndarray:
    """Valid cross-correlation (torch conv2d, stride 1, no padding) from explicit sliding windows, in float64."""
    R = Wt.shape[2]
    windows = np.lib.stride_tricks.sliding_window_view(X.astype(np.float64), (R, R), axis=(2, 3))
    return np.einsum("ncyxrs,kcrs->nkyx", windows, Wt.astype(np.float64))


def maxpool2(x: np.ndarray) -> np.ndarray:
    n, k, h, w = x.shape
    return x.reshape(n, k, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def close(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape and a.dtype == np.float32
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


seeds = st.integers(0, 2**16)


@FAST
@given(L=st.integers(1, 300), seed=seeds)
def test_vector_add(L: int, seed: int) -> None:
    i, out = run("vector_add", {"L": L}, seed)
    np.testing.assert_array_equal(out["z"], i["x"] + i["y"])


@FAST
@given(M=st.integers(1, 40), N=st.integers(1, 40), seed=seeds)
def test_transpose(M: int, N: int, seed: int) -> None:
    i, out = run("transpose", {"M": M, "N": N}, seed)
    np.testing.assert_array_equal(out["Y"], i["X"].T)


@FAST
@given(M=st.integers(1, 20), K=st.integers(1, 20), N=st.integers(1, 20), seed=seeds)
def test_matmul(M: int, K: int, N: int, seed: int) -> None:
    i, out = run("matmul", {"M": M, "K": K, "N": N}, seed)
    close(out["C"], i["A"].astype(np.float64) @ i["B"].astype(np.float64))


conv_sizes = st.fixed_dictionaries({"N": st.integers(1, 2), "C": st.sampled_from([128]), "K": st.sampled_from([128]),
                                    "R": st.integers(1, 3), "Ho": st.integers(1, 4), "Wo": st.integers(1, 4)})


def _conv_defines(sz: dict[str, int], pool: int) -> dict[str, int]:
    return {"N": sz["N"], "C": sz["C"], "K": sz["K"], "R": sz["R"],
            "H": sz["R"] - 1 + pool * sz["Ho"], "W": sz["R"] - 1 + pool * sz["Wo"]}


@FAST
@given(sz=conv_sizes, seed=seeds)
def test_conv2d(sz: dict[str, int], seed: int) -> None:
    i, out = run("conv2d", _conv_defines(sz, 1), seed)
    close(out["Y"], conv_ref(i["X"], i["Wt"]))


@FAST
@given(sz=conv_sizes, seed=seeds)
def test_conv_bias_maxpool(sz: dict[str, int], seed: int) -> None:
    i, out = run("conv_bias_maxpool", _conv_defines(sz, 2), seed)
    close(out["Y"], maxpool2(conv_ref(i["X"], i["Wt"]) + i["b"][None, :, None, None]))


@FAST
@given(sz=conv_sizes, seed=seeds)
def test_conv_relu(sz: dict[str, int], seed: int) -> None:
    i, out = run("conv_relu", _conv_defines(sz, 2), seed)
    close(out["Y"], maxpool2(np.maximum(conv_ref(i["X"], i["Wt"]) + i["b"][None, :, None, None], 0)))


@FAST
@given(N=st.integers(1, 2), C=st.integers(1, 5), H2=st.integers(1, 6), W2=st.integers(1, 6), seed=seeds)
def test_avgpool(N: int, C: int, H2: int, W2: int, seed: int) -> None:
    i, out = run("avgpool", {"N": N, "C": C, "H": 2 * H2, "W": 2 * W2}, seed)
    close(out["Y"], i["X"].astype(np.float64).reshape(N, C, H2, 2, W2, 2).mean(axis=(3, 5)))


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.tl")), ids=lambda p: p.stem)
def test_example_checks_at_defaults_and_has_a_header(path: pathlib.Path) -> None:
    prog = api.load(path)
    assert prog.complete() and prog.kernel.comments, "defaults give every shape; a comment names the workload"
    assert set(prog.facts.symbols) == {d.name for d in prog.kernel.defaults}


def test_assignment_default_shapes() -> None:
    prog = api.load(EXAMPLES / "conv_bias_maxpool.tl")
    assert prog.tensors["X"].shape == (4, 256, 224, 224) and prog.tensors["Y"].shape == (4, 256, 111, 111)
    assert api.load(EXAMPLES / "matmul.tl").sizes == {"M": 512, "K": 1024, "N": 768}
    assert api.load(EXAMPLES / "vector_add.tl").sizes == {"L": 25600}


def test_sizes_bound_from_inputs() -> None:
    """Input arrays override defaults; -D must agree with them."""
    prog = api.load(EXAMPLES / "matmul.tl")
    rng = np.random.default_rng(3)
    A, B = rng.random((3, 5), dtype=np.float32), rng.random((5, 2), dtype=np.float32)
    out = api.evaluate(prog, {"A": A, "B": B})["C"]
    close(out, A.astype(np.float64) @ B)
    assert api.bind_inputs(prog, {"A": A, "B": B}).sizes == {"M": 3, "K": 5, "N": 2}
