"""Global pools (rules_global.global_pool): `S[n, c] += X[n, c, i, j]` then `Y[n, c] = S[n, c] / k`, or a max/min/sum
alone, compiled, run on the NKI interpreter (both dialects) and compared with NumPy (float64 means and maxima of
each channel's map; independent of tilec), f32/f16/bf16, with row counts that split into 128 partitions and ragged
ones (fewer partitions, or none near 128: the row chain then builds it)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import assert_matches
from tilec.compiler import rules_global
from tilec.compiler.api import compile_loaded
from tilec.compiler.wrap import unwrap
from tilec.lang import api as lang
from kernel_numbers import numbered

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def global_program(kind: str, dtype: str, n: int, c: int, h: int, w: int) -> str:
    """kind: avg (/ H*W), mul (* 0.25), sum (S is the output), max, min."""
    lines = [f"kernel gp(X: {dtype}[N, C, H, W]) -> Y",
             f"  default N = {n}, C = {c}, H = {h}, W = {w}"]
    if kind in ("avg", "mul"):
        epilogue = f"S[n, c] / {h * w}" if kind == "avg" else "S[n, c] * 0.25"
        return "\n".join(lines + [f"  S: {dtype}[N, C]", f"  Y: {dtype}[N, C]",
                                  "  for n in 0..N, c in 0..C:", "    S[n, c] = 0",
                                  "    for i in 0..H, j in 0..W:", "      S[n, c] += X[n, c, i, j]",
                                  "  for n in 0..N, c in 0..C:", f"    Y[n, c] = {epilogue}"]) + "\n"
    op, init = {"sum": ("+=", "0"), "max": ("max=", "-inf"), "min": ("min=", "inf")}[kind]
    return "\n".join(lines + [f"  Y: {dtype}[N, C]", "  for n in 0..N, c in 0..C:", f"    Y[n, c] = {init}",
                              "    for i in 0..H, j in 0..W:", f"      Y[n, c] {op} X[n, c, i, j]"]) + "\n"


def reference(x: np.ndarray, kind: str) -> np.ndarray:
    x = x.astype(np.float64)
    if kind == "avg":
        return x.mean(axis=(2, 3))
    if kind == "mul":
        return x.sum(axis=(2, 3)) * 0.25
    return {"sum": np.sum, "max": np.max, "min": np.min}[kind](x, axis=(2, 3))


def run(kind: str, dtype: str, n: int, c: int, h: int, w: int, nki: str = "0.6", seed: int = 5):
    prog = lang.load(global_program(kind, dtype, n, c, h, w))
    compiled = compile_loaded(prog, None, nki)
    x = np.random.default_rng(seed).random(prog.tensors["X"].shape).astype(NP[dtype])
    got = compiled.run(X=x)["Y"]
    want = reference(x, kind)
    assert np.shape(got) == want.shape
    assert_matches(prog, "Y", got, want)
    return compiled


def is_global(compiled) -> bool:
    return "global pool" in numbered(compiled.source)


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("kind", ["avg", "mul", "sum", "max", "min"])
def test_global_pool_matches_numpy(kind, dtype, nki):
    """2 x 1024 channels of 7x7 (16 rows per partition: several chunks, the last the smallest)."""
    assert is_global(run(kind, dtype, 2, 1024, 7, 7, nki))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("n, c, h, w", [(8, 2048, 7, 7), (3, 96, 5, 3), (1, 200, 4, 4), (5, 26, 3, 7),
                                        (1, 64, 2, 2), (2, 3, 6, 6)])
def test_global_pool_sizes(n, c, h, w, dtype):
    """The ResNet-50 head at batch 8 (a loop of middle chunks), and ragged row counts: 288 rows on 96 partitions,
    200 on 100, 130 on 65, 64 rows of one row each, 6 rows on 6 partitions."""
    compiled = run("avg", dtype, n, c, h, w)
    assert is_global(compiled)
    if n * c == 8 * 2048:
        assert "for gt in " in unwrap(numbered(compiled.source))


@pytest.mark.parametrize("n, c, h, w", [(1, 131, 7, 7), (1, 64, 96, 96)])
def test_declined_shapes_still_match(n, c, h, w):
    """131 rows (prime: no partition count near 128) and rows of 18 KiB (96 x 96 bf16: the row chain splits long
    rows) are left to the row chain, which still computes them."""
    for kind in ("avg", "max"):
        assert not is_global(run(kind, "bf16", n, c, h, w))


def test_a_directive_builds_the_ops_apart():
    """`tile Y.n, 2` names the mean's op: it is built alone, as the directive asks; S, named by none, stays the
    global pool's sum (into its HBM temporary)."""
    text = global_program("avg", "f32", 2, 1024, 7, 7)
    prog = lang.load(text)
    compiled = compile_loaded(prog, lang.parse_schedule("tile Y.n, 2", "<s>"))
    assert "# global pool S:" in numbered(compiled.source)
    x = np.random.default_rng(1).random(prog.tensors["X"].shape).astype(np.float32)
    assert_matches(prog, "Y", compiled.run(X=x)["Y"], reference(x, "avg"))


