"""The depthwise kernel's ScalarE/VectorE products rotate through depthwise_layout.PRODUCTS_MORE (12) buffers per
chunk tag when the kernel still fits its SBUF share, else through PRODUCTS (4) in the same layout
(build_depthwise.decide; the MobileNet block's build_mbblock.choose). Each case compiles the default schedule, runs
the kernel on the NKI interpreter (both dialects) and compares Y with an independent NumPy formula (np.pad + one
product per tap; test_conv_grouped.grouped_ref for a fan-in; test_conv_mobilenet.block_ref for the block); the
families' batch-8 shapes are only compiled (which rotation, which layout)."""
from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_conv_grouped import grouped_ref
from test_conv_padded import rounded, run
from test_depthwise_fanin_pieces import FAN_IN
from test_depthwise_fast import reference
from tilec.compiler import build_depthwise, codegen, wrap
from tilec.compiler.api import compile_file
from tilec.compiler.depthwise_layout import PRODUCTS, PRODUCTS_MORE

FAMILIES = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "families"

MULT_STRIDED = """\
kernel dwm2(X: {dt}[N, C, H, W], Wm: {dt}[C * 2, 3, 3], b: {dt}[C * 2]) -> Y
  default N = 2, C = 64, H = 36, W = 112
  Y: {dt}[N, C * 2, H / 2, W / 2]
  for n in 0..N, c in 0..C, m in 0..2, y in 0..H / 2, x in 0..W / 2:
    Y[n, c*2 + m, y, x] = b[c*2 + m]
    for r in 0..3, s in 0..3:
      Y[n, c*2 + m, y, x] += (X[n, c, 2*y + r - 1, 2*x + s - 1] ?? 0) * Wm[c*2 + m, r, s]
"""


def product_buffers(source: str) -> set[int]:
    """The product buffers' indices (`{op}_prod{k}{tag}`) of a generated kernel."""
    return {int(k) for k in re.findall(r"\bY_prod(\d+)", wrap.unwrap(source))}


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_fan_in_rotates_more_products(monkeypatch, nki, dt):
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    monkeypatch.setattr(build_depthwise, "dense_ns", lambda *args: float("inf"))  # the depthwise kernel's path
    # 64 groups of 4 input channels, one output each: 36 taps a chunk, at least 8 of them vector products
    prog, comp, inputs, out = run(FAN_IN.format(dt=dt, n=2, g=64, cg=4, h=18, w=24, pad=1))
    assert "36 taps" in comp.source
    bufs = product_buffers(comp.source)
    # f32: 23 vector products a chunk (TensorE takes 12 taps), all buffers; 16-bit: TensorE takes 27, 8 products
    assert bufs == set(range(PRODUCTS_MORE if dt == "f32" else 8)), bufs
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], grouped_ref(x["X"], x["Wg"], 64, pad=1, bias=x["b"]))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_multiplier_stride_two_padded(monkeypatch, nki, dt):
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    monkeypatch.setattr(build_depthwise, "dense_ns", lambda *args: float("inf"))
    prog, comp, inputs, out = run(MULT_STRIDED.format(dt=dt))
    assert re.search(r"\(output 1 of each \w+\)", comp.source)
    x = rounded(inputs, dt)
    # output channel c*2 + m filters input channel c with its own weights
    want = reference(np.repeat(x["X"], 2, axis=1), x["Wm"], stride=2, pad=1, bias=x["b"])
    assert_matches(prog, "Y", out["Y"], want)


def family_source(name: str, batch: int) -> str:
    return wrap.unwrap(compile_file(str(FAMILIES / f"{name}.tl"), {"N": batch}).source)


def test_more_products_only_where_they_fit(monkeypatch):
    """grouped_kg1 at batch 8 (f32) fits PRODUCTS_MORE buffers per tag; depthwise_mult3x3 does not (two outputs' tags of
    4 chunks, 2 KiB each): it keeps 4 and the layout it had with 4 (32 channels per group, 2 images per tile)."""
    assert product_buffers(family_source("grouped_kg1", 8)) == set(range(PRODUCTS_MORE))
    mult = family_source("depthwise_mult3x3", 8)
    assert product_buffers(mult) == set(range(PRODUCTS))
    assert re.search(r"^GROUP = 32$", mult, re.M) and re.search(r"^IMAGES = 2$", mult, re.M)
    # the same layout as the kernel built with 4 products throughout
    monkeypatch.setattr(build_depthwise, "PRODUCT_TRIES", (PRODUCTS,))
    assert family_source("depthwise_mult3x3", 8) == mult


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_block_rotates_more_products_where_they_fit(monkeypatch, nki):
    """The MobileNet block's depthwise (build_mbblock.choose: PRODUCTS_MORE buffers per tag, else 4 in the same
    layout): one 56x56 image of 144 expanded channels takes 6 (its chunks have 6 vector products); Y matches
    test_conv_mobilenet's NumPy block."""
    from test_conv_mobilenet import block_ref, block_text, on_chip
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    prog, comp, inputs, out = run(block_text("f32", 1, 24, 144, 56, 56))
    assert on_chip(comp)
    assert {int(k) for k in re.findall(r"\bB_prod(\d+)", wrap.unwrap(comp.source))} == set(range(6))
    assert_matches(prog, "Y", out["Y"], block_ref(rounded(inputs, "f32"), "f32"))


def test_block_keeps_four_products_where_more_do_not_fit(monkeypatch):
    from tilec.compiler import build_mbblock
    block = family_source("mobilenet_block", 8)
    assert {int(k) for k in re.findall(r"\bB_prod(\d+)", block)} == set(range(PRODUCTS))
    monkeypatch.setattr(build_mbblock, "PRODUCT_TRIES", (PRODUCTS,))
    assert family_source("mobilenet_block", 8) == block
