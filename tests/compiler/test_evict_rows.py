"""Issue 13 §6 (evict24): a vector along a 2-D matmul's output columns (`+ c[j]`, `* r[j]`, `- c[j]`, a key-padding
row) anywhere in the element-wise statement that reads the product runs on its PSUM eviction: the row is replicated
on every partition once and applied by a tensor_tensor on the evicted tile, with column terms (`+ b[i]`) in the
activation. Each form runs on the interpreter against NumPy in f32 and bf16 on a multi-tile shape (M 200 = two
partition tiles, the last ragged), and explain must place the product on chip only. Pairwise squared distances at
D = 128 add |b|^2 that way instead of as a second contraction tile."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_matches, run_signed
from test_eviction_fusion import MATMUL as FUSION_MATMUL
from tilec.compiler.api import compile_loaded, explain
from tilec.lang import api as lang

# test_eviction_fusion's matmul, with two rows along its columns (c, r) for the consumer
MATMUL = FUSION_MATMUL.replace("g: {dt}[M]", "c: {dt}[J], r: {dt}[J]").replace("{dt}", "f32")


def _row(v: np.ndarray) -> np.ndarray:
    return v[None, :]


def _col(v: np.ndarray) -> np.ndarray:
    return v[:, None]


CONSUMERS = {  # consumer -> Y from t and the inputs (float64)
    "relu(t[i, j] * 0.5 + b[i]) * r[j] - c[j]":
        lambda t, a: np.maximum(t * 0.5 + _col(a["b"]), 0) * _row(a["r"]) - _row(a["c"]),
    "b[i] - 2 * t[i, j] + c[j]": lambda t, a: _col(a["b"]) - 2 * t + _row(a["c"]),
    "c[j] - t[i, j]": lambda t, a: _row(a["c"]) - t,
    "relu(t[i, j] - c[j])": lambda t, a: np.maximum(t - _row(a["c"]), 0),  # (the row's step is the eviction)
    # the row first from PSUM, pre-divided by an exact factor (row_first), and a factor that is not a power of two
    "b[i] + 0.5 * t[i, j] - c[j]": lambda t, a: _col(a["b"]) + 0.5 * t - _row(a["c"]),
    "0.3 * t[i, j] + b[i] + c[j]": lambda t, a: 0.3 * t + _col(a["b"]) + _row(a["c"]),
    "exp(t[i, j] * 0.125 + c[j])": lambda t, a: np.exp(t * 0.125 + _row(a["c"])),
    "max(t[i, j], c[j]) / (r[j] + 2)": None,  # (a vector's arithmetic: not one step; stays a nest of its own)
}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
def test_row_steps_on_the_eviction_match_numpy(consumer: str, dtype: str) -> None:
    prog, compiled, out, a = run_signed(MATMUL.format(consumer=consumer), dtype, seed=5)
    t = a["A"] @ a["B"]
    if dtype == "bf16":  # t is stored bf16 before the consumer reads it
        t = (t.astype(np.float32).view(np.uint32) + 0x8000 & 0xFFFF0000).view(np.float32).astype(np.float64)
    f = CONSUMERS[consumer]
    want = f(t, a) if f else np.maximum(t, _row(a["c"])) / (_row(a["r"]) + 2)
    assert_matches(prog, "Y", out["Y"], want)
    placed = explain(compiled).split("tensor placement:")[1].split("\n  t ")[1].split("\n  Y ")[0]
    assert ("never in HBM" in placed) == (f is not None), placed


def test_key_padding_row_on_attention_scores() -> None:
    """Masked attention scores: `Q K^T * s + m[j]` with m a key-padding row (0 or -30000) is one eviction."""
    text = """\
kernel scores(Q: f32[S, D], Kt: f32[D, S], m: f32[S]) -> Sc
  default S = 160, D = 64
  Sc: f32[S, S]
  for i in 0..S, j in 0..S:
    Sc[i, j] = 0
    for d in 0..D:
      Sc[i, j] += Q[i, d] * Kt[d, j]
  for i in 0..S, j in 0..S:
    Sc[i, j] = Sc[i, j] * 0.125 + m[j]
