"""attn18: one attention head (scores, row max, exp, row sum, P V, division) built on chip by build_attention.py:
NumPy formulas (float64, with the program's roundings) in fp32 and bf16, at tile counts that exercise every part of
the software pipeline (one tile, two, odd counts, the loop plus left-over steps), K stored either way, the exponent
spelled several ways, both NKI dialects; fp32 scores large enough that an exponent without the row max overflows.
The kernel keeps sc and e out of HBM; a head whose intermediate is read elsewhere is built op by op, as before."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.compiler.fusers import Chain
from tilec.lang import api as lang
from tilec.tolerance import max_error, program_budget, scale_of, tolerance

HEAD = """\
kernel attn(Q: {dt}[SQ, D], K: {kdecl}, V: {dt}[SK, DV]) -> O{extra_out}
  default SQ = {sq}, SK = {sk}, D = {d}, DV = {dv}
  sc: {dt}[SQ, SK]
  m: {dt}[SQ]
  e: {dt}[SQ, SK]
  z: {dt}[SQ]
  O: {dt}[SQ, DV]
  for i in 0..SQ, j in 0..SK:
    sc[i, j] = 0
    for d in 0..D:
      sc[i, j] += Q[i, d] * {kread}
  for i in 0..SQ:
    m[i] = -inf
    for j in 0..SK:
      m[i] max= sc[i, j]
  for i in 0..SQ, j in 0..SK:
    e[i, j] = {exponent}
  for i in 0..SQ:
    z[i] = 0
    for j in 0..SK:
      z[i] += e[i, j]
  for i in 0..SQ, d in 0..DV:
    O[i, d] = 0
    for j in 0..SK:
      O[i, d] += e[i, j] * V[j, d]
  for i in 0..SQ, d in 0..DV:
    O[i, d] = O[i, d] / z[i]
