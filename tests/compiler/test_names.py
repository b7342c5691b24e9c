"""Derived names (`X_band`, `Wt_T`, `conv_acc`, `k_t`, `TILE_K`, `tmp1`, ...) never collide with the user's names:
programs whose tensors and loops are named like the compiler's own buffers compile, pass the IR verifier and compute
the reference result."""
from __future__ import annotations

import ast

from compiler_helpers import check_against_reference
from kernel_numbers import numbered
from tilec.compiler.api import compile_loaded
from tilec.compiler.names import NameAllocator
from tilec.lang import api as lang

CONV_CLASH = """\
kernel conv_acc(X: f32[N, C, H, W], Wt: f32[K, C, R, R], Wt_T: f32[K]) -> X_band
  default N = 2, C = 256, H = 10, W = 10, K = 256, R = 3
  let Ho = H - R + 1, Wo = W - R + 1
  conv_acc: f32[N, K, Ho, Wo]
  X_band: f32[N, K, Ho / 2, Wo / 2]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    conv_acc[n, k, y, x] = Wt_T[k]
    for c in 0..C, k_t in 0..R, c_t in 0..R:
      conv_acc[n, k, y, x] += X[n, c, y + k_t, x + c_t] * Wt[k, c, k_t, c_t]
  for n in 0..N, k in 0..K, i in 0..Ho / 2, j in 0..Wo / 2:
    X_band[n, k, i, j] = -inf
    for p in 0..2, q in 0..2:
      X_band[n, k, i, j] max= conv_acc[n, k, 2*i + p, 2*j + q]
"""


def test_conv_with_tensors_named_like_derived_buffers():
    c = compile_loaded(lang.load(CONV_CLASH))
    ast.parse(c.source)
    # the user's X_band (the output) and Wt_T (the bias) keep their names; the compiler's get fresh ones
    assert "def conv_acc(X, Wt, Wt_T):" in c.source and "return X_band" in c.source
    assert "X_band2 = nl.ndarray(" in c.source and "Wt_T2 = nl.ndarray(" in c.source
    # derived loop variables (k_t, c_t: tile indices of k and c) avoid the user's taps named k_t and c_t
    numbers = numbered(c.source)
    assert "for k_t2 in nl.affine_range(2)" in numbers and "for c_t2 in nl.affine_range(2)" in numbers
    check_against_reference(c)


MATMUL_CLASH = """\
kernel mm(A: f32[TILE_I, K], B: f32[K, N]) -> C
  default TILE_I = 256, K = 256, N = 384
  C: f32[TILE_I, N]
  for i in 0..TILE_I, j in 0..N:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += A[i, k] * B[k, j]
"""


def test_matmul_constants_follow_the_loop_names_and_avoid_the_users():
    """A constant per tiled loop, TILE_<loop>; the user's size TILE_I keeps its name (SIZE_TILE_I), the tile of i gets
    another."""
    c = compile_loaded(lang.load(MATMUL_CLASH))
    ast.parse(c.source)
    consts = [line for line in c.source.splitlines() if line.startswith("TILE") or line.startswith(("ROWS", "BAND"))]
    assert consts == ["TILE_I2 = 128", "TILE_K = 128", "TILE_J = 384"]  # j: one tile (the accumulator's columns)
    assert "for i_t in nl.affine_range(SIZE_TILE_I // TILE_I2):" in c.source
    assert "A_T[:, k_t, i_t * TILE_I2:" in c.source
    assert "SIZE_TILE_I = 256" in c.source  # the user's size TILE_I as a module constant: never a tile's name
    assert "stationary operand A" in c.source and "moving operand B" in c.source and "weights" not in c.source
    check_against_reference(c)


ELTWISE_CLASH = """\
kernel tmp1(A: f32[L], A_v: f32[L], A_tile: f32[L]) -> tmp2
  default L = 2048
  tmp2: f32[L]
  for t in 0..L:
    tmp2[t] = (A[t] + A_v[t]) * (A_tile[t] - A[t])
"""


def test_eltwise_with_tensors_named_like_temporaries():
    c = compile_loaded(lang.load(ELTWISE_CLASH))
    ast.parse(c.source)
    assert "def tmp1_(A, A_v, A_tile):" in c.source or "def tmp1(A, A_v, A_tile):" in c.source
    check_against_reference(c)


TRANSPOSE_CLASH = """\
kernel t(A: f32[M, N]) -> A_strip
  default M = 256, N = 384
  A_strip: f32[N, M]
  for i in 0..M, j in 0..N:
    A_strip[j, i] = A[i, j]
"""


def test_transpose_with_tensors_named_like_strips():
    c = compile_loaded(lang.load(TRANSPOSE_CLASH))
    assert "A_strip2 = nl.ndarray(" in c.source and "return A_strip\n" in c.source  # the load strip of A
    check_against_reference(c)


def test_allocator_is_stable_per_owner_and_avoids_reserved_words():
    names = NameAllocator({"X_band", "lambda"})
    assert names.fresh("X_band", "conv") == "X_band2"
    assert names.fresh("X_band", "conv") == "X_band2"  # same request, same name
    assert names.fresh("X_band", "pool") == "X_band3"  # another op never shares it
    assert names.fresh("lambda_") == "lambda_2"  # codegen prints the user's `lambda` as `lambda_`
    assert names.fresh("nl") == "nl2"


def test_verifier_rejects_two_buffers_with_one_name():
    """The invariant the allocator guarantees is checked after every pass (a violation is a compiler bug)."""
    import pytest

    from tilec.compiler import ir
    from tilec.compiler.verify import verify
    from tilec.errors import InternalError

    x = ir.Buf("X", "hbm", "f32", (128, 4))
    clash = ir.Buf("X", "sbuf", "f32", (128, 4))
    kernel = ir.Kernel("k", (x,), (), (ir.Alloc(clash), ir.Dma(ir.whole(clash), ir.whole(x))))
    with pytest.raises(InternalError, match="two different buffers are named X"):
        verify(kernel, "test")
