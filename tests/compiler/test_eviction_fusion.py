"""Issue 13's fusion clause: any element-wise consumer of a matmul or conv (bias, scale, relu, residual add of another
input, clamp) runs on the PSUM eviction, so the contraction's result never goes to HBM. A user writes the consumer
as its own statement over the conv's tensor (`Y = relu(conv + b[k])`): each form below is run on the interpreter
against a NumPy formula, and `tilec explain`'s placement must say the conv never reaches HBM. audit13 found the
forms after the first four going through an HBM scratch and back (strict xfails until fuse15's eviction_fusion.py:
one chain over the function table, for conv, matmul and matrix-vector products)."""
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


def _col(v: np.ndarray) -> np.ndarray:
    return v[:, None, None]


# consumer -> the NumPy formula of Y from the conv and the inputs (None: not a chain, stays unfused)
CONSUMERS = {
    f"relu({C})": lambda c, a: np.maximum(c, 0),
    f"max({C}, 0)": lambda c, a: np.maximum(c, 0),
    f"{C} + S[n, k, y, x]": lambda c, a: c + a["S"],
    f"relu({C} + S[n, k, y, x])": lambda c, a: np.maximum(c + a["S"], 0),
    f"{C} + b[k]": lambda c, a: c + _col(a["b"]),
    f"relu({C} + b[k])": lambda c, a: np.maximum(c + _col(a["b"]), 0),
    f"2 * {C}": lambda c, a: 2 * c,
    f"{C} * g[k] + b[k]": lambda c, a: c * _col(a["g"]) + _col(a["b"]),
    f"min(relu({C}), 6)": lambda c, a: np.clip(c, 0, 6),
    f"min(max({C}, -1), 1)": lambda c, a: np.clip(c, -1, 1),
    f"{C} + S[n, k, y, x] + b[k]": lambda c, a: c + a["S"] + _col(a["b"]),
    # more of the chain (fuse15): activations of the function table, reversed and divided operands, a constant
    # added, a relu after a scaled residual
    f"tanh(0.5 * {C}) - b[k]": lambda c, a: np.tanh(0.5 * c) - _col(a["b"]),
    f"1 - {C} / (g[k] + 2)": None,  # (not a chain: a vector's arithmetic; see NOT_A_CHAIN)
    f"1 - {C} / g[k]": lambda c, a: 1 - c / _col(a["g"]),
    f"-{C} + 0.25": lambda c, a: 0.25 - c,
    f"relu(2 * {C} + S[n, k, y, x])": lambda c, a: np.maximum(2 * c + a["S"], 0),
    f"exp(min({C}, 0)) * g[k]": lambda c, a: np.exp(np.minimum(c, 0)) * _col(a["g"]),
}
NOT_A_CHAIN = {k for k, v in CONSUMERS.items() if v is None}
for _k in NOT_A_CHAIN:
    del CONSUMERS[_k]


def conv_same(x: np.ndarray, wt: np.ndarray) -> np.ndarray:
    """torch conv2d(x, wt, padding=1), float64."""
    xp = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)])
    h, w = x.shape[2:]
    return sum(np.einsum("nchw,kc->nkhw", xp[:, :, r:r + h, s:s + w], wt[:, :, r, s])
               for r in range(3) for s in range(3))


@pytest.mark.parametrize("consumer", list(CONSUMERS))
def test_element_wise_consumer_runs_on_the_eviction(consumer: str) -> None:
    program = lang.load(PROGRAM.format(consumer=consumer))
    compiled = compile_loaded(program)
    rng = np.random.default_rng(5)
    inputs = {t.name: rng.random(t.shape, dtype=np.float32) - 0.5 for t in program.inputs}
    a = {k: v.astype(np.float64) for k, v in inputs.items()}
    want = CONSUMERS[consumer](conv_same(a["X"], a["Wt"]), a)
    got = compiled.run(**inputs)["Y"]
    acc_len, inter = program_budget(program)["Y"]
    assert max_error(got, want) <= tolerance("f32", acc_len, scale_of(want), inter)
    placement = explain(compiled).split("tensor placement:")[1]
    conv_line = next(line for line in placement.splitlines() if line.split()[:1] == ["conv"])
    assert "never in HBM" in conv_line, conv_line


