"""The depthwise kernel's chunk pipeline is one chunk deeper with several images (depthwise_layout.DEPTH_BATCH: chunk
i's taps are issued before chunk i-3's eviction; one image, and the hybrid, keep DEPTH). Checked against NumPy
(test_depthwise_fast.reference: np.pad + one product per tap; test_conv_grouped.grouped_ref for a fan-in) on the NKI
interpreter, both NKI dialects, f32 and bf16, at sizes of more chunks than the pipeline holds."""
from __future__ import annotations

import re

import pytest

from compiler_helpers import assert_matches
from test_conv_grouped import grouped_ref
from test_conv_padded import rounded, run
from test_depthwise_fanin_pieces import FAN_IN
from test_depthwise_fast import PADDED, reference
from tilec.compiler import build_depthwise, codegen, wrap
from tilec.compiler.depthwise_layout import DEPTH, DEPTH_BATCH


def pipeline_tags(source: str) -> set[str]:
    """The chunk letters of the PSUM sums (`{op}_acc{tag}_{letter}`): one per chunk in flight, plus one."""
    return {m.group(1) for m in re.finditer(r"\bY_acc\w*?_([a-e])(?:_end)?\b", wrap.unwrap(source))}


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("n", [1, 2])
def test_depth_by_batch_matches_numpy(monkeypatch, nki, dt, n):
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    # 128 channels: one image per tile, no row blocks; W = 64: 8 output rows per PSUM chunk, 5 chunks per tile
    prog, comp, inputs, out = run(PADDED.format(dt=dt, n=n, c=128, h=40, w=64))
    assert "nl.psum" in comp.source
    assert len(pipeline_tags(comp.source)) == (DEPTH_BATCH if n > 1 else DEPTH) + 1, pipeline_tags(comp.source)
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], reference(x["X"], x["Wd"], pad=1, bias=x["b"]))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_fan_in_depth_with_batch_matches_numpy(monkeypatch, nki, dt):
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    monkeypatch.setattr(build_depthwise, "dense_ns", lambda *args: float("inf"))  # the depthwise kernel's path
    prog, comp, inputs, out = run(FAN_IN.format(dt=dt, n=2, g=64, cg=2, h=40, w=64, pad=1))
    assert "18 taps" in comp.source
    # a fan-in's TensorE taps lead by one chunk: one more sum in flight
    assert len(pipeline_tags(comp.source)) == DEPTH_BATCH + 2, pipeline_tags(comp.source)
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], grouped_ref(x["X"], x["Wg"], 64, pad=1, bias=x["b"]))
