"""Reductions along the trailing dimensions (`s[i] += A[i, j]`, max=, min=, a mean, an initial bias): kept indices
on the partitions, reduced ones along the free dimension, tensor_reduce per free tile combined into an fp32 column.
Each runs on the interpreter against the reference evaluator and an independent NumPy reduction; the forms with no
mapping, and directives that cannot be honoured, are golden errors."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, check_against_reference, inputs_for
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang
from kernel_numbers import numbered


def reduce_program(init: str = "0", op: str = "+=", term: str = "A[i, j]", dtype: str = "f32", m: int = 256,
                   n: int = 384, extra: str = "") -> str:
    return f"""\
kernel rowred(A: {dtype}[M, N]{extra}) -> s
  default M = {m}, N = {n}
  s: {dtype}[M]
  for i in 0..M:
    s[i] = {init}
    for j in 0..N:
      s[i] {op} {term}
"""


BATCHED = """\
kernel batched(A: f32[B, M, N]) -> s
  default B = 2, M = 96, N = 500
  s: f32[B, M]
  for b in 0..B, i in 0..M:
    s[b, i] = 0
    for j in 0..N:
      s[b, i] += A[b, i, j]
"""


def compile_text(text: str, schedule: str | None = None):
    directives = lang.parse_schedule(schedule, "<test schedule>") if schedule is not None else None
    return compile_loaded(lang.load(text), directives)


def run_numpy(c, reduce_fn) -> None:
    """The kernel's output against NumPy's reduction of the same inputs (not the reference evaluator)."""
    inputs = inputs_for(c.program)
    got = np.asarray(c.run(**inputs)["s"], np.float32)
    dtype = c.program.tensors["s"].dtype
    want = reduce_fn({k: v.astype(got.dtype if dtype == "f32" else np.float16).astype(np.float64)
                      for k, v in inputs.items()})
    assert got.shape == want.shape
    assert_matches(c.program, "s", got, want)


def test_row_sum_is_one_tensor_reduce_per_row_tile():
    c = compile_text(reduce_program())
    assert "nisa.tensor_reduce(nl.add, A_tile, axis=1, keepdims=True, dtype=nl.float32)  # tl:7" in numbered(c.source)
    assert "for pt in nl.affine_range(2):  # tl:4  for i (tiles of TILE_P)" in numbered(c.source)
    check_against_reference(c)
    run_numpy(c, lambda x: x["A"].sum(axis=1))


@pytest.mark.parametrize("term,fn", [
    ("A[i, j] * B[i, j]", lambda x: (x["A"] * x["B"]).sum(axis=1)),
    ("A[i, j] + B[i, j]", lambda x: (x["A"] + x["B"]).sum(axis=1)),
    ("sqrt(A[i, j]) / (B[i, j] + 1)", lambda x: (np.sqrt(x["A"]) / (x["B"] + 1)).sum(axis=1)),
])
@pytest.mark.parametrize("schedule", [None, "tile s.j, 128"])
def test_an_element_wise_expression_is_reduced(term, fn, schedule):
    """Each free tile of the expression is computed from the loaded tiles, then tensor_reduce'd."""
    c = compile_text(reduce_program(term=term, extra=", B: f32[M, N]"), schedule)
    assert "nisa.tensor_reduce(nl.add, s_terms" in numbered(c.source)
    check_against_reference(c)
    run_numpy(c, fn)


def test_free_tiles_combine_into_an_accumulator_column():
    c = compile_text(reduce_program(), "tile s.j, 128\ntile s.i, 64")
    assert "TILE_F = 128" in numbered(c.source) and "TILE_P = 64" in numbered(c.source)
    assert "for ft in nl.sequential_range(3):  # tl:6  for j (tiles of TILE_F)" in numbered(c.source)
    assert "s_acc[...] = nisa.tensor_tensor(s_acc, s_part, op=nl.add, dtype=nl.float32)" in numbered(c.source)
    check_against_reference(c)


def test_f16_with_sizes_not_multiples_of_128():
    c = compile_text(reduce_program(dtype="f16", m=200, n=300), "tile s.j, 100")
    assert "TILE_P = 100" in numbered(c.source)  # 200 rows: the largest divisor up to 128
    assert "s_tile[...] = nisa.tensor_copy(s_acc, dtype=nl.float16)" in numbered(c.source)  # accumulate fp32, store f16
    check_against_reference(c)
    run_numpy(c, lambda x: x["A"].sum(axis=1))


