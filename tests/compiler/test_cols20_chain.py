"""Column chains (build_colchain.py), session 20: the ones matmuls carry the onezero hint (an fp32 matmul at up to
twice the rate, ISA1/ISA6 nc_matmul), statistics without an element-wise user (a column variance) read X once, and
the folded sums still match when _balance asks for them. Values against NumPy formulas at small shapes, f32 and
bf16; the structure on the kernel's text; column_standardize's model time against the HBM floor."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_formula_matches
from kernel_numbers import numbered
from test_colchain import STANDARDIZE, _standardize, fused
from tilec.compiler import build_colchain
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

VARIANCE = """kernel k(X: f32[M, N]) -> V
  default M = {M}, N = {N}
  mu: f32[N]
  V: f32[N]
  for j in 0..N:
    mu[j] = 0
    for i in 0..M:
      mu[j] += X[i, j] / M
  for j in 0..N:
    V[j] = 0
    for i in 0..M:
      V[j] += (X[i, j] - mu[j]) * (X[i, j] - mu[j]) / M
"""
MEAN_MAX = """kernel k(X: f32[M, N]) -> mu, hi
  default M = {M}, N = {N}
  mu: f32[N]
  hi: f32[N]
  for j in 0..N:
    mu[j] = 0
    for i in 0..M:
      mu[j] += X[i, j] / M
  for j in 0..N:
    hi[j] = -inf
    for i in 0..M:
      hi[j] max= X[i, j]
"""


def _variance(x):
    return {"V": x["X"].astype(np.float64).var(axis=0)}


def _mean_max(x):
    X = x["X"].astype(np.float64)
    return {"mu": X.mean(axis=0), "hi": X.max(axis=0)}


CASES = {  # name: (program, sizes, formula)
    "variance_one_block": (VARIANCE, dict(M=256, N=384), _variance),
    "variance_pipelined": (VARIANCE, dict(M=1024, N=1024), _variance),  # 8 row tiles: 4 blocks of 256 columns
    "mean_max": (MEAN_MAX, dict(M=384, N=1024), _mean_max),
}


def compiled(name: str, dtype: str = "f32", nki: str = "0.6"):
    text, sizes, _ = CASES[name]
    return compile_loaded(lang.load(text.format(**sizes).replace("f32", dtype)), nki=nki)


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return {name: numbered(compiled(name).source) for name in CASES}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_statistics_alone_match_numpy(name, dtype):
    c = compiled(name, dtype)
    assert fused(c.source)
    assert_formula_matches(c, CASES[name][2], f"{name} {dtype}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_statistics_alone_read_x_once(sources, name):
    """Every load of X is a whole block of every row; only the kernel's outputs go to HBM (mu of the variance
    stays on chip)."""
    src = sources[name]
    loads = [ln for ln in src.splitlines() if "dma_copy" in ln and "src=X" in ln]
    assert loads and all("dst=X_res" in ln for ln in loads)
    assert "buffer=nl.hbm" not in src
    stores = {ln.split("dst=")[1].split("[")[0].split(",")[0] for ln in src.splitlines()
              if "dma_copy" in ln and "src=X" not in ln}
    assert stores == ({"V"} if name.startswith("variance") else {"mu", "hi"})


def test_four_blocks_of_statistics_are_software_pipelined(sources):
    src = sources["variance_pipelined"]
    assert "software-pipelined" in src
    assert src.count("src=X_v") >= 3  # the first block's load, the loop's two, the last block's


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
def test_the_ones_matmuls_carry_the_onezero_hint(nki):
    src = " ".join(compiled("variance_pipelined", nki=nki).source.split())
    calls = src.split("nisa.nc_matmul(")[1:]
    assert calls and all("stationary=ones" in c.split(")")[0] or c.startswith("ones") for c in calls)
    assert all("is_stationary_onezero=True" in c.split(")")[0] for c in calls)


def test_the_older_dialect_matches_numpy():
    assert_formula_matches(compiled("variance_pipelined", nki="0.1"), _variance, "variance 0.1")


def test_a_single_statistic_is_left_to_build_colreduce():
    one = VARIANCE.split("  for j in 0..N:\n    V[j]")[0].replace("-> V", "-> mu").replace("  V: f32[N]\n", "")
    c = compile_loaded(lang.load(one.format(M=256, N=512)), nki="0.6")
    assert not fused(c.source)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_folded_sums_match_numpy(monkeypatch, dtype):
    """_balance folds no row tile on trn2 since the onezero hint; when it asks for some (a slower TensorE), the
    first q row tiles of each sum are added on VectorE/GpSimdE and their total is one more matmul."""
    monkeypatch.setattr(build_colchain, "_balance", lambda b: 4)
    c = compile_loaded(lang.load(STANDARDIZE.format(M=1024, N=256).replace("f32", dtype)), nki="0.6")
    assert "row tiles added element-wise" in c.source
    assert_formula_matches(c, _standardize, f"folded {dtype}")


def test_the_model_column_standardize_within_one_and_a_third():
    """audit15's column_standardize (4096 x 2048 f32): the model's estimate (start-up excluded) within 1.3x of the
    time the core's HBM needs for X and Y (1.73x before the onezero hint)."""
    from tilec.perf.api import estimate
    from tilec.target import TARGETS

    M, N = 4096, 2048
    c = compile_loaded(lang.load(STANDARDIZE.format(M=M, N=N)), nki="0.6")
    _, trace = c.run_traced(**lang.random_inputs(c.program, seed=1), numerics=False)
    est = estimate(trace)
    floor_us = 2 * M * N * 4 / TARGETS["trn2"].hbm_bw / 1000
    assert est.total_us - est.params.startup_ns.value / 1000 < 1.3 * floor_us


