"""Window pools of any window, stride and padding (rules_pool.py): compiled, run on the NKI interpreter and compared
with NumPy (np.pad + sliding windows; independent of tilec), max and average (padding counted or not, as torch's
count_include_pad), f32/f16/bf16, at sizes of several partition tiles (N*C = 192 rows) and several bands."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import assert_matches
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def pool_program(kind: str, r: int, s: int, pad: int, dtype: str = "f32", h: int = 23, w: int = 19,
                 n: int = 2, c: int = 96) -> str:
    fill = {"max": " ?? -inf", "avg": " ?? 0", "avgx": " ?? 0"}[kind] if pad else ""
    off = f" - {pad}" if pad else ""
    read = f"X[n, c, {s}*i + u{off}, {s}*j + v{off}]{fill}"
    lines = [f"kernel pool(X: {dtype}[N, C, H, W]) -> Y",
             f"  default N = {n}, C = {c}, H = {h}, W = {w}",
             f"  let Ho = (H + {2 * pad} - {r}) / {s} + 1, Wo = (W + {2 * pad} - {r}) / {s} + 1"]
    if kind == "max":
        lines += [f"  Y: {dtype}[N, C, Ho, Wo]",
                  "  for n in 0..N, c in 0..C, i in 0..Ho, j in 0..Wo:",
                  "    Y[n, c, i, j] = -inf",
                  f"    for u in 0..{r}, v in 0..{r}:",
                  f"      Y[n, c, i, j] max= {read}"]
        return "\n".join(lines) + "\n"
    if kind == "avg":
        div = f"{r * r}"
    else:
        rows = f"(min({s}*i + {r - pad}, H) - max({s}*i - {pad}, 0))"
        cols = f"(min({s}*j + {r - pad}, W) - max({s}*j - {pad}, 0))"
        div = f"({rows} * {cols})"
    lines += ["  S: f32[N, C, Ho, Wo]", f"  Y: {dtype}[N, C, Ho, Wo]",
              "  for n in 0..N, c in 0..C, i in 0..Ho, j in 0..Wo:",
              "    S[n, c, i, j] = 0",
              f"    for u in 0..{r}, v in 0..{r}:",
              f"      S[n, c, i, j] += {read}",
              f"    Y[n, c, i, j] = S[n, c, i, j] / {div}"]
    return "\n".join(lines) + "\n"


def reference(x: np.ndarray, kind: str, r: int, s: int, pad: int) -> np.ndarray:
    """torch's max_pool2d / avg_pool2d(count_include_pad=True/False) in NumPy."""
    x = x.astype(np.float64)
    widths = ((0, 0), (0, 0), (pad, pad), (pad, pad))
    xp = np.pad(x, widths, constant_values=-np.inf if kind == "max" else 0.0)
    ones = np.pad(np.ones_like(x), widths)
    ho, wo = (xp.shape[2] - r) // s + 1, (xp.shape[3] - r) // s + 1

    def windows(a: np.ndarray) -> np.ndarray:
        return np.stack([a[:, :, u:u + s * (ho - 1) + 1:s, v:v + s * (wo - 1) + 1:s]
                         for u in range(r) for v in range(r)])
    if kind == "max":
        return windows(xp).max(0)
    total = windows(xp).sum(0)
    return total / (r * r) if kind == "avg" else total / windows(ones).sum(0)


def run_pool(text: str, kind: str, r: int, s: int, pad: int, dtype: str, schedule: str | None = None,
             seed: int = 3) -> None:
    prog = lang.load(text)
    directives = lang.parse_schedule(schedule, "<test schedule>") if schedule else None
    compiled = compile_loaded(prog, directives)
    shape = prog.tensors["X"].shape
    x = np.random.default_rng(seed).standard_normal(shape).astype(NP[dtype])  # signed: padding must never win
    got = compiled.run(X=x)["Y"]
    want = reference(x.astype(np.float32), kind, r, s, pad)
    assert np.shape(got) == want.shape
    assert_matches(prog, "Y", got, want)


CASES = [(kind, r, s, pad) for kind in ("max", "avg", "avgx") for r, s, pad in
         ((3, 2, 1), (3, 1, 1), (2, 1, 0), (2, 2, 1), (3, 2, 0), (2, 1, 1))]


