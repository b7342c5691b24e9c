"""lang15: forms a new user writes that audit13 found refused (tests/fuzz/regressions/audit13_*.tl), each compiled
now and checked against an independent NumPy formula on tilec's NKI interpreter in f32 and bf16 and in both NKI
dialects; the forms still refused give a located TilecError that says what to write instead."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.compiler.codegen import NKI_VERSIONS
from tilec.errors import TilecError
from tilec.lang import api as lang
from tilec.tolerance import max_error, program_budget, scale_of, tolerance
from kernel_numbers import numbered

NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
CASES = [(dt, nki) for dt in NP for nki in NKI_VERSIONS]


def check(src: str, dtype: str, nki: str, formula, seed: int = 15):
    """Compile `src` with its tensors in `dtype` for NKI `nki`, run it on signed inputs exact in `dtype` and compare
    each output with `formula(inputs in float64, rounding to dtype)` within the project's tolerance policy; returns
    the compiled kernel."""
    prog = lang.load(src.replace("f32[", f"{dtype}["))
    c = compile_loaded(prog, None, nki)
    rng = np.random.default_rng(seed)
    given = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(NP[dtype]) for t in prog.inputs}
    exact = {k: v.astype(np.float64) for k, v in given.items()}
    q = lambda v: np.asarray(v).astype(NP[dtype]).astype(np.float64)  # noqa: E731  a store in `dtype`
    want = formula(exact, q)
    got = c.run(**given)
    assert set(got) == set(want)
    for name, expected in want.items():
        assert np.shape(got[name]) == expected.shape, name
        acc_len, inter = program_budget(prog).get(name, (1, None))
        tol = tolerance(dtype, acc_len, scale_of(expected), inter)
        err = max_error(np.asarray(got[name], np.float64), q(expected))
        assert err <= tol, f"{name} ({dtype}, NKI {nki}): max |kernel - NumPy| {err:.3g} > tolerance {tol:.3g}"
    return c


def refusal(src: str) -> TilecError:
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load(src))
    assert err.value.span is not None and err.value.hint
    return err.value


# ---- a size read as a value (audit13_size_in_value) -----------------------------------------------------------------

MEAN = """\
kernel mean_hw(X: f32[N, C, H, W]) -> Y
  default N = 2, C = 136, H = 7, W = 5
  S: f32[N, C]
  Y: f32[N, C]
  for n in 0..N, c in 0..C:
    S[n, c] = 0
    for i in 0..H, j in 0..W:
      S[n, c] += X[n, c, i, j]
  for n in 0..N, c in 0..C:
    Y[n, c] = S[n, c] / (H * W) + 0.5 * H
"""


@pytest.mark.parametrize("dtype, nki", CASES)
def test_a_size_in_an_element_wise_value_is_its_number(dtype, nki):
    check(MEAN, dtype, nki, lambda a, q: {"Y": q(a["X"].sum(axis=(2, 3))) / 35 + 3.5})


# ---- batched matmuls with several batch indices (audit13_batched4d_matmul) -------------------------------------------

SCORES = """\
kernel scores(Q: f32[B, G, S, D], Kt: f32[B, G, T, D]) -> P
  default B = 2, G = 3, S = 130, T = 200, D = 72
  P: f32[B, G, S, T]
  for b in 0..B, h in 0..G, i in 0..S, j in 0..T:
    P[b, h, i, j] = 0
    for d in 0..D:
      P[b, h, i, j] += Q[b, h, i, d] * Kt[b, h, j, d]
"""

PV = """\
kernel pv(Pm: f32[A, B, G, S, T], V: f32[A, B, G, T, D]) -> O
  default A = 2, B = 1, G = 3, S = 140, T = 150, D = 64
  O: f32[A, B, G, S, D]
  for a in 0..A, b in 0..B, h in 0..G, i in 0..S, d in 0..D:
    O[a, b, h, i, d] = 0
    for j in 0..T:
      O[a, b, h, i, d] += Pm[a, b, h, i, j] * V[a, b, h, j, d]
