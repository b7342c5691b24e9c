"""The MobileNetV2 block (1x1 expand, relu6, padded 3x3 depthwise, relu6, 1x1 project, skip connection): relu6 of a
contraction's operand (`min(relu(A[..] ?? 0), 6) * W[..]`) folds into the producer's eviction (relu, then a minimum;
both keep the padding's 0), and an initial value read from another tensor at the output's element
(`Y[..] = X[..]; Y[..] += ...`) is added on the eviction like a residual. Checked against NumPy (einsum, np.pad)
on the NKI interpreter for f32, f16 and bf16."""
from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

from compiler_helpers import assert_matches
from tilec.compiler import wrap
from tilec.compiler.fusers import Chain
from test_conv_depthwise import depthwise_ref
from test_conv_padded import NARROW, rounded, run

FAMILY = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "families" / "mobilenet_block.tl"


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_mobilenet_block(dt):
    text = FAMILY.read_text().replace("f32", dt).replace("C = 24, E = 144, H = 56, W = 56",
                                                           "C = 24, E = 144, H = 11, W = 9")
    prog, c, inputs, out = run(text.replace("N = 1", "N = 2"))
    x = rounded(inputs, dt)
    narrow = lambda v: v.astype(NARROW[dt]).astype(np.float64)  # noqa: E731
    a = narrow(np.einsum("ec,nchw->nehw", x["We"], x["X"]))
    b = narrow(depthwise_ref(np.minimum(np.maximum(a, 0), 6), x["Wd"]))
    y = x["X"] + np.einsum("ke,nehw->nkhw", x["Wp"], np.minimum(np.maximum(b, 0), 6))
    assert_matches(prog, "Y", out["Y"], y)


MATMUL_INIT = """\
kernel mm2(A: f32[M, K], B: f32[K, N], D: f32[M, N]) -> C
  default M = 200, K = 256, N = 96
  C: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = D[i, j]
    for k in 0..K:
      C[i, j] += A[i, k] * B[k, j]
"""


def test_matmul_starting_from_a_matrix():
    prog, c, inputs, out = run(MATMUL_INIT)
    assert "+ D" in c.stages["select"]
    x = rounded(inputs, "f32")
    assert_matches(prog, "C", out["C"], x["D"] + x["A"] @ x["B"])


RELU6_TWICE = """\
kernel r6(X: f32[C, H, W], W1: f32[K, C], W2: f32[K, K, 3, 3]) -> Y
  default C = 16, H = 8, W = 7, K = 32
  T: f32[K, H, W]
  Y: f32[K, H, W]
  for k in 0..K, y in 0..H, x in 0..W:
    T[k, y, x] = 0
    for c in 0..C:
      T[k, y, x] += X[c, y, x] * W1[k, c]
  for k in 0..K, y in 0..H, x in 0..W:
    Y[k, y, x] = 0
    for c in 0..K, r in 0..3, s in 0..3:
      Y[k, y, x] += min(6, relu(T[c, y + r - 1, x + s - 1] ?? 0)) * W2[k, c, r, s]
"""


def test_relu6_of_a_padded_operand_folds_into_its_producer():
    prog, c, inputs, out = run(RELU6_TWICE)
    x = rounded(inputs, "f32")
    t = np.minimum(np.maximum(np.einsum("kc,chw->khw", x["W1"], x["X"]), 0), 6)
    tp = np.pad(t, ((0, 0), (1, 1), (1, 1)))
    want = sum(np.einsum("kc,chw->khw", x["W2"][:, :, r, s], tp[:, r:r + 8, s:s + 7])
               for r in range(3) for s in range(3))
    assert_matches(prog, "Y", out["Y"], want)


def test_two_different_functions_of_one_operand_are_a_located_error():
    from tilec.compiler.api import compile_loaded
    from tilec.errors import TilecError
    from tilec.lang import api as lang
    text = RELU6_TWICE + """\
  Z: f32[K, H, W]
  for k in 0..K, y in 0..H, x in 0..W:
    Z[k, y, x] = 0
    for c in 0..K:
      Z[k, y, x] += relu(T[c, y, x]) * W3[k, c]
"""
    text = text.replace("-> Y", "-> Y, Z").replace("W2: f32[K, K, 3, 3])", "W2: f32[K, K, 3, 3], W3: f32[K, K])")
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(text))
    assert "read only under the same function" in str(e.value) and e.value.span is not None


# ---- the block kept on chip (build_mbblock.py): A and B never in HBM ------------------------------------------------

