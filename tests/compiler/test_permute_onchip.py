"""Permutes that move their last dimension in short runs, interleaved on chip (permute_onchip.py): the pixel shuffle
and unshuffle as a user writes them (view_split makes them 6-D permutes), and a 5-D permute written as one, against
NumPy's reshape / transpose (a permute moves values: the result must be bit-exact); the channel shuffle's DMAs on
128 rows (permute_rows.py); heads packed in a contraction's operands (heads_split.py)"""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import words
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

FOLDER = pathlib.Path(__file__).parents[1] / "programs" / "user20"
ONCHIP = "in SBUF: slices loaded in"


def shuffle(x: np.ndarray) -> np.ndarray:
    """Pixel shuffle, upscale 2: [N, 4C, H, W] -> [N, C, 2H, 2W] (Y[n, c, 2h + i, 2w + j] = X[n, 4c + 2i + j, h, w])."""
    n, c4, h, w = x.shape
    return x.reshape(n, c4 // 4, 2, 2, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(n, c4 // 4, 2 * h, 2 * w)


def unshuffle(x: np.ndarray) -> np.ndarray:
    """Its inverse: [N, C, 2H, 2W] -> [N, 4C, H, W]."""
    n, c, h2, w2 = x.shape
    return x.reshape(n, c, h2 // 2, 2, w2 // 2, 2).transpose(0, 1, 3, 5, 2, 4).reshape(n, 4 * c, h2 // 2, w2 // 2)


def run(text: str, dtype: str, sizes: dict[str, int], nki: str | None = None, target: str | None = None):
    """(kernel source, input, output) of the program compiled with `sizes` in `dtype`, on signed inputs exact in
    the dtype."""
    prog = lang.load(text.replace("f32", dtype), sizes)
    c = compile_loaded(prog, None, nki, target)
    x = np.random.default_rng(7).random(prog.inputs[0].shape, dtype=np.float32) - 0.5
    if dtype == "bf16":
        x = (x.view(np.uint32) & 0xFFFF0000).view(np.float32)
    return c.source, x, np.asarray(c.run(x)["Y"], np.float32)


CASES = [  # (N, C, H, W): batch 1 and 2, extents that divide nothing (the blocks of the cut dimension)
    ({"N": 1, "C": 8, "H": 4, "W": 6}), ({"N": 2, "C": 3, "H": 5, "W": 7}), ({"N": 2, "C": 16, "H": 6, "W": 4}),
]


@pytest.mark.parametrize("name,formula", [("pixel_shuffle", shuffle), ("pixel_unshuffle", unshuffle)])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("sizes", CASES)
def test_pixel_shuffles_match_numpy(name, formula, dtype, sizes):
    source, x, y = run((FOLDER / f"{name}.tl").read_text(), dtype, sizes)
    assert ONCHIP in words(source)
    assert np.array_equal(y, formula(x))


@pytest.mark.parametrize("nki,target", [("0.1", None), (None, "trn1")])
def test_pixel_shuffle_in_nki_01_and_on_trn1(nki, target):
    """NKI 0.1 prints the permuted HBM view as an advanced index, NKI 0.6 as an access pattern."""
    source, x, y = run((FOLDER / "pixel_shuffle.tl").read_text(), "f32", {"N": 2, "C": 4, "H": 3, "W": 5}, nki,
                       target)
    assert ONCHIP in words(source)
    assert np.array_equal(y, shuffle(x))


FIVE = """\
kernel five(X: f32[A, B, C, D, E]) -> Y
  default A = 3, B = 4, C = 5, D = 2, E = 6
  Y: f32[A, D, B, E, C]
  for a in 0..A, d in 0..D, b in 0..B, e in 0..E, c in 0..C:
    Y[a, d, b, e, c] = X[a, b, c, d, e]
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_five_dimensional_permute_written_as_one(dtype):
    """No single swap does [a, b, c, d, e] -> [a, d, b, e, c]: a chain of HBM steps before, one pass on chip now."""
    source, x, y = run(FIVE, dtype, {})
    assert ONCHIP in words(source)
    assert np.array_equal(y, x.transpose(0, 3, 1, 4, 2))


def test_one_step_permutes_stay_transposes():
    """A swap of two runs ([b, i, j, k] -> [b, k, i, j]) and a pair swap ([a, b, c] -> [c, b, a]) keep the
    transpose rule's single step: only chains are replaced."""
    from tilec.compiler import permute_onchip
    from tilec.target import TRN2
    ext = {"b": 4, "i": 64, "j": 8, "k": 16}
    assert not permute_onchip.chosen(tuple("bijk"), tuple("bkij"), ext, 4, TRN2)
    assert not permute_onchip.chosen(tuple("ijk"), tuple("kji"), ext, 4, TRN2)


def test_layout_blocks_fill_the_partitions_and_fit():
    """The realistic pixel shuffle (gaps15: 1 x 4*64 x 56 x 56, f32): the 64 slices alone would take half the
    partitions, so each is cut along h into blocks on partitions of their own, every step's tiles within
    STEP_BYTES, and the estimate at most 1.25x the DMA byte floor (measured on the model: 1.15x)."""
    from tilec.compiler import permute_onchip
    from tilec.target import TRN2
    ext = {"n": 1, "c": 64, "i": 2, "j": 2, "h": 56, "w": 56}
    lay = permute_onchip.plan(tuple("ncijhw"), tuple("nchiwj"), ext, 4, TRN2)
    assert lay is not None and lay.batch == ("c",) and lay.cut == "h"
    assert lay.pb * lay.parts == 128
    per = 4 * 56 * 56 // lay.parts
    assert 2 * per * 4 <= permute_onchip.STEP_BYTES
    floor_ns = 2 * 64 * 4 * 56 * 56 * 4 / (TRN2.dma_engines * TRN2.dma_engine_bw)
    assert permute_onchip.estimate_ns(lay, ext, 4, TRN2) < 1.25 * floor_ns


def channel_shuffle(x: np.ndarray, g: int) -> np.ndarray:
    n, c, h, w = x.shape
    return x.reshape(n, g, c // g, h, w).transpose(0, 2, 1, 3, 4).reshape(n, c, h, w)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("sizes", [{"N": 1, "G": 4, "Cg": 32, "H": 3, "W": 5},
                                   {"N": 2, "G": 2, "Cg": 64, "H": 2, "W": 3},
                                   {"N": 4, "G": 3, "Cg": 32, "H": 2, "W": 2}])
def test_channel_shuffle_moves_128_rows_per_dma(dtype, sizes):
    """Its DMAs had the Cg channels of a group as rows (fewer than 128: half the DMA engines or less); now 128 of
    Y's rows (n, c) or (c, g) per DMA (permute_rows.py)."""
    source, x, y = run((FOLDER / "channel_shuffle.tl").read_text(), dtype, sizes)
    assert "HBM -> HBM, 128 rows of" in words(source)
    assert np.array_equal(y, channel_shuffle(x, sizes["G"]))


def test_rows_plan_leaves_full_partitions_and_moved_last_dimensions():
    from tilec.compiler.permute_rows import rows_plan
    ext = {"s": 512, "n": 1, "h": 8, "d": 64}
    assert rows_plan(tuple("snhd"), tuple("nhsd"), ext, 128) is None  # heads_permute: s already 128 rows a DMA
    assert rows_plan(tuple("abc"), tuple("cba"), {"a": 4, "b": 4, "c": 4}, 128) is None  # the last dimension moves
    assert rows_plan(tuple("ngchw"), tuple("ncghw"), {"n": 8, "g": 4, "c": 64, "h": 28, "w": 28}, 128) == (0, 2, 2)


HEADS = """\
kernel heads(Q: f32[S, Hd * D], K: f32[S, Hd * D]) -> P
  P: f32[Hd, S, S]
  for h in 0..Hd, i in 0..S, j in 0..S:
    P[h, i, j] = 0
    for d in 0..D:
      P[h, i, j] += Q[i, h * D + d] * K[j, h * D + d]
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("sizes", [{"S": 64, "Hd": 2, "D": 32}, {"S": 130, "Hd": 3, "D": 24}])
def test_heads_packed_in_a_contractions_operands(dtype, sizes):
    """`Q[i, h * D + d]` (a QKV projection's packed heads) read by a batched contraction: each operand copied
    head-first (heads_split.py), then the batched matmul; against NumPy's einsum in float64."""
    from compiler_helpers import assert_matches, run_signed
    text = HEADS.replace("-> P\n", "-> P\n  default " + ", ".join(f"{k} = {v}" for k, v in sizes.items()) + "\n")
    prog, c, out, a = run_signed(text, dtype, seed=3)
    assert "Q_h" in c.source and "K_h" in c.source
    hd = sizes["Hd"]
    q, k = (a[t].reshape(sizes["S"], hd, sizes["D"]) for t in ("Q", "K"))
    assert_matches(prog, "P", out["P"], np.einsum("ihd,jhd->hij", q, k))


def test_packed_heads_behind_the_output_stay_refused():
    """With the heads not first in the output (`P[i, h, j]`) the batched rule refuses the contraction either way:
    nothing is copied, and the refusal is still at the contraction's line."""
    from tilec.compiler.heads_split import split_packed_heads
    prog = lang.load(HEADS.replace("P[h, i, j]", "P[i, h, j]").replace("P: f32[Hd, S, S]", "P: f32[S, Hd, S]"),
                     {"S": 8, "Hd": 2, "D": 4})
    assert split_packed_heads(prog).tensors.keys() == prog.tensors.keys()


PV = """\
kernel pv(A: f32[Hd, S, T], V: f32[T, Hd * D]) -> O
  default S = 40, T = 130, Hd = 3, D = 16
  O: f32[Hd, S, D]
  for h in 0..Hd, i in 0..S, d in 0..D:
    O[h, i, d] = 0
    for t in 0..T:
      O[h, i, d] += A[h, i, t] * V[t, h * D + d]
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_values_packed_by_head(dtype):
    """P V with V's heads packed (`V[t, h * D + d]`): V copied as V_h[h, t, d] (its d, an output variable after the
    rows, stays last), then the batched matmul; against NumPy's einsum."""
    from compiler_helpers import assert_matches, run_signed
    prog, c, out, a = run_signed(PV, dtype, seed=5)
    assert "V_h" in c.source
    assert_matches(prog, "O", out["O"], np.einsum("hit,thd->hid", a["A"], a["V"].reshape(130, 3, 16)))
