"""dma_merge: a loop of DMAs over blocks of partitions becomes one DMA whose HBM side has the blocks as a leading
access-pattern axis (ir.View.blocks). The padded copy 56x56 -> 58x58 (families pad1) puts (channel, block of 28
rows) pairs on 128 partitions; its two block loads and two block stores become one each. Checked against NumPy's pad
in both NKI dialects, on the model (the kernel's latency no longer depends on the undocumented rule ordering DMAs that
write interleaved rows of one tensor), and on IR loops that must stay loops."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from compiler_helpers import compile_and_run
from tilec.compiler import ir
from tilec.compiler.dma_merge import merged
from tilec.compiler.ir import Aff, Buf, Dma, Loop, Sl, Term, View, full
from tilec.compiler.verify import verify
from tilec.errors import InternalError
from tilec.perf.api import estimate

PAD = """kernel pad1(X: f32[N, C, H, W]) -> P
  default N = 1, C = 64, H = 56, W = 56
  P: f32[N, C, H + 2, W + 2]
  for n in 0..N, c in 0..C, y in 0..H + 2, x in 0..W + 2:
    P[n, c, y, x] = X[n, c, y - 1, x - 1] ?? 0
"""


def dmas(c) -> list[ir.Dma]:
    return [s for s in ir.walk(c.result.kernel.body) if isinstance(s, ir.Dma)]


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_padded_copy_one_dma_per_side_matches_numpy(nki: str, dtype: str) -> None:
    _, c, inputs, out = compile_and_run(PAD.replace("f32", dtype), nki)
    x = np.asarray(inputs["X"]).astype(out["P"].dtype).astype(np.float64)  # the kernel's input, in its dtype
    want = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)])
    assert np.array_equal(np.asarray(out["P"], np.float64), want)  # a copy: exact
    blocked = [d for d in dmas(c) if d.dst.blocks or d.src.blocks]
    assert len(blocked) == 2  # the load of X's rows and the store of P's rows
    assert all(v.blocks == ((1, 2, 28),) for d in blocked for v in (d.dst, d.src) if v.buf.memory == "hbm")
    assert not any(isinstance(s, Loop) and any(isinstance(b, Dma) for b in s.body)
                   for s in ir.walk(c.result.kernel.body))
    assert "ROWS" not in c.source  # the block loops' row count, named in their slices, is read nowhere now


def test_latency_does_not_depend_on_the_hbm_ordering_rule() -> None:
    _, c, inputs, _ = compile_and_run(PAD, "0.6")
    _, trace = c.run_traced(numerics=False, **inputs)
    stores = [ins for ins in trace.instrs if ins.engine == "dma" and any(w.memory == "hbm" for w in ins.writes)]
    assert len(stores) == 2  # the two fill rows (one DMA of row step 57) and the rows
    assert estimate(trace, hbm_rule="range").total_ns == estimate(trace, hbm_rule="pattern").total_ns


HBM = Buf("Y", "hbm", "f32", (64, 58, 58))
TILE = Buf("T", "sbuf", "f32", (128, 28, 58))


def block_loop(part: Sl, row: Aff, extent: int = 2) -> Loop:
    dma = Dma(View(HBM, (full(64), Sl(row, 28), full(58))), View(TILE, (part, full(28), full(58))))
    return Loop("b", extent, (dma,))


def test_blocks_side_by_side_merge() -> None:
    dma = merged(block_loop(Sl(Aff((Term("b", 64),)), 64), Aff((Term("b", 28),), 1)))
    assert dma is not None
    assert dma.src == View(TILE, (Sl(Aff(), 128), full(28), full(58)))
    assert dma.dst == View(HBM, (full(64), Sl(Aff((), 1), 28), full(58)), (), ((1, 2, 28),))
    assert dma.dst.shape() == (2, 64, 28, 58)


@pytest.mark.parametrize("part,row", [
    (Sl(Aff((Term("b", 32),)), 64), Aff((Term("b", 28),), 1)),  # blocks overlap: step 32, size 64
    (Sl(Aff((Term("b", 64),), 32), 64), Aff((Term("b", 28),), 1)),  # 128 partitions from 32
    (Sl(Aff((Term("b", 64),)), 64), Aff((Term("b", 28), Term("b", 1)))),  # b twice in one index
    (Sl(Aff((Term("b", 64),)), 64), Aff((), 1)),  # HBM side the same each time
])
def test_other_loops_stay(part: Sl, row: Aff) -> None:
    assert merged(block_loop(part, row)) is None


def test_verifier_refuses_blocks_on_chip() -> None:
    src = View(HBM, (full(64), Sl(Aff(), 28), full(58)))
    bad = Dma(View(TILE, (Sl(Aff(), 64), full(28), full(58)), (), ((0, 2, 64),)), src)
    k = ir.Kernel("k", (HBM,), (), (ir.Alloc(TILE), bad))
    with pytest.raises(InternalError, match="blocked"):
        verify(k, "merge")


def test_blocks_with_gaps_between_stay_apart() -> None:
    """Rows 0-27 of image b per iteration: the iterations' HBM ranges leave rows 28-57 of each image between them
    (other stores' rows); one DMA over the bounding range would overlap those stores' ranges."""
    hbm, tile = Buf("Z", "hbm", "f32", (4, 58, 58)), Buf("U", "sbuf", "f32", (112, 58))
    gaps = Dma(View(hbm, (Aff((Term("b"),)), Sl(Aff(), 28), full(58))), View(tile, (Sl(Aff((Term("b", 28),)), 28),
                                                                              full(58))))
    assert merged(Loop("b", 4, (gaps,))) is None
    joined = replace(gaps, dst=View(hbm, (Aff((), 0), Sl(Aff((Term("b", 28),)), 28), full(58))))
    assert merged(Loop("b", 2, (joined,))) is not None  # rows 0-27 then 28-55 of one image: one range
