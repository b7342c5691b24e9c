"""Shared helpers for compiler tests: compile a .tl example (optionally in another dtype), run it on the NKI
interpreter, compare with LANG's reference evaluator (an independent NumPy implementation of the program)."""
from __future__ import annotations

import pathlib

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler.api import Compiled, compile_loaded
from tilec.lang import api as lang
from tilec.tolerance import max_error, program_budget, scale_of, tolerance

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def program(name: str, sizes: dict[str, int] | None = None, dtype: str = "f32"):
    path = EXAMPLES / f"{name}.tl"
    if dtype == "f32":
        return lang.load(str(path), sizes)
    return lang.load(path.read_text().replace("f32", dtype), sizes)


def compile_example(name: str, sizes=None, dtype: str = "f32", schedule: str | None = None) -> Compiled:
    prog = program(name, sizes, dtype)
    directives = lang.parse_schedule(schedule, "<test schedule>") if schedule is not None else None
    return compile_loaded(prog, directives)


def inputs_for(prog, seed: int = 42) -> dict[str, np.ndarray]:
    """Uniform [0, 1) inputs, as the assignment's harness (np.random.rand): with signed inputs the sums cancel and
    np.allclose's relative tolerance would judge summation order, not correctness."""
    rng = np.random.default_rng(seed)
    return {t.name: rng.random(t.shape, dtype=np.float32) for t in prog.inputs}


MATMUL_UPDATE = """\
kernel mm(A: f32[M, K], B: f32[K, N]) -> C
  default M = {M}, K = {K}, N = 260
  C: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += {update}
"""


def compile_and_run(text: str, nki: str, schedule: str | None = None):
    """The program in `text` compiled for NKI `nki` (with `schedule`'s directives, if any) and run on its inputs
    (inputs_for): (program, compiled, inputs, outputs)."""
    prog = lang.load(text)
    c = compile_loaded(prog, lang.parse_schedule(schedule, "<test>") if schedule else None, nki)
    inputs = inputs_for(prog)
    return prog, c, inputs, c.run(**inputs)


def matmul_update(update: str, M: int = 200, K: int = 300) -> str:
    """A matmul written with `update` as its contraction's term (a sign, a factor, a relu of an operand)."""
    return MATMUL_UPDATE.format(update=update, M=M, K=K)


def conv_valid(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """NumPy reference of an unpadded, stride-1 conv: x [N, C, H, W], w [K, C, R, S] -> [N, K, H-R+1, W-S+1]."""
    R, S = w.shape[2:]
    Ho, Wo = x.shape[2] - R + 1, x.shape[3] - S + 1
    out = np.zeros((x.shape[0], w.shape[0], Ho, Wo))
    for r in range(R):
        for s in range(S):
            out += np.einsum("nchw,kc->nkhw", x[:, :, r:r + Ho, s:s + Wo], w[:, :, r, s])
    return out


def run_signed(src: str, dtype: str, seed: int):
    """Compile `src` with its f32 tensors in `dtype` and run it on inputs in [-0.5, 0.5) (signed: a relu or a sign
    changes the result), exact in `dtype` (the interpreter rounds bf16 inputs). Returns (program, compiled, outputs,
    the inputs in float64 for the NumPy formula)."""
    prog = lang.load(src.replace("f32", dtype))
    c = compile_loaded(prog)
    rng = np.random.default_rng(seed)
    inputs = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5) for t in prog.inputs}
    if dtype == "f16":
        inputs = {k: v.astype(np.float16) for k, v in inputs.items()}
    if dtype == "bf16":
        inputs = {k: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in inputs.items()}
    out = c.run(**inputs)
    return prog, c, out, {k: np.asarray(v, np.float64) for k, v in inputs.items()}


def run_in_own_dtypes(text: str, seed: int, scale: float = 2.0):
    """Compile `text` as written (its tensors' own dtypes, which may differ) and run it on inputs uniform in
    [-scale / 2, scale / 2), rounded to each input's dtype. Returns (program, outputs, the inputs in float64)."""
    prog = lang.load(text)
    rng = np.random.default_rng(seed)
    inputs = {}
    for t in prog.inputs:
        x = (rng.random(t.shape, dtype=np.float32) - np.float32(0.5)) * np.float32(scale)
        narrow = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}.get(t.dtype)
        inputs[t.name] = x.astype(narrow) if narrow else x
    out = compile_loaded(prog).run(**inputs)
    return prog, out, {k: np.asarray(v, np.float64) for k, v in inputs.items()}


