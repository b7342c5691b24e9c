"""Operation selection on programs beyond the examples: layouts, several outputs, shared temporaries, and what it
rejects (golden errors naming the statement, with a caret)."""
from __future__ import annotations

import pytest

from compiler_helpers import check_against_reference
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang

LHS_T = """\
kernel mm_t(AT: f32[K, M], B: f32[K, N]) -> C
  default M = 256, K = 384, N = 512
  C: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += AT[k, i] * B[k, j]
"""

CONV_AND_POOL_OUTPUTS = """\
kernel two(X: f32[N, C, H, W], Wt: f32[K, C, R, R]) -> Y, Z
  default N = 1, C = 128, H = 10, W = 10, K = 128, R = 3
  let Ho = H - R + 1, Wo = W - R + 1
  Y: f32[N, K, Ho, Wo]
  Z: f32[N, K, Ho / 2, Wo / 2]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..R, s in 0..R:
      Y[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, i in 0..Ho / 2, j in 0..Wo / 2:
    Z[n, k, i, j] = -inf
    for p in 0..2, q in 0..2:
      Z[n, k, i, j] max= Y[n, k, 2*i + p, 2*j + q]
"""

SHARED_TEMP = """\
kernel shared(A: f32[M, N], B: f32[M, N]) -> C, D
  default M = 256, N = 384
  T: f32[M, N]
  C: f32[M, N]
  D: f32[N, M]
  for i in 0..M, j in 0..N:
    T[i, j] = A[i, j] * B[i, j] - 0.5
  for i in 0..M, j in 0..N:
    C[i, j] = relu(T[i, j])
  for i in 0..N, j in 0..M:
    D[i, j] = T[j, i]
"""


def test_contraction_major_weights_need_no_transpose():
    c = compile_loaded(lang.load(LHS_T))
    assert "layout ck" in c.stages["select"] and "nc_transpose" not in c.source
    check_against_reference(c)


def test_conv_output_that_is_also_a_kernel_output_is_not_fused():
    c = compile_loaded(lang.load(CONV_AND_POOL_OUTPUTS))
    assert c.stages["select"].count("\n  vars") == 2  # a conv and a separate pool
    check_against_reference(c)


def test_temporary_read_by_two_ops_goes_through_hbm():
    c = compile_loaded(lang.load(SHARED_TEMP))
    assert "alloc T: hbm" in c.stages["loops"]
    check_against_reference(c)


REJECTED = {
    "shifted_copy": """\
kernel shift(A: f32[L]) -> B
  default L = 256
  B: f32[L]
  for i in 0..L - 1:
    B[i] = A[i + 1]
""",
    "partial_write": """\
kernel half(A: f32[N]) -> Z
  default N = 256
  Z: f32[N]
  for i in 0..N / 2:
    Z[i] = A[i]
""",
    "partial_read": """\
kernel mm(A: f32[M, K], B: f32[K, N]) -> C
  default M = 128, K = 256, N = 128
  C: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = 0
    for k in 0..K / 2:
      C[i, j] += A[i, k] * B[k, j]
""",
    "partial_pool": """\
kernel cbm(X: f32[N, C, H, W], Wt: f32[K, C, R, R]) -> Y
  default N = 1, C = 128, H = 6, W = 6, K = 128, R = 3
  let Ho = H - R + 1, Wo = W - R + 1
  conv: f32[N, K, Ho, Wo]
  Y: f32[N, K, Ho / 2, Wo / 2]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    conv[n, k, y, x] = 0
    for c in 0..C, r in 0..R, s in 0..R:
      conv[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, i in 0..Ho / 2, j in 0..Wo / 2 - 1:
    Y[n, k, i, j] = -inf
    for p in 0..2, q in 0..2:
      Y[n, k, i, j] max= conv[n, k, 2*i + p, 2*j + q]
""",
}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_unmappable_statements_are_rejected(name, golden):
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load(REJECTED[name]))
    assert err.value.span is not None and "cannot map" in err.value.message
    golden.check(f"compiler/errors/select_{name}.txt", err.value.render() + "\n")
