"""The refusals gaps11's survey of 1500 generated programs (default schedules, main 24d9247) still finds after its
fixes, each a located error with a caret and a hint (golden files): a function of a contraction's 16-bit operand
(`exp(A[k, i]) * B[k, j]`: 3, all f16; fp32 operands compile since gaps12, test_operand_function.py). Reversed reads
(`Y[i] = A[N - 1 - i] + 1`, 21 of the 38 refusals then) compile since gaps14 (test_reversed_reads.py), which keeps
the forms it does not build as located errors there. The forms the survey found that compile now are tested
against NumPy in test_constant_factor.py, test_unit_index.py, test_stationary_relu.py and test_column_alone.py."""
from __future__ import annotations

import pytest

from compiler_helpers import assert_located_refusal

REFUSED = {
    "operand_function": ("""\
kernel mm(A: f16[K, M], B: f16[K, N], b: f16[M]) -> C
  default M = 3, K = 23, N = 165
  C: f16[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = b[i]
    for k in 0..K:
      C[i, j] += exp(A[k, i]) * B[k, j]
""", 7),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refusal_is_located_with_a_hint(name, golden):
    src, line = REFUSED[name]
    assert_located_refusal(src, line, golden, f"compiler/errors/survey_{name}.txt")
