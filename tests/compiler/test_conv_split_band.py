"""The kernel's last row-pair band at batch 1 built as two accumulation groups of unequal rows, each evicted and
stored on its own (conv_pairs.split_groups): the first group's store runs under the second group's matmuls.
Checked on the kernels' text (two PSUM tiles of ceil(rows / 2) and floor(rows / 2) pairs, two stores) and against
a NumPy float64 reference on the interpreter (small shapes: 64 channels, the fewest that take row pairs)."""
from __future__ import annotations

import functools
import re

import ml_dtypes
import numpy as np
import pytest

from numpy_refs import conv
from tilec.compiler.api import compile_loaded
from tilec.compiler.wrap import unwrap
from tilec.lang import api as lang
from tilec.tolerance import max_error, tolerance

NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}

CONV = """kernel c(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3], b: f32[K]) -> Y
  default N = 1, C = 64, H = 14, W = 30, K = 64
  Y: f32[N, K, H - 2 + 2*{p}, W - 2 + 2*{p}]
  for n in 0..N, k in 0..K, y in 0..H - 2 + 2*{p}, x in 0..W - 2 + 2*{p}:
    Y[n, k, y, x] = b[k]
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, y + r - {p}, x + s - {p}] ?? 0) * Wt[k, c, r, s]
"""

BLOCK = """kernel blk(X: f32[N, C, H, W], W1: f32[C, C, 3, 3], W2: f32[C, C, 3, 3]) -> Y
  default N = 1, C = 64, H = 20, W = 20
  T: f32[N, C, H, W]
  U: f32[N, C, H, W]
  Y: f32[N, C, H, W]
  for n in 0..N, k in 0..C, y in 0..H, x in 0..W:
    T[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      T[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * W1[k, c, r, s]
  for n in 0..N, k in 0..C, y in 0..H, x in 0..W:
    U[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      U[n, k, y, x] += relu(T[n, c, y + r - 1, x + s - 1] ?? 0) * W2[k, c, r, s]
  for n in 0..N, k in 0..C, y in 0..H, x in 0..W:
    Y[n, k, y, x] = relu(U[n, k, y, x] + X[n, k, y, x])
"""

RESIDUAL = """kernel res(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3], S: f32[N, K, H - 2, W - 2]) -> Y
  default N = 1, C = 72, H = 15, W = 24, K = 40
  conv: f32[N, K, H - 2, W - 2]
  Y: f32[N, K, H - 2, W - 2]
  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:
    conv[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      conv[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, y in 0..H - 2, x in 0..W - 2:
    Y[n, k, y, x] = conv[n, k, y, x] + S[n, k, y, x]
"""

STRIDED = """kernel s2(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3]) -> Y
  default N = 1, C = 48, H = 26, W = 50, K = 32
  let Ho = (H + 2*1 - 3) / 2 + 1, Wo = (W + 2*1 - 3) / 2 + 1
  Y: f32[N, K, Ho, Wo]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, 2*y + r - 1, 2*x + s - 1] ?? 0) * Wt[k, c, r, s]
"""

# name -> (program text, sizes, the split's pairs (row pairs) or rows (plain bands) (head, tail) in f32)
CASES = {
    "same_7_pairs": (CONV.format(p=1), {}, (4, 3)),
    "valid_unpadded": (CONV.format(p=0), {"H": 22, "W": 32}, (5, 5)),
    "block_consumer": (BLOCK, {}, (5, 5)),
    "plain_residual": (RESIDUAL, {}, (7, 6)),
    "plain_padded_own_columns": (CONV.format(p=1), {"C": 72, "K": 40, "H": 13, "W": 24}, (7, 6)),
    "folded_strided": (STRIDED, {}, (7, 6)),  # taps folded in pairs (2 x 48 channels), stride 2
}


@functools.lru_cache(maxsize=None)  # each kernel compiled once for the module's tests
def compiled(name: str, dtype: str):
    text, sizes, _ = CASES[name]
    prog = lang.load(text.replace("f32[", f"{dtype}["), sizes)
    return prog, compile_loaded(prog, nki="0.6")


