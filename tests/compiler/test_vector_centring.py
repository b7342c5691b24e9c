"""A standardisation's centring and scaling, `(X - mu) * r` with the sum before the product, as one VectorE
tensor_scalar of two operators where that makes the chain's busiest engine less busy (build_rowchain.pipelined
builds such a chain both ways): layernorm over rows of 1024, whose ScalarE has the statistics' passes already."""
from __future__ import annotations

import pathlib

import numpy as np

from compiler_helpers import assert_matches
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

LAYERNORM = pathlib.Path(__file__).parents[2] / "examples" / "layernorm.tl"
ONE_STEP = "nisa.tensor_scalar(X_tile, nl.add, mu_neg, op1=nl.multiply, operand1=r_tile"  # (the NKI 0.1 form: conftest)


def _layernorm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(axis=1, keepdims=True)
    v = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(v + 1e-5) * g + b


def test_layernorm_rows_of_1024_centre_and_scale_on_vectore() -> None:
    prog = lang.load(LAYERNORM, {"M": 512, "N": 1024})
    c = compile_loaded(prog)
    assert ONE_STEP in c.source
    rng = np.random.default_rng(3)
    x = (rng.random((512, 1024), dtype=np.float32) * 4 + 100).astype(np.float32)  # a large mean: the sum first
    g, b = rng.random(1024, dtype=np.float32), rng.random(1024, dtype=np.float32)
    out = c.run(X=x, g=g, b=b)
    assert_matches(prog, "Y", out["Y"], _layernorm(*(np.asarray(a, np.float64) for a in (x, g, b))))


def test_rows_whose_vectore_has_the_sums_keep_scalare_passes() -> None:
    """An all-bf16 chain sums on VectorE (16-bit rows stream at N/2 there): the other build is less busy."""
    text = LAYERNORM.read_text().replace("f32", "bf16")
    assert ONE_STEP not in compile_loaded(lang.load(text, {"M": 512, "N": 1024})).source
