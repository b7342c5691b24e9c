"""conv -> [relu ->] conv chains kept on chip (issue 13 item 6, conv_chain.py): the first conv's eviction writes an
SBUF image laid out as the second conv's input (zero halo when padded), the second conv's matmuls read it in place.
Every case runs on the NKI interpreter and is compared with NumPy (np.pad + one einsum per tap, test_conv_padded's
conv_ref), never with tilec's own evaluator; the kernels are checked to really keep T off HBM."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import EXAMPLES, assert_matches
from test_conv_padded import NARROW, conv_ref
from tilec.compiler.api import compile_loaded, explain
from tilec.errors import TilecError
from tilec.lang import api as lang
from kernel_numbers import numbered

# the example's ResNet basic block (padded 3x3 conv + bias -> relu -> conv + bias + residual -> relu), with the
# dtype and sizes as format fields
RESNET = re.sub(r"  default .*", "  default N = {n}, C = {c}, H = {h}, W = {w}",
                (EXAMPLES / "resnet_block.tl").read_text()).replace("f32", "{dt}")

CHAIN = """\
kernel chain(X: {dt}[N, C, H, W], W1: {dt}[C, C, 3, 3], W2: {dt}[C, C, 3, 3]) -> {outs}
  default N = {n}, C = {c}, H = {h}, W = {w}
  T: {dt}[N, C, H - 2, W - 2]
  Y: {dt}[N, C, H - 4, W - 4]
{extra_decl}  for n in 0..N, k in 0..C, y in 0..H - 2, x in 0..W - 2:
    T[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      T[n, k, y, x] += X[n, c, y + r, x + s] * W1[k, c, r, s]
    T[n, k, y, x] = relu(T[n, k, y, x])
  for n in 0..N, k in 0..C, y in 0..H - 4, x in 0..W - 4:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += T[n, c, y + r, x + s] * W2[k, c, r, s]
{extra}"""


def chain(dt="f32", n=2, c=136, h=12, w=10, outs="Y", extra_decl="", extra="") -> str:
    return CHAIN.format(dt=dt, n=n, c=c, h=h, w=w, outs=outs, extra_decl=extra_decl, extra=extra)


def compile_text(text: str, schedule: str = ""):
    return compile_loaded(lang.load(text + (f"  schedule:\n    {schedule}\n" if schedule else "")))


def inputs_for(prog, seed: int = 5) -> dict[str, np.ndarray]:
    """X in [0, 1), weights in +-1/sqrt(taps x channels) and biases in +-0.5: T, U and Y stay near 1 (f16 holds
    them; [0, 1) weights overflow it at 64 channels)."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in prog.inputs:
        if t.name == "X":
            out[t.name] = rng.random(t.shape, dtype=np.float32)
        elif len(t.shape) == 4:
            scale = 1 / np.sqrt(t.shape[1] * t.shape[2] * t.shape[3])
            out[t.name] = rng.uniform(-scale, scale, t.shape).astype(np.float32)
        else:
            out[t.name] = rng.uniform(-0.5, 0.5, t.shape).astype(np.float32)
    return out


def narrow(v: np.ndarray, dt: str) -> np.ndarray:
    """v rounded to dt, as float64 (what a store of a dt tensor keeps)."""
    return v.astype(NARROW[dt]).astype(np.float64)


def run(text: str, schedule: str = ""):
    prog = lang.load(text + (f"  schedule:\n    {schedule}\n" if schedule else ""))
    c = compile_loaded(prog)
    inputs = inputs_for(prog)
    x = {k: narrow(v, prog.tensors[k].dtype) for k, v in inputs.items()}
    return prog, c, x, c.run(**inputs)


def on_chip(source: str, name: str = "T") -> bool:
    """The kernel keeps `name` in SBUF: its image buffer exists and no HBM tensor of that name is allocated."""
    return f"{name}_img = nl." in source and not re.search(rf"\b{name} = nl\.ndarray\([^\n]*nl\.hbm", source)


def resnet_ref(x: dict, dt: str) -> np.ndarray:
    t = narrow(np.maximum(conv_ref(x["X"], x["W1"], bias=x["b1"]), 0), dt)
    u = narrow(conv_ref(t, x["W2"], bias=x["b2"]), dt)
    return np.maximum(u + x["X"], 0)


@pytest.mark.parametrize("dt, n, c, h, w", [
    ("f32", 2, 64, 20, 12), ("f32", 1, 96, 14, 9), ("f32", 1, 160, 9, 7),  # 160: a whole tile + a ragged one
    ("f16", 1, 96, 14, 9), ("f16", 2, 64, 10, 8), ("bf16", 1, 64, 20, 12), ("bf16", 2, 96, 10, 8)])
def test_resnet_block_on_chip_matches_numpy(dt, n, c, h, w):
    """The padded block (bias, relu, residual add of X, relu) with T forced on chip: T's image in SBUF with its
    zero halo, no HBM T, no band of T loaded."""
    prog, comp, x, out = run(RESNET.format(dt=dt, n=n, c=c, h=h, w=w), "place T, sbuf")
    assert on_chip(numbered(comp.source))
    assert "src=T[" not in numbered(comp.source) and "src=T," not in numbered(comp.source)
    assert "T_img = nl.zeros" in comp.source or "nisa.memset(dst=T_img" in comp.source  # the halo is zero
    assert_matches(prog, "Y", out["Y"], resnet_ref(x, dt))


def test_resnet_block_batch_8_on_chip():
    """Eight images, one loop over them for both convs (T's image allocated per image: two in flight)."""
    prog, comp, x, out = run(RESNET.format(dt="f32", n=8, c=64, h=6, w=6), "place T, sbuf")
    assert on_chip(numbered(comp.source))
    assert re.search(r"for n in nl\.affine_range\(8\):", numbered(comp.source))
    assert_matches(prog, "Y", out["Y"], resnet_ref(x, "f32"))


@pytest.mark.parametrize("dt, n", [("f32", 2), ("f32", 1), ("f16", 2), ("bf16", 1)])
def test_conv_relu_conv_on_chip_matches_numpy(dt, n):
    """Unpadded (the conv_relu_conv family) with 136 channels (a ragged second channel tile): on chip by default
    at this size, as `place T, sbuf` forces."""
    for schedule in ("", "place T, sbuf"):
        prog, comp, x, out = run(chain(dt, n), schedule)
        assert on_chip(numbered(comp.source))
        t = narrow(np.maximum(conv_ref(x["X"], x["W1"], pad=(0, 0)), 0), dt)
        assert_matches(prog, "Y", out["Y"], conv_ref(t, x["W2"], pad=(0, 0)))


@pytest.mark.parametrize("dt, text, swapped", [
    ("f32", RESNET.format(dt="f32", n=2, c=64, h=20, w=12), True),  # padded: the copies start at row -1
    ("f32", chain("f32", 2, 64, 16, 12), False), ("f32", chain("f32", 1, 64, 12, 9), False),  # unpadded: row 0
    # 16-bit (a conv on its own has no row pairs there, a chain takes them: pairs_16)
    ("bf16", RESNET.format(dt="bf16", n=1, c=64, h=20, w=12), True),
    ("f16", RESNET.format(dt="f16", n=2, c=64, h=10, w=8), True), ("bf16", chain("bf16", 2, 64, 14, 10), False)])
def test_row_pairs_stay_paired_on_chip(dt, text, swapped):
    """64 channels: both convs keep (or, in 16 bits, take) their row pairs. The producer's two partition halves
    (even and odd rows) are evicted into the two copies of T the consumer's pairs read, only the rows they read
    (one in two): no store, no reload; with a padded read the halves land one index apart (two evictions)."""
    prog, comp, x, out = run(text)
    c = prog.tensors["T"].shape[1]
    assert on_chip(comp.source) and re.search(rf"T_img = nl\.(ndarray|zeros)\(\({2 * c}, ", numbered(comp.source))
    evictions = [ln for ln in numbered(comp.source).splitlines() if "nisa.activation" in ln and "T_img[" in ln]
    assert len(evictions) == (2 if swapped else 1), evictions
    if "b1" in x:
        want = resnet_ref(x, dt)
    else:
        want = conv_ref(narrow(np.maximum(conv_ref(x["X"], x["W1"], pad=(0, 0)), 0), dt), x["W2"], pad=(0, 0))
    assert_matches(prog, "Y", out["Y"], want)


@pytest.mark.parametrize("dt, text, copies", [
    ("f32", RESNET.format(dt="f32", n=2, c=32, h=12, w=10), 4), ("f16", RESNET.format(dt="f16", n=1, c=32, h=9,
                                                                                       w=11), 4)])
def test_folded_taps_read_copies_the_producer_writes(dt, text, copies):
    """The consumer folds filter taps into its contraction (32 channels: 4 taps): the producer's stationary
    repeats its output channels once per copy and its eviction writes each copy of T at its tap shift, so the
    consumer keeps its folded matmuls. (64 channels in 16 bits fold 2 taps, but a chain gives them row pairs.)"""
    prog, comp, x, out = run(text)
    c = prog.tensors["T"].shape[1]
    source = numbered(comp.source)
    assert on_chip(source) and re.search(rf"T_img = nl\.(ndarray|zeros)\(\({copies * c}, ", source)
    evictions = [ln for ln in numbered(comp.source).splitlines() if "nisa.activation" in ln and "T_img[" in ln]
    assert len(evictions) == copies, evictions
    if "b1" in x:
        want = resnet_ref(x, dt)
    else:
        want = conv_ref(narrow(np.maximum(conv_ref(x["X"], x["W1"], pad=(0, 0)), 0), dt), x["W2"], pad=(0, 0))
    assert_matches(prog, "Y", out["Y"], want)


def test_folded_copy_of_halo_only_is_not_evicted():
    """One column, padded, 32 channels in bf16 (4 copies): copy 2 (two columns right) holds only halo. Its
    eviction once wrote a column of it anyway (a slice of 0 columns; found by the block family of the fuzzer)."""
    prog, comp, x, out = run(RESNET.format(dt="bf16", n=1, c=32, h=10, w=1))
    assert on_chip(numbered(comp.source)) and re.search(r"T_img = nl\.(ndarray|zeros)\(\(128, ", numbered(comp.source))
    evictions = [ln for ln in numbered(comp.source).splitlines() if "nisa.activation" in ln and "T_img[" in ln]
    assert len(evictions) == 3, evictions
    assert_matches(prog, "Y", out["Y"], resnet_ref(x, "bf16"))


@pytest.mark.parametrize("c", [136, 64])
def test_t_also_an_output_is_stored_from_the_on_chip_image(c):
    """T also a kernel output: stored from the image (plain layout at 136 channels, paired at 64)."""
    prog, comp, x, out = run(chain(outs="Y, T", c=c), "place T, sbuf")
    assert "T_img" in comp.source and re.search(r"nisa\.dma_copy\(dst=T\[[^\n]*src=T_img", comp.source)
    t = np.maximum(conv_ref(x["X"], x["W1"], pad=(0, 0)), 0)
    assert_matches(prog, "T", out["T"], t)
    assert_matches(prog, "Y", out["Y"], conv_ref(t, x["W2"], pad=(0, 0)))
    reason = " ".join(explain(comp).split())
    assert "(and stored: T is also an output)" in reason


def test_t_read_by_a_third_op_is_stored_too():
    extra = ("  for n in 0..N, k in 0..C, y in 0..H - 2, x in 0..W - 2:\n"
             "    S[n, k, y, x] = T[n, k, y, x] * 2\n")
    text = chain(outs="Y, S", extra_decl="  S: f32[N, C, H - 2, W - 2]\n", extra=extra)
    for schedule in ("", "place T, sbuf"):
        prog, comp, x, out = run(text, schedule)
        assert "T_img" in numbered(comp.source) and re.search(r"T = nl\.ndarray\([^\n]*nl\.hbm", numbered(comp.source))
        t = np.maximum(conv_ref(x["X"], x["W1"], pad=(0, 0)), 0)
        assert_matches(prog, "S", out["S"], 2 * t)
        assert_matches(prog, "Y", out["Y"], conv_ref(t, x["W2"], pad=(0, 0)))
        assert "(and stored: T is also read by another op)" in " ".join(explain(comp).split())


def test_place_hbm_keeps_the_round_trip():
    prog, comp, x, out = run(chain(), "place T, hbm")
    assert not on_chip(numbered(comp.source)) and "T_img" not in numbered(comp.source)
    t = np.maximum(conv_ref(x["X"], x["W1"], pad=(0, 0)), 0)
    assert_matches(prog, "Y", out["Y"], conv_ref(t, x["W2"], pad=(0, 0)))


def test_place_sbuf_of_a_crop_is_a_located_error():
    """The second conv reads T from its second row on: not the whole image, so T cannot be its input image."""
    text = chain().replace("T[n, c, y + r, x + s]", "T[n, c, y + r + 1, x + s]").replace(
        "Y: f32[N, C, H - 4, W - 4]", "Y: f32[N, C, H - 5, W - 4]").replace(
        "y in 0..H - 4", "y in 0..H - 5")
    lines = text.count("\n")
    with pytest.raises(TilecError) as e:
        compile_text(text, "place T, sbuf")
    msg = str(e.value)
    assert f"<string>:{lines + 2}:5: error: T cannot stay in SBUF: conv Y (tl:11) reads T" in msg
    assert "it cannot stay on chip: the conv reading T starts past its first row or column (a crop)" in msg
    assert "^" * len("place T, sbuf") in msg and "write `place T, hbm`" in msg
    assert not on_chip(numbered(compile_text(text).source))  # the default goes through HBM


def test_place_sbuf_too_big_is_a_located_error_and_the_default_falls_back():
    """128 channels of 200 x 200 f32: one image of T is 154 KiB per partition, more than the budget leaves."""
    text = chain(n=1, c=128, h=202, w=202)
    lines = text.count("\n")
    with pytest.raises(TilecError) as e:
        compile_text(text, "place T, sbuf")
    msg = str(e.value)
    assert f"<string>:{lines + 2}:5: error: T cannot stay in SBUF:" in msg
    assert re.search(r"the chain needs \d+ KiB of SBUF per partition with one image of T on chip", msg)
    comp = compile_text(text)
    assert not on_chip(numbered(comp.source))
    assert "goes through HBM" in " ".join(explain(comp).split())
