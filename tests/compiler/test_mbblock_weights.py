"""The MobileNet block's block-diagonal weights (build_mbblock.block_diag): every group's slice goes into its own
part of one zeroed tile (zeroed once), so the groups' DMAs and PE transposes do not wait for each other. Checked
against test_conv_mobilenet's NumPy block (torch-like conv2d, each stored tensor rounded) on the NKI interpreter,
both NKI dialects, f32 and bf16, with several groups and a smaller last group."""
from __future__ import annotations

import re

import pytest

from compiler_helpers import ROOT, assert_matches
from test_conv_mobilenet import block_ref, block_text, on_chip
from test_conv_padded import rounded, run
from tilec.compiler import build_mbblock, codegen, wrap
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang


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


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_diagonals_group_by_group_when_they_outlast_the_first_load(monkeypatch, nki, dt):
    """The depthwise's diagonal matrices (TensorE's taps) are built all before the pipeline when that takes less
    than the first band's load, else group by group, each just before its group's expand. Forced both ways here
    (the rule's inputs are the model's costs; test_family_rule checks it on the family's shapes)."""
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    for later in (False, True):
        monkeypatch.setattr(build_mbblock.BlockBuilder, "diags_outlast_load", lambda self, count, v=later: v)
        prog, c, inputs, out = run(block_text(dt, 1, 16, 200, 12, 10))
        assert on_chip(c)
        lines = wrap.unwrap(c.source).splitlines()
        expands = [i for i, line in enumerate(lines) if re.search(r"# ---- A = We \. X for e group \d+", line)]
        diags = [i for i, line in enumerate(lines) if re.search(r"# ---- diag\(Wd\[e, r, s\]\).*, e group \d+", line)]
        if later:
            assert len(diags) == len(expands) >= 2 and all(
                (g == 0 or expands[g - 1] < d) and d < expands[g] for g, d in enumerate(diags)), (diags, expands)
        else:
            assert not diags and any(re.search(r"# ---- diag\(Wd\[e, r, s\]\)", line) for line in lines)
        assert_matches(prog, "Y", out["Y"], block_ref(rounded(inputs, dt), dt))


@pytest.mark.parametrize("dt, later", [("f32", False), ("bf16", True)])
def test_family_rule(dt, later):
    """The MobileNet family's block (C = 24, E = 144, 56 x 56, batch 1): at f32 TensorE takes 2 taps per group (10
    diagonals, ~1.1 us on ScalarE and VectorE by turns) against ~2.4 us for the first band; at bf16 8 (40 diagonals,
    ~4.5 us) against ~1.8 us."""
    text = (ROOT / "benchmarks" / "families" / "mobilenet_block.tl").read_text().replace("f32[", f"{dt}[")
    c = compile_loaded(lang.load(text))
    grouped = re.search(r"# ---- diag\(Wd\[e, r, s\]\).*, e group 1\b", wrap.unwrap(c.source)) is not None
    assert grouped == later


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_last_image_of_a_pipeline_projects_after_its_evictions(monkeypatch, nki, dt):
    """Batch 3 (a pipeline of two images, then one of the last image): an earlier image's project sum starts while
    the next image's groups are evicted (a group behind), the last image's only after its pipeline's last
    eviction, so its PSUM banks stay free for the expand and depthwise sums until then (dw16)."""
    monkeypatch.setattr(codegen, "DEFAULT_NKI", nki)
    prog, c, inputs, out = run(block_text(dt, 3, 16, 200, 12, 10))
    assert on_chip(c)
    lines = wrap.unwrap(c.source).splitlines()
    evicts = [i for i, line in enumerate(lines) if re.search(r"# ---- B rows .*, e group \d+: evicted", line)]
    # a project sum starts at the matmul that overwrites its PSUM tile (0.1 `t[..] = nc_matmul`, 0.6 accumulate=False)
    sums = [i for i, line in enumerate(lines) if re.search(r"\] = nisa\.nc_matmul\(Wp_bd|nc_matmul\(dst=.*, "
                                                         r"stationary=Wp_bd.*accumulate=False", line)]
    projects = [i for i, line in enumerate(lines) if re.search(r"# ---- Y \+= Wp\[:, e group \d+\]", line)]
    assert len(sums) == 3 and len(evicts) == len(projects) >= 6 and len(evicts) % 3 == 0, (sums, evicts, projects)
    per = len(evicts) // 3  # evictions (and project matmuls) of an image
    assert sums[0] < evicts[per], (sums, evicts)  # image 0's sum starts before image 1's first eviction
    assert sums[1] > evicts[2 * per - 1] and all(p > evicts[2 * per - 1] for p in projects[per:2 * per])
    assert sums[2] > evicts[-1] and all(p > evicts[-1] for p in projects[2 * per:])
    assert_matches(prog, "Y", out["Y"], block_ref(rounded(inputs, dt), dt))
