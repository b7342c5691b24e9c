"""The MobileNet block's block-diagonal weights (build_mbblock.block_diag): every group's slice goes into its own
part of one zeroed tile (zeroed once), so the groups' DMAs and PE transposes do not wait for each other. Checked
against test_conv_mobilenet's NumPy block (torch-like conv2d, each stored tensor rounded) on the NKI interpreter,
both NKI dialects, f32 and bf16, with several groups and a smaller last group."""
from __future__ import annotations

import re

import pytest

from compiler_helpers import assert_matches
from test_conv_mobilenet import block_ref, block_text, on_chip
from test_conv_padded import rounded, run
from tilec.compiler import codegen, wrap


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_block_weights_zeroed_once_match_numpy(monkeypatch, nki, dt):
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    prog, c, inputs, out = run(block_text(dt, 1, 16, 200, 12, 10))
    assert on_chip(c)
    src = wrap.unwrap(c.source)
    for w in ("We", "Wp"):
        # allocated and zeroed once, outside the groups' loop (0.1: nl.zeros; 0.6: nl.ndarray + memset)
        made = [line for line in src.splitlines() if re.match(rf"\s*{w}_blocks = nl\.", line)]
        zeroed = [line for line in src.splitlines()
                  if re.search(rf"memset\(dst={w}_blocks|{w}_blocks = nl\.zeros", line)]
        assert len(made) == 1 and len(zeroed) == 1 and not zeroed[0].startswith(" " * 8), made + zeroed
        # each group's own part (a loop over groups, or unrolled group by group)
        parts = re.findall(rf"nc_transpose\(.*{w}_blocks\[[^\]]*, (e_w|\d+)[,\]]", src)
        assert parts in (["e_w"], ["e_w", "e_r"]) or parts == [str(g) for g in range(len(parts))], parts
    assert_matches(prog, "Y", out["Y"], block_ref(rounded(inputs, dt), dt))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_one_image_prepares_the_project_weights_group_by_group(monkeypatch, nki, dt):
    """Batch 1, E = 200 (the layout's groups of channels, at least two): group g's project stationary is made right
    after group g's expand, not all of them before the pipeline or after the second group's expand."""
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    prog, c, inputs, out = run(block_text(dt, 1, 16, 200, 12, 10))
    assert on_chip(c)
    lines = wrap.unwrap(c.source).splitlines()
    expands = [i for i, line in enumerate(lines) if re.search(r"# ---- A = We \. X for e group \d+", line)]
    preps = [i for i, line in enumerate(lines) if re.search(r"# ---- Wp as block-diagonal .*, e group \d+", line)]
    assert len(expands) == len(preps) >= 2, (expands, preps)
    for g, (e, w) in enumerate(zip(expands, preps)):
        assert e < w and (g + 1 == len(expands) or w < expands[g + 1]), (g, expands, preps)
    assert_matches(prog, "Y", out["Y"], block_ref(rounded(inputs, dt), dt))