@pytest.mark.parametrize("kind, r, s, pad", CASES)
def test_window_pool_matches_numpy_f32(kind, r, s, pad):
    """(avgx without padding: every window is whole, its count written with min/max is the constant r * r.)"""
    run_pool(pool_program(kind, r, s, pad), kind, r, s, pad, "f32")


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("r,h,w", [(2, 7, 23), (3, 32, 25), (2, 36, 6)])
def test_count_written_with_min_max_when_window_equals_stride(dtype, r, h, w):
    """count_include_pad=False written with min/max for a pool whose window is its stride (no padding; odd sizes:
    the last rows and columns of X are not read): the count is r * r everywhere, fused as the pool's scale (it
    was refused: the pool had no explicit window, so the division stayed an element-wise statement of min/max)."""
    run_pool(pool_program("avgx", r, r, 0, dtype, h=h, w=w, n=2, c=96), "avgx", r, r, 0, dtype)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("kind", ["max", "avg", "avgx"])
def test_window_pool_matches_numpy_16_bit(kind, dtype):
    run_pool(pool_program(kind, 3, 2, 1, dtype), kind, 3, 2, 1, dtype)


def test_global_like_7x7_window():
    """A 7x7 window over a 7x7 map with padding 3, stride 1 (every window clipped differently)."""
    for kind in ("max", "avgx"):
        run_pool(pool_program(kind, 7, 1, 3, h=7, w=7, n=1, c=160), kind, 7, 1, 3, "f32")


@pytest.mark.parametrize("schedule", ["split Y.i, 3", "tile Y.n, 32", "split S.i, 4"])
def test_window_pool_under_schedules(schedule):
    kind = "avgx" if schedule.startswith("split S") else "max"
    run_pool(pool_program(kind, 3, 2, 1), kind, 3, 2, 1, "f32", schedule)


def test_bands_peel_first_and_last():
    """Several bands: the first and last read fewer rows (clipped to X), the middle ones run in one loop."""
    compiled = compile_loaded(lang.load(pool_program("max", 3, 1, 1, h=40, w=16, n=1, c=128)),
                              lang.parse_schedule("split Y.i, 8", "<s>"))
    assert "for yb in nl.affine_range(3)" in compiled.source
    run_pool(pool_program("max", 3, 1, 1, h=40, w=16, n=1, c=128), "max", 3, 1, 1, "f32", "split Y.i, 8")


def test_padding_with_the_wrong_value_is_a_located_error():
    text = pool_program("max", 3, 1, 1).replace("?? -inf", "?? 0")
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(text))
    assert "must pad with -inf" in str(e.value) and "X[n, c" in str(e.value)


@pytest.mark.parametrize("kind, r, s, pad, h", [("max", 3, 2, 1, 24), ("avg", 3, 1, 1, 24), ("max", 2, 1, 0, 25),
                                                ("avg", 3, 2, 1, 23), ("max", 3, 1, 1, 30),
                                                ("max", 2, 1, 0, 24), ("avg", 2, 1, 1, 22)])
def test_few_channel_rows_fill_the_partitions_with_row_blocks(kind, r, s, pad, h):
    """N*C = 48: blocks of output rows on the other partitions, each loaded by its own DMA; the first block's
    top rows and the last block's bottom rows (outside X) hold the identity (0, or X's edge row for a max)."""
    text = pool_program(kind, r, s, pad, h=h, w=21, n=1, c=48)
    compiled = compile_loaded(lang.load(text))
    assert "blocks of" in compiled.source
    run_pool(text, kind, r, s, pad, "f32")
    run_pool(text, kind, r, s, pad, "f32", "split " + ("Y" if kind == "max" else "S") + ".i, 2")


def test_overlapping_pool_once_rejected_now_compiles():
    """tests/compiler/test_selection.py rejected this 3x3 stride-2 pool ("windows may not overlap") before the
    window-pool rule; its golden error is gone with it."""
    text = """\
kernel pool3(X: f32[N, C, H, W]) -> Y
  default N = 1, C = 128, H = 17, W = 17
  Y: f32[N, C, 8, 8]
  for n in 0..N, c in 0..C, i in 0..8, j in 0..8:
    Y[n, c, i, j] = -inf
    for p in 0..3, q in 0..3:
      Y[n, c, i, j] max= X[n, c, 2*i + p, 2*j + q]
"""
    run_pool(text, "max", 3, 2, 0, "f32")


def test_explain_shows_the_pool_rules_primitives() -> None:
    """`explain` / `--dump-ir schedule` print the primitive list the pool's plan expands to, with the plan's band
    and the window's stride and padding (the same record the lowering reads)."""
    c = compile_loaded(lang.load(pool_program("max", 3, 2, 1), {}), lang.parse_schedule("split Y.i, 3", "<s>"))
    text = c.stages["schedule"]
    assert "# Y: rules_pool.pool expands its plan into" in text
    assert "#   split(i, 3, name=BAND)" in text
    assert "#   window(j, taps=3, stride=2, offset=-1, op=maximum)" in text
