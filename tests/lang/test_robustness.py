"""Mangled programs (random edits of the examples) either load or raise a TilecError with a span inside the
file: never another exception."""
from __future__ import annotations

import pathlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilec.errors import TilecError
from tilec.lang import api

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parents[2] / "examples").glob("*.tl"))
TEXTS = [p.read_text() for p in EXAMPLES]
PIECES = ["[", "]", "(", ")", ",", ":", "..", "=", "+=", "max=", "-", "*", "/ 0", "% 2", " for ", " in ", "i",
          "N", "1.5", "-inf", "\n", "\n    ", "  ", "#", "f16", "relu(", "X[", "let ", "assume ", "default ",
          "schedule:\n    split Y.i, 2\n", "0", "Y", "conv", "0..", "->", "@", "x[0]"]


@st.composite
def mangled(draw) -> str:
    text = draw(st.sampled_from(TEXTS))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        cut = draw(st.integers(0, 6))
        text = text[:at] + draw(st.sampled_from(PIECES + [""])) + text[at + cut:]
    return text


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=mangled(), small=st.booleans())
def test_mangled_programs_fail_cleanly(text: str, small: bool) -> None:
    try:
        prog = api.load(text)
    except TilecError as err:
        rendered = err.render()
        assert "error:" in rendered and err.hint
        if err.span is not None:
            assert 1 <= err.span.line <= len(text.splitlines()) + 1 and err.span.col >= 1
        return
    assert prog.kernel.name


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=mangled(), size=st.sampled_from([2, 3, 4]))
def test_mangled_programs_that_check_also_evaluate(text: str, size: int) -> None:
    """Where a mangled program still checks at tiny sizes, the evaluator runs it to the end."""
    try:
        symbols = api.load(text).facts.symbols
        prog = api.load(text, {name: size for name in symbols})
    except TilecError:
        return
    outputs = api.evaluate(prog, api.random_inputs(prog, 0))
    assert set(outputs) == set(prog.kernel.outputs)
    for name, array in outputs.items():
        assert array.shape == prog.tensors[name].shape
