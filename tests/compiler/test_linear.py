"""The linear layer: a matmul whose initial value is a bias along the output's columns, C[i, j] = b[j] + sum_k ...
(examples/linear.tl, with relu). The bias row is copied to every partition once, before the nest, and added on PSUM
eviction; other bias shapes are golden errors that say what is supported."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import check_against_reference, compile_example, inputs_for
from tilec.compiler.api import compile_loaded
from tilec.compiler.ops import ConvOp
from tilec.compiler.pipeline import compile_program
from tilec.errors import TilecError
from tilec.lang import api as lang

LINEAR = """\
kernel lin(A: f32[M, K], B: f32[K, N], b: f32[N]) -> C
  default M = 256, K = 512, N = 384
  C: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = b[j]
    for k in 0..K:
      C[i, j] += A[i, k] * B[k, j]
"""


def _numpy_linear(inputs: dict[str, np.ndarray], relu: bool) -> np.ndarray:
    """Independent of the reference evaluator too: X @ W + b in float64."""
    x, w, b = (inputs[n].astype(np.float64) for n in ("X", "W", "b"))
    out = x @ w + b[None, :]
    return np.maximum(out, 0.0) if relu else out


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_linear_relu_example_matches_reference(dtype):
    c = compile_example("linear", dtype=dtype)
    check_against_reference(c)
    np_dtype = {"f32": np.float32, "f16": np.float16}[dtype]
    inputs = {k: (v - 0.5).astype(np_dtype) for k, v in inputs_for(c.program, 7).items()}  # signed: relu clips
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    want = _numpy_linear(inputs, relu=True)
    assert (want == 0).mean() > 0.2  # the relu matters in this check
    tol = {"f32": (1e-5, 1e-4), "f16": (4e-3, 2e-2)}[dtype]
    assert np.allclose(got, want, rtol=tol[0], atol=tol[1]), np.abs(got - want).max()


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_linear_at_sizes_not_multiple_of_128(dtype):
    c = compile_example("linear", dict(M=200, K=300, N=300), dtype)
    assert "TILE_I = 100" in c.source
    check_against_reference(c)


def test_bias_row_selected_and_relu_fused():
    c = compile_example("linear")
    conv, = [op for op in compile_program(c.program).ops if isinstance(op, ConvOp)]
    assert (conv.bias, conv.bias_role, conv.relu, conv.out) == ("b", "x", True, "Y")
    assert "bias b (a row along j)" in c.stages["select"] and "epilogue relu  (fused Y)" in c.stages["select"]


def test_bias_is_broadcast_once_outside_the_nest_and_added_on_eviction():
    """One ones-row matmul (at the kernel's top level, not per output tile), then per output tile one
    tensor_tensor add reading PSUM and one relu; the accumulation itself has only the real contraction tiles."""
    src = compile_example("linear").source
    bcast = re.findall(r"^( *)\w+ \+= nisa\.nc_matmul\(ones_f32, b_row", src, re.M)
    assert bcast == ["    "]  # kernel body level: outside every loop
    assert re.search(r"= nisa\.tensor_tensor\(H_acc, b_bc\b.*op=nl\.add.*# tl:10$", src, re.M)
    assert re.search(r"= nisa\.activation\(op=nl\.relu, data=(\w+), .*# tl:14$", src, re.M)
    assert src.count("nisa.nc_matmul(") == 2  # the broadcast and the accumulation


def test_linear_without_relu_and_its_trace_has_one_broadcast_matmul():
    c = compile_loaded(lang.load(LINEAR))
    trace = check_against_reference(c, traced=True)
    matmuls = [i for i in trace.instrs if i.op == "nc_matmul"]
    # 2 row tiles x 4 contraction tiles (j in one tile of 384) + the one broadcast of b
    assert len(matmuls) == 2 * 4 + 1
    assert "relu" not in c.source


POOLED = """\
kernel lin_pool(A: f32[M, K], B: f32[K, N], b: f32[N]) -> Y
  default M = 128, K = 256, N = 192
  C: f32[M, N]
  Y: f32[M / 2, N / 2]
  for i in 0..M, j in 0..N:
    C[i, j] = b[j]
    for k in 0..K:
      C[i, j] += A[i, k] * B[k, j]
  for i in 0..M / 2, j in 0..N / 2:
    Y[i, j] = -inf
    for p in 0..2, q in 0..2:
      Y[i, j] max= C[2*i + p, 2*j + q]
"""


def test_pool_after_a_linear_layer_is_not_fused_into_its_rows():
    """A matmul's rows are its output partitions: a 2x2 pool cannot run on its PSUM tiles, so it reads C back
    (it once reached the IR verifier as an internal error)."""
    c = compile_loaded(lang.load(POOLED))
    assert "pool" in c.stages["select"] and "fused" not in c.stages["select"]
    check_against_reference(c)


SCHEDULES = {
    "narrow_tiles_in_column_bands": "tile H.j, 64\nsplit H.j, 128\n",
    "small_row_tiles_weights_per_tile": "tile H.i, 64\ntile H.j, 128\ntile H.k, 64\nhoist X, H.i\n",
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_linear_under_schedules(name, dtype):
    c = compile_example("linear", dict(N=256), dtype, schedule=SCHEDULES[name])
    check_against_reference(c)


def test_linear_compiles_to_the_same_bytes():
    a, b = compile_example("linear"), compile_example("linear")
    assert a.source == b.source and a.stages == b.stages


REJECTED = {
    "bias_columns_of_a_conv": """\
kernel c1(X: f32[C, H], Wt: f32[K, C, R], b: f32[Ho]) -> Y
  default C = 128, H = 66, K = 128, R = 3
  let Ho = H - R + 1
  Y: f32[K, Ho]
  for k in 0..K, y in 0..Ho:
    Y[k, y] = b[y]
    for c in 0..C, r in 0..R:
      Y[k, y] += X[c, y + r] * Wt[k, c, r]
""",
    "bias_scaled_row": """\
kernel mm3(A: f32[M, K], B: f32[K, N], b: f32[N]) -> C
  default M = 128, K = 256, N = 128
  C: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = 2 * b[j]
    for k in 0..K:
      C[i, j] += A[i, k] * B[k, j]
""",
}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_unsupported_bias_shapes_are_clear_errors(name, golden):
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load(REJECTED[name]))
    assert err.value.span is not None and "bias" in err.value.message
    golden.check(f"compiler/errors/select_{name}.txt", err.value.render() + "\n")
