"""A broadcast over non-consecutive output indices, a row read per outer index (`mask[b, k]` added to S[b, h, q, k],
attention's padding mask): the output viewed as O (b) x P (h, q) x F (k), the row of each b loaded and copied to
every partition (its view mask[o, 0, f]). It was refused ("the broadcast read `mask[b, k]` must use consecutive
output indices in order"). Matched against NumPy in both NKI dialects."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run

MASK = """\
kernel attn_mask(X: f32[B, H, Q, K], mask: f32[B, K]) -> S
  default B = {B}, H = {H}, Q = {Q}, K = {K}
  S: f32[B, H, Q, K]
  for b in 0..B, h in 0..H, q in 0..Q, k in 0..K:
    S[b, h, q, k] = {expr}
"""

THREE = """\
kernel per_batch(X: f32[B, M, N], m: f32[B, N], s: f32[N], c: f32[M]) -> Y
  default B = 3, M = 300, N = 700
  Y: f32[B, M, N]
  for b in 0..B, i in 0..M, j in 0..N:
    Y[b, i, j] = {expr}
"""

CASES = {  # name: (program, NumPy formula of the inputs)
    "padding_mask": (MASK.format(B=2, H=3, Q=130, K=200, expr="X[b, h, q, k] + mask[b, k]"),
                     lambda a: a["X"] + a["mask"][:, None, None, :]),
    "scaled_mask_long_rows": (MASK.format(B=2, H=2, Q=64, K=1500, expr="0.125 * X[b, h, q, k] - 4 * mask[b, k]"),
                              lambda a: 0.125 * a["X"] - 4 * a["mask"][:, None, None, :]),
    "mask_in_a_function": (MASK.format(B=3, H=5, Q=40, K=96, expr="exp(X[b, h, q, k] * mask[b, k])"),
                           lambda a: np.exp(a["X"] * a["mask"][:, None, None, :])),
    "with_a_plain_row": (THREE.format(expr="X[b, i, j] * m[b, j] + s[j]"),
                         lambda a: a["X"] * a["m"][:, None, :] + a["s"]),
    "with_a_column": (THREE.format(expr="max(X[b, i, j] - m[b, j], c[i])"),
                      lambda a: np.maximum(a["X"] - a["m"][:, None, :], a["c"][None, :, None])),
    # test_selection's former "broadcast" refusal (its golden select_broadcast.txt is gone)
    "selection_broadcast": ("""\
kernel bc(A: f32[M, N, L], b: f32[M, L]) -> C
  default M = 128, N = 64, L = 8
  C: f32[M, N, L]
  for i in 0..M, j in 0..N, l in 0..L:
    C[i, j, l] = A[i, j, l] + b[i, l]
""", lambda a: a["A"] + a["b"][:, None, :]),
    # a column that reads the outer index too: both widened first (lang_split.split_mixed_broadcasts)
    "with_a_column_per_batch": (THREE.replace("c: f32[M]", "c: f32[B, M]").format(
        expr="X[b, i, j] * m[b, j] + c[b, i]"), lambda a: a["X"] * a["m"][:, None, :] + a["c"][:, :, None]),
}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_row_read_per_outer_index_matches_numpy(case, nki):
    text, formula = CASES[case]
    prog, c, inputs, out = compile_and_run(text, nki)
    name = prog.kernel.outputs[0]
    want = formula({k: v.astype(np.float64) for k, v in inputs.items()})
    assert_matches(prog, name, out[name], want)


def test_the_mask_row_is_loaded_per_batch_and_never_widened_in_hbm():
    prog, c, inputs, out = compile_and_run(CASES["padding_mask"][0], "0.6")
    assert "src=mask[o]" in c.source  # one row of the mask per b, copied to the partitions on chip
    assert c.source.count("buffer=nl.shared_hbm") == 1  # S only: no HBM temporary
