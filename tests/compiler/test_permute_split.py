"""gaps15: element-wise work on the way through a transpose or permute compiles as the element-wise statement in
the read's order, then a permute (permute_split.py), and matches NumPy formulas in float64 in both NKI dialects."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run, run_signed
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang

PROGRAMS = pathlib.Path(__file__).parents[1] / "programs" / "gaps15"

FORMULAS = {
    "transpose3d_relu": lambda a: {"Y": np.maximum(a["X"], 0).transpose(0, 2, 1)},
    "transpose3d_first_last": lambda a: {"Y": (a["X"] * 2).transpose(2, 1, 0)},
    "nchw_to_nhwc_add": lambda a: {"Y": (a["X"] + a["b"][None, :, None, None]).transpose(0, 2, 3, 1)},
    "nhwc_to_nchw_relu": lambda a: {"Y": np.maximum(a["X"], 0).transpose(0, 3, 1, 2)},
}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_elementwise_work_through_a_permute_matches_numpy(name, nki):
    prog, c, inputs, out = compile_and_run((PROGRAMS / f"{name}.tl").read_text(), nki)
    want = FORMULAS[name]({k: np.asarray(v, np.float64) for k, v in inputs.items()})
    for tensor, expected in want.items():
        assert_matches(prog, tensor, out[tensor], expected)


TRANSPOSE_2D = """\
kernel tr(X: f32[M, N], c: f32[N]) -> Y
  default M = 300, N = 129
  Y: f32[N, M]
  for i in 0..M, j in 0..N:
    Y[j, i] = relu(X[i, j] - c[j])
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_ragged_2d_transpose_with_a_relu_and_a_broadcast(dtype):
    """Signed inputs (the relu changes the result); bf16: the temporary has the output's dtype, rounded once."""
    prog, c, out, a = run_signed(TRANSPOSE_2D, dtype, seed=3)
    assert "Y_pre" in prog.tensors or "Y_pre" in c.stages["select"]
    assert_matches(prog, "Y", out["Y"], np.maximum(a["X"] - a["c"][None, :], 0).T)


def test_two_reads_in_two_orders_stay_refused():
    text = ("kernel bad(A: f32[M, N], c: f32[N, M]) -> Y\n  default M = 128, N = 64\n  Y: f32[N, M]\n"
            "  for i in 0..M, j in 0..N:\n    Y[j, i] = A[i, j] + c[j, i]\n")
    with pytest.raises(TilecError) as info:
        compile_loaded(lang.load(text))
    assert info.value.span is not None and info.value.span.line == 5


SHIFTED = {  # program text, NumPy formula of the inputs in float64
    "strided_slice": (None, lambda a: a["X"][::2, ::3][:256, :300]),
    "strided_slice_offset": (None, lambda a: a["X"][:, :, 1::2]),
    "diff_adjacent": (None, lambda a: a["X"][:, 1:] - a["X"][:, :-1]),
    "strided_difference": ("""\
kernel sd(X: f32[B, M, N]) -> Y
  default B = 3, M = 130, N = 602
  Y: f32[B, M, N / 2]
  for b in 0..B, i in 0..M, j in 0..N / 2:
    Y[b, i, j] = X[b, i, 2 * j + 1] * 2 - X[b, i, 2 * j]
""", lambda a: a["X"][:, :, 1::2] * 2 - a["X"][:, :, ::2]),
}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("name", sorted(SHIFTED))
def test_shifted_and_strided_reads_match_numpy(name, nki):
    """A strided slice alone is a copy (one DMA with steps); in an expression, the read is copied first."""
    text, formula = SHIFTED[name]
    text = text or (PROGRAMS / f"{name}.tl").read_text()
    prog, c, inputs, out = compile_and_run(text, nki)
    want = formula({k: np.asarray(v, np.float64) for k, v in inputs.items()})
    assert_matches(prog, "Y", out["Y"], want)


def test_a_strided_slice_is_one_dma_with_steps():
    from tilec.compiler import wrap

    prog, c, inputs, out = compile_and_run((PROGRAMS / "strided_slice_offset.tl").read_text(), "0.6")
    dmas = [line for line in wrap.unwrap(c.source).splitlines() if "dma_copy" in line]
    assert len(dmas) == 1 and "1:600:2]" in dmas[0]
