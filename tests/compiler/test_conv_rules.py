"""The conv default plan as a table of rules (schedule_conv.CONV_RULES): records with a name, a predicate, a plan
and the reason; the first rule that applies plans the conv. Checked: the table's records, and the rule each of
issue 13's families (and a 1x1 conv of many channels) is planned by. That the table plans exactly what the former
`if` branches planned is checked by `python -m tilec.compiler.regen --check` (generated kernels and goldens) and by
the families tables (docs/notes/conv22.md)."""
from __future__ import annotations

import pathlib

import pytest

from tilec.compiler import schedule_conv
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

FAMILIES = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "families"

ONE_BY_ONE = """kernel pointwise(X: f32[N, C, H, W], Wt: f32[K, C]) -> Y
  default N = 1, C = 256, H = 56, W = 56, K = 128
  Y: f32[N, K, H / 2, W / 2]
  for n in 0..N, k in 0..K, y in 0..H / 2, x in 0..W / 2:
    Y[n, k, y, x] = 0
    for c in 0..C:
      Y[n, k, y, x] += X[n, c, 2*y, 2*x] * Wt[k, c]
"""


def test_table_records() -> None:
    names = [rule.name for rule in schedule_conv.CONV_RULES]
    assert len(set(names)) == len(names)
    assert all(len(rule.why) > 80 for rule in schedule_conv.CONV_RULES)  # each says why, with its measurements
    assert names[-1] == "plain"


def rules_of(text: str, sizes: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    chosen: list[str] = []
    first = schedule_conv.conv_rule

    def spy(op, dtypes):
        rule, z = first(op, dtypes)
        chosen.append(rule.name)
        return rule, z
    monkeypatch.setattr(schedule_conv, "conv_rule", spy)
    compile_loaded(lang.load(text, sizes))
    return chosen


# (family, dtype, batch) -> the rule of its (first) conv
CASES = [
    ("conv3x3same", "f32", 1, "row pairs"),
    ("conv3x3s2", "f32", 1, "folded taps"),
    ("conv3x3s2", "bf16", 2, "strided folded: two bands per image"),
    ("conv_odd", "f32", 1, "mixed taps"),
    ("conv_odd", "bf16", 1, "plain"),
    ("conv1x1s2", "f32", 1, "1x1: stacked bands"),
]


@pytest.mark.parametrize("family,dtype,n,rule", CASES)
def test_family_rule(family: str, dtype: str, n: int, rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (FAMILIES / f"{family}.tl").read_text().replace("f32[", f"{dtype}[")
    assert rules_of(text, {"N": n}, monkeypatch)[0] == rule


def test_one_by_one_many_channels(monkeypatch: pytest.MonkeyPatch) -> None:
    """A strided 1x1 conv of 256 input channels (they do not stack on the partition halves): a band per matmul
    group, whose input rows (27 per group of 14 output rows) are long enough DMA rows."""
    assert rules_of(ONE_BY_ONE, {}, monkeypatch) == ["1x1: a band per matmul group"]
