"""Column chains (build_colchain.py) with VectorE reading a statistic in its PSUM accumulator and blocks of 256
fp32 columns from eight row tiles on (session 19). Values against NumPy formulas at small shapes, f32 and bf16;
the structure on the kernel's text; softmax_axis0's model time against the HBM floor."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import assert_formula_matches
from kernel_numbers import numbered
from test_colchain import SOFTMAX, STANDARDIZE, _softmax, _standardize, fused
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

NORMALISE = """kernel k(X: f32[M, N]) -> Y
  default M = {M}, N = {N}
  s: f32[N]
  Y: f32[M, N]
  for j in 0..N:
    s[j] = 0
    for i in 0..M:
      s[j] += exp(X[i, j])
  for i in 0..M, j in 0..N:
    Y[i, j] = exp(X[i, j]) / s[j]
"""


def _normalise(x):  # softmax over columns without the max (inputs in [-0.5, 0.5))
    e = np.exp(x["X"])
    return {"Y": e / e.sum(axis=0)}


CASES = {  # name: (program, sizes, formula)
    # one sum, nothing else on VectorE/GpSimdE: GpSimdE takes a share of the divide, from the sum's SBUF copy
    "normalise_blocks": (NORMALISE, dict(M=256, N=1024), _normalise),
    "normalise_one_block": (NORMALISE, dict(M=384, N=512), _normalise),
    # eight row tiles of fp32: blocks of 256 columns (four blocks, software-pipelined)
    "standardize_narrow_blocks": (STANDARDIZE, dict(M=1024, N=1024), _standardize),
    "softmax_narrow_blocks": (SOFTMAX, dict(M=1024, N=1024), _softmax),
}


def compiled(name: str, dtype: str = "f32"):
    text, sizes, _ = CASES[name]
    return compile_loaded(lang.load(text.format(**sizes).replace("f32", dtype)), nki="0.6")


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return {name: numbered(compiled(name).source) for name in CASES}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_chains_match_numpy(name, dtype):
    c = compiled(name, dtype)
    assert fused(c.source)
    assert_formula_matches(c, CASES[name][2], f"{name} {dtype}")


def _tt(src: str) -> list[str]:
    """The tensor_tensor calls, one line each."""
    return [" ".join(m.split()) for m in re.findall(r"nisa\.tensor_tensor\((?:[^()]|\([^()]*\))*\)", src)]


def test_vector_engine_reads_the_sum_in_psum_and_gpsimd_its_copy(sources):
    """The divide by the column sums: VectorE's columns read the PSUM accumulator (1 cycle per element against 2),
    GpSimdE's columns the SBUF copy, which holds only those columns."""
    src = sources["normalise_blocks"]
    divides = [ln for ln in _tt(src) if "op=nl.divide" in ln]
    vector = [ln for ln in divides if "gpsimd" not in ln]
    gpsimd = [ln for ln in divides if "gpsimd" in ln]
    assert vector and gpsimd
    assert all("s_acc" in ln for ln in vector) and not any("s_acc" in ln for ln in gpsimd)
    assert re.search(r"tensor_copy\(dst=s_b\w*\[:, [1-9]\d*:(\d+)\], src=s_acc\w*\[:, [1-9]\d*:\1\]", src)


def test_softmax_subtracts_the_max_from_psum(sources):
    src = sources["softmax_narrow_blocks"]
    assert any("op=nl.subtract" in ln and "m_acc" in ln for ln in _tt(src))
    assert any("op=nl.divide" in ln and "s_acc" in ln for ln in _tt(src))


def test_the_model_softmax_over_columns_within_one_and_a_half():
    """gaps15's realistic softmax_axis0 (2048 x 2048 f32): the model's estimate (start-up excluded) within 1.5x of
    the time the core's HBM needs for X and Y (1.67x before VectorE read its statistics in PSUM)."""
    from tilec.perf.api import estimate
    from tilec.target import TARGETS

    M = N = 2048
    c = compile_loaded(lang.load(SOFTMAX.format(M=M, N=N)), nki="0.6")
    _, trace = c.run_traced(**lang.random_inputs(c.program, seed=1), numerics=False)
    est = estimate(trace)
    floor_us = 2 * M * N * 4 / TARGETS["trn2"].hbm_bw / 1000
    assert est.total_us - est.params.startup_ns.value / 1000 < 1.5 * floor_us


@pytest.mark.parametrize("name, width", [("standardize_narrow_blocks", 256), ("softmax_narrow_blocks", 256)])
def test_eight_fp32_row_tiles_take_blocks_of_256_columns(sources, name, width):
    assert f"Y_TILE_F = {width}" in sources[name] and "software-pipelined" in sources[name]


def test_16_bit_or_few_row_tiles_take_blocks_of_512_columns():
    for text, sizes, dtype in ((SOFTMAX, dict(M=1024, N=1024), "bf16"), (SOFTMAX, dict(M=512, N=2048), "f32")):
        c = compile_loaded(lang.load(text.format(**sizes).replace("f32", dtype)), nki="0.6")
        assert "Y_TILE_F = 512" in numbered(c.source)
