"""Kernels whose tensors differ in dtype are valid in both NKI forms from one scheduled IR (found by the fuzzer):

  * a transpose that converts (X: bf16 -> Y: f32) with `method Y, dma`: NKI 0.6's dma_transpose does not cast
    (src.dtype == dst.dtype [ISA6 dma_transpose]), so the strip keeps X's dtype and the store's dma_copy converts;
  * a bf16/f16 column broadcast along the free dims is a tensor_scalar operand (or an activation scale/bias),
    which must be a float32 tile [ISA6 tensor_scalar]: the column's load converts it once per partition tile.

Each case runs in both forms, matches NumPy (the inputs rounded to their declared dtypes with ml_dtypes), gives
the same bits in both forms, and the same model latency."""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import tilec  # noqa: F401
from tilec.compiler.api import compile_file
from tilec.lang import api as lang
from tilec.perf.api import estimate
from kernel_numbers import numbered

NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}
NL = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def as_(x: np.ndarray, dt: str) -> np.ndarray:
    return np.asarray(x, np.float32).astype(NP[dt]).astype(np.float64)


def run_both(path, schedule=None):
    outs, latency, sources = {}, {}, {}
    for nki in ("0.6", "0.1"):
        c = compile_file(str(path), schedule=schedule, nki=nki)
        inputs = lang.random_inputs(c.program, seed=5)
        got, trace = c.run_traced(**inputs)
        outs[nki] = {k: np.asarray(v, np.float64) for k, v in got.items()}
        latency[nki] = estimate(trace).total_us
        sources[nki] = numbered(c.source)
    for name in outs["0.6"]:
        np.testing.assert_array_equal(outs["0.6"][name], outs["0.1"][name])  # one IR: the same bits
    assert latency["0.6"] == latency["0.1"]
    return inputs, outs["0.6"], sources["0.6"]


@pytest.mark.parametrize("src,dst", [("bf16", "f32"), ("f32", "bf16"), ("f16", "bf16"), ("f16", "f32")])
@pytest.mark.parametrize("method", ["dma", "pe"])
def test_dtype_converting_transpose(tmp_path, src, dst, method):
    tl = tmp_path / "tr.tl"
    tl.write_text(f"kernel tr(X: {src}[M, N]) -> Y\n  default M = 256, N = 384\n  Y: {dst}[N, M]\n"
                  f"  for i in 0..N, j in 0..M:\n    Y[i, j] = X[j, i]\n")
    inputs, out, source = run_both(tl, f"method Y, {method}\n")
    np.testing.assert_array_equal(out["Y"], as_(as_(inputs["X"], src).T, dst))  # a transpose rounds only once
    if method == "dma":
        assert "nisa.dma_transpose(dst=Y_strip" in source
        strip = re.search(r"Y_strip = nl.ndarray\(\([0-9, ]+\), dtype=nl.(\w+)", source)
        assert strip and strip.group(1) == NL[src]  # the strip keeps X's dtype; the store's dma_copy converts


@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_low_precision_broadcast_columns(tmp_path, dt):
    tl = tmp_path / "bc.tl"
    tl.write_text(f"kernel bc(A: {dt}[M, N], c: {dt}[M], d: {dt}[M]) -> Y\n  default M = 200, N = 300\n"
                  f"  Y: f32[M, N]\n  for i in 0..M, j in 0..N:\n    Y[i, j] = relu(A[i, j] - c[i]) * d[i]\n")
    inputs, out, source = run_both(tl)
    A, c, d = (as_(inputs[k], dt).astype(np.float32) for k in "Acd")
    want = np.maximum(A - c[:, None], np.float32(0)) * d[:, None]  # fp32 arithmetic, as the engines compute
    np.testing.assert_allclose(out["Y"], want, rtol=1e-6, atol=1e-6)
    assert "c_col = nl.ndarray((100, 1), dtype=nl.float32" in source  # the tensor_scalar operand is fp32


def test_low_precision_column_in_a_row_chain(tmp_path):
    """A bf16 column read by a fused row chain is an activation scale: fp32 too (the 0.1 form rejected it as well)."""
    tl = tmp_path / "ch.tl"
    tl.write_text("kernel ch(A: bf16[M, N], c: bf16[M]) -> Y\n  default M = 200, N = 96\n  s: bf16[M]\n"
                  "  Y: f32[M, N]\n  for i in 0..M:\n    s[i] = 0\n    for j in 0..N:\n      s[i] += A[i, j]\n"
                  "  for i in 0..M, j in 0..N:\n    Y[i, j] = A[i, j] * c[i] - s[i]\n")
    inputs, out, source = run_both(tl)
    assert "fused row chain" in source and "c_tile = nl.ndarray((100, 1), dtype=nl.float32" in source
    A, c = as_(inputs["A"], "bf16"), as_(inputs["c"], "bf16")
    want = A * c[:, None] - A.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out["Y"], want, rtol=1e-2, atol=1e-2 * np.abs(A).sum(axis=1).max())
