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
