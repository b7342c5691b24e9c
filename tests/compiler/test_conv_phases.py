"""Row phases of folded convolutions (ConvPlan.pair = 2, build_conv): with 32 or 64 output channels the
stationary's two column halves compute two parts of the output rows (the second half starts at partition K, an
aligned start), so a matmul fills twice as many output partitions:
  * row pairs (two band copies, 64 or fewer input channels; fp32, where these convs are TensorE-bound): even and
    odd output rows; copy 1 of the band holds X one row down, so the input rows between two output rows serve both
    phases (a 3x3 conv: 6 matmuls of the whole 128 x 128 array per 2 output rows instead of 12 of a quarter of it);
  * band halves (few input channels, 2 x R x C <= 128): the two halves of a row band, from a band copy per tap row,
    tap column and half (the C = 3 first layer and the 7x7 stride-2 stem).
Checked against an independent NumPy formula (np.pad + one einsum per tap) on the NKI interpreter for f32, f16 and
bf16, with padding, several row bands (peeled edge bands), bias, relu, residual adds and strides."""
from __future__ import annotations

import re

import pytest

from compiler_helpers import assert_matches
from tilec.compiler import conv_pairs
from tilec.compiler.api import compile_loaded
from tilec.compiler.wrap import unwrap
from tilec.lang import api as lang
from test_conv_padded import conv_ref, resnet_ref, rounded, run
from kernel_numbers import numbered

SAME64 = """\
kernel same(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3], b: {dt}[K]) -> Y
  default N = 2, C = 48, H = 20, W = 13, K = 32
  Y: {dt}[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = b[k]
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[k, c, r, s]
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_row_pairs_padded_conv_with_bias_several_bands(dt):
    prog, c, inputs, out = run(SAME64.format(dt=dt), "split Y.y, 4\n")
    code = numbered(c.source)
    # 6 matmuls per row group (pairs of tap rows x 3 tap columns), each over both copies' partitions and all 2K
    # output partitions, reading every other row of the band; the even and odd rows of a band leave in one store
    # (16-bit too: with one store per band and copies loaded as one run per partition, pairs pay there as well)
    assert code.count("nisa.nc_matmul(") % 6 == 0 and "(64, 2, 13)" in code
    assert ":2]" in code or ":2," in code  # every other row
    assert code.count("src=Y_band)") == code.count("Y_band = nl.ndarray") and "Y_band[0:32]" not in code
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], bias=x["b"]))


def test_row_pairs_default_schedule_matches():
    prog, c, inputs, out = run(SAME64.format(dt="f32").replace("H = 20", "H = 30"))
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], bias=x["b"]))


def test_row_pairs_fall_back_when_a_band_holds_an_odd_number_of_rows():
    prog, c, inputs, out = run(SAME64.format(dt="f32"), "split Y.y, 5\n")
    assert "(32, " in numbered(c.source) and "(64, " not in numbered(c.source)  # one phase: K output partitions
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], bias=x["b"]))


RESNET = """\
kernel block(X: {dt}[N, C, H, W], W1: {dt}[C, C, 3, 3], b1: {dt}[C], W2: {dt}[C, C, 3, 3], b2: {dt}[C]) -> Y
  default N = 2, C = 64, H = 12, W = 10
  T: {dt}[N, C, H, W]
  U: {dt}[N, C, H, W]
  Y: {dt}[N, C, H, W]
  for n in 0..N, k in 0..C, y in 0..H, x in 0..W:
    T[n, k, y, x] = b1[k]
    for c in 0..C, r in 0..3, s in 0..3:
      T[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * W1[k, c, r, s]
  for n in 0..N, k in 0..C, y in 0..H, x in 0..W:
    U[n, k, y, x] = b2[k]
    for c in 0..C, r in 0..3, s in 0..3:
      U[n, k, y, x] += relu(T[n, c, y + r - 1, x + s - 1] ?? 0) * W2[k, c, r, s]
  for n in 0..N, k in 0..C, y in 0..H, x in 0..W:
    Y[n, k, y, x] = relu(U[n, k, y, x] + X[n, k, y, x])
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_row_pairs_resnet_block_bias_relu_residual(dt):
    prog, c, inputs, out = run(RESNET.format(dt=dt))
    # row pairs (16-bit: a conv on its own has no row pairs, but the two convs here are a chain kept on chip, which
    # takes them: conv_chain.pairs_16): a band's even and odd output rows leave in one store through Y seen as
    # [N, K, pairs, 2, W] with the phase axis first (partition h*K + k); the residual is not loaded: the band's
    # pairs read band rows 1, 3, .. of the first conv's copies of X (conv_chain.skip_from_bands; one band here)
    assert "nisa.dma_copy(dst=Y_pairs[n, i1, i2, i0, i3], src=Y_band)" in numbered(c.source)
    assert numbered(c.source).count("i0, i1, i2, i3 = nl.mgrid[0:2, 0:64, 0:6, 0:10]") == 1  # Y's only: X is not loaded
    assert "X_skip" not in numbered(c.source) and "X_pairs" not in numbered(c.source)
    assert len(re.findall(r"tensor_tensor\([^\n]*X_band0\[:, 1:12:2\]", numbered(c.source))) == 1
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], resnet_ref(x, dt))



