"""`Y = X * f(beta[j] * X)` with beta's broadcast kept in PSUM (build_psumrow.py): the kernel's structure, its numbers
on the interpreter against NumPy (three, eight and fifteen row tiles: no loop, a loop of one group of six, of two),
and the programs it leaves to the element-wise builder."""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import check_against_reference
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from kernel_numbers import numbered

SWISH = """kernel swish(X: bf16[M, N], beta: bf16[N]) -> Y
  Y: bf16[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = EXPR
"""
PLAIN = "X[i, j] * sigmoid(beta[j] * X[i, j])"


def compiled(rows: int, cols: int, expr: str = PLAIN, dtype: str = "bf16", nki: str = "0.6"):
    text = SWISH.replace("EXPR", expr).replace("bf16", dtype)
    return compile_loaded(lang.load(text, {"M": rows, "N": cols}), nki=nki)


def test_beta_stays_in_psum() -> None:
    """beta broadcast into PSUM once (8 banks at 4096 columns), read there by VectorE's products; no copy of it to
    SBUF; Y = X * s shared by VectorE (1/8) and GpSimdE; X in three buffers, the loop covering six row tiles."""
    src = numbered(compiled(4096, 4096).source)
    assert len(re.findall(r"nc_matmul\(dst=beta_bank\d+, stationary=ones_bf16", src)) == 8
    assert "beta_tile" not in src and "tensor_copy" not in src
    assert re.search(r"tensor_tensor\(dst=z\w*\[:, 0:512\], data1=X_tile\w*\[:, 0:512\], data2=beta_bank0, "
                     r"op=nl\.multiply\)", src)
    assert re.search(r"tensor_tensor\(dst=Y_tile\w*\[:, 0:512\], data1=X_tile\w*\[:, 0:512\], data2=sigmoid_z\w*\[:, "
                     r"0:512\], op=nl\.multiply\)", src)
    assert re.search(r"data2=sigmoid_z\w*\[:, 512:4096\], op=nl\.multiply, engine=nisa\.engine\.gpsimd\)", src)
    assert re.search(r"for w in (nl\.sequential_)?range\(5\)", src)  # (32 - 2) // 6 groups
    assert len(re.findall(r"X_tile\w* = nl\.ndarray", src)) == 3


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("rows,cols,expr", [(384, 512, PLAIN), (1024, 1024, "sigmoid(X[i, j] * beta[j]) * X[i, j]"),
                                            (1920, 512, "X[i, j] * tanh(beta[j] * X[i, j])")])
def test_numbers(rows: int, cols: int, expr: str, nki: str) -> None:
    """Against NumPy's formula (float64 from the same bf16 inputs, Y rounded once: within one bf16 unit) and the
    reference evaluator under the tolerance policy."""
    c = compiled(rows, cols, expr, nki=nki)
    assert "beta_bank0" in c.source
    bf = ml_dtypes.bfloat16
    rng = np.random.default_rng(7)
    x = (rng.normal(size=(rows, cols)) * 3).astype(bf)
    beta = rng.uniform(-2.5, 2.5, size=cols).astype(bf)
    got = np.asarray(c.run(x, beta)["Y"], np.float64)
    xd, bd = x.astype(np.float64), beta.astype(np.float64)
    z = bd * xd
    want = xd * (np.tanh(z) if "tanh" in expr else 1 / (1 + np.exp(-z)))
    np.testing.assert_allclose(got, want, rtol=2.0 ** -8, atol=1e-6)
    check_against_reference(c, seed=3)


@pytest.mark.parametrize("case,rows,cols,expr,dtype", [
    ("rows not whole tiles", 300, 512, PLAIN, "bf16"),
    ("two row tiles", 256, 512, PLAIN, "bf16"),
    ("beta wider than PSUM", 384, 4608, PLAIN, "bf16"),
    ("columns not whole banks", 384, 700, PLAIN, "bf16"),
    ("f32 (beta's broadcast not exact by matmul)", 384, 512, PLAIN, "f32"),
    ("another tensor in the function", 384, 512, "X[i, j] * sigmoid(beta[j] * X[i, j] + 1)", "bf16"),
    ("not a product with X", 384, 512, "X[i, j] + sigmoid(beta[j] * X[i, j])", "bf16"),
])
def test_others_keep_the_elementwise_builder(case: str, rows: int, cols: int, expr: str, dtype: str) -> None:
    assert "beta_bank" not in compiled(rows, cols, expr, dtype).source


def test_schedule_line_names_the_builder() -> None:
    assert "# Y: its broadcast row kept in PSUM" in compiled(384, 512).source
