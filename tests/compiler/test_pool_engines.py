"""Where a pool's work runs (issue 13, pool speed): a window pool's lone border taps copied on ScalarE, and short-row
reductions (global average pools) whose inputs stay whole in SBUF with every tile loaded into its own part. Each
kernel runs on the NKI interpreter and is compared with NumPy (np.pad + sliding windows, np.sum), f32/f16/bf16, at
sizes of several partition tiles, bands or row tiles."""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_pool_window import NP, pool_program, reference
from tilec.compiler import build_reduce, pool_knobs, wrap
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def compiled_pool(kind: str, r: int, s: int, pad: int, dtype: str, **sizes: int):
    prog = lang.load(pool_program(kind, r, s, pad, dtype, **sizes))
    return prog, compile_loaded(prog, None)


def check_pool(kind: str, r: int, s: int, pad: int, dtype: str, **sizes: int) -> str:
    prog, c = compiled_pool(kind, r, s, pad, dtype, **sizes)
    x = np.random.default_rng(5).standard_normal(prog.tensors["X"].shape).astype(NP[dtype])
    got = c.run(X=x)["Y"]
    want = reference(x.astype(np.float32), kind, r, s, pad)
    assert np.shape(got) == want.shape
    assert_matches(prog, "Y", got, want)
    return c.source


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("r,s,pad", [(3, 1, 1), (3, 2, 1), (2, 2, 1), (5, 1, 2)])
def test_padded_average_copies_its_border_taps_on_scalar_engine(dtype, r, s, pad):
    """count_include_pad=True: the outputs whose window reaches the padding start from their lone inside tap, copied
    by ScalarE (nisa.activation with the copy function); N*C = 192 rows: two partition tiles of 96."""
    source = check_pool("avg", r, s, pad, dtype, h=21, w=17, n=2, c=96)
    copies = [ln for ln in source.splitlines() if "nisa.activation(" in ln and "op=nl.copy" in ln and "scale=" not in ln]
    assert copies and "nisa.tensor_copy(" not in source


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_padded_max_pool_across_bands(dtype):
    """A max pool's border taps go the same way; 130 rows of 80 columns make several bands per partition tile."""
    check_pool("max", 3, 1, 1, dtype, h=130, w=80, n=1, c=128)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_average_without_the_padding_keeps_scalar_engine_for_its_counts(dtype):
    """count_include_pad=False: ScalarE scales each border region by its own count; the border copies stay on
    VectorE (nisa.tensor_copy) so ScalarE's in-order queue is not lengthened."""
    source = check_pool("avgx", 3, 1, 1, dtype, h=21, w=17, n=2, c=96)
    assert "nisa.tensor_copy(" in source


def test_unpadded_pool_has_no_border_copies():
    source = check_pool("max", 2, 1, 0, "f32", h=20, w=18, n=2, c=64)
    assert "op=nl.copy" not in source and "nisa.tensor_copy(" not in source


# ---- short rows: inputs whole in SBUF ---------------------------------------------------------------------------

def gpool(dtype: str, n: int, c: int, h: int, w: int) -> str:
    return f"""\
kernel gpool(X: {dtype}[N, C, H, W]) -> Y
  default N = {n}, C = {c}, H = {h}, W = {w}
  S: f32[N, C]
  Y: {dtype}[N, C]
  for n in 0..N, c in 0..C:
    S[n, c] = 0
    for i in 0..H, j in 0..W:
      S[n, c] += X[n, c, i, j]
  for n in 0..N, c in 0..C:
    Y[n, c] = S[n, c] / {h * w}
"""


