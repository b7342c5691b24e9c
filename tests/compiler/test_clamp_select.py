"""A clamp of an element-wise expression (audit15's bcast_clamp, hardtanh `min(max(e, -1), 1)`, relu6): the sum
inside the clamp is regrouped as a bare sum is (column terms with the first scaled operand on one ScalarE
activation), and the clamp's two operators are one tensor_scalar (op0, then op1 on its result, one VectorE pass).
Checked on the interpreter against NumPy formulas, both NKI dialects, three dtypes."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run
from tilec.compiler import wrap

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}

CLAMP = """\
kernel clamp(X: {dt}[M, N], b: {dt}[N], c: {dt}[M]) -> Y
  default M = 300, N = 700
  Y: {dt}[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = {expr}
"""
FORMS = {  # expression -> NumPy formula (float64 of the rounded inputs)
    "min(max(3 * X[i, j] + 0.5 * b[j] - c[i] / 4, -1), 1)":
        lambda x, b, c: np.clip(3 * x + 0.5 * b[None, :] - c[:, None] / 4, -1, 1),
    "min(relu(X[i, j] - c[i]), 0.5)": lambda x, b, c: np.clip(x - c[:, None], 0, 0.5),
    "max(min(2 * X[i, j], 1.5), 0.25)": lambda x, b, c: np.clip(2 * x, 0.25, 1.5),
}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("expr", list(FORMS))
def test_a_clamp_matches_numpy(expr, dt, nki):
    prog, c, x, out = compile_and_run(CLAMP.format(dt=dt, expr=expr), nki)
    f64 = {k: np.asarray(v).astype(NP[dt]).astype(np.float64) for k, v in x.items()}
    assert_matches(prog, "Y", out["Y"], FORMS[expr](f64["X"], f64["b"], f64["c"]))


def test_the_clamps_two_operators_are_one_tensor_scalar():
    _, c, _, _ = compile_and_run(CLAMP.format(dt="f32", expr=list(FORMS)[0]), "0.6")
    lines = [ln for ln in wrap.unwrap(c.source).splitlines() if "nisa.tensor_scalar(" in ln]
    clamp = [ln for ln in lines if "op0=nl.maximum" in ln]
    assert len(clamp) == 1 and "op1=nl.minimum, operand1=1.0" in clamp[0], lines
    assert not any("op0=nl.minimum" in ln for ln in lines)
    # the column term -c[i]/4 rides on the ScalarE activation of 3 * X (scale 3, bias the column)
    assert any("nisa.activation(" in ln and "scale=3.0" in ln and "bias=" in ln for ln in wrap.unwrap(c.source)
               .splitlines())