"""
SCALED = "exp((sc[i, j] - m[i]) * 0.125)"
NUMPY = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
HEAD_OPS = ("sc", "m", "e", "z", "O_acc", "O")


def source(dt: str = "f32", sq: int = 256, sk: int = 256, d: int = 64, dv: int = 64, exponent: str = SCALED,
           k_rows: bool = True, extra_out: str = "") -> str:
    kdecl, kread = (f"{dt}[SK, D]", "K[j, d]") if k_rows else (f"{dt}[D, SK]", "K[d, j]")
    return HEAD.format(dt=dt, kdecl=kdecl, kread=kread, sq=sq, sk=sk, d=d, dv=dv, exponent=exponent,
                       extra_out=extra_out)


def head_formula(a: dict, dt: str, k_rows: bool, coef: tuple[float, float, float]) -> dict[str, np.ndarray]:
    """The program in float64, rounded to dt where it stores sc, e, z and O_acc."""
    def rnd(x):
        return np.asarray(x).astype(NUMPY[dt]).astype(np.float64)
    k = a["K"] if k_rows else a["K"].T
    sc = rnd(a["Q"] @ k.T)
    m = sc.max(1, keepdims=True)
    e = rnd(np.exp(coef[0] * sc + coef[1] * m + coef[2]))
    z = rnd(e.sum(1, keepdims=True))
    return {"O": rnd(e @ a["V"]) / z, "e": e}


def check(text: str, dt: str, spread: float, coef=(0.125, -0.125, 0.0), k_rows: bool = True, nki: str = "0.6",
          seed: int = 3):
    prog = lang.load(text)
    c = compile_loaded(prog, None, nki)
    rng = np.random.default_rng(seed)
    given = {t.name: (rng.standard_normal(t.shape) * spread).astype(np.float32).astype(NUMPY[dt])
             for t in prog.inputs}
    got = c.run(**given)
    want = head_formula({n: v.astype(np.float64) for n, v in given.items()}, dt, k_rows, coef)
    for out in prog.kernel.outputs:
        expected = want[out].astype(NUMPY[dt]).astype(np.float64)
        acc_len, inter = program_budget(prog).get(out, (1, None))
        tol = tolerance(dt, acc_len, scale_of(expected), inter)
        err = max_error(np.asarray(got[out], np.float64), expected)
        assert np.isfinite(np.asarray(got[out], np.float64)).all(), f"{out}: not finite"
        assert err <= tol, f"{out}: max |kernel - NumPy| {err:.3g} > tolerance {tol:.3g}"
    return c


# (SQ, SK, D, DV): 1 query tile; 2; 3 (fp32: two ahead, one step left over); 5 (fp32: one loop iteration);
# 7 (fp32: the loop and two left over; bf16: one ahead, the loop and none left); bf16 4 (loop and one left);
# 640 keys: a part-full second PSUM bank of scores
SHAPES = [(128, 128, 32, 48), (256, 256, 64, 64), (384, 256, 64, 32), (640, 128, 32, 16), (896, 128, 16, 8),
          (128, 640, 16, 16)]  # the last: keys fill one PSUM bank and part of a second


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp32_head_matches_numpy_and_stays_on_chip(shape):
    sq, sk, d, dv = shape
    # spread 6: |scores| * 0.125 reach ~100, so exp without the row max would overflow fp32
    c = check(source("f32", sq, sk, d, dv), "f32", 6.0)
    assert c.result.chains == (Chain("attention head", HEAD_OPS),)
    assert not any(line.lstrip().startswith(("sc = nl.ndarray", "e = nl.ndarray")) for line in c.source.splitlines())


@pytest.mark.parametrize("shape", [(128, 256, 64, 64), (512, 128, 32, 32), (896, 128, 16, 8), (256, 640, 16, 16)],
                         ids=lambda s: "x".join(map(str, s)))
def test_bf16_head_matches_numpy(shape):
    sq, sk, d, dv = shape
    c = check(source("bf16", sq, sk, d, dv), "bf16", 1.0)
    assert c.result.chains == (Chain("attention head", HEAD_OPS),)


@pytest.mark.parametrize("exponent, coef", [
    ("exp(sc[i, j] * 0.125 - m[i] * 0.125)", (0.125, -0.125, 0.0)),
    ("exp((sc[i, j] - m[i]) / 8)", (0.125, -0.125, 0.0)),
    ("exp(sc[i, j] - m[i])", (1.0, -1.0, 0.0)),
    ("exp(0.5 * (sc[i, j] - m[i]) + 1)", (0.5, -0.5, 1.0)),
])
def test_exponent_spellings(exponent, coef):
    c = check(source("f32", 256, 128, 32, 32, exponent), "f32", 1.0, coef)
    assert c.result.chains == (Chain("attention head", HEAD_OPS),)


def test_keys_stored_contraction_major():
    c = check(source("f32", 384, 256, 64, 32, k_rows=False), "f32", 3.0, k_rows=False)
    assert c.result.chains == (Chain("attention head", HEAD_OPS),)


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_nki_01_dialect(dt):
    check(source(dt, 384, 256, 32, 32), dt, 1.0, nki="0.1")


def test_an_intermediate_read_elsewhere_keeps_the_op_by_op_path():
    c = check(source("f32", 256, 128, 32, 32, extra_out=", e"), "f32", 1.0)
    assert HEAD_OPS not in [part.members for part in c.result.chains]


@pytest.mark.parametrize("dt, by_dma", [("f32", True), ("bf16", False)])
def test_transposes_of_p_follow_the_bottleneck(dt, by_dma):
    """fp32 at S = 1024: TensorE bound (matmuls at the fp32 rate), P^T goes to the DMA queues; bf16: on TensorE."""
    c = compile_loaded(lang.load(source(dt, 1024, 1024, 128, 128)), None, "0.6")
    assert ("nisa.dma_transpose(dst=e_T" in c.source) == by_dma
    assert ("nisa.nc_transpose(dst=e_tp" in c.source) == (not by_dma)


@pytest.mark.parametrize("old, new", [
    ("m[i] = -inf", "m[i] = 0"),  # a max from 0 is not the row max
    (SCALED, "exp(sc[i, j] * m[i])"),  # not a linear form of sc and m
    (SCALED, "exp((sc[i, j] - m[j % 128]) * 0.125)"),  # m read at another index
    ("O[i, d] = O[i, d] / z[i]", "O[i, d] = O[i, d] * z[i]"),  # not the division
    ("O[i, d] += e[i, j] * V[j, d]", "O[i, d] += e[j, i] * V[j, d]"),  # P^T V
])
def test_near_misses_are_not_built_as_a_head(old, new):
    text = source("f32", 256, 256, 32, 32)
    assert old in text
    c = compile_loaded(lang.load(text.replace(old, new)), None, "0.6")
    assert HEAD_OPS not in [part.members for part in c.result.chains]


def test_explain_says_why_a_head_is_built_op_by_op():
    text = source("f32", 256, 256, 32, 32).replace("O[i, d] = O[i, d] / z[i]", "O[i, d] = O[i, d] * z[i]")
    c = compile_loaded(lang.load(text), None, "0.6")
    assert "# attention from sc built op by op: the second matmul does not read e as e[i, j] * V[j, d], or O is " \
           "not O_acc / z" in c.stages["schedule"]
    built = compile_loaded(lang.load(source("f32", 256, 256, 32, 32)), None, "0.6")
    assert "# attention sc -> m -> e -> z -> O_acc -> O on chip" in built.stages["schedule"]
    assert "built op by op" not in built.stages["schedule"]


def test_a_row_chain_of_six_ops_is_not_named_a_head():
    """fuzz regression gaps15_broadcast_reductions.tl: a fused row chain of six reductions was taken for a head by
    the schedule note (KeyError on a ReduceOp's sizes)."""
    import pathlib
    path = pathlib.Path(__file__).parents[1] / "fuzz" / "regressions" / "gaps15_broadcast_reductions.tl"
    c = compile_loaded(lang.load(str(path)), None, "0.6")
    assert "attention head" not in [part.kind for part in c.result.chains]
    assert not any(len(part.members) == 6 and "attention" in line for part in c.result.chains
                   for line in c.stages["schedule"].splitlines())
