"""ffn19: a two-layer MLP (h = f(X W1 + b1); Y = h W2 + b2) built on chip by build_mlp.py, checked against NumPy
(float64, rounded where the program stores h) in fp32 and bf16, gelu and relu, with and without biases, M not a
multiple of 128, Y wider than a PSUM bank, every part of the block pipeline (one block; the loop over pairs of
blocks, a leftover and a part-full last block), both NKI dialects. h never reaches HBM and nothing is transposed on
TensorE; `place h, hbm`, or h read elsewhere, keeps the op-by-op path (same answers)."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler import build_mlp
from tilec.compiler.api import compile_loaded, explain
from tilec.compiler.fusers import Chain
from tilec.lang import api as lang
from tilec.tolerance import max_error, program_budget, scale_of, tolerance

NUMPY = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}


def source(dt: str = "f32", m: int = 200, d: int = 128, h: int = 256, e: int = 64, func: str = "gelu",
           bias: bool = True, extra_out: str = "", y_func: str = "") -> str:
    """The MLP as a user writes it: op 1 with its bias as the initial value, f as its own statement."""
    b1, b2 = (f", b1: {dt}[H]", f", b2: {dt}[E]") if bias else ("", "")
    lines = [f"kernel mlp(X: {dt}[M, D], W1: {dt}[D, H]{b1}, W2: {dt}[H, E]{b2}) -> Y{extra_out}",
             f"  default M = {m}, D = {d}, H = {h}, E = {e}",
             f"  h: {dt}[M, H]", f"  Y: {dt}[M, E]",
             "  for i in 0..M, j in 0..H:", f"    h[i, j] = {'b1[j]' if bias else '0'}",
             "    for k in 0..D:", "      h[i, j] += X[i, k] * W1[k, j]"]
    if func:
        lines += ["  for i in 0..M, j in 0..H:", f"    h[i, j] = {func}(h[i, j])"]
    lines += ["  for i in 0..M, n in 0..E:", f"    Y[i, n] = {'b2[n]' if bias else '0'}",
              "    for j in 0..H:", "      Y[i, n] += h[i, j] * W2[j, n]"]
    if y_func:
        lines += ["  for i in 0..M, n in 0..E:", f"    Y[i, n] = {y_func}(Y[i, n])"]
    return "\n".join(lines) + "\n"


FUNCS = {"gelu": lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))),
         "relu": lambda x: np.maximum(x, 0.0), "": lambda x: x}


def formula(a: dict, dt: str, func: str, y_func: str = "") -> dict[str, np.ndarray]:
    """The program in float64, rounded to dt where it stores h (before and after f) and Y (before y_func)."""
    def rnd(x):
        return np.asarray(x).astype(NUMPY[dt]).astype(np.float64)
    h = rnd(a["X"] @ a["W1"] + a.get("b1", 0.0))
    h = rnd(FUNCS[func](h))
    y = rnd(h @ a["W2"] + a.get("b2", 0.0))
    return {"Y": rnd(FUNCS[y_func](y)), "h": h}


def check(text: str, dt: str, func: str = "gelu", nki: str = "0.6", schedule=None, seed: int = 5, y_func: str = ""):
    prog = lang.load(text)
    c = compile_loaded(prog, schedule, nki)
    rng = np.random.default_rng(seed)
    given = {t.name: rng.standard_normal(t.shape).astype(np.float32).astype(NUMPY[dt]) for t in prog.inputs}
    got = c.run(**given)
    want = formula({n: v.astype(np.float64) for n, v in given.items()}, dt, func, y_func)
    for out in prog.kernel.outputs:
        acc_len, inter = program_budget(prog).get(out, (1, None))
        tol = tolerance(dt, acc_len, scale_of(want[out]), inter)
        err = max_error(np.asarray(got[out], np.float64), want[out])
        assert err <= tol, f"{out}: max |kernel - NumPy| {err:.3g} > tolerance {tol:.3g}"
    return c


def on_chip(c) -> bool:
    """Built by build_mlp: h neither allocated in HBM nor turned by PE transposes."""
    return c.result.chains == (Chain("MLP", ("h", "Y")),) and "h = nl.ndarray" not in c.source \
        and "nc_transpose" not in c.source


@pytest.fixture
def blocks_of_128(monkeypatch):
    """Blocks of 128 rows (the widest that fits otherwise is M itself below 512): small programs reach the loop
    over pairs of blocks."""
    monkeypatch.setattr(build_mlp, "BLOCKS", (128,))


# (M, D, H, E): one block of 200 rows (a full and a part-full row tile); 130 rows; Y of two PSUM banks (600
# columns); W1 in two buffers (640 hidden units: 512 + 128, a tile left over); in four (2176: 512, 512, 1024 (a
# loop over two groups of four PSUM tiles), 128)
@pytest.mark.parametrize("shape", [(200, 128, 256, 64), (130, 256, 128, 32), (128, 128, 128, 600),
                                   (64, 128, 640, 48), (64, 128, 2176, 48)], ids=lambda s: "x".join(map(str, s)))
def test_fp32_mlp_matches_numpy_on_chip(shape):
    m, d, h, e = shape
    assert on_chip(check(source("f32", m, d, h, e), "f32"))


@pytest.mark.parametrize("m", [384, 600, 700], ids=lambda m: f"M{m}")
def test_the_block_pipeline(blocks_of_128, m):
    """3 blocks: one pair (written out), nothing left over; 600: a pair, a leftover block and a part-full last (88
    rows); 700: 5 full blocks (a loop over two pairs) and 60 rows."""
    c = check(source("f32", m, 128, 256, 32), "f32")
    assert on_chip(c)
    assert ("for m_b in range(2):" in c.source) == (m == 700)


@pytest.mark.parametrize("func", ["relu", ""])
def test_relu_or_none_and_no_bias(func):
    assert on_chip(check(source("f32", 150, 128, 256, 40, func=func, bias=False), "f32", func))


@pytest.mark.parametrize("bias", [True, False])
def test_a_function_of_y_too(bias):
    """Y = relu(h W2 + b2) (a deeper MLP's next layer reads it): applied on Y's eviction."""
    c = check(source("f32", 150, 128, 256, 40, bias=bias, y_func="relu"), "f32", y_func="relu")
    assert on_chip(c)


@pytest.mark.parametrize("func", ["gelu", "relu"])
def test_bf16(func):
    assert on_chip(check(source("bf16", 200, 256, 256, 64, func=func), "bf16", func))


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_nki_01_dialect(blocks_of_128, dt):
    assert on_chip(check(source(dt, 300, 128, 256, 32), dt, nki="0.1"))


def test_place_h_hbm_keeps_the_op_by_op_path():
    text = source("f32", 200, 128, 256, 64)
    c = check(text, "f32", schedule=lang.parse_schedule("place h, hbm\n", "<schedule>"))
    assert c.result.chains == () and "h = nl.ndarray" in c.source
    assert "# MLP h -> Y built op by op: a directive names h or Y" in c.stages["schedule"]


def test_h_read_elsewhere_keeps_the_op_by_op_path():
    c = check(source("f32", 200, 128, 256, 64, extra_out=", h"), "f32")
    assert c.result.chains == ()


def test_explain_says_where_h_goes():
    c = compile_loaded(lang.load(source("f32", 200, 128, 256, 64)), None, "0.6")
    text = explain(c)
    assert "h            never in HBM: fused into the MLP writing Y" in text
    assert "# MLP h -> Y on chip by blocks of 200 rows" in text


def test_place_h_sbuf_says_it_is_the_default():
    from tilec.errors import TilecError
    with pytest.raises(TilecError, match="h stays in SBUF by default when the two matmuls form an MLP") as err:
        compile_loaded(lang.load(source()), lang.parse_schedule("place h, sbuf\n", "<schedule>"), "0.6")
    assert err.value.span is not None


def test_y_wider_than_the_psum_banks_is_built_op_by_op():
    c = compile_loaded(lang.load(source("f32", 128, 128, 128, 3200)), None, "0.6")
    assert c.result.chains == ()
    assert "# MLP h -> Y built op by op: Y is wider than 6 PSUM banks of fp32" in c.stages["schedule"]


def test_the_tuner_builds_the_space_of_an_mlp(tmp_path):
    """The fused MLP's matmuls offer no tile knobs; the space's lower bound left them out (it raised KeyError
    'tile h.i' in `tilec tune`)."""
    from tilec.tune.evaluate import Job
    from tilec.tune.knobs import build_space
    path = tmp_path / "mlp.tl"
    path.write_text(source("bf16", 200, 128, 256, 64))
    space = build_space(Job.of(str(path), {}))
    assert space.lower_bound(space.default_point()) >= 0.0
