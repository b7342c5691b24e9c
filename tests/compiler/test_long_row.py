"""One long row reduced into one element (reduce_split's total of a dot product or of one long loop: `s[z] OP=
s_row[z, i]`) goes over the 128 partitions (build_reduce.build_long_row: per-partition reduces into a column, then
a ones matmul or a transpose across the partitions), and the row's terms are an element-wise nest on 128 partitions
(a read leaving out the row's loop of one iteration is read in full, not broadcast over one partition); matches
NumPy in float64, in both NKI dialects."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run
from tilec.compiler import wrap
from tilec.compiler.build_reduce import LONG_ROW, long_row
from tilec.lang.evaluator import round_to

N = 4 * LONG_ROW  # 65536 elements: 128 partitions of 512

PROGRAMS = {  # name: (program, NumPy formula of the rounded inputs)
    "dot": (f"""kernel dot(a: {{t}}[N], b: {{t}}[N]) -> s
  default N = {N}
  s: f32[1]
  s[0] = 0
  for i in 0..N:
    s[0] += a[i] * b[i]
""", lambda x: np.array([np.dot(x["a"], x["b"])])),
    "mean_plus_one": (f"""kernel m1(x: {{t}}[N]) -> s
  default N = {N}
  s: {{t}}[1]
  s[0] = 1
  for i in 0..N:
    s[0] += x[i] / N
""", lambda x: np.array([1 + x["x"].mean()])),
    "max_shifted": (f"""kernel mx(x: {{t}}[N]) -> s
  default N = {N}
  s: f32[1]
  s[0] = -inf
  for i in 0..N:
    s[0] max= x[i] - 2
""", lambda x: np.array([x["x"].max() - 2])),
    "min_from_zero": (f"""kernel mn(x: {{t}}[N]) -> s
  default N = {N}
  s: f32[1]
  s[0] = 0
  for i in 0..N:
    s[0] min= x[i] + 0.25
""", lambda x: np.array([min(0.0, x["x"].min() + 0.25)])),
}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_long_row_into_one_element_matches_numpy(name, dtype, nki):
    text, formula = PROGRAMS[name]
    prog, c, inputs, out = compile_and_run(text.format(t=dtype), nki)
    assert "over the partitions" in c.source  # (an expression of vectors: build_longrows' one row, cols17)
    x = {k: np.asarray(round_to(prog.tensors[k].dtype, np.asarray(v, np.float32)), np.float64)
         for k, v in inputs.items()}
    assert_matches(prog, "s", out["s"], formula(x))


def test_the_terms_and_the_reduce_use_128_partitions():
    """A plain long row: its row of terms on 128 partitions; a dot product: no row of terms at all (the two vectors
    over the partitions, build_longrows: cols17)."""
    _, c, _, _ = compile_and_run(PROGRAMS["mean_plus_one"][0].format(t="f32").replace("x[i] / N", "x[i]"), "0.6")
    lines = wrap.unwrap(c.source)
    assert "the row over the partitions" in lines and "copied to every partition" not in lines
    _, c, _, _ = compile_and_run(PROGRAMS["dot"][0].format(t="f32"), "0.6")
    lines = wrap.unwrap(c.source)
    assert "s_row" not in lines and "copied to every partition" not in lines
    assert "nl.ndarray((128, 1), dtype=nl.float32" in lines  # the column of per-partition sums


def test_short_rows_and_others_keep_their_schedules():
    assert long_row(1, LONG_ROW - 128, "f32", True, False) is None  # short: one partition is as good
    assert long_row(1, LONG_ROW + 1, "f32", True, False) is None  # not 128 runs of whole elements
    assert long_row(2, 4 * LONG_ROW, "f32", True, False) is None  # two rows: the row rule
    assert long_row(1, 4 * LONG_ROW, "f32", True, True) is None  # an initial value read from a tensor
    assert long_row(1, 128 * 8192, "f32", True, False) == 4096  # 16 KiB tiles of fp32 per partition
    _, c, _, _ = compile_and_run(PROGRAMS["dot"][0].format(t="f32").replace(f"N = {N}", "N = 4096"), "0.6")
    assert "the row over the partitions" not in c.source


def test_explain_says_the_long_row_has_no_schedule_parameters():
    """Its plan's directives would be refused (directives.fixed_schedule): `explain` prints none for it."""
    _, c, _, _ = compile_and_run(PROGRAMS["dot"][0].format(t="f32"), "0.6")
    stage = c.result.stages["schedule"]
    assert "# s: a reduction of a few long rows, each over the partitions" in stage and "tile s.i" not in stage
