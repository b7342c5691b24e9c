"""user20's survey: programs a user of ResNet/MobileNet/UNet/transformer layers writes after the examples
(tests/programs/user20/), each compiled and run on the interpreter in f32 and bf16 against its NumPy formula
(user20_formulas.py, from the layers' definitions), or refused with a located TilecError and a hint.
benchmarks/gaps15.py times the ones docs/notes/user20.md lists at realistic sizes."""
from __future__ import annotations

import pathlib

import pytest

from compiler_helpers import assert_matches, run_signed
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang
from user20_formulas import FORMULAS

FOLDER = pathlib.Path(__file__).parents[1] / "programs" / "user20"
REFUSED = {  # program -> the refused line (a flatten read back whole, a transposed conv's strided output, heads
    # packed in the contraction's operands: merged indices that view_split leaves to the contraction rules)
    "avgpool_flatten_fc": 7, "conv_transpose2x2": 8, "heads_scores": 8,
}
PROGRAMS = sorted(p.stem for p in FOLDER.glob("*.tl"))


def test_every_program_has_a_formula_or_a_refusal():
    assert set(PROGRAMS) == set(FORMULAS) and set(REFUSED) < set(PROGRAMS)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", [p for p in PROGRAMS if p not in REFUSED])
def test_program_matches_numpy(name, dtype):
    prog, _, out, a = run_signed((FOLDER / f"{name}.tl").read_text(), dtype, seed=1)
    for tensor, want in FORMULAS[name](a).items():
        assert_matches(prog, tensor, out[tensor], want)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_program_is_refused_at_its_line_with_a_hint(name):
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load((FOLDER / f"{name}.tl").read_text()))
    assert err.value.span is not None and err.value.span.line == REFUSED[name] and err.value.hint
