"""The stem's conv -> 3x3 s2 pad 1 max pool kept on chip in the conv's row phases (stem_chain.py, issue 13): the
conv's even output rows on the first K partitions, the odd rows on the next K, the pool's odd rows moved to the even
partitions by an SBUF -> SBUF DMA. Every kernel runs on the NKI interpreter against NumPy (test_pool_chain.run: the
conv as one einsum per tap over np.pad, rounded to the program's dtype, then the pool), small shapes."""
from __future__ import annotations

import pytest

from test_pool_chain import run, stem
from tilec.compiler.api import compile_loaded, explain
from tilec.lang import api as lang


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("sizes, schedule", [
    (dict(N=1, K=64, H=28, W=28), ""),  # one band: one block of pooled rows
    (dict(N=2, K=32, H=36, W=20), ""),  # 32 channels, batch 2 (the pool one image behind)
    (dict(N=3, K=64, H=32, W=24), ""),  # batch 3: the loop over pairs of images and one odd step
    (dict(N=1, K=64, H=60, W=28), "split T.y, 10"),  # 3 bands: 3 blocks of 5 pooled rows
    (dict(N=2, K=32, H=44, W=20), "split T.y, 2"),  # 11 bands of one row pair: 11 blocks of one row
])
def test_stem_then_max_pool_in_row_phases_matches_numpy(dtype, sizes, schedule):
    """On chip by default, T never in HBM (no view of it), Y against NumPy."""
    c = run(stem("max", 3, dtype, f"  schedule:\n    {schedule}\n" if schedule else ""), dtype, C=3, **sizes)
    assert "T_phases" in c.source and "T_v" not in c.source and "T_pairs" not in c.source


def test_place_hbm_keeps_the_round_trip():
    """`place T, hbm`: T stored in its phases and loaded back by the pool (and still NumPy's answer)."""
    c = run(stem("max", 3, "f32", "  schedule:\n    place T, hbm\n"), "f32", N=1, C=3, K=64, H=28, W=28)
    assert "T_phases" not in c.source and "T_pairs" in c.source


def test_explain_says_where_t_goes():
    prog = lang.load(stem("max", 3, "f32"), dict(N=1, C=3, K=64, H=28, W=28))
    out = " ".join(explain(compile_loaded(prog, None)).split())
    assert "T SBUF, one image at a time (conv -> pool chain) on chip by default, in row phases: conv T (tl:9) " \
           "evicts the even output rows of each band onto the first 64 partitions and the odd rows onto the next 64" \
           in out
    assert "moves the even rows' passes to the odd rows' partitions with an SBUF -> SBUF DMA" in out
    assert "this saves T's store and reload" in out


def test_an_average_pool_keeps_the_plain_chain():
    """The phases serve a 3x3 s2 max pool only: a sum pool of the same windows keeps pool_chain's image."""
    prog = lang.load(stem("avg", 3, "f32"), dict(N=1, C=3, K=64, H=28, W=28))
    assert "T_phases" not in compile_loaded(prog, None).source
