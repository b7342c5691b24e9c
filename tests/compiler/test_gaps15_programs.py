"""gaps15's survey programs (tests/programs/gaps15/: what a user writes after the examples) keep their outcome:
each compiles and matches the reference evaluator (NKI 0.6, the CLI's default), or is refused with a located
TilecError. benchmarks/gaps15.py runs them in both dialects with the model's time against the floor."""
from __future__ import annotations

import pathlib
import warnings

import pytest

from tilec.testing.oracle import check

PROGRAMS = sorted((pathlib.Path(__file__).parents[1] / "programs" / "gaps15").glob("*.tl"))
REFUSED = {  # program -> why (docs/notes/gaps15.md)
}


def test_the_refusal_table_names_survey_programs():
    assert set(REFUSED) <= {p.stem for p in PROGRAMS}


@pytest.mark.parametrize("path", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_survey_program_outcome(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verdict, _ = check(path.read_text(), None)
    assert verdict.cls == ("rejected" if path.stem in REFUSED else "ok"), verdict.line()
