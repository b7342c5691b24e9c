"""Golden tests of the printed IR after each pipeline stage, and of each directive's effect (before/after).

Refresh with `pytest --update-golden` and review the diff: these files are the documentation of what each pass and
directive does (the directive docstrings in tilec/compiler/schedule.py point here).
"""
from __future__ import annotations

import difflib

import pytest

from compiler_helpers import compile_example

SMALL = {
    "vector_add": {"L": 1024},
    "transpose": {"M": 256, "N": 384},
    "matmul": {"M": 256, "K": 256, "N": 640},
    "conv2d": {"N": 1, "C": 128, "K": 128, "H": 10, "W": 8},
    "conv_bias_maxpool": {"N": 2, "C": 256, "K": 256, "H": 10, "W": 8},
    "conv_relu": {"N": 1, "C": 128, "K": 128, "H": 10, "W": 10},
    "avgpool": {"N": 1, "C": 128, "H": 8, "W": 8},
}

STAGES_PER_EXAMPLE = {
    "vector_add": ("lower", "select", "loops"),
    "transpose": ("lower", "select", "loops"),
    "matmul": ("lower", "select", "schedule", "loops", "squeeze"),
    "conv2d": ("select", "hoist"),
    "conv_bias_maxpool": ("lower", "select", "schedule", "loops", "hoist", "allocate"),
    "conv_relu": ("lower", "select", "hoist"),
    "avgpool": ("select", "loops"),
}


@pytest.mark.parametrize("name,stage", [(n, s) for n, stages in STAGES_PER_EXAMPLE.items() for s in stages])
def test_stage_golden(name, stage, golden):
    c = compile_example(name, SMALL[name])
    golden.check(f"compiler/stages/{name}.{stage}.txt", c.stages[stage])


def _diff(before: str, after: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), "before", "after", n=1))


DIRECTIVES = {
    "tile": "tile conv.k, 64\n",
    "split": "split conv.y, 2\n",
    "split_weights": "split Wt, conv.c\n",
    "reorder_outer": "reorder conv, k, n, y\n",
    "reorder_taps": "reorder conv, r, s, c\n",
    "compute_at_root": "compute_at conv, root\n",
    "place_hbm": "place conv, hbm\n",
    "hoist_weights": "hoist Wt, conv.k\n",
    "hoist_input": "hoist X, conv.k\n",
    "buffers": "buffers X, 1\n",
    "unroll": "unroll conv.s\n",
}


@pytest.mark.parametrize("name", sorted(DIRECTIVES))
def test_directive_before_after(name, golden):
    """Each directive's effect on the final loop nest, as a diff against the default schedule."""
    sizes = SMALL["conv_bias_maxpool"]
    before = compile_example("conv_bias_maxpool", sizes).stages["legalise"]
    after = compile_example("conv_bias_maxpool", sizes, schedule=DIRECTIVES[name]).stages["legalise"]
    assert before != after
    golden.check(f"compiler/directives/{name}.txt", DIRECTIVES[name] + _diff(before, after))


ELTWISE = {"buffers_eltwise": "buffers x, 1\n", "unroll_eltwise": "unroll z.i\n",
           "split_eltwise": "split z.i, 2\n"}


@pytest.mark.parametrize("name", sorted(ELTWISE))
def test_eltwise_directive_before_after(name, golden):
    """The directives an element-wise statement takes beyond `tile`, as a diff of the final loop nest (4 tiles)."""
    sizes = {"L": 128 * 4096}
    before = compile_example("vector_add", sizes).stages["legalise"]
    after = compile_example("vector_add", sizes, schedule=ELTWISE[name]).stages["legalise"]
    assert before != after
    golden.check(f"compiler/directives/{name}.txt", ELTWISE[name] + _diff(before, after))


BROADCAST = """kernel b(X: f32[M, N], c: f32[M]) -> Y
  default M = 256, N = 2048
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] - c[i]
"""


def test_reorder_of_a_broadcast_before_after(golden):
    """`reorder Y, j, i`: a broadcast layout's free tiles outside its partition tiles (2 x 2 tiles of 128 x 1024)."""
    from tilec.compiler.api import compile_loaded
    from tilec.lang import api as lang

    schedule = "reorder Y, j, i\n"
    before = compile_loaded(lang.load(BROADCAST)).stages["legalise"]
    after = compile_loaded(lang.load(BROADCAST), lang.parse_schedule(schedule, "<test schedule>")).stages["legalise"]
    assert before != after
    golden.check("compiler/directives/reorder_eltwise.txt", schedule + _diff(before, after))


def test_transpose_method_dma(golden):
    sizes = SMALL["transpose"]
    before = compile_example("transpose", sizes).stages["loops"]
    after = compile_example("transpose", sizes, schedule="method Y, dma\n").stages["loops"]
    golden.check("compiler/directives/method_dma.txt", "method Y, dma\n" + _diff(before, after))


