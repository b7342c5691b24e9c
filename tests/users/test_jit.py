"""Kernels for any shape: tilec.jit compiles per input shape and dtype and caches; NumPy arrays and CPU torch
tensors; tilec.jit.bundle writes one @nki.jit module serving several shapes, dtypes and pool sizes (the course
harness's `fused_conv2d_maxpool(X, W, bias, pool_size)`). References are NumPy, written here."""
from __future__ import annotations

import importlib.util
import pathlib

import ml_dtypes
import numpy as np
import pytest

import tilec
from tilec.errors import TilecError
from tilec.jit import Case

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
COURSE = ROOT / "docs" / "course"
TOL = {np.float32: 1e-4, np.float16: 2e-2, ml_dtypes.bfloat16: 5e-2}


def conv_pool_reference(X: np.ndarray, W: np.ndarray, b: np.ndarray, pool: int) -> np.ndarray:
    """conv2d (stride 1, no padding) + bias + max pool (size = stride = pool), in float64."""
    X, W, b = (np.asarray(a, np.float64) for a in (X, W, b))
    n, _, h, w = X.shape
    k, _, r, _ = W.shape
    ho, wo = h - r + 1, w - r + 1
    out = np.zeros((n, k, ho, wo))
    for i in range(r):
        for j in range(r):
            out += np.einsum("nchw,kc->nkhw", X[:, :, i:i + ho, j:j + wo], W[:, :, i, j])
    out += b[None, :, None, None]
    return out.reshape(n, k, ho // pool, pool, wo // pool, pool).max(axis=(3, 5))


def close(got: np.ndarray, want: np.ndarray, dtype: type) -> bool:
    got = np.asarray(got, np.float64)
    return bool(np.abs(got - want).max() <= TOL[dtype] * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_one_function_many_shapes_compiled_once_each(dtype: type) -> None:
    matmul = tilec.jit(EXAMPLES / "matmul.tl")
    rng = np.random.default_rng(0)
    shapes = [(128, 128, 512), (256, 128, 384), (128, 256, 512), (128, 128, 512)]  # the last repeats the first
    for m, k, n in shapes:
        a = rng.standard_normal((m, k)).astype(dtype)
        b = rng.standard_normal((k, n)).astype(dtype)
        c = matmul(a, b)
        assert c.shape == (m, n) and c.dtype == np.dtype(dtype)
        assert close(c, a.astype(np.float64) @ b.astype(np.float64), dtype)
    assert len(matmul.cache) == 3  # the repeated shape came from the cache
    (compiled,) = [c for key, c in matmul.cache.items() if key[0] == ((256, 128), (128, 384))]
    assert "def matmul(" in compiled.source and f"nl.{np.dtype(dtype).name}" in compiled.source


def test_sizes_the_shapes_do_not_fix_and_mistakes() -> None:
    conv = tilec.jit(EXAMPLES / "conv2d.tl")
    x = np.random.default_rng(1).random((1, 128, 6, 10), dtype=np.float32)
    w = np.random.default_rng(2).random((128, 128, 3, 3), dtype=np.float32)
    assert close(conv(x, w), conv_pool_reference(x, w, np.zeros(128), 1), np.float32)
    with pytest.raises(TilecError, match="takes 2 arrays"):
        conv(x)
    with pytest.raises(TilecError, match="has 3 dimensions"):
        conv(x[0], w)


def test_torch_tensors_in_and_out() -> None:
    torch = pytest.importorskip("torch")
    add = tilec.jit(EXAMPLES / "vector_add.tl")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.arange(512, dtype=torch.float32).to(dtype)
        y = torch.full((512,), 0.5, dtype=torch.float32).to(dtype)
        z = add(x, y)
        assert isinstance(z, torch.Tensor) and z.dtype == dtype and z.shape == (512,)
        assert torch.equal(z, x + y)  # both round the exact sum once to the dtype
    conv = tilec.jit(COURSE / "conv_bias.tl")
    gen = torch.Generator().manual_seed(0)
    X, W, b = torch.rand(2, 128, 8, 6, generator=gen), torch.rand(128, 128, 3, 3, generator=gen), torch.rand(128)
    Y = conv(X, W, b)
    want = torch.nn.functional.conv2d(X.double(), W.double(), b.double())
    assert torch.allclose(Y.double(), want, rtol=1e-5, atol=1e-4)


def test_bundle_serves_the_course_harness_calls(tmp_path: pathlib.Path) -> None:
    """Batch 4 32x16 images, 128 -> 256 channels, pool 1 and 2, fp32 and fp16, through one kernel function."""
    sizes = {"N": 4, "C": 128, "K": 256, "H": 32, "W": 16}
    cases = [Case(str(COURSE / "conv_bias.tl") if pool == 1 else str(EXAMPLES / "conv_bias_maxpool.tl"), sizes,
                  dtype, {"pool_size": pool}) for dtype in ("f32", "f16") for pool in (1, 2)]
    source = tilec.jit.bundle("fused_conv2d_maxpool", ["X", "W", "bias", "pool_size"], cases, nki="0.1")
    assert source == tilec.jit.bundle("fused_conv2d_maxpool", ["X", "W", "bias", "pool_size"], cases, nki="0.1")
    path = tmp_path / "conv2d.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("harness_conv2d", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import neuronxcc.nki as nki

    rng = np.random.default_rng(42)
    for dtype in (np.float32, np.float16):
        X = rng.random((4, 128, 32, 16)).astype(dtype)
        W = rng.random((256, 128, 3, 3)).astype(dtype)
        bias = rng.random(256).astype(dtype)
        for pool in (1, 2):
            Y = nki.simulate_kernel(module.fused_conv2d_maxpool, X, W, bias, pool)
            assert Y.dtype == dtype and Y.shape == (4, 256, 30 // pool, 14 // pool)
            assert close(Y, conv_pool_reference(X, W, bias, pool), dtype)
    expected = (r"no specialised kernel for shapes \(\(1, 128, 32, 16\), \(256, 128, 3, 3\), \(256,\)\), "
                r"dtype float16, pool_size=3")
    with pytest.raises(AssertionError, match=expected):
        nki.simulate_kernel(module.fused_conv2d_maxpool, X[:1], W, bias, 3)


def test_on_a_trainium_host_the_kernel_is_called_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the real neuronxcc is installed, calling an @nki.jit kernel with NumPy arrays runs it on the device;
    here the interpreter's kernel stands in for it (called directly too), to check the arguments and outputs."""
    from tilec.nki import shim

    monkeypatch.setattr(shim, "active_backend", lambda: "neuronxcc")
    add = tilec.jit(EXAMPLES / "vector_add.tl")
    x, y = np.arange(256, dtype=np.float16), np.ones(256, np.float16)
    z = add(x, y)
    assert z.dtype == np.float16 and np.array_equal(z, x + y)
