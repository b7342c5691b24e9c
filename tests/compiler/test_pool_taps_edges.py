"""A 16-bit average through TensorE's taps (pool_tensor.py): ScalarE evicts each tile's sums in program order, so a
copy it makes of the pass along y's partial sums (the border rows the last tap misses) holds the next tile's
evictions until the vector engines' pass along y reaches it. With a window of 4 rows or more that pass is long, so
the copy goes to VectorE (`WindowPasses.edge_copy`); with 3 rows it stays on ScalarE. Kernels against NumPy
(`test_pool_window.reference`) on the NKI interpreter."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_pool_window import NP, pool_program, reference
from tilec.compiler import pool_knobs
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

ON_SCALAR = re.compile(r"activation\(dst=Y_band\[[^\]]*\], op=nl\.copy, data=Y_rows\[")
ON_VECTOR = re.compile(r"tensor_copy\(dst=Y_band\[[^\]]*\], src=Y_rows\[")


@pytest.fixture
def taps(monkeypatch):
    monkeypatch.setattr(pool_knobs, "PSUM", "on")
    monkeypatch.setattr(pool_knobs, "TAPS", "on")


def compiled(r: int, s: int, dtype: str, nki: str | None = None):
    prog = lang.load(pool_program("avg", r, s, r // 2, dtype, h=20, w=20, n=3, c=128))
    return prog, compile_loaded(prog, None, nki=nki)


def test_partial_sums_of_a_5_row_pass_copied_on_vector_engine(taps, monkeypatch):
    """5x5 s1, 3 tiles (the peeled first from SBUF, then the taps) with 3 rows TensorE sums whole, so the border
    rows after them are summed tap by tap: every copy of their partial sums into Y's band is a VectorE
    tensor_copy."""
    monkeypatch.setattr(pool_knobs, "FULL_ROWS", 3)
    source = compiled(5, 1, "bf16", "0.6")[1].source
    assert "nisa.nc_matmul(" in source
    assert ON_VECTOR.search(source) and not ON_SCALAR.search(source)


def test_partial_sums_of_a_3_row_pass_stay_on_scalar_engine(taps, monkeypatch):
    """3x3 s1 through the taps: the tiles with TensorE's taps copy the border row on ScalarE (the last tile, whose
    pass along y both vector engines share, on VectorE as before)."""
    monkeypatch.setattr(pool_knobs, "FULL_ROWS", 3)
    source = compiled(3, 1, "bf16", "0.6")[1].source
    assert ON_SCALAR.search(source)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("r,s,whole", [(5, 1, 0), (5, 1, 3), (5, 2, 0), (7, 1, 2)])
def test_taps_with_copies_on_vector_engine_match_numpy(taps, monkeypatch, dtype, r, s, whole):
    """3 tiles of 20 x 20 through TensorE's taps, windows of 5 and 7 rows, with and without whole rows."""
    monkeypatch.setattr(pool_knobs, "FULL_ROWS", whole)
    prog, kernel = compiled(r, s, dtype)
    x = np.random.default_rng(3).standard_normal(prog.tensors["X"].shape).astype(NP[dtype])
    assert_matches(prog, "Y", kernel.run(X=x)["Y"], reference(x.astype(np.float32), "avg", r, s, r // 2))
