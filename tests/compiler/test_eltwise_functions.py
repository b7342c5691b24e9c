"""Every element-wise function of the table and `/` between tensors, end to end: .tl -> checker -> compiled kernel
-> interpreter, equal to the reference evaluator (NumPy)."""
from __future__ import annotations

import pytest

from compiler_helpers import check_against_reference
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from tilec.lang.functions import ACTIVATIONS, FUNCTIONS

SRC = """kernel k(A: f32[M, N], B: f32[M, N], c: f32[M]) -> Y
  default M = 256, N = 384
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = {expr}
"""
# inputs are uniform in [0, 1): shift and scale them to where each function is defined and interesting
ARGUMENT = {"log": "A[i, j] + 0.01", "rsqrt": "A[i, j] + 0.01", "reciprocal": "A[i, j] + 0.01",
            "sqrt": "A[i, j]"}


@pytest.mark.parametrize("fn", ACTIVATIONS)
def test_each_activation_function(fn: str) -> None:
    c = compile_loaded(lang.load(SRC.format(expr=f"{fn}({ARGUMENT.get(fn, '4 * A[i, j] - 2')})")))
    assert f"op=nl.{FUNCTIONS[fn].nki}," in c.source
    check_against_reference(c)


@pytest.mark.parametrize("expr,instruction", [
    ("A[i, j] / (B[i, j] + 1)", "op=nl.divide"),  # tensor_tensor
    ("A[i, j] / c[i]", "nl.divide"),  # the divisor is a per-partition column
    ("c[i] / (A[i, j] + 1)", "reverse0=True"),  # the column is the dividend
    ("2 / (A[i, j] + 1)", "op=nl.reciprocal"),  # a constant over a tensor: reciprocal, then scaled
    ("exp(A[i, j] - c[i]) / (B[i, j] + 1)", "op=nl.exp"),
])
def test_division(expr: str, instruction: str) -> None:
    c = compile_loaded(lang.load(SRC.format(expr=expr)))
    assert instruction in c.source
    check_against_reference(c)
