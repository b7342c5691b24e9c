"""`tilec fmt`: canonical, idempotent, comment-preserving; parse -> fmt -> parse gives the same tree."""
from __future__ import annotations

import math
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilec.lang import syntax as s
from tilec.lang.fmt import format_kernel, format_schedule, format_source
from tilec.lang.parser import parse, parse_schedule

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"

MESSY = """\
# a header comment

kernel  conv(X: f32[N, C, H, W],
             Wt: f32[K, C, R, R], b: f32[K])   ->   Y    # one output
  let Ho = (H - R) + 1
  assume C % 128 == 0
  let Wo = W-R+1
  default N=1
  conv: f32[N, K, Ho, Wo]
  Y: f32[N, K, Ho/2, Wo/2]
  # the convolution
  for n in 0..N:
      for k in 0..K, y in 0..Ho, x in 0..Wo:
          conv[n,k,y,x] = b[k]      # bias first
          for c in 0..C:
            for r in 0..R, s in 0..R:
              conv[n, k, y, x] += (X[n, c, (y + r), x + s] * Wt[k, c, r, s])
  for n in 0..N, k in 0..K, i in 0..Ho / 2, j in 0..Wo / 2:
    Y[n, k, i, j] = - inf
    for p in 0..2, q in 0..2:
      Y[n, k, i, j] max= max(conv[n, k, 2 * i + p, 2*j+q], -(1.5e-3 * -2))
  schedule:
      split conv.y , 2   # halves
      place conv, psum
      tile conv.k, factor = 128
# trailing
"""


def test_messy_program_formats_to_golden(golden) -> None:
    out = format_source(MESSY, "messy.tl")
    golden.check("lang/fmt_messy.tl", out)
    assert parse(out) == parse(MESSY)
    assert format_source(out) == out


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.tl")), ids=lambda p: p.stem)
def test_examples_are_canonical(path: pathlib.Path) -> None:
    text = path.read_text()
    assert format_source(text, str(path)) == text
    assert parse(format_kernel(parse(text))) == parse(text)


def test_schedule_round_trip() -> None:
    text = "split conv.y, 2\ncompute_at conv, Y.j\nbuffers X, -2\ntile conv.k, factor=128\nunroll\n"
    assert format_schedule(parse_schedule(text)) == text


# ---- random trees -------------------------------------------------------------------------------------------------

names = st.sampled_from(["i", "j", "N", "Ho"])
numbers = st.one_of(st.integers(-50, 50), st.floats(allow_nan=False, width=32).filter(lambda v: v != 0 or
                                                                                      math.copysign(1, v) > 0))


def _exprs(leaf: st.SearchStrategy) -> st.SearchStrategy:
    def grow(children: st.SearchStrategy) -> st.SearchStrategy:
        not_num = children.filter(lambda e: not isinstance(e, s.Num))  # the parser folds -<number> into the number
        return st.one_of(
            st.builds(s.Neg, not_num),
            st.builds(s.BinOp, st.sampled_from("+-*/"), children, children),
            st.builds(s.Call, st.sampled_from(["max", "min"]), st.tuples(children, children)),
            st.builds(s.Call, st.sampled_from(["relu", "exp", "f16"]), st.tuples(children)),
            st.builds(s.Access, st.just("A"), st.tuples(children, children)),
        )

    return st.recursive(leaf, grow, max_leaves=12)


values = _exprs(st.one_of(st.builds(s.Num, numbers), st.builds(s.Name, names)))


def _kernel(value: s.Expr, index: s.Expr) -> s.Kernel:
    shape = (s.Name("N"), s.Name("N"))
    body = (s.Loop("i", s.Num(0), s.Name("N"), (
        s.Loop("j", s.Num(1), s.BinOp("-", s.Name("N"), s.Num(1)), (
            s.Assign(s.Access("Z", (s.Name("i"), index)), "+=", value),)),)),)
    return s.Kernel("k", (s.Param("A", s.TensorType("f32", shape)),), ("Z",),
                    (s.Let("Ho", s.BinOp("/", s.Name("N"), s.Num(2))),), (),
                    (s.Decl("Z", s.TensorType("bf16", shape)),),
                    body, (s.Directive("split", (s.Ref(("Z", "i")), 2)),), defaults=(s.Let("N", s.Num(8)),))


@settings(max_examples=100, deadline=None)
@given(value=values, index=values)
def test_random_trees_round_trip(value: s.Expr, index: s.Expr) -> None:
    kernel = _kernel(value, index)
    text = format_kernel(kernel)
    assert parse(text) == kernel
    assert format_source(text) == text
