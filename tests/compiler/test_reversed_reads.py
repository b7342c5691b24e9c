"""Reversed reads (torch.flip: `Y[i, j] = f(A[N - 1 - i, j])`, `A[i, M - 1 - j]`), gaps12's design built by gaps14:
the layout's groups of loops meet where a read turns, so each new loop is read one way; a reversed free axis is
loaded forward and read backwards by the first engine instruction (0.6 `.ap()` with a negative free step, 0.1 an
affine index of nl.arange with coefficient -1); reversed partitions are reversed by the DMA that loads them (0.6 a
negative-stride HBM access pattern, 0.1 an indirect DMA whose rows an iota tile names: runtimes of the 0.1 era moved
negative-stride DMA patterns wrongly). A reduction that sums over a reversed loop sums the same values forward; one
whose kept loop is reversed reads a reversed copy. Every case is checked on the interpreter against NumPy formulas
in float64 (signed inputs), in both NKI dialects."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_located_refusal, assert_matches
from tilec.compiler import wrap
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

DIALECTS = ["0.1", "0.6"]


def _run(src: str, nki: str, dtype: str = "f32", seed: int = 3):
    prog = lang.load(src.replace("f32", dtype))
    c = compile_loaded(prog, nki=nki)
    rng = np.random.default_rng(seed)
    x = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5) * 4 for t in prog.inputs}
    if dtype == "bf16":
        x = {k: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in x.items()}
    return prog, c, c.run(**x), {k: np.asarray(v, np.float64) for k, v in x.items()}


ELTWISE = """\
kernel flip(A: f32[N, M], B: f32[N, M]) -> Y
  default N = {N}, M = {M}
  Y: f32[N, M]
  for i in 0..N, j in 0..M:
    Y[i, j] = {expr}
"""

FORMS = {  # expression -> its NumPy formula
    "A[N - 1 - i, j] * B[i, j]": lambda A, B: A[::-1, :] * B,
    "A[i, M - 1 - j] + B[i, j]": lambda A, B: A[:, ::-1] + B,
    "exp(A[N - 1 - i, M - 1 - j]) - B[i, M - 1 - j]": lambda A, B: np.exp(A[::-1, ::-1]) - B[:, ::-1],
    "A[N - 1 - i, j]": lambda A, B: A[::-1, :],
}


@pytest.mark.parametrize("nki", DIALECTS)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("N, M", [(300, 70), (301, 1500), (1, 33), (130, 1)])
@pytest.mark.parametrize("expr", sorted(FORMS))
def test_a_reversed_element_wise_read(expr, N, M, dtype, nki):
    prog, c, out, x = _run(ELTWISE.format(N=N, M=M, expr=expr), nki, dtype)
    assert_matches(prog, "Y", out["Y"], FORMS[expr](x["A"], x["B"]))


@pytest.mark.parametrize("nki", DIALECTS)
def test_the_kernel_reverses_partitions_in_the_dma_and_free_elements_on_the_engine(nki):
    """A flip of both axes of 301 x 1500 (ragged partition tiles): the rows come reversed from the DMA (0.6: a
    negative partition stride in the HBM access pattern; 0.1: an iota index tile, an indirect DMA) and the engine
    reads each tile's columns backwards (0.6: `.ap` with a [-1, F] pair; 0.1: `F - 1 - nl.arange(F)`)."""
    _, c, _, _ = _run(ELTWISE.format(N=301, M=1500, expr="exp(A[N - 1 - i, M - 1 - j]) - B[i, M - 1 - j]"), nki)
    text = wrap.unwrap(c.source)
    if nki == "0.6":
        assert "A.ap(pattern=[[-1500, 128], [1, 750]]" in text
        assert ".ap(pattern=[[750, 128], [-1, 750]], offset=749)" in text
        assert "nisa.iota" not in text
    else:
        assert "A_rows = nisa.iota(300 - pt * 128 - nl.arange(128)[:, None], dtype=nl.int32)" in text
        assert "src=A[A_rows, 750 - t * 750 + nl.arange(750)[None, :]]" in text
        assert "749 - nl.arange(750)[None, :]" in text
        assert ".ap(" not in text


@pytest.mark.parametrize("nki", DIALECTS)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("N", [2184, 2003])
def test_a_one_dimensional_flip(N, dtype, nki):
    """Y[i] = A[N - 1 - i]: 2184 elements flattened as 104 x 21 (both new loops reversed); 2003 (prime) in ragged
    partition tiles."""
    src = f"""\
kernel flip(A: f32[N]) -> Y
  default N = {N}
  Y: f32[N]
  for i in 0..N:
    Y[i] = A[N - 1 - i] * 2
"""
    prog, _, out, x = _run(src, nki, dtype)
    assert_matches(prog, "Y", out["Y"], x["A"][::-1] * 2)


