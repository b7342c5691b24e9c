"""gaps15: a reduction of an expression that reads a tensor broadcast along the reduced loops (softmax's sum of
exp(X - m), a variance, a column softmax, log_softmax) compiles through an f32 temporary (reduce_split.py) and
matches NumPy formulas in float64, in both NKI dialects; a reduction into one element is a located refusal."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang

PROGRAMS = pathlib.Path(__file__).parents[1] / "programs" / "gaps15"


def _softmax_rows(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


FORMULAS = {
    "log_softmax": lambda a: {"Y": a["X"] - a["X"].max(1, keepdims=True)
                              - np.log(np.exp(a["X"] - a["X"].max(1, keepdims=True)).sum(1, keepdims=True))},
    "tiny_softmax": lambda a: {"Y": _softmax_rows(a["X"])},
    "softmax_axis0": lambda a: {"Y": _softmax_rows(a["X"].T).T},
    "row_mean_var": lambda a: {"mu": a["X"].mean(1), "v": a["X"].var(1)},
    "residual_layernorm": lambda a: {
        "Y": ((a["X"] + a["R"]) - (a["X"] + a["R"]).mean(1, keepdims=True))
        / np.sqrt((a["X"] + a["R"]).var(1, keepdims=True) + 1e-05) * a["g"] + a["b"]},
}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_a_reduction_of_a_broadcast_expression_matches_numpy(name, nki):
    text = (PROGRAMS / f"{name}.tl").read_text()
    prog, c, inputs, out = compile_and_run(text, nki)
    want = FORMULAS[name]({k: np.asarray(v, np.float64) for k, v in inputs.items()})
    for tensor, expected in want.items():
        assert_matches(prog, tensor, out[tensor], expected)


def test_the_terms_go_through_a_temporary_laid_out_like_the_full_read():
    """`s[j] max= exp(X[i, j] - m[j])` under `for j: for i:` fills s_terms[i, j] (X's layout: no transpose). (The
    f32 sum `s[j] += exp(X[i, j] - m[j])` is left whole: the column rule reads the row m itself, cols17.)"""
    from tilec.compiler.reduce_split import split_broadcast_reductions

    text = (PROGRAMS / "softmax_axis0.tl").read_text()
    assert split_broadcast_reductions(lang.load(text)).tensors.keys() == lang.load(text).tensors.keys()
    prog = split_broadcast_reductions(lang.load(text.replace("s[j] += exp", "s[j] max= exp")))
    assert prog.tensors["s_terms"].dtype == "f32"
    assert [str(d) for d in prog.tensors["s_terms"].shape] == ["300", "256"]


def test_a_product_of_two_reads_is_left_to_the_contraction_rule():
    from tilec.compiler.reduce_split import split_broadcast_reductions

    prog = lang.load((PROGRAMS / "matvec_bias.tl").read_text())
    assert split_broadcast_reductions(prog) is prog


TOTALS = {  # core16: a reduction into one element (split_total_reductions): program text -> NumPy formula
    "dot": ("""kernel dot(a: {t}[N], b: {t}[N]) -> s
  default N = 4096
  s: f32[1]
  s[0] = 0
  for i in 0..N:
    s[0] += a[i] * b[i]
""", lambda a: {"s": np.array([np.dot(a["a"], a["b"])])}),
    "total": ("""kernel total(X: {t}[M, N]) -> s
  default M = 300, N = 129
  s: {t}[1]
  s[0] = 1.5
  for i in 0..M, j in 0..N:
    s[0] += X[i, j] / N
""", lambda a: {"s": np.array([1.5 + a["X"].sum() / a["X"].shape[1]])}),
    "max3d": ("""kernel gmax(X: {t}[A, M, N]) -> s
  default A = 3, M = 200, N = 130
  s: f32[1, 1]
  s[0, 0] = -inf
  for a in 0..A, i in 0..M, j in 0..N:
    s[0, 0] max= X[a, i, j]
""", lambda a: {"s": np.array([[a["X"].max()]])}),
    "min_sq": ("""kernel mins(X: {t}[M, N], Y: {t}[M, N]) -> s
  default M = 130, N = 64
  s: f32[1]
  s[0] = inf
  for i in 0..M, j in 0..N:
    s[0] min= (X[i, j] - Y[i, j]) * (X[i, j] - Y[i, j])
""", lambda a: {"s": np.array([((a["X"] - a["Y"]) ** 2).min()])}),
}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(TOTALS))
def test_a_reduction_into_one_element_matches_numpy(name, dtype, nki):
    text, formula = TOTALS[name]
    prog, c, inputs, out = compile_and_run(text.format(t=dtype), nki)
    want = formula({k: np.asarray(v, np.float64) for k, v in inputs.items()})
    for tensor, expected in want.items():
        assert_matches(prog, tensor, out[tensor], expected)


@pytest.mark.parametrize("name", ["dot_product", "total_sum"])
def test_a_reduction_into_one_element_goes_rows_then_one_row(name):
    """Rows to an f32 column (when there are two loops or more), the column as one row, that row into the element:
    each step an ordinary reduction or copy."""
    from tilec.compiler.reduce_split import split_total_reductions

    prog = lang.load((PROGRAMS / f"{name}.tl").read_text())
    split = split_total_reductions(prog)
    assert split is not prog
    assert split.tensors["s_row"].dtype == "f32" and [str(d) for d in split.tensors["s_row"].shape][0] == "1"
    assert ("s_rows" in split.tensors) == (name == "total_sum")


def test_a_reduction_into_one_element_without_its_initial_value_right_before_is_a_located_refusal():
    text = """kernel late(X: f32[M, N]) -> s
  default M = 64, N = 32
  s: f32[1]
  s[0] = 0
  for i in 0..M:
    for j in 0..N:
      s[0] += X[i, j]
    for j in 0..N:
      s[0] += X[i, j]
"""
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load(text))
    assert err.value.span is not None and err.value.hint and "one element" in err.value.message