def _run_checked(text: str, want, dtype: str, out: str = "Y") -> str:
    """Run `text` on the interpreter with random inputs of `dtype`, check `out` against want(inputs as float64,
    rounded as the program stores its 16-bit intermediates), return explain's placement."""
    import ml_dtypes
    program = lang.load(text)
    compiled = compile_loaded(program)
    rng = np.random.default_rng(7)
    np_dt = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}[dtype]
    inputs = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(np_dt) for t in program.inputs}
    a = {k: v.astype(np.float64) for k, v in inputs.items()}
    rnd = (lambda v: v.astype(np_dt).astype(np.float64))
    expected = want(a, rnd)
    got = compiled.run(**inputs)[out].astype(np.float64)
    acc_len, inter = program_budget(program)[out]
    assert max_error(got, expected) <= tolerance(dtype, acc_len, scale_of(expected), inter)
    return explain(compiled).split("tensor placement:")[1]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("consumer", [f"{C} * g[k] + b[k]", f"min(max({C} + b[k], 0), 6)",
                                      f"{C} + S[n, k, y, x] + b[k]", f"tanh(0.5 * {C}) - b[k]"])
def test_narrow_dtypes_and_batches(consumer: str, n: int, dtype: str) -> None:
    """16-bit programs (conv stored rounded to the dtype before the consumer reads it) at batch 1 and 8."""
    text = PROGRAM.format(consumer=consumer).replace("f32", dtype).replace(
        "default N = 2, C = 136, H = 12, W = 23, K = 136", f"default N = {n}, C = 72, H = 6, W = 9, K = 136")
    formulas = {f"{C} * g[k] + b[k]": lambda c, a: c * _col(a["g"]) + _col(a["b"]),
                f"min(max({C} + b[k], 0), 6)": lambda c, a: np.clip(c + _col(a["b"]), 0, 6),
                f"{C} + S[n, k, y, x] + b[k]": lambda c, a: c + a["S"] + _col(a["b"]),
                f"tanh(0.5 * {C}) - b[k]": lambda c, a: np.tanh(0.5 * c) - _col(a["b"])}
    placement = _run_checked(text, lambda a, rnd: formulas[consumer](rnd(conv_same(a["X"], a["Wt"])), a), dtype)
    assert "never in HBM" in next(line for line in placement.splitlines() if line.split()[:1] == ["conv"])


MATMUL = """\
kernel mm(A: {dt}[M, K], B: {dt}[K, J], b: {dt}[M], g: {dt}[M]) -> Y
  default M = 200, K = 160, J = 300
  t: {dt}[M, J]
  Y: {dt}[M, J]
  for i in 0..M, j in 0..J:
    t[i, j] = 0
    for k in 0..K:
      t[i, j] += A[i, k] * B[k, j]
  for i in 0..M, j in 0..J:
    Y[i, j] = {consumer}
"""

MATVEC = """\
kernel mv(W: {dt}[M, K], v: {dt}[K], b: {dt}[M], g: {dt}[M]) -> Y
  default M = 1000, K = 2048
  t: {dt}[M]
  Y: {dt}[M]
  for i in 0..M:
    t[i] = 0
    for k in 0..K:
      t[i] += W[i, k] * v[k]
  for i in 0..M:
    Y[i] = {consumer}
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("consumer", ["relu({t} + b[i])", "min(max({t} * g[i] + b[i], 0), 6)", "exp(-{t}) / 4"])
def test_matmul_and_matvec_consumers(consumer: str, dtype: str) -> None:
    formulas = {"relu({t} + b[i])": lambda t, a: np.maximum(t + a["b"], 0),
                "min(max({t} * g[i] + b[i], 0), 6)": lambda t, a: np.clip(t * a["g"] + a["b"], 0, 6),
                "exp(-{t}) / 4": lambda t, a: np.exp(-t) / 4}
    f = formulas[consumer]
    text = MATMUL.format(dt=dtype, consumer=consumer.format(t="t[i, j]"))
    placement = _run_checked(text, lambda a, rnd: f(rnd(a["A"] @ a["B"]).T, {k: v for k, v in a.items()}).T
                             if False else _cols(f, rnd(a["A"] @ a["B"]), a), dtype)
    assert "never in HBM" in next(line for line in placement.splitlines() if line.split()[:1] == ["t"])
    text = MATVEC.format(dt=dtype, consumer=consumer.format(t="t[i]"))
    placement = _run_checked(text, lambda a, rnd: f(rnd(a["W"] @ a["v"]), a), dtype)
    assert "never in HBM" in next(line for line in placement.splitlines() if line.split()[:1] == ["t"])


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_matmul_row_bias_consumer(dtype: str) -> None:
    """A linear layer's bias along the output columns, `relu(t[i, j] + c[j])`, as its own statement: the matmul's
    row bias (broadcast once, added on the eviction) for fp32; a 16-bit t rounds before the add, so there the row
    is a step of the eviction's chain after the rounding (evict24: a row replicated on every partition)."""
    text = MATMUL.replace("g: {dt}[M]", "c: {dt}[J]").format(dt=dtype, consumer="relu(t[i, j] + c[j])")
    placement = _run_checked(text, lambda a, rnd: np.maximum(rnd(a["A"] @ a["B"]) + a["c"][None, :], 0), dtype)
    line = " ".join(placement.split("\n  t ")[1].split("\n  Y ")[0].split())
    assert "never in HBM" in line, line


