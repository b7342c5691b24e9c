"""A column sum of an expression of 16-bit reads into an f32 result computes its terms in f32 (rules_colreduce
terms_dtype): a bf16 terms tile rounded every `X * X / M`, 0.000194 off the reference against a tolerance of
4.98e-05 (core23's find). A 16-bit result keeps 16-bit terms (TensorE's 16-bit rate). Against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, inputs_for
from tilec.compiler import ir
from tilec.compiler.api import compile_loaded
from tilec.compiler.pipeline import compile_program
from tilec.lang import api as lang

SUMSQ = """\
kernel c(X: bf16[M, N], b: {out}[N]) -> s
  default M = 300, N = 640
  s: {out}[N]
  for j in 0..N:
    s[j] = b[j]
    for i in 0..M:
      s[j] += X[i, j] * X[i, j] / M
"""


@pytest.mark.parametrize("out", ["f32", "bf16"])
def test_terms_in_f32_for_an_f32_sum(out: str) -> None:
    prog = lang.load(SUMSQ.format(out=out))
    kernel = compile_program(prog).kernel
    terms = {s.dst.buf.dtype for s in ir.walk(kernel.body)
             if isinstance(s, (ir.Binary, ir.Act, ir.Scalar)) and s.dst.buf.name.startswith("s_terms")}
    assert terms == {"f32" if out == "f32" else "bf16"}
    x = {k: v.astype(lang.NP_DTYPES[prog.tensors[k].dtype]) for k, v in inputs_for(prog).items()}
    want = x["b"].astype(np.float64) + (x["X"].astype(np.float64) ** 2).sum(axis=0) / 300
    assert_matches(prog, "s", compile_loaded(prog).run(**x)["s"], want)