THREE = """\
kernel flip(A: f32[B, N, M]) -> Y
  default B = 5, N = 130, M = 50
  Y: f32[B, N, M]
  for b in 0..B, i in 0..N, j in 0..M:
    Y[b, i, j] = {read} * 3
"""


@pytest.mark.parametrize("nki", DIALECTS)
@pytest.mark.parametrize("read, formula", [
    ("A[B - 1 - b, i, M - 1 - j]", lambda A: A[::-1, :, ::-1]),  # the outer loop and the free axis
    ("A[b, N - 1 - i, M - 1 - j]", lambda A: A[:, ::-1, ::-1]),
    ("A[b, N - 1 - i, j]", lambda A: A[:, ::-1, :]),  # a middle axis: its own group of loops
])
def test_several_reversed_axes_of_a_3d_tensor(read, formula, nki):
    prog, _, out, x = _run(THREE.format(read=read), nki)
    assert_matches(prog, "Y", out["Y"], formula(x["A"]) * 3)


@pytest.mark.parametrize("nki", DIALECTS)
def test_a_reversed_read_beside_a_column_and_a_row(nki):
    src = """\
kernel flip(A: f32[N, M], c: f32[N], r: f32[M]) -> Y, Z
  default N = 300, M = 70
  Y: f32[N, M]
  Z: f32[N, M]
  for i in 0..N, j in 0..M:
    Y[i, j] = A[i, M - 1 - j] * c[i]
  for i in 0..N, j in 0..M:
    Z[i, j] = A[N - 1 - i, j] + r[j]
"""
    prog, _, out, x = _run(src, nki)
    assert_matches(prog, "Y", out["Y"], x["A"][:, ::-1] * x["c"][:, None])
    assert_matches(prog, "Z", out["Z"], x["A"][::-1, :] + x["r"][None, :])


@pytest.mark.parametrize("nki", DIALECTS)
def test_reversed_broadcast_operands(nki):
    """A column c[N - 1 - i] and a row r[M - 1 - j]: each copied reversed first (small copies), then broadcast."""
    src = """\
kernel flip(A: f32[N, M], c: f32[N], r: f32[M]) -> Y
  default N = 300, M = 70
  Y: f32[N, M]
  for i in 0..N, j in 0..M:
    Y[i, j] = A[i, j] * c[N - 1 - i] + r[M - 1 - j]
"""
    prog, _, out, x = _run(src, nki)
    assert_matches(prog, "Y", out["Y"], x["A"] * x["c"][::-1, None] + x["r"][None, ::-1])


@pytest.mark.parametrize("nki", DIALECTS)
def test_a_reversed_read_across_a_columns_run(nki):
    """c[b] puts b on the partitions and i, j on the free axis, which A[b, N - 1 - i, j] cannot read one way: A is
    copied reversed first, and the copy is not fused back into the statement."""
    src = """\
kernel flip(A: f32[B, N, M], c: f32[B]) -> Y
  default B = 3, N = 130, M = 50
  Y: f32[B, N, M]
  for b in 0..B, i in 0..N, j in 0..M:
    Y[b, i, j] = A[b, N - 1 - i, j] * c[b]
"""
    prog, _, out, x = _run(src, nki)
    assert_matches(prog, "Y", out["Y"], x["A"][:, ::-1, :] * x["c"][:, None, None])


@pytest.mark.parametrize("nki", DIALECTS)
def test_a_reversed_transpose(nki):
    """Y = flip(A, 0).T: A copied reversed first (the element-wise rule), then transposed (TensorE)."""
    src = """\
kernel flip(A: f32[M, N]) -> Y
  default N = 130, M = 70
  Y: f32[N, M]
  for i in 0..N, j in 0..M:
    Y[i, j] = A[M - 1 - j, i]
"""
    prog, _, out, x = _run(src, nki)
    assert_matches(prog, "Y", out["Y"], x["A"][::-1, :].T)


@pytest.mark.parametrize("nki", DIALECTS)
def test_a_chain_through_a_temporary_and_a_forward_read_of_the_same_tensor(nki):
    """T = 2 * A reversed, then Y = T - A forward: the chain is not fused (one statement would read A both ways)."""
    src = """\
kernel flip(A: f32[N, M]) -> Y
  default N = 300, M = 70
  T: f32[N, M]
  Y: f32[N, M]
  for i in 0..N, j in 0..M:
    T[i, j] = A[N - 1 - i, j] * 2
  for i in 0..N, j in 0..M:
    Y[i, j] = T[i, j] - A[i, j]
"""
    prog, _, out, x = _run(src, nki)
    assert_matches(prog, "Y", out["Y"], x["A"][::-1] * 2 - x["A"])


