"""Blocks of output rows over several partition tiles (pool_costs.across_blocks): a pool whose n*c channel rows
leave partitions of their tiles empty (80 rows: one tile of 80; 192: two of 96) takes tiles of fewer channel rows
with blocks of output rows beside them on the other partitions, when the model's costs say so. Checked on the NKI
interpreter against NumPy (test_pool_window.reference): max and average pools, f32 and bf16, blocks that split the
output rows evenly, paddings 1 to 3 (a max's rows outside X copied from rows of X: `pad_runs`)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from kernel_numbers import numbered
from test_pool_window import NP, pool_program, reference
from tilec.compiler import pool_knobs
from tilec.compiler.api import compile_loaded
from tilec.compiler.ops import PoolOp, PoolSpec, Window
from tilec.compiler.pool_segments import pad_runs
from tilec.compiler.schedule import PoolPlan, window_pool_plan
from tilec.lang import api as lang


def run(kind: str, r: int, pad: int, dtype: str, n: int, c: int, h: int) -> str:
    """A stride-1 pool of n x c channel rows over h x (h + 1), compared with NumPy; the kernel's text, numbered."""
    prog = lang.load(pool_program(kind, r, 1, pad, dtype, h=h, w=h + 1, n=n, c=c))
    compiled = compile_loaded(prog)
    x = np.random.default_rng(r * 10 + pad + c).standard_normal(prog.tensors["X"].shape).astype(NP[dtype])
    want = reference(x.astype(np.float32), kind, r, 1, pad)
    assert_matches(prog, "Y", compiled.run(X=x)["Y"], want)
    return numbered(compiled.source)


def pool_op(kind: str, c: int, h: int) -> PoolOp:
    spec = PoolSpec(5, 5, "maximum" if kind == "max" else "add", 1.0 if kind == "max" else 1 / 25)
    window = Window((1, 1), (-2, -2), (h, h), "window")
    return PoolOp("Y", "Y", "X", (("B", c), ("H", h), ("W", h)), spec, (("b", "c"), ("i", "i"), ("j", "j")),
                  window=window)


def test_the_plan_of_192_channel_rows():
    """maxpool 5x5 s1 at 192 x 28 x 28 (families.py): three tiles of 64 channel rows, two blocks of 14 rows each;
    256 rows fill their two tiles (no blocks); a bf16 average keeps TensorE's taps (one block)."""
    assert window_pool_plan(pool_op("max", 192, 28), ("f32", "f32")) == PoolPlan(64, 14, 2, across=True)
    assert window_pool_plan(pool_op("max", 192, 28), ("bf16", "bf16")) == PoolPlan(64, 14, 2, across=True)
    assert window_pool_plan(pool_op("max", 256, 28), ("f32", "f32")) == PoolPlan(128, 28, 1)
    assert not window_pool_plan(pool_op("avg", 192, 28), ("bf16", "bf16")).across
    assert not window_pool_plan(pool_op("max", 192, 28)).across  # (no dtypes: a conv's chained pool, pool_chain)


def test_the_knob_turns_it_off(monkeypatch):
    monkeypatch.setattr(pool_knobs, "ACROSS", "off")
    assert window_pool_plan(pool_op("max", 192, 28), ("f32", "f32")) == PoolPlan(96, 28, 1)


def test_pad_rows_copy_rows_every_window_reads():
    """A max's band rows outside X hold rows of X that every window reading them reads too: 5x5 padding 2 over 28
    rows, the first block's two rows above X from rows 0-1 and the last block's two below from rows 26-27, one DMA
    each; a 4-wide window padded by 3 has windows (rows -2..1) without row 1, so each row takes row 0 alone."""
    assert pad_runs(-2, 18, 28, 5, 1, -2, 28) == [(0, 2, 0)]
    assert pad_runs(12, 18, 28, 5, 1, -2, 28) == [(16, 2, 26)]
    assert pad_runs(2, 10, 28, 5, 1, -2, 28) == []
    assert pad_runs(-3, 6, 10, 4, 1, -3, 10) == [(0, 1, 0), (1, 1, 0), (2, 1, 0)]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("kind, r, pad", [("max", 5, 2), ("avg", 5, 2), ("max", 3, 1), ("avg", 5, 1), ("max", 4, 2),
                                          ("max", 7, 3)])
@pytest.mark.parametrize("n, c", [(1, 80), (2, 96)])
def test_blocks_across_tiles_match_numpy(kind, r, pad, dtype, n, c, monkeypatch):
    """18 output rows: 80 channel rows in two tiles of 40, three blocks of 6 rows; 192 in three tiles of 64, two
    blocks of 9 (forced where the costs keep one block; a 16-bit sum may keep TensorE's taps instead)."""
    monkeypatch.setattr(pool_knobs, "ACROSS", "on")
    source = run(kind, r, pad, dtype, n, c, 18 - 2 * pad + r - 1)
    if "X_taps" not in source:
        assert "TILE_P = 40" in source if c == 80 else "TILE_P = 64" in source
        assert "3 blocks of 6 output rows" in source if c == 80 else "2 blocks of 9 output rows" in source
