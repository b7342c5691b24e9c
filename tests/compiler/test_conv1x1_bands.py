"""A 1x1 convolution whose image is one input band of several matmul groups loads a band per group (schedule.
_default_conv, small20): the first matmul waits for its own group's input rows, not the whole image's, and the next
group's rows load behind it. Only when a group's rows are a DMA of at least 2 KiB per partition (nki-spec §2.5):
narrower images keep the one band. Checked against a NumPy strided 1x1 conv in both NKI dialects and on the
model's timeline (the order of events, not a latency figure)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import compile_and_run
from kernel_numbers import numbered
from tilec.compiler.wrap import unwrap
from tilec.perf.api import estimate
from tilec.tolerance import max_error, tolerance

CONV = """kernel proj(X: f32[N, C, H, W], Wt: f32[K, C]) -> Y
  default N = 1, C = 64, H = 56, W = 56, K = 128
  let Ho = (H - 1) / 2 + 1, Wo = (W - 1) / 2 + 1
  Y: f32[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = 0
    for c in 0..C:
      Y[n, k, y, x] += X[n, c, 2*y, 2*x] * Wt[k, c]
"""


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.einsum("nchw,kc->nkhw", x[:, :, ::2, ::2].astype(np.float64), w.astype(np.float64))


def check(text: str, nki: str, dtype: str = "f32"):
    prog, c, inputs, out = compile_and_run(text, nki)
    want = reference(np.asarray(inputs["X"]), np.asarray(inputs["Wt"]))
    got = np.asarray(out["Y"], np.float64)
    assert got.shape == want.shape
    assert max_error(got, want) <= tolerance(dtype, 64, float(np.abs(want).max()), None)
    return prog, c, inputs


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype,n", [("f32", 1), ("bf16", 2)])
def test_band_per_group_matches_numpy(nki: str, dtype: str, n: int) -> None:
    text = CONV.replace("f32", dtype).replace("N = 1", f"N = {n}")
    _, c, _ = check(text, nki, dtype)
    src = unwrap(numbered(c.source))
    # two groups of 14 output rows: two band loads of 27 input rows each, not one of 55; 64 channels: the two
    # groups' rows side by side on partitions 0-63 and 64-127 (stacked bands, schedule.stacks)
    assert "X_band = nl.ndarray((128, 27, 56)" in src and "(64, 55, 56)" not in src
    assert "dst=X_band[0:64]" in src and "dst=X_band[64:128]" in src


def test_group_loads_run_side_by_side() -> None:
    # the two groups' loads (partitions 0-63 and 64-127: DMA engines 0-7 and 8-15) overlap in time, and the first
    # matmul waits for its own group's rows only (it reads partitions 0-63)
    prog, c, inputs = check(CONV, "0.6")
    _, trace = c.run_traced(numerics=False, **inputs)
    sched = estimate(trace)._schedule
    ops = list(enumerate(trace.instrs))
    first_mm = min(sched.start[i] for i, ins in ops if ins.op == "nc_matmul")
    loads = [i for i, ins in ops if ins.engine == "dma" and any(w.name == "X_band" for w in ins.writes)]
    assert len(loads) == 2
    assert max(sched.start[i] for i in loads) < min(sched.end[i] for i in loads)
    assert first_mm >= sched.end[loads[0]]


def test_short_group_rows_keep_one_band() -> None:
    # stride 1, bf16, 28 x 28: two groups of 14 rows, 14 x 28 x 2 B = 784 B per partition, under the 2 KiB minimum;
    # two images (a single image's one band is split in two by schedule.two_bands, conv20, whatever the 1x1 rule)
    text = (CONV.replace("f32", "bf16").replace("H = 56, W = 56", "H = 28, W = 28").replace("2*y, 2*x", "y, x")
            .replace("N = 1", "N = 2")
            .replace("(H - 1) / 2 + 1", "H").replace("(W - 1) / 2 + 1", "W"))
    _, c, inputs, out = compile_and_run(text, "0.6")
    want = np.einsum("nchw,kc->nkhw", np.asarray(inputs["X"], np.float64), np.asarray(inputs["Wt"], np.float64))
    assert max_error(np.asarray(out["Y"], np.float64), want) <= tolerance("bf16", 64, float(np.abs(want).max()), None)
    src = unwrap(numbered(c.source))
    # one band of the image (two groups), the groups' rows stacked on the partition halves (schedule.stacks)
    assert "split Y.y, 28" in src and "X_band = nl.ndarray((128, 14, 28)" in src and "ROWS = 14" in src