def only_conv(prog):
    """The program's one contraction (ConvOp) as selection made it."""
    from tilec.compiler.ops import ConvOp
    from tilec.compiler.pipeline import compile_program
    conv, = [op for op in compile_program(prog).ops if isinstance(op, ConvOp)]
    return conv


def assert_located_refusal(src: str, line: int, golden, path: str) -> None:
    """Compiling src is refused with a TilecError at `line` that has a hint; its rendering is the golden `path`."""
    from tilec.errors import TilecError

    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load(src))
    assert err.value.span is not None and err.value.span.line == line and err.value.hint
    golden.check(path, err.value.render() + "\n")


def assert_matches(program, name: str, got, want) -> None:
    """One output against its expected values within the project's one tolerance policy (tilec/tolerance.py, as
    `tilec run`, the tuner and the fuzzer): the accumulation length and narrow intermediates of `name` are read from
    the program, the scale from the expected values."""
    acc_len, inter = program_budget(program).get(name, (1, None))
    tol = tolerance(program.tensors[name].dtype, acc_len, scale_of(want), inter)
    err = max_error(np.asarray(got, np.float32), np.asarray(want, np.float32))
    assert err <= tol, f"{name}: max |kernel - expected| {err:.3g} > tolerance {tol:.3g}"


def check_against_reference(c: Compiled, seed: int = 42, traced: bool = False):
    prog = c.program
    inputs = inputs_for(prog, seed)
    ref = lang.evaluate(prog, inputs)
    if traced:
        out, trace = c.run_traced(**inputs)
    else:
        out, trace = c.run(**inputs), None
    for name, expect in ref.items():
        assert np.shape(out[name]) == np.shape(expect)
        assert_matches(prog, name, out[name], expect)
    return trace


def words(source: str) -> str:
    """A kernel's text with comment wraps undone (a block's label spans several `#` lines)."""
    return " ".join(source.replace("#", " ").split())


def assert_formula_matches(compiled: Compiled, formula, label: str, seed: int = 16) -> None:
    """The compiled program on uniform inputs in [-0.5, 0.5) (in each input's dtype) against `formula` of those
    inputs in float64, each output rounded to its own dtype first (the store's rounding), within the project's
    tolerance policy (tilec/tolerance.py), compared in float64."""
    program = compiled.program
    dtypes = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
    rng = np.random.default_rng(seed)
    given = {t.name: (rng.random(t.shape) - 0.5).astype(np.float32).astype(dtypes[t.dtype]) for t in program.inputs}
    want = formula({k: v.astype(np.float64) for k, v in given.items()})
    got = compiled.run(**given)
    for out, expected in want.items():
        out_dtype = program.tensors[out].dtype
        expected = np.asarray(expected).astype(dtypes[out_dtype]).astype(np.float64)
        assert np.shape(got[out]) == expected.shape
        acc_len, inter = program_budget(program).get(out, (1, None))
        tol = tolerance(out_dtype, acc_len, scale_of(expected), inter)
        err = max_error(np.asarray(got[out], np.float64), expected)
        assert err <= tol, f"{label}: max |kernel - NumPy| {err:.3g} > tolerance {tol:.3g}"


INLINE = """\
kernel attn(Q: {dt}[S, D], K: {dt}[T, D], V: {dt}[T, D]{mask}) -> O
  default S = {s}, T = {t}, D = {d}
  sc: {inner}[S, T]
  m: {inner}[S]
  z: {inner}[S]
  O: {inner}[S, D]
  for i in 0..S, j in 0..T:
    sc[i, j] = {init}
    for d in 0..D:
      sc[i, j] += Q[i, d] * K[j, d] * 0.125
  for i in 0..S:
    m[i] = -inf
    for j in 0..T:
      m[i] max= sc[i, j]
  for i in 0..S:
    z[i] = 0
    for j in 0..T:
      z[i] += exp(sc[i, j] - m[i])
  for i in 0..S, d in 0..D:
    O[i, d] = 0
    for j in 0..T:
      O[i, d] += exp(sc[i, j] - m[i]) / z[i] * {vread}
"""


def inline_attention(dt: str, s: int, t: int, d: int, inner: str | None = None, masked: bool = False) -> str:
    """One attention head written inline (the normalisation inside P V's sum) with inputs in dt, the rest in
    `inner` (then V read as `f32(V[j, d])`), the scores started from a mask Mk when `masked`."""
    inner = inner or dt
    vread = "f32(V[j, d])" if inner != dt else "V[j, d]"
    return INLINE.format(dt=dt, inner=inner, s=s, t=t, d=d, vread=vread, mask=f", Mk: {inner}[S, T]" if masked else "",
                         init="Mk[i, j]" if masked else "0")
