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
    """`s[j] += exp(X[i, j] - m[j])` under `for j: for i:` fills s_terms[i, j] (X's layout: no transpose)."""
    from tilec.compiler.reduce_split import split_broadcast_reductions

    prog = split_broadcast_reductions(lang.load((PROGRAMS / "softmax_axis0.tl").read_text()))
    assert prog.tensors["s_terms"].dtype == "f32"
    assert [str(d) for d in prog.tensors["s_terms"].shape] == ["300", "256"]


def test_a_product_of_two_reads_is_left_to_the_contraction_rule():
    from tilec.compiler.reduce_split import split_broadcast_reductions

    prog = lang.load((PROGRAMS / "matvec_bias.tl").read_text())
    assert split_broadcast_reductions(prog) is prog


@pytest.mark.parametrize("name", ["dot_product", "total_sum"])
def test_a_reduction_into_one_element_is_a_located_refusal(name):
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load((PROGRAMS / f"{name}.tl").read_text()))
    assert err.value.span is not None and err.value.hint and "one element" in err.value.message
