"""Column sums of an expression reading rows at the kept indices (`s[j] += abs(X[i, j] - c[j])`, a variance about
a mean row, softmax's sum over axis 0): the column rule stages each row per free tile and broadcasts it to the
partitions, so the terms are computed on chip (no HBM temporary). Each program runs on tilec's NKI interpreter
against a float64 NumPy formula written here, at sizes of one, several and grouped row tiles and ragged edges."""
from __future__ import annotations

from typing import Callable

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from tilec.tolerance import max_error, program_budget, scale_of, tolerance

NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
Arrays = dict[str, np.ndarray]

L1 = """
kernel l1(X: {t}[M, N], c: f32[N]) -> s
  s: f32[N]
  for j in 0..N:
    s[j] = 0
  for i in 0..M, j in 0..N:
    s[j] += abs(X[i, j] - c[j])
"""
# a constant start, a factor, a square of the difference (ScalarE squares), the loops written j then i
VARIANCE = """
kernel var0(X: {t}[M, N], mu: f32[N]) -> v
  v: f32[N]
  for j in 0..N:
    v[j] = 0.25
    for i in 0..M:
      v[j] += (X[i, j] - mu[j]) * (X[i, j] - mu[j]) / M
"""
SOFTMAX_SUM = """
kernel esum(X: {t}[M, N], m: f32[N]) -> s
  s: f32[N]
  for j in 0..N:
    s[j] = 0
    for i in 0..M:
      s[j] += exp(X[i, j] - m[j])
"""
# two kept indices and two rows
ROWS_2D = """
kernel r2(X: {t}[M, J, K], c: f32[J, K], d: f32[J, K]) -> s
  s: f32[J, K]
  for j in 0..J, k in 0..K:
    s[j, k] = 0
  for i in 0..M, j in 0..J, k in 0..K:
    s[j, k] += (X[i, j, k] - c[j, k]) * d[j, k]
"""

Case = tuple[str, Callable[[Arrays], Arrays]]
CASES: dict[str, Case] = {
    "l1": (L1, lambda a: {"s": np.abs(a["X"] - a["c"]).sum(axis=0)}),
    "variance": (VARIANCE, lambda a: {"v": 0.25 + ((a["X"] - a["mu"]) ** 2).mean(axis=0)}),
    "softmax_sum": (SOFTMAX_SUM, lambda a: {"s": np.exp(a["X"] - a["m"]).sum(axis=0)}),
    "rows_2d": (ROWS_2D, lambda a: {"s": ((a["X"] - a["c"]) * a["d"]).sum(axis=0)}),
}
SIZES = [dict(M=512, N=1024), dict(M=384, N=640), dict(M=300, N=700), dict(M=128, N=256)]


def _run(source: str, sizes: dict[str, int], formula: Callable[[Arrays], Arrays], target: str) -> str:
    program = lang.load(source, sizes)
    compiled = compile_loaded(program, None, None, target)
    rng = np.random.default_rng(17)
    given = {t.name: (rng.random(t.shape) - 0.5).astype(np.float32).astype(NP[t.dtype]) for t in program.inputs}
    want = formula({k: v.astype(np.float64) for k, v in given.items()})
    got = compiled.run(**given)
    for out, expected in want.items():
        acc_len, inter = program_budget(program).get(out, (1, None))
        tol = tolerance(program.tensors[out].dtype, acc_len, scale_of(expected), inter)
        err = max_error(np.asarray(got[out], np.float64), expected)
        assert err <= tol, f"{out}: max |kernel - NumPy| {err:.3g} > tolerance {tol:.3g}"
    return compiled.source


def _hbm_temporaries(source: str) -> list[str]:
    return [line for line in source.splitlines() if "_terms" in line and "hbm" in line]