@pytest.mark.parametrize("program", ["standardize", "softmax"])
def test_all_bf16_chains_read_x_once(program):
    """A program written in bf16 throughout (its statistics bf16 too): the column sums reading rows stay whole
    (reduce_split.same_width), so the chain takes them; before, the variance's and the softmax sum's terms went
    through HBM in f32. Values: test_colchain's bf16 cases."""
    from test_colchain import SOFTMAX
    text = (STANDARDIZE if program == "standardize" else SOFTMAX).format(M=512, N=1024).replace("f32", "bf16")
    src = compile_loaded(lang.load(text), nki="0.6").source
    assert fused(src) and "buffer=nl.hbm" not in src


def test_a_bf16_source_with_f32_rows_keeps_its_terms_in_hbm():
    """The column-reduction rule computes a sum's terms in the source's dtype: a bf16 X with an f32 row (or an f32
    result) keeps the f32 terms in HBM (test_cols17_rows' bf16 sources), an all-bf16 one is read whole."""
    text = """kernel l1(X: bf16[M, N], c: {c}[N]) -> s
  default M = 256, N = 512
  s: {c}[N]
  for j in 0..N:
    s[j] = 0
  for i in 0..M, j in 0..N:
    s[j] += abs({x} - c[j])
"""
    split = compile_loaded(lang.load(text.format(c="f32", x="f32(X[i, j])")), nki="0.6")
    whole = compile_loaded(lang.load(text.format(c="bf16", x="X[i, j]")), nki="0.6")
    assert "buffer=nl.hbm" in split.source and "buffer=nl.hbm" not in whole.source
    assert_formula_matches(whole, lambda a: {"s": np.abs(a["X"].astype(np.float64) - a["c"]).sum(axis=0)}, "l1 bf16")


@pytest.mark.parametrize("program", ["standardize", "softmax"])
def test_a_16_bit_block_has_an_fp32_working_copy(program):
    """The part every later reader of X reads it through (X - mu, exp(X - m)) is computed once into an fp32 copy of
    the bf16 block (a bf16 X_res would round it), read from then on; Y is written over X_res and stored from it."""
    from test_colchain import SOFTMAX
    text = (STANDARDIZE if program == "standardize" else SOFTMAX).format(M=1024, N=1024).replace("f32", "bf16")
    src = " ".join(compile_loaded(lang.load(text), nki="0.6").source.split())
    assert "X_f32 = nl.ndarray((128, SIZE_M // 128, " in src and "dtype=nl.float32" in src
    assert "in place (every later reader of X reads it)" in src
    assert all("src=X_res" in c for c in src.split("nisa.dma_copy(dst=Y_v")[1:])


def test_a_16_bit_mean_over_2k_rows_is_read_from_psum():
    """The mean of a bf16 X over M = 2^k rows: 1/M rides in the bf16 ones (exact), the accumulator holds the mean,
    and VectorE's share of the centring reads it in PSUM (1 cycle per element against 2); an fp32 X keeps plain
    ones (their onezero rate) and scales on the eviction."""
    bf16 = " ".join(compile_loaded(lang.load(STANDARDIZE.format(M=1024, N=1024).replace("f32", "bf16")),
                                   nki="0.6").source.split())
    assert "operand0=0.0009765625" in bf16 and "stationary=scaled_bf16" in bf16
    assert "data2=mu_acc" in bf16 or "data1=mu_acc" in bf16
    f32 = " ".join(compile_loaded(lang.load(STANDARDIZE.format(M=1024, N=1024)), nki="0.6").source.split())
    assert "scaled_" not in f32 and "scale=0.0009765625" in f32


def test_statistics_alone_stay_apart_without_the_onezero_rate(monkeypatch):
    """_sums_keep_up: the chain of statistics alone puts every sum on TensorE; at the full fp32 factor a block's sum
    takes longer than the block's load, and the ops stay apart (each reading X, as before the hint)."""
    import dataclasses

    from tilec.perf import params
    slow = dataclasses.replace(params.TRN2, onezero_fp32_speedup=params.Param(1, "no onezero rate"))
    text = VARIANCE.format(M=1024, N=1024)
    assert fused(compile_loaded(lang.load(text), nki="0.6").source)
    monkeypatch.setattr(params, "target_params", lambda name: slow)
    assert not fused(compile_loaded(lang.load(text), nki="0.6").source)
