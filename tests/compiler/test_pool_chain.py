"""A conv -> overlapping window pool chain kept on chip (pool_chain.py; issue 13, the ResNet stem: conv 7x7 s2 pad 3
then max pool 3x3 s2 pad 1): the conv's eviction writes each image into SBUF, the pool's bands read their rows and
the halo rows there. Every kernel runs on the NKI interpreter against NumPy (the conv as one einsum per tap over
np.pad, test_conv_padded.conv_ref; the pool as test_pool_window.reference, on the conv's output rounded to the
program's dtype as it is stored), f32/f16/bf16, one and two channel tiles, batch 1 and 2."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from kernel_numbers import numbered
from test_conv_padded import NARROW, conv_ref
from test_pool_window import reference
from tilec.compiler.api import compile_loaded, explain
from tilec.errors import TilecError
from tilec.lang import api as lang

STEM = """\
# ResNet stem: conv 7x7 s2 pad 3 then max pool 3x3 s2 pad 1.
kernel stem_pool(X: f32[N, C, H, W], Wt: f32[K, C, 7, 7]) -> Y
  default N = 1, C = 3, H = 224, W = 224, K = 64
  let Ho = (H + 6 - 7) / 2 + 1, Wo = (W + 6 - 7) / 2 + 1
  let Po = (Ho + 2 - {r}) / 2 + 1, Qo = (Wo + 2 - {r}) / 2 + 1
  T: f32[N, K, Ho, Wo]
  Y: f32[N, K, Po, Qo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    T[n, k, y, x] = 0
    for c in 0..C, r in 0..7, s in 0..7:
      T[n, k, y, x] += (X[n, c, 2*y + r - 3, 2*x + s - 3] ?? 0) * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, i in 0..Po, j in 0..Qo:
    Y[n, k, i, j] = {init}
    for p in 0..{r}, q in 0..{r}:
      Y[n, k, i, j] {update} T[n, k, 2*i + p - 1, 2*j + q - 1] ?? {fill}
{tail}"""


SBUF = "  schedule:\n    place T, sbuf\n"
PLAIN = """\
# conv 3x3 pad 1 then max pool 3x3 s2 pad 1.
kernel conv_pool(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3]) -> Y
  let Po = (H + 2 - 3) / 2 + 1, Qo = (W + 2 - 3) / 2 + 1
  T: f32[N, K, H, W]
  Y: f32[N, K, Po, Qo]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    T[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      T[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, i in 0..Po, j in 0..Qo:
    Y[n, k, i, j] = -inf
    for p in 0..3, q in 0..3:
      Y[n, k, i, j] max= T[n, k, 2*i + p - 1, 2*j + q - 1] ?? -inf
"""


def stem(kind: str = "max", r: int = 3, dtype: str = "f32", schedule: str = "") -> str:
    init, update, fill = ("-inf", "max=", "-inf") if kind == "max" else ("0", "+=", "0")
    divide = f"    Y[n, k, i, j] = S[n, k, i, j] / {r * r}\n" if kind == "avg" else ""
    text = STEM.format(r=r, init=init, update=update, fill=fill, tail=divide + schedule)
    if kind == "avg":  # a window sum S, then Y = S / r^2 (count_include_pad=True)
        text = text.replace("  Y: f32[N, K, Po, Qo]\n", "  S: f32[N, K, Po, Qo]\n  Y: f32[N, K, Po, Qo]\n")
        text = text.replace("    Y[n, k, i, j] = 0\n", "    S[n, k, i, j] = 0\n")
        text = text.replace("      Y[n, k, i, j] += T", "      S[n, k, i, j] += T")
    return text if dtype == "f32" else text.replace("f32[", f"{dtype}[")


def run(text: str, dtype: str, seed: int = 7, **sizes: int):
    """Compile and run `text` (the stem, or PLAIN: a 3x3 s1 pad 1 conv) on the interpreter, Y against NumPy."""
    prog = lang.load(text, sizes)
    compiled = compile_loaded(prog, None)
    rng = np.random.default_rng(seed)
    x = {t.name: rng.standard_normal(t.shape).astype(NARROW[dtype]) for t in prog.inputs}
    got = compiled.run(**x)["Y"]
    stride, pad = (2, 3) if "stem_pool" in text else (1, 1)
    t = conv_ref(x["X"], x["Wt"], stride=stride, pad=(pad, pad)).astype(NARROW[dtype]).astype(np.float32)
    kind = "max" if "max=" in text else "avg"
    r = 3 if "0..3, q" in text else 2
    want = reference(t, kind, r, 2, 1)
    assert np.shape(got) == want.shape
    assert_matches(prog, "Y", got, want)
    return compiled


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("sizes", [dict(N=1, K=64, H=42, W=36), dict(N=2, K=160, H=30, W=34)])
def test_stem_conv_then_overlapping_max_pool_on_chip(dtype, sizes):
    """One channel tile (64) and two (160 = 2 x 80), batch 1 and 2, odd pooled sizes (the last window padded).
    (An odd number of conv rows: the f32 stem of even rows takes the row phases instead, test_stem_chain.py.)"""
    c = run(stem("max", 3, dtype, SBUF), dtype, C=3, **sizes)
    assert "T_img" in c.source and "T_v" not in c.source  # T never reaches HBM


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_conv_then_padded_average_pool_on_chip(dtype):
    """A 3x3 s2 pad 1 sum pool divided by 9 reading the conv's image in place."""
    c = run(stem("avg", 3, dtype, SBUF), dtype, N=1, C=3, K=64, H=28, W=28)
    assert "T_img" in c.source and "T_v" not in c.source


def test_place_hbm_keeps_the_round_trip():
    """`place T, hbm` stores T and the pool loads it back (the kernel still matches NumPy)."""
    c = run(stem("max", 3, "f32", "  schedule:\n    place T, hbm\n"), "f32", N=1, C=3, K=64, H=28, W=28)
    assert "T_v" in c.source


def test_explain_says_where_the_intermediate_lives():
    """Forced: on chip, and what it saves and gives up; by default the stem's 64 channels keep T in HBM (the conv's
    row halves and the pool's row blocks use all 128 partitions) and explain says why and how to force it. (15 conv
    columns: with an even number the stem takes the row phases instead, test_stem_chain.py.)"""
    prog = lang.load(stem("max", 3, "f32", SBUF), dict(N=1, C=3, K=64, H=28, W=29))
    out = " ".join(explain(compile_loaded(prog, None)).split())
    assert "T SBUF, one image at a time (conv -> pool chain) `place T, sbuf`: conv T (tl:9) evicts each image" in out
    assert "pool Y (tl:13)'s bands read their rows and halo rows there; this saves T's store and reload" in out
    assert "but on chip T's plan puts two parts of its output rows on the two partition halves" in out
    out = " ".join(explain(compile_loaded(lang.load(stem("max", 3, "f32"), dict(N=1, C=3, K=64, H=28, W=29)),
                                          None)).split())
    assert "T HBM scratch (not fused: written, then read back) through HBM by default" in out
    assert "`place T, sbuf` forces it" in out


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("batch", [1, 2, 3, 4])
def test_a_chain_that_gives_up_nothing_is_on_chip_by_default(dtype, batch):
    """128 output channels (no row pairs, the pool needs no row blocks): on chip without a directive, the pool one
    image behind the conv from batch 2 on (two image buffers; batch 2 without the loop over pairs of images, 3 with
    one odd step written out, 4 with both)."""
    c = run(PLAIN.replace("f32[", f"{dtype}["), dtype, N=batch, C=16, K=128, H=20, W=18)
    assert "T_img" in c.source and "T_v" not in c.source
    assert ("T_img2" in c.source) == (batch > 1)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_an_intermediate_that_is_also_an_output_is_stored_from_the_image(dtype):
    """T an output too: the conv stores each band of T from the on-chip image, the pool reads the image; both
    outputs match NumPy, and explain says only the reload is saved."""
    text = PLAIN.replace("-> Y", "-> T, Y").replace("f32[", f"{dtype}[")
    prog = lang.load(text, dict(N=2, C=16, K=128, H=20, W=18))
    c = compile_loaded(prog, None)
    x = {t.name: np.random.default_rng(3).standard_normal(t.shape).astype(NARROW[dtype]) for t in prog.inputs}
    out = c.run(**x)
    t = conv_ref(x["X"], x["Wt"], stride=1, pad=(1, 1))
    assert_matches(prog, "T", out["T"], t)
    assert_matches(prog, "Y", out["Y"], reference(t.astype(NARROW[dtype]).astype(np.float32), "max", 3, 2, 1))
    assert "T_img" in c.source
    text = " ".join(explain(c).split())
    assert "T HBM (output) and SBUF, one image at a time (conv -> pool chain)" in text
    assert "(and stored: T is also an output); this saves T's reload (" in text


def test_the_pools_own_directives_keep_its_standalone_form():
    """`split Y.i, 4` on the pool: through HBM by default (the directive is its standalone form's), and explain
    says so; with `place T, sbuf` too, on chip with bands of 4 pooled rows. Both match NumPy."""
    sizes = dict(N=1, C=16, K=128, H=20, W=18)
    c = run(PLAIN + "  schedule:\n    split Y.i, 4\n", "f32", **sizes)
    assert "T_img" not in c.source and "the pool has its own directives (`split Y...`)" in " ".join(explain(c).split())
    c = run(PLAIN + "  schedule:\n    split Y.i, 4\n    place T, sbuf\n", "f32", **sizes)
    assert "T_img" in c.source and "Y_band = nl.ndarray((128, 4, 9)" in numbered(c.source)


def test_forcing_sbuf_when_the_image_does_not_fit_is_a_located_error():
    """One image of T over half of SBUF: `place T, sbuf` is refused at the directive, saying why."""
    prog = lang.load(PLAIN + SBUF.replace("    place", "    place"), dict(N=1, C=16, K=128, H=200, W=200))
    with pytest.raises(TilecError) as err:
        compile_loaded(prog, None)
    assert "T cannot stay in SBUF" in err.value.message and "one image of T takes" in err.value.message
    assert err.value.span is not None
