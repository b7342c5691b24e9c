"""A layernorm's mean and variance in one VectorE pass (mean_var.py: bn_stats / bn_aggr), the output's `+ b` on
GpSimdE, and the chain software-pipelined by one row tile with its two chunk loops fused (build_rowchain
`stats_pipelined`, pair_tiles `fuse`).

Each kernel is checked on the interpreter against layernorm's formula in NumPy (float64), in both NKI forms, with
row tiles that are not 128 rows; the structure (bn_stats pieces, one bn_aggr per row tile, no ScalarE pass for the
variance, the fused loop) on the kernel's text."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import EXAMPLES
from tilec.compiler import ir
from tilec.compiler.api import compile_loaded
from tilec.compiler.mean_var import one_pass_stats
from tilec.compiler.verify import verify
from tilec.errors import InternalError
from tilec.lang import api as lang
from tilec.compiler.wrap import unwrap
from kernel_numbers import numbered

LAYERNORM = (EXAMPLES / "layernorm.tl").read_text()
TOLERANCE = {"f32": 2e-6}


def layernorm(X, g, b):
    d = X - X.mean(axis=1, keepdims=True)
    return d / np.sqrt((d * d).mean(axis=1, keepdims=True) + 1e-5) * g + b


def compiled(rows: int, cols: int, nki: str = "0.6"):
    return compile_loaded(lang.load(LAYERNORM, {"M": rows, "N": cols}), nki=nki)


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("rows,cols", [(400, 8192), (400, 16384), (400, 32768)])
def test_one_pass_layernorm_matches_numpy(nki: str, rows: int, cols: int) -> None:
    """Four row tiles of 100 rows (the pipeline's prologue, one pair in the loop, its epilogue): X per parity at
    rows of 8192, X allocated once (B's chunk read before the next tile's chunk loads) at 16384 and 32768."""
    c = compiled(rows, cols, nki)
    src = unwrap(numbered(c.source))
    assert "bn_stats" in src and "bn_aggr" in src and "op=nl.square" not in src
    inputs = lang.random_inputs(c.program, seed=11)
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    want = layernorm(*(np.asarray(inputs[p.name], np.float64) for p in c.program.inputs))
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=TOLERANCE["f32"], atol=TOLERANCE["f32"] * scale)


def test_rows_far_from_zero_keep_their_variance() -> None:
    """Rows with a mean 1000 times their spread: bn_aggr merges per-chunk means and squared deviations (never
    E[x^2] - mean^2, which would lose every digit here), so Y matches the float64 formula."""
    c = compiled(400, 8192)
    rng = np.random.default_rng(5)
    X = (1000.0 + rng.standard_normal((400, 8192))).astype(np.float32)
    g = rng.standard_normal(8192).astype(np.float32)
    b = rng.standard_normal(8192).astype(np.float32)
    got = np.asarray(c.run(X=X, g=g, b=b)["Y"], np.float64)
    want = layernorm(X.astype(np.float64), g.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * float(np.abs(want).max()))


def test_the_statistics_are_one_vector_pass() -> None:
    """bn_stats over 512-column pieces of each chunk into one stats tile, one bn_aggr per row tile; ScalarE keeps
    the centring only (no activation kept for its row sums); `+ b` on GpSimdE, one instruction per chunk."""
    src = unwrap(numbered(compiled(512, 8192).source))
    assert re.search(r"nisa\.bn_stats\(dst=mv_stats\w*\[:, cc \* \d+ \+ cs \* 6:", src)
    assert "for cs in range(4)" in src  # 2048-column chunks in pieces of 512
    assert "reduce_res" not in src
    adds = [line for line in src.splitlines() if "op=nl.add" in line and "tensor_tensor" in line]
    assert adds and all("engine=nisa.engine.gpsimd" in line for line in adds)
    assert "the columns of two row tiles: the next tile's, then this one's" in src  # X by parity


def test_x_allocated_once_is_read_before_it_is_reloaded() -> None:
    """At rows of 16384 X (64 KiB per partition) is allocated once: in the fused chunk loop this tile's chunk k is
    read (the centring) before the next tile's chunk k is loaded into the same columns."""
    src = unwrap(numbered(compiled(512, 16384).source))
    head, loop = src.split("pairs of row tiles", 1)
    assert len(re.findall(r"X_tile\w* = nl.ndarray\(\(128, 16384\)", head)) == 1
    body = loop.split("for cc in range(")[1]
    assert body.index("data=X_tile[:, cc * Y_TILE_C") < body.index("nisa.dma_copy(dst=X_tile[:, cc * Y_TILE_C")


def test_chains_without_both_passes_are_left_alone() -> None:
    """rmsnorm (a sum of squares, no mean) and softmax keep their ScalarE sums."""
    for text in ((EXAMPLES / "rmsnorm.tl").read_text(), (EXAMPLES / "softmax.tl").read_text()):
        src = numbered(compile_loaded(lang.load(text, {"M": 512, "N": 16384})).source)
        assert "bn_stats" not in src and "reduce_res" in src


def test_a_non_layernorm_sum_is_not_rewritten() -> None:
    """one_pass_stats leaves a body without a mean pass (None)."""
    x = ir.Buf("X_tile", "sbuf", "f32", (128, 1024))
    col = ir.Buf("s_col", "sbuf", "f32", (128, 1))
    d = ir.Buf("discard", "sbuf", "f32", (128, 1024))
    body = [ir.Alloc(d), ir.Alloc(col), ir.Act(ir.whole(d), ir.whole(x), "exp", total=ir.whole(col))]
    block = ir.Block("chain", (ir.Loop("pt", 2, tuple(body)),))
    assert one_pass_stats([block], 1024, lambda n: n, 512) is None


def test_the_verifier_checks_bn_stats_shapes() -> None:
    """bn_stats reads at most bn_stats_fmax (512) elements per partition into 6 values; bn_aggr reads triples."""
    x = ir.Buf("x", "sbuf", "f32", (128, 1024))
    stats = ir.Buf("stats", "sbuf", "f32", (128, 6))
    mv = ir.Buf("mv", "sbuf", "f32", (128, 2))
    for body, what in (((ir.Reduce(ir.whole(stats), ir.whole(x), "bn_stats"),), "at most 512"),
                       ((ir.Reduce(ir.whole(mv), ir.View(stats, (ir.full(128), ir.Sl(ir.Aff(), 4))), "bn_aggr"),),
                        "triples")):
        kernel = ir.Kernel("k", (), (), tuple(ir.Alloc(b) for b in (x, stats, mv)) + body)
        with pytest.raises(InternalError, match=what):
            verify(kernel, "test")


def test_a_row_too_long_to_keep_whole_is_kept_for_its_first_chunks() -> None:
    """Rows of 32768 fp32: X (128 KiB per partition) and b whole do not fit; b is broadcast before the loop for its
    first chunks only (chunk_pipe.partly_whole), and both halves of the output's chunk loop are fused with the
    matching chunks of the next tile's statistics (two fused loops per row tile)."""
    src = unwrap(numbered(compiled(400, 32768).source))
    head, rest = src.split("pairs of row tiles", 1)
    whole = re.search(r"b_tile = nl\.ndarray\(\(100, (\d+)\)", head)
    assert whole and 0 < int(whole.group(1)) < 32768
    first = int(whole.group(1)) // 1024
    loop = rest.split("for p1 in")[0]
    assert re.findall(r"for cc in range\((\d+)\)", loop) == [str(first), str(32 - first)] * 2
    assert loop.count("for the columns of two row tiles: this tile's, then the next one's") == 4


@pytest.mark.parametrize("cols", [8192, 32768])
def test_the_broadcast_before_the_loop_is_evicted_by_scalar_engine(cols: int) -> None:
    """b's broadcast before the row-tile loop leaves PSUM through ScalarE (the first tile's statistics are
    VectorE's bn_stats, ScalarE is idle until its first centring); the chunks of b broadcast again inside the loop
    (rows of 32768) stay VectorE's copies (ScalarE's centring would wait behind them)."""
    src = unwrap(numbered(compiled(400, cols).source))
    head, rest = src.split("# ---- ", 1)
    assert re.search(r"nisa\.activation\(dst=b_tile\[:, c \* 512:c \* 512 \+ 512\], op=nl\.copy, data=b_bcast\)", head)
    assert "tensor_copy(dst=b_tile" not in src
    again = re.findall(r"nisa\.(\w+)\(dst=b_chunk\w*\[[^]]*\], (?:src|op=nl\.copy, data)=b_bcast", rest)
    assert set(again) == ({"tensor_copy"} if cols == 32768 else set()), again
