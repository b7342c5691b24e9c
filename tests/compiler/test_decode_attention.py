"""One decoding step of multi-head attention written as its statements (tests/programs/gaps15/decode_attention.tl:
scores of one query against the cached keys, the softmax's maximum, exponentials and sum, the weights times the
cached values), checked against NumPy on the interpreter. Before lead23 it was an internal error: the softmax's sum
widened along the sequence for the weights (`z_at[b, h, s] = z[b, h]`) was stored by the fused row chain as one
column."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_matches
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

PROGRAM = pathlib.Path(__file__).parents[1] / "programs" / "gaps15" / "decode_attention.tl"


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_decode_attention_matches_numpy(dt: str) -> None:
    """bf16: the weights' column (the values' mat-vec vector, 2 tiles of 128) is loaded as rows and turned on
    TensorE (conv_batched.vector_rows), the scores' columns turned into rows to be stored (column_rows)."""
    c = compile_loaded(lang.load(PROGRAM.read_text().replace("f32", dt)), target="trn2")
    if dt == "bf16":
        assert "e_col_vturned" in c.source and "sc_col_turned" in c.source
    inputs = lang.random_inputs(c.program, seed=3)
    q, k, v = (np.asarray(inputs[n], np.float64) for n in ("q", "K", "V"))  # (bf16 inputs: exact in float64)

    scores = np.einsum("bhsd,bhd->bhs", k, q) * 0.125
    weights = np.exp(scores - scores.max(axis=2, keepdims=True))
    want = np.einsum("bhs,bhsd->bhd", weights / weights.sum(axis=2, keepdims=True), v)
    assert_matches(c.program, "o", c.run(**inputs)["o"], want)
