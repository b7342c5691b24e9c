"""Row-pair weights of a conv chain kept on chip (conv14): the chain's convs gather their fp32 stationaries in four
copies per weight (conv_pairs.chained), as 16-bit convs do, while a lone fp32 conv keeps one gather per block.
Every result is checked against NumPy (np.pad + one einsum per tap) on the interpreter, in both NKI dialects."""
from __future__ import annotations

import re

import pytest

from compiler_helpers import assert_matches, compile_and_run
from test_conv_pair_store import SAME
from test_conv_padded import conv_ref, resnet_ref, rounded
from test_conv_phases import RESNET
from tilec.compiler.wrap import unwrap
from kernel_numbers import numbered


def taps_shapes(source: str) -> dict[str, tuple[int, ...]]:
    """name -> shape of each gathered stationary (`W_taps = nl.zeros((..)` or `nl.ndarray((..)`) in the kernel."""
    found = re.findall(r"(\w+_taps) = nl\.(?:zeros|ndarray)\(\(([\d, ]+)\)", unwrap(source))
    return {name: tuple(int(d) for d in dims.split(",")) for name, dims in found}


def gathers(source: str, name: str) -> int:
    """The copies (VectorE or ScalarE) writing the gathered stationary `name`."""
    code = unwrap(source)
    return len(re.findall(rf"^\s*{name}\[.*\] = nisa\.(tensor_copy|activation)\(", code, re.M)) + \
        len(re.findall(rf"^\s*nisa\.(tensor_copy|activation)\(dst={name}\[", code, re.M))  # (the 0.6 form)


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_resnet_chain_gathers_each_weight_in_four_copies(nki, dt):
    prog, comp, inputs, out = compile_and_run(RESNET.format(dt=dt), nki)
    shapes = taps_shapes(numbered(comp.source))
    # [2K, 2C, U, S]: both convs' blocks at one position per copy (U = 2 row-pair offsets, S = 3 tap columns)
    assert shapes == {"W1_taps": (128, 128, 2, 3), "W2_taps": (128, 128, 2, 3)}
    assert gathers(numbered(comp.source), "W1_taps") == gathers(numbered(comp.source), "W2_taps") == 4
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], resnet_ref(x, dt))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_lone_fp32_row_pairs_keep_one_gather_per_block(nki):
    prog, comp, inputs, out = compile_and_run(SAME.format(dt="f32", n=1, c=64, h=12, w=9, k=64), nki)
    shapes = taps_shapes(numbered(comp.source))
    # 6 row pairs of [2K, 2C]; 3 x 4 blocks minus the 3 that read past the taps (u = 2, copy 1, phase 0)
    assert shapes == {"Wt_taps": (128, 6, 128)}
    assert gathers(numbered(comp.source), "Wt_taps") == 18
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"]))
