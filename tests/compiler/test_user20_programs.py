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
REFUSED = {  # program -> the refused line (a flatten read back whole: merged indices that view_split leaves to the
    # contraction rules; heads packed in the operands compile: heads_split.py; a transposed conv: tconv_split.py)
    "avgpool_flatten_fc": 7,
}
PROGRAMS = sorted(p.stem for p in FOLDER.glob("*.tl"))


def test_every_program_has_a_formula_or_a_refusal():
    assert set(PROGRAMS) == set(FORMULAS) and set(REFUSED) < set(PROGRAMS)


@pytest.mark.parametrize("name,dtype", [(p, dt) for p in PROGRAMS if p not in REFUSED for dt in ("f32", "bf16")])
def test_program_matches_numpy(name, dtype):
    prog, _, out, a = run_signed((FOLDER / f"{name}.tl").read_text(), dtype, seed=1)
    for tensor, want in FORMULAS[name](a).items():
        assert_matches(prog, tensor, out[tensor], want)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_program_is_refused_at_its_line_with_a_hint(name):
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load((FOLDER / f"{name}.tl").read_text()))
    assert err.value.span is not None and err.value.span.line == REFUSED[name] and err.value.hint


@pytest.mark.parametrize("name", ["channel_shuffle", "group_norm", "batched_matvec", "rope"])
def test_rewritten_programs_match_numpy_in_nki_01(name):
    """The rewrites are source-level (view_split's signature views, matvec_split's columns, store_split's part):
    the NKI 0.1 form runs them too."""
    from compiler_helpers import compile_and_run
    import numpy as np

    prog, _, inputs, out = compile_and_run((FOLDER / f"{name}.tl").read_text(), "0.1")
    for tensor, want in FORMULAS[name]({k: np.asarray(v, np.float64) for k, v in inputs.items()}).items():
        assert_matches(prog, tensor, out[tensor], want)


def test_views_keep_the_signature_and_split_only_merged_dimensions():
    """channel_shuffle's X and Y are viewed split inside the kernel; the kernel still takes and returns the
    [N, G * Cg, H, W] arrays (its shape checks), and a program without merged indices is left alone."""
    from tilec.compiler.view_split import split_merged_dims

    prog = lang.load((FOLDER / "channel_shuffle.tl").read_text())
    split = split_merged_dims(prog)
    assert split.tensors["X"].shape == (2, 4, 16, 8, 8) and split.tensors["Y"].shape == (2, 16, 4, 8, 8)
    assert split.views == {"X": (2, 64, 8, 8), "Y": (2, 64, 8, 8)}
    source = compile_loaded(prog).source
    assert "X.shape == (2, 64, 8, 8)" in source and ".reshape(" in source
    plain = lang.load((FOLDER / "glu.tl").read_text())
    assert split_merged_dims(plain) is plain


DEPENDENT = """\
kernel dep(X: f32[M, N]) -> s, t
  default M = 64, N = 32
  s: f32[M]
  t: f32[M]
  for i in 0..M:
    s[i] = 0
    t[i] = 0
    for j in 0..N:
      s[i] += X[i, j]
      t[i] += X[i, j] * s[i]
"""


def test_fission_leaves_a_loop_whose_reductions_read_each_other():
    """t reads the running s: one nest per tensor would change t (each t term would read the finished s)."""
    from tilec.compiler.fission import distribute_reductions

    prog = lang.load(DEPENDENT)
    assert distribute_reductions(prog) is prog
    independent = lang.load((FOLDER / "channel_max_mean.tl").read_text())
    assert len(distribute_reductions(independent).kernel.body) == 2
