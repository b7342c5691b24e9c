"""Element-wise statements at sizes without good divisors (rules.eltwise with `cut`): a prime element count or a
prime partition/free extent gets 128-partition x ~1000-element tiles and a smaller last tile, not thousands of
one-element tiles. Compiled, run on the NKI interpreter and compared with NumPy (independent of tilec), f32, f16
and bf16, under the default schedule and under tiles that do not divide the data."""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import assert_matches
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def flat(shape: tuple[int, ...], dtype: str) -> str:
    dims = ", ".join(f"D{i}" for i in range(len(shape)))
    sizes = ", ".join(f"D{i} = {n}" for i, n in enumerate(shape))
    loops = ", ".join(f"i{k} in 0..D{k}" for k in range(len(shape)))
    idx = ", ".join(f"i{k}" for k in range(len(shape)))
    return (f"kernel k(A: {dtype}[{dims}], B: {dtype}[{dims}]) -> C\n  default {sizes}\n  C: {dtype}[{dims}]\n"
            f"  for {loops}:\n    C[{idx}] = A[{idx}] * 0.5 + B[{idx}]\n")


BCAST = """\
kernel k(X: {t}[M, N], g: {t}[N], c: {t}[M]) -> Y
  default M = {m}, N = {n}
  Y: {t}[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] * g[j] + c[i]
"""


def run(text: str, schedule: str | None, want_fn, seed: int = 5):
    prog = lang.load(text)
    directives = lang.parse_schedule(schedule, "<test schedule>") if schedule else None
    compiled = compile_loaded(prog, directives)
    rng = np.random.default_rng(seed)
    ins = {t.name: rng.standard_normal(t.shape).astype(NP[t.dtype]) for t in prog.inputs}
    out_name = prog.outputs[0].name
    got = compiled.run(**ins)[out_name]
    want = want_fn(**{k: v.astype(np.float64) for k, v in ins.items()})
    assert np.shape(got) == want.shape
    assert_matches(prog, out_name, got, want)
    return compiled


def tiles(source: str) -> int:
    """The kernel's stores to HBM (one per tile): each store statement times the trips of the loops around it."""
    total, loops = 0, []  # loops: (indent, trips) of the enclosing `for`s
    for line in source.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        loops = [(i, n) for i, n in loops if i < indent]
        loop = re.match(r" *for \w+ in nl\.\w+_range\((\d+)\)", line)
        if loop:
            loops.append((indent, int(loop.group(1))))
        elif "nisa.dma_copy(dst=C" in line or "nisa.dma_copy(dst=Y" in line:
            total += int(np.prod([n for _, n in loops]))
    return total


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape", [(227, 521), (100003,), (3, 1031), (131, 7, 11)])
def test_flat_prime_sizes_match_numpy_in_few_tiles(shape, dtype):
    c = run(flat(shape, dtype), None, lambda A, B: A * 0.5 + B)
    size = int(np.prod(shape))
    # each tile holds at least a few hundred elements (the old divisor plan: 1-element tiles for a prime count)
    assert tiles(c.source) <= size // 100 + 4, c.source


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("m, n", [(227, 521), (131, 1031), (300, 257)])
def test_broadcast_with_prime_extents_matches_numpy(m, n, dtype):
    c = run(BCAST.format(t=dtype, m=m, n=n), None, lambda X, g, c: X * g[None, :] + c[:, None])
    assert tiles(c.source) <= 4 * (-(-m // 128)) * (-(-n // 512)), c.source


@pytest.mark.parametrize("schedule", ["tile Y.j, 100", "tile Y.j, 1", "tile Y.j, 333", "tile Y.i, 100"])
def test_tiles_that_do_not_divide_are_ragged(schedule):
    """A free tile (j) or a partition tile (i) the data's extent does not divide: whole tiles and a smaller last
    one."""
    c = run(BCAST.format(t="f32", m=227, n=521), schedule, lambda X, g, c: X * g[None, :] + c[:, None])
    assert f"{schedule.split(', ')[1]}" in c.source


def test_divisible_sizes_keep_one_nest():
    """Sizes the plan divides are not cut (the kernels of divisible sizes are as before)."""
    c = run(BCAST.format(t="f32", m=256, n=1024), None, lambda X, g, c: X * g[None, :] + c[:, None])
    assert " x columns " not in c.source and "_ab" not in c.source  # (a cut's region note: "rows .. x columns ..")


def test_layernorm_row_chain_broken_by_a_one_element_tile_runs_quickly():
    """The fuzzer's hang (seed 19002218): `tile Y.j, 1` (then written `tile Y.i, 1`) builds Y alone as a broadcast with 227 rows and 521
    columns, both prime: 118,267 one-element tiles before, a few hundred now (tests/fuzz/regressions has it too)."""
    text = (
        "kernel ln(X: f32[M, N], g: f32[N], b: f32[N]) -> Y\n  default M = 227, N = 521\n"
        "  mu: f32[M]\n  d: f32[M, N]\n  v: f32[M]\n  r: f32[M]\n  Y: f16[M, N]\n"
        "  for i in 0..M:\n    mu[i] = 0\n    for j in 0..N:\n      mu[i] += X[i, j] / N\n"
        "  for i in 0..M, j in 0..N:\n    d[i, j] = X[i, j] - mu[i]\n"
        "  for i in 0..M:\n    v[i] = 0\n    for j in 0..N:\n      v[i] += d[i, j] * d[i, j] / N\n"
        "  for i in 0..M:\n    r[i] = rsqrt(v[i] + 1e-06)\n"
        "  for i in 0..M, j in 0..N:\n    Y[i, j] = d[i, j] * r[i] * g[j] + b[j]\n")

    def layernorm(X, g, b):
        d = X - X.mean(1, keepdims=True)
        return d / np.sqrt((d * d).mean(1, keepdims=True) + 1e-6) * g + b
    c = run(text, "tile Y.j, 1", layernorm)
    assert tiles(c.source) <= 2 * 521
