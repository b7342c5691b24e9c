"""Scheduling primitives on level A (tilec/compiler/primitives.py): each is tested by meaning (the nest evaluates to
the same values before and after), by a before/after golden, and its illegal uses by error goldens."""
from __future__ import annotations

import difflib

import numpy as np
import pytest

from compiler_helpers import inputs_for, program
from tilec.compiler import fuse, primitives as pr
from tilec.compiler.layout import cut
from tilec.compiler.rules import unroll_tiles
from tilec.compiler.nest import lower_nest, print_nest
from tilec.compiler.nest_eval import evaluate_nest
from tilec.errors import Span, TilecError
from tilec.lang import api as lang

ELTWISE = """kernel add1(X: f32[M, N]) -> Y
  default M = 256, N = 8
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] + 1
"""
ROWSUM = """kernel rowsum(A: f32[M, N]) -> s
  default M = 64, N = 12
  s: f32[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += A[i, j]
"""
COLSUM = """kernel colsum(A: f32[M, N]) -> s
  default M = 16, N = 12
  s: f32[N]
  for j in 0..N:
    s[j] = 0
  for i in 0..M, j in 0..N:
    s[j] += A[i, j]
"""
COLMAX = COLSUM.replace("+=", "max=")
COLSUM_FROM_ONE = COLSUM.replace("s[j] = 0", "s[j] = 1")
MATMUL = """kernel mm(A: f32[M, K], B: f32[K, N]) -> C
  default M = 16, K = 12, N = 8
  C: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = 0
  for i in 0..M, j in 0..N, k in 0..K:
    C[i, j] += A[i, k] * B[k, j]
"""
LAST_WINS = """kernel last(X: f32[M, N]) -> Y
  default M = 8, N = 4
  Y: f32[M]
  for i in 0..M, j in 0..N:
    Y[i] = X[i, j]
"""
CHAIN = """kernel chain(X: f32[M, N], b: f32[N]) -> Y
  default M = 16, N = 8
  T: f32[M, N]
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    T[i, j] = X[i, j] * 2
  for i in 0..M, j in 0..N:
    Y[i, j] = T[i, j] + b[j]
"""
MEAN = """kernel mean(A: f32[M, N]) -> Y
  default M = 64, N = 12
  s: f32[M]
  Y: f32[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += A[i, j]
  for i in 0..M:
    Y[i] = s[i] / N
"""
DOT = """kernel dot(A: f32[M, N], B: f32[M, N]) -> s
  default M = 64, N = 12
  s: f32[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += A[i, j] * B[i, j]
"""
ABSSUM = """kernel abssum(A: bf16[M, N]) -> s
  default M = 64, N = 12
  s: f32[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += abs(A[i, j])
"""
STACKED_PAIRS = """kernel pairs(A: f32[M, L, N]) -> s
  default M = 8, L = 2, N = 3
  s: f32[2, N]
  for k in 0..2, n in 0..N:
    s[k, n] = 0
  for k in 0..2, r in 0..4, n in 0..N:
    s[k, n] += A[4 * k + r, 0, n] + A[4 * k + r, 1, n]
"""
MEAN_OF_SQUARES = MEAN.replace("+= A[i, j]", "+= A[i, j] * A[i, j]")
SIBLINGS = """kernel halves(X: f32[M, 2 * H], C: f32[M, H]) -> Y, Z
  default M = 16, H = 4
  Y: f32[M, H]
  Z: f32[M, H]
  for i in 0..M, j in 0..H:
    Y[i, j] = X[i, j] * C[i, j]
  for i in 0..M, j in 0..H:
    Z[i, j] = X[i, H + j] * C[i, j]
"""
SHIFTED = CHAIN.replace("Y[i, j] = T[i, j] + b[j]", "Y[i, j] = T[i, N - 1 - j] + b[j]")
CONV = ("conv_relu", {"N": 1, "C": 128, "H": 6, "W": 6, "K": 128})


def kernel_of(text: str):
    prog = lang.load(text)
    return prog, lower_nest(prog)


