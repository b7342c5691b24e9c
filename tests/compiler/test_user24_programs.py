"""user24's survey: programs a user writes after user20's and user23's (tests/programs/user24/: a SwiGLU FFN, an
MBConv block with squeeze-excite, Conformer's conv module, fused norms before a projection, losses reduced to one
number, audio convs, NHWC data movement), each compiled with the default schedule and run on the interpreter in f32
against its NumPy formula (user24_formulas.py), or refused with a located TilecError and a hint.
benchmarks/gaps15.py times them at realistic sizes (docs/notes/user24.md)."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_matches
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang
from user24_formulas import FORMULAS, INPUTS

FOLDER = pathlib.Path(__file__).parents[1] / "programs" / "user24"
REFUSED: dict[str, int] = {  # program -> the refused line
    "gram_batch_mean": 8, "scalar_mix": 21, "spatial_attention": 18,
}
PROGRAMS = sorted(p.stem for p in FOLDER.glob("*.tl"))


def run(name: str, dtype: str = "f32", seed: int = 3):
    """Compile and run a survey program with its tensors in `dtype`; inputs signed in [-0.5, 0.5) (exact in bf16)
    unless INPUTS makes them. Returns (program, outputs, the inputs in float64)."""
    prog = lang.load((FOLDER / f"{name}.tl").read_text().replace("f32", dtype))
    rng = np.random.default_rng(seed)
    makers = INPUTS.get(name, {})
    inputs = {t.name: makers[t.name](rng, t.shape) if t.name in makers
              else rng.random(t.shape, dtype=np.float32) - np.float32(0.5) for t in prog.inputs}
    if dtype == "bf16":
        inputs = {k: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in inputs.items()}
    out = compile_loaded(prog).run(**inputs)
    return prog, out, {k: np.asarray(v, np.float64) for k, v in inputs.items()}


def test_every_program_has_a_formula_or_a_refusal():
    assert set(PROGRAMS) == set(FORMULAS) and set(REFUSED) < set(PROGRAMS)


@pytest.mark.parametrize("name", [p for p in PROGRAMS if p not in REFUSED])
def test_program_matches_numpy(name):
    prog, out, a = run(name)
    for tensor, want in FORMULAS[name](a).items():
        assert_matches(prog, tensor, out[tensor], want)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_program_is_refused_at_its_line_with_a_hint(name):
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load((FOLDER / f"{name}.tl").read_text()))
    assert err.value.span is not None and err.value.span.line == REFUSED[name] and err.value.hint