"""
    prog = lang.load(text)
    rng = np.random.default_rng(2)
    Q, Kt = (rng.standard_normal(t.shape).astype(np.float32) for t in prog.inputs[:2])
    m = np.where(np.arange(160) % 7 == 3, -30000.0, 0.0).astype(np.float32)
    compiled = compile_loaded(prog)
    got = compiled.run(Q=Q, Kt=Kt, m=m)["Sc"]
    assert_matches(prog, "Sc", got, Q.astype(np.float64) @ Kt * 0.125 + m[None, :])
    assert "_bc" in compiled.source  # the row replicated on the partitions, not an HBM round trip


def test_row_of_one_output_column() -> None:
    """J = 1 (a matrix-vector shape): the row is one value on every partition; the general builder takes it (the
    matrix-vector builder has no replicated rows; found by a random sweep as an assertion)."""
    text = MATMUL.format(consumer="relu(t[i, j] * 0.5 + b[i]) * r[j] - c[j]").replace("J = 300", "J = 1")
    prog, _, out, a = run_signed(text, "f32", seed=8)
    t = a["A"] @ a["B"]
    assert_matches(prog, "Y", out["Y"], np.maximum(t * 0.5 + _col(a["b"]), 0) * _row(a["r"]) - _row(a["c"]))


HEADS = """\
kernel kpad(Q: f32[Hd, S, D], K: f32[Hd, S, D], m: f32[S]) -> Sc
  default Hd = 2, S = 200, D = 64
  Sc: f32[Hd, S, S]
  for h in 0..Hd, i in 0..S, j in 0..S:
    Sc[h, i, j] = 0
    for d in 0..D:
      Sc[h, i, j] += Q[h, i, d] * K[h, j, d]
  for h in 0..Hd, i in 0..S, j in 0..S:
    Sc[h, i, j] = Sc[h, i, j] * 0.125 + m[j]
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_key_padding_row_over_heads(dtype: str) -> None:
    """A batched matmul (heads) with one key-padding row for every head: the row replicated once, added on each
    head's eviction (it was an HBM round trip of the scores: 8 x 1024 x 1024 x 64 f32 3.33x -> 1.96x)."""
    prog, compiled, out, a = run_signed(HEADS, dtype, seed=6)
    want = np.einsum("hid,hjd->hij", a["Q"], a["K"]) * 0.125 + a["m"][None, None, :]
    assert_matches(prog, "Sc", out["Sc"], want)
    assert "_bc" in compiled.source


FOLDER = pathlib.Path(__file__).parents[1] / "programs" / "user23"


@pytest.mark.parametrize("name", ["sqdist", "sqdist_matmul"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_distances_at_a_whole_contraction_tile_add_the_norm_row_on_the_eviction(name: str, dtype: str) -> None:
    """At D = 128 the augmented operands' extra column would be a second contraction tile: |b|^2 is a row added
    on the eviction instead (no augmented operand), |a|^2 the bias column; checked against NumPy's distances."""
    src = (FOLDER / f"{name}.tl").read_text().replace("M = 96, N = 80, D = 32", "M = 130, N = 200, D = 128")
    prog, compiled, out, a = run_signed(src, dtype, seed=4)
    A, B = a["A"], a["B"]
    assert_matches(prog, "Dm", out["Dm"], ((A[:, None, :] - B[None, :, :]) ** 2).sum(axis=2))
    assert "_Aa" not in compiled.source and "_bc" in compiled.source


def test_distance_rewrite_keeps_the_augmented_form_where_the_column_is_free() -> None:
    from tilec.compiler.distance_split import split_squared_distances

    src = (FOLDER / "sqdist.tl").read_text()
    at_128 = split_squared_distances(lang.load(src.replace("D = 32", "D = 128")))
    assert {n for n, t in at_128.tensors.items() if t.kind == "temp"} == {"Dm_aa", "Dm_bb"}
    at_127 = split_squared_distances(lang.load(src.replace("D = 32", "D = 127")))
    assert at_127.tensors["Dm_Aa"].shape == (96, 128)
