"""relu written where users write it: in the matmul's/conv's own loop nest (`C[i, j] = relu(C[i, j])` after the
reduction) or in a following nest that rectifies the output in place. Both compile to the same fused kernel as the
`Y = relu(C)` form (examples/linear.tl): the relu runs on the PSUM eviction and the output goes to HBM once. Any
other in-place update of a contraction's output is a golden error."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_example
from tilec.compiler.api import compile_file, compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang

MATMUL = """\
kernel mm(A: {dt}[M, K], B: {dt}[K, N]{bias_param}) -> C
  default M = 256, K = 256, N = 256
  C: {dt}[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = {init}
    for k in 0..K:
      C[i, j] += A[i, k] * B[k, j]
{relu}"""
SAME_NEST = "    C[i, j] = relu(C[i, j])\n"
NEXT_NEST = "  for i in 0..M, j in 0..N:\n    C[i, j] = relu(C[i, j])\n"
BIASES = {"none": ("", "0"), "row": (", b: {dt}[M]", "b[i]"), "column": (", b: {dt}[N]", "b[j]")}


def _matmul(bias: str, relu: str, dt: str = "f32") -> str:
    param, init = BIASES[bias]
    return MATMUL.format(dt=dt, bias_param=param.format(dt=dt), init=init, relu=relu)


CONV = """\
kernel cnn(X: f32[N, C, H, W], Wt: f32[K, C, R, R], b: f32[K]) -> {out}
  default N = 1, C = 128, H = 10, W = 10, K = 128, R = 3
  let Ho = H - R + 1, Wo = W - R + 1
  conv: f32[N, K, Ho, Wo]
{pool_decl}  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    conv[n, k, y, x] = b[k]
    for c in 0..C, r in 0..R, s in 0..R:
      conv[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
{relu}{pool}"""
CONV_SAME_NEST = "    conv[n, k, y, x] = relu(conv[n, k, y, x])\n"
CONV_NEXT_NEST = "  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:\n    conv[n, k, y, x] = relu(conv[n, k, y, x])\n"
POOL_DECL = "  Y: f32[N, K, Ho / 2, Wo / 2]\n"
POOL = """\
  for n in 0..N, k in 0..K, i in 0..Ho / 2, j in 0..Wo / 2:
    Y[n, k, i, j] = -inf
    for p in 0..2, q in 0..2:
      Y[n, k, i, j] max= conv[n, k, 2*i + p, 2*j + q]
"""


def _conv(relu: str, pooled: bool) -> str:
    return CONV.format(out="Y" if pooled else "conv", pool_decl=POOL_DECL if pooled else "", relu=relu,
                       pool=POOL if pooled else "")


def _signed_inputs(prog, seed: int = 3) -> dict[str, np.ndarray]:
    """Centred inputs: with the harness's [0, 1) inputs every product is positive and a missing relu would pass."""
    rng = np.random.default_rng(seed)
    return {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5) for t in prog.inputs}


def _check_relu_against_reference(c, out: str, clipped: float = 0.2) -> None:
    """`clipped`: the least share of output zeros (a 2x2 max pool is 0 only where its four inputs all were)."""
    prog = c.program
    dtype = prog.tensors[out].dtype
    inputs = _signed_inputs(prog)
    if dtype != "f32":
        inputs = {k: v.astype(np.float16) for k, v in inputs.items()}
    want = np.asarray(lang.evaluate(prog, inputs)[out], np.float32)
    got = np.asarray(c.run(**inputs)[out], np.float32)
    assert got.shape == want.shape
    assert (want == 0).mean() > clipped and (want > 0).mean() > 0.2  # the relu clips a share of the elements
    assert_matches(prog, out, got, want)


def _assert_fused(source: str, out: str) -> None:
    """One activation relu (on the eviction), and the output is written to HBM once and never read back."""
    assert len(re.findall(r"nisa\.activation\(op=nl\.relu\b", source)) == 1
    assert len(re.findall(rf"dma_copy\(dst={out}\b", source)) == 1
    assert not re.search(rf"src={out}\b", source)


@pytest.mark.parametrize("where", ["same_nest", "next_nest"])
@pytest.mark.parametrize("bias", sorted(BIASES))
def test_matmul_relu_in_place(bias, where):
    c = compile_loaded(lang.load(_matmul(bias, SAME_NEST if where == "same_nest" else NEXT_NEST)))
    _assert_fused(c.source, "C")
    _check_relu_against_reference(c, "C")


def test_linear_same_nest_f16():
    c = compile_loaded(lang.load(_matmul("column", SAME_NEST, "f16")))
    _assert_fused(c.source, "C")
    _check_relu_against_reference(c, "C")


def test_column_bias_is_added_then_rectified_on_eviction():
    src = compile_loaded(lang.load(_matmul("column", SAME_NEST))).source
    assert re.search(r"= nisa\.tensor_tensor\(C_acc, b_bc\b.*op=nl\.add.*# tl:5$", src, re.M)
    assert re.search(r"= nisa\.activation\(op=nl\.relu, .*# tl:8$", src, re.M)  # the relu keeps its own .tl line


def _normalised(source: str, renames: dict[str, str]) -> list[str]:
    """The kernel's code lines without comments, docstring or blank lines, with tensor names unified."""
    body = source.split('"""', 2)[2]
    lines = []
    for line in body.splitlines():
        code = line.split("  #", 1)[0].rstrip()
        if not code or code.lstrip().startswith("#"):
            continue
        for old, new in renames.items():
            code = re.sub(rf"\b{old}(?=\b|_)", new, code)
        lines.append(code)
    return lines


def test_same_nest_linear_is_the_kernel_of_the_relu_of_a_temporary():
    """examples/linear.tl writes Y = relu(H) in a second nest; the same layer written in one nest (output C, inputs
    A, B) must give the same instructions."""
    ref = compile_example("linear", dict(M=256, K=256, N=256)).source
    same = _matmul("column", SAME_NEST).replace("kernel mm(", "kernel linear(")
    got = compile_loaded(lang.load(same)).source
    want_lines = _normalised(ref, {"X": "A", "W": "B", "H": "C", "Y": "C"})
    assert _normalised(got, {}) == want_lines
    assert sum("nisa.activation(op=nl.relu" in line for line in want_lines) == 1


@pytest.mark.parametrize("where", ["same_nest", "next_nest"])
@pytest.mark.parametrize("pooled", [False, True], ids=["conv_out", "maxpool"])
def test_conv_relu_in_place(where, pooled, tmp_path):
    path = tmp_path / f"conv_{where}_{pooled}.tl"
    path.write_text(_conv(CONV_SAME_NEST if where == "same_nest" else CONV_NEXT_NEST, pooled))
    c = compile_file(str(path))
    out = "Y" if pooled else "conv"
    _assert_fused(c.source, out)
    if pooled:  # the conv temporary never reaches HBM
        assert not re.search(r"\bconv = nl\.ndarray\(.*shared_hbm", c.source)
    _check_relu_against_reference(c, out, 0.03 if pooled else 0.2)


REJECTED = {
    "relu_of_another_element": _matmul("none", "    C[i, j] = relu(C[j, i])\n"),
    "relu_before_the_reduction": _matmul("none", "").replace(
        "    C[i, j] = 0\n", "    C[i, j] = 0\n    C[i, j] = relu(C[i, j])\n"),
}  # `conv = 2 * conv` in the next nest compiles since gaps15 (inplace_split.py; test_inplace_split.py), and
# `C = C * 2` in the same nest since fuse15 (an element-wise chain on the eviction; test_eviction_fusion.py)


def test_relu_then_a_row_in_place_runs_on_the_eviction():
    """`C = relu(C) + b[j]` in the matmul's nest (refused until evict24: a row along the columns is now a step of
    the eviction's chain anywhere in it, not only as the first)."""
    prog = lang.load(_matmul("none", "    C[i, j] = relu(C[i, j]) + b[j]\n").replace(
        "B: f32[K, N]", "B: f32[K, N], b: f32[N]"))
    rng = np.random.default_rng(3)
    ins = {t.name: rng.random(t.shape, dtype=np.float32) - np.float32(0.5) for t in prog.inputs}
    got = compile_loaded(prog).run(**ins)["C"]
    a = {k: v.astype(np.float64) for k, v in ins.items()}
    want = np.maximum(a["A"] @ a["B"], 0) + a["b"][None, :]
    assert_matches(prog, "C", got, want)


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_other_in_place_updates_are_clear_errors(name, golden):
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load(REJECTED[name]))
    assert err.value.span is not None
    golden.check(f"compiler/errors/relu_in_nest_{name}.txt", err.value.render() + "\n")
