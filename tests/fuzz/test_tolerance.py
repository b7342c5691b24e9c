"""The tolerance (tilec/tolerance.py) both ways: the pairs the campaigns flagged only because a narrow
intermediate's legitimate one-ulp rounding difference reached the output with a large gain now pass, and wrong
results (a shifted tap, a dropped term, a missing row, a missing rounding), injected here by evaluating a mutated
program with the reference evaluator, never by changing the compiler, are still far outside it."""
from __future__ import annotations

import pathlib
import warnings

import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from tilec.testing.fuzz import input_seed
from tilec.testing.oracle import check_formula
from tilec.tolerance import error_bounds, mismatches

REGRESSIONS = pathlib.Path(__file__).parent / "regressions"
LAYERNORM = REGRESSIONS / "l14_wrong-bf16-layernorm-mean-ulp-times-rsqrt.tl"  # bf16, N = 3: rsqrt gain ~31
LAYERNORM2 = REGRESSIONS / "l15_wrong-bf16-layernorm-mean-ulp-times-rsqrt-2.tl"
CONV_POOL = REGRESSIONS / "l16_ref-disagree-f16-conv-into-sum-pool.tl"  # f16 conv (~3.5) averaged into f16 (~1.8)


def _setup(path: pathlib.Path):
    text = path.read_text()
    program = lang.load(text)
    inputs = {k: v.astype(lang.NP_DTYPES[program.tensors[k].dtype])
              for k, v in lang.random_inputs(program, input_seed(text)).items()}
    return text, program, inputs, lang.evaluate(program, inputs)


def ratio(program, got: dict, want: dict, inputs: dict) -> float:
    """|got - want| / tolerance at the element furthest beyond it (> 1: outside), 0 when inside everywhere."""
    bad = mismatches(program, got, want, inputs)
    if not bad:
        return max(_inside(program, got, want, inputs), 0.0)
    return max(m.error / m.tolerance for m in bad)


def _inside(program, got, want, inputs) -> float:
    """The largest |got - want| / tolerance of an output inside its tolerance (how close a passing result is)."""
    from tilec.tolerance import program_budget, scale_of, tolerance

    bounds, budget, worst = error_bounds(program, inputs), program_budget(program), 0.0
    for name, ref in want.items():
        tol = tolerance(ref.dtype, budget[name][0], scale_of(ref)) + bounds[name]
        diff = np.abs(np.asarray(got[name], np.float64) - np.asarray(ref, np.float64))
        worst = max(worst, float(np.max(diff / tol)))
    return worst


def mutated(text: str, old: str, new: str, inputs: dict) -> dict:
    """The reference evaluator's outputs of the program with `old` replaced by `new` (a deliberate bug)."""
    assert old in text, old
    return lang.evaluate(lang.load(text.replace(old, new)), inputs)


