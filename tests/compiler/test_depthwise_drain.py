"""The depthwise kernel's pipeline ends (dw11): a chunk's ScalarE products feed VectorE's adds, whose final add feeds
ScalarE's eviction, so the route choice weighs the part of that chain the pipeline cannot hide (`drain`: the last
chunk of each output's pipeline), and a chunk's final add is issued before the taps of the chunk DEPTH later (its
eviction after them). Every kernel runs on the NKI interpreter, in both NKI forms, against the NumPy formula of
test_depthwise_fast (np.pad + one product per tap)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_conv_padded import NARROW, rounded, run
from test_depthwise_fast import PADDED, RELU6, fast, reference
from tilec.compiler import codegen, depthwise_layout


def test_drain_moves_a_tap_from_the_chain_to_tensore():
    """bf16, one PSUM bank of 504 columns: the busiest engine alone picks 7 TensorE taps (ScalarE: 2 products and the
    eviction, VectorE: 2 adds); with a third of the chunks draining, the chain ScalarE -> VectorE -> ScalarE of the
    7-tap split (~2.8 us) outweighs TensorE's eighth tap (+0.2 us), so TensorE takes 8."""
    balanced = depthwise_layout.choose_routes(9, 504, False, True, False)
    assert balanced == depthwise_layout.choose_routes(9, 504, False, True, False, drain=0.0)
    assert balanced.pe == 7
    drained = depthwise_layout.choose_routes(9, 504, False, True, False, drain=1 / 3)
    assert drained.pe == 8 and drained.sv == 0 and drained.ns > balanced.ns
    # f32 (TensorE 4.7x slower): no tap is worth moving, the split stays
    f32 = depthwise_layout.choose_routes(9, 504, False, True, True)
    assert depthwise_layout.choose_routes(9, 504, False, True, True, drain=1 / 3).pe == f32.pe


def _blocks(source: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"# ---- Y (rows \d+\.\.\d+[^\n]*)", source)]


def test_final_add_issued_before_the_taps_three_chunks_later():
    """Chunk i-3's final add comes before chunk i's taps, its eviction after them (several images: DEPTH_BATCH)."""
    _, c, _, _ = run(PADDED.format(dt="bf16", n=5, c=24, h=41, w=37))
    blocks = _blocks(c.source)
    first = [b for b in blocks if b.startswith("rows 0..")]
    assert len(first) == 3, blocks  # taps, final add, eviction of the first chunk
    taps, added, evicted = (blocks.index(b) for b in first)
    third = next(i for i, b in enumerate(blocks) if re.match(r"rows 39\.\.41, 9 taps", b))
    assert taps < added < third < evicted, blocks


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("n, ch, h, w", [(1, 150, 41, 23), (5, 24, 41, 37)])
def test_padded_with_bias_both_forms(monkeypatch, nki, dt, n, ch, h, w):
    """Several chunks per output, several groups (150 channels) or image tiles (5 images), odd sizes."""
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    prog, c, inputs, out = run(PADDED.format(dt=dt, n=n, c=ch, h=h, w=w))
    assert fast(c)
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], reference(x["X"], x["Wd"], pad=1, bias=x["b"]))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_relu6_bf16_batch(monkeypatch, nki):
    """relu6 clamps in PSUM before the eviction (on VectorE, between the final add and ScalarE's eviction)."""
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    prog, c, inputs, out = run(RELU6.format(dt="bf16", n=3, c=40, h=33, w=29))
    assert fast(c)
    x = rounded(inputs, "bf16")
    want = reference(x["X"], x["Wd"], pad=1)
    want = want.astype(NARROW["bf16"]).astype(np.float64)  # T is stored (rounded) before the relu6
    assert_matches(prog, "Z", out["Z"], np.minimum(np.maximum(want, 0), 6))


def test_mobilenet_block_adds_before_the_next_groups_taps():
    """The MobileNet block's group pipeline: group 0's final adds before group 1's taps, its evictions after them
    (the example, 144 channels in groups; its numbers are test_conv_mobilenet's)."""
    from pathlib import Path

    from tilec.compiler.api import compile_file
    src = compile_file(str(Path(__file__).parents[2] / "examples" / "mobilenet_block.tl"), {}).source
    added = src.index("e group 0: the GpSimdE sum added into PSUM")
    taps = src.index("e group 1, 9 taps")
    evicted = src.index("e group 0: evicted")
    assert added < taps < evicted
