"""Pools whose window axes have dimensions after them (pool_axes.py, build_pool_axes.py): NHWC max / min / average /
sum pools of any window, stride and padding, compiled, run on the NKI interpreter and compared with NumPy (float64
windows over an identity-padded copy of X; independent of tilec), f32 / f16 / bf16, at sizes whose row groups take
several partition tiles, with column blocks on the partitions and without, averages that exclude the padding, and
the errors of what is not built."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import assert_matches
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
OPS = {"max": ("max=", "-inf"), "min": ("min=", "inf"), "sum": ("+=", "0"), "avg": ("+=", "0")}


def program(kind: str, dtype: str, shape: str, sizes: dict[str, int], win: tuple[int, int], stride: tuple[int, int],
            pad: tuple[int, int]) -> str:
    """shape: "nhwc" (X[N, H, W, C]), "hwc" (X[H, W, C]) or "nhwgc" (two dimensions after the window axes)."""
    (r, q), (sy, sx), (py, px) = win, stride, pad
    ho, wo = f"(H + {2 * py} - {r}) / {sy} + 1", f"(W + {2 * px} - {q}) / {sx} + 1"
    lead = {"nhwc": ["N"], "hwc": [], "nhwgc": ["N"]}[shape]
    tail = {"nhwc": ["C"], "hwc": ["C"], "nhwgc": ["G", "C"]}[shape]
    lv = [d.lower() for d in lead]
    tv = [d.lower() for d in tail]
    op, init = OPS[kind]
    fill = {"max": "-inf", "min": "inf", "sum": "0", "avg": "0"}[kind]
    read = f"X[{', '.join(lv + [f'{sy} * y + p - {py}', f'{sx} * x + q - {px}'] + tv)}]"
    read = f"({read} ?? {fill})" if py or px else read
    value = f"{read} / {r * q}" if kind == "avg" else read
    loops = ", ".join([f"{v} in 0..{d}" for v, d in zip(lv, lead)] + [f"y in 0..{ho}", f"x in 0..{wo}"] +
                      [f"{v} in 0..{d}" for v, d in zip(tv, tail)])
    out = f"Y[{', '.join(lv + ['y', 'x'] + tv)}]"
    return "\n".join([f"kernel pa(X: {dtype}[{', '.join(lead + ['H', 'W'] + tail)}]) -> Y",
                      "  default " + ", ".join(f"{k} = {v}" for k, v in sizes.items()),
                      f"  Y: {dtype}[{', '.join(lead + [ho, wo] + tail)}]",
                      f"  for {loops}:", f"    {out} = {init}",
                      f"    for p in 0..{r}, q in 0..{q}:", f"      {out} {op} {value}"]) + "\n"


def exclude_program(dtype: str, sizes: dict[str, int], win, stride, pad) -> str:
    """An NHWC average whose windows divide by their taps inside X (torch's count_include_pad=False), the count
    written with the loop variables."""
    (r, q), (sy, sx), (py, px) = win, stride, pad
    ho, wo = f"(H + {2 * py} - {r}) / {sy} + 1", f"(W + {2 * px} - {q}) / {sx} + 1"
    count = f"((min({sy} * y + {r - py}, H) - max({sy} * y - {py}, 0)) * " \
            f"(min({sx} * x + {q - px}, W) - max({sx} * x - {px}, 0)))"
    return "\n".join([f"kernel pe(X: {dtype}[N, H, W, C]) -> Y",
                      "  default " + ", ".join(f"{k} = {v}" for k, v in sizes.items()),
                      f"  S: f32[N, {ho}, {wo}, C]", f"  Y: {dtype}[N, {ho}, {wo}, C]",
                      f"  for n in 0..N, y in 0..{ho}, x in 0..{wo}, c in 0..C:", "    S[n, y, x, c] = 0",
                      f"    for p in 0..{r}, q in 0..{q}:",
                      f"      S[n, y, x, c] += X[n, {sy} * y + p - {py}, {sx} * x + q - {px}, c] ?? 0",
                      f"    Y[n, y, x, c] = S[n, y, x, c] / {count}"]) + "\n"


def reference(x: np.ndarray, kind: str, at: int, win, stride, pad) -> np.ndarray:
    """Windows over axes at, at + 1 of X (float64), the padding the reduction's identity."""
    (r, q), (sy, sx), (py, px) = win, stride, pad
    ident = {"max": -np.inf, "min": np.inf, "sum": 0.0, "avg": 0.0}[kind]
    widths = [(0, 0)] * x.ndim
    widths[at], widths[at + 1] = (py, py), (px, px)
    xp = np.pad(x.astype(np.float64), widths, constant_values=ident)
    ho, wo = (xp.shape[at] - r) // sy + 1, (xp.shape[at + 1] - q) // sx + 1
    parts = []
    for p in range(r):
        for t in range(q):
            idx = [slice(None)] * x.ndim
            idx[at] = slice(p, p + sy * (ho - 1) + 1, sy)
            idx[at + 1] = slice(t, t + sx * (wo - 1) + 1, sx)
            parts.append(xp[tuple(idx)])
    stack = np.stack(parts)
    if kind in ("sum", "avg"):
        return stack.sum(0) / (r * q if kind == "avg" else 1)
    return stack.max(0) if kind == "max" else stack.min(0)


def run(kind, dtype, shape, sizes, win, stride, pad, nki="0.6", seed=3):
    prog = lang.load(program(kind, dtype, shape, sizes, win, stride, pad))
    compiled = compile_loaded(prog, None, nki)
    assert "over axes with" in compiled.source  # (build_pool_axes's kernel, not another rule's)
    x = np.random.default_rng(seed).standard_normal(prog.tensors["X"].shape).astype(NP[dtype])
    got = compiled.run(X=x)["Y"]
    want = reference(x, kind, 1 if shape != "hwc" else 0, win, stride, pad)
    assert np.shape(got) == want.shape
    assert_matches(prog, "Y", got, want)


FORMS = [  # (window, stride, padding): ResNet's 3x3 s2 pad 1, 2x2 s2, overlapping s1 padded, stride != window
    ((3, 3), (2, 2), (1, 1)), ((2, 2), (2, 2), (0, 0)), ((3, 3), (1, 1), (1, 1)), ((2, 3), (3, 2), (1, 1))]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("form", FORMS)
def test_nhwc_pool_matches_numpy(kind, dtype, form):
    """3 images of 40 x 12 x 6: 60-120 row groups, several partition tiles or column blocks."""
    run(kind, dtype, "nhwc", dict(N=3, H=40, W=12, C=6), *form)


@pytest.mark.parametrize("kind", ["min", "sum"])
def test_min_and_sum(kind):
    run(kind, "f32", "nhwc", dict(N=2, H=17, W=9, C=5), (3, 3), (2, 2), (1, 1))


@pytest.mark.parametrize("shape, sizes", [("hwc", dict(H=150, W=7, C=4)), ("nhwgc", dict(N=2, H=9, W=10, G=3, C=2))])
def test_other_layouts(shape, sizes):
    """No dimension before the window axes (an image's 150 row groups over two tiles); two after them."""
    run("max", "bf16", shape, sizes, (3, 3), (1, 2), (1, 1))


def test_large_window_padding_rows():
    """5x5 stride 1 padding 2: the first two row groups of every image read rows above X in different slots."""
    run("max", "f32", "nhwc", dict(N=2, H=11, W=13, C=3), (5, 5), (1, 1), (2, 2))


def test_nki_01():
    run("avg", "bf16", "nhwc", dict(N=3, H=40, W=12, C=6), (3, 3), (2, 2), (1, 1), nki="0.1")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("form", [FORMS[0], FORMS[2], FORMS[3]])
def test_exclude_padding_matches_numpy(dtype, form):
    """count_include_pad=False: each window's sum over its taps inside X (NumPy: a pool of ones beside X's)."""
    prog = lang.load(exclude_program(dtype, dict(N=3, H=40, W=12, C=6), *form))
    compiled = compile_loaded(prog, None, "0.6")
    assert "over axes with" in compiled.source
    x = np.random.default_rng(4).standard_normal(prog.tensors["X"].shape).astype(NP[dtype])
    want = reference(x, "sum", 1, *form) / reference(np.ones_like(x, np.float64), "sum", 1, *form)
    assert_matches(prog, "Y", compiled.run(X=x)["Y"], want)


def test_axes_apart_are_refused():
    src = "\n".join(["kernel pa(X: f32[N, H, C, W]) -> Y", "  default N = 1, H = 8, C = 3, W = 8",
                     "  Y: f32[N, H / 2, C, W / 2]", "  for n in 0..N, y in 0..H / 2, c in 0..C, x in 0..W / 2:",
                     "    Y[n, y, c, x] = -inf", "    for p in 0..2, q in 0..2:",
                     "      Y[n, y, c, x] max= X[n, 2 * y + p, c, 2 * x + q]"]) + "\n"
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(src), None, "0.6")
    assert "not two adjacent" in e.value.message


def test_directive_is_refused():
    src = program("max", "f32", "nhwc", dict(N=2, H=8, W=8, C=4), (2, 2), (2, 2), (0, 0))
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(src), lang.parse_schedule("split Y.y, 2", "<s>"), "0.6")
    assert "no directives" in e.value.message
