"""Two reductions initialised together in one nest (`se[i] = 0; tgt[i] = 0; for j: se[i] += ..; tgt[i] += ..`, a
cross-entropy loss written as a user writes it) compile as two reductions, each with its own init (fission.py, or
lower.py when a later statement of the loop reads several of them); a
statement that reads a tensor its own loop is still accumulating, or a loop continuing a finished reduction, is
refused at its line (lower.py)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run
from tilec.errors import TilecError

XENT = """\
kernel xent(L: f32[M, N], onehot: f32[M, N]) -> loss
  default M = 200, N = 300
  mx: f32[M]
  se: f32[M]
  tgt: f32[M]
  loss: f32[M]
  for i in 0..M:
    mx[i] = -inf
    for j in 0..N:
      mx[i] max= L[i, j]
  for i in 0..M:
    se[i] = 0
    tgt[i] = 0
    for j in 0..N:
      se[i] += exp(L[i, j] - mx[i])
      tgt[i] += L[i, j] * onehot[i, j]
  for i in 0..M:
    loss[i] = log(se[i]) + mx[i] - tgt[i]
"""

RUNNING = """\
kernel running(A: f32[M, N], B: f32[M, N]) -> t
  default M = 128, N = 64
  s: f32[M]
  t: f32[M]
  for i in 0..M:
    s[i] = 0
    t[i] = 0
    for j in 0..N:
      s[i] += A[i, j]
      t[i] += s[i] * B[i, j]
"""


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
def test_two_reductions_initialised_together_match_numpy(nki: str) -> None:
    prog, _, a, out = compile_and_run(XENT, nki)
    logits = a["L"].astype(np.float64)
    m = logits.max(1)
    want = np.log(np.exp(logits - m[:, None]).sum(1)) + m - (logits * a["onehot"]).sum(1)
    assert_matches(prog, "loss", out["loss"], want)


# an element-wise statement in the accumulating loop compiled before and gave the finished sum's quotients (7e3 off)
RUNNING_ELTWISE = """\
kernel run2(A: f32[M, N]) -> Y
  default M = 128, N = 64
  s: f32[M]
  Y: f32[M, N]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += A[i, j]
      Y[i, j] = A[i, j] / s[i]
"""


@pytest.mark.parametrize("text,line", [(RUNNING, 10), (RUNNING_ELTWISE, 9)], ids=["reduction", "eltwise"])
def test_reading_a_running_sum_is_refused_at_its_line(text: str, line: int) -> None:
    with pytest.raises(TilecError) as err:
        compile_and_run(text, "0.6")
    assert err.value.span is not None and err.value.span.line == line
    assert "accumulates s" in err.value.message and "loop of its own" in str(err.value)


def test_a_read_after_the_accumulating_loop_is_not_refused() -> None:
    """`Y` reads s after s's loop has finished (in the enclosing body): the whole sum, as compiled."""
    text = RUNNING.replace("      t[i] += s[i] * B[i, j]\n", "    t[i] = s[i] * 2\n").replace("    t[i] = 0\n", "")
    prog, _, a, out = compile_and_run(text, "0.6")
    assert_matches(prog, "t", out["t"], a["A"].astype(np.float64).sum(1) * 2)


def test_a_reduction_continuing_one_read_meanwhile_is_refused_with_what_to_write() -> None:
    """(the selector said "needs an initial value", which the program has); u reads s's first sum, so the second
    loop cannot join the first (continue_split.py)"""
    text = RUNNING.replace("      t[i] += s[i] * B[i, j]\n", "").replace("    t[i] = 0\n", "") + \
        "  for i in 0..M:\n    t[i] = s[i] * 2\n" + \
        "  for i in 0..M:\n    for j in 0..N:\n      s[i] += A[i, j] * B[i, j]\n"
    with pytest.raises(TilecError) as err:
        compile_and_run(text, "0.6")
    assert err.value.span is not None and err.value.span.line == 13
    assert "keeps accumulating into s" in err.value.message and "of its own" in str(err.value)


def test_a_reduction_continuing_a_finished_one_in_the_same_loop_is_a_chain() -> None:
    """continue_split.py: s's second loop starts from the first's sum."""
    text = RUNNING.replace("      t[i] += s[i] * B[i, j]\n", "    for j in 0..N:\n      s[i] += A[i, j] * B[i, j]\n")
    text = text.replace("    t[i] = 0\n", "") + "  for i in 0..M:\n    t[i] = s[i]\n"
    prog, _, a, out = compile_and_run(text, "0.6")
    A, B = a["A"].astype(np.float64), a["B"].astype(np.float64)
    assert_matches(prog, "t", out["t"], A.sum(1) + (A * B).sum(1))


# the statistics' loop cannot be distributed (Y reads both in the same row loop): lowering merges each reduction with
# its own init (the fuzz family gen_nests.py found it refused when only fission did this)
STATS_THEN_USE = """\
kernel stats(A: f32[M, N]) -> Y
  default M = 130, N = 200
  s1: f32[M]
  s2: f32[M]
  Y: f32[M, N]
  for i in 0..M:
    s1[i] = 0
    s2[i] = -inf
    for j in 0..N:
      s1[i] += A[i, j] / 200
      s2[i] max= A[i, j]
    for j in 0..N:
      Y[i, j] = A[i, j] * 2 - s1[i] + s2[i]
"""


def test_statistics_initialised_together_and_used_in_the_same_row_loop_match_numpy() -> None:
    prog, _, a, out = compile_and_run(STATS_THEN_USE, "0.6")
    x = a["A"].astype(np.float64)
    assert_matches(prog, "Y", out["Y"], x * 2 - x.mean(1)[:, None] + x.max(1)[:, None])
