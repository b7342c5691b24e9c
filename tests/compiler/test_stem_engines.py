"""Band copies spread over every DMA engine (conv_fold.spread): the f32 stem's 36 copies of 3 channels, packed 3
apart, sat on partitions 0-107 (DMA engines 0-13, 8 partitions each), and a copy straddling two engines shared its
bytes evenly between them, so some engines moved 9 partitions' bytes per band while engines 14-15 idled. Spread,
each engine holds at most 7 of the copies' partitions, each load stays on one engine, and the gaps are zeroed with
the band slots. Kernels run on the NKI interpreter against NumPy (np.pad + an einsum per tap), small shapes."""
from __future__ import annotations

import re

import pytest

from compiler_helpers import assert_matches, compile_and_run
from test_conv_padded import conv_ref, rounded
from test_conv_stem_phases import STEM
from test_pool_chain import run, stem
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

LOAD = re.compile(r"nisa\.dma_copy\(dst=X_band\w*\[(\d+):(\d+)")


def engines(source: str, one: bool = True) -> dict[int, set[int]]:
    """DMA engine (8 partitions each) -> the band partitions its loads write (`one`: each load on one engine)."""
    held: dict[int, set[int]] = {}
    for m in LOAD.finditer(source):
        p0, p1 = int(m.group(1)), int(m.group(2))
        assert not one or p0 // 8 == (p1 - 1) // 8, f"a band load on two DMA engines: [{p0}, {p1})"
        for q in range(p0, p1):
            held.setdefault(q // 8, set()).add(q)
    return held


def test_stem_copies_spread_over_every_engine():
    """Batch 2, 6 bands of one row pair in the slots: every engine loads, none more than 7 partitions (the NKI 0.1
    dialect and other shapes: test_conv_stem_phases.py)."""
    prog, c, inputs, out = compile_and_run(STEM.format(dt="f32", n=2, h=29, w=22, k=32), "0.6", "split Y.y, 2\n")
    held = engines(c.source)
    assert sorted(held) == list(range(16)) and max(len(p) for p in held.values()) == 7
    assert sum(len(p) for p in held.values()) == 108  # 36 copies x 3 channels
    assert "copies spread over every DMA engine, gaps zeroed once" in c.source
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], stride=2, pad=(0, 0)))


def test_one_band_keeps_the_packed_copies():
    """A single band has no slots (nothing to zero once): its copies stay 3 apart on engines 0-13."""
    c = compile_loaded(lang.load(STEM.format(dt="f32", n=1, h=21, w=29, k=64)), None)
    assert "spread" not in c.source and max(engines(c.source, one=False)) == 13


def test_padded_stem_then_pool_spread_from_batch_two():
    """The padded stem of stem_maxpool (5 bands in slots): spread at batch 2 (its halos copied into the spread
    slots; the pooled Y against NumPy), packed at batch 1 (the slots' memsets would delay its first loads). (48
    columns at batch 2: at 16, TensorE's time per band is short enough that the chain takes 2 tap columns per copy,
    18 copies 7 apart, stem_chain.columns_per_copy.)"""
    text = stem("max", 3, "f32", "  schedule:\n    split T.y, 4\n")
    c = run(text, "f32", N=2, C=3, K=32, H=39, W=48)
    assert "copies spread over" in c.source and max(len(p) for p in engines(c.source).values()) == 7
    one = compile_loaded(lang.load(text, dict(N=1, C=3, K=32, H=39, W=16)), None)
    assert "copies spread over" not in one.source
    assert max(len(p) for p in engines(one.source, one=False).values()) == 8
