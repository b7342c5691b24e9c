"""One decoding step of multi-head attention written as its statements (tests/programs/gaps15/decode_attention.tl:
scores of one query against the cached keys, the softmax's maximum, exponentials and sum, the weights times the
cached values), checked against NumPy on the interpreter. Before lead23 it was an internal error: the softmax's sum
widened along the sequence for the weights (`z_at[b, h, s] = z[b, h]`) was stored by the fused row chain as one
column."""
from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

from compiler_helpers import assert_matches
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

PROGRAM = pathlib.Path(__file__).parents[1] / "programs" / "gaps15" / "decode_attention.tl"


@pytest.mark.parametrize("dt,sizes", [("f32", {}), ("bf16", {}), ("f32", {"B": 1, "H": 3, "S": 384, "D": 128}),
                                       ("bf16", {"B": 3, "H": 1, "S": 384, "D": 32})])
def test_decode_attention_matches_numpy(dt: str, sizes: dict) -> None:
    """The values' mat-vec sums its sequence partition-major (s = 128-tile count * p + t: V and the weights each
    loaded by one DMA a head, conv_batched.partition_major), the scores' columns are turned into rows to be stored
    (column_rows); K is transposed by one DMA a head (conv_batched.kc_whole) instead of on TensorE (its copies out of
    PSUM were the bf16 kernel's pace: conv_weights.matvec_evictions)."""
    c = compile_loaded(lang.load(PROGRAM.read_text().replace("f32", dt), sizes), target="trn2")
    assert "V_pmajor" in c.source and "e_col_pmajor" in c.source and "sc_col_turned" in c.source
    # the result columns are views of the scores and the output, not copied into them (unit_copies.py)
    assert not re.search(r"\b(sc_col|o_col)\[", c.source)  # (read by no copy, written through their views)
    assert "dma_transpose(" in c.source and "K_tp" not in c.source
    inputs = lang.random_inputs(c.program, seed=3)
    q, k, v = (np.asarray(inputs[n], np.float64) for n in ("q", "K", "V"))  # (bf16 inputs: exact in float64)

    scores = np.einsum("bhsd,bhd->bhs", k, q) * 0.125
    weights = np.exp(scores - scores.max(axis=2, keepdims=True))
    want = np.einsum("bhs,bhsd->bhd", weights / weights.sum(axis=2, keepdims=True), v)
    assert_matches(c.program, "o", c.run(**inputs)["o"], want)
