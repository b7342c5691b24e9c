"""N-D permutes: one swap of two runs of dimensions after leading batch dimensions, as a batch of 2-D transposes
(batched transpose, NCHW -> NHWC, a 3-D rotation). Checked on the interpreter against the reference evaluator."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import check_against_reference
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang
from kernel_numbers import numbered

BATCHED = """kernel btrans(X: f32[B, M, N]) -> Y
  default B = 3, M = 256, N = 384
  Y: f32[B, N, M]
  for b in 0..B, i in 0..M, j in 0..N:
    Y[b, j, i] = X[b, i, j]
"""
NHWC = """kernel nhwc(X: f32[N, C, H, W]) -> Y
  default N = 2, C = 128, H = 16, W = 24
  Y: f32[N, H, W, C]
  for n in 0..N, c in 0..C, h in 0..H, w in 0..W:
    Y[n, h, w, c] = X[n, c, h, w]
"""
ROTATE = """kernel rot(X: f32[A, B, C]) -> Y
  default A = 128, B = 4, C = 64
  Y: f32[B, C, A]
  for a in 0..A, b in 0..B, c in 0..C:
    Y[b, c, a] = X[a, b, c]
"""
REVERSE = """kernel rev(X: f32[A, B, C]) -> Y
  default A = 8, B = 4, C = 2
  Y: f32[C, B, A]
  for a in 0..A, b in 0..B, c in 0..C:
    Y[c, b, a] = X[a, b, c]
"""


NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def compile_text(text: str, schedule: str | None = None, sizes=None):
    directives = lang.parse_schedule(schedule, "<test>") if schedule is not None else None
    return compile_loaded(lang.load(text, sizes), directives)


@pytest.mark.parametrize("text,schedule,sizes", [
    (BATCHED, None, None), (BATCHED, "method Y, dma", None), (BATCHED, None, {"B": 2, "M": 200, "N": 130}),
    (NHWC, None, None), (ROTATE, None, None), (BATCHED.replace("f32", "f16"), None, None),
])
def test_permutes_match_the_reference(text, schedule, sizes):
    c = compile_text(text, schedule, sizes)
    assert "transpose" in c.stages["select"]
    check_against_reference(c)


def test_nchw_to_nhwc_is_one_transpose_per_image():
    c = compile_text(NHWC)
    assert "transpose Y -> Y" in c.stages["select"] and "M=128 N=384 B=2" in c.stages["select"]
    assert "for bt in nl.affine_range(2):" in numbered(c.source)


def test_a_3_cycle_keeping_the_last_dimension_compiles():
    """Once a located rejection; now a chain of permutes (tests/compiler/test_permute_any.py has them all)."""
    c = compile_text(CYCLE)
    check_against_reference(c)


def test_a_permute_of_more_dimensions_than_the_search_takes_compiles():
    """Once a located rejection (rank 6); now a narrowed search at rank 6 and short chains above it
    (tests/compiler/test_lang15.py checks ranks 6-8 against NumPy)."""
    names = "abcdef"
    shape = ", ".join("2" for _ in names)
    text = (f"kernel p7(X: f32[{shape}]) -> Y\n  Y: f32[{shape}]\n"
            f"  for {', '.join(f'{v} in 0..2' for v in names)}:\n"
            f"    Y[{', '.join('fdbeca')}] = X[{', '.join(names)}]\n")
    check_against_reference(compile_text(text))


NWHC = """kernel nwhc(X: f32[N, C, H, W]) -> Y
  default N = 2, C = 136, H = 3, W = 20
  Y: f32[N, W, H, C]
  for n in 0..N, c in 0..C, h in 0..H, w in 0..W:
    Y[n, w, h, c] = X[n, c, h, w]
"""
CYCLE = """kernel cyc(X: f32[A, B, C, D]) -> Y
  default A = 4, B = 3, C = 2, D = 5
  Y: f32[B, C, A, D]
  for a in 0..A, b in 0..B, c in 0..C, d in 0..D:
    Y[b, c, a, d] = X[a, b, c, d]
"""


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("text,sizes,schedule", [
    (REVERSE, None, None), (REVERSE, {"A": 200, "B": 3, "C": 150}, None), (NWHC, None, None),
    (NWHC, None, "method Y, dma"),
])
def test_two_dimensions_swapped_around_others_match_the_reference(text, sizes, schedule, dtype):
    # Y[c, b, a] = X[a, b, c]: per b a 2-D transpose of strided slices (no [B, M, N] views)
    c = compile_text(text.replace("f32", dtype), schedule, sizes)
    assert "transpose" in c.stages["select"]
    check_against_reference(c)
    x = np.random.default_rng(1).random(c.program.tensors["X"].shape).astype(np.float32)
    axes = (2, 1, 0) if text is REVERSE else (0, 3, 2, 1)
    want = x.astype(NP[dtype]).astype(np.float32).transpose(axes)
    np.testing.assert_array_equal(np.asarray(c.run(X=x)["Y"], np.float32), want)  # a permute moves bits: exact


@pytest.mark.parametrize("text,sizes", [
    (BATCHED, {"B": 200, "M": 2, "N": 1}), (BATCHED, {"B": 3, "M": 1, "N": 5}), (BATCHED, {"B": 1, "M": 1, "N": 7}),
    (BATCHED, {"B": 2, "M": 130, "N": 1}), (BATCHED.replace("f32", "bf16"), {"B": 4, "M": 1, "N": 1}),
    (NHWC, {"N": 2, "C": 1, "H": 4, "W": 4}), (NHWC, {"N": 2, "C": 3, "H": 1, "W": 1}),
    (NHWC, {"N": 2, "C": 1, "H": 1, "W": 1}), (NHWC.replace("f32", "f16"), {"N": 3, "C": 130, "H": 2, "W": 1}),
])
def test_permutes_with_a_run_of_size_one_match_the_reference(text, sizes):
    # a swapped run of one element moves no data; the views must still place every loop (layout.reshape groups)
    c = compile_text(text, None, sizes)
    assert "transpose" in c.stages["select"]
    check_against_reference(c)
