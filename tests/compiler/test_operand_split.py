"""A contraction whose operands are expressions (operand_split.py): attention's weighted values written in one
statement, `O[i, d] += exp(sc[i, j] - m[i]) / z[i] * V[j, d]`, compiles to the fused attention head; other
operand expressions are computed into temporaries over their own indices (never over all the loops), and a factor
of the output's indices leaves a sum started from 0. Each result against a NumPy formula."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, inline_attention, run_signed
from tilec.compiler.api import compile_loaded, explain
from tilec.compiler.pipeline import compile_program
from tilec.errors import TilecError
from tilec.lang import api as lang

ATTN = inline_attention("f32", 256, 384, 64)


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_attention_in_one_statement(dtype: str) -> None:
    prog, c, out, a = run_signed(ATTN, dtype, seed=3)
    # the head on chip, not op by op through HBM; bf16: operand_split copies V to f32 beside the f32 weights (a
    # bf16 temporary would round every weight, which the reference does not); the head takes V itself and carries
    # P in bf16, the rounding tilec/tolerance.py names for a bf16 sum (attention_find.weights)
    assert "attention sc -> m" in explain(c)
    want = _softmax_rows(a["Q"] @ a["K"].T * 0.125) @ a["V"]
    assert_matches(prog, "O", out["O"], want)


def test_operand_temporaries_cover_their_own_indices_only() -> None:
    names = {op.out: op for op in compile_program(lang.load(ATTN)).ops}
    assert "O_lhs" not in names  # exp(sc - m) is softmax's own terms, reused; `/ z` applies to the total
    assert "O_terms" not in names  # (the [S, T, D] temporary the reduction rewrite would make)


BOTH = """\
kernel both(A: f32[M, K], B: f32[K, N], b: f32[N]) -> Y
  default M = 160, K = 200, N = 96
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = b[j]
    for k in 0..K:
      Y[i, j] += tanh(A[i, k]) * (B[k, j] + 1) * 0.5
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_both_operands_expressions_from_a_bias(dtype: str) -> None:
    prog, c, out, a = run_signed(BOTH, dtype, seed=5)
    kinds = [type(op).__name__ for op in compile_program(prog).ops]
    assert kinds == ["EltwiseOp", "EltwiseOp", "ConvOp"]  # each operand over its own two loops, then the matmul
    want = a["b"][None, :] + 0.5 * np.tanh(a["A"]) @ (a["B"] + 1)
    assert_matches(prog, "Y", out["Y"], want)


SCALED = """\
kernel scaled(A: f32[M, K], B: f32[K, N], g: f32[M], z: f32[M]) -> Y
  default M = 160, K = 200, N = 96
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = 0
    for k in 0..K:
      Y[i, j] += A[i, k] * g[i] / z[i] * B[k, j]
"""


def _run_positive(src: str):
    """(program, outputs, inputs) on inputs in [0.5, 1.5): the divisors stay away from 0."""
    prog = lang.load(src)
    rng = np.random.default_rng(1)
    a = {t.name: rng.random(t.shape, dtype=np.float32) + 0.5 for t in prog.inputs}
    return prog, compile_loaded(prog).run(**a), {k: v.astype(np.float64) for k, v in a.items()}


def test_factors_of_the_output_indices_scale_the_total() -> None:
    prog, out, a = _run_positive(SCALED)
    outs = [op.out for op in compile_program(prog).ops]
    assert outs[0] != "Y_lhs" and "Y_lhs" not in outs  # A read as it is, g / z applied to the sum
    want = (a["A"] @ a["B"]) * (a["g"] / a["z"])[:, None]
    assert_matches(prog, "Y", out["Y"], want)


def test_a_factor_of_both_output_indices_is_left_to_the_other_rules() -> None:
    src = SCALED.replace("g: f32[M]", "g: f32[M, N]").replace("g[i]", "g[i, j]")
    with pytest.raises(TilecError) as err:  # no split into two operands: the rules' own refusal, at the line
        compile_loaded(lang.load(src))
    assert err.value.span.line == 7 and err.value.hint
