"""Sums over middle dimensions with long kept rows after them (global_axes.py, build_global_axes.py): the NHWC global
average pool and its relatives, compiled, run on the NKI interpreter and compared with NumPy (float64 sums of the
same inputs; independent of tilec), f32 and bf16, with several images, several column chunks and pieces."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import assert_matches
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}


def average(dtype: str, sizes: dict[str, int], tail: str = "/ 25") -> str:
    """`S[n, c] += X[n, i, j, c]` then `Y[n, c] = S[n, c] <tail>` (tail "" : the sum itself is the output)."""
    head = [f"kernel gap(X: {dtype}[N, H, W, C]) -> {'Y' if tail else 'S'}",
            "  default " + ", ".join(f"{k} = {v}" for k, v in sizes.items()), f"  S: {dtype}[N, C]"]
    body = ["  for n in 0..N, c in 0..C:", "    S[n, c] = 0", "    for i in 0..H, j in 0..W:",
            "      S[n, c] += X[n, i, j, c]"]
    if not tail:
        return "\n".join(head + body) + "\n"
    return "\n".join(head + [f"  Y: {dtype}[N, C]"] + body + ["  for n in 0..N, c in 0..C:",
                                                              f"    Y[n, c] = S[n, c] {tail}"]) + "\n"


def run(source: str, dtype: str, out: str, factor: float, seed: int = 5, nki: str = "0.6") -> str:
    prog = lang.load(source)
    compiled = compile_loaded(prog, None, nki)
    x = np.random.default_rng(seed).standard_normal(prog.tensors["X"].shape).astype(NP[dtype])
    got = compiled.run(X=x)[out]
    want = x.astype(np.float64).sum(axis=(1, 2)) * factor
    assert np.shape(got) == want.shape
    assert_matches(prog, out, got, want)
    return compiled.source


@pytest.mark.parametrize("dtype, sizes", [
    ("f32", dict(N=3, H=5, W=5, C=256)),  # 2 pieces of 128, three images
    ("f32", dict(N=1, H=5, W=5, C=1024)),  # 4 pieces of 256 in 2 chunks of 128 columns
    ("bf16", dict(N=2, H=5, W=5, C=512)),  # 2 pieces of 256
])
def test_average_matches_numpy(dtype, sizes):
    source = run(average(dtype, sizes), dtype, "Y", 1 / 25)
    assert "pieces on the partitions" in source  # build_global_axes's kernel, not the column-reduce rule's
    assert "nl.divide" not in source and "S = nl.ndarray" not in source  # the factor fused: no S in HBM, no divide


def test_product_factor_and_plain_sum():
    """`* 0.5` (a factor written as a product) and the sum itself as the output (no factor)."""
    sizes = dict(N=2, H=5, W=5, C=256)
    run(average("f32", sizes, "* 0.5"), "f32", "Y", 0.5)
    assert "pieces on the partitions" in run(average("f32", sizes, ""), "f32", "S", 1.0)


def test_nki_01():
    assert "pieces on the partitions" in run(average("bf16", dict(N=2, H=3, W=3, C=512)), "bf16", "Y", 1 / 25,
                                             nki="0.1")


def test_short_rows_keep_the_column_rule():
    """Kept rows too short for runs of 512 bytes a piece: the column-reduce rule, still the right numbers."""
    source = run(average("f32", dict(N=2, H=5, W=5, C=64)), "f32", "Y", 1 / 25)
    assert "pieces on the partitions" not in source


def test_streamed_when_not_resident(monkeypatch):
    """X and the sums larger than the resident budget: a tile a chunk, a row of sums an image (the budget lowered so
    small shapes take that path)."""
    from tilec.compiler import build_global_axes
    monkeypatch.setattr(build_global_axes, "RESIDENT_BYTES", 1024)
    source = run(average("f32", dict(N=3, H=5, W=5, C=1024)), "f32", "Y", 1 / 25)
    assert "X_tile" in source and "X_all" not in source


def test_fused_factor_on_the_column_rule():
    """A sum of squares over the middle dimensions (an expression: the column-reduce rule's, not the pieces) with
    the divide after it fused as the op's factor (global_axes.fuse_reduce_divide): no second nest, NumPy's numbers."""
    text = average("f32", dict(N=2, H=5, W=5, C=256)).replace("+= X[n, i, j, c]", "+= X[n, i, j, c] * X[n, i, j, c]")
    prog = lang.load(text)
    compiled = compile_loaded(prog, None, "0.6")
    x = np.random.default_rng(7).standard_normal(prog.tensors["X"].shape).astype(np.float32)
    want = (x.astype(np.float64) ** 2).sum(axis=(1, 2)) / 25
    assert_matches(prog, "Y", compiled.run(X=x)["Y"], want)
    assert "pieces on the partitions" not in compiled.source and "S = nl.ndarray" not in compiled.source
