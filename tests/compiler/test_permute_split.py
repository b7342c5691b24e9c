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
    """Signed inputs (the relu changes the result); bf16: rounded once, on the eviction. Since move17 the column
    c[j] (over the transposed tile's partitions) and the relu are done on the transpose's eviction (fn_chain.py):
    no temporary."""
    prog, c, out, a = run_signed(TRANSPOSE_2D, dtype, seed=3)
    assert "Y_pre" not in prog.tensors and "Y_pre" not in c.stages["select"] and "nc_transpose" in c.source
    assert_matches(prog, "Y", out["Y"], np.maximum(a["X"] - a["c"][None, :], 0).T)


def test_two_reads_in_two_orders_are_one_transpose_of_the_one_not_in_the_outputs_order():
    """Y[j, i] = A[i, j] + c[j, i]: c is read in the output's order, A transposed: one transpose of A, c staged like
    Y and added on the eviction (fn_chain.py; through a temporary A_t in session 19, refused before)."""
    text = ("kernel two(A: f32[M, N], c: f32[N, M]) -> Y\n  default M = 128, N = 64\n  Y: f32[N, M]\n"
            "  for i in 0..M, j in 0..N:\n    Y[j, i] = A[i, j] + c[j, i]\n")
    prog, c, inputs, out = compile_and_run(text, "0.6")
    assert "src A computing A[i, j] + c[j, i]" in c.stages["select"] and "A_t" not in c.stages["select"]
    a = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
    assert_matches(prog, "Y", out["Y"], a["A"].T + a["c"])


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
    """A slice strided in both dimensions (X[2*i, 3*j]); one strided in the rows only (strided_slice_offset) loads
    whole rows and picks the elements on chip since core17 (test_copy_strided.py)."""
    from tilec.compiler import wrap

    prog, c, inputs, out = compile_and_run((PROGRAMS / "strided_slice.tl").read_text(), "0.6")
    dmas = [line for line in wrap.unwrap(c.source).splitlines() if "dma_copy" in line]
    assert len(dmas) == 1 and "255:2, 0:898:3]" in dmas[0]


RESHAPES = {  # core16: a copy through an index `h * D + d` (a reshape of one dimension into two): NumPy formulas
    "heads_split": (None, lambda a: a["X"].reshape(256, 8, 64).transpose(1, 0, 2)),
    "heads_merge": (None, lambda a: a["X"].transpose(1, 0, 2).reshape(256, 512)),
    "split_middle": ("""\
kernel hs(X: {t}[S, E]) -> Y
  default S = 200, E = 96
  let H = 3, D = E / 3
  Y: {t}[S, H, D]
  for s in 0..S, h in 0..H, d in 0..D:
    Y[s, h, d] = X[s, D * h + d]
""", lambda a: a["X"].reshape(200, 3, 32)),
    "split_permuted": ("""\
kernel hs(X: {t}[S, E]) -> Y
  default S = 200, E = 96
  let H = 3, D = E / 3
  Y: {t}[H, S, D]
  for s in 0..S, h in 0..H, d in 0..D:
    Y[h, s, d] = X[s, d + h * D]
""", lambda a: a["X"].reshape(200, 3, 32).transpose(1, 0, 2)),
    "merge_batched": ("""\
kernel hm(X: {t}[B, H, S, D]) -> Y
  default B = 2, H = 4, S = 130, D = 48
  Y: {t}[B, S, H * D]
  for b in 0..B, h in 0..H, s in 0..S, d in 0..D:
    Y[b, s, h * D + d] = X[b, h, s, d]
""", lambda a: a["X"].transpose(0, 2, 1, 3).reshape(2, 130, 192)),
}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(RESHAPES))
def test_a_copy_through_a_reshape_index_matches_numpy(name, dtype, nki):
    text, formula = RESHAPES[name]
    text = (PROGRAMS / f"{name}.tl").read_text().replace("f32", dtype) if text is None else text.format(t=dtype)
    prog, c, inputs, out = compile_and_run(text, nki)
    want = formula({k: np.asarray(v, np.float64) for k, v in inputs.items()})
    assert_matches(prog, "Y", out["Y"], want)


def test_a_reshape_copy_is_one_copy_per_head():
    """heads_split: 8 heads, one DMA per head and block of 128 rows, each moving rows of D elements."""
    from tilec.compiler import wrap

    prog, c, inputs, out = compile_and_run((PROGRAMS / "heads_split.tl").read_text(), "0.6")
    dmas = [line for line in wrap.unwrap(c.source).splitlines() if "dma_copy" in line]
    assert len(dmas) == 8 and all(f"{64 * h}:{64 * h + 64}]" in dmas[h] for h in range(8))


def test_a_reshape_index_over_too_many_heads_stays_refused():
    from tilec.compiler.permute_split import MAX_HEADS, split_reshape_copies

    text = f"""kernel hs(X: f32[S, E]) -> Y
  default S = 4, E = {2 * (MAX_HEADS + 1)}
  let H = {MAX_HEADS + 1}, D = 2
  Y: f32[H, S, D]
  for h in 0..H, s in 0..S, d in 0..D:
    Y[h, s, d] = X[s, h * D + d]
"""
    prog = lang.load(text)
    assert split_reshape_copies(prog) is prog
    with pytest.raises(TilecError) as err:
        compile_loaded(prog)
    assert err.value.span is not None and err.value.hint
