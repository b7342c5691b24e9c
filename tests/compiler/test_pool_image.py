"""Row blocks whose bands are views of one block image (pool23, pool_image.py): a pool with few channel rows puts
blocks of output rows on the partitions; with more than one band per block, each input row is loaded once into the
image, passed along x once, and each band's pass along y reads its rows of the x results. Each kernel runs on the
NKI interpreter against NumPy (np.pad + sliding windows, `test_pool_window.reference`) at small sizes; `split Y.i`
makes several bands (the default's bands cover these small blocks whole), and BLOCK_STORES off keeps the costs from
storing such small blocks once per block (a form the image does not take)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_pool_window import NP, pool_program, reference
from tilec.compiler import pool_image, pool_knobs
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang


@pytest.fixture(autouse=True)
def per_band_stores(monkeypatch):
    monkeypatch.setattr(pool_knobs, "BLOCK_STORES", False)


def run(kind: str, r: int, s: int, pad: int, dtype: str, h: int, c: int, band: int, w: int = 13) -> str:
    prog = lang.load(pool_program(kind, r, s, pad, dtype, h=h, w=w, n=1, c=c))
    compiled = compile_loaded(prog, lang.parse_schedule(f"split Y.i, {band}", "<s>"))
    x = np.random.default_rng(7).standard_normal(prog.tensors["X"].shape).astype(NP[dtype])
    assert_matches(prog, "Y", compiled.run(X=x)["Y"], reference(x.astype(np.float32), kind, r, s, pad))
    return compiled.source


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("kind,r,s,pad,h,c,band", [
    ("max", 5, 2, 2, 44, 64, 4),  # maxpool5x5s2's form: two blocks of 11 rows, padding at both ends
    ("avg", 5, 1, 2, 30, 64, 4),  # a sum: the rows outside X zeroed in the image
    ("max", 2, 1, 0, 30, 64, 5),  # maxpool2x2s1's: no padding, 29 output rows (the last block redoes one)
    ("avg", 3, 1, 1, 31, 48, 4),  # blocks at partitions 0 and 48 (the zero copies span every partition)
    ("max", 5, 1, 2, 27, 32, 3),  # four blocks of 7 rows, stride 1
    ("avg", 7, 2, 3, 46, 64, 3),  # 7 taps (doubling), three rows of padding per side
])
def test_bands_as_views_of_the_block_image(kind, r, s, pad, h, c, band, dtype):
    source = run(kind, r, s, pad, dtype, h, c, band)
    assert "X_image" in source and "X_band" not in source


def test_strided_f32_sum_in_the_image():
    """avgpool5x5s2's form in f32 (a 16-bit strided sum keeps the Interleave, where TensorE sums its taps)."""
    assert "X_image" in run("avg", 5, 2, 2, "f32", 44, 64, 4)


def test_each_input_row_is_loaded_once():
    """maxpool 2x2 s1 (no padding, two blocks evenly spaced): the loads into the image move each block's input rows
    once (their rows add up to the block's), where the per-band buffers reload a row per band."""
    source = run("max", 2, 1, 0, "f32", 33, 64, 4)
    loads = [ln for ln in source.splitlines() if "dma_copy(dst=X_image" in ln]
    rows = 0
    for ln in loads:
        part = ln.split("X_image[")[1].split("]")[0].split(",")
        lo, hi = (int(v) for v in part[1].strip().split(":"))
        rows += hi - lo
    assert rows == 16 + 1  # 16 output rows per block, 2 taps


def test_per_band_buffers_when_disabled(monkeypatch):
    """IMAGE off: the per-band buffers with their halo rows (the form before), the same answers."""
    monkeypatch.setattr(pool_knobs, "IMAGE", False)
    source = run("max", 5, 2, 2, "f32", 44, 64, 4)
    assert "X_image" not in source and "X_band" in source


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_last_band_rows_all_outside_x(monkeypatch, kind):
    """Bands of one row, 5x5 s2 pad 2, H = 43: the last block's last band reads two new input rows, both below X
    (padding): no load for them, only the identity rows (the random sweep found a load of 0 rows, which the IR
    verifier refused)."""
    monkeypatch.setattr(pool_image.ImageBands, "image_bands", lambda self: [1] * self.Rb)
    monkeypatch.setattr(pool_image.ImageBands, "bands_estimate", lambda self, once: float("inf"))
    assert "X_image" in run(kind, 5, 2, 2, "f32", 43, 64, 2)