"""


@pytest.mark.parametrize("dtype, nki", CASES)
def test_attention_scores_with_two_batch_indices_is_one_batched_matmul(dtype, nki):
    c = check(SCORES, dtype, nki, lambda a, q: {"P": np.einsum("bhid,bhjd->bhij", a["Q"], a["Kt"])})
    assert "reshape((6, " in numbered(c.source)  # the batch (b, h) is one batch of B * G: the tensors seen as [6, ..]


@pytest.mark.parametrize("dtype, nki", CASES)
def test_three_batch_indices(dtype, nki):
    check(PV, dtype, nki, lambda a, q: {"O": np.einsum("abhij,abhjd->abhid", a["Pm"], a["V"])})


def test_batch_indices_over_part_of_a_dimension_are_a_located_refusal():
    err = refusal(SCORES.replace("for b in 0..B, h in 0..G", "for b in 0..B, h in 0..G - 1"))
    assert "runs over part of dimension 1 of" in err.message and "whole dimension" in err.message


@pytest.mark.parametrize("dtype, nki", CASES)
def test_batch_indices_after_the_rows_in_the_output_are_a_batched_matmul_then_a_permute(dtype, nki):
    src = SCORES.replace("P[b, h, i, j] =", "P[b, i, h, j] =").replace("P[b, h, i, j] +=", "P[b, i, h, j] +=") \
        .replace("P: f32[B, G, S, T]", "P: f32[B, S, G, T]").replace("for b in 0..B, h in 0..G, i in 0..S",
                                                                     "for b in 0..B, i in 0..S, h in 0..G")
    c = check(src, dtype, nki, lambda a, q: {"P": np.einsum("bhid,bhjd->bihj", a["Q"], a["Kt"])})
    assert "conv P_c" in c.stages["select"]  # batch-first into P_c, then permuted into P


@pytest.mark.parametrize("dtype, nki", CASES)
def test_a_vector_times_a_matrix_with_two_output_indices_matches_numpy(dtype, nki):
    """`C[i, j] += A[k, i, j] * v[k]`: no operand has one output index, a refusal until user24's
    matvec_split.split_vector_matrix (v and C with a unit first dimension: an M = 1 matmul)."""
    src = """\
kernel weighted(A: f32[K, M, N], v: f32[K]) -> C
  default K = 8, M = 16, N = 16
  C: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += A[k, i, j] * v[k]
