"""A transposed read beside reads in the output's order (`Y[i, j] = 0.5 * (X[i, j] + X[j, i])`, `A[j, i] * s[i] +
B[i, j]`, `A[b, j, i] - c[i, j]`): one transpose pass, the other reads staged like the output's strip and combined
with the transposed block on its eviction (fn_chain.py, rules_transpose.py), checked against NumPy formulas."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
SYM = """kernel sym(X: DT[N, N]) -> Y
  default N = 136
  Y: DT[N, N]
  for i in 0..N, j in 0..N:
    Y[i, j] = 0.5 * (X[i, j] + X[j, i])
"""
TWO = """kernel two(A: DT[N, M], B: DT[M, N], s: DT[M]) -> Y
  default M = 200, N = 72
  Y: DT[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = A[j, i] * s[VEC] + B[i, j]
"""
BATCHED = """kernel bt(A: DT[B, N, M], c: DT[M, N]) -> Y
  default B = 3, M = 136, N = 72
  Y: DT[B, M, N]
  for b in 0..B, i in 0..M, j in 0..N:
    Y[b, i, j] = A[b, j, i] - c[i, j]
"""


def compiled(text: str, sizes=None, schedule: str | None = None, target: str | None = None, nki: str | None = None):
    directives = lang.parse_schedule(schedule, "<test>") if schedule is not None else None
    return compile_loaded(lang.load(text, sizes), directives, nki=nki, target=target)


def outputs(c, dtype: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Random inputs (as stored: rounded to the dtype, in float64) and the kernel's Y in float64."""
    given = {n: np.asarray(v, NP[dtype]) for n, v in lang.random_inputs(c.program, seed=5).items()}
    got = np.asarray(c.run(**given)["Y"], np.float64)
    return {n: v.astype(np.float64) for n, v in given.items()}, got


def check(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    """Computed in f32 and rounded once to the output's dtype: within one ulp of the output's dtype."""
    ulp = 2.0**-7 if dtype == "bf16" else 2.0**-22
    assert np.abs(got - want).max() <= ulp * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("options", [{}, {"target": "trn1"}, {"nki": "0.1"}, {"schedule": "method Y, dma"}])
def test_a_symmetric_part_is_one_transpose_pass(dtype, options):
    c = compiled(SYM.replace("DT", dtype), **options)
    assert "src X computing 0.5 * (X[i, j] + X[j, i])" in c.stages["select"] and "X_t" not in c.stages["select"]
    x, got = outputs(c, dtype)
    check(got, 0.5 * (x["X"] + x["X"].T), dtype)


def test_a_ragged_symmetric_part():
    """261 rows: blocks of 128, 128 and 5 (four regions), each staging its own tiles of X."""
    c = compiled(SYM.replace("DT", "f32"), {"N": 261})
    assert "ragged" in c.stages["schedule"] and "src X computing" in c.stages["select"]
    x, got = outputs(c, "f32")
    check(got, 0.5 * (x["X"] + x["X"].T), "f32")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_another_tensor_and_a_vector_over_the_results_partitions(dtype):
    c = compiled(TWO.replace("DT", dtype).replace("VEC", "i"))
    assert "src A computing" in c.stages["select"] and "A_t" not in c.stages["select"]
    a, got = outputs(c, dtype)
    check(got, a["A"].T * a["s"][:, None] + a["B"], dtype)


def test_a_vector_over_the_sources_partitions_permutes_first():
    """s[j] is a column of A's blocks (work before the transpose) while B is read after it: A through a temporary."""
    c = compiled(TWO.replace("DT", "f32").replace("VEC", "j").replace("s: f32[M]", "s: f32[N]"))
    assert "transpose A_t" in c.stages["select"]
    a, got = outputs(c, "f32")
    check(got, a["A"].T * a["s"][None, :] + a["B"], "f32")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_batched_transpose_with_a_tile_read_for_every_batch(dtype):
    c = compiled(BATCHED.replace("DT", dtype))
    assert "src A computing A[b, j, i] - c[i, j]" in c.stages["select"]
    a, got = outputs(c, dtype)
    check(got, a["A"].transpose(0, 2, 1) - a["c"][None], dtype)


NHWC_ADD = """kernel na(X: DT[N, C, H, W], Z: DT[N, H, W, C]) -> Y
  default N = 2, C = 64, H = 6, W = 10
  Y: DT[N, H, W, C]
  for n in 0..N, h in 0..H, w in 0..W, c in 0..C:
    Y[n, h, w, c] = X[n, c, h, w] * 2 + Z[n, h, w, c]
"""


@pytest.mark.parametrize("dtype,sizes", [("f32", None), ("bf16", None), ("f32", {"C": 130})])
def test_an_nchw_to_nhwc_permute_adds_a_tensor_in_the_outputs_layout(dtype, sizes):
    """A permute through views (X as [N, C, H*W], Y and Z as [N, H*W, C]) with Z staged like Y's strip."""
    c = compiled(NHWC_ADD.replace("DT", dtype), sizes)
    assert "src X computing X[n, c, h, w] * 2 + Z[n, h, w, c]" in c.stages["select"]
    a, got = outputs(c, dtype)
    check(got, a["X"].transpose(0, 2, 3, 1) * 2 + a["Z"], dtype)


ROT = """kernel rot(X: f32[N, N, N]) -> Y
  default N = 16
  Y: f32[N, N, N]
  for i in 0..N, j in 0..N, k in 0..N:
    Y[i, j, k] = X[i, j, k] + X[j, k, i]
"""
TWO_BATCH = """kernel bb(X: f32[A, B, N, N], c: f32[N, N]) -> Y
  default A = 2, B = 3, N = 72
  Y: f32[A, B, N, N]
  for a in 0..A, b in 0..B, i in 0..N, j in 0..N:
    Y[a, b, i, j] = X[a, b, i, j] - X[a, b, j, i] * c[i, j]
"""


def test_a_rotation_beside_its_source_keeps_the_temporary():
    """X[j, k, i] swaps a run of two dimensions: no one view of X shows it and X[i, j, k], so X is permuted first."""
    c = compiled(ROT)
    assert "X_t" in c.stages["select"]
    a, got = outputs(c, "f32")
    check(got, a["X"] + a["X"].transpose(2, 0, 1), "f32")


def test_two_batch_loops_around_a_source_read_twice():
    c = compiled(TWO_BATCH)
    assert "src X computing" in c.stages["select"]
    a, got = outputs(c, "f32")
    check(got, a["X"] - a["X"].transpose(0, 1, 3, 2) * a["c"], "f32")
