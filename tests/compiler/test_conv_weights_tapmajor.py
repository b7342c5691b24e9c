"""fp32 weights copied tap-major before their PE transposes (conv14, conv_weights.tap_major): the rows loaded
k-major [k, C, R, S] are copied per tap into [k, R, S, C] on GpSimdE and VectorE, each tap's transposes read their
in-channels contiguously, and ScalarE evicts them. 16-bit weights keep transposing the loaded rows. Every result is
checked against NumPy (np.pad + one einsum per tap) on the interpreter, in both NKI dialects."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import assert_matches, compile_and_run
from test_conv_padded import conv_ref, rounded
from tilec.compiler.wrap import unwrap
from kernel_numbers import numbered

VALID = """\
kernel valid(X: {dt}[N, C, H, W], Wt: {dt}[K, C, {R}, {S}]) -> Y
  default N = 2, C = {C}, H = 9, W = 8, K = {K}
  Y: {dt}[N, K, H - {R} + 1, W - {S} + 1]
  for n in 0..N, k in 0..K, y in 0..H - {R} + 1, x in 0..W - {S} + 1:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..{R}, s in 0..{S}:
      Y[n, k, y, x] += X[n, c, y + r, x + s] * {w}
"""


def program(dt: str, c: int, k: int, r: int = 3, s: int = 3, w: str = "Wt[k, c, r, s]") -> str:
    return VALID.format(dt=dt, C=c, K=k, R=r, S=s, w=w)


def tap_major_copies(source: str) -> list[str]:
    """The copies writing the tap-major buffer Wt_taps (either dialect), in program order."""
    return [line.strip() for line in unwrap(source).splitlines()
            if re.match(r"\s*(Wt_taps\[.*\] = nisa\.tensor_copy\(|nisa\.tensor_copy\(dst=Wt_taps\[)", line)]


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("c, k, r, s, parts", [
    (128, 128, 3, 3, 1),  # one tile each way
    (136, 144, 3, 3, 1),  # two tiles each way (of 68 and 72 channels)
    (257, 251, 3, 3, 4),  # ragged: 128-channel tiles and a remainder tile each way (copies of their own)
    (128, 128, 2, 3, 1),  # a filter that is not square: the copies' taps in (r, s) order
])
def test_fp32_weights_are_transposed_from_a_tap_major_copy(nki, c, k, r, s, parts):
    prog, comp, inputs, out = compile_and_run(program("f32", c, k, r, s), nki)
    code = unwrap(numbered(comp.source))
    assert re.search(rf"Wt_taps = nl\.ndarray\(\(\d+, {r}, {s}, \d+\)", code)
    copies = tap_major_copies(code)
    # one copy per tap and (out-channel part, in-channel part) in the text (the tile loops, then the remainders'),
    # GpSimdE and VectorE in turn
    assert len(copies) == r * s * parts
    assert sum("gpsimd" in cp for cp in copies) == parts * ((r * s + 1) // 2)
    # every transpose reads the copy; none reads the strided rows
    transposes = [ln for ln in code.splitlines() if "nc_transpose(" in ln]
    assert transposes and all("Wt_taps[" in ln and "Wt_rows[" not in ln for ln in transposes)
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], pad=(0, 0)))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_relu_of_the_weights_on_the_scalar_eviction(nki):
    prog, comp, inputs, _ = compile_and_run(program("f32", 128, 128, w="relu(Wt[k, c, r, s])"), nki)
    code = unwrap(numbered(comp.source))
    assert tap_major_copies(code) and "nl.relu" in code
    # signed weights (exact in fp32): the relu changes the result
    inputs = {name: (v - 0.5).astype(v.dtype) for name, v in inputs.items()}
    out = comp.run(**inputs)
    x = rounded(inputs, "f32")
    assert (x["Wt"] < 0).mean() > 0.3
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], np.maximum(x["Wt"], 0), pad=(0, 0)))


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_16_bit_weights_transpose_the_loaded_rows(dt):
    prog, comp, inputs, out = compile_and_run(program(dt, 136, 144), "0.1")
    code = unwrap(numbered(comp.source))
    assert "Wt_taps" not in code and "nc_transpose(Wt_rows[" in code
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], pad=(0, 0)))


def test_large_filters_keep_transposing_the_loaded_rows():
    # a 5x5 filter's copy of a 128-channel tile is 12.5 KiB per partition, over TAP_MAJOR_BYTES: no copy (SBUF)
    prog, comp, inputs, out = compile_and_run(program("f32", 128, 128, 5, 5), "0.1")
    code = unwrap(numbered(comp.source))
    assert "Wt_taps" not in code and "nc_transpose(Wt_rows[" in code
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], pad=(0, 0)))
