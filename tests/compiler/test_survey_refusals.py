"""The refusals gaps11's survey of 1500 generated programs (default schedules, main 24d9247) still found after its
fixes: the last, a function of a contraction's 16-bit operand (`exp(A[k, i]) * B[k, j]`: 3, all f16), compiles since
lead21 (operand_split.py: exp(A) in an f32 temporary, B copied to f32 beside it) and is checked against NumPy here.
Reversed reads compile since gaps14 (test_reversed_reads.py); the other forms the survey found are tested against
NumPy in test_constant_factor.py, test_unit_index.py, test_stationary_relu.py and test_column_alone.py."""
from __future__ import annotations

import numpy as np

from compiler_helpers import assert_matches
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

OPERAND_FUNCTION = """\
kernel mm(A: f16[K, M], B: f16[K, N], b: f16[M]) -> C
  default M = 3, K = 23, N = 165
  C: f16[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = b[i]
    for k in 0..K:
      C[i, j] += exp(A[k, i]) * B[k, j]
"""


def test_a_function_of_a_16_bit_operand_compiles():
    prog = lang.load(OPERAND_FUNCTION)
    rng = np.random.default_rng(5)
    x = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(np.float16) for t in prog.inputs}
    out = compile_loaded(prog).run(**x)["C"]
    a, b, bias = (x[n].astype(np.float64) for n in ("A", "B", "b"))
    assert_matches(prog, "C", out, bias[:, None] + np.exp(a).T @ b)
