"""The stem -> max pool chain's band copies (stem22): how many tap columns its phased conv folds into the copies
from batch 2 on (stem_chain.columns_per_copy: TensorE against the busiest DMA engine, the pool's seam and store on
the odd half's engines), and a padded read of two bands per image whose copies stand apart with gaps (they were
never zeroed: the band is now zeroed whole, conv_halo.zero_tiles). Kernels run on the interpreter against NumPy
(test_pool_chain.run: the conv as one einsum per tap over np.pad, rounded to the program's dtype, then the pool)."""
from __future__ import annotations

import pytest

from test_pool_chain import run, stem
from tilec.compiler import conv_pairs
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
    ("bf16", 8, 2),  # 18 copies 7 apart: 4 partitions at most per DMA engine (27 copies 4 apart: 6, seam and store)
    ("bf16", 2, 3),  # only the second image's conv meets the pool's DMAs: the fewer matmuls
    ("bf16", 1, 3),  # one image: conv_pairs' own rule
])
def test_columns_per_copy_at_the_stems_size(monkeypatch, dtype, n, m):
    seen = spy(monkeypatch)
    compile_loaded(lang.load(stem("max", 3, dtype), dict(N=n, C=3, K=64, H=224, W=224)), None)
    assert seen[-1] == m


@pytest.mark.parametrize("dtype, sizes, schedule, m", [
    ("bf16", dict(N=3, K=64, H=48, W=64), "split T.y, 4", 2),  # 6 bands in slots, 18 copies 7 apart
    ("bf16", dict(N=2, K=64, H=96, W=96), "", 2),  # two bands: one shared slot is none, the band zeroed whole
    ("f32", dict(N=2, K=64, H=80, W=80), "", 4),  # fp32 matmuls at a quarter rate: the most columns
])
def test_chain_copies_match_numpy(monkeypatch, dtype, sizes, schedule, m):
    seen = spy(monkeypatch)
    c = run(stem("max", 3, dtype, f"  schedule:\n    {schedule}\n" if schedule else ""), dtype, C=3, **sizes)
    assert "T_phases" in c.source and seen[-1] == m