@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_row_pairs_resnet_block_final_relu(nki, dt):
    """56 columns: in 16 bits a band of U's row pairs takes two accumulation groups (<= 512 columns each; fp32
    bands are one group). 16 bits: the block's final relu is a VectorE max(x, 0) in each group, right after that
    group's residual add (relu_on_vector), and no relu runs over the band; fp32: the relu runs once over the whole
    band on ScalarE, after the residual adds and before the store (relu_per_band). The result is the same."""
    from compiler_helpers import compile_and_run

    text = RESNET.format(dt=dt).replace("H = 12, W = 10", "H = 20, W = 56").replace("N = 2", "N = 1")
    prog, c, inputs, out = compile_and_run(text, nki)
    lines = unwrap(numbered(c.source)).split("\n")
    groups = [i for i, ln in enumerate(lines) if re.match(r"\s*for y_g2 in ", ln)]
    band_relus = [i for i, ln in enumerate(lines) if "op=nl.relu" in ln and re.search(r"data=Y_band[,)]", ln)]
    maxes = [i for i, ln in enumerate(lines) if "tensor_scalar" in ln and "maximum" in ln and "Y_band[:, y_g2" in ln]
    adds = [i for i, ln in enumerate(lines) if "tensor_tensor" in ln and "Y_band[:, y_g2" in ln]
    stores = [i for i, ln in enumerate(lines) if re.search(r"dma_copy\(dst=Y_pairs.*src=Y_band\)", ln)]
    assert len(stores) >= 1  # (bands peeled: conv_chain.skip_from_bands)

    def indent(i: int) -> int:
        return len(lines[i]) - len(lines[i].lstrip())
    if dt == "f32":
        assert not groups and not maxes and len(band_relus) == len(stores)
        for r, st in zip(band_relus, stores):
            assert st - 3 <= r < st
    else:
        assert not band_relus and len(groups) == len(maxes) == len(adds) == len(stores)
        for g, add, mx, st in zip(groups, adds, maxes, stores):
            assert g < add < mx < st and indent(mx) == indent(add) > indent(g) == indent(st)
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], resnet_ref(x, dt))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_resnet_block_residual_from_the_first_convs_band_copies(nki, dt):
    """40 x 24: two row bands, both peeled for their halo. The first conv keeps each band's two copies of X in a
    buffer of its own (X_band0, X_band1) and the second conv's band b adds band rows 1, 3, .. of X_band<b> (copy
    h, on partitions h*64.., holds X one row further than copy 0, as output phase h needs): no residual load."""
    from compiler_helpers import compile_and_run

    text = RESNET.format(dt=dt).replace("H = 12, W = 10", "H = 40, W = 24")
    prog, c, inputs, out = compile_and_run(text, nki)
    src = unwrap(numbered(c.source))
    assert "X_skip" not in src and "X_pairs" not in src
    bodies = 1 + src.count("# ---- the last image")  # (16-bit: the last image built apart, conv_chain.peels_last)
    for band in range(2):
        assert re.search(rf"X_band{band} = nl\.(ndarray|zeros)\(\(128, \d+, 24\)", src)
        assert len(re.findall(rf"tensor_tensor\([^\n]*X_band{band}\[:, [^\]]*:2\]", src)) == bodies
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], resnet_ref(x, dt))


