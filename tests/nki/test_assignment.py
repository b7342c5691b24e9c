"""The assignment's kernels (benchmarks/kernels, written from the README, source unchanged) run on the interpreter
and checked against NumPy in fp32, fp16 and bf16."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tilec.nki import api, rules

from nki_testutil import KERNELS, error_of, first_line, kernel

F32 = np.float32
DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


def rand(shape: tuple, dtype: object, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(shape, dtype=np.float32).astype(dtype)


def engine_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # VectorE adds in fp32 and rounds once to the tile dtype: for one add that is the exact fp32 sum rounded,
    # so the comparison below is exact equality, in every dtype.
    return (a.astype(F32) + b.astype(F32)).astype(a.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,n", [("vector_add_naive", 128), ("vector_add_tiled", 512),
                                    ("vector_add_tiled_128", 2048), ("vector_add_stream", 2560),
                                    ("vector_add_stream_200", 25600)])
def test_vector_add(name: str, n: int, dtype: object) -> None:
    a, b = rand((n,), dtype, 1), rand((n,), dtype, 2)
    out = kernel("asst.py", name)(a, b)
    assert out.dtype == np.dtype(dtype) and out.shape == (n,)
    np.testing.assert_array_equal(out.astype(F32), engine_add(a, b).astype(F32))


@pytest.mark.parametrize("name", ["vector_add_stream_1000", "vector_add_stream_2000"])
def test_vector_add_stream_profiled_sizes(name: str) -> None:
    a, b = rand((256000,), F32, 3), rand((256000,), F32, 4)
    out, trace = api.simulate_traced(kernel("asst.py", name), a, b)
    np.testing.assert_array_equal(out, a + b)
    # calibration rows 6 and 7: 3 DMA transfers at FREE_DIM=2000, 6 at FREE_DIM=1000
    expected = {"vector_add_stream_2000": 3, "vector_add_stream_1000": 6}[name]
    assert sum(i.op == "dma_copy" for i in trace.instrs) == expected


def test_vector_add_tiled_256_fails_with_partition_error() -> None:
    a, b = rand((25600,), F32, 1), rand((25600,), F32, 2)
    err = error_of(kernel("asst.py", "vector_add_tiled_256"), a, b)
    assert isinstance(err, SyntaxError) and isinstance(err, rules.NkiSyntaxError)
    lines = (KERNELS / "asst.py").read_text().splitlines()
    start = lines.index("def vector_add_tiled_256(a_vec, b_vec):")
    line = next(i + 1 for i in range(start, len(lines)) if lines[i].strip().startswith("a_tile = nl.ndarray("))
    assert first_line(err) == (f"{KERNELS / 'asst.py'}:{line}: error: number of partitions 256 exceed architecture "
                               "limitation of 128 [err_num_partition_exceed_arch_limit]")
    assert str(err).splitlines()[1] == "  tile 'a_tile' of shape (256, 1) in sbuf"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(128, 128), (256, 384), (384, 128)])
def test_matrix_transpose(shape: tuple, dtype: object) -> None:
    x = rand(shape, dtype, 5)
    out = kernel("asst.py", "matrix_transpose")(x)
    # a transpose moves bits: exact in every dtype
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out.view(np.uint8), np.ascontiguousarray(x.T).view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_tiled(dtype: object) -> None:
    k, m, n = 256, 256, 1024
    lhsT, rhs = rand((k, m), dtype, 6), rand((k, n), dtype, 7)
    result = np.zeros((m, n), dtype=dtype)
    assert kernel("asst.py", "nki_matmul_tiled_")(lhsT, rhs, result) is None  # writes its `result` argument
    ref = lhsT.astype(np.float64).T @ rhs.astype(np.float64)
    # Products of the (already rounded) inputs are exact in fp32 and 256 terms of size < 1 accumulate in fp32
    # with relative error << 1e-5; the only large error is the final rounding to the output dtype: half an ulp,
    # i.e. relative 2^-24 (fp32), 2^-11 (fp16), 2^-8 (bf16).
    rtol = {np.float32: 1e-5, np.float16: 2.0**-11, ml_dtypes.bfloat16: 2.0**-8}[dtype]
    np.testing.assert_allclose(result.astype(np.float64), ref, rtol=rtol, atol=0)
