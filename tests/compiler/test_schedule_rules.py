"""Default schedules as rules (tilec/compiler/rules.py): a rule recognises a level-A nest and writes its schedule
as primitive applications. Tested by meaning (the scheduled nest evaluates like the program), by goldens of the
primitive list and the scheduled nest, and end to end (the compiled kernel matches NumPy on the interpreter)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import check_against_reference, inputs_for
from tilec.compiler import rules
from tilec.compiler.api import compile_loaded
from tilec.compiler.lower import lower
from tilec.compiler.lower_tiles import eltwise_nest, transpose_nest
from tilec.compiler.nest import lower_nest, print_nest
from tilec.compiler.nest_eval import evaluate_nest
from tilec.compiler.schedule import EltwisePlan, TransposePlan, default_plan
from tilec.compiler.select import select
from tilec.lang import api as lang
from tilec.target import target

FLAT = """kernel add(X: f32[M, N], Z: f32[M, N]) -> Y
  default M = 64, N = 96
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] * 2 + Z[i, j]
"""
COLUMNS_ROWS = """kernel bc(X: f32[B, M, N], c: f32[M], s: f32[N]) -> Y
  default B = 2, M = 256, N = 1024
  Y: f32[B, M, N]
  for b in 0..B, i in 0..M, j in 0..N:
    Y[b, i, j] = 2 * X[b, i, j] + s[j] - 0.5 * c[i]
"""
ROW_TILES = COLUMNS_ROWS.replace("N = 1024", "N = 384")
ROWSUM = """kernel rowsum(A: f32[M, N]) -> s
  default M = 64, N = 12
  s: f32[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += A[i, j]
"""
# row_tiles: tiles of 256 that do not divide the 384-wide rows, so each region broadcasts its rows tile by tile (one
# tile as wide as the row is broadcast whole, once, since lead20: schedule.rows_whole)
CASES = {"flat": (FLAT, None), "flat_tiles": (FLAT, EltwisePlan(128, 12)), "columns_rows": (COLUMNS_ROWS, None),
         "row_tiles": (ROW_TILES, EltwisePlan(128, 256)), "row_tiles_whole": (ROW_TILES, EltwisePlan(128, 128))}


def _op_nest(text: str):
    prog = lang.load(text)
    ops = select(lower(prog.kernel, prog.sizes), prog)
    return prog, eltwise_nest(ops[0], prog)


@pytest.mark.parametrize("name", sorted(CASES))
def test_eltwise_rule_keeps_the_meaning(name: str, golden) -> None:
    text, params = CASES[name]
    prog, nest = _op_nest(text)
    prims = rules.eltwise(nest, target("trn2"), params)
    assert prims is not None
    scheduled = rules.apply(nest, prims, target("trn2"))
    inputs = inputs_for(prog)
    np.testing.assert_allclose(evaluate_nest(scheduled, inputs)["Y"], evaluate_nest(lower_nest(prog), inputs)["Y"],
                               rtol=1e-6)
    golden.check(f"compiler/rules/{name}.txt", rules.print_prims(prims) + "\n" + print_nest(scheduled))


@pytest.mark.parametrize("name", sorted(CASES))
def test_eltwise_rule_compiles_to_a_kernel_that_matches_numpy(name: str) -> None:
    text, _ = CASES[name]
    check_against_reference(compile_loaded(lang.load(text)))


def test_rules_say_not_applicable_to_a_reduction() -> None:
    nest = lower_nest(lang.load(ROWSUM))
    assert rules.eltwise(nest, target("trn2")) is None and rules.fallback(nest, target("trn2")) is None


def test_default_parameters_are_the_plan_defaults() -> None:
    """The rule's defaults and the schedule's default plan (what directives and the tuner start from) agree."""
    from tilec.compiler.schedule import default_plan
    f32 = (FLAT, COLUMNS_ROWS, ROW_TILES)
    for text in f32 + tuple(t.replace("f32", "bf16") for t in f32):
        prog = lang.load(text)  # (bf16: tiles of twice the elements, schedule.ELTWISE_TILE_BYTES)
        op = select(lower(prog.kernel, prog.sizes), prog)[0]
        dtypes = {n: t.dtype for n, t in prog.tensors.items()}
        nest = eltwise_nest(op, prog)
        assert rules.eltwise_params(rules.injective(nest), nest) == default_plan(op, dtypes)


TRANSPOSE = """kernel tr(X: f32[M, N]) -> Y
  default M = 256, N = 384
  Y: f32[N, M]
  for i in 0..M, j in 0..N:
    Y[j, i] = X[i, j]
"""
BATCHED = """kernel btr(X: f32[B, M, N]) -> Y
  default B = 2, M = 128, N = 256
  Y: f32[B, N, M]
  for b in 0..B, j in 0..N, i in 0..M:
    Y[b, j, i] = X[b, i, j]
"""
TRANSPOSES = {"transpose": (TRANSPOSE, None), "transpose_dma": (TRANSPOSE, TransposePlan(128, 2, 3, "dma")),
              "transpose_batched": (BATCHED, None), "transpose_ragged": (TRANSPOSE.replace("256", "131"), None)}


@pytest.mark.parametrize("name", sorted(TRANSPOSES))
def test_transpose_rule_keeps_the_meaning(name: str, golden) -> None:
    text, params = TRANSPOSES[name]
    prog = lang.load(text)
    op = select(lower(prog.kernel, prog.sizes), prog)[0]
    nest = transpose_nest(op, prog)
    plan = params or default_plan(op, {n: t.dtype for n, t in prog.tensors.items()})
    prims = rules.transpose(nest, target("trn2"), plan)
    assert prims is not None
    scheduled = rules.apply(nest, prims, target("trn2"))
    inputs = inputs_for(prog)
    np.testing.assert_array_equal(evaluate_nest(scheduled, inputs)["Y"], evaluate_nest(lower_nest(prog), inputs)["Y"])
    golden.check(f"compiler/rules/{name}.txt", rules.print_prims(prims) + "\n" + print_nest(scheduled))
    check_against_reference(compile_loaded(prog, lang.parse_schedule("method Y, dma", "<t>") if params else None))


def test_the_transpose_rule_does_not_apply_to_an_element_wise_nest() -> None:
    assert rules.transpose(lower_nest(lang.load(FLAT)), target("trn2"), TransposePlan(128, 1, 1)) is None