C3 = """\
kernel c3(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3]) -> Y
  default N = 2, C = 3, H = 38, W = 21, K = 32
  Y: {dt}[N, K, H - 2, W - 2]
  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_band_halves_first_layer_one_matmul_per_group(dt, monkeypatch):
    # (fp32 takes phased halves by default: test_conv_stem_phases.py; kept to halves here)
    monkeypatch.setattr(conv_pairs, "PHASES_MIN_BYTES", 8)
    prog, c, inputs, out = run(C3.format(dt=dt), "split Y.y, 12\n")
    code = numbered(c.source)
    # 2 halves x 9 taps x 3 channels: 18 copies, 7 partitions apart (their loads on all 16 DMA engines), 122
    # partitions; one matmul per band (3 bands, each in its own slot of the band buffer)
    assert code.count("nisa.nc_matmul(") == 3 and "(122, " in code and "X_band0[7:10]" in code
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], pad=(0, 0)))


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("band, slots", [(4, 5), (2, 6)])
def test_band_halves_slots_loop_and_remainder(dt, band, slots):
    # more bands (36 rows: 9 or 18) than slots: the band loop unrolled once per slot (band slots * y_b + j in slot
    # j), the remaining bands after it; the gaps between the copies are zeroed once, before the images' loop. With
    # batch 2 the next image's first bands reuse the slots of this image's last ones: 9 bands take 5 slots (4 left
    # over: slot 0 is rewritten 4 bands after its last use), 18 bands 6 (none left over), not 4 (1 or 2 bands apart)
    prog, c, inputs, out = run(C3.format(dt=dt), f"split Y.y, {band}\n")
    code = numbered(c.source)
    bands = 36 // band
    # (one pass of the unrolled loop is no loop; fp32 takes the phased halves, whose copies use the same slots)
    assert (f"{slots} at a time" in code) == (bands // slots > 1)
    assert code.count("nisa.nc_matmul(") == slots + bands % slots
    assert code.index(f"X_band{slots - 1}") < code.index("# ---- main")  # slots allocated before the images
    assert f"X_band{slots} " not in code
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], pad=(0, 0)))


STEM = """\
kernel stem(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 7, 7]) -> Y
  default N = 1, C = 3, H = 40, W = 37, K = 64
  let Ho = (H + 6 - 7) / 2 + 1, Wo = (W + 6 - 7) / 2 + 1
  Y: {dt}[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..7, s in 0..7:
      Y[n, k, y, x] += (X[n, c, 2*y + r - 3, 2*x + s - 3] ?? 0) * Wt[k, c, r, s]
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_band_halves_padded_stride_2_stem(dt):
    prog, c, inputs, out = run(STEM.format(dt=dt), "split Y.y, 4\n")
    code = numbered(c.source)
    # f32 takes the output rows' phases (conv_pairs.phases_pay, with the halo too): 9 row offsets x 4 tap columns
    # x 3 channels = 108 partitions, 2 matmuls per group (tap columns 0-3, 4-6: the second over 81 partitions), the
    # bands in slots. 16-bit keeps band halves: TensorE has time to spare, so 2 tap columns per copy (84
    # partitions, 4 matmuls: columns 0-1, 2-3, 4-5, 6, the last over 42) and a third fewer loads
    parts, matmuls, last = (108, 2, 81) if dt == "f32" else (84, 4, 42)
    assert f"Wt_T = nl.ndarray(({parts}, {matmuls}, " in code and f"[0:{last}, " in code
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], stride=2, pad=(3, 3)))


