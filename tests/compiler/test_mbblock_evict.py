"""The MobileNet block's relu6 evictions (no bias): one VectorE tensor_scalar each, max(z, 0) then min(., 6), PSUM ->
SBUF, for the expand's chunks and the depthwise's (build_mbblock.evict_expand, DepthwiseBuilder.evicts_on_vector);
before, each was a VectorE minimum in PSUM then a ScalarE relu eviction. Checked against test_conv_mobilenet's NumPy
block (np.pad, one einsum per tap) on the NKI interpreter, both dialects, f32/f16/bf16, with signed weights so that
both ends of relu6 clamp (uniform [0, 1) inputs never reach the lower one). Also BlockLayout.images: four images per
software pipeline where they fit."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_conv_mobilenet import block_ref, block_text, on_chip
from test_conv_padded import NARROW
from tilec.compiler import codegen, wrap
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

RELU6 = "op1=nl.minimum, operand1=6.0"  # (both dialects: op0 maximum with 0.0 before it)


def signed_inputs(prog, seed: int = 3) -> dict[str, np.ndarray]:
    """X in [0, 1); weights centred below 0 and wide enough that A and B cross both 0 and 6."""
    rng = np.random.default_rng(seed)
    shapes = {t.name: t.shape for t in prog.inputs}
    return {"X": rng.random(shapes["X"], dtype=np.float32),
            "We": rng.uniform(-1.5, 2.0, shapes["We"]).astype(np.float32),
            "Wd": rng.uniform(-1.5, 2.5, shapes["Wd"]).astype(np.float32),
            "Wp": rng.uniform(-0.5, 0.5, shapes["Wp"]).astype(np.float32)}


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_block_relu6_evictions_on_vector(monkeypatch, nki, dt):
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    # E = 200: two groups (the second smaller), H = 12: row blocks beside the channels, two images
    prog = lang.load(block_text(dt, 2, 16, 200, 12, 10))
    comp = compile_loaded(prog)
    assert on_chip(comp)
    src = wrap.unwrap(comp.source)
    main = src[src.index("main:"):]
    # no ScalarE relu and no lone clamp in the block's body: every relu6 is one tensor_scalar (max 0, min 6)
    assert "op=nl.relu" not in main
    clamps = [ln for ln in main.splitlines() if "nl.minimum" in ln]
    assert all(RELU6 in ln and re.search(r"nl\.maximum, (operand0=)?0\.0", ln) for ln in clamps), clamps
    assert len(clamps) >= 4  # expand and depthwise, two groups
    inputs = signed_inputs(prog)
    out = comp.run(**inputs)
    x = {k: v.astype(NARROW[dt]).astype(np.float64) for k, v in inputs.items()}
    a = x["X"].transpose(0, 2, 3, 1) @ x["We"].T
    assert (a < 0).any() and (a > 6).any()  # both ends of the expand's relu6 are exercised
    assert_matches(prog, "Y", out["Y"], block_ref(x, dt))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("n", [5, 10])
def test_block_four_images_per_pipeline(monkeypatch, nki, dt, n):
    """BlockLayout.images: the loop body pipelines 4 images (IMAGE_TRIES, when they fit), the images left over (1 or
    2) a pipeline of their own after it (N = 5: one body, inlined, then 1; N = 10: a loop of 2, then 2); each image's
    Y against NumPy."""
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    prog = lang.load(block_text(dt, n, 16, 200, 12, 10))
    comp = compile_loaded(prog)
    assert on_chip(comp)
    src = wrap.unwrap(comp.source)
    assert "X_ext_d" in src  # four images' input bands in one pipeline
    assert ("(4 images at a time)" in src) == (n == 10)
    inputs = signed_inputs(prog)
    out = comp.run(**inputs)
    x = {k: v.astype(NARROW[dt]).astype(np.float64) for k, v in inputs.items()}
    assert_matches(prog, "Y", out["Y"], block_ref(x, dt))


@pytest.mark.parametrize("dt, n, on_pe", [("bf16", 2, True), ("f16", 5, True), ("f32", 2, False), ("bf16", 1, False)])
def test_block_residual_on_tensor_engine(dt, n, on_pe):
    """BlockBuilder.residual_on_pe: at 16 bits with several images TensorE adds the block's input into the project's
    sums (one identity matmul per sum) and ScalarE evicts; at f32 or for one image VectorE adds it on the eviction.
    (Y against NumPy on this path: the relu6 and four-images tests above, N = 2, 5 and 10 at f16 and bf16.)"""
    src = wrap.unwrap(compile_loaded(lang.load(block_text(dt, n, 16, 200, 12, 10))).source)
    assert ("ident_res" in src) == on_pe
    assert bool(re.search(r"tensor_tensor\([^)]*X_skip", src)) == (not on_pe)
