"""Issue 13's fusion clause: any element-wise consumer of a matmul or conv (bias, scale, relu, residual add of another
input, clamp) runs on the PSUM eviction, so the contraction's result never goes to HBM. A user writes the consumer
as its own statement over the conv's tensor (`Y = relu(conv + b[k])`): each form below is run on the interpreter
against a NumPy formula, and `tilec explain`'s placement must say the conv never reaches HBM. The forms the compiler
does not fuse yet (they go through an HBM scratch and back; audit13 found them) are strict xfails: they pass, and so
fail, once fused."""
from __future__ import annotations

import numpy as np
import pytest

from tilec.compiler.api import compile_loaded, explain
from tilec.lang import api as lang
from tilec.tolerance import max_error, program_budget, scale_of, tolerance

PROGRAM = """\
kernel eviction(X: f32[N, C, H, W], Wt: f32[K, C, 3, 3], b: f32[K], g: f32[K], S: f32[N, K, H, W]) -> Y
  default N = 2, C = 136, H = 12, W = 23, K = 136
  conv: f32[N, K, H, W]
  Y: f32[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    conv[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      conv[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = {consumer}
"""
C = "conv[n, k, y, x]"
NOT_FUSED = "the consumer is built as its own loop nest: conv goes through HBM (audit13)"


def _col(v: np.ndarray) -> np.ndarray:
    return v[:, None, None]


# consumer -> (NumPy formula of Y from the conv and the inputs, fused today)
CONSUMERS = {
    f"relu({C})": (lambda c, a: np.maximum(c, 0), True),
    f"max({C}, 0)": (lambda c, a: np.maximum(c, 0), True),
    f"{C} + S[n, k, y, x]": (lambda c, a: c + a["S"], True),
    f"relu({C} + S[n, k, y, x])": (lambda c, a: np.maximum(c + a["S"], 0), True),
    f"{C} + b[k]": (lambda c, a: c + _col(a["b"]), False),
    f"relu({C} + b[k])": (lambda c, a: np.maximum(c + _col(a["b"]), 0), False),
    f"2 * {C}": (lambda c, a: 2 * c, False),
    f"{C} * g[k] + b[k]": (lambda c, a: c * _col(a["g"]) + _col(a["b"]), False),
    f"min(relu({C}), 6)": (lambda c, a: np.clip(c, 0, 6), False),
    f"min(max({C}, -1), 1)": (lambda c, a: np.clip(c, -1, 1), False),
    f"{C} + S[n, k, y, x] + b[k]": (lambda c, a: c + a["S"] + _col(a["b"]), False),
}


def conv_same(x: np.ndarray, wt: np.ndarray) -> np.ndarray:
    """torch conv2d(x, wt, padding=1), float64."""
    xp = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)])
    h, w = x.shape[2:]
    return sum(np.einsum("nchw,kc->nkhw", xp[:, :, r:r + h, s:s + w], wt[:, :, r, s])
               for r in range(3) for s in range(3))


@pytest.mark.parametrize("consumer", [
    pytest.param(text)
    for text, (_, fused) in CONSUMERS.items()])
def test_element_wise_consumer_runs_on_the_eviction(consumer: str) -> None:
    program = lang.load(PROGRAM.format(consumer=consumer))
    compiled = compile_loaded(program)
    rng = np.random.default_rng(5)
    inputs = {t.name: rng.random(t.shape, dtype=np.float32) - 0.5 for t in program.inputs}
    a = {k: v.astype(np.float64) for k, v in inputs.items()}
    want = CONSUMERS[consumer][0](conv_same(a["X"], a["Wt"]), a)
    got = compiled.run(**inputs)["Y"]
    acc_len, inter = program_budget(program)["Y"]
    assert max_error(got, want) <= tolerance("f32", acc_len, scale_of(want), inter)
    placement = explain(compiled).split("tensor placement:")[1]
    conv_line = next(line for line in placement.splitlines() if line.split()[:1] == ["conv"])
    assert "never in HBM" in conv_line, conv_line
