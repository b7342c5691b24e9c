"""An element-wise read at the constant 0 of a dimension of one element (`Y[i, j] = f(A[i, 0, j])`, a squeezed
torch dimension; gaps11's "Left"): selected without that index, the operand read through an HBM view of its own
dimensions (the same elements). Checked on the interpreter against NumPy formulas in float64, both dialects."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang


def _run(src: str, dtype: str, nki: str, seed: int = 5):
    prog = lang.load(src.replace("f32", dtype))
    c = compile_loaded(prog, nki=nki)
    rng = np.random.default_rng(seed)
    x = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5) * 4 for t in prog.inputs}
    if dtype == "f16":
        x = {k: v.astype(np.float16) for k, v in x.items()}
    if dtype == "bf16":
        x = {k: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in x.items()}
    return prog, c, c.run(**x), {k: np.asarray(v, np.float64) for k, v in x.items()}


MIDDLE = """\
kernel u(A: f32[N, 1, M], B: f32[N, M]) -> Y
  default N = {N}, M = {M}
  Y: f32[N, M]
  for i in 0..N, j in 0..M:
    Y[i, j] = exp(A[i, 0, j]) + B[i, j]
"""


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("N, M", [(200, 70), (300, 1000), (1, 9)])
def test_a_unit_index_in_the_middle(N, M, dtype, nki):
    prog, c, out, x = _run(MIDDLE.format(N=N, M=M), dtype, nki)
    assert_matches(prog, "Y", out["Y"], np.exp(x["A"][:, 0, :]) + x["B"])


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_leading_and_trailing_unit_indices_and_a_column(dtype, nki):
    """`A[0, i, j, 0]` of a [1, N, M, 1] tensor beside a per-row column `c[i, 0]` of an [N, 1] tensor."""
    src = """\
kernel u(A: f32[1, N, M, 1], c: f32[N, 1]) -> Y
  default N = 150, M = 33
  Y: f32[N, M]
  for i in 0..N, j in 0..M:
    Y[i, j] = relu(A[0, i, j, 0] * c[i, 0]) - 1
"""
    prog, c, out, x = _run(src, dtype, nki)
    assert_matches(prog, "Y", out["Y"], np.maximum(x["A"][0, :, :, 0] * x["c"], 0) - 1)


def test_an_index_other_than_zero_stays_a_located_error():
    """`A[i, 1, j]` of an [N, 2, M] tensor is not a squeezed dimension: the original message, at the read."""
    src = """\
kernel u(A: f32[N, 2, M]) -> Y
  default N = 20, M = 7
  Y: f32[N, M]
  for i in 0..N, j in 0..M:
    Y[i, j] = exp(A[i, 1, j])
"""
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load(src))
    text = str(err.value)
    assert ":5:19:" in text and "^^^" in text and "`A[i, 1, j]`" in text


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_a_plain_read_of_a_squeezed_dimension_is_exact(dtype, nki):
    """`Y[n, c, x] = A[n, c, 0, x]` moves bits (no function): exact, in a 3-D nest."""
    src = """\
kernel u(A: f32[N, C, 1, M]) -> Y
  default N = 3, C = 70, M = 45
  Y: f32[N, C, M]
  for n in 0..N, c in 0..C, x in 0..M:
    Y[n, c, x] = A[n, c, 0, x]
"""
    prog, c, out, x = _run(src, dtype, nki)
    np.testing.assert_array_equal(np.asarray(out["Y"], np.float64), x["A"][:, :, 0, :])


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_row_of_a_unit_leading_dimension(dtype, nki):
    """`s[0, j]` of a [1, M] tensor is the row s[j], broadcast to every partition."""
    src = """\
kernel u(A: f32[N, M], s: f32[1, M]) -> Y
  default N = 300, M = 70
  Y: f32[N, M]
  for i in 0..N, j in 0..M:
    Y[i, j] = A[i, j] * s[0, j]
"""
    prog, c, out, x = _run(src, dtype, nki)
    assert_matches(prog, "Y", out["Y"], x["A"] * x["s"])
