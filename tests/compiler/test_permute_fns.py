"""Element-wise work on the way through a transpose (`Y[b, j, i] = relu(X[b, i, j])`, per-channel vectors and
constants): one pass, the work done on the PSUM -> SBUF eviction or on the source block (fn_chain.py), checked
against NumPy formulas written here."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

BATCHED = """kernel trelu(X: DT[B, M, N]) -> Y
  default B = 2, M = 256, N = 384
  Y: DT[B, N, M]
  for b in 0..B, i in 0..M, j in 0..N:
    Y[b, j, i] = FN
"""
NHWC = """kernel nhwc(X: f32[N, C, H, W]) -> Y
  default N = 2, C = 128, H = 8, W = 12
  Y: f32[N, H, W, C]
  for n in 0..N, c in 0..C, h in 0..H, w in 0..W:
    Y[n, h, w, c] = relu(X[n, c, h, w])
"""
NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
REFS = {
    "relu(X[b, i, j])": lambda x: np.maximum(x, 0),
    "tanh(abs(X[b, i, j]))": lambda x: np.tanh(np.abs(x)),
    "sigmoid(X[b, i, j])": lambda x: 1 / (1 + np.exp(-x)),
}


def compiled(text: str, sizes=None, schedule: str | None = None, target: str | None = None, nki: str | None = None):
    directives = lang.parse_schedule(schedule, "<test>") if schedule is not None else None
    return compile_loaded(lang.load(text, sizes), directives, nki=nki, target=target)


def run(c, x: np.ndarray) -> np.ndarray:
    return np.asarray(c.run(X=x)["Y"], dtype=np.float64)


def inputs(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return np.random.default_rng(3).uniform(-2, 2, shape).astype(NP[dtype])


@pytest.mark.parametrize("fn", sorted(REFS))
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("sizes", [None, {"B": 3, "M": 200, "N": 130}])
def test_a_transpose_applies_activations_on_its_eviction(fn, dtype, sizes):
    c = compiled(BATCHED.replace("DT", dtype).replace("FN", fn), sizes)
    assert "_pre" not in c.source and "nc_transpose" in c.source  # one pass: no element-wise temporary in HBM
    b, m, n = (sizes or {"B": 2, "M": 256, "N": 384}).values()
    x = inputs((b, m, n), dtype)
    expect = REFS[fn](x.astype(np.float64)).transpose(0, 2, 1)
    tol = 1e-2 if dtype == "bf16" else 1e-5
    np.testing.assert_allclose(run(c, x), expect, rtol=tol, atol=tol)


@pytest.mark.parametrize("options", [{"target": "trn1"}, {"nki": "0.1"}, {"schedule": "method Y, dma"}])
def test_the_fused_transpose_on_trn1_in_nki_01_and_by_dma(options):
    c = compiled(BATCHED.replace("DT", "f32").replace("FN", "relu(X[b, i, j])"), **options)
    x = inputs((2, 256, 384), "f32")
    np.testing.assert_allclose(run(c, x), np.maximum(x, 0).transpose(0, 2, 1), rtol=0, atol=0)


def test_nchw_to_nhwc_with_relu_is_one_transpose():
    c = compiled(NHWC)
    assert "_pre" not in c.source and "relu" in c.source
    x = inputs((2, 128, 8, 12), "f32")
    np.testing.assert_allclose(run(c, x), np.maximum(x, 0).transpose(0, 2, 3, 1), rtol=0, atol=0)


SCALE = """kernel scale(X: DT[N, H, W, C], s: DT[C], t: DT[C]) -> Y
  default N = 2, H = 6, W = 10, C = 192
  Y: DT[N, C, H, W]
  for n in 0..N, c in 0..C, h in 0..H, w in 0..W:
    Y[n, c, h, w] = relu(s[c] * X[n, h, w, c] - t[c]) + 0.5
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("options", [{}, {"target": "trn1"}, {"nki": "0.1"}, {"schedule": "method Y, dma"}])
def test_vectors_over_the_transposed_partitions_are_columns_of_the_eviction(dtype, options):
    """NHWC -> NCHW with per-channel vectors: c is on the transposed tile's partitions, so s[c] and t[c] are
    columns of the instructions reading the PSUM tile; no temporary in HBM."""
    c = compiled(SCALE.replace("DT", dtype), **options)
    assert "_pre" not in c.source
    rng = np.random.default_rng(5)
    x = inputs((2, 6, 10, 192), dtype)
    s, t = rng.uniform(-1, 1, 192).astype(NP[dtype]), rng.uniform(-1, 1, 192).astype(NP[dtype])
    got = np.asarray(c.run(X=x, s=s, t=t)["Y"], dtype=np.float64)
    x64 = x.astype(np.float64).transpose(0, 3, 1, 2)
    s, t = s.astype(np.float64), t.astype(np.float64)
    expect = np.maximum(s[None, :, None, None] * x64 - t[None, :, None, None], 0) + 0.5
    tol = 2e-2 if dtype == "bf16" else 1e-5
    np.testing.assert_allclose(got, expect, rtol=tol, atol=tol)


