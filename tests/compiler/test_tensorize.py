"""Instruction selection by matching (compiler/tensorize.py): every statement of every example matches an
instruction of the Target's table, with the roles the compiler's kernels use."""
from __future__ import annotations

import pytest

from compiler_helpers import EXAMPLES, program
from tilec.compiler.nest import Assign, Update, lower_nest, walk
from tilec.compiler.tensorize import match
from tilec.lang import api as lang
from tilec.target import TRN2

SMALL = {"conv2d": {"H": 10, "W": 10}, "conv_bias_maxpool": {"H": 10, "W": 10}}


@pytest.mark.parametrize("name", sorted(p.stem for p in EXAMPLES.glob("*.tl")))
def test_every_statement_of_every_example_matches(name: str) -> None:
    k = lower_nest(program(name, SMALL.get(name)))
    for s in walk(k.body):
        if isinstance(s, (Assign, Update)) and not (isinstance(s, Assign) and s.expr.__class__.__name__ == "Const"):
            found = match(s, TRN2)
            assert found is not None, s
            assert found.instr in TRN2.instructions


def _first_match(text: str, kind=Update) -> str:
    k = lower_nest(lang.load(text))
    return str(match(next(s for s in walk(k.body) if isinstance(s, kind)), TRN2))


def test_conv_binds_channels_and_taps() -> None:
    k = lower_nest(program("conv_relu"))
    upd = next(s for s in walk(k.body) if isinstance(s, Update))
    assert str(match(upd)) == "nc_matmul(k: c, r, s; m: k; n: n, y, x)"


@pytest.mark.parametrize("name,kind,want", [
    ("matmul", Update, "nc_matmul(k: k; m: i; n: j)"),
    ("rowsum", Update, "tensor_reduce(p: i; f: j)"),
    ("transpose", Assign, "nc_transpose(p: j; f: i)"),  # Y[i, j] = X[j, i]
    ("vector_add", Assign, "tensor_tensor(OP: +)"),
    ("softmax", Update, "tensor_reduce(p: i; f: j)"),
])
def test_matches(name: str, kind, want: str) -> None:
    k = lower_nest(program(name))
    stmt = next(s for s in walk(k.body) if isinstance(s, kind) and not type(s.expr).__name__ == "Const")
    assert str(match(stmt)) == want


def test_block_statements_match_with_their_roles() -> None:
    """A depthwise tap is a per-partition multiply-accumulate; a function of one operand (relu6 of the expanded
    activations, relu of a padded read) stays a matmul operand."""
    k = lower_nest(program("mobilenet_block"))
    got = [str(match(s)) for s in walk(k.body) if isinstance(s, Update)]
    assert got == ["nc_matmul(k: c; m: e; n: n, y, x)", "scalar_tensor_tensor(p: e; f: n, y, x; taps: r, s)",
                   "nc_matmul(k: e; m: k; n: n, y, x)"]
    k = lower_nest(program("resnet_block"))
    assert [str(match(s)) for s in walk(k.body) if isinstance(s, Update)] == \
        ["nc_matmul(k: c, r, s; m: k; n: n, y, x)"] * 2


def test_a_function_of_the_loop_index_is_no_matmul_operand() -> None:
    text = """kernel k(A: f32[M, K], B: f32[K, N]) -> C
  default M = 4, K = 4, N = 4
  C: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += (A[i, k] + k) * B[k, j]
"""
    assert not _first_match(text).startswith("nc_matmul")


def test_a_row_sum_of_a_square_matches_the_activation_that_squares_and_sums() -> None:
    """`s[i] += x * x` along the rows is one ScalarE activation (FN square, the row sum its reduce_res): the row of the
    table rules.reduce names (`tensorize(p_x, square=sum)`). A column sum of a square, a sum of a product of two
    tensors and a maximum of a square are not that instruction."""
    row = """kernel k(A: f32[M, N], B: f32[M, N]) -> s
  default M = 4, N = 8
  s: f32[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += (A[i, j] - B[i, j]) * (A[i, j] - B[i, j])
"""
    assert _first_match(row) == "activation(FN: square; p: i; f: j; reduce_res: s)"
    assert _first_match(row.replace("(A[i, j] - B[i, j]) * (A[i, j] - B[i, j])", "A[i, j] * B[i, j]")) == \
        "tensor_reduce(p: i; f: j)"
    assert _first_match(row.replace("s[i] = 0", "s[i] = -inf").replace("+=", "max=")) == "tensor_reduce(p: i; f: j)"
    column = """kernel k(A: f32[M, N]) -> s
  default M = 4, N = 8
  s: f32[N]
  for j in 0..N:
    s[j] = 0
  for i in 0..M, j in 0..N:
    s[j] += A[i, j] * A[i, j]
"""
    assert not _first_match(column).startswith("activation")
