"""A one-element broadcast column alone at scale, `Y[n, m, p] = 2 * c[m] + 1` with M = 1 (rules._unit_column_alone):
the leading loops go on the partitions (not the one-element column run: one partition per tile, 4016 us for
4096 x 1 x 64 f32 on the model), the value is loaded once as a (1, 1) row and copied to every partition once
(`broadcast`), and the output is flattened onto the partitions when the tiles divide it (20.9 us; a fill of the same
output: 21.1). Tested by meaning (the scheduled level-A nest against NumPy), by a golden of the primitives and the
scheduled nest, and end to end on the interpreter (both NKI dialects) against NumPy formulas."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from tilec.compiler import rules, wrap
from tilec.compiler.api import compile_loaded
from tilec.compiler.lower import lower
from tilec.compiler.lower_tiles import eltwise_nest
from tilec.compiler.nest import lower_nest, print_nest
from tilec.compiler.nest_eval import evaluate_nest
from tilec.compiler.schedule import default_plan
from tilec.compiler.select import select
from tilec.lang import api as lang
from tilec.target import target
from kernel_numbers import numbered

UNIT = """\
kernel col(A: f32[N, M, P], c: f32[M]) -> Y
  default N = {N}, M = 1, P = {P}
  Y: f32[N, M, P]
  for n in 0..N, m in 0..M, p in 0..P:
    Y[n, m, p] = {expr}
"""
UNIT4 = """\
kernel col(c: f32[M], x: f32[B, N, M, P]) -> Y
  default B = 3, N = 50, M = 1, P = 7
  Y: f32[B, N, M, P]
  for b in 0..B, n in 0..N, m in 0..M, p in 0..P:
    Y[b, n, m, p] = relu(c[m] - 0.5)