@pytest.mark.parametrize("path", [LAYERNORM, LAYERNORM2, CONV_POOL], ids=lambda p: p.name[:3])
def test_the_flagged_pairs_kernels_are_inside_the_tolerance(path):
    text, program, inputs, ref = _setup(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compile_loaded(program, None).run(**inputs)
    assert not mismatches(program, got, ref, inputs)
    assert ratio(program, got, ref, inputs) < 1.0


def test_the_f16_conv_into_sum_pool_reference_agrees_with_its_formula():
    """Seed 15017659: the reference and an independent float64 formula (each f16 store rounded) differed by 0.00195,
    two ulps of the output, from the conv's f16 rounding (its values are twice the output's)."""
    text, program, inputs, ref = _setup(CONV_POOL)

    def formula(env):
        x, w, b = env["inputs"], env["Wt"], env["b"]
        conv = np.einsum("ncyx,kc->nkyx", x[:, :, :, 0:2 * 33 + 1:2], w[:, :, 0, 0]) + b[None, :, None, None]
        conv = conv.astype(np.float16).astype(np.float64)
        pool = 0.5 * (conv[:, :, :, 0:33:2] + conv[:, :, :, 1:34:2])
        return {"psum": pool}

    assert program.sizes["W"] == 67 and program.sizes["None"] == 9  # the shapes the formula is written for
    assert check_formula(program, ref, formula, inputs) is None


def test_wrong_layernorms_are_far_outside():
    text, program, inputs, ref = _setup(LAYERNORM)
    dropped = mutated(text, "for Ä in 0..N5:", "for Ä in 0..N5 - 1:", inputs)  # the mean misses a term
    assert ratio(program, dropped, ref, inputs) > 5
    shifted = mutated(text, "Ŷ[i9, j8] * True[i9]", "Ŷ[i9, j8] * True[(i9 + 1) % 254]", inputs)  # another row's r
    assert ratio(program, shifted, ref, inputs) > 5
    missed = {k: v.copy() for k, v in ref.items()}
    missed["名前"][17] = 0  # a row never written (zeros)
    assert ratio(program, missed, ref, inputs) > 5


def test_wrong_conv_pools_are_far_outside():
    text, program, inputs, ref = _setup(CONV_POOL)
    tap = mutated(text, "inputs[nisa, c, y0 + 名前, 2*x + s]", "(inputs[nisa, c, y0 + 名前, 2*x + s + 1] ?? 0)", inputs)  # every conv tap one column off
    assert ratio(program, tap, ref, inputs) > 5
    dropped = mutated(text, "q6 in 0..2", "q6 in 0..1", inputs)  # the pool misses a term
    assert ratio(program, dropped, ref, inputs) > 5


def test_a_missing_rounding_of_an_exact_narrow_intermediate_is_far_outside():
    """h is bf16 and computed exactly alike on both sides (no sum, division or engine function): a kernel that
    keeps it in fp32 is wrong, and the 256-term matmul it feeds shows it."""
    text = ("kernel k(X: f32[M, K], Wt: bf16[K, N]) -> Y\n  default M = 64, K = 256, N = 32\n  h: bf16[M, K]\n"
            "  Y: f32[M, N]\n  for i in 0..M, k in 0..K:\n    h[i, k] = X[i, k] * 3.0 + 0.25\n"
            "  for i in 0..M, j in 0..N:\n    Y[i, j] = 0\n    for k in 0..K:\n      Y[i, j] += h[i, k] * Wt[k, j]\n")
    program = lang.load(text)
    inputs = lang.random_inputs(program, 7)
    ref = lang.evaluate(program, inputs)
    unrounded = mutated(text.replace("h[i, k] * Wt[k, j]", "h[i, k] * f32(Wt[k, j])"), "h: bf16", "h: f32", inputs)
    assert ratio(program, unrounded, ref, inputs) > 5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compile_loaded(program, None).run(**inputs)
    assert not mismatches(program, got, ref, inputs)  # while the compiled kernel (which rounds h) passes


LAYERNORM_F32 = REGRESSIONS / "l27_wrong-f32-layernorm-mean-roundoff-times-rsqrt.tl"  # f32, N = 3: rsqrt gain ~31


def test_an_all_f32_layernorm_gets_the_gain_of_its_rsqrt_and_wrong_ones_stay_far_outside():
    """All f32: the mean's roundoff times rsqrt(var + eps) is legitimate (the kernel's 2.19e-06 passes), a mean
    missing a term or another row's r is not."""
    text, program, inputs, ref = _setup(LAYERNORM_F32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compile_loaded(program, None).run(**inputs)
    assert ratio(program, got, ref, inputs) < 1.0
    dropped = mutated(text, "for j8 in 0..N6:", "for j8 in 0..N6 - 1:", inputs)
    assert ratio(program, dropped, ref, inputs) > 5
    shifted = mutated(text, "d[ι, len] * r[ι]", "d[ι, len] * r[(ι + 1) % 299]", inputs)
    assert ratio(program, shifted, ref, inputs) > 5


def test_plain_f32_programs_skip_the_error_analysis():
    """A matmul of inputs has no gain beyond its summation order: its bound is zero (tolerance alone), and the
    reference evaluator does not run the analysis again."""
    text = ("kernel k(A: f32[M, K], B: f32[K, N]) -> C\n  default M = 8, K = 16, N = 4\n  C: f32[M, N]\n"
            "  for i in 0..M, j in 0..N:\n    C[i, j] = 0\n    for k in 0..K:\n      C[i, j] += A[i, k] * B[k, j]\n")
    program = lang.load(text)
    inputs = lang.random_inputs(program, 0)
    assert not error_bounds(program, inputs)["C"].any()
