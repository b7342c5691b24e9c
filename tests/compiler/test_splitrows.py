"""A 16-bit layernorm with each row on two partitions (build_splitrows.py): the choice at long rows, the kernel's
structure at bf16 rows of 32768 (compiled only), and its numbers on the interpreter at small shapes (the choice
forced there: at small rows the whole chain fits and the row-chain kernels are chosen)."""
from __future__ import annotations

import pathlib
import re

import ml_dtypes
import numpy as np
import pytest

from test_chunk_cols import FORMS, compiled
from test_rowchain_engines import check_numbers
from tilec.compiler import build_splitrows
from tilec.compiler.api import compile_loaded
from tilec.compiler.wrap import unwrap
from tilec.lang import api as lang
from kernel_numbers import numbered


@pytest.fixture(scope="module")
def long_bf16() -> str:
    return unwrap(numbered(compiled("layernorm", "bf16", 512, 32768).source))


def test_rows_of_32768_are_split_over_two_partitions(long_bf16: str) -> None:
    """X and Y seen as (1024, 16384); eight row tiles of 64 rows: the first, three pairs in the loop, the last two."""
    src = long_bf16
    assert "X_halves = X.reshape((1024, 16384))" in src
    assert re.search(r"Y_halves\w* = Y\.reshape", src)
    assert re.search(r"for pt in (nl\.sequential_)?range\(3\)", src)
    # the halves' statistics combined by one fp32 matmul by the pair matrix per row tile: 2 in the loop + 2 after
    assert len(re.findall(r"nc_matmul\(dst=pair_tot, stationary=pair_sum", src)) == 4
    # r's power on GpSimdE (nki-spec 1.10.4): stage C has no ScalarE instruction
    assert re.search(r"tensor_tensor\(dst=r_rounded\w*, data1=var_eps\w*, data2=neg_half, op=nl\.power, "
                     r"engine=nisa\.engine\.gpsimd\)", src)


def test_stage_c_has_no_scalar_engine_instruction(long_bf16: str) -> None:
    """From the pair matmul to r on its parity's column: TensorE and VectorE only (a ScalarE instruction there
    would wait behind the next tile's passes, rows18)."""
    loop = long_bf16[long_bf16.index("pairs of row tiles"):]
    c = loop[loop.index("nisa.nc_matmul(dst=pair_tot"):loop.index("nisa.tensor_scalar(dst=r_parity")]
    assert "activation" not in c and "engine=nisa.engine.scalar" not in c
    assert set(re.findall(r"nisa\.(\w+)\(", c)) == {"nc_matmul", "tensor_scalar", "tensor_tensor", "tensor_copy"}


@pytest.mark.parametrize("dtype,cols", [("bf16", 16384), ("f32", 32768)])
def test_other_rows_keep_their_kernels(dtype: str, cols: int) -> None:
    """Rows of 16384 fit two row tiles and b (chunk_pipe's kernel stays); f32 is not split."""
    src = compiled("layernorm", dtype, 512, cols).source
    assert "_halves" not in src


LAYERNORM_BF16 = (pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "core" / "layernorm_bf16.tl").read_text()
NEAR_MISSES = {"mu also an output": ("-> Y", "-> Y, mu"), "no shift by b": (" + b[j]", ""),
               "r of 2 v + eps": ("rsqrt(v[i] + 1e-05)", "rsqrt(v[i] * 2.0 + 1e-05)")}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_near_misses_keep_the_row_chain(case: str) -> None:
    """Only the five ops exactly (the rest of the chain's spellings keep the row-chain builders), at rows of
    32768 bf16."""
    old, new = NEAR_MISSES[case]
    text = LAYERNORM_BF16.replace(old, new)
    if case == "no shift by b":
        text = text.replace(", b: bf16[N]", "")
    assert text != LAYERNORM_BF16
    assert "_halves" not in compile_loaded(lang.load(text, {"M": 512, "N": 32768})).source


@pytest.fixture
def forced(monkeypatch):
    monkeypatch.setattr(build_splitrows, "long_rows", lambda ln, budget: True)


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dtype,rows,cols", [("bf16", 256, 1024), ("f16", 384, 2048), ("bf16", 320, 1024)])
def test_split_layernorm_numbers(forced, dtype: str, rows: int, cols: int, nki: str) -> None:
    """Against NumPy's layernorm and the reference evaluator under the tolerance policy (the variance sums
    (X - mu)^2 in fp32, as chunk_pipe's kernel: v may be the neighbour of the program's rounded value). Four row
    tiles (the loop's pair and the two after it), six (f16, rows of 2048: two chunks), five (an odd count: two
    pairs in the loop, then the last tile alone)."""
    c = compile_loaded(lang.load(FORMS["layernorm"][0].replace("f32", dtype), {"M": rows, "N": cols}), nki=nki)
    assert "X_halves" in c.source
    check_numbers(c, "layernorm", dtype)


def test_rows_far_from_zero_and_unequal_halves(forced) -> None:
    """Rows of mean 1000 and rows whose halves' means differ by 5 (the halves' statistics combined exactly, Chan's
    formula): equal to NumPy's float64 formula with the program's roundings of mu, d, r and Y, and v the mean of
    (X - mu)^2 unrounded, in all but a few elements off by one bf16 unit."""
    bf = ml_dtypes.bfloat16
    m, n = 256, 1024
    c = compile_loaded(lang.load(FORMS["layernorm"][0].replace("f32", "bf16"), {"M": m, "N": n}))
    rng = np.random.default_rng(5)
    x = rng.normal(size=(m, n)) * rng.uniform(0.5, 8, size=(m, 1)) + rng.normal(size=(m, 1)) * 3
    x[:32] = rng.normal(size=(32, n)) * 8 + 1000
    x[32:64, :n // 2] += 5.0
    xb, g, b = x.astype(bf), rng.normal(size=n).astype(bf), rng.normal(size=n).astype(bf)
    got = np.asarray(c.run(xb, g, b)["Y"], np.float64)
    xd = xb.astype(np.float64)
    mu = xd.mean(1, keepdims=True).astype(bf).astype(np.float64)
    d = (xd - mu).astype(bf).astype(np.float64)
    v = ((xd - mu) ** 2).mean(1, keepdims=True).astype(bf).astype(np.float64)
    r = (1 / np.sqrt(v + 1e-5)).astype(bf).astype(np.float64)
    want = (d * r * g.astype(np.float64) + b.astype(np.float64)).astype(bf).astype(np.float64)
    err = np.abs(got - want)
    assert (err <= np.abs(want) * 2.0 ** -7 + 1e-6).all(), err.max()
    assert (err == 0).mean() > 0.99
