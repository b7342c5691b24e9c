"""Batch norm at inference over NCHW (`Y = (X - mean[c]) * rsqrt(var[c] + eps) * g[c] + b[c]`), the most common
per-channel element-wise op of a CNN, checked against NumPy on the interpreter. Two things the kernel must do
(lead23; before, 143 us on the trn2 model for 8 x 64 x 56 x 56 bf16, 68.7 after): compute the column-only part
`rsqrt(var[c] + eps)` once, not in every free tile (ExprCompiler marks a value of columns only hoistable; the hoist
pass lifts a block only when nothing else in the loop writes what it reads), and run the per-channel scale and
shift `* g[c] + b[c]` on ScalarE (tensor_scalar's multiply-add takes columns there on trn2), so that the tile's
two passes use two engines and the loads (issued by VectorE, the first reader) and the stores (by ScalarE, the
producer) go on different DMA trigger streams instead of each load waiting behind the last tile's store."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import assert_matches
from kernel_numbers import numbered
from test_conv_padded import rounded
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

BN = """\
kernel bn(X: {dt}[N, C, H, W], mean: f32[C], var: f32[C], g: f32[C], b: f32[C]) -> Y
  default N = 2, C = 48, H = 20, W = 30
  Y: {dt}[N, C, H, W]
  for n in 0..N, c in 0..C, y in 0..H, x in 0..W:
    Y[n, c, y, x] = (X[n, c, y, x] - mean[c]) * rsqrt(var[c] + 0.00001) * g[c] + b[c]
"""


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_batch_norm_inference_matches_numpy(dt: str) -> None:
    c = compile_loaded(lang.load(BN.format(dt=dt)), target="trn2")
    kernel = numbered(c.source)
    loops = kernel.index("for o in")
    assert kernel.index("nl.rsqrt") < loops  # the column's rsqrt before the loops, once
    passes = [ln for ln in kernel[loops:].splitlines() if "tensor_scalar(" in ln]
    if dt == "f32":  # the scale and shift on ScalarE (NKI 0.1's spelling)
        assert "engine=nisa.scalar_engine" in kernel[loops:] and len(passes) == 2
    else:  # a 16-bit result: one multiply-add X * A + B a tile (affine_fold.py), A and B columns made before
        assert len(passes) == 1 and "tensor_scalar(X_tile, nl.multiply" in passes[0]  # (NKI 0.1's call form)
    check(c, dt, seed=4)


def test_bf16_batch_norm_loads_are_triggered_by_the_sync_engine() -> None:
    """NKI 0.6: the loop's one VectorE pass reads the loads and makes the stores, so the loads are issued by the
    Sync engine's hardware DGE (dma_streams.loads_on_sync), the stores by VectorE's stream as before."""
    c = compile_loaded(lang.load(BN.format(dt="bf16"), {"N": 8, "C": 64, "H": 56, "W": 56}), target="trn2",
                       nki="0.6")
    flat = " ".join(re.sub(r"#[^\n]*", "", c.source[c.source.index("for o in"):]).split())
    calls = flat.split(" nisa.")[1:]  # (a keyword argument's `=nisa.` does not split)
    loads = [call for call in calls if call.startswith("dma_copy(dst=X_tile")]
    stores = [call for call in calls if call.startswith("dma_copy(dst=Y_")]
    assert loads and all("dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.sync" in ln for ln in loads)
    assert stores and not any("engine=" in ln for ln in stores)


def test_the_fold_and_the_sync_loads_take_bf16_batch_norm_near_its_floor(monkeypatch) -> None:
    """8 x 64 x 56 x 56 bf16 on the trn2 model: 43.8 us before either (session 23), slower with the fold alone (each
    load behind the previous store on VectorE's stream), faster with both."""
    from tilec.compiler import pipeline
    from tilec.perf.api import estimate

    def run_us() -> float:
        c = compile_loaded(lang.load(BN.format(dt="bf16"), {"N": 8, "C": 64, "H": 56, "W": 56}), target="trn2",
                           nki="0.6")
        _, trace = c.run_traced(**lang.random_inputs(c.program, seed=1), numerics=False)
        return estimate(trace).total_us

    both = run_us()
    monkeypatch.setattr(pipeline, "loads_on_sync", lambda k, t: k)
    assert both < 43.8 < run_us()


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_batch_norm_over_32_channels_fills_the_partitions(dt: str) -> None:
    """32 channels: y split in 4 (channel_pack.py), (c, a) on all 128 partitions, each statistic replicated 4 times
    first; the values are the same, element by element."""
    src = BN.format(dt=dt).replace("C = 48, H = 20, W = 30", "C = 32, H = 16, W = 128")
    c = compile_loaded(lang.load(src), target="trn2")
    kernel = numbered(c.source)
    assert "X_v = X.reshape((2, 32, 4, 4, 128))" in kernel and "g_rep" in kernel  # [N, C, 4, H / 4, W]
    check(c, dt, seed=5)


def check(c, dt: str, seed: int) -> None:
    """The kernel against batch norm in NumPy (float64, from the inputs as the kernel sees them; var > 0)."""
    inputs = lang.random_inputs(c.program, seed=seed)
    inputs["var"] = np.abs(inputs["var"]) + np.float32(0.1)
    x = rounded(inputs, dt) if dt != "f32" else {k: np.asarray(v, np.float64) for k, v in inputs.items()}
    x["var"] = np.asarray(inputs["var"], np.float64)
    col = lambda v: v[None, :, None, None]  # noqa: E731
    want = (x["X"] - col(x["mean"])) / np.sqrt(col(x["var"]) + 1e-5) * col(x["g"]) + col(x["b"])
    assert_matches(c.program, "Y", c.run(**inputs)["Y"], want)