def reference(name: str, given: dict[str, np.ndarray]) -> np.ndarray:
    f = {k: v.astype(np.float64) for k, v in given.items()}
    if name == "block_consumer":
        pad = lambda t: np.pad(t, [(0, 0), (0, 0), (1, 1), (1, 1)])  # noqa: E731
        t = conv(pad(f["X"]), f["W1"])
        return np.maximum(conv(pad(np.maximum(t, 0)), f["W2"]) + f["X"], 0)
    if name == "plain_residual":
        return conv(f["X"], f["Wt"]) + f["S"]
    if name == "folded_strided":
        return conv(np.pad(f["X"], [(0, 0), (0, 0), (1, 1), (1, 1)]), f["Wt"], stride=2)
    p = 0 if name == "valid_unpadded" else 1
    return conv(np.pad(f["X"], [(0, 0), (0, 0), (p, p), (p, p)]), f["Wt"]) + f["b"][None, :, None, None]


def accs(src: str) -> list[int]:
    """The rows (pairs) of the split band's two PSUM tiles, in program order."""
    return [int(m) for m in re.findall(r"_acc_(?:head|tail) = nl\.ndarray\(\((?:2 \* )?\w+, (\d+),", src)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_last_band_in_two_groups(name: str) -> None:
    """f32: two groups, the first of ceil(rows / 2) pairs, each with its own eviction and store (the stores:
    one per earlier band plus two)."""
    src = unwrap(compiled(name, "f32")[1].source)
    assert accs(src) == list(CASES[name][2])
    head, tail = src.split("_acc_tail = ")
    head = head[head.index("_acc_head = "):]
    for part in (head, tail):  # each group evicted into the output band and stored before the next
        assert len(re.findall(r"dma_copy\(dst=Y", part)) == 1 and "dst=Y_band[:, " in part


def test_bf16_keeps_one_group() -> None:
    """16-bit matmuls of a group's pairs are shorter than a DMA's latency: the first store would not hide under
    them, so the band stays one group (conv_pairs._tail_hides_store)."""
    assert accs(unwrap(compiled("same_7_pairs", "bf16")[1].source)) == []


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_split_band_matches_numpy(name: str, dtype: str) -> None:
    prog, kernel = compiled(name, dtype)
    rng = np.random.default_rng(23)
    given = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(NP[dtype]) for t in prog.inputs}
    want = reference(name, given)
    got = np.asarray(kernel.run(**given)["Y"], np.float64)
    assert got.shape == want.shape
    terms = int(given["X"].shape[1]) * 9 * (2 if name == "block_consumer" else 1)
    rounded = want.astype(NP[dtype]).astype(np.float64)
    assert max_error(got, rounded) <= tolerance(dtype, terms, float(np.abs(want).max()), None)


CHAIN = """kernel crc(X: f32[N, C, H, W], W1: f32[C, C, 3, 3], W2: f32[C, C, 3, 3]) -> Y
  default N = 1, C = 72, H = 10, W = 10
  T: f32[N, C, H - 2, W - 2]
  Y: f32[N, C, H - 4, W - 4]
  for n in 0..N, k in 0..C, y in 0..H - 2, x in 0..W - 2:
    T[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      T[n, k, y, x] += X[n, c, y + r, x + s] * W1[k, c, r, s]
    T[n, k, y, x] = relu(T[n, k, y, x])
  for n in 0..N, k in 0..C, y in 0..H - 4, x in 0..W - 4:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += T[n, c, y + r, x + s] * W2[k, c, r, s]
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("batch", [1, 2])
def test_chain_consumer_weights_by_dma(dtype: str, batch: int) -> None:
    """A conv chain's second conv at batch 1 in fp32 transposes its weights' taps by DMA, SBUF -> SBUF
    (conv_weights.taps_by_dma); the first conv's stay on TensorE, as do 16-bit weights and batch 2. Either way the
    kernel matches NumPy."""
    prog = lang.load(CHAIN.replace("f32[", f"{dtype}["), {"N": batch})
    kernel = compile_loaded(prog, nki="0.6")
    src = unwrap(kernel.source)
    by_dma = dtype == "f32" and batch == 1
    assert ("nisa.dma_transpose(dst=W2_T" in src) == by_dma and "dma_transpose(dst=W1_T" not in src
    rng = np.random.default_rng(5)
    given = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(NP[dtype]) for t in prog.inputs}
    f = {k: v.astype(np.float64) for k, v in given.items()}
    t = np.maximum(conv(f["X"], f["W1"]), 0)
    if dtype != "f32":  # the program stores T in its dtype: the second conv reads the rounded values
        t = t.astype(NP[dtype]).astype(np.float64)
    want = conv(t, f["W2"])
    got = np.asarray(kernel.run(**given)["Y"], np.float64)
    rounded = want.astype(NP[dtype]).astype(np.float64)
    assert max_error(got, rounded) <= tolerance(dtype, 2 * 72 * 9, float(np.abs(want).max()), None)