CASES = {  # name -> (program text, primitive applied to the level-A kernel)
    "split": (ELTWISE, lambda k: pr.split(k, "i", 128)),
    "split_reduction": (ROWSUM, lambda k: pr.split(k, "j", 4)),
    "reorder": (ELTWISE, lambda k: pr.reorder(k, "j", "i")),
    "reorder_reduction": (MATMUL, lambda k: pr.reorder(k, "k", "i#1", "j#1")),
    "unroll": (ROWSUM, lambda k: pr.unroll(k, "j")),
    # every tile loop `t` of a cut nest (`t@a`, `t@b`): rules.unroll_tiles, what `unroll Y.v` applies (core20)
    "unroll_tiles": (ELTWISE, lambda k: unroll_tiles(pr.split(pr.split(cut(k, "i", 200), "i@a", 100, outer="t@a"),
                                                              "i@b", 28, outer="t@b"), "t")),
    # the copies written out, each staged into a buffer of its own (rules.colreduce's 16-bit row groups)
    "unroll_copies": (COLSUM, lambda k: pr.stage(pr.stage(pr.unroll(pr.split(k, "i", 8, outer="g", inner="p"), "g",
                                                                     copies=True), "A", "g#0", "sbuf"),
                                                 "A", "g#1", "sbuf", name="A_r1")),
    "partition": (ELTWISE, lambda k: pr.partition(pr.split(k, "i", 128), "i_i")),
    # two copies' updates of one element as one `+=` of both (rules.colreduce's fp32 pairs, then bind_expr)
    "pair": (COLSUM, lambda k: pr.pair(pr.unroll(pr.split(k, "i", 8, outer="g", inner="p"), "g", copies=True),
                                       "g#0", "g#1")),
    "partition_summed": (COLSUM, lambda k: pr.partition(k, "i", summed=True)),  # a column sum: a ones matmul
    "stage": (MATMUL, lambda k: pr.stage(k, "B", "j#1", "sbuf")),
    "buffers": (MATMUL, lambda k: pr.buffers(pr.stage(k, "B", "j#1", "sbuf"), "B_sbuf", 2)),
    "compute_at": (CHAIN, lambda k: pr.compute_at(k, "T", "i#1")),
    "compute_at_inner": (CHAIN, lambda k: pr.compute_at(k, "T", "j#1")),
    "reverse_compute_at": (MEAN, lambda k: pr.reverse_compute_at(k, "i#1", "i#0")),
    "reverse_compute_at_tile": (MEAN, lambda k: pr.reverse_compute_at(pr.split(pr.split(k, "i#0", 16), "j", 4),
                                                                      "i", "i_o")),
    "bind_expr": (DOT, lambda k: pr.bind_expr(k, "s", "j", "T")),
    # the terms in the source's 16-bit dtype (rules.colreduce's expressions; abs is exact in bf16)
    "bind_expr_dtype": (ABSSUM, lambda k: pr.bind_expr(k, "s", "j", "T", dtype="bf16")),
    # the initial value folded into the reduce (rules' reductions: tensor_reduce writes its first result)
    "fold_init": (COLSUM, lambda k: pr.fold_init(k, "s")),
    # the K blocks of R rows as one tile of K*R partitions, read at [R*k + r] (rules.colreduce's fp32 row pairs:
    # the pair's sum bound to one tile after layout.merge_dims made the reads [R*k + r, l, f])
    "bind_expr_merged": (STACKED_PAIRS, lambda k: pr.bind_expr(k, "s", "k#1", "T", merged=True)),
    # the consumer computed at the producer's loop although the bound tile T (written in each iteration, read by
    # no one after) is indexed by none of the loops above it
    "reverse_compute_at_past_a_temporary": (MEAN_OF_SQUARES, lambda k: pr.reverse_compute_at(
        pr.bind_expr(k, "s", "j", "T"), "i#1", "i#0")),
    # siblings over one domain computed in one nest (core26: siblings.py's fusion on level A)
    "fuse": (SIBLINGS, lambda k: fuse.fuse(k, "i#0", "i#1")),
    # a producer and its reader at the same index: each element written, then read, in the same iteration
    "fuse_producer": (CHAIN, lambda k: fuse.fuse(k, "i#0", "i#1")),
    "split_reorder_stage": (ELTWISE, lambda k: pr.stage(pr.reorder(pr.split(k, "i", 128), "i_o", "i_i", "j"),
                                                        "X", "i_i", "sbuf")),
}


