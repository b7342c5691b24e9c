"""Issue 10's directives on column sums and reductions (core23): a column sum's row tile that does not divide its
summed rows leaves a smaller last tile, summed into the same PSUM row (rules_colragged); where another layout sums
it, the tile is refused at its line with the divisors. `reorder` and `split` of a reduction are refused at their
line saying which case it is and what to write. Small shapes for the interpreter; NumPy formulas in float64."""
from __future__ import annotations

import numpy as np
import pytest

from test_core20_directives import ROWSUM, code, compiled, matches
from test_core22_directives import CENTRE
from tilec.errors import TilecError

COLSUM = """kernel c(X: f32[M, N], r: f32[N], b: f32[N]) -> s
  default M = {M}, N = {N}
  s: f32[N]
  for j in 0..N:
    s[j] = {init}
  for i in 0..M, j in 0..N:
    s[j] {op} {term}
"""

MIDDLE = """kernel m(X: f32[A, B, C], Y0: f32[A, B, C]) -> s
  default A = {A}, B = {B}, C = {C}
  s: f32[A, C]
  for a in 0..A, c in 0..C:
    s[a, c] = 0
    for b in 0..B:
      s[a, c] += (X[a, b, c] - Y0[a, b, c]) * (X[a, b, c] - Y0[a, b, c])
"""

def colsum(init: str, term: str, op: str = "+="):
    return COLSUM.replace("{init}", init).replace("{term}", term).replace("{op}", op)


@pytest.mark.parametrize("init, term, formula", [
    ("0", "X[i, j]", lambda x: x["X"].sum(axis=0)),
    ("0", "abs(X[i, j] - r[j])", lambda x: np.abs(x["X"] - x["r"]).sum(axis=0)),  # a row copied to the partitions
    ("b[j]", "X[i, j] / M", lambda x: x["X"].mean(axis=0) + x["b"]),  # an epilogue on the PSUM row's eviction
])
def test_a_row_tile_that_does_not_divide_a_column_sum_leaves_a_smaller_last_tile(init, term, formula):
    c = compiled(colsum(init, term), "tile s.i, 64", M=300, N=200)
    src = code(c.source)
    assert "X_tile_b" in src and "X[256:300" in src, src  # 300 rows: 4 x 64, then 44
    assert "accumulate=True" in src, src  # the last part adds to the sum the whole tiles started
    matches(c, formula, "s")


@pytest.mark.parametrize("schedule, parts", [
    ("tile s.j, 64", ("X[rt * TILE_P:rt * TILE_P + TILE_P, 192:200]",)),  # 200 columns: 3 x 64, then 8
    ("tile s.j, 64\ntile s.i, 64", ("X[256:300, 192:200]",)),  # and 300 rows: 4 x 64, then 44
])
@pytest.mark.parametrize("init, term, formula", [
    ("0", "X[i, j]", lambda x: x["X"].sum(axis=0)),
    ("0", "abs(X[i, j] - r[j])", lambda x: np.abs(x["X"] - x["r"]).sum(axis=0)),
    ("b[j]", "X[i, j] / M", lambda x: x["X"].mean(axis=0) + x["b"]),  # the epilogue cut at the same column
])
def test_a_column_tile_that_does_not_divide_the_columns_makes_a_second_column_sum(schedule, parts, init, term,
                                                                                   formula):
    c = compiled(colsum(init, term), schedule, M=300, N=200)
    src = code(c.source)
    assert all(p in src for p in parts) and "columns 192..200" in src, src
    matches(c, formula, "s")


def test_a_middle_axis_sum_takes_a_ragged_row_tile_per_outer_index():
    c = compiled(MIDDLE, "tile s.b, 64", A=3, B=200, C=100)
    assert "X[o, 192:200]" in code(c.source), code(c.source)  # per outer index a (o): 3 x 64 rows, then 8
    matches(c, lambda x: ((x["X"] - x["Y0"]) ** 2).sum(axis=1), "s")


@pytest.mark.parametrize("init, op, schedule, rows, says", [
    ("-inf", "max=", "tile s.i, 64", 300, "(reduced rows: 100, 75, 60, 50, 30)"),  # a column max: its own builder
    ("0", "+=", "tile s.i, 120", 100, "more than the 100 rows"),
    ("-inf", "max=", "tile s.j, 64", 300, "(columns: 200, 100, 50, 40, 25)"),  # its columns neither
])
def test_a_column_tile_no_layout_takes_is_refused_at_its_line(init, op, schedule, rows, says):
    with pytest.raises(TilecError) as err:
        compiled(colsum(init, "X[i, j]", op), schedule, M=rows, N=200)
    assert err.value.span is not None and err.value.span.line == 1 and says in str(err.value), str(err.value)


@pytest.mark.parametrize("text, schedule, says, hint", [
    (ROWSUM, "reorder s, j, i", "reduced tiles (j) cannot go outside its row tiles (i)", "tile s.j, N"),
    (ROWSUM, "reorder s, i, j", "is the order the rule compiles s in already", "remove it"),
    (ROWSUM, "split s.i, 2", "`split` of s's loop `i` is not compiled", "tile s.i, N"),
    (colsum("0", "X[i, j]"), "reorder s, i, j", "row tiles (i) cannot go outside its free tiles (j)", "tile s.j, N"),
    (colsum("0", "X[i, j]"), "reorder s, j, i", "is the order the rule compiles s in already", "remove it"),
    (MIDDLE, "reorder s, b, a, c", "a of s are taken one at a time outside its tiles", "list a first"),
    (MIDDLE, "reorder s, a, c, x", "reorder lists loop variables of s, each once: a, c, b", ""),
])
def test_reorder_and_split_of_a_reduction_say_why_and_what_to_write(text, schedule, says, hint):
    with pytest.raises(TilecError) as err:
        compiled(text, schedule, M=300, N=200, A=3, B=200, C=100)
    e = err.value
    assert e.span is not None and e.span.line == 1 and says in str(e) and hint in e.hint, (str(e), e.hint)



@pytest.mark.parametrize("schedule, line", [("compute_at mu, Y.i", 1), ("tile Y.j, 32\nplace mu, sbuf", 2)])
def test_a_placement_the_compiler_makes_anyway_says_so(schedule, line):
    """`compute_at` / `place sbuf` of a statistic several statements read: refused as changing nothing when the
    row chain keeps it on chip without the directive; with Y scheduled alone (a directive names it) mu goes
    through HBM and the refusal says where it goes is the compiler's choice."""
    with pytest.raises(TilecError) as err:
        compiled(CENTRE, schedule, M=200, N=64)
    e = err.value
    assert e.span is not None and e.span.line == line, str(e)
    assert ("stays on chip without the directive" if line == 1 else "is the compiler's choice") in str(e), str(e)
    assert "place mu, hbm" in e.hint
