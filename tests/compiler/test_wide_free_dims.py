"""16-bit programs whose rows hold more elements than an access-pattern dimension can count (target.ap_dim_max,
65535: a uint16 size per free dimension): the compiler must never give an on-chip operand such a dimension (the
interpreter rejects it, tests/nki/test_rules.py), and the answers match NumPy."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, run_signed
from tilec.target import TRN2

F = TRN2.ap_dim_max + 4465  # 70000 elements per row: 137 KiB of bf16, within SBUF

PROGRAMS = {
    "relu": ("kernel wide(X: f32[P, F]) -> Y\n  default P = 2, F = {F}\n  Y: f32[P, F]\n"
             "  for p in 0..P, f in 0..F:\n    Y[p, f] = relu(X[p, f])\n",
             lambda x: np.maximum(x["X"], 0)),
    "add": ("kernel wide(X: f32[P, F], Z: f32[P, F]) -> Y\n  default P = 128, F = {F}\n  Y: f32[P, F]\n"
            "  for p in 0..P, f in 0..F:\n    Y[p, f] = X[p, f] + Z[p, f]\n",
            lambda x: x["X"] + x["Z"]),
    "rowsum": ("kernel wide(X: f32[P, F]) -> Y\n  default P = 128, F = {F}\n  Y: f32[P]\n"
               "  for p in 0..P:\n    Y[p] = 0\n    for f in 0..F:\n      Y[p] += X[p, f]\n",
               lambda x: x["X"].sum(axis=1)),
}


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_rows_wider_than_an_access_pattern_dimension(name, dtype):
    text, ref = PROGRAMS[name]
    prog, c, out, x = run_signed(text.format(F=F), dtype, seed=3)
    assert_matches(prog, "Y", out["Y"], ref(x))
