"""Mirrored border outputs of a pool's pass along x as one instruction each pair (pool_segments.border_pairs): the
window reductions on VectorE and the doubling form's combines and copies write columns o and W - 1 - o through
views that step from one to the other; an average excluding the padding scales each region of mirrored rows and
columns (one factor) by one ScalarE instruction. Checked on the NKI interpreter against NumPy
(test_pool_window.reference),
max and average pools, 4- to 7-wide windows with paddings that make one to three pairs, f32 and bf16, with the
window reductions (the default) and without (REDUCE off: the doubling form on both engines)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import assert_matches
from kernel_numbers import numbered
from test_pool_window import NP, pool_program, reference
from tilec.compiler import pool_knobs
from tilec.compiler.api import compile_loaded
from tilec.compiler.pool_segments import border_pairs, segments
from tilec.lang import api as lang


def run(kind: str, r: int, s: int, pad: int, dtype: str, h: int = 9, w: int = 10, c: int = 160) -> str:
    """Two partition tiles (N*C = 160), compared with NumPy; the kernel's text with numbers."""
    prog = lang.load(pool_program(kind, r, s, pad, dtype, h=h, w=w, n=1, c=c))
    compiled = compile_loaded(prog)
    x = np.random.default_rng(r * 10 + pad).standard_normal(prog.tensors["X"].shape).astype(NP[dtype])
    want = reference(x.astype(np.float32), kind, r, s, pad)
    assert_matches(prog, "Y", compiled.run(X=x)["Y"], want)
    return numbered(compiled.source)


def starts(pairs) -> list[tuple[int, int]]:
    return [(f.start, g.start) for f, g in pairs]


def test_pairs_of_a_padded_window():
    assert starts(border_pairs(segments(28, -2, 1, 5, 28))) == [(0, 27), (1, 26)]
    assert starts(border_pairs(segments(28, -3, 1, 7, 28))) == [(0, 27), (1, 26), (2, 25)]
    assert border_pairs(segments(28, 0, 1, 5, 32)) == []  # no padding: one segment


def test_no_pairs_when_the_borders_differ():
    """5x5 stride 2 padding 2 over 112 columns: the first output has 3 taps inside, the last 4."""
    assert border_pairs(segments(56, -2, 2, 5, 112)) == []


def test_lone_taps_pair_only_outside_reductions():
    """A 4-wide window padded by 3: its outermost outputs read one column each, a copy (the doubling form pairs
    them) that no window reduction makes (reduced=True stops there)."""
    segs = segments(31, -3, 1, 4, 28)
    assert starts(border_pairs(segs, reduced=False)) == [(0, 30), (1, 29), (2, 28)]
    assert border_pairs(segs) == []


def test_the_kernel_pairs_columns_not_rows():
    """VectorE's reductions and GpSimdE's doubling along x each write columns 0 and 9, 1 and 8 by one instruction;
    the pass along y keeps its border rows apart (a pair there would read both engines' rows of the levels)."""
    source = run("max", 5, 1, 2, "f32")
    assert re.search(r"Y_cols\[:, \d+:\d+, 0:10:9\] = nisa.tensor_reduce", source)
    assert re.search(r"Y_cols\[:, \d+:\d+, 1:9:7\] = nisa.tensor_reduce", source)
    assert re.search(r"Y_cols\[:, \d+:\d+, 0:10:9\] = nisa.tensor_tensor\(Y_d2x\[:, :, 0:8:7\]", source)
    assert re.search(r"Y_cols\[:, \d+:\d+, 1:9:7\] = nisa.activation\(op=nl.copy, data=Y_d4x\[:, :, 0:7:6\]", source)
    assert "Y_band[:, 0] = " in source and "Y_band[:, 8] = " in source


@pytest.mark.parametrize("reduce", ["auto", "off"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("kind, r, pad", [("max", 5, 2), ("avg", 5, 2), ("max", 7, 3), ("avg", 7, 3), ("avgx", 5, 2),
                                          ("avgx", 4, 2)])
def test_paired_borders_match_numpy(kind, r, pad, dtype, reduce, monkeypatch):
    """(A 16-bit average may take TensorE's taps along x instead: no pass along x on the vector engines there.)"""
    monkeypatch.setattr(pool_knobs, "REDUCE", reduce)
    source = run(kind, r, 1, pad, dtype)
    wo = 10 + 2 * pad - r + 1
    assert f":{wo}:{wo - 1}] = " in source or "X_taps" in source  # the outermost pair, in whichever form
    if reduce == "off":
        assert "tensor_reduce" not in source


def test_counted_regions_pair_mirrored_rows_and_columns():
    """count_include_pad=False, 5x5 padding 2 over 9 x 10: rows {0, 8}, {1, 7}, 2..6 by columns {0, 9}, {1, 8},
    2..7: nine scaling instructions instead of twenty-five."""
    source = run("avgx", 5, 1, 2, "f32")
    regions = re.findall(r"Y_band\[:, ([0-9:]+), ([0-9:]+)\] = nisa.activation\(op=nl.copy, data=Y_rows", source)
    assert sorted(regions) == sorted((y, x) for y in ("0:9:8", "1:8:6", "2:7") for x in ("0:10:9", "1:9:7", "2:8"))