def conv2d(x, w, groups=1, pad=0):
    """torch.nn.functional.conv2d(x, w, padding=pad, groups=groups), stride 1, in float64: x [N, C, H, W],
    w [K, C / groups, R, S]; output channel k reads the input channels of its group."""
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    kg = k // groups
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = h + 2 * pad - r + 1, wd + 2 * pad - s + 1
    out = np.zeros((n, k, ho, wo))
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        for i in range(r):
            for j in range(s):
                out[:, g * kg:(g + 1) * kg] += np.einsum("kc,nchw->nkhw", w[g * kg:(g + 1) * kg, :, i, j],
                                                         xs[:, :, i:i + ho, j:j + wo])
    return out


def block_ref(x: dict, dt: str, residual: bool = True):
    """The MobileNetV2 block as torch computes it (expand 1x1, relu6, depthwise 3x3 padding 1 with groups = E,
    relu6, project 1x1, + the input), each stored tensor rounded to the program's dtype."""
    narrow = lambda v: v.astype(NARROW[dt]).astype(np.float64)  # noqa: E731
    relu6 = lambda v: np.minimum(np.maximum(v, 0), 6)  # noqa: E731
    e, c = x["We"].shape
    a = narrow(conv2d(x["X"], x["We"].reshape(e, c, 1, 1)))
    b = narrow(conv2d(relu6(a), x["Wd"].reshape(e, 1, 3, 3), groups=e, pad=1))
    y = conv2d(relu6(b), x["Wp"].reshape(-1, e, 1, 1))
    return y + x["X"] if residual else y


def block_text(dt: str, n: int, c: int, e: int, h: int, w: int, residual: bool = True) -> str:
    text = FAMILY.read_text().replace("f32", dt).replace("N = 1, C = 24, E = 144, H = 56, W = 56",
                                                           f"N = {n}, C = {c}, E = {e}, H = {h}, W = {w}")
    return text if residual else text.replace("Y[n, k, y, x] = X[n, k, y, x]", "Y[n, k, y, x] = 0")


def on_chip(c) -> bool:
    """A and B never allocated in HBM: the three convs built as one block."""
    from tilec.compiler.ir import Alloc, walk
    in_hbm = {s.buf.name for s in walk(c.result.kernel.body) if isinstance(s, Alloc) and s.buf.memory == "hbm"}
    return not {"A", "B"} & in_hbm and Chain("MobileNet block", ("A", "B", "Y")) in c.result.chains


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("n", [1, 2])
def test_block_on_chip(dt, n):
    # E = 200: not a multiple of 128, groups of channels and a smaller last group; H = 12: row blocks beside the
    # channels on the partitions (12 = 4 x 3 rows)
    prog, c, inputs, out = run(block_text(dt, n, 16, 200, 12, 10))
    assert on_chip(c)
    assert "row block" in c.source and "block-diagonal" in c.source
    assert_matches(prog, "Y", out["Y"], block_ref(rounded(inputs, dt), dt))


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_block_without_residual(dt):
    prog, c, inputs, out = run(block_text(dt, 2, 24, 144, 8, 7, residual=False))
    assert on_chip(c)
    assert_matches(prog, "Y", out["Y"], block_ref(rounded(inputs, dt), dt, residual=False))


@pytest.mark.parametrize("h, w", [(1, 5), (7, 1), (5, 3)])
def test_block_small_images(h, w):
    """One row, one column (the depthwise then falls back to its own kernel: a column halo), odd sizes."""
    prog, c, inputs, out = run(block_text("f32", 1, 8, 40, h, w))
    assert on_chip(c) == (w > 1)
    assert_matches(prog, "Y", out["Y"], block_ref(rounded(inputs, "f32"), "f32"))


def test_a_directive_keeps_the_convs_apart_and_explain_says_why():
    from tilec.compiler.api import explain
    text = block_text("f32", 1, 16, 72, 6, 5)
    prog, c, inputs, out = run(text, "tile Y.k, 8\n")
    assert not on_chip(c)
    assert_matches(prog, "Y", out["Y"], block_ref(rounded(inputs, "f32"), "f32"))
    assert "a directive names one of its convs" in explain(c)
    _, fused, _, _ = run(text)
    text = explain(fused)
    assert "never in HBM" in text and "A -> B -> Y" in text


def test_generated_kernel_keeps_a_and_b_on_chip():
    """generated/mobilenet_block.py (the example at its default sizes) allocates no HBM scratch."""
    kernel = (FAMILY.parents[2] / "generated" / "mobilenet_block.py").read_text()
    assert "nl.hbm)" not in kernel.replace("ident_hbm = nl.ndarray((128, 129), dtype=nl.float32, buffer=nl.hbm)", "")


