"""A row chain whose VectorE streams more than the other engines (a cross-entropy per row: its maximum, the product
T * X before the target's sum, that sum) has its tensor_tensors of SBUF tiles on GpSimdE
(rowchain_rewrites.products_on_gpsimd). The result against NumPy."""
from __future__ import annotations

import numpy as np
from compiler_helpers import assert_matches, inputs_for
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

XENT = """\
kernel xent(X: f32[M, N], T: f32[M, N]) -> L
  default M = 768, N = 384
  mx: f32[M]
  se: f32[M]
  tg: f32[M]
  L: f32[M]
  for i in 0..M:
    mx[i] = -inf
    for j in 0..N:
      mx[i] max= X[i, j]
  for i in 0..M:
    se[i] = 0
    tg[i] = 0
    for j in 0..N:
      se[i] += exp(X[i, j] - mx[i])
      tg[i] += T[i, j] * X[i, j]
  for i in 0..M:
    L[i] = log(se[i]) + mx[i] - tg[i]
"""


def _products(source: str) -> list[str]:
    return [line for line in source.splitlines() if "tensor_tensor(" in line and "op=nl.multiply" in line]


def test_the_products_move_to_gpsimd() -> None:
    prog = lang.load(XENT)
    c = compile_loaded(prog)
    products = _products(c.source)
    assert products and all("gpsimd_engine" in line for line in products)
    a = inputs_for(prog)
    x = a["X"].astype(np.float64)
    m = x.max(1)
    want = np.log(np.exp(x - m[:, None]).sum(1)) + m - (x * a["T"]).sum(1)
    assert_matches(prog, "L", c.run(**a)["L"], want)
