"""Every loop of a generated kernel is tagged with the .tl line of the `for` it implements, every instruction with
the line of its statement (pool, transpose and element-wise kernels as well as convolutions)."""
from __future__ import annotations

import re

import pytest

from compiler_helpers import ROOT, compile_example

CASES = {
    "transpose": {"M": 512, "N": 384},
    "vector_add": {"L": 256000},
    "avgpool": {"N": 2, "C": 128, "H": 64, "W": 64},
}


def _tags(source: str, pattern: str) -> set[int]:
    return {int(m) for m in re.findall(pattern + r".*# tl:(\d+)", source)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_loops_carry_their_own_line(name):
    c = compile_example(name, CASES[name])
    text = [line.strip() for line in c.program.source.splitlines()]
    for_lines = {n for n, line in enumerate(text, 1) if line.startswith("for ")}
    stmt_lines = {n for n, line in enumerate(text, 1) if re.match(r"\w+\[.*\] *(=|\+=|max=)", line)}
    loops = _tags(c.source, r"for \w+ in nl\.\w+_range\(")
    instructions = _tags(c.source, r"nisa\.")
    assert loops and loops <= for_lines
    assert instructions and instructions <= stmt_lines


def test_operand_preparation_loops_say_so():
    """Weight and bias loops run before the nest but carry the line of the statement that uses them: each such
    `for` says it prepares that operand, and keeps the `# tl:N` prefix the profiler reads."""
    source = (ROOT / "generated" / "conv_bias_maxpool.py").read_text()
    head = source[:source.index("# ---- main")]
    loops = [line for line in head.splitlines() if re.search(r"\bfor \w+ in nl\.", line)]
    assert len(loops) == 5  # k, c, r, s of the weights; k of the bias column
    assert all(re.search(r"# tl:\d+  (prepare Wt|load b as columns): for ", line) for line in loops)
