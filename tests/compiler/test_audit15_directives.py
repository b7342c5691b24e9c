"""audit15: the directives on issue 10's program kinds (tests/programs/audit15/, the sizes of
test_audit15_programs.py), as a new user tries them after `tilec explain`. Accepted directives must keep the
kernel equal to the NumPy formula; refused ones must be located TilecErrors. The design (docs: design-core.md)
has every directive expand into primitives that apply to any nest where legal; on these programs `tile`, `method`
on permutes, on element-wise statements `unroll`, `buffers X, 1`, `split` (flattened data) and `reorder` (broadcast
layouts), on column sums `unroll` and `buffers X, 1` are accepted: the strict xfails below are directives that are
legal on the nest and refused,
or refused with a reason that is not true (docs/notes/audit15.md)."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

from tilec.compiler.api import compile_loaded, read_schedule
from tilec.errors import TilecError
from tilec.lang import api as lang

_spec = importlib.util.spec_from_file_location("audit15_programs", pathlib.Path(__file__).with_name(
    "test_audit15_programs.py"))
assert _spec and _spec.loader
programs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(programs)


def compile_with(name: str, directive: str, target: str | None = None):
    sizes = programs.CASES[name][0]
    program = lang.load(programs.PROGRAMS / f"{name}.tl", sizes)
    return program, compile_loaded(program, read_schedule(directive), None, target)


def check(name: str, directive: str, target: str | None = None) -> None:
    program, compiled = compile_with(name, directive, target)
    given, exact = programs.inputs(name, program)
    got = compiled.run(**given)
    bad = programs.beyond_tolerance(name, program, got, exact)
    assert not bad, (directive, bad)

ACCEPTED = [  # (program, directive): accepted today, and the kernel changes; untested before
    ("logsumexp_rows", "tile s.j, 350"), ("softmax_heads", "tile Y.i, 64"), ("softmax_heads", "tile Y.j, 100"),
    ("rmsnorm_gated", "tile Y.i, 64"), ("rmsnorm_gated", "tile Y.j, 200"), ("layernorm_nogain", "tile Y.i, 50"),
    ("gelu_tanh", "tile Y.j, 350"), ("funcs_mix", "tile Y.j, 175"), ("softplus", "tile Y.j, 70"),
    ("channel_max", "tile Y.c, 50"), ("channel_max", "tile Y.h, 33"), ("batch_mse", "tile s.i, 100"),
    ("batch_mse", "tile s.j, 150"), ("middle_ssd", "tile s.c, 150"), ("keys_transpose", "tile Y.d, 36"),
    ("keys_transpose", "method Y, dma"), ("cyclic_permute", "tile Y.c, 100"), ("cyclic_permute", "method Y, dma"),
    ("nhwc_to_nchw_scale", "tile Y.h, 5"), ("nhwc_to_nchw_scale", "method Y, dma"), ("bcast_clamp", "tile Y.i, 100"),
    ("swish_bcast", "tile Y.i, 100"), ("rowrange_bf16", "tile lo.j, 350"),
    # core20: unroll / buffers X, 1 on element-wise statements, a partition tile of a broadcast layout
    ("gelu_tanh", "unroll Y.i"), ("gelu_tanh", "buffers X, 1"), ("funcs_mix", "buffers B, 1"),
    ("bcast_clamp", "tile Y.i, 64\nunroll Y.i\nbuffers X, 1"), ("bcast3d", "tile Y.j, 50\nunroll Y.i"),
    ("softmax_heads", "buffers Y, 1"), ("bcast3d", "tile Y.j, 64\nunroll Y.j\nbuffers X, 1\nbuffers Y, 1"),
    ("batch_mse", "buffers A, 1"), ("logsumexp_rows", "unroll m.i"),
    # core21: N tiles per DMA on flattened data, the tile order of a broadcast layout, column sums (bcast_clamp's
    # 700-wide rows are one free tile by default since lead20: two tiles make the order matter)
    ("gelu_tanh", "split Y.j, 2"), ("bcast_clamp", "tile Y.j, 350\nreorder Y, j, i"), ("column_l1", "buffers X, 1"),
    # core22: ragged tiles of a row reduction, a statistic or term stored in HBM instead of kept in the row chain
    ("logsumexp_rows", "tile m.i, 64"), ("batch_mse", "tile s.j, 64"), ("layernorm_nogain", "place sd, hbm"),
    ("softmax_heads", "place m, hbm"), ("rmsnorm_gated", "compute_at ms, root"),
]


@pytest.mark.parametrize("name,directive", ACCEPTED, ids=[f"{n}-{d}" for n, d in ACCEPTED])
def test_an_accepted_directive_keeps_the_kernel_right(name: str, directive: str) -> None:
    check(name, directive)


@pytest.mark.parametrize("name,directive", [("softmax_heads", "tile Y.j, 100"), ("keys_transpose", "method Y, dma"),
                                            ("channel_max", "tile Y.c, 50")])
def test_an_accepted_directive_keeps_the_kernel_right_on_trn1(name: str, directive: str) -> None:
    check(name, directive, "trn1")


REFUSED = [  # refused today, each as a located error at the directive (line 1 of the schedule)
    ("logsumexp_rows", "tile m.j, 701"), ("gelu_tanh", "method Y, dma"), ("gelu_tanh", "buffers X, 3"),
    ("rmsnorm_gated", "partition Y.j"), ("height_mean", "tile Y.c, 100"), ("batch_mse", "partition s.j"),
    ("keys_transpose", "partition Y.d"),
]


@pytest.mark.parametrize("name,directive", REFUSED, ids=[f"{n}-{d}" for n, d in REFUSED])
def test_a_refused_directive_is_a_located_error(name: str, directive: str) -> None:
    with pytest.raises(TilecError) as err:
        compile_with(name, directive)
    assert err.value.span is not None and err.value.span.line == 1, str(err.value)


LEGAL_AND_REFUSED = [  # (program, directive, what the compiler says)
    ("gelu_tanh", "reorder Y, j, i", "Y has a fixed loop order (an injective element-wise nest: any order is legal)"),
    ("gelu_tanh", "buffers X, 3", "the tiles of X are allocated inside Y's tile loop, so the NKI compiler already "
                                  "keeps several in flight (its own rotation): 3 buffers would leave the kernel as it "
                                  "is (only `buffers X, 1` is compiled)"),
    ("rmsnorm_gated", "hoist g, Y.i", "no computation or schedulable tensor named `g`"),
    ("softmax_heads", "compute_at e, Y.i", "e has no consumer to fuse into (Y reads it, one row at a time)"),
    ("channel_max", "reorder Y, h, n, w", "Y has a fixed loop order (kept loops of a reduction)"),
    ("cyclic_permute", "tile Y.b, 65", "Y has no loop `b` (the program's loop b, merged with a)"),
    ("nhwc_to_nchw_scale", "tile Y.w, 7", "Y has no loop `w` (the program's loop w, merged with h)"),
]


@pytest.mark.xfail(strict=True, raises=TilecError, reason="legal on the nest, refused by the per-kind plan")
@pytest.mark.parametrize("name,directive,says", LEGAL_AND_REFUSED, ids=[f"{n}-{d}" for n, d, _ in LEGAL_AND_REFUSED])
def test_a_legal_directive_is_accepted(name: str, directive: str, says: str) -> None:
    check(name, directive)


@pytest.mark.parametrize("name,directives", [
    ("softmax_heads", ("tile Y.i, 64", "tile Y.j, 100", "tile m.j, 100")),
    ("keys_transpose", ("tile Y.d, 36", "method Y, dma", "tile Y.s, 100")),
])
def test_directive_lists_in_any_order_give_one_kernel(name: str, directives: tuple[str, ...]) -> None:
    import itertools

    kernels = {compile_with(name, "\n".join(order))[1].source for order in itertools.permutations(directives)}
    assert len(kernels) == 1
    assert kernels != {compile_with(name, "")[1].source}  # the directives did something
