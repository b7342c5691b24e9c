"""The stem -> max pool chain's band copies (stem22): how many tap columns its phased conv folds into the copies
from batch 2 on (stem_chain.columns_per_copy: TensorE against the busiest DMA engine, the pool's seam and store on
the odd half's engines), and a padded read of two bands per image whose copies stand apart with gaps (they were
never zeroed: the band is now zeroed whole, conv_halo.zero_tiles). Kernels run on the interpreter against NumPy
(test_pool_chain.run: the conv as one einsum per tap over np.pad, rounded to the program's dtype, then the pool)."""
from __future__ import annotations

import re
from collections import Counter

import pytest

from test_pool_chain import run, stem
from tilec.compiler import conv_pairs, stem_chain
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang


def spy(monkeypatch) -> list[int]:
    """The M of each call of conv_pairs.columns_per_copy from now on (the phased conv's is the last)."""
    seen: list[int] = []
    real = conv_pairs.columns_per_copy

    def record(b, plan):
        seen.append(real(b, plan))
        return seen[-1]
    monkeypatch.setattr(conv_pairs, "columns_per_copy", record)
    return seen


@pytest.mark.parametrize("dtype, n, m", [
    ("bf16", 8, 3),  # 27 copies placed around the seam and store (stem23; 4 apart: 6 a DMA engine, M = 2 paid)
    ("bf16", 2, 3),  # only the second image's conv meets the pool's DMAs: the fewer matmuls
    ("bf16", 1, 3),  # one image: conv_pairs' own rule
])
def test_columns_per_copy_at_the_stems_size(monkeypatch, dtype, n, m):
    seen = spy(monkeypatch)
    c = compile_loaded(lang.load(stem("max", 3, dtype), dict(N=n, C=3, K=64, H=224, W=224)), None)
    assert seen[-1] == m
    if n == 8:  # the odd half's DMA engines (partitions 64-127) carry the pool's seam and store: fewer copies
        engines = band_partitions(c.source)
        assert sum(engines.values()) == 27 * 3
        assert max(engines[e] for e in range(8, 16)) < min(engines[e] for e in range(8))


def band_partitions(source: str) -> Counter[int]:
    """Partitions of the first band slot's loads on each DMA engine (8 partitions an engine)."""
    parts = {p for lo, hi in re.findall(r"dma_copy\(dst=X_band0\[(\d+):(\d+)", source) for p in range(int(lo), int(hi))}
    return Counter(p // 8 for p in parts)


@pytest.mark.parametrize("dtype, sizes, schedule, m", [
    ("bf16", dict(N=3, K=64, H=48, W=64), "split T.y, 4", 2),  # 6 bands in slots, 18 copies 7 apart
    ("bf16", dict(N=2, K=64, H=96, W=96), "", 2),  # two bands: one shared slot is none, the band zeroed whole
    ("f32", dict(N=2, K=64, H=80, W=80), "", 4),  # fp32 matmuls at a quarter rate: the most columns
])
def test_chain_copies_match_numpy(monkeypatch, dtype, sizes, schedule, m):
    seen = spy(monkeypatch)
    c = run(stem("max", 3, dtype, f"  schedule:\n    {schedule}\n" if schedule else ""), dtype, C=3, **sizes)
    assert "T_phases" in c.source and seen[-1] == m


@pytest.mark.parametrize("dtype, sizes, schedule", [
    ("bf16", dict(N=3, K=64, H=48, W=64), "split T.y, 4"),  # 6 bands in slots
    ("bf16", dict(N=2, K=32, H=40, W=28), "split T.y, 4"),  # 7 pooled columns; the odd half: engines 4-7
    ("f32", dict(N=2, K=32, H=39, W=48), "split T.y, 4"),  # 5 bands, 27 copies at M = 3
])
def test_placed_copies_match_numpy(monkeypatch, dtype, sizes, schedule):
    """Copies placed around the pool's DMA engines (stem_chain.placement: partitions not PMAX // copies apart,
    the stationary's rows moved one copy at a time, loads cut at engine boundaries), forced at small sizes (where
    the estimate keeps them apart: their bands wait for DMA latency, not for the busiest engine)."""
    real = stem_chain._totals
    monkeypatch.setattr(stem_chain, "_totals", lambda b, plan, m: (real(b, plan, m)[0], 0.0)
                        if b.C < max(b.C, 128 // (m * (b.R + b.sy))) else real(b, plan, m))
    c = run(stem("max", 3, dtype, f"  schedule:\n    {schedule}\n"), dtype, C=3, **sizes)
    assert "T_phases" in c.source and "copies spread over" in c.source