"""
    check(src, dtype, nki, lambda a, q: {"C": np.einsum("kij,k->ij", a["A"], a["v"])})


# ---- permutes of any rank (audit13: a 6-D permute was refused) -------------------------------------------------------


def permute_program(shape: tuple[int, ...], perm: tuple[int, ...]) -> str:
    """`Y[..] = X[..]` with Y's dimension i X's dimension perm[i] (NumPy's transpose(perm))."""
    names = "abcdefgh"[:len(shape)]
    sizes = ", ".join(f"{v.upper()} = {n}" for v, n in zip(names, shape))
    x = ", ".join(v.upper() for v in names)
    y = ", ".join(names[p].upper() for p in perm)
    loops = ", ".join(f"{v} in 0..{v.upper()}" for v in names)
    return (f"kernel perm(X: f32[{x}]) -> Y\n  default {sizes}\n  Y: f32[{y}]\n  for {loops}:\n"
            f"    Y[{', '.join(names[p] for p in perm)}] = X[{', '.join(names)}]\n")


PERMUTES = [((2, 3, 4, 5, 6, 40), (5, 4, 3, 2, 1, 0)),  # a 6-D reversal
            ((3, 2, 136, 2, 5, 24), (1, 4, 0, 5, 3, 2)),  # a 6-D permute with a dimension over 128
            ((2, 3, 2, 4, 3, 2, 20), (6, 2, 4, 0, 5, 1, 3)),  # 7-D: short chains
            ((2, 2, 3, 2, 2, 3, 2, 16), (7, 6, 5, 4, 3, 2, 1, 0))]  # an 8-D reversal


@pytest.mark.parametrize("shape, perm", PERMUTES)
@pytest.mark.parametrize("dtype, nki", CASES)
def test_permutes_of_six_to_eight_dimensions(shape, perm, dtype, nki):
    c = check(permute_program(shape, perm), dtype, nki, lambda a, q: {"Y": a["X"].transpose(perm)})
    assert "transpose Y -> Y" in c.stages["select"]  # the permute path (a chain of steps), not a copy per element


def test_the_narrowed_search_finds_the_full_searchs_chain_on_a_6d_reversal():
    from tilec.compiler import select_permute as sp
    src, ext = tuple("abcdef"), dict(zip("abcdef", (16, 8, 32, 4, 64, 8)))

    def total(ch):
        return sum(sp.step_us(k, a, b, ext, 4) for (k, b), a in zip(ch, [src] + [o for _, o in ch]))
    narrowed = sp.plan(src, src[::-1], ext, 4)
    saved = sp.MAX_RANK
    try:
        sp.MAX_RANK = 6  # the full search (seconds)
        full = sp.chain(src, src[::-1], ext, 4)
    finally:
        sp.MAX_RANK = saved
    assert narrowed is not None and full is not None and total(narrowed) <= total(full) * 1.001


# ---- `i / k` outside a plain copy (audit13: an FPN's upsample-and-add was refused) -------------------------------

FPN = """\
kernel fpn(P: f32[N, C, H, W], L: f32[N, C, 3 * H, 2 * W]) -> Y
  default N = 2, C = 136, H = 5, W = 7
  Y: f32[N, C, 3 * H, 2 * W]
  for n in 0..N, c in 0..C, i in 0..3 * H, j in 0..2 * W:
    Y[n, c, i, j] = relu(P[n, c, i / 3, j / 2] * 2 + L[n, c, i, j])
"""


@pytest.mark.parametrize("dtype, nki", CASES)
def test_upsample_inside_arithmetic_is_a_copy_then_the_element_wise_statement(dtype, nki):
    c = check(FPN, dtype, nki, lambda a, q: {"Y": np.maximum(a["P"].repeat(3, axis=2).repeat(2, axis=3) * 2
                                                            + a["L"], 0)})
    assert "P_at" in c.stages["select"]  # the upsampled read copied into a temporary first (permute_split)


# ---- conv layouts: HWIO weights, NHWC tensors (audit13_hwio_weights; NHWC was refused as "not a window") ----------

NHWC = """\
kernel nhwc(X: f32[N, H, W, C], Wt: f32[3, 3, C, K], b: f32[K]) -> Y
  default N = 2, C = 72, H = 13, W = 11, K = 136
  Y: f32[N, H, W, K]
  for n in 0..N, y in 0..H, x in 0..W, k in 0..K:
    Y[n, y, x, k] = b[k]
    for r in 0..3, s in 0..3, c in 0..C:
      Y[n, y, x, k] += (X[n, 2 * y + r - 1, 2 * x + s - 1, c] ?? 0) * Wt[r, s, c, k]
"""


def nchw(x: np.ndarray) -> np.ndarray:
    return x.transpose(0, 3, 1, 2)


def conv_same(x: np.ndarray, w: np.ndarray, stride: int = 1) -> np.ndarray:
    """x [N, C, H, W] zero-padded by 1, w [K, C, 3, 3] -> [N, K, ceil(H/s), ceil(W/s)] (NumPy, float64)."""
    xp = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)])
    ho, wo = -(-x.shape[2] // stride), -(-x.shape[3] // stride)
    out = np.zeros((x.shape[0], w.shape[0], ho, wo))
    for r in range(3):
        for s in range(3):
            win = xp[:, :, r:r + stride * (ho - 1) + 1:stride, s:s + stride * (wo - 1) + 1:stride]
            out += np.einsum("nchw,kc->nkhw", win, w[:, :, r, s])
    return out


@pytest.mark.parametrize("dtype, nki", CASES)
def test_strided_nhwc_conv_with_hwio_weights_and_a_bias(dtype, nki):
    src = NHWC.replace("f32[N, H, W, K]", "f32[N, (H + 1) / 2, (W + 1) / 2, K]").replace(
        "for n in 0..N, y in 0..H, x in 0..W", "for n in 0..N, y in 0..(H + 1) / 2, x in 0..(W + 1) / 2")
    c = check(src, dtype, nki, lambda a, q: {"Y": (conv_same(nchw(a["X"]), a["Wt"].transpose(3, 2, 0, 1), 2)
                                                    + a["b"][:, None, None]).transpose(0, 2, 3, 1)})
    ops = c.stages["select"]
    assert "conv Y_c" in ops and "transpose X_c" in ops and "transpose Y -> Y" in ops and "Wt_kc" in ops


@pytest.mark.parametrize("dtype, nki", CASES)
def test_hwio_weights_alone_permute_only_the_weights(dtype, nki):
    src = """\
kernel hwio(X: f32[N, C, H, W], Wt: f32[3, 3, C, K]) -> Y
  default N = 2, C = 72, H = 13, W = 11, K = 136
  Y: f32[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += 0.5 * (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[r, s, c, k]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = relu(Y[n, k, y, x])
"""
    c = check(src, dtype, nki,
              lambda a, q: {"Y": np.maximum(0.5 * conv_same(a["X"], a["Wt"].transpose(3, 2, 0, 1)), 0)})
    ops = c.stages["select"]
    assert "transpose Wt_kc" in ops and "transpose X_c" not in ops and "conv Y -> Y" in ops
    assert "epilogue scaled by 0.5, relu" in ops  # the in-place relu still fused on the eviction


@pytest.mark.parametrize("dtype, nki", CASES)
def test_nhwc_depthwise(dtype, nki):
    src = """\
kernel dwn(X: f32[N, H, W, C], Wt: f32[3, 3, C]) -> Y
  default N = 2, C = 144, H = 9, W = 10
  Y: f32[N, H, W, C]
  for n in 0..N, y in 0..H, x in 0..W, c in 0..C:
    Y[n, y, x, c] = 0
    for r in 0..3, s in 0..3:
      Y[n, y, x, c] += (X[n, y + r - 1, x + s - 1, c] ?? 0) * Wt[r, s, c]
"""
    eye = np.eye(144)

    def formula(a, q):
        w = np.einsum("rsc,ck->kcrs", a["Wt"], eye)  # a diagonal [K, C, 3, 3]: each channel its own filter
        return {"Y": conv_same(nchw(a["X"]), w).transpose(0, 2, 3, 1)}
    check(src, dtype, nki, formula)


# ---- a floor modulo in an index (audit13_modulo_index) --------------------------------------------------------------

TILED = """\
kernel tiled(X: f32[N, 3, W], Z: f32[N, H, W]) -> Y
  default N = 2, W = 300, H = 141
  Y: f32[N, H, W]
  for n in 0..N, i in 0..H, j in 0..W:
    Y[n, i, j] = X[n, i % 3, j] * Z[n, i, j] - 1
"""


@pytest.mark.parametrize("dtype, nki", CASES)
def test_a_tiling_read_in_arithmetic(dtype, nki):
    c = check(TILED, dtype, nki, lambda a, q: {"Y": np.tile(a["X"], (1, 47, 1)) * a["Z"] - 1})
    assert "X_at" in c.stages["select"]


@pytest.mark.parametrize("dtype, nki", CASES)
def test_a_plain_tiling_copy_writes_its_parts_into_the_output(dtype, nki):
    src = TILED.replace("X[n, i % 3, j] * Z[n, i, j] - 1", "X[n, i % 3, j]")
    c = check(src, dtype, nki, lambda a, q: {"Y": np.tile(a["X"], (1, 47, 1))})
    assert "X_at" not in c.stages["select"]


def test_a_period_that_does_not_divide_the_loop_is_a_located_refusal_saying_what_compiles():
    err = refusal(TILED.replace("H = 141", "H = 140"))
    assert "floor modulo" in err.message and (err.span.line, err.span.col) == (5, 23)  # at `i % 3`
    assert "multiple of the constant m" in err.hint


# ---- two convs whose default bands overflow SBUF together (audit13_two_convs_sbuf) ----------------------------------

TWO_CONVS = """\
kernel two_convs(X: f32[N, C, H, W], W1: f32[C, C, 3, 3], W2: f32[C, C, 3, 3]) -> Y
  default N = 1, C = 128, H = 160, W = 160
  T: f32[N, C, H, W]
  Y: f32[N, C, H, W]
  for n in 0..N, k in 0..C, y in 0..H, x in 0..W:
    T[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      T[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * W1[k, c, r, s]
  for n in 0..N, k in 0..C, y in 0..H, x in 0..W:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += relu(T[n, c, y + r - 1, x + s - 1] ?? 0) * W2[k, c, r, s]
"""


def test_a_default_schedule_over_sbuf_is_retried_with_halved_conv_bands():
    c = check(TWO_CONVS, "f32", "0.6", lambda a, q: {"Y": conv_same(np.maximum(conv_same(a["X"], a["W1"]), 0),
                                                                    a["W2"])})
    assert "split T.y, 16" in c.source and "split Y.y, 16" in c.source  # 32-row bands halved (the schedule shown)
    assert "T_img" in numbered(c.source)  # T still on chip, one image at a time


def test_a_written_schedule_that_overflows_sbuf_is_not_retried():
    with pytest.raises(TilecError, match="KiB of SBUF per partition"):
        compile_loaded(lang.load(TWO_CONVS + "  schedule:\n    split T.y, 32\n    split Y.y, 32\n"))


PW_NHWC = """\
kernel pw(X: f32[N, H, W, C], Wt: f32[C, K], b: f32[K]) -> Y
  default N = 2, C = 136, H = 9, W = 10, K = 100
  Y: f32[N, H, W, K]
  for n in 0..N, y in 0..H, x in 0..W, k in 0..K:
    Y[n, y, x, k] = b[k]
    for c in 0..C:
      Y[n, y, x, k] += X[n, y, x, c] * Wt[c, k]
"""


@pytest.mark.parametrize("dtype, nki", CASES)
def test_a_1x1_nhwc_conv_is_a_matmul_over_merged_rows(dtype, nki):
    c = check(PW_NHWC, dtype, nki, lambda a, q: {"Y": a["X"] @ a["Wt"] + a["b"]})
    assert "K=180" in c.stages["select"]  # the rows (n, y, x) merged: 2 * 9 * 10, no permute
    assert "transpose" not in c.stages["select"]


def test_merged_rows_over_part_of_a_dimension_stay_refused():
    err = refusal(PW_NHWC.replace("for n in 0..N, y in 0..H, x in 0..W, k",
                                  "for n in 0..N, y in 0..H - 1, x in 0..W, k")
                  .replace("Y: f32[N, H, W, K]", "Y: f32[N, H - 1, W, K]"))
    assert "batch indices" in err.message


# ---- a contraction of a tensor with itself (found while writing these tests: an internal error on main) -----------

GRAM = """\
kernel gram(A: f32[M, K]) -> G
  default M = 200, K = 300
  G: f32[M, M]
  for i in 0..M, j in 0..M:
    G[i, j] = 0
    for k in 0..K:
      G[i, j] += A[i, k] * A[j, k]
"""


@pytest.mark.parametrize("dtype, nki", CASES)
def test_a_gram_matrix_reads_its_one_operand_without_a_copy(dtype, nki):
    """(evict24: the matmul's band of A holds its stationary tiles too; the HBM copy A_2 cost gram_style 4.17x)"""
    c = check(GRAM, dtype, nki, lambda a, q: {"G": a["A"] @ a["A"].T})
    assert "stationary A (layout kc), moving A," in c.stages["select"] and "A_2 -> A_2" not in c.stages["select"]