def test_block_with_a_short_last_row_chunk(monkeypatch):
    """Rows of 100 columns: PSUM chunks of 5 rows, a 6-row block is a chunk of 5 rows and one of 1; each chunk's
    project sum has its own PSUM bank while every group's B is added (the layout forced: 2 row blocks)."""
    from tilec.compiler import build_mbblock

    monkeypatch.setattr(build_mbblock, "layouts", lambda e, d, p, elem: [build_mbblock.BlockLayout(2, 6, 24)])
    prog, c, inputs, out = run(block_text("f32", 2, 8, 40, 12, 100))
    assert on_chip(c) and "4 taps" not in c.source
    lines = wrap.unwrap(c.source).splitlines()
    heads = [i for i, line in enumerate(lines) if line.strip().startswith("# ---- Y += Wp[:, e group")]
    assert len(heads) == 2 * 2  # (2 images, 2 groups)
    for i in heads:  # each group's project: a matmul into each chunk's sum, two PSUM tiles
        tiles = [m.group(1) or m.group(2) for line in lines[i + 1:i + 3] for m in [re.search(
            r"nc_matmul\(dst=(\w+).*stationary=Wp_bd|^\s*(\w+)[^=]* \+?= nisa\.nc_matmul\(Wp_bd", line)] if m]
        assert len(set(tiles)) == 2, lines[i:i + 3]
    assert_matches(prog, "Y", out["Y"], block_ref(rounded(inputs, "f32"), "f32"))


def test_block_that_does_not_fit_says_why():
    from tilec.compiler.api import explain
    prog, c, inputs, out = run(block_text("f32", 1, 16, 96, 112, 112))
    assert not on_chip(c)
    assert "no layout of its bands fits SBUF and PSUM (the smallest" in explain(c)


def test_block_of_five_images_and_many_groups(monkeypatch):
    """Five images: a loop over pairs of images (one pipeline each), then the last image; 1100 expanded channels:
    more groups than the pipeline unrolls (a loop over pairs of groups per image). (Pairs forced: the default tries 4
    images per pipeline first, test_mbblock_evict.)"""
    from tilec.compiler import build_mbblock
    from tilec.compiler.build_mbblock import UNROLL_GROUPS
    monkeypatch.setattr(build_mbblock, "IMAGE_TRIES", (2,))

    for e in (200, 1100):
        prog, c, inputs, out = run(block_text("f32", 5, 8, e, 4, 5))
        assert on_chip(c)
        assert ("pairs of groups" in c.source) == (e > UNROLL_GROUPS * 128)
        assert ("pairs of images" in c.source) == (e <= UNROLL_GROUPS * 128)
        assert_matches(prog, "Y", out["Y"], block_ref(rounded(inputs, "f32"), "f32"))


BIASED = """\
kernel mb_bias(X: {dt}[N, C, H, W], We: {dt}[E, C], be: {dt}[E], Wd: {dt}[E, 3, 3], bd: {dt}[E], Wp: {dt}[C, E]) -> Y
  default N = 2, C = 16, E = 200, H = 12, W = 10
  A: {dt}[N, E, H, W]
  B: {dt}[N, E, H, W]
  Y: {dt}[N, C, H, W]
  for n in 0..N, e in 0..E, y in 0..H, x in 0..W:
    A[n, e, y, x] = be[e]
    for c in 0..C:
      A[n, e, y, x] += X[n, c, y, x] * We[e, c]
  for n in 0..N, e in 0..E, y in 0..H, x in 0..W:
    B[n, e, y, x] = bd[e]
    for r in 0..3, s in 0..3:
      B[n, e, y, x] += min(relu(A[n, e, y + r - 1, x + s - 1] ?? 0), 6) * Wd[e, r, s]
  for n in 0..N, k in 0..C, y in 0..H, x in 0..W:
    Y[n, k, y, x] = X[n, k, y, x]
    for e in 0..E:
      Y[n, k, y, x] += min(relu(B[n, e, y, x]), 6) * Wp[k, e]
"""


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_block_with_batch_norm_biases(dt):
    """Batch norm folded into the expand and depthwise convs as biases: the expand's bias makes the rows outside X
    nonzero before the padding is restored (zeros copied over them), the depthwise's is added on its eviction."""
    prog, c, inputs, out = run(BIASED.format(dt=dt))
    assert on_chip(c)
    x = rounded(inputs, dt)
    narrow = lambda v: v.astype(NARROW[dt]).astype(np.float64)  # noqa: E731
    relu6 = lambda v: np.minimum(np.maximum(v, 0), 6)  # noqa: E731
    e, ch = x["We"].shape
    a = narrow(conv2d(x["X"], x["We"].reshape(e, ch, 1, 1)) + x["be"][None, :, None, None])
    b = narrow(conv2d(relu6(a), x["Wd"].reshape(e, 1, 3, 3), groups=e, pad=1) + x["bd"][None, :, None, None])
    want = conv2d(relu6(b), x["Wp"].reshape(-1, e, 1, 1)) + x["X"]
    assert_matches(prog, "Y", out["Y"], want)