def test_sum_read_by_two_ops_is_a_global_pool_alone():
    """S read twice (Y and Z): the rule takes S alone, into its HBM temporary, and each reader reads it there."""
    text = global_program("avg", "f32", 1, 256, 7, 7).replace("-> Y", "-> Y, Z").replace(
        "  Y: f32[N, C]\n", "  Y: f32[N, C]\n  Z: f32[N, C]\n")
    text += "  for n in 0..N, c in 0..C:\n    Z[n, c] = S[n, c] + 1\n"
    prog = lang.load(text)
    compiled = compile_loaded(prog)
    assert "# global pool S:" in numbered(compiled.source)
    x = np.random.default_rng(2).random(prog.tensors["X"].shape).astype(np.float32)
    out = compiled.run(X=x)
    assert_matches(prog, "Y", out["Y"], reference(x, "avg"))
    assert_matches(prog, "Z", out["Z"], x.astype(np.float64).sum(axis=(2, 3)) + 1)


@pytest.mark.parametrize("G, F, itemsize, P", [(128, 49, 2, 128), (128, 49, 4, 128), (16, 49, 2, 128), (1, 49, 4, 8),
                                               (3, 25, 2, 96), (300, 9, 2, 128), (37, 100, 4, 128)])
def test_chunks_cover_every_row_once_and_end_small(G, F, itemsize, P):
    m, first, k, tail = rules_global.global_chunks(G, F, itemsize, P)
    sizes = [first] * bool(first) + [m] * k + tail
    assert sum(sizes) == G and all(s >= 1 for s in sizes)
    assert first < m and all(s <= m for s in tail)
    assert sizes[-1] == min(sizes[-3:])  # the last load is among the smallest (only its reduce follows it)


def test_sixteen_bit_sum_reduces_into_its_dtype():
    """A bf16 S: the tensor_reduce writes the bf16 tile (N/2 on VectorE; one rounding of the fp32 sum), and the
    factor runs on ScalarE (an activation's scale), not on VectorE."""
    src = unwrap(numbered(run("avg", "bf16", 2, 1024, 7, 7).source))
    assert "S_tile = nl.ndarray((128, 16), dtype=nl.bfloat16" in src
    assert "nisa.activation(" in src and "nisa.tensor_scalar(" not in src


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("kind", ["avg", "max"])
def test_long_rows_and_streamed_chunks(monkeypatch, kind, dtype, nki):
    """Maps of 14x14 and 28x28 (rows longer than 128 elements, the row chain's before), and an X too large to stay
    in SBUF (forced here with a 2 KiB budget): each chunk loads into a tile of its own, the loop's rotating."""
    monkeypatch.setattr(rules_global, "GLOBAL_RESIDENT", 2048)
    monkeypatch.setattr(rules_global, "GLOBAL_STREAM_BYTES", 2048)
    for n, c, h in ((2, 512, 14), (1, 384, 28)):
        compiled = run(kind, dtype, n, c, h, h, nki)
        assert is_global(compiled) and "X_all" not in compiled.source and "X_rows" in compiled.source


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_mean_written_in_the_sum(dtype, nki):
    """`Y[n, c] += X[n, c, i, j] / 49`, one statement: summed in fp32, then scaled into Y's tile (one rounding)."""
    text = (f"kernel gm(X: {dtype}[N, C, H, W]) -> Y\n  default N = 2, C = 1024, H = 7, W = 7\n  Y: {dtype}[N, C]\n"
            "  for n in 0..N, c in 0..C:\n    Y[n, c] = 0\n    for i in 0..H, j in 0..W:\n"
            "      Y[n, c] += X[n, c, i, j] / 49\n")
    prog = lang.load(text)
    compiled = compile_loaded(prog, None, nki)
    assert is_global(compiled) and "Y_sum" in numbered(compiled.source)
    x = np.random.default_rng(8).random(prog.tensors["X"].shape).astype(NP[dtype])
    assert_matches(prog, "Y", compiled.run(X=x)["Y"], reference(x, "avg"))
