"""The MobileNet block's 16-bit depthwise evictions split over two engines where that lowers the busiest one
(depthwise_layout.choose_routes' `split_evict`, `Routes.scalar_evict`): ScalarE's relu from PSUM into the 16-bit B,
then VectorE's min(., 6) on it in SBUF (4x mode), instead of VectorE's one clamp from fp32 PSUM (1x). Checked on the
NKI interpreter against test_conv_mobilenet's NumPy block (np.pad, one einsum per tap, each stored tensor rounded
to its dtype), both dialects, with signed weights so that relu6 clamps at both ends."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_conv_mobilenet import block_ref, block_text, on_chip
from test_conv_padded import NARROW
from test_mbblock_evict import signed_inputs
from tilec.compiler import codegen, wrap
from tilec.compiler.api import compile_loaded
from tilec.compiler.depthwise_layout import choose_routes
from tilec.lang import api as lang


def destination(line: str) -> str:
    """The tile an instruction writes: `dst=T` (NKI 0.6) or `T = nisa...` (0.1)."""
    return line[line.index("dst=") + 4:].split(",")[0] if "dst=" in line else line.split("=")[0].strip()


def split_pairs(main: str) -> int:
    """ScalarE relu evictions each followed (the next instruction writing that tile) by VectorE's min(., 6) in
    place."""
    lines = [ln.strip() for ln in main.splitlines() if "nisa." in ln]
    pairs = 0
    for i, ln in enumerate(lines):
        if "op=nl.relu" in ln:
            after = [x for x in lines[i + 1:] if destination(x) == destination(ln)]
            assert after and "nl.minimum" in after[0] and "6.0" in after[0] and "maximum" not in after[0], ln
            pairs += 1
    return pairs


# (N, C, E, H, W): one image (two groups of 24 channels, row blocks of 12), two images (two groups of 96)
SHAPES = [(1, 8, 48, 24, 24), (2, 32, 192, 14, 28)]


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES)
def test_split_evictions_match_numpy(monkeypatch, nki, dt, shape):
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    prog = lang.load(block_text(dt, *shape))
    comp = compile_loaded(prog)
    assert on_chip(comp)
    src = wrap.unwrap(comp.source)
    assert split_pairs(src[src.index("main:"):]) >= 1
    inputs = signed_inputs(prog)
    out = comp.run(**inputs)
    x = {k: v.astype(NARROW[dt]).astype(np.float64) for k, v in inputs.items()}
    a = x["X"].transpose(0, 2, 3, 1) @ x["We"].T
    assert (a < 0).any() and (a > 6).any()  # both ends of relu6 are exercised
    assert_matches(prog, "Y", out["Y"], block_ref(x, dt))


def test_f32_block_keeps_one_clamp():
    """At f32 VectorE's min would run at 1x too: no split (every relu6 one tensor_scalar)."""
    comp = compile_loaded(lang.load(block_text("f32", *SHAPES[1])))
    src = wrap.unwrap(comp.source)
    assert split_pairs(src[src.index("main:"):]) == 0


@pytest.mark.parametrize("n", [64, 196, 280, 504])
@pytest.mark.parametrize("extra", [(0.0, 0.0, 0.0), (300.0, 100.0, 500.0), (0.0, 600.0, 200.0)])
def test_split_never_moves_the_taps(n, extra):
    """The eviction's engines are chosen for the taps' split: the taps are the same with or without the option, and
    the split is taken only where it lowers the estimate."""
    plain = choose_routes(9, n, True, True, False, extra, 0.0, True)
    split = choose_routes(9, n, True, True, False, extra, 0.0, True, True)
    assert (split.pe, split.first, split.sv, split.v, split.g) == (plain.pe, plain.first, plain.sv, plain.v, plain.g)
    assert split.ns < plain.ns if split.scalar_evict else split == plain
