"""user23's survey: programs a user writes after the examples (tests/programs/user23/: distances, similarities,
normalisations, losses, attention biases, a Gram matrix, a dilated and a weight-standardised conv, upsampling),
each compiled and run on the interpreter in f32 against its NumPy formula (user23_formulas.py), or refused with a
located TilecError and a hint. benchmarks/gaps15.py times them at realistic sizes (docs/notes/user23.md)."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_matches, run_signed
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang
from user23_formulas import FORMULAS

FOLDER = pathlib.Path(__file__).parents[1] / "programs" / "user23"
REFUSED = {  # program -> the refused line
    "alibi_scores": 13, "relpos_bias": 10, "bilinear_up2_taps": 7,
}
PROGRAMS = sorted(p.stem for p in FOLDER.glob("*.tl"))


def test_every_program_has_a_formula_or_a_refusal():
    assert set(PROGRAMS) == set(FORMULAS) and set(REFUSED) < set(PROGRAMS)


@pytest.mark.parametrize("name", [p for p in PROGRAMS if p not in REFUSED])
def test_program_matches_numpy(name):
    prog, _, out, a = run_signed((FOLDER / f"{name}.tl").read_text(), "f32", seed=3)
    for tensor, want in FORMULAS[name](a).items():
        assert_matches(prog, tensor, out[tensor], want)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_program_is_refused_at_its_line_with_a_hint(name):
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load((FOLDER / f"{name}.tl").read_text()))
    assert err.value.span is not None and err.value.span.line == REFUSED[name] and err.value.hint


def test_squared_distances_of_near_rows_within_the_expansions_error():
    """The expanded form |a|^2 - 2 a.b + |b|^2 cancels where rows are near: its f32 error is relative to
    |a|^2 + |b|^2, not to the distance. B's rows are A's (some exact, some 1e-3 apart, some far), so the near
    distances are ~1e-5 of the norms and a bound relative to the distance would fail; each entry is checked
    against (D + 2) * 4 eps32 * (|a|^2 + |b|^2), and the far ones also relatively."""
    src = (FOLDER / "sqdist.tl").read_text()
    prog = lang.load(src)
    (m, d), (n, _) = prog.tensors["A"].shape, prog.tensors["B"].shape
    rng = np.random.default_rng(7)
    A = rng.standard_normal((m, d)).astype(np.float32)
    B = np.concatenate([A[:n // 4], A[n // 4:n // 2] + np.float32(1e-3) * rng.standard_normal((n // 2 - n // 4, d)),
                        rng.standard_normal((n - n // 2, d))]).astype(np.float32)
    got = compile_loaded(prog).run(A=A, B=B)["Dm"]
    a, b = A.astype(np.float64), B.astype(np.float64)
    want = ((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=2)
    norms = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :]
    bound = (d + 2) * 4 * np.finfo(np.float32).eps * norms
    assert np.all(np.abs(got - want) <= bound)
    assert np.min(want[: n // 4, : n // 4].diagonal()) == 0 and np.min(want[:, n // 2:]) > 1  # cases present
    far = want[:, n // 2:]
    assert np.allclose(got[:, n // 2:], far, rtol=1e-4)


def test_distance_rewrite_is_one_contraction_with_the_norms_as_its_bias():
    """sqdist's statement becomes the norms, the augmented operands and one matmul started from |a|^2: no
    [M, N] temporary in HBM (what the element-wise form through ab costs)."""
    from tilec.compiler.distance_split import split_squared_distances

    prog = split_squared_distances(lang.load((FOLDER / "sqdist.tl").read_text()))
    temps = {name: t.shape for name, t in prog.tensors.items() if t.kind == "temp"}
    assert temps == {"Dm_aa": (96,), "Dm_bb": (80,), "Dm_Aa": (96, 33), "Dm_Ba": (80, 33)}


def test_gram_of_a_4d_map_views_the_input_with_its_pixels_merged():
    from tilec.compiler.merge_split import merge_reduced_runs

    prog = merge_reduced_runs(lang.load((FOLDER / "gram_style.tl").read_text()))
    assert prog.tensors["F"].shape == (2, 32, 64) and prog.views == {"F": (2, 32, 8, 8)}
    source = compile_loaded(lang.load((FOLDER / "gram_style.tl").read_text())).source
    assert ".reshape(" in source


def test_scales_along_the_columns_move_into_the_operands():
    """cosine_matrix's `dot * rsqrt(aa[i] + e) * rsqrt(bb[j] + e)`: each row's and column's factor scales A's and
    B's rows before the matmul (the result then leaves PSUM finished); a factor reading both i and j stays."""
    from tilec.compiler.scale_split import split_column_scales

    prog = split_column_scales(lang.load((FOLDER / "cosine_matrix.tl").read_text()))
    assert {"A_s", "B_s"} <= set(prog.tensors) and prog.tensors["B_s"].shape == (80, 32)
    both = (FOLDER / "cosine_matrix.tl").read_text().replace(
        "dot[i, j] * rsqrt(aa[i] + 0.00000001) * rsqrt(bb[j] + 0.00000001)", "dot[i, j] * rsqrt(aa[i] + bb[j])")
    plain = lang.load(both)
    assert split_column_scales(plain) is plain


