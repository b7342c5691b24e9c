"""A temporary copied whole into a tensor of the same elements in the same order (shapes equal but for unit
dimensions) becomes a view of that tensor and the copy goes (unit_copies.py): a program's column temporary
matches NumPy with no copy left; on built kernels, the copy stays when the destination is touched between the
temporary's first use and the copy, when the temporary is read after it, or when the copy moves elements
(reversed indices)."""
from __future__ import annotations

import re

import numpy as np

from compiler_helpers import assert_matches
from tilec.compiler import ir
from tilec.compiler.api import compile_loaded
from tilec.compiler.unit_copies import unit_copies_dropped
from tilec.lang import api as lang

COLUMN = """kernel k(X: f32[N, M]) -> Y
  default N = 4, M = 256
  T: f32[N, M, 1]
  Y: f32[N, M]
  for i in 0..N, j in 0..M, z in 0..1:
    T[i, j, z] = X[i, j] * 2
  for i in 0..N, j in 0..M:
    Y[i, j] = T[i, j, 0]
"""


def test_column_temporary_is_a_view_of_the_result():
    c = compile_loaded(lang.load(COLUMN), target="trn2")
    assert not re.search(r"\bT\[", c.source) and "T_v = Y.reshape" in c.source
    x = lang.random_inputs(c.program, seed=1)
    assert_matches(c.program, "Y", c.run(**x)["Y"], np.asarray(x["X"], np.float64) * 2)


def _kernel(between: ir.Stmt | None = None, read_after: bool = False, reversed_copy: bool = False) -> ir.Kernel:
    """T[8, 4, 1] = tile (stored by DMA), [between], Y[8, 4] = T[:, :, 0] (the copy), [T loaded again, stored to Z]."""
    t, y, z = ir.Buf("T", "hbm", "f32", (8, 4, 1)), ir.Buf("Y", "hbm", "f32", (8, 4)), ir.Buf("Z", "hbm", "f32", (8, 4))
    tile = ir.Buf("t_tile", "sbuf", "f32", (8, 4))
    src = ir.View(t, (ir.full(8), ir.full(4), ir.Aff(const=0)))
    dst = ir.View(y, (ir.full(8), ir.Sl(ir.Aff(const=3), 4, -1) if reversed_copy else ir.full(4)))
    body: list[ir.Stmt] = [ir.Alloc(t), ir.Alloc(tile),
                           ir.Block("T = work", (ir.Dma(ir.View(t, (ir.full(8), ir.full(4), ir.Aff(const=0))),
                                                         ir.whole(tile)),))]
    body += ([between] if between else []) + [ir.Block("Y = copy of T", (ir.Dma(dst, src),))]
    body += [ir.Dma(ir.whole(tile), src), ir.Dma(ir.whole(z), ir.whole(tile))] if read_after else []
    return ir.Kernel("k", (), (y, z), tuple(body))


def test_the_temporary_becomes_a_view():
    out = unit_copies_dropped(_kernel())
    assert out.body[0] == ir.Reshape(ir.Buf("T", "hbm", "f32", (8, 4, 1)), ir.Buf("Y", "hbm", "f32", (8, 4)))
    assert not any(isinstance(s, ir.Block) and s.label == "Y = copy of T" for s in out.body)


def test_the_copy_stays():
    y, z = ir.Buf("Y", "hbm", "f32", (8, 4)), ir.Buf("Z", "hbm", "f32", (8, 4))
    for k in (_kernel(between=ir.Dma(ir.whole(z), ir.whole(y))), _kernel(read_after=True),
              _kernel(reversed_copy=True)):
        assert unit_copies_dropped(k) == k