ADD = """kernel add(X: DT[N, C, H, W], b: DT[C]) -> Y
  default N = 2, C = 192, H = 6, W = 10
  Y: DT[N, H, W, C]
  for n in 0..N, c in 0..C, h in 0..H, w in 0..W:
    Y[n, h, w, c] = tanh(X[n, c, h, w] * b[c]) - b[c]
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("options", [{}, {"target": "trn1"}, {"nki": "0.1"}, {"schedule": "method Y, dma"}])
def test_vectors_over_the_source_partitions_are_done_before_the_transpose(dtype, options):
    """NCHW -> NHWC with a per-channel vector: c is on the source tile's partitions, so the value is computed
    there (b a column) into an f32 tile, then transposed and copied out; a DMA transpose cannot, so the directive's
    `dma` gives way to TensorE here."""
    c = compiled(ADD.replace("DT", dtype), **options)
    assert "Y_pre" not in c.source and "nc_transpose" in c.source  # no HBM temporary
    x = inputs((2, 192, 6, 10), dtype)
    b = np.random.default_rng(7).uniform(-1, 1, 192).astype(NP[dtype])
    got = np.asarray(c.run(X=x, b=b)["Y"], dtype=np.float64)
    b64 = b.astype(np.float64)[None, :, None, None]
    expect = (np.tanh(x.astype(np.float64) * b64) - b64).transpose(0, 2, 3, 1)
    tol = 2e-2 if dtype == "bf16" else 1e-5
    np.testing.assert_allclose(got, expect, rtol=tol, atol=tol)


def test_vectors_over_both_runs_keep_the_split():
    """b[c] over the source's partitions and s[h, w]... over the result's: not one place to compute the value, so
    the statement keeps permute_split's two passes (and still matches NumPy)."""
    text = """kernel both(X: f32[C, M], b: f32[C], s: f32[M]) -> Y
  default C = 128, M = 256
  Y: f32[M, C]
  for c in 0..C, m in 0..M:
    Y[m, c] = X[c, m] * b[c] + s[m]
"""
    c = compiled(text)
    assert "Y_pre" in c.source
    rng = np.random.default_rng(9)
    x, b, s = (rng.uniform(-1, 1, shape).astype(np.float32) for shape in ((128, 256), (128,), (256,)))
    got = np.asarray(c.run(X=x, b=b, s=s)["Y"], dtype=np.float64)
    np.testing.assert_allclose(got, (x * b[:, None] + s[None, :]).T, rtol=1e-6, atol=1e-6)


NP_FN = {"relu": lambda x: np.maximum(x, 0), "tanh": np.tanh, "abs": np.abs, "exp": np.exp,
         "sigmoid": lambda x: 1 / (1 + np.exp(-x))}


def _random_case(seed: int):
    """A random swap of runs after a batch (rank 2-4, extents around and across 128), an activation or an affine
    map, and a vector over one of the two runs or none: (program text, inputs, NumPy formula of the inputs)."""
    import random
    rng = random.Random(seed)
    rank = rng.choice([2, 3, 4])
    names = "abcd"[:rank]
    ext = {v: rng.choice([1, 3, 64, 100, 128, 130]) for v in names}
    while math.prod(ext.values()) > 200_000:  # interpreter-sized: shrink the largest dimension
        ext[max(ext, key=ext.__getitem__)] = 3
    k = rng.randrange(0, rank - 1)
    rest = list(names[k:])
    cut = rng.randrange(1, len(rest))
    out = list(names[:k]) + rest[cut:] + rest[:cut]
    run = rng.choice([(), tuple(rest[:cut]), tuple(rest[cut:])])
    fn = rng.choice(sorted(NP_FN))
    x = f"X[{', '.join(names)}]"
    value = f"{fn}({x} - v[{', '.join(run)}]) * 2" if run else f"{fn}(0.5 * {x} + 1)"
    upper = lambda vs: ", ".join(v.upper() for v in vs)  # noqa: E731
    text = (f"kernel k(X: f32[{upper(names)}]" + (f", v: f32[{upper(run)}]" if run else "") + ") -> Y\n"
            f"  default {', '.join(f'{v.upper()} = {ext[v]}' for v in names)}\n  Y: f32[{upper(out)}]\n"
            f"  for {', '.join(f'{v} in 0..{v.upper()}' for v in names)}:\n    Y[{', '.join(out)}] = {value}\n")
    r = np.random.default_rng(seed)
    args = {"X": r.uniform(-2, 2, [ext[v] for v in names]).astype(np.float32)}
    if run:
        args["v"] = r.uniform(-1, 1, [ext[v] for v in run]).astype(np.float32)

    def formula(a):
        xs = a["X"].astype(np.float64)
        if run:  # v broadcast along the dimensions it does not index
            vv = a["v"].astype(np.float64).reshape([ext[v] if v in run else 1 for v in names])
            y = NP_FN[fn](xs - vv) * 2
        else:
            y = NP_FN[fn](0.5 * xs + 1)
        return y.transpose([names.index(v) for v in out])
    return text, args, formula


@pytest.mark.parametrize("seed", range(12))
def test_random_swaps_with_work_on_the_way_match_numpy(seed):
    text, args, formula = _random_case(seed)
    c = compiled(text)
    assert "Y_pre" not in c.source  # one transpose: the work is done on the way
    got = np.asarray(c.run(**args)["Y"], dtype=np.float64)
    np.testing.assert_allclose(got, formula(args), rtol=1e-5, atol=1e-5)