def test_max_from_minus_inf_over_several_free_tiles():
    c = compile_text(reduce_program("-inf", "max=", m=200, n=300), "tile s.j, 60")
    assert 'nisa.tensor_scalar(s_acc, nl.add, float("-inf"), dtype=nl.float32)' in numbered(c.source)
    assert "nisa.tensor_reduce(nl.maximum, A_tile" in numbered(c.source)
    check_against_reference(c)
    run_numpy(c, lambda x: x["A"].max(axis=1))


def test_max_of_all_negative_rows_starts_below_zero():
    """Uniform [0, 1) inputs cannot tell a -inf start from a 0 start: rows of negative values can."""
    c = compile_text(reduce_program("-inf", "max=", m=200, n=300), "tile s.j, 60")
    a = -1.0 - np.random.default_rng(7).random((200, 300), dtype=np.float32)
    got = np.asarray(c.run(A=a)["s"], np.float32)
    assert np.array_equal(got, a.max(axis=1))


def test_min_from_inf_in_one_tile():
    c = compile_text(reduce_program("inf", "min=", m=128, n=64))
    assert "float(" not in numbered(c.source)  # one free tile reduces straight into the accumulator: no identity needed
    check_against_reference(c)
    run_numpy(c, lambda x: x["A"].min(axis=1))


def test_mean_from_a_bias_applies_factor_and_bias_once():
    c = compile_text(reduce_program("b[i]", term="A[i, j] / N", m=200, n=300, extra=", b: f32[M]"),
                     "tile s.j, 150")
    assert "nisa.tensor_scalar(s_acc, nl.multiply, 0.0033333333333333335" in numbered(c.source)
    assert "nisa.tensor_tensor(s_acc, b_col, op=nl.add" in numbered(c.source)
    check_against_reference(c)
    run_numpy(c, lambda x: x["A"].mean(axis=1) + x["b"])


def test_constant_factor_and_constant_start():
    c = compile_text(reduce_program("1.5", term="0.5 * A[i, j]", m=64, n=32))
    check_against_reference(c)
    run_numpy(c, lambda x: 1.5 + 0.5 * x["A"].sum(axis=1))


def test_3d_input_flattens_kept_indices_onto_partitions():
    c = compile_text(BATCHED, "tile s.j, 250")
    assert "view A_v: hbm f32[192, 500] = A" in c.stages["loops"]
    check_against_reference(c)
    run_numpy(c, lambda x: x["A"].sum(axis=2))


def test_same_program_same_bytes():
    text = reduce_program("-inf", "max=", m=200, n=300)
    assert numbered(compile_text(text, "tile s.j, 60").source) == numbered(compile_text(text, "tile s.j, 60").source)


def test_explain_shows_the_plan_as_directives():
    c = compile_text(BATCHED)
    assert "tile s.b, 96" in c.source and "tile s.j, 500" in c.source  # the kernel's docstring schedule


REJECTED = {
    "operands_indexed_differently": reduce_program(term="A[i, j] * B[j, i]", extra=", B: f32[N, M]"),
    "computed_init": reduce_program("b[i] * 2", extra=", b: f32[M]"),
}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_unsupported_reductions_are_clear_errors(name, golden):
    with pytest.raises(TilecError) as err:
        compile_text(REJECTED[name])
    assert err.value.span is not None and "cannot map `s`" in err.value.message
    golden.check(f"compiler/errors/reduce_{name}.txt", err.value.render() + "\n")


BAD_DIRECTIVES = {
    "partition_tile_too_big": "tile s.i, 256",
    "free_tile_too_wide": "tile s.j, 400",  # (a tile that does not divide the row is ragged: test_core22)
}


@pytest.mark.parametrize("name", sorted(BAD_DIRECTIVES))
def test_bad_reduce_directives(name, golden):
    with pytest.raises(TilecError) as err:
        compile_text(reduce_program(), BAD_DIRECTIVES[name])
    golden.check(f"compiler/errors/reduce_{name}.txt", err.value.render() + "\n")