def _diff(before: str, after: str) -> str:
    lines = difflib.unified_diff(before.splitlines(), after.splitlines(), "before", "after", lineterm="", n=1)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name", sorted(CASES))
def test_primitive_keeps_the_meaning(name: str, golden) -> None:
    text, apply = CASES[name]
    prog, before = kernel_of(text)
    after = apply(before)
    inputs = inputs_for(prog)
    want = evaluate_nest(before, inputs)
    got = evaluate_nest(after, inputs)
    for out in want:
        np.testing.assert_allclose(got[out], want[out], rtol=1e-5, atol=1e-6)
    golden.check(f"compiler/primitives/{name}.txt", _diff(print_nest(before), print_nest(after)))


def test_compute_at_of_a_conv_into_its_pool_keeps_the_meaning() -> None:
    """conv computed per pooled row: each iteration of Y's loop i computes the 2 conv rows its window reads."""
    prog = program("conv_bias_maxpool", {"N": 1, "C": 128, "H": 6, "W": 8, "K": 128})
    before = lower_nest(prog)
    after = pr.compute_at(before, "conv", "i")
    assert "for y_r in serial(2):" in print_nest(after) and "alloc conv" in print_nest(after)
    inputs = inputs_for(prog)
    np.testing.assert_allclose(evaluate_nest(after, inputs)["Y"], evaluate_nest(before, inputs)["Y"], rtol=1e-5)


def test_stage_on_a_convolution_keeps_the_meaning() -> None:
    """The input window a conv output row reads (X[n, c, y + r, x + s] over c, r, s) staged at loop x."""
    prog = program(*CONV)
    before = lower_nest(prog)
    after = pr.stage(before, "X", "x", "sbuf")
    assert "alloc X_sbuf: sbuf f32[128, 3, 3]" in print_nest(after)  # the image n is fixed: channels lead
    inputs = inputs_for(prog)
    np.testing.assert_allclose(evaluate_nest(after, inputs)["Y"], evaluate_nest(before, inputs)["Y"], rtol=1e-5)