@pytest.mark.parametrize("target", ["trn2", "trn1"])
@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "x".join(map(str, s.values())))
@pytest.mark.parametrize("name", sorted(CASES))
def test_rows_read_on_chip(name: str, sizes: dict[str, int], target: str) -> None:
    source, formula = CASES[name]
    if name == "rows_2d":
        sizes = dict(M=sizes["M"], J=2, K=sizes["N"] // 2)
    kernel = _run(source.format(t="f32"), sizes, formula, target)
    assert not _hbm_temporaries(kernel), "the terms went through HBM"


@pytest.mark.parametrize("name", sorted(CASES))
def test_bf16_source_still_matches(name: str) -> None:
    """A 16-bit source keeps the f32 terms in HBM (reduce_split): the same values as NumPy."""
    source, formula = CASES[name]
    sizes = dict(M=256, J=2, K=256) if name == "rows_2d" else dict(M=256, N=512)
    text = source.format(t="bf16").replace("X[i, j]", "f32(X[i, j])").replace("X[i, j, k]", "f32(X[i, j, k])")
    _run(text, sizes, formula, "trn2")


WIDENED = """
kernel ext(X: bf16[M, N]) -> hi, lo, cmax
  hi: f32[M]
  lo: f32[M]
  cmax: f32[N]
  for i in 0..M:
    hi[i] = -inf
    for j in 0..N:
      hi[i] max= f32(X[i, j])
  for i in 0..M:
    lo[i] = 0.25
    for j in 0..N:
      lo[i] min= f32(X[i, j])
  for j in 0..N:
    cmax[j] = -inf
  for i in 0..M, j in 0..N:
    cmax[j] max= f32(X[i, j])
"""


@pytest.mark.parametrize("sizes", [dict(M=300, N=700), dict(M=256, N=1024)], ids=["300x700", "256x1024"])
def test_max_min_of_a_widened_16_bit_read(sizes: dict[str, int]) -> None:
    """`max= f32(X)` of bf16 X reduces the loaded tiles (no conversion copy): exact, as NumPy's max of X."""
    kernel = _run(WIDENED, sizes, lambda a: {"hi": a["X"].max(axis=1), "lo": np.minimum(a["X"].min(axis=1), 0.25),
                                             "cmax": a["X"].max(axis=0)}, "trn2")
    assert "tensor_copy(dst=hi_terms" not in kernel


RANGE = """
kernel rng(X: bf16[M, N]) -> r
  hi: {o}[M]
  lo: {o}[M]
  r: f32[M]
  for i in 0..M:
    hi[i] = -inf
    for j in 0..N:
      hi[i] max= {x}
  for i in 0..M:
    lo[i] = inf
    for j in 0..N:
      lo[i] min= {x}
  for i in 0..M:
    r[i] = {d}
"""


@pytest.mark.parametrize("o", ["f32", "bf16"])
@pytest.mark.parametrize("sizes", [dict(M=300, N=1024), dict(M=256, N=2050)], ids=["300x1024", "256x2050"])
def test_a_16_bit_row_range(o: str, sizes: dict[str, int]) -> None:
    """The row chain's 16-bit max and min into exact columns, the min's tile folded in half on GpSimdE first."""
    x, d = ("f32(X[i, j])", "hi[i] - lo[i]") if o == "f32" else ("X[i, j]", "f32(hi[i]) - f32(lo[i])")
    kernel = _run(RANGE.format(o=o, x=x, d=d), sizes, lambda a: {"r": a["X"].max(axis=1) - a["X"].min(axis=1)},
                  "trn2")
    lines = kernel.splitlines()
    at = next(n for n, line in enumerate(lines) if "lo_half" in line and "tensor_tensor" in line)
    assert "gpsimd" in lines[at] + lines[at + 1]  # the fold's instruction (either NKI dialect wraps it)


DOT = """
kernel dot(a: {t}[N], b: {t}[N]) -> s
  s: f32[1]
  s[0] = {init}
  for i in 0..N:
    s[0] {op} {term}
"""
DOTS = {  # name: (init, op, term, NumPy formula)
    "dot": ("0", "+=", "f32(a[i]) * f32(b[i])", lambda a: np.array([np.dot(a["a"], a["b"])])),
    "scaled_from_a_start": ("1.5", "+=", "f32(a[i]) * f32(b[i]) / 4",
                            lambda a: np.array([1.5 + np.dot(a["a"], a["b"]) / 4])),
    "max_difference": ("-inf", "max=", "f32(a[i]) - f32(b[i])", lambda a: np.array([(a["a"] - a["b"]).max()])),
}


@pytest.mark.parametrize("t", ["f32", "bf16"])
@pytest.mark.parametrize("n", [65536, 3 * 128 * 128])
@pytest.mark.parametrize("name", sorted(DOTS))
def test_a_long_vector_reduction_reads_the_vectors_once(name: str, n: int, t: str) -> None:
    """`s[0] += a[i] * b[i]` of long vectors: the two vectors over the partitions (build_longrows), no row of terms
    through HBM (reduce_split wrote `s_row[z, i] = a[i] * b[i]` to HBM first)."""
    init, op, term, formula = DOTS[name]
    text = DOT.format(t=t, init=init, op=op, term=term if t == "bf16" else term.replace("f32(a[i])", "a[i]")
                      .replace("f32(b[i])", "b[i]"))
    kernel = _run(text, dict(N=n), lambda a: {"s": formula(a)}, "trn2")
    assert "s_row" not in kernel


GROUPNORM = """
kernel gn(X: f32[N, G, L], g: f32[G]) -> Y
  mu: f32[N, G]
  v: f32[N, G]
  r: f32[N, G]
  Y: f32[N, G, L]
  for n in 0..N, k in 0..G:
    mu[n, k] = 0
    for l in 0..L:
      mu[n, k] += X[n, k, l] / L
  for n in 0..N, k in 0..G:
    v[n, k] = 0
    for l in 0..L:
      v[n, k] += (X[n, k, l] - mu[n, k]) * (X[n, k, l] - mu[n, k]) / L
  for n in 0..N, k in 0..G:
    r[n, k] = rsqrt(v[n, k] + 1e-05)
  for n in 0..N, k in 0..G, l in 0..L:
    Y[n, k, l] = (X[n, k, l] - mu[n, k]) * r[n, k] * g[k]
"""


def _groupnorm(a: Arrays) -> Arrays:
    x = a["X"]
    mu = x.mean(axis=2, keepdims=True)
    return {"Y": (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=2, keepdims=True) + 1e-5) * a["g"][None, :, None]}