def test_hoist_pass_moves_input_band_out_of_k_loop(golden):
    c = compile_example("conv_bias_maxpool", SMALL["conv_bias_maxpool"])
    golden.check("compiler/passes/hoist.txt", _diff(c.stages["loops"], c.stages["hoist"]))


def test_legalise_pass_makes_shared_buffer_loops_sequential(golden):
    c = compile_example("conv_bias_maxpool", SMALL["conv_bias_maxpool"], schedule="buffers X, 1\n")
    diff = _diff(c.stages["unroll"], c.stages["legalise"])
    assert "sequential" in diff
    golden.check("compiler/passes/legalise.txt", diff)


def test_unroll_pass(golden):
    c = compile_example("conv_bias_maxpool", SMALL["conv_bias_maxpool"], schedule="unroll conv.r\n")
    diff = _diff(c.stages["hoist"], c.stages["unroll"])
    assert "static" in diff
    golden.check("compiler/passes/unroll.txt", diff)


def test_squeeze_pass_drops_the_matmuls_unit_dims(golden):
    c = compile_example("matmul", SMALL["matmul"])
    diff = _diff(c.stages["legalise"], c.stages["squeeze"])
    assert "A_T: sbuf f32[128, 2, 256]" in diff
    golden.check("compiler/passes/squeeze.txt", diff)


def _stage_kernel(stage: str, schedule: str):
    from tilec.compiler.api import Compiled
    from tilec.compiler.codegen import emit

    c = compile_example("conv_bias_maxpool", SMALL["conv_bias_maxpool"], schedule=schedule)
    source = emit(c.result.kernels[stage], f"{stage}.tl", [])
    return Compiled(source, c.kernel_name, c.stages, c.program, c.result)


@pytest.mark.parametrize("schedule", ["", "unroll conv.s\nreorder conv, k, n, y\nhoist Wt, conv.k\n"])
@pytest.mark.parametrize("stage", ["loops", "hoist", "unroll", "legalise", "squeeze"])
def test_every_ir_stage_computes_the_same(stage, schedule):
    """Passes are tested by meaning: the kernel emitted from the IR after each pass equals the reference."""
    from compiler_helpers import check_against_reference

    check_against_reference(_stage_kernel(stage, schedule))


def test_legalise_is_what_makes_a_single_buffer_legal():
    """Before `legalise` the single-buffered band races across affine iterations (the interpreter's hardware
    check catches it); after it, the kernel is legal and right."""
    from compiler_helpers import check_against_reference
    from tilec.errors import KernelError

    with pytest.raises(KernelError, match="loop-carried dependence"):
        check_against_reference(_stage_kernel("unroll", "buffers X, 1\n"))
    check_against_reference(_stage_kernel("legalise", "buffers X, 1\n"))


def _doc_excerpts(fn) -> list[tuple[str, list[str]]]:
    """(golden path, its excerpt lines) for each `golden excerpt: PATH` in a docstring."""
    import re

    doc = fn.__doc__ or ""
    parts = re.split(r"golden\s+excerpt:\s*(tests/golden/\S+?\.txt)\)?:?", doc)
    return [(path, [ln.strip() for ln in text.splitlines() if ln.strip()[:1] in "+-" and ln.strip()])
            for path, text in zip(parts[1::2], parts[2::2])]


def test_directive_and_pass_docstrings_match_their_goldens():
    """Each directive's and IR pass's docstring shows before/after IR copied from its golden file; a golden refresh
    that changes those lines fails here until the docstring is updated too."""
    from compiler_helpers import ROOT
    from tilec.compiler import directives, passes, squeeze

    functions = [*directives.APPLY.values(), directives.apply_fusion, passes.hoist, passes.unroll, passes.legalise,
                 squeeze.squeeze]
    seen = set()
    for fn in functions:
        excerpts = _doc_excerpts(fn)
        if fn is directives.apply_partition:
            continue  # it only checks the binding; the IR does not change
        assert excerpts, f"{fn.__name__} has no golden excerpt"
        for path, lines in excerpts:
            golden = {(ln[0], ln[1:].strip()) for ln in (ROOT / path).read_text().splitlines() if ln[:1] in "+-"}
            assert len(lines) >= 2, f"{fn.__name__}: excerpt of {path} shows no before/after"
            for line in lines:
                assert (line[0], line[1:].strip()) in golden, f"{fn.__name__}: `{line}` is not in {path}"
            seen.add(path)
    expected = {f"tests/golden/compiler/{p.parent.name}/{p.name}" for p in
                (ROOT / "tests/golden/compiler").glob("*/*.txt") if p.parent.name in ("directives", "passes")}
    assert seen == expected