@pytest.mark.parametrize("nki", DIALECTS)
def test_one_tensor_read_both_ways_in_one_statement(nki):
    """flip(A) - A: a tile is loaded one way, so the reversed read goes through a reversed copy first (pad_split)."""
    prog, c, out, x = _run(ELTWISE.format(N=300, M=70, expr="A[N - 1 - i, j] - A[i, M - 1 - j] * B[i, j]"), nki)
    assert_matches(prog, "Y", out["Y"], x["A"][::-1] - x["A"][:, ::-1] * x["B"])
    assert "A_rev" in c.source


REDUCE = """\
kernel flip(A: f32[N, M], B: f32[N, M]) -> s
  default N = 300, M = 70
  s: f32[N]
  for i in 0..N:
    s[i] = {init}
    for j in 0..M:
      s[i] {op} {value}
"""


@pytest.mark.parametrize("nki", DIALECTS)
@pytest.mark.parametrize("init, op, value, formula", [
    ("0", "+=", "A[i, M - 1 - j] * B[i, M - 1 - j]", lambda A, B: (A * B).sum(1)),  # summed over j: turned around
    ("-inf", "max=", "A[i, M - 1 - j]", lambda A, B: A.max(1)),
    ("0", "+=", "A[N - 1 - i, j]", lambda A, B: A[::-1].sum(1)),  # a kept loop: the result copied reversed
    ("inf", "min=", "exp(A[N - 1 - i, M - 1 - j])", lambda A, B: np.exp(A[::-1]).min(1)),
    ("0", "+=", "A[i, M - 1 - j] * B[i, j]", lambda A, B: (A[:, ::-1] * B).sum(1)),  # j both ways: A copied
])
def test_a_reversed_operand_of_a_row_reduction(init, op, value, formula, nki):
    prog, c, out, x = _run(REDUCE.format(init=init, op=op, value=value), nki)
    assert_matches(prog, "s", out["s"], formula(x["A"], x["B"]))
    if "N - 1 - i" in value:  # a kept loop read backwards: the result is reversed (s_fwd), not the operand
        assert "s_fwd" in c.source and "A_rev" not in c.source


@pytest.mark.parametrize("nki", DIALECTS)
def test_a_reversed_contraction(nki):
    """C = flip(A, 0) @ flip(B, 1) with the contraction index reversed in both operands."""
    src = """\
kernel mm(A: f32[N, K], B: f32[K, M]) -> C
  default N = 200, K = 300, M = 100
  C: f32[N, M]
  for i in 0..N, j in 0..M:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += A[N - 1 - i, K - 1 - k] * B[K - 1 - k, M - 1 - j]
"""
    prog, _, out, x = _run(src, nki)
    assert_matches(prog, "C", out["C"], x["A"][::-1, ::-1] @ x["B"][::-1, ::-1])


REFUSED = {
    "reversed_part": ("""\
kernel flip(A: f32[P, M]) -> Y
  default P = 214, M = 127
  let N = P - 14
  Y: f32[N, M]
  for i in 0..N, j in 0..M:
    Y[i, j] = A[P - 1 - i, j] * 2
""", 6),
    "reversed_three_turns": ("""\
kernel flip(A: f32[B, N, M, Q]) -> Y
  default B = 3, N = 4, M = 5, Q = 6
  Y: f32[B, N, M, Q]
  for b in 0..B, i in 0..N, j in 0..M, q in 0..Q:
    Y[b, i, j, q] = A[B - 1 - b, i, M - 1 - j, q]
""", 5),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_stays_refused_is_located_with_a_hint(name, golden):
    src, line = REFUSED[name]
    assert_located_refusal(src, line, golden, f"compiler/errors/{name}.txt")


@pytest.mark.parametrize("nki", DIALECTS)
def test_a_reversed_row_load_costs_one_descriptor_per_row_like_a_forward_one(nki):
    """The model's descriptor count: the reversed rows of A (0.6: a [-M, P] pair; 0.1: an indirect DMA) move as P
    rows of M contiguous elements, as B's forward rows do (trace-only run, the model's)."""
    prog = lang.load(ELTWISE.format(N=256, M=300, expr="A[N - 1 - i, j] * B[i, j]"))
    c = compile_loaded(prog, nki=nki)
    x = {t.name: np.zeros(t.shape, np.float32) for t in prog.inputs}
    _, trace = c.run_traced(numerics=False, **x)
    dmas = [i for i in trace.instrs if i.engine == "dma"]
    assert len(dmas) == 6  # per row tile of 128: A's load, B's load, Y's store
    assert {(i.partitions, i.dma_chunks, i.dma_chunk_bytes) for i in dmas} == {(128, 128, 300 * 4)}
