"""The MobileNet block's PSUM sums (dw17, build_mbblock.shared_sums): a pipeline of unrolled groups keeps its expand,
depthwise and project sums in at most 8 PSUM tiles (a bank each), allocated once per pipeline and reused sum after
sum in program order; each sum's first matmul overwrites its tile (NKI 0.1 `t[..] = nc_matmul`, 0.6
accumulate=False). Checked against test_conv_mobilenet's NumPy block on the NKI interpreter (whose live-tile check
runs too), both dialects, f32 and bf16, at the family's shape (56 x 56, a pair of images) and small ones (a pair
then a last image; one image)."""
from __future__ import annotations

import re

import pytest

from compiler_helpers import assert_matches
from test_conv_mobilenet import block_ref, block_text, on_chip
from test_conv_padded import rounded, run
from tilec.compiler import codegen, wrap
from tilec.target import target

SHAPES = [(2, 24, 144, 56, 56), (3, 16, 200, 12, 10), (1, 16, 600, 12, 10)]  # N, C, E, H, W


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_block_sums_share_the_psum_banks(monkeypatch, nki, dt, shape):
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    prog, c, inputs, out = run(block_text(dt, *shape))
    assert on_chip(c)
    lines = wrap.unwrap(c.source).splitlines()
    tiles = {m.group(1) for line in lines for m in [re.match(r"\s*(\w+) = nl\.\w+\(.*buffer=nl\.psum", line)] if m}
    tiles.discard("weights_tp")  # (the weights' PE transposes, before the pipelines)
    assert tiles and len(tiles) <= target("trn2").psum_banks and not any(t.startswith("Y_acc") for t in tiles)
    # every sum's first matmul overwrites its tile; there are more sums than tiles (the tiles are reused)
    starts = [line for line in lines if re.search(r"^\s*\w+\[[^=]*\] = nisa\.nc_matmul\(|accumulate=False", line)]
    sums = [line for line in lines if re.search(r"# ---- (A = We \. X|B rows .* taps:)", line)]
    assert len(starts) > len(tiles) and len(sums) > len(tiles), (len(starts), len(sums), tiles)
    assert_matches(prog, "Y", out["Y"], block_ref(rounded(inputs, dt), dt))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_a_group_of_many_row_chunks_keeps_each_chunks_sums_apart(monkeypatch, nki):
    """21 rows of 100 columns in one row block: 5 chunks of PSUM rows per group (5, 5, 5, 5, 1). A group's PSUM and
    GpSimdE sums are added and evicted after its last chunk's taps, so each chunk needs sums of its own (chunk 3
    once shared chunk 0's names: the layout was out of reach while every sum took a PSUM bank of its own name)."""
    from tilec.compiler import build_mbblock

    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    monkeypatch.setattr(build_mbblock, "layouts", lambda e, d, p, elem: [build_mbblock.BlockLayout(1, 21, 40)])
    prog, c, inputs, out = run(block_text("f32", 1, 8, 40, 21, 100))
    assert on_chip(c)
    src = wrap.unwrap(c.source)
    assert len(re.findall(r"# ---- B rows \d+\.\.\d+ of each block, e group 0, 9 taps", src)) == 5
    gsums = set(re.findall(r"\b(B_gacc\w*) = nl\.ndarray", src))
    assert len(gsums) == 5, gsums
    assert_matches(prog, "Y", out["Y"], block_ref(rounded(inputs, "f32"), "f32"))
