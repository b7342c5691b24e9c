"""A 16-bit row-pair band regrouped on TensorE for its store (conv_pairs.regroup_store) whose two accumulation
groups are its two halves sums each group in two parts of one PSUM tile, cut where the regroup's PSUM parts are
(conv_split.half_groups): the regroup's first selection matmul of half 1 then waits for the part's eviction only,
not the whole group's. The kernel text (the loop over the band's groups kept, each part starting its own sum with
accumulate=False, evicted on its own) and the outputs against NumPy float64 on the interpreter, both NKI dialects:
a lone conv (bias) at batch 2 and 3; not at batch 1 nor in the ResNet block's last image (the regroup's other
form), nor for fp32 (no regroup)."""
from __future__ import annotations

import re

import pytest

from compiler_helpers import assert_matches, compile_and_run
from kernel_numbers import numbered
from test_conv_last_image import block
from test_conv_padded import conv_ref, resnet_ref, rounded
from test_conv_pair_store import REGROUP
from tilec.compiler.wrap import unwrap

# 32 rows in bands of 16 (8 pairs): groups of 4 pairs, one a half band; the regroup's parts 2 + 2 pairs
HALVES = REGROUP.replace("H = 40", "H = 32") + "  schedule:\n    tile Y.y, 4\n    split Y.y, 16\n"


def parts(src: str, acc: str) -> list[str]:
    """The rows of `acc` each sum starts at (accumulate=False matmuls into a part of it)."""
    return re.findall(rf"nc_matmul\(dst={acc}\[:, (\d+:\d+)\][^\n]*accumulate=False", src)


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt, n", [("bf16", 2), ("f16", 3)])
def test_regrouped_band_sums_its_groups_in_two_parts(nki, dt, n):
    prog, c, inputs, out = compile_and_run(HALVES.format(dt=dt, n=n), nki)
    src = unwrap(numbered(c.source))
    assert "Y_halves" in src
    if nki == "0.6":  # each part starts its sum (0.1: every matmul adds onto the zeroed tile)
        assert parts(src, "Y_acc") == ["0:2", "2:4"]  # band 1 only: band 0 keeps one sum per group
    else:
        assert [len(re.findall(rf"Y_acc\[:, {rows}(, \d+:\d+)?\] \+= nisa\.nc_matmul", src))
                for rows in ("0:2", "2:4")] == [6, 6]
    assert src.count("data=Y_acc[:, 0:2]") == src.count("data=Y_acc[:, 2:4]") == 1  # each part evicted once summed
    assert len(re.findall(r"for y_g in (nl\.affine_)?range\(2\)", src)) == 2  # both bands keep their group loop
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], bias=x["b"]))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_last_image_keeps_one_sum_per_group(nki):
    """56 x 40: bands of 28 rows, groups of 7 pairs. The ResNet block regroups only its last image's odd band,
    in the form that sums both halves in each selection matmul (as batch 1): no cut there."""
    prog, comp, inputs, out = compile_and_run(block("bf16", 2, 56, 40), nki)
    src = unwrap(numbered(comp.source))
    assert "# ---- the last image, its odd band regrouped for its store" in src and not parts(src, "U_acc")
    x = rounded(inputs, "bf16")
    assert_matches(prog, "Y", out["Y"], resnet_ref(x, "bf16"))


def test_fp32_keeps_one_sum_per_group():
    """fp32 row pairs are not regrouped (TensorE-bound), so their groups stay one sum each."""
    prog, c, inputs, out = compile_and_run(HALVES.format(dt="f32", n=1), "0.6")
    src = unwrap(numbered(c.source))
    assert "Y_halves" not in src and not parts(src, "Y_acc")
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], bias=x["b"]))
