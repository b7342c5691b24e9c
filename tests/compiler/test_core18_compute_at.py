"""`compute_at T, C.v` beyond conv -> pool (compute_at.py): an element-wise producer (a function of its inputs, a
transpose) with one reader is computed inside that reader, so it never goes to HBM. Each case runs against NumPy in
both NKI dialects, checks that T is gone from HBM, and keeps a before/after golden of the selected operations
(tests/golden/compiler/compute_at/); refusals are located errors with their golden."""
from __future__ import annotations

import difflib

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang

REDUCE = """\
kernel red(X: f32[M, N]) -> s
  default M = 300, N = 700
  T: f32[M, N]
  s: f32[M]
  for i in 0..M, j in 0..N:
    T[i, j] = exp(X[i, j] - 1)
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += T[i, j]
"""

MATMUL = """\
kernel tmm(A: f32[K, M], B: f32[K, N]) -> C
  default M = 200, K = 300, N = 260
  At: f32[M, K]
  C: f32[M, N]
  for i in 0..M, k in 0..K:
    At[i, k] = A[k, i]
  for i in 0..M, j in 0..N:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += At[i, k] * B[k, j]
"""

COLUMN = """\
kernel colsum(X: f32[M, N], Z: f32[M, N]) -> s
  default M = 300, N = 200
  D: f32[M, N]
  s: f32[N]
  for i in 0..M, j in 0..N:
    D[i, j] = abs(X[i, j] - Z[i, j])
  for j in 0..N:
    s[j] = 0
  for i in 0..M, j in 0..N:
    s[j] += D[i, j]
"""

ELTWISE = """\
kernel ew(X: f32[M, N], b: f32[N]) -> Y
  default M = 300, N = 700
  T: f32[M, N]
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    T[i, j] = X[i, j] * 2 + b[j]
  for i in 0..M, j in 0..N:
    Y[i, j] = relu(T[i, j]) - 1
"""

CASES = {  # name: (program, directive, temporary, NumPy formula)
    "eltwise_into_row_sum": (REDUCE, "compute_at T, s.i", "T",
                             lambda a: {"s": np.exp(a["X"] - 1).sum(axis=1)}),
    "transpose_into_matmul": (MATMUL, "compute_at At, C.i", "At", lambda a: {"C": a["A"].T @ a["B"]}),
    "eltwise_into_column_sum": (COLUMN, "compute_at D, s.j", "D",
                                lambda a: {"s": np.abs(a["X"] - a["Z"]).sum(axis=0)}),
    "eltwise_into_eltwise": (ELTWISE, "compute_at T, Y.j", "T",
                             lambda a: {"Y": np.maximum(a["X"] * 2 + a["b"], 0) - 1}),
}


def _with(text: str, directive: str) -> str:
    return text + "  schedule:\n    " + directive + "\n"


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_compute_at_of_an_element_wise_producer_matches_numpy(case, nki):
    text, directive, temp, formula = CASES[case]
    prog, c, inputs, out = compile_and_run(_with(text, directive), nki)
    want = formula({k: v.astype(np.float64) for k, v in inputs.items()})
    for name, expected in want.items():
        assert_matches(prog, name, out[name], expected)
    assert f"{temp} = nl.ndarray" not in c.source  # never allocated in HBM


@pytest.mark.parametrize("case", sorted(CASES))
def test_compute_at_golden(case, golden):
    text, directive, temp, _ = CASES[case]
    kept = f"tile {temp}.i, 100"  # a directive naming T keeps its statement (the default inlines it, below)
    before = compile_loaded(lang.load(_with(text, kept))).stages["select"]
    after = compile_loaded(lang.load(_with(text, directive))).stages["select"]
    diff = "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), "before", "after", n=1))
    golden.check(f"compiler/compute_at/{case}.txt", directive + "\n" + diff)


ERRORS = {  # name: (program, directive)
    "loop_not_indexing_the_producer": (MATMUL, "compute_at At, C.j"),
    "producer_is_an_output": (REDUCE.replace("-> s", "-> s, T"), "compute_at T, s.i"),
    "shifted_read": (REDUCE.replace("for j in 0..N:\n      s[i] += T[i, j]",
                                    "for j in 0..N - 1:\n      s[i] += T[i, j + 1]"), "compute_at T, s.i"),
    "consumer_not_reading_it": (ELTWISE.replace("-> Y", "-> Y, Z").replace("  Y: f32[M, N]\n",
                                "  Y: f32[M, N]\n  Z: f32[M, N]\n") + "  for i in 0..M, j in 0..N:\n"
                                "    Z[i, j] = X[i, j] + 1\n", "compute_at T, Z.i"),
    "several_readers": (ELTWISE.replace("-> Y", "-> Y, Z").replace("  Y: f32[M, N]\n",
                        "  Y: f32[M, N]\n  Z: f32[M, N]\n") + "  for i in 0..M, j in 0..N:\n"
                        "    Z[i, j] = T[i, j] + 1\n", "compute_at T, Y.i"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_refused_compute_at_is_a_located_error(case, golden):
    text, directive = ERRORS[case]
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(_with(text, directive)))
    assert e.value.span is not None
    golden.check(f"compiler/compute_at/error_{case}.txt", str(e.value) + "\n")


@pytest.mark.parametrize("case", ["eltwise_into_row_sum", "transpose_into_matmul", "eltwise_into_column_sum"])
def test_by_default_a_temporary_reduced_by_its_one_reader_is_computed_there(case):
    """compute_at.inline_reduced_temporaries: without a directive, the same kernel as `compute_at T, C.v`."""
    text, directive, temp, _ = CASES[case]
    default = compile_loaded(lang.load(text))
    assert default.source == compile_loaded(lang.load(_with(text, directive))).source
    assert f"{temp} = nl.ndarray" not in default.source


def test_a_temporary_a_directive_names_keeps_its_statement():
    c = compile_loaded(lang.load(_with(REDUCE, "tile T.i, 100")))
    assert "T = nl.ndarray" in c.source  # T stored to HBM, as the user scheduled it


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
def test_a_bf16_temporary_is_rounded_where_it_is_computed_in(nki):
    """T's store rounds each element to bf16; inlined, the read rounds the same (`bf16(exp(...))`), as NumPy here."""
    text = REDUCE.replace("T: f32[M, N]", "T: bf16[M, N]")
    prog, c, inputs, out = compile_and_run(text, nki)
    t = np.exp(inputs["X"].astype(np.float64) - 1).astype(np.float32)
    rounded = (t.view(np.uint32) + 0x7FFF + ((t.view(np.uint32) >> 16) & 1)) & 0xFFFF0000  # round to nearest even
    want = rounded.view(np.float32).astype(np.float64).sum(axis=1)
    assert "T = nl.ndarray" not in c.source
    assert_matches(prog, "s", out["s"], want)