def _cols(f, t: np.ndarray, a: dict) -> np.ndarray:
    """f with the vectors b[i], g[i] along the rows of a matrix t."""
    return f(t, {**a, "b": a["b"][:, None], "g": a["g"][:, None]})


MATVEC_INIT = """\
kernel mv(W: {dt}[M, K], v: {dt}[K], b: {dt}[M]) -> y
  default M = 1000, K = 2048
  y: {dt}[M]
  for i in 0..M:
    y[i] = b[i]
    for k in 0..K:
      y[i] += W[i, k] * v[k]
    y[i] = relu(y[i])
"""


@pytest.mark.parametrize("text", [MATVEC.format(dt="f32", consumer="relu(t[i] + b[i])"),
                                  MATVEC_INIT.format(dt="f32"), MATVEC_INIT.format(dt="bf16")])
def test_matvec_epilogue_stays_on_the_matvec_builder(text: str) -> None:
    """audit13: a bias + relu epilogue (a separate statement, or the bias as the initial value and an in-place
    relu) pushed a matrix-vector product off its builder (PE transposes of W, 2.4x of the floor)."""
    from tilec.compiler import wrap
    out = "Y" if "-> Y" in text else "y"
    dtype = "bf16" if "bf16" in text else "f32"
    _run_checked(text, lambda a, rnd: np.maximum(a["W"] @ a["v"] + a["b"], 0), dtype, out)
    source = wrap.unwrap(compile_loaded(lang.load(text)).source)
    assert "summed along the free axis" in source or "transposed on TensorE in groups" in source


def test_depthwise_16bit_bias_chain_is_explained() -> None:
    """A 16-bit depthwise conv's separate bias + relu6 stays unfused (its kernel has no chain steps, the rounding
    precedes the bias): explain says so."""
    text = """\
kernel dw(X: bf16[N, C, H, W], Wt: bf16[C, 3, 3], b: bf16[C]) -> Y
  default N = 1, C = 144, H = 20, W = 20
  D: bf16[N, C, H, W]
  Y: bf16[N, C, H, W]
  for n in 0..N, c in 0..C, y in 0..H, x in 0..W:
    D[n, c, y, x] = 0
    for r in 0..3, s in 0..3:
      D[n, c, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[c, r, s]
  for n in 0..N, c in 0..C, y in 0..H, x in 0..W:
    Y[n, c, y, x] = min(max(D[n, c, y, x] + b[c], 0), 6)
"""
    placement = " ".join(explain(compile_loaded(lang.load(text))).split("tensor placement:")[1].split())
    assert "D HBM scratch" in placement and "its producer is a depthwise conv" in placement


@pytest.mark.parametrize("consumer", [f"{C} * {C}", *NOT_A_CHAIN])
def test_explain_says_why_a_consumer_is_not_fused(consumer: str) -> None:
    """The contraction read twice, or an operand that is arithmetic on a vector: its own nest, conv in HBM."""
    program = lang.load(PROGRAM.format(consumer=consumer))
    placement = explain(compile_loaded(program)).split("tensor placement:")[1]
    text = " ".join(placement.split())
    assert "conv HBM scratch" in text and "not an element-wise chain the PSUM eviction computes" in text