@pytest.mark.parametrize("sizes", [dict(N=2, G=5, L=1000), dict(N=4, G=32, L=512)], ids=["2x5x1000", "4x32x512"])
def test_group_norm_is_one_row_chain(sizes: dict[str, int]) -> None:
    """The per-group scale g[k] widened to [n, k] first (lang_split), before the statistics: the statistics and Y
    stay one row chain, so mu and r never go through HBM and X is read once for them."""
    kernel = _run(GROUPNORM, sizes, _groupnorm, "trn2")
    hbm = [line.split("=")[0].strip() for line in kernel.splitlines() if "nl.ndarray(" in line and "hbm" in line]
    assert not {"mu", "r", "v"} & set(hbm), hbm


START_ROW = """
kernel sr(X: f32[M, N], c: f32[N]) -> s
  s: f32[N]
  for j in 0..N:
    s[j] = c[j]
  for i in 0..M, j in 0..N:
    s[j] += abs(X[i, j] - c[j])
"""
UNIT_DOT = """
kernel dz(a: f32[N], b: f32[N]) -> s
  s: f32[1]
  for z in 0..1:
    s[z] = 0
    for i in 0..N:
      s[z] += a[i] * b[i]
"""


def test_a_row_that_is_also_the_start_keeps_its_terms_split() -> None:
    """`s[j] = c[j]` then `s[j] += abs(X[i, j] - c[j])`: the row is the initial value too; the terms go through a
    temporary as before (reduce_split), and the result matches."""
    _run(START_ROW, dict(M=256, N=512), lambda a: {"s": a["c"] + np.abs(a["X"] - a["c"]).sum(axis=0)}, "trn2")


def test_a_short_unit_loop_dot_product_compiles_as_the_element_0_form() -> None:
    """`s[z] += a[i] * b[i]` over z in 0..1 written by hand, too short for build_longrows: a located refusal until
    user24's reduce_split._unit_loop made it the `s[0]` dot product; short and long, it compiles and matches."""
    for n in (4096, 65536):
        _run(UNIT_DOT, dict(N=n), lambda a: {"s": np.array([np.dot(a["a"], a["b"])])}, "trn2")
