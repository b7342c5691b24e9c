"""The ResNet block's last image built apart from the image loop (conv_chain.peels_last): from batch 2 on, a 16-bit
block's second conv regroups its odd band on TensorE before the store (conv_pairs.regroup_store) in the last image
only, whose store is the kernel's tail; the other images keep the row-pair store. The kernel text (the loop over
N - 1 images, the last image reading X[N - 1] and storing through the halves view, the selection stationaries
built and used only there) and the outputs against the block in NumPy float64 on the interpreter, both NKI dialects."""
from __future__ import annotations

import re

import pytest

from compiler_helpers import assert_matches, compile_and_run
from kernel_numbers import numbered
from test_conv_padded import resnet_ref, rounded
from test_conv_phases import RESNET
from tilec.compiler.wrap import unwrap


def block(dt: str, n: int, h: int, w: int) -> str:
    return RESNET.format(dt=dt).replace("N = 2,", f"N = {n},").replace("H = 12, W = 10", f"H = {h}, W = {w}")


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt, n, h, w", [("bf16", 3, 40, 6), ("f16", 2, 48, 5)])
def test_last_image_regroups_its_odd_band(nki, dt, n, h, w):
    prog, comp, inputs, out = compile_and_run(block(dt, n, h, w), nki)
    src = unwrap(numbered(comp.source))
    head, last = src.split("# ---- the last image, its odd band regrouped for its store")
    loop = re.search(r"for n in (nl\.affine_)?range\((\d+)\)", head)
    assert (int(loop.group(2)) if loop else 1) == n - 1  # (a loop of one image is no loop)
    selects = r"nc_matmul\([^\n]*Y_select\["
    assert "Y_select" not in head and "Y_halves[" not in head and "Y_halves_view" not in head  # (built in there)
    assert f"X[{n - 1}, :, 0:" in last and "X[n" not in last  # the last image's own loads
    assert len(re.findall(selects, last)) == 4  # 2 phases x 2 evicting engines, in a loop over the halves
    assert len(re.findall(r"dma_copy\(dst=Y_halves", last)) == 1 and len(re.findall(r"dma_copy\(dst=Y_pairs", last)) == 1
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], resnet_ref(x, dt))


@pytest.mark.parametrize("dt, n", [("f32", 3), ("bf16", 1)])
def test_no_last_image_apart(dt, n):
    """fp32 row pairs never regroup; at batch 1 the one image is the last and the loop is gone already."""
    prog, comp, inputs, out = compile_and_run(block(dt, n, 40, 6), "0.6")
    src = unwrap(numbered(comp.source))
    assert "the last image" not in src
    assert ("Y_select" in src) == (n == 1)
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], resnet_ref(x, dt))