ERRORS = {
    "split_not_dividing": (ELTWISE, lambda k: pr.split(k, "i", 100)),
    "partition_reduced_loop": (COLSUM, lambda k: pr.partition(k, "i")),
    "partition_summed_max": (COLMAX, lambda k: pr.partition(k, "i", summed=True)),  # no engine adds maxima so
    "split_unknown_loop": (ELTWISE, lambda k: pr.split(k, "q", 2)),
    "reorder_not_perfect": (ROWSUM, lambda k: pr.reorder(k, "i", "j")),
    "reorder_ambiguous_loop": (MATMUL, lambda k: pr.reorder(k, "j", "i")),
    "reorder_assign_not_spatial": (LAST_WINS, lambda k: pr.reorder(k, "j", "i")),
    "unroll_too_long": (ELTWISE, lambda k: pr.unroll(k, "i")),
    "pair_not_neighbours": (COLSUM, lambda k: pr.pair(pr.unroll(pr.split(k, "i", 4, outer="g", inner="p"), "g",
                                                                copies=True), "g#0", "g#2")),
    "pair_not_updates": (ELTWISE, lambda k: pr.pair(pr.unroll(pr.split(k, "i", 128, outer="g", inner="p"), "g",
                                                              copies=True), "g#0", "g#1")),
    "unroll_copies_of_a_name_used_twice": (MATMUL, lambda k: pr.unroll(k, "i#1", copies=True)),
    "unroll_copies_of_an_allocation": (ELTWISE, lambda k: pr.unroll(pr.stage(pr.split(k, "i", 128, outer="io"), "X",
                                                                             "io", "sbuf"), "io", copies=True)),
    "partition_too_many": (ELTWISE, lambda k: pr.partition(k, "i")),
    "partition_not_indexing": (ROWSUM, lambda k: pr.partition(k, "j")),
    "stage_not_read": (MATMUL, lambda k: pr.stage(k, "A", "i#0", "sbuf")),
    "buffers_not_on_chip": (MATMUL, lambda k: pr.buffers(k, "B", 2)),
    "buffers_too_many": (MATMUL, lambda k: pr.buffers(pr.stage(k, "B", "j#1", "sbuf"), "B_sbuf", 8)),
    "compute_at_output": (CHAIN, lambda k: pr.compute_at(k, "Y", "i#1")),
    "compute_at_before_producer": (CHAIN, lambda k: pr.compute_at(k, "T", "i#0")),
    "bind_expr_plain_read": (ROWSUM, lambda k: pr.bind_expr(k, "s", "j", "T")),
    "bind_expr_not_one_update": (DOT, lambda k: pr.bind_expr(k, "s", "i", "T")),
    "bind_expr_not_an_on_chip_dtype": (DOT, lambda k: pr.bind_expr(k, "s", "j", "T", dtype="f64")),
    "bind_expr_merged_not_stacked": (STACKED_PAIRS.replace("A[4 * k + r, 1, n]", "A[r, 1, n]"),
                                     lambda k: pr.bind_expr(k, "s", "k#1", "T", merged=True)),
    "reverse_compute_at_reduction_loop": (MEAN, lambda k: pr.reverse_compute_at(k, "i#1", "j")),
    "fold_init_not_the_identity": (COLSUM_FROM_ONE, lambda k: pr.fold_init(k, "s")),
    "fold_init_no_initialising_nest": (ELTWISE, lambda k: pr.fold_init(k, "Y")),
    "reverse_compute_at_not_next": (CHAIN, lambda k: pr.reverse_compute_at(k, "i#0", "j#1")),
    "fuse_shifted_read": (SHIFTED, lambda k: fuse.fuse(k, "i#0", "i#1")),
    "fuse_different_extents": (SIBLINGS, lambda k: fuse.fuse(pr.split(k, "j#1", 2), "i#0", "i#1")),
    "fuse_not_neighbours": (MEAN, lambda k: fuse.fuse(k, "i#0", "j")),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_illegal_primitives_are_user_errors(name: str, golden) -> None:
    text, apply = ERRORS[name]
    with pytest.raises(TilecError) as info:
        apply(kernel_of(text)[1])
    golden.check(f"compiler/primitives/errors/{name}.txt", info.value.render() + "\n")


def test_reverse_compute_at_errors_are_located() -> None:
    """The span a directive gives comes back on the error (the caret under the directive's line)."""
    span = Span("<schedule>", 3, 1, 3, 20)
    with pytest.raises(TilecError) as info:
        pr.reverse_compute_at(kernel_of(MEAN)[1], "i#1", "j", span=span)
    assert info.value.span == span and "does not index s[i]" in str(info.value)


HELPERS = {"with_loop_many"}  # Kernel -> Kernel plumbing the primitives share, not a schedule step


def test_every_primitive_has_before_after_and_error_goldens() -> None:
    """Issue 10: "every primitive has before/after goldens and error goldens". A primitive is a public
    `Kernel -> Kernel` function of primitives.py or layout.py; its goldens are named after it."""
    import inspect
    import pathlib

    from tilec.compiler import layout

    golden = pathlib.Path(__file__).resolve().parents[1] / "golden" / "compiler"
    missing = []
    for module, folder in ((pr, "primitives"), (fuse, "primitives"), (layout, "layout")):
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            params = list(inspect.signature(fn).parameters.values())
            if fn.__module__ != module.__name__ or name.startswith("_") or name in HELPERS or not params or \
                    params[0].annotation != "Kernel" or inspect.signature(fn).return_annotation != "Kernel":
                continue
            for kind, pattern in (("before/after", f"{name}*.txt"), ("error", f"errors/{name}*.txt")):
                if not list((golden / folder).glob(pattern)):
                    missing.append(f"{folder}.{name}: no {kind} golden")
    assert not missing, missing
