"""A column reduction whose term reads a broadcast row (`s[j] += f(X[i, j], c[j])`), its initial value in its own
nest (`for j: s[j] = 0`): the terms are computed into a temporary first (reduce_split), and that nest goes before
the initial value's, so lowering still merges the initial value into its reduction (rewrite.hoisted). It was
refused with "needs an initial value" (audit15). Matched against NumPy formulas, both NKI dialects."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run

COLUMN = """\
kernel col(X: f32[M, N], c: f32[N], b: f32[N]) -> s
  default M = 300, N = 200
  s: f32[N]
  for j in 0..N:
    s[j] = {init}
  for i in 0..M, j in 0..N:
    s[j] {op} {term}
"""

CASES = {  # name: (init, op, term, NumPy formula of X, c, b)
    "l1_to_a_row": ("0", "+=", "abs(X[i, j] - c[j])", lambda X, c, b: np.abs(X - c).sum(axis=0)),
    "squared_scaled": ("1.5", "+=", "(X[i, j] - c[j]) * (X[i, j] - c[j]) / M",
                       lambda X, c, b: 1.5 + ((X - c) ** 2).sum(axis=0) / 300),
    "max_from_a_tensor": ("b[j]", "max=", "X[i, j] * c[j]", lambda X, c, b: np.maximum(b, (X * c).max(axis=0))),
}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_column_reduction_of_a_broadcast_row_matches_numpy(case, nki):
    init, op, term, formula = CASES[case]
    prog, c, inputs, out = compile_and_run(COLUMN.format(init=init, op=op, term=term), nki)
    X, cc, b = (inputs[k].astype(np.float64) for k in ("X", "c", "b"))
    assert_matches(prog, "s", out["s"], formula(X, cc, b))


def test_the_terms_nest_goes_before_the_initial_value():
    from tilec.compiler.reduce_split import split_broadcast_reductions
    from tilec.lang import api as lang
    from tilec.lang import fmt
    # (a max=: the f32 sum is left whole, its column rule reads the row c on chip: test_cols17_rows)
    prog = split_broadcast_reductions(lang.load(COLUMN.format(init="0", op="max=", term="abs(X[i, j] - c[j])")))
    text = [line.text for line in fmt.kernel_lines(prog.kernel)]
    assert text.index("s_terms[i, j] = abs(X[i, j] - c[j])") < text.index("s[j] = 0") < text.index(
        "s[j] max= s_terms[i, j]")
