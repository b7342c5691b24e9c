"""A temporary copied whole into a region of another tensor is stored there by its producer (store_regions.py,
rows21): RoPE's halves and a concatenation of computed parts (each with a broadcast row: an element-wise nest
without one is stored flattened, which is no region of Y) match NumPy in f32 and bf16 with no HBM temporary
left; a copy whose destination something between reads, or whose temporary is read elsewhere, stays."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_matches, run_signed
from tilec.compiler import ir
from tilec.compiler.store_regions import stores_in_place
from user20_formulas import FORMULAS

ROPE = (pathlib.Path(__file__).parents[1] / "programs" / "user20" / "rope.tl").read_text().replace("S = 128", "S = 512")

CONCAT = """kernel cat(A: f32[M, N], B: f32[M, K], g: f32[N], h: f32[K]) -> Y
  default M = 384, N = 48, K = 80
  Y: f32[M, N + K]
  for i in 0..M, j in 0..N:
    Y[i, j] = relu(A[i, j]) * g[j]
  for i in 0..M, k in 0..K:
    Y[i, N + k] = B[i, k] - h[k]
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_rope_halves_are_stored_into_y(dtype):
    prog, c, out, a = run_signed(ROPE, dtype, seed=2)
    for tensor, want in FORMULAS["rope"](a).items():
        assert_matches(prog, tensor, out[tensor], want)
    assert "Y_part" in c.source and "dst=Y_part[" not in c.source and "src=Y_part[" not in c.source
    assert "nl.ndarray((SIZE_S, SIZE_Dh), dtype=nl.float32, buffer=nl.hbm)" not in c.source


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_concatenated_parts_are_stored_into_y(dtype):
    prog, c, out, a = run_signed(CONCAT, dtype, seed=4)
    want = np.concatenate([np.maximum(a["A"], 0) * a["g"], a["B"] - a["h"]], axis=1)
    assert_matches(prog, "Y", out["Y"], want)
    assert "buffer=nl.hbm)" not in c.source  # no HBM temporary


def _kernel(between: ir.Stmt | None, extra_read: bool = False) -> ir.Kernel:
    """T = tile (stored by DMA), [between], Y[:, 4:8] = T (the copy); optionally T read back too."""
    t, y, z = ir.Buf("T", "hbm", "f32", (8, 4)), ir.Buf("Y", "hbm", "f32", (8, 8)), ir.Buf("Z", "hbm", "f32", (8, 4))
    tile = ir.Buf("t_tile", "sbuf", "f32", (8, 4))
    prod: list[ir.Stmt] = [ir.Alloc(tile), ir.Dma(ir.whole(t), ir.whole(tile))]
    if extra_read:
        prod.append(ir.Dma(ir.whole(z), ir.whole(t)))
    copy = ir.Dma(ir.View(y, (ir.full(8), ir.Sl(ir.Aff(const=4), 4))), ir.whole(t))
    body = [ir.Alloc(t), ir.Block("T = work", tuple(prod))] + ([between] if between else []) + \
        [ir.Block("Y = copy of T", (copy,))]
    return ir.Kernel("k", (), (y, z), tuple(body))


def test_the_copy_folds_into_its_producer():
    out = stores_in_place(_kernel(None))
    assert len(out.body) == 1 and "stored into Y[0:8, 4:8]" in out.body[0].label
    dma = out.body[0].body[1]
    assert dma.dst.buf.name == "Y" and dma.dst.idx[1] == ir.Sl(ir.Aff(const=4), 4)


@pytest.mark.parametrize("case", ["y_read_between", "t_read_back"])
def test_the_copy_stays(case):
    y, z = ir.Buf("Y", "hbm", "f32", (8, 8)), ir.Buf("Z", "hbm", "f32", (8, 8))
    between = ir.Dma(ir.whole(z), ir.whole(y)) if case == "y_read_between" else None
    k = _kernel(between, extra_read=case == "t_read_back")
    assert stores_in_place(k) == k