def run_text(text: str, fn) -> str:
    prog = lang.load(text)
    c = compile_loaded(prog, None)
    rng = np.random.default_rng(7)
    inputs = {t.name: rng.standard_normal(t.shape).astype(NP[t.dtype]) for t in prog.tensors.values()
              if t.kind == "input"}
    out = next(t.name for t in prog.tensors.values() if t.kind == "output")
    got = np.asarray(c.run(**inputs)[out], np.float32)
    want = fn({k: v.astype(np.float64) for k, v in inputs.items()})
    assert got.shape == want.shape
    assert_matches(prog, out, got, want)
    return c.source


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape", [(8, 256, 7, 7), (3, 200, 5, 5), (2, 130, 7, 3)])
def test_global_average_pool_with_its_input_whole_in_sbuf(dtype, shape):
    """Several row tiles per partition (8 x 256 x 7 x 7: 16 rows of 49 per partition, tiles of 16), each loaded into
    its own part of one (P, G, F) buffer; C not a multiple of 128; odd H * W."""
    source = run_text(gpool(dtype, *shape), lambda x: x["X"].sum(axis=(2, 3)) / (shape[2] * shape[3]))
    assert "X_all = nl.ndarray(" in source


def test_expression_of_two_inputs_whole_in_sbuf():
    text = """\
kernel sq(A: f32[M, F], B: f32[M, F]) -> s
  default M = 4096, F = 49
  s: f32[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..F:
      s[i] += (A[i, j] - B[i, j]) * (A[i, j] - B[i, j])
"""
    source = run_text(text, lambda x: ((x["A"] - x["B"]) ** 2).sum(axis=1))
    assert "A_all" in source and "B_all" in source


def test_large_input_falls_back_to_rotating_tiles():
    """More than RESIDENT_BYTES per partition (counted as fp32): a (P, TILE_G, F) tile per loop iteration."""
    rows = 128 * (build_reduce.RESIDENT_BYTES // (4 * 49) + 4)
    text = f"""\
kernel rs(A: bf16[M, F]) -> s
  default M = {rows}, F = 49
  s: f32[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..F:
      s[i] += A[i, j]
"""
    source = run_text(text, lambda x: x["A"].sum(axis=1))
    assert "A_tile = nl.ndarray(" in source and "A_all" not in source


# ---- few channel rows: blocks of rows interleaved with the channel rows ------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("kind,r,s,pad,h", [("max", 3, 2, 1, 32), ("avg", 3, 1, 1, 24), ("avgx", 3, 1, 1, 24),
                                            ("max", 2, 2, 0, 24), ("avg", 3, 3, 1, 36), ("max", 5, 1, 2, 28)])
def test_few_channel_rows_interleave_blocks_and_compute_seams_apart(dtype, kind, r, s, pad, h):
    """N*C = 48 channel rows, Ho even: partition b * 2 + g holds block g of row b (a plain reshape of X and Y, one
    DMA per band for both blocks); output rows whose window crosses a block edge or reaches the padding (the seams)
    are computed on the 48 channel rows alone. Signed inputs, so a padding or another block's row winning a max
    would show."""
    prog, c = compiled_pool(kind, r, s, pad, dtype, h=h, w=19, n=1, c=48)
    interleaved = "partition b * 2 + g" in c.source
    # count_include_pad=False: one block (counts differ per block); a max or a sum with more than one seam row per
    # block (3x3 and 5x5 s1: one or two at each block edge) keeps the row blocks, each band's blocks one DMA
    # (rules_pool.interleaved; a sum's rows outside X zeroed by copies, pool_window.zero_rows)
    assert interleaved == (kind != "avgx" and (r, s) not in ((3, 1), (5, 1)))
    check_pool(kind, r, s, pad, dtype, h=h, w=19, n=1, c=48)


def test_interleaved_pool_honours_a_band_directive():
    text = pool_program("max", 3, 2, 1, "f32", h=40, w=16, n=1, c=64)
    prog = lang.load(text)
    c = compile_loaded(prog, lang.parse_schedule("split Y.i, 3", "<s>"))
    assert "BAND = 3" in c.source and "partition b * 2 + g" in c.source
    x = np.random.default_rng(2).standard_normal(prog.tensors["X"].shape).astype(np.float32)
    assert_matches(prog, "Y", c.run(X=x)["Y"], reference(x, "max", 3, 2, 1))


def test_rows_that_do_not_split_evenly_keep_the_row_blocks():
    """Ho = 23 rows do not split into 2 blocks: the blocks are loaded one DMA each, as before."""
    source = check_pool("max", 2, 1, 0, "f32", h=24, w=19, n=1, c=48)
    assert "blocks of" in source and "partition b * 2 + g" not in source


