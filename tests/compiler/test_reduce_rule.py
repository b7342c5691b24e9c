"""Row reductions as a level-A rule (rules.reduce): `s[i] = c; s[i] OP= A[i, j]` with c OP's identity (one free
tile per row, or several combined into an accumulator), then its epilogue (a constant factor, another initial
value, a cast to a narrower output) computed at the row tile, and a reduced expression computed into a tile
first (bind_expr), is scheduled by primitives (fold_init, reshape, split,
reorder, partition, stage_out, stage, tensorize) and lowered by lower_tiles, to the same kernel build_reduce wrote.
Tested by meaning (the scheduled nest evaluates like the program, and like NumPy), by goldens of the primitives and
the scheduled nest, end to end on the interpreter against NumPy, and by which forms the rule leaves to
build_reduce."""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from compiler_helpers import check_against_reference, inputs_for
from tilec.compiler import primitives as pr
from tilec.compiler import rules
from tilec.compiler.api import compile_loaded
from tilec.compiler.lower import lower
from tilec.compiler.lower_tiles import reduce_nest
from tilec.compiler.nest import Const, lower_nest, print_nest
from tilec.compiler.nest_eval import evaluate_nest
from tilec.compiler.schedule import ReducePlan, default_plan
from tilec.compiler.select import select
from tilec.errors import TilecError
from tilec.lang import api as lang
from tilec.target import target
from kernel_numbers import numbered


def program(op: str = "+=", init: str = "0", m: int = 256, n: int = 384, dtype: str = "f32", out: str = "f32",
            term: str = "A[i, j]", extra: str = "") -> str:
    return f"""\
kernel rowred(A: {dtype}[M, N]{extra}) -> s
  default M = {m}, N = {n}
  s: {out}[M]
  for i in 0..M:
    s[i] = {init}
    for j in 0..N:
      s[i] {op} {term}
"""


BATCHED_MAX = """\
kernel rmax(A: f32[B, M, N]) -> m
  default B = 2, M = 96, N = 300
  m: f32[B, M]
  for b in 0..B, i in 0..M:
    m[b, i] = -inf
    for j in 0..N:
      m[b, i] max= A[b, i, j]
"""
B = ", b: f32[M]"
CASES = {"sum": (program(), None), "max_batched": (BATCHED_MAX, None), "min": (program("min=", "inf"), None),
         "sum_tiles_of_64": (program(), ReducePlan(64, 384)),
         "max_free_tiles": (program("max=", "-inf"), ReducePlan(128, 96)),  # 4 free tiles: an accumulator
         "sum_free_tiles": (program(m=128, n=8192), None),  # the default plan's 2 tiles of 4096
         # epilogues computed at the row tile (reverse_compute_at): a scale, initial values, a narrow output
         "mean": (program(term="A[i, j] / N"), None),
         "max_from_one": (program("max=", "1"), None),
         "sum_from_column": (program(init="b[i]", term="A[i, j] * 0.5", extra=B), ReducePlan(128, 96)),
         "sum_f16": (program(dtype="f16", out="f16"), None),
         # a reduced expression: computed into a tile per row tile (bind_expr), then reduced
         "sum_of_products": (program(term="A[i, j] * B[i, j]", extra=", B: f32[M, N]"), None),
         "sum_of_squares_tiles": (program(term="(A[i, j] - B[i, j]) * (A[i, j] - B[i, j]) / N",
                                          extra=", B: f32[M, N]"), ReducePlan(128, 96)),
         # short rows: 8 per partition, in tiles of 4 rows (TILE_G)
         "short_rows": (program(m=1024, n=64, init="b[i]", term="A[i, j] * 0.5", extra=B, out="bf16"), (128, 8, 4)),
         "short_rows_resident": (program("max=", "-inf", m=1024, n=64), (128, 8, 8, True)),
         # ragged rows: whole row tiles, then one tile of the rest (cut), the epilogue cut alike
         "ragged_rows_mean_from_column": (program(m=139, n=96, init="b[i]", term="A[i, j] / N", extra=B),
                                          ReducePlan(128, 32)),
         "ragged_rows_squares_bf16": (program(m=257, n=64, term="(A[i, j] - B[i, j]) * (A[i, j] - B[i, j])",
                                              extra=", B: f32[M, N]", out="bf16"), None),
         # ragged free tiles: whole free tiles, then one of the rest, both reduced into the row tile's accumulator
         "ragged_free_max": (program("max=", "-inf", m=139, n=97), ReducePlan(128, 32)),
         "ragged_free_squares_from_column": (program(init="b[i]", term="(A[i, j] - B[i, j]) * (A[i, j] - B[i, j])",
                                                     extra=", B: f32[M, N]" + B, n=96), ReducePlan(128, 40))}
NUMPY = {"+=": np.sum, "max=": np.max, "min=": np.min}