"""
FORMULA = {"2 * c[m] + 1": lambda a, c: np.broadcast_to(2 * c + 1, a.shape),
           "c[m]": lambda a, c: np.broadcast_to(c, a.shape),
           "relu(c[m] - 0.5)": lambda a, c: np.broadcast_to(np.maximum(c - 0.5, 0), a.shape),
           "A[n, m, p] - 3 * c[m]": lambda a, c: a - 3 * c}
NP = {"f32": np.float32, "f16": np.float16}


def _inputs(prog, dtype: str, seed: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {t.name: rng.random(t.shape, dtype=np.float32) * 4 - 2 for t in prog.inputs}
    if dtype == "bf16":
        return {k: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in out.items()}
    return {k: v.astype(NP[dtype]) for k, v in out.items()}


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even in bf16 (as float64)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def _want(expr: str, inputs: dict[str, np.ndarray], dtype: str) -> np.ndarray:
    a = np.asarray(inputs["A"], np.float64)
    c = np.asarray(inputs["c"], np.float64)[None, :, None]
    want = FORMULA[expr](a, c)
    return _bf16(want) if dtype == "bf16" else want


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("expr", sorted(FORMULA))
@pytest.mark.parametrize("N, P", [(4096, 64), (521, 3), (4099, 1), (26, 64)])
def test_one_element_column_alone_matches_numpy(N, P, expr, dtype, nki):
    """4096 x 64 and 26 x 64: flattened onto 128 partitions; 521 x 3 (1563 = 3 x 521 elements) and 4099 x 1
    (a prime): the leading loops on the partitions, cut into whole tiles and the rest."""
    prog = lang.load(UNIT.format(N=N, P=P, expr=expr).replace("f32", dtype))
    c = compile_loaded(prog, None, nki)
    inputs = _inputs(prog, dtype)
    assert_matches(prog, "Y", c.run(**inputs)["Y"], _want(expr, inputs, dtype))


def test_the_value_is_copied_to_every_partition_once():
    """4096 x 1 x 64: one (1, 1) load of c, one ones-matmul to 128 partitions, then 128-partition tiles of the
    flattened output (not 4096 tiles of one partition)."""
    c = compile_loaded(lang.load(UNIT.format(N=4096, P=64, expr="2 * c[m] + 1")), None, "0.6")
    src = wrap.unwrap(numbered(c.source))
    assert src.count("nc_matmul(") == 1 and "c_col = nl.ndarray((128, 1)" in src
    assert "Y_tile = nl.ndarray((128, 1024)" in src and "for t in range(2)" in src
    ragged = wrap.unwrap(numbered(compile_loaded(lang.load(UNIT.format(N=4099, P=1, expr="c[m]")), None, "0.6")
                                  .source))
    assert "Y_tile_a = nl.ndarray((128, 1)" in ragged and "Y_tile_b = nl.ndarray((3, 1)" in ragged


def test_inf_and_nan_stay_what_they_are():
    """The copy to every partition multiplies by ones only (no zero times inf)."""
    prog = lang.load(UNIT.format(N=300, P=5, expr="c[m]"))
    c = compile_loaded(prog)
    for v in (np.inf, -np.inf, np.nan):
        got = np.asarray(c.run(A=np.zeros((300, 1, 5), np.float32), c=np.array([v], np.float32))["Y"])
        assert np.array_equal(got, np.full((300, 1, 5), v, np.float32), equal_nan=True)


def test_two_leading_loops_of_a_4d_output():
    prog = lang.load(UNIT4)
    c = compile_loaded(prog)
    inputs = _inputs(prog, "f32")
    want = np.broadcast_to(np.maximum(inputs["c"].astype(np.float64) - 0.5, 0)[None, None, :, None], (3, 50, 1, 7))
    assert_matches(prog, "Y", c.run(**inputs)["Y"], want)


CASES = {"unit_column_flat": UNIT.format(N=512, P=64, expr="A[n, m, p] - 3 * c[m]"),
         "unit_column_ragged": UNIT.format(N=4099, P=1, expr="2 * c[m] + 1")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_rule_keeps_the_meaning(name, golden):
    """The scheduled level-A nest evaluates like the program and like NumPy."""
    prog = lang.load(CASES[name])
    op = select(lower(prog.kernel, prog.sizes), prog)[0]
    nest = eltwise_nest(op, prog)
    prims = rules.eltwise(nest, target("trn2"), default_plan(op, {}))
    assert prims is not None and any(p.name == "broadcast" for p in prims)
    scheduled = rules.apply(nest, prims, target("trn2"))
    inputs = _inputs(prog, "f32")
    got = evaluate_nest(scheduled, inputs)["Y"]
    np.testing.assert_allclose(got, evaluate_nest(lower_nest(prog), inputs)["Y"], rtol=1e-6)
    expr = "A[n, m, p] - 3 * c[m]" if "flat" in name else "2 * c[m] + 1"
    np.testing.assert_allclose(got, _want(expr, inputs, "f32"), rtol=1e-6)
    golden.check(f"compiler/rules/{name}.txt", rules.print_prims(prims) + "\n" + print_nest(scheduled))


def test_a_users_tiles_keep_the_column_layout():
    """Directives (`tile Y.p, 32`: 32 free elements per tile) are kept, not overridden: the tiles stay those of the
    column layout (one partition each), still matching NumPy; the default schedule is the flattened one."""
    prog = lang.load(UNIT.format(N=40, P=64, expr="2 * c[m] + 1"))
    c = compile_loaded(prog, lang.parse_schedule("tile Y.p, 32", "<test>"), "0.6")
    src = wrap.unwrap(numbered(c.source))
    assert "Y_tile = nl.ndarray((1, 32)" in src and "nc_matmul(" not in src
    inputs = _inputs(prog, "f32")
    assert_matches(prog, "Y", c.run(**inputs)["Y"], _want("2 * c[m] + 1", inputs, "f32"))
    assert "nc_matmul(" in numbered(compile_loaded(prog, None, "0.6").source)


def test_explain_shows_the_rules_layout_not_the_plans_one_partition():
    """`tilec explain` of the default schedule: the plan's one-partition tiles (`tile Y.n, 64`) are not the kernel's,
    so the schedule says the rule lays the column out itself, and its primitives follow; a user's tiles (which the
    rule keeps) still print as their plan."""
    prog = lang.load(UNIT.format(N=4096, P=64, expr="2 * c[m] + 1"))
    text = compile_loaded(prog, None, "0.6").stages["schedule"]
    assert "a one-element column alone: rules.eltwise lays it out itself" in text, text
    assert "tile Y.n" not in text and "#   broadcast(c_row" in text
    users = compile_loaded(prog, lang.parse_schedule("tile Y.p, 32", "<test>"), "0.6").stages["schedule"]
    assert "one-element column alone" not in users and "EltwisePlan(parts=1, free=32)" in users