@pytest.mark.parametrize("kind,c,h,interleaved", [("max", 32, 64, True), ("avg", 40, 48, True), ("max", 24, 80, True),
                                                  ("max", 32, 32, False)])
def test_interleave_of_three_to_five_blocks(kind, c, h, interleaved):
    """Fewer channel rows, more blocks (128 // C of them, at least 4 output rows each): 32 rows -> 4 blocks, 40 -> 3,
    24 -> 5; the seams of every block edge computed side by side. With 4 output rows per block (32 x 32) only 3
    have their window inside the block: too few to interleave (MIN_INTERLEAVED), the blocks stay."""
    prog, comp = compiled_pool(kind, 3, 2, 1, "f32", h=h, w=15, n=1, c=c)
    blocks = min(128 // c, (h // 2) // 4)
    assert (f"partition b * {blocks} + g" in comp.source) == interleaved
    check_pool(kind, 3, 2, 1, "f32", h=h, w=15, n=1, c=c)


# ---- blocks of rows stored once per block -----------------------------------------------------------------------


@pytest.mark.parametrize("nki", [None, "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
# (maxpool2x2s1's 64 x 56 x 56 left this list: its two blocks are evenly spaced, so each band's stores are one DMA
# (pool_window.one_store, test_pool_doubling), and in f32 the model's costs then store per band)
@pytest.mark.parametrize("kind, r, s, pad, h, w, c", [("max", 3, 1, 1, 17, 23, 40),
                                                      ("max", 2, 1, 0, 28, 28, 16), ("avg", 2, 1, 1, 22, 21, 48),
                                                      ("max", 3, 2, 1, 23, 21, 48), ("max", 2, 1, 1, 40, 32, 8)])
def test_row_blocks_store_once_per_block(kind, r, s, pad, h, w, c, dtype, nki):
    """Few channel rows in blocks of output rows that do not interleave: every band writes its rows of one
    tile-wide output buffer, stored once per block after the bands (the model orders stores into Y one DMA latency
    apart: per band they were bands x blocks stores); the last block's rows that redo the block before's are not
    stored. Against NumPy, both dialects (maxpool2x2s1 batch 1 bf16: 9.25 -> 8.15 us; f32 12.38 -> 11.76). 8
    channels of 41 output rows: 10 blocks of 5, the last two both start at row 36, so the last stores nothing (it
    was an empty DMA the verifier refused: the random sweep found it)."""
    text = pool_program(kind, r, s, pad, dtype, h=h, w=w, n=1, c=c)
    prog = lang.load(text)
    compiled = compile_loaded(prog, None, nki)
    src = wrap.unwrap(compiled.source)
    found = re.search(r"; (\d+) blocks of \d+ output rows", src)
    assert found is not None and "partition b * " not in src and "Y_tile" in src  # blocks, not interleaved
    blocks = int(found.group(1))
    assert src.count("dma_copy(dst=Y_v[") in (blocks, blocks - 1) and blocks > 1  # one store per block
    x = np.random.default_rng(5).standard_normal(prog.tensors["X"].shape).astype(NP[dtype])
    assert_matches(prog, "Y", compiled.run(X=x)["Y"], reference(x.astype(np.float32), kind, r, s, pad))


def test_row_blocks_per_band_when_disabled(monkeypatch):
    """BLOCK_STORES off: each band stores its blocks' rows itself (the form before), still matching NumPy."""
    monkeypatch.setattr(pool_knobs, "BLOCK_STORES", False)
    text = pool_program("max", 2, 1, 0, "bf16", h=56, w=56, n=1, c=64)
    prog = lang.load(text)
    compiled = compile_loaded(prog)
    # (a band's two blocks are one DMA: pool_window.one_store; two bands)
    assert "Y_tile" not in compiled.source and wrap.unwrap(compiled.source).count("dma_copy(dst=Y_v") >= 2
    x = np.random.default_rng(6).standard_normal(prog.tensors["X"].shape).astype(NP["bf16"])
    assert_matches(prog, "Y", compiled.run(X=x)["Y"], reference(x.astype(np.float32), "max", 2, 1, 0))