def numpy_reduction(text: str, inputs: dict) -> np.ndarray:
    """The program's value by NumPy, from the text's own pieces (the reduction, factor and initial value)."""
    red = "max=" if "max=" in text else "min=" if "min=" in text else "+="
    a = inputs["A"].astype(np.float64)
    if "B[i, j]" in text:
        b = inputs["B"].astype(np.float64)
        a = a * b if "A[i, j] * B[i, j]" in text else (a - b) ** 2
    value = NUMPY[red](a * (0.5 if "* 0.5" in text else 1 / a.shape[-1] if "/ N" in text else 1), axis=-1)
    if "b[i]" in text:
        return value + inputs["b"].astype(np.float64)
    if "s[i] = 1" in text:
        return value + 1 if red == "+=" else np.maximum(value, 1)
    return value


def _nest(text: str):
    prog = lang.load(text)
    op = select(lower(prog.kernel, prog.sizes), prog)[0]
    return prog, op, reduce_nest(op, prog)


@pytest.mark.parametrize("name", sorted(CASES))
def test_reduce_rule_keeps_the_meaning(name: str, golden) -> None:
    text, params = CASES[name]
    prog, op, nest = _nest(text)
    if isinstance(params, tuple):  # short rows: (P, G, GB[, resident])
        prims = rules.reduce(nest, target("trn2"), default_plan(op, {}), params[:3], len(params) > 3)
    else:
        prims = rules.reduce(nest, target("trn2"), params or default_plan(op, {}))
    assert prims is not None
    scheduled = rules.apply(nest, prims, target("trn2"))
    inputs = inputs_for(prog)
    out = prog.kernel.outputs[0]
    got = evaluate_nest(scheduled, inputs)[out]
    tol = 2e-3 if "f16" in name else 8e-3 if "bf16" in text else 1e-4
    ulp = 1e-5 if prog.tensors[out].dtype == "f32" else tol  # a narrow output may round the other way
    np.testing.assert_allclose(got, evaluate_nest(lower_nest(prog), inputs)[out], rtol=ulp)
    np.testing.assert_allclose(got, numpy_reduction(text, inputs), rtol=tol, atol=10 * tol)
    golden.check(f"compiler/rules/reduce_{name}.txt", rules.print_prims(prims) + "\n" + print_nest(scheduled))


@pytest.mark.parametrize("text", [program(), BATCHED_MAX, program("min=", "inf", dtype="bf16"),
                                  program(m=200, n=1000, dtype="f16"), program(n=8192),
                                  program("max=", "-inf", n=8192, dtype="bf16"), program("min=", "inf", n=12288),
                                  program(init="1"), program(term="A[i, j] / N", n=8192, dtype="bf16", out="bf16"),
                                  program(init="b[i]", term="A[i, j] * 0.5", extra=B, n=8192),
                                  program("max=", "b[i]", extra=B, out="f16"), program("min=", "-2"),
                                  program(term="A[i, j] * B[i, j]", extra=", B: f32[M, N]", n=8192, out="bf16"),
                                  program("max=", "-inf", term="A[i, j] * B[i, j]", extra=", B: f16[M, N]",
                                          dtype="f16")])
def test_reduce_rule_compiles_to_a_kernel_that_matches_numpy(text: str) -> None:
    c = compile_loaded(lang.load(text))
    assert "rules.reduce expands its plan into" in c.stages["schedule"]
    check_against_reference(c)
    inputs = inputs_for(c.program)
    out = c.program.kernel.outputs[0]
    got = np.asarray(c.run(**inputs)[out], np.float64)
    want = numpy_reduction(text, inputs)
    if "min=" in text and "-2" in text:
        want = np.minimum(inputs["A"].astype(np.float64).min(axis=-1), -2)
    if "max=" in text and "B[i, j]" in text:
        want = (inputs["A"].astype(np.float64) * inputs["B"].astype(np.float64)).max(axis=-1)
    if "max=" in text and "b[i]" in text:
        want = np.maximum(inputs["A"].astype(np.float64).max(axis=-1), inputs["b"].astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=8e-3 if "bf16[M]" in text else 2e-3, atol=1e-2)  # bf16: 8 bits


RAGGED = [program(m=139, n=12289), program(m=139, n=12289, dtype="bf16", out="bf16"), program(m=257, n=1000),
          program(m=257, n=1000, dtype="bf16"), program(m=1, n=7), program(m=1, n=7, dtype="bf16", out="bf16"),
          program(m=129, n=129), program("max=", "-inf", m=129, n=129, dtype="bf16", out="bf16"),
          program(m=157, n=3, out="bf16"), program("min=", "inf", m=131, n=8192),
          program(init="b[i]", term="A[i, j] / N", extra=B, m=263, n=8192, dtype="bf16", out="bf16"),
          program(term="A[i, j] * B[i, j]", extra=", B: f32[M, N]", m=131, n=4099)]


