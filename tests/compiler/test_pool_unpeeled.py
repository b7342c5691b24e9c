"""A pool through TensorE's taps whose first tile cannot be peeled (the three bodies' buffers do not fit): every tile
runs the taps, so the whole rows TensorE sums per band come from the band's own estimate (psum_choice with
peeled=False), not from peeled_whole's kernel-long estimate, which counts a peeled first tile's SBUF passes on the
vector engines that the kernel does not have. Every kernel runs on the NKI interpreter against NumPy
(`test_pool_window.reference`)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_pool_window import NP, pool_program, reference
from tilec.compiler import pool_costs, pool_knobs
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

FIRST = "the first channel-row tile from SBUF"


@pytest.fixture
def unpeelable(monkeypatch):
    """No peeled body fits: at these small shapes the bodies would fit, so the SBUF part they may take shrinks."""
    monkeypatch.setattr(pool_knobs, "PEEL_SBUF_PART", 10 ** 6)


def source(kind: str, r: int, s: int, dtype: str, h: int, n: int) -> str:
    prog = lang.load(pool_program(kind, r, s, r // 2, dtype, h=h, w=h, n=n, c=128))
    return compile_loaded(prog, None).source


def unnumbered(text: str) -> str:
    """The kernel without the numbers its buffers' names carry (and the line breaks their lengths move)."""
    return " ".join(re.sub(r"([A-Za-z_])\d+\b", r"\1", text).split())


def choices(monkeypatch, kind: str, r: int, s: int, h: int, n: int) -> dict[bool, int]:
    """The whole rows psum_choice gave, by its `peeled` argument, while the pool compiled."""
    seen: dict[bool, int] = {}
    real = pool_costs.psum_choice

    def spy(*args, **kwargs):
        choice = real(*args, **kwargs)
        assert choice is not None
        seen[bool(args[6] if len(args) > 6 else kwargs.get("peeled", True))] = choice.whole
        return choice
    monkeypatch.setattr("tilec.compiler.pool_tensor.psum_choice", spy)
    source(kind, r, s, "bf16", h, n)
    monkeypatch.setattr("tilec.compiler.pool_tensor.psum_choice", real)
    return seen


@pytest.mark.parametrize("kind,r,s,h,n,peeled,band", [("avg", 3, 1, 24, 3, 10, 3), ("avg", 5, 1, 24, 3, 5, 0),
                                                     ("avgx", 3, 1, 24, 3, None, None)])
def test_unpeeled_taps_take_the_bands_whole_rows(unpeelable, monkeypatch, kind, r, s, h, n, peeled, band):
    """3 tiles of 24 x 24, bf16: the peeled estimate's whole rows (10 for 3x3, 5 for 5x5) are asked first, then, the
    peeled bodies not fitting, the band's (3 and 0), and the kernel is the one those rows make (the same source as
    FULL_ROWS forced to them, but for the numbers the buffers' names carry: the discarded bodies took some).
    count_include_pad=False: whatever the estimates, the kernel matches NumPy."""
    seen = choices(monkeypatch, kind, r, s, h, n)
    got = source(kind, r, s, "bf16", h, n)
    assert FIRST not in got and "nisa.nc_matmul(" in got
    if peeled is not None:
        assert seen == {True: peeled, False: band}
        monkeypatch.setattr(pool_knobs, "FULL_ROWS", band)
        assert unnumbered(got) == unnumbered(source(kind, r, s, "bf16", h, n))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("kind,r,s", [("avg", 3, 1), ("avg", 5, 1), ("avg", 5, 2), ("avgx", 3, 1)])
def test_unpeeled_taps_match_numpy(unpeelable, dtype, kind, r, s):
    """3 tiles of 20 x 20 (batch 3 of 128 channels), every tile through TensorE's taps, against NumPy."""
    prog = lang.load(pool_program(kind, r, s, r // 2, dtype, h=20, w=20, n=3, c=128))
    compiled = compile_loaded(prog, None)
    assert FIRST not in compiled.source and "nisa.nc_matmul(" in compiled.source
    x = np.random.default_rng(5).standard_normal(prog.tensors["X"].shape).astype(NP[dtype])
    assert_matches(prog, "Y", compiled.run(X=x)["Y"], reference(x.astype(np.float32), kind, r, s, r // 2))


def test_peeled_pools_keep_the_kernel_long_estimate(monkeypatch):
    """When the peeled bodies fit (the default SBUF part), psum_choice is asked once, with the peeled estimate."""
    seen = choices(monkeypatch, "avg", 3, 1, 24, 3)
    assert list(seen) == [True]
    assert FIRST in source("avg", 3, 1, "bf16", 24, 3)
