"""attn22: attention written inline (`O[i, d] += exp(sc[i, t] - m[i]) / z[i] * V[t, d]`) in bf16 and in mixed
dtypes reaches the fused head (build_attention.py) through operand_split's f32 weights and V's exact f32 copy:

  * O and V bf16: P is carried in bf16 on TensorE (the head's own rounding, which tilec/tolerance.py names:
    `rounded_operand`), V loaded once in bf16, no f32 copy;
  * O f32 with V bf16 converted by the user (`f32(V[t, d])`): P V in fp32, V converted on chip.

Each kernel against a NumPy float64 formula with the program's roundings (and, in bf16, P's), at shapes of several
query tiles and a part-full PSUM bank of keys; with a causal mask too (added on the scores' eviction)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import inline_attention as program
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from tilec.lang import syntax as sx
from tilec.tolerance import max_error, mismatches, program_budget, rounded_operand, scale_of, tolerance

NUMPY = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}


def rnd(x, dt: str) -> np.ndarray:
    return np.asarray(x).astype(NUMPY[dt]).astype(np.float64)


def formula(a: dict, inner: str, p_dtype: str) -> np.ndarray:
    """The program in float64 rounded where it stores (sc, z in `inner`), P in `p_dtype` (the head's operand)."""
    sc = rnd(a["Q"] @ a["K"].T * 0.125 + a.get("Mk", 0.0), inner)
    e = np.exp(sc - sc.max(1, keepdims=True))
    z = rnd(e.sum(1, keepdims=True), inner)
    return rnd(rnd(e, p_dtype) @ a["V"], inner) / z


def run(text: str, dt: str, inner: str, seed: int = 5):
    prog = lang.load(text)
    c = compile_loaded(prog, None, "0.6")
    rng = np.random.default_rng(seed)
    given = {t.name: (rng.standard_normal(t.shape) * 2.0).astype(np.float32).astype(NUMPY[dt]) for t in prog.inputs}
    if "Mk" in given:  # causal: 0 on and below the diagonal, -1e9 above
        given["Mk"] = np.triu(np.full(given["Mk"].shape, -1e9, np.float32), 1).astype(NUMPY[inner])
    got = np.asarray(c.run(**given)["O"], np.float64)
    return prog, c, got, {n: v.astype(np.float64) for n, v in given.items()}


def assert_close(prog, got: np.ndarray, want: np.ndarray, dt: str) -> None:
    acc_len, inter = program_budget(prog)["O"]
    tol = tolerance(dt, acc_len, scale_of(want), inter)
    err = max_error(got, want.astype(NUMPY[dt]).astype(np.float64))
    assert err <= tol, f"O: max |kernel - NumPy| {err:.3g} > tolerance {tol:.3g}"


def head_built(c) -> bool:
    return any(part.kind == "attention head" for part in c.result.chains)


# (S, T, D): 3 query tiles (bf16: 3 ahead, all written out); 5; 9 (the loop of 4 steps once, 2 steps left over);
# 1 tile; 640 keys (a part-full second PSUM bank of scores)
@pytest.mark.parametrize("shape", [(384, 256, 64), (640, 128, 32), (1152, 128, 16), (128, 256, 32), (256, 640, 16)],
                         ids=lambda s: "x".join(map(str, s)))
def test_bf16_inline_head_carries_p_in_bf16(shape):
    prog, c, got, a = run(program("bf16", *shape), "bf16", "bf16")
    assert head_built(c)
    kernel = c.source
    assert "V_f32_tiles" not in kernel and "V_f32 = " not in kernel  # V loaded in bf16 once, never copied to f32
    assert "z_terms_rows = nl.ndarray((128, SIZE_T), dtype=nl.bfloat16" in kernel  # P written in bf16 by the exp
    assert_close(prog, got, formula(a, "bf16", "bf16"), "bf16")
    assert not mismatches(prog, {"O": got}, {"O": lang.evaluate(prog, a)["O"]}, a)  # and the policy's own check


@pytest.mark.parametrize("shape", [(384, 256, 64), (256, 640, 16)], ids=lambda s: "x".join(map(str, s)))
def test_f32_output_with_converted_v_keeps_p_in_f32(shape):
    prog, c, got, a = run(program("bf16", *shape, inner="f32"), "bf16", "f32")
    assert head_built(c)
    assert "V_f32_tiles = nl.ndarray" in c.source and "nisa.tensor_copy(dst=V_f32_tiles, src=V_tiles)" in c.source
    assert_close(prog, got, formula(a, "f32", "f32"), "f32")


def test_f32_inline_head_is_unchanged():
    prog, c, got, a = run(program("f32", 384, 256, 32), "f32", "f32")
    assert head_built(c) and "V_f32_tiles" not in c.source
    assert_close(prog, got, formula(a, "f32", "f32"), "f32")


# (S, T, D, dtype): f32 on the DMA path (3 tiles), bf16 on the PE path (1, 3 and 6 tiles: the loop of 5 steps once)
@pytest.mark.parametrize("s, t, d, dt", [(384, 256, 32, "f32"), (128, 256, 32, "bf16"), (384, 256, 32, "bf16"),
                                         (768, 128, 16, "bf16")], ids=lambda v: str(v))
def test_causal_mask_inline_head_matches_numpy(s, t, d, dt):
    prog, c, got, a = run(program(dt, s, t, d, masked=True), dt, dt)
    assert head_built(c)  # the mask added on the scores' eviction, its rows loaded a step ahead
    assert "Mk_rows" in c.source and "sc = nl.ndarray" not in c.source
    assert np.isfinite(got).all()
    assert_close(prog, got, formula(a, dt, dt), dt)


def test_the_named_rounding_is_a_16_bit_sum_of_a_computed_factor_beside_a_read_of_its_dtype():
    def stmt(value: str, dt: str = "bf16") -> str | None:
        prog = lang.load(f"""\
kernel k(A: bf16[N, N], B: bf16[N, N], F: f32[N, N]) -> O
  default N = 128
  O: {dt}[N, N]
  for i in 0..N, j in 0..N:
    O[i, j] = 0
    for t in 0..N:
      O[i, j] += {value}
""")
        dtypes = {n: t.dtype for n, t in prog.tensors.items()}
        loop = prog.kernel.body[0]
        while not isinstance(loop, sx.Assign):
            loop = loop.body[-1]
        return rounded_operand(loop, dtypes)

    assert stmt("exp(A[i, t]) * B[t, j]") == "bf16"
    assert stmt("A[i, t] * B[t, j]") is None  # both plain reads: nothing rounded
    assert stmt("exp(f32(A[i, t])) * F[t, j]", "f32") is None  # an f32 sum: no 16-bit operand rounding


def test_a_masked_bf16_head_is_planned_by_the_buffers_it_allocates():
    # S = 1536: 4 deep, the steps written out around the loop allocated 231 KiB in straight-line code (rejected by the
    # capacity check) though a set per tile in flight fitted; the plan measures the built head and goes 1 deep
    c = compile_loaded(lang.load(program("bf16", 1536, 1536, 128, masked=True)), None, "0.6")
    assert head_built(c) and "P V 1 tile behind" in c.source