@pytest.mark.parametrize("text", RAGGED)
def test_ragged_rows_compile_to_kernels_that_match_numpy(text: str) -> None:
    """A row count that 128-row tiles do not divide: whole tiles and one tile of the rest, never tiles of one
    partition (139 rows: 128 + 11; a prime count of short rows, 157 x 3, too)."""
    c = compile_loaded(lang.load(text))
    assert "rules.reduce expands its plan into" in c.stages["schedule"]
    m = c.program.sizes["M"]
    rows = [int(x) for x in re.findall(r"ndarray\(\((\d+), 1\), dtype=nl.float32", numbered(c.source))]
    assert len(set(rows)) <= 2 and max(rows) >= min(m, 32), rows  # whole tiles, then the rest
    inputs = inputs_for(c.program)
    got = np.asarray(c.run(**inputs)["s"], np.float64)
    want = numpy_reduction(text, inputs)
    if "min=" in text:
        want = inputs["A"].astype(np.float64).min(axis=-1)
    narrow = "bf16" in text  # inputs or output rounded to 8 bits
    np.testing.assert_allclose(got, want, rtol=8e-3 if narrow else 1e-4, atol=1e-2 if narrow else 1e-3)


def test_short_rows_are_a_parameter_of_the_rule() -> None:
    """Rows of 64 (several per partition): the rule's `short` parameter, a (P, TILE_G, F) tile per step reduced over
    its last axis into the (P, G) result tile; a unit loop among them stays with build_reduce's short-row builder."""
    prog, op, nest = _nest(program(m=1024, n=64, init="1", term="A[i, j] * 0.5"))
    prims = rules.reduce(nest, target("trn2"), default_plan(op, {}), (128, 8, 8))
    assert prims is not None and "reshape(i#0, ((p, 128), (g, 8), (f, 64))" in str(prims[1])
    assert rules.reduce(nest, target("trn2"), default_plan(op, {})) is not None  # one row per partition works too
    one = _nest(BATCHED_MAX.replace("B = 2", "B = 1"))
    assert rules.reduce(one[2], target("trn2"), default_plan(one[1], {}), (96, 3, 3)) is None


def test_explain_prints_the_rules_primitives() -> None:
    """`explain` / `--dump-ir schedule` print the primitive list the reduction's plan expands to."""
    text = compile_loaded(lang.load(program())).stages["schedule"]
    assert "# s: rules.reduce expands its plan into" in text
    for p in ("fold_init(s)", "split(r, 128, outer=pt, inner=p, name=TILE_P)", "reorder(pt, ft, p, f_i)",
              "stage_out(s_v, ft, name=s_acc, line=5)", "stage(A_v, ft, name=A_tile)", "tensorize(p)"):
        assert f"#   {p}\n" in text
    short = compile_loaded(lang.load(program(m=1024, n=64))).stages["schedule"]  # rows of 64: 8 per partition
    for p in ("reshape(i, ((p, 128), (g, 8), (f, 64)), notes=('for i', 'for i', 'for j'), lines=(4, 4, 6), "
              "views=((A, A_v), (s, s_v)), view_line=5, unit=False)", "split(g, 4, outer=gt, inner=g_i, "
              "name=TILE_G, note='for the rows, TILE_G at a time on each partition (8 per partition)')",
              "stage_out(s_v, '', name=s_col, line=5, dtype=f32)", "stage(A_v, gt, name=A_all, resident=True)"):
        assert f"#   {p}\n" in short
    mean = compile_loaded(lang.load(program(init="b[i]", term="A[i, j] / N", extra=B, out="bf16"))).stages["schedule"]
    for p in ("reshape(i#0, ((e, 256), (e_u, 1)), views=((s, s_v)))", "reverse_compute_at(e, ft)",
              "reverse_compute_at(e2, ft)", "stage(b_v, ft, name=b_col, near=True)", "tensorize(e2_r)",
              "stage_out(s_v, ft, name=s_acc, line=5, dtype=f32, cast=s_tile)"):
        assert f"#   {p}\n" in mean
    many = compile_loaded(lang.load(program(n=8192)))
    assert "#   stage_out(s_v, pt, name=s_acc, line=5)\n" in many.stages["schedule"]
    assert "#   tensorize(p, accumulate=True)\n" in many.stages["schedule"]
    assert "s_part = nl.ndarray((128, 1)" in numbered(many.source)
    assert "nisa.tensor_tensor(s_acc, s_part, op=nl.add" in numbered(many.source)


def test_fold_init_refuses_a_value_that_is_not_the_identity() -> None:
    prog, op, nest = _nest(program())
    _, _, ones = _nest(program(init="1"))
    assert isinstance(ones.body[0].body[0].expr, Const)  # reduce_nest starts from the identity, 1 comes last
    assert ones.body[0].body[0].expr.value == 0 and len(ones.body) == 3
    full = lower_nest(lang.load(program(op="max=", init="0")))
    with pytest.raises(TilecError, match="not the identity of max="):
        pr.fold_init(_split_init(full), "s")
    assert pr.fold_init(nest, "s").body[0] is nest.body[1]


def _split_init(k):
    """`for i: (s[i] = c; for j: ...)` as two nests, the form fold_init takes."""
    top = k.body[0]
    return replace(k, body=(replace(top, body=top.body[:1]), replace(top, body=top.body[1:])))