def test_an_intermediate_finished_in_place_is_split_only_when_it_reads_another_tensor():
    """alibi_pos's `Sc = Sc * s + slope[h] * (..)` reads Sc's sum through Sc_acc; the FFN's `h = gelu(h)` stays as
    written (the eviction's epilogue: split, the FFN lost its fused hidden layer, bf16 1.47x -> 5.02x)."""
    from tilec.compiler.inplace_split import split_in_place_epilogues

    alibi = split_in_place_epilogues(lang.load((FOLDER / "alibi_pos.tl").read_text()))
    assert "Sc_acc" in alibi.tensors
    ffn = lang.load((FOLDER.parent / "gaps15" / "ffn_gelu.tl").read_text())
    assert split_in_place_epilogues(ffn) is ffn


def test_row_and_column_terms_ride_in_the_contraction():
    """sqdist_matmul's `aa[i] - 2 * ab[i, j] + bb[j]`: ab's matmul starts from aa and has bb as one more row of its
    operands (K + 1 = 33 columns), so Dm is a copy of ab; a term of both i and j stays (no rewrite)."""
    from tilec.compiler.distance_split import split_row_column_terms

    src = (FOLDER / "sqdist_matmul.tl").read_text()
    prog = split_row_column_terms(lang.load(src))
    assert prog.tensors["ab_Aa"].shape == (96, 33) and prog.tensors["ab_Ba"].shape == (80, 33)
    plain = lang.load(src.replace("+ bb[j]", "+ bb[j] * aa[i]"))
    assert split_row_column_terms(plain) is plain


@pytest.mark.parametrize("name", ["sqdist", "sqdist_matmul", "cosine_matrix", "gram_style", "normalize_rows",
                                  "alibi_pos"])
def test_rewritten_programs_match_numpy_in_bf16(name):
    """The programs this branch's rewrites compile, with every tensor bf16 (their temporaries stay f32)."""
    prog, _, out, a = run_signed((FOLDER / f"{name}.tl").read_text(), "bf16", seed=3)
    for tensor, want in FORMULAS[name](a).items():
        assert_matches(prog, tensor, out[tensor], want)


@pytest.mark.parametrize("name", ["sqdist", "gram_style", "cosine_matrix"])
def test_rewritten_programs_match_numpy_in_nki_01(name):
    """The rewrites are source-level (augmented operands, a merged view, scaled operands): NKI 0.1 runs them too."""
    from compiler_helpers import compile_and_run

    prog, _, inputs, out = compile_and_run((FOLDER / f"{name}.tl").read_text(), "0.1")
    for tensor, want in FORMULAS[name]({k: np.asarray(v, np.float64) for k, v in inputs.items()}).items():
        assert_matches(prog, tensor, out[tensor], want)
