"""Schedules: many legal schedules of one conv all equal the reference; schedule text round-trips; illegal
directives are TilecErrors pointing at the directive (golden messages)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler_helpers import ROOT, check_against_reference, compile_example, program
from tilec.compiler.ir import Dma, walk
from tilec.compiler.schedule import default_directives, print_schedule
from tilec.errors import TilecError
from tilec.lang import api as lang

SIZES = {"N": 2, "C": 256, "K": 256, "H": 14, "W": 12}  # Ho = 12, Wo = 10, pooled 6 x 5

SCHEDULES = {
    "default": "",
    "k_outer": "reorder conv, k, n, y\n",
    "row_per_matmul_small_band": "tile conv.y, 2\nsplit conv.y, 2\n",
    "half_tiles": "tile conv.k, 64\ntile conv.c, 64\n",
    "taps_outer_unrolled": "reorder conv, r, s, c\nunroll conv.s\n",
    "unfused_through_hbm": "place conv, hbm\n",
    "weights_per_k_tile": "hoist Wt, conv.k\nreorder conv, k, y, n\n",
    "columns_split": "tile conv.x, 2\ntile conv.y, 4\n",
    "column_bands": "split conv.x, 2\nsplit conv.y, 6\n",
    "whole_image_fused": "compute_at conv, Y.n\ntile conv.y, 6\n",
    "fused_at_pool_row": "compute_at conv, Y.i\n",
    "fused_at_pool_element": "compute_at conv, Y.j\n",
    "input_band_per_k_single_buffer": "hoist X, conv.k\nbuffers X, 1\nsplit conv.y, 4\n",
    "weights_per_c_tile": "split Wt, conv.c\n",
    "weights_per_c_tile_inside_k": "split Wt, conv.c\nhoist Wt, conv.k\ntile conv.c, 64\n",
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_conv_schedule_matches_reference(name):
    c = compile_example("conv_bias_maxpool", SIZES, schedule=SCHEDULES[name])
    check_against_reference(c)


def test_schedules_really_differ():
    sources = {compile_example("conv_bias_maxpool", SIZES, schedule=s).source for s in SCHEDULES.values()}
    assert len(sources) == len(SCHEDULES)


def _conv_writes_hbm(c) -> bool:
    return any(isinstance(s, Dma) and s.dst.buf.name == "conv" for s in walk(c.result.kernel.body))


def test_fused_conv_output_never_goes_to_hbm():
    fused = compile_example("conv_bias_maxpool", SIZES)
    assert not _conv_writes_hbm(fused)
    assert "conv" not in [b.name for b in fused.result.kernel.outputs]
    _, trace = fused.run_traced(**{t.name: np.ones(t.shape, np.float32) for t in fused.program.inputs})
    hbm_written = {w.name for i in trace.instrs for w in i.writes if w.memory == "hbm"}
    assert hbm_written == {"Y"}
    unfused = compile_example("conv_bias_maxpool", SIZES, schedule=SCHEDULES["unfused_through_hbm"])
    assert _conv_writes_hbm(unfused)  # the check above can fail: the unfused schedule does write conv


# ---- Hypothesis: any legal combination of these knobs preserves meaning ---------------------------------------

KNOBS = st.fixed_dictionaries({
    "tile_k": st.sampled_from([64, 128]), "tile_c": st.sampled_from([64, 128, 256]),
    "rows": st.sampled_from([2, 4, 6, 12]), "order": st.permutations(["n", "y", "k"]),
    "taps": st.permutations(["c", "r", "s"]), "place": st.sampled_from(["sbuf", "hbm"]),
})


def _schedule_text(k: dict) -> str:
    lines = [f"tile conv.k, {k['tile_k']}", f"tile conv.c, {k['tile_c']}", f"tile conv.y, {k['rows']}",
             f"split conv.y, {k['rows']}", "reorder conv, " + ", ".join(k["order"]),
             "reorder conv, " + ", ".join(k["taps"]), f"place conv, {k['place']}"]
    return "\n".join(lines) + "\n"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(KNOBS)
def test_random_legal_schedules_match_reference(knobs):
    text = _schedule_text(knobs)
    try:
        c = compile_example("conv_bias_maxpool", {"N": 1, "C": 256, "K": 128, "H": 14, "W": 8}, schedule=text)
    except TilecError as err:  # tile_c of 256 is illegal: the error must say so, at the directive
        assert "exceeds 128" in err.message and err.span is not None
        return
    check_against_reference(c)


# ---- schedule text is data --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["conv_bias_maxpool", "matmul", "transpose", "vector_add", "avgpool"])
def test_default_schedule_round_trips(name):
    c = compile_example(name, None)
    for op in c.result.ops:
        text = print_schedule(default_directives(op, {n: t.dtype for n, t in c.program.tensors.items()}))
        parsed = lang.parse_schedule(text, "<roundtrip>")
        assert print_schedule(parsed) == text
        again = compile_example(name, None, schedule=text)
        assert again.source == c.source  # applying the printed default reproduces the default kernel


def test_weight_split_prints_back_only_when_not_default():
    from tilec.compiler.schedule import plan_directives
    split = compile_example("conv_bias_maxpool", SIZES, schedule="split Wt, conv.c\n")
    default = compile_example("conv_bias_maxpool", SIZES, schedule="split Wt, conv.k\n")
    assert default.source == compile_example("conv_bias_maxpool", SIZES).source  # conv.k is the default
    assert "split Wt" not in default.stages["schedule"]
    printed = print_schedule(plan_directives(split.result.ops[0], split.result.plans[0]))
    assert "split Wt, conv.c\n" in printed
    again = compile_example("conv_bias_maxpool", SIZES, schedule=printed)
    assert again.source == split.source != default.source


def test_weight_split_on_a_pool_is_rejected(golden):
    with pytest.raises(TilecError) as err:
        compile_example("avgpool", {"N": 1}, schedule="split Y, Y.c\n")
    assert err.value.span is not None
    golden.check("compiler/errors/split_weights_not_a_conv.txt", err.value.render() + "\n")


@given(KNOBS)
@settings(max_examples=20, deadline=None)
def test_schedule_text_round_trips(knobs):
    text = _schedule_text(knobs)
    assert print_schedule(lang.parse_schedule(text, "<rt>")) == text


# ---- illegal schedules: golden error messages ------------------------------------------------------------------

ILLEGAL = {
    "partition_tile_too_big": "tile conv.k, 256\n",
    "contraction_tile_too_big": "tile conv.c, 512\n",
    "moving_too_wide": "tile conv.y, 32\n",
    "rows_not_multiple_of_pool": "tile conv.y, 3\n",
    "split_not_dividing": "split conv.y, 5\n",
    "unknown_loop": "tile conv.q, 2\n",
    "unknown_consumer_loop": "compute_at conv, Y.q\n",  # the hint lists Y's loops, not conv's
    "unknown_op": "tile nope.k, 2\n",
    "unknown_directive": "vectorize conv.x\n",
    "reorder_mixed_groups": "reorder conv, c, k\n",
    "partition_wrong_loop": "partition conv.y\n",
    "fuse_whole_image_too_big": "compute_at conv, Y.n\n",
    "unroll_outer_loop": "unroll conv.n\n",
    "method_on_conv": "method conv, dma\n",
    "buffers_too_many": "buffers X, 9\n",
    "columns_split_pool_window": "tile conv.x, 3\n",
    "split_weights_wrong_loop": "split Wt, conv.y\n",
    "split_weights_of_the_input": "split X, conv.c\n",
    "repeated_tile": "tile conv.k, 64\nsplit conv.y, 2\ntile conv.k, 128\n",  # the later one would silently win
    "repeated_fusion": "place conv, hbm\ncompute_at conv, Y.i\n",
    "repeated_reorder": "reorder conv, k, n, y\nreorder conv, c, r, s\nreorder conv, n, y, k\n",
}


@pytest.mark.parametrize("name", sorted(ILLEGAL))
def test_illegal_schedule_errors(name, golden):
    sizes = {"N": 1} if name == "fuse_whole_image_too_big" else {"N": 1, "H": 34, "W": 34}
    prog = program("conv_bias_maxpool", sizes)
    with pytest.raises(TilecError) as err:
        from tilec.compiler.api import compile_loaded
        compile_loaded(prog, lang.parse_schedule(ILLEGAL[name], "bad.sched"))
    assert err.value.span is not None
    golden.check(f"compiler/errors/{name}.txt", err.value.render() + "\n")


def test_sbuf_overflow_is_a_user_error(golden):
    with pytest.raises(TilecError) as err:
        compile_example("conv_bias_maxpool", {"N": 1, "C": 1024, "K": 128, "H": 130, "W": 130},
                        schedule="compute_at conv, Y.n\n")
    # located at the statement of the largest buffer (the path relative to the checkout, so the golden is portable)
    golden.check("compiler/errors/sbuf_overflow.txt", err.value.render().replace(f"{ROOT}/", "") + "\n")


def test_transpose_tile_over_128_is_rejected(golden):
    with pytest.raises(TilecError) as err:
        compile_example("transpose", {"M": 512, "N": 512}, schedule="tile Y.j, 256\n")
    golden.check("compiler/errors/transpose_tile_too_big.txt", err.value.render() + "\n")


def test_schedule_section_of_the_program_is_applied():
    text = (ROOT / "examples" / "conv_bias_maxpool.tl").read_text() + "  schedule:\n    reorder conv, k, n, y\n"
    prog = lang.load(text, SIZES)
    from tilec.compiler.api import compile_loaded
    c = compile_loaded(prog)
    assert "reorder conv, k, n, y" in c.stages["schedule"]
    check_against_reference(c)
    replaced = compile_loaded(prog, lang.parse_schedule("reorder conv, n, k, y\n", "<cli>"))
    assert "reorder conv, n, k, y" in replaced.stages["schedule"]  # --schedule FILE replaces the section


def test_elementwise_tile_error_explains_the_layout(golden):
    # the tile counts elements per partition, not along the user's loop: the message must say how the data lies
    with pytest.raises(TilecError) as err:
        compile_example("vector_add", {"L": 200}, schedule="tile z.i, 7\n")
    assert "100 partitions x 2 elements each" in err.value.message
    golden.check("compiler/errors/eltwise_tile_too_wide.txt", err.value.render() + "\n")


def test_column_tile_too_wide_for_pool_window(golden):
    """`tile conv.x, 300` with 2-row pooling windows: 600 elements per matmul (was an internal verifier error)."""
    sizes = {"N": 1, "C": 128, "K": 128, "H": 6, "W": 602}
    with pytest.raises(TilecError) as err:
        compile_example("conv_bias_maxpool", sizes, schedule="tile conv.x, 300\n")
    golden.check("compiler/errors/columns_too_wide_for_pool_window.txt", err.value.render() + "\n")
    check_against_reference(compile_example("conv_bias_maxpool", sizes, schedule="tile conv.x, 150\n"))


def test_buffers_on_an_op_without_input_bands_is_rejected():
    # a standalone pool streams its tiles with no band buffer to multiply: the directive must not be ignored silently
    with pytest.raises(TilecError, match="has no multi-buffered input"):
        compile_example("avgpool", {"N": 1}, schedule="buffers Y, 3\n")


@pytest.mark.parametrize("schedule, says", [
    ("buffers X, 3", "would build the kernel of 2, the default"),  # the NKI compiler rotates the bands itself
    ("buffers Wt, 1", "Wt is not conv's input band"),  # only the input bands have a buffer setting
])
def test_conv_buffers_that_would_not_change_the_kernel_are_refused_at_their_line(schedule: str, says: str) -> None:
    with pytest.raises(TilecError, match=says) as err:
        compile_example("conv_bias_maxpool", {"N": 1}, schedule=schedule + "\n")
    assert err.value.span is not None and err.value.span.line == 1  # the directive's line of the schedule


def test_conv_buffers_one_and_two_build_what_they_say() -> None:
    def band(schedule: str | None) -> tuple[int, str]:
        """(the indentation of X's band allocation, the kernel without its schedule comment)"""
        code = compile_example("conv_bias_maxpool", {"N": 1}, schedule=schedule).source.split('"""')[-1]
        line = next(s for s in code.splitlines() if s.lstrip().startswith("X_band = nl.ndarray"))
        return len(line) - len(line.lstrip()), code

    (one, _), (_, two), (inside, default) = band("buffers X, 1\n"), band("buffers X, 2\n"), band(None)
    assert one < inside  # one buffer: allocated once, before the loops
    assert two == default  # 2 is the default
