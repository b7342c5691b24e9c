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
    "gram_batch_mean": 8, "spatial_attention": 18,
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


def test_nhwc_channel_shuffle_is_interleaved_on_chip():
    """[n, h, w, g, c] -> [n, h, w, c, g] is one swap of runs, but as such it is a 4 x 16 transpose per pixel (at
    8 x 28 x 28 x 4 x 64: 6272 of them, 190x the floor on the model); the on-chip interleave loads whole pixels'
    channels and reorders them with engine copies (permute_onchip.chosen's one-step margin)."""
    source = compile_loaded(lang.load((FOLDER / "channel_shuffle_nhwc.tl").read_text())).source
    assert "nc_transpose" not in source and "tensor_copy" in source


def test_a_total_reduction_in_a_unit_loop_is_the_same_as_at_index_0():
    """`for z in 0..1: L[z] = 0; for i: L[z] += r[i]` (huber_mean's last nest) is split as `L[0]` is; z read by
    the value keeps the nest as written (refused with its hint)."""
    from tilec.compiler.reduce_split import split_total_reductions

    prog = lang.load((FOLDER / "huber_mean.tl").read_text())
    assert split_total_reductions(prog) is not prog
    read = (FOLDER / "huber_mean.tl").read_text().replace("r[i] / (M * N)", "r[i + z] / (M * N)")
    kept = lang.load(read)
    assert split_total_reductions(kept) is kept


def test_a_vectors_element_becomes_a_column_along_the_first_index():
    """ECA's `k[0] * (p[n, c - 1] ?? 0) + k[1] * p[n, c] + ..`: k broadcast along n once (k_b [N, 3]), then one
    [N, 1] column per constant (k_0, k_1, k_2) read at [n, 0]."""
    from tilec.compiler.scalar_split import split_scalar_reads

    prog = split_scalar_reads(lang.load((FOLDER / "eca_block.tl").read_text()))
    temps = {name: t.shape for name, t in prog.tensors.items() if name.startswith("k_")}
    assert temps == {"k_b": (2, 3), "k_0": (2, 1), "k_1": (2, 1), "k_2": (2, 1)}


def test_swiglu_ffn_over_the_sbuf_budget_runs_each_op_in_its_own_scope():
    """At D 768, H 2048 the three weights held whole (48 KiB a partition each) were 265 KiB of 192 live at once,
    an SBUF overflow; each op's buffers now die at its end (op_scope.py, the last resort) and the FFN matches
    NumPy (M 128 keeps the interpreter's run short; the realistic M 512 is gaps15's row)."""
    prog = lang.load((FOLDER / "swiglu_ffn.tl").read_text(), {"M": 128, "D": 768, "H": 2048})
    compiled = compile_loaded(prog)
    assert "one op: its buffers die at its end" in compiled.source
    rng = np.random.default_rng(5)
    inputs = {t.name: rng.random(t.shape, dtype=np.float32) - np.float32(0.5) for t in prog.inputs}
    out = compiled.run(**inputs)
    want = FORMULAS["swiglu_ffn"]({k: np.asarray(v, np.float64) for k, v in inputs.items()})["Y"]
    assert_matches(prog, "Y", out["Y"], want)