C3_EPILOGUE = """\
kernel c3r(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3], b: {dt}[K], S: {dt}[N, K, H - 2, W - 2]) -> Y
  default N = 2, C = 3, H = 26, W = 15, K = 64
  conv: {dt}[N, K, H - 2, W - 2]
  Y: {dt}[N, K, H - 2, W - 2]
  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:
    conv[n, k, y, x] = b[k]
    for c in 0..C, r in 0..3, s in 0..3:
      conv[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:
    Y[n, k, y, x] = relu(conv[n, k, y, x] + S[n, k, y, x])
"""


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_band_halves_bias_and_residual_on_interleaved_partitions(dt):
    # the halves' output channels interleave (partition 2k + h): the bias column and the residual band follow, and
    # the output band leaves in one DMA (3 bands of 8 rows, each in its band slot: 3 stores)
    prog, c, inputs, out = run(C3_EPILOGUE.format(dt=dt), "split Y.y, 8\n")
    code = numbered(c.source)
    assert "b_twice" in code and code.count("dst=Y_halves") == 3
    x = rounded(inputs, dt)
    conv = conv_ref(x["X"], x["Wt"], pad=(0, 0), bias=x["b"])
    if dt != "f32":  # conv is rounded to the program's dtype before the add
        conv = rounded({"c": conv}, dt)["c"]
    assert_matches(prog, "Y", out["Y"], (conv + x["S"]).clip(min=0))


@pytest.mark.parametrize("dt, copies", [("f32", 12), ("f16", 12), ("bf16", 12)])
def test_band_halves_tap_columns_per_copy_follow_the_dtype(dt, copies):
    # the first layer at its ResNet shape (224 x 224 out, compiled only): in fp32 TensorE is the tighter engine and
    # all 3 tap columns go into the copies, of 4 row offsets (phased halves: 12 copies); with 16-bit operands the
    # loads are, and 2 tap columns per copy of the halves' 6 tap rows (12 copies, 2 matmuls per group) move a third
    # fewer bytes than 3. Copies sit 128 // copies partitions apart.
    text = C3.format(dt=dt).replace("N = 2, C = 3, H = 38, W = 21, K = 32", "N = 1, C = 3, H = 226, W = 226, K = 64")
    c = compile_loaded(lang.load(text), None)
    parts = (copies - 1) * (128 // copies) + 3
    assert f"Wt_T = nl.ndarray(({parts}, " in numbered(c.source)


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_resnet_block_batch_1_last_band_regrouped(nki, dt):
    """At batch 1 the 16-bit block's second band (peeled: its residual reads the first conv's band copies) is
    regrouped on TensorE before its store, after its residual adds and relus (conv_pairs.regroups): its store is
    128 runs of half a band through Y seen as [N, K, bands, 2, BAND / 2, W], not 1,792 runs of one row; band 0
    keeps the row-pair store. From batch 2 on (TensorE the bound) only the last image's, built apart from the image
    loop (conv_chain.peels_last; test_conv_last_image.py)."""
    from compiler_helpers import compile_and_run

    text = RESNET.format(dt=dt).replace("H = 12, W = 10", "H = 40, W = 24")
    for n in (1, 2):
        prog, c, inputs, out = compile_and_run(text.replace("N = 2", f"N = {n}"), nki)
        src = unwrap(numbered(c.source))
        last = src.split("# ---- the last image")[-1]
        assert "Y_select" in src and "Y_rows" in last and ("the last image" in src) == (n == 2)
        assert len(re.findall(r"Y_halves", src)) >= 2
        x = rounded(inputs, dt)
        assert_matches(prog, "Y", out["Y"], resnet_ref(x, dt))
