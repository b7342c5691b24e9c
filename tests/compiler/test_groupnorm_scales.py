"""Group norm's output `(X - mu[n, k]) * r[n, k] * g[k]` (two columns of the row chain scaling a centred tile) is
one VectorE tensor_scalar (add, then multiply by the product column), not ScalarE's centring and scaling passes
(rowchain_chain.scales_grouped). Checked against NumPy (f32, bf16; whole and ragged row tiles) and on the kernel's
text."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_formula_matches
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

PROGRAM = pathlib.Path(__file__).resolve().parents[1] / "programs" / "audit15" / "groupnorm.tl"


def compiled(dtype: str, N: int, G: int, L: int):
    return compile_loaded(lang.load(PROGRAM.read_text().replace("f32", dtype), {"N": N, "G": G, "L": L}), nki="0.6")


def formula(x):
    X = x["X"]
    mu = X.mean(axis=2, keepdims=True)
    v = ((X - mu) ** 2).mean(axis=2, keepdims=True)
    return {"Y": (X - mu) / np.sqrt(v + 1e-5) * x["g"][None, :, None]}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("N, G, L", [(2, 64, 256), (3, 64, 200)])
def test_groupnorm_matches_numpy(dtype, N, G, L):
    assert_formula_matches(compiled(dtype, N, G, L), formula, f"groupnorm {dtype} {N}x{G}x{L}")


def test_the_output_is_one_vector_pass():
    src = compiled("f32", 2, 64, 256).source
    lines = [ln for ln in src.splitlines() if "dst=Y_tile" in ln]
    assert len(lines) == 1 and "tensor_scalar(" in lines[0] and "op1=nl.multiply" in " ".join(
        src[src.index(lines[0].strip()):].split("\n")[:2])
