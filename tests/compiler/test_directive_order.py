"""A schedule means the same whatever order its directives are written in (they apply in one canonical order,
directives.canonical_order): permuting a legal directive list gives byte-identical kernels."""
from __future__ import annotations

import functools
import pathlib
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler_helpers import compile_example
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from tilec.errors import TilecError
from kernel_numbers import numbered

CASES = {
    "conv_bias_maxpool": (dict(N=1, C=128, H=10, W=14, K=256),
                          ["tile conv.k, 128", "split conv.y, 4", "tile conv.x, 6", "tile conv.y, 2", "buffers X, 1",
                           "unroll conv.s", "hoist Wt, conv.k"]),
    "transpose": (dict(M=512, N=512), ["tile Y.i, 64", "split Y.i, 2", "split Y.j, 4", "method Y, dma"]),
    "matmul": (dict(M=256, K=256, N=512), ["tile C.i, 128", "tile C.j, 256", "tile C.k, 64"]),
    "rowsum": (None, ["tile s.i, 64", "tile s.j, 128"]),
    # element-wise (core20): free and partition tiles, unroll of the loops they make, one buffer of a tile
    "vector_add": (dict(L=128 * 4096), ["tile z.i, 512", "unroll z.i", "buffers x, 1", "buffers z, 1"]),
    "rmsnorm": (dict(M=300, N=1024), ["tile Y.i, 100", "tile Y.j, 256", "unroll Y.i", "unroll Y.j"]),
    # (core21) the broadcast layout's free tiles outside its partition tiles, with the tiles and unrolls
    "rmsnorm#order": (dict(M=300, N=1024), ["tile Y.i, 100", "tile Y.j, 256", "reorder Y, j, i", "unroll Y.j"]),
    # (core21) four free tiles per DMA, the loop of DMAs unrolled, the result's tiles in one buffer
    "vector_add#split": (dict(L=128 * 4096), ["tile z.i, 256", "split z.i, 4", "unroll z.i", "buffers z, 1"]),
    # (core22) ragged tiles of a row reduction; a row chain's statistic through HBM
    "rowsum#ragged": (dict(M=300, N=700), ["tile s.i, 64", "tile s.j, 256", "unroll s.i"]),
    "layernorm#place": (dict(M=300, N=512), ["place mu, hbm", "tile Y.j, 128", "unroll Y.j"]),
    # (core23) a column sum's ragged tiles (300 rows: 4 x 64 + 44; 700 columns: 5 x 128 + 60), with its settings
    "audit15/column_l1": (dict(M=300, N=700), ["tile s.i, 64", "tile s.j, 128", "unroll s.j", "buffers X, 1"]),
    # (core25) one buffer of X for each of its readers built apart; a directive over a sum a rewrite moved into
    # O_acc next to one naming O_acc itself (which wins), with the finish's own
    "audit15/column_standardize": (dict(M=300, N=200), ["buffers X, 1", "tile mu.i, 100", "tile Y.j, 100"]),
    "gaps15/attn_inline": (dict(S=128, D=64), ["tile O.d, 32", "tile O_acc.d, 64", "tile O.j, 64", "tile O.i, 64"]),
}
PROGRAMS = pathlib.Path(__file__).resolve().parent.parent / "programs"


def compile_case(name: str, sizes, schedule: str | None):
    """A case's example (`rmsnorm#order`: rmsnorm) or audit15 program compiled with the schedule."""
    stem = name.split("#")[0]
    if "/" in stem:  # a program of tests/programs (audit15/column_l1)
        parsed = lang.parse_schedule(schedule, "<test schedule>") if schedule is not None else None
        return compile_loaded(lang.load(PROGRAMS / f"{stem}.tl", sizes), parsed)
    return compile_example(stem, sizes, schedule=schedule)


@functools.cache
def reference(name: str) -> str:
    """The kernel for the directives in their written order (computed inside a test, under conftest's NKI form)."""
    sizes, directives = CASES[name]
    return numbered(compile_case(name, sizes, "\n".join(directives)).source)


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # (loaded CI)
@given(st.sampled_from(sorted(CASES)).flatmap(lambda name: st.tuples(st.just(name),
                                                                      st.permutations(CASES[name][1]))))
def test_permuted_directives_give_the_same_kernel(case) -> None:
    name, order = case
    sizes = CASES[name][0]
    assert numbered(compile_case(name, sizes, "\n".join(order)).source) == reference(name)


def test_the_transpose_split_survives_a_later_tile() -> None:
    """`split Y.i, 2` written before `tile Y.i, 64` used to be dropped by the tile (issue 10)."""
    src = numbered(compile_example("transpose", dict(M=512, N=512), schedule="split Y.i, 2\ntile Y.i, 64").source)
    assert src == numbered(compile_example("transpose", dict(M=512, N=512), schedule="tile Y.i, 64\nsplit Y.i, 2")
                           .source)
    # Y.i is the source's column loop: the tile sets the blocks' columns (64; rows stay 128, rectangular blocks), and
    # the split keeps two blocks per strip
    assert "Y_strip = nl.ndarray((64, 2, 512)" in src


def _rival(directive: str) -> str:
    """A directive setting what `directive` sets, to another value (the same line when it takes no number)."""
    return re.sub(r"(\d+)$", lambda m: str(int(m.group(1)) * 2), directive)


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # (loaded CI)
@given(st.sampled_from(sorted(CASES)).flatmap(
    lambda name: st.tuples(st.just(name), st.integers(0, len(CASES[name][1]) - 1)).flatmap(
        lambda c: st.tuples(st.just(c[0]), st.permutations(CASES[c[0]][1] + [_rival(CASES[c[0]][1][c[1]])]),
                            st.just(_rival(CASES[c[0]][1][c[1]])), st.just(CASES[c[0]][1][c[1]])))))
def test_two_directives_setting_one_thing_are_one_error_naming_both_lines(case) -> None:
    """Issue 10: a permuted directive list gives the same kernel "or an error naming both conflicting lines",
    wherever the two lines are."""
    name, order, rival, original = case
    lines = [i + 1 for i, d in enumerate(order) if d in (rival, original)]
    if rival == original:  # the same line twice
        lines = [i + 1 for i, d in enumerate(order) if d == original]
    first, second = lines[0], lines[1]
    with pytest.raises(TilecError) as info:
        compile_case(name, CASES[name][0], "\n".join(order))
    err = info.value
    assert err.span is not None and err.span.line == second, err.render()
    assert f"(line {first})" in str(err) and "sets again" in str(err), err.render()


@pytest.mark.parametrize("name", ["vector_add", "rmsnorm", "rmsnorm#order", "vector_add#split", "rowsum#ragged",
                                  "layernorm#place", "audit15/column_l1", "audit15/column_standardize",
                                  "gaps15/attn_inline"])
def test_element_wise_directives_in_other_orders_give_the_same_kernel(name: str) -> None:
    """The element-wise and reduction cases every run (hypothesis samples the cases above): reversed and rotated
    lists."""
    sizes, directives = CASES[name]
    for order in (directives[::-1], directives[2:] + directives[:2]):
        assert numbered(compile_case(name, sizes, "\n".join(order)).source) == reference(name)
    assert reference(name) != numbered(compile_case(name, sizes, None).source)
