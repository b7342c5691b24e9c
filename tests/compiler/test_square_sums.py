"""A row reduction of a square, `s[i] += x * x` (x an expression, e.g. A - B), as one ScalarE activation that squares
and sums (lower_tiles.square_sums), with x's fp32 subtraction shared by GpSimdE and VectorE: the kernels against
the NumPy float64 formula, f32 and bf16, both NKI dialects, ragged sizes."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from tilec.compiler import wrap
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

ROW_SSD = """\
kernel row_ssd(A: f32[M, N], B: f32[M, N]) -> s
  default M = {M}, N = {N}
  s: f32[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += (A[i, j] - B[i, j]) * (A[i, j] - B[i, j])
"""

ROW_SQ = """\
kernel row_sq(A: f32[M, N]) -> s
  default M = {M}, N = {N}
  s: f32[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += A[i, j] * A[i, j]
"""

ROW_DOT = ROW_SSD.replace("(A[i, j] - B[i, j]) * (A[i, j] - B[i, j])", "A[i, j] * B[i, j]")


def _run(src: str, dtype: str, nki: str, seed: int = 7):
    """Compiled for `nki` with f32 replaced by `dtype`, run on signed inputs exact in `dtype`: (program, kernel source,
    outputs, the inputs in float64)."""
    prog = lang.load(src.replace("f32", dtype))
    c = compile_loaded(prog, None, nki)
    rng = np.random.default_rng(seed)
    inputs = {t.name: rng.random(t.shape, dtype=np.float32) - 0.5 for t in prog.inputs}
    if dtype == "bf16":  # values a bf16 input holds exactly
        inputs = {k: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in inputs.items()}
    return prog, wrap.unwrap(c.source), c.run(**inputs), {k: np.asarray(v, np.float64) for k, v in inputs.items()}


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("M, N, squared", [(256, 512, True), (200, 1000, True), (130, 4100, True), (130, 77, False)])
def test_sum_of_squared_differences(M, N, squared, dtype, nki):
    prog, source, out, x = _run(ROW_SSD.format(M=M, N=N), dtype, nki)
    want = ((x["A"] - x["B"]) ** 2).sum(axis=1)
    assert_matches(prog, "s", out["s"], want)
    if not squared:  # short rows, several per partition: a (P, G, F) tile reduced along its last axis (not this form)
        assert "nl.square" not in source
        return
    assert "nl.square" in source and "reduce_res=" in source  # squared and summed by one activation
    assert "tensor_reduce" not in source
    assert "gpsimd" in source  # A - B shared with GpSimdE


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_sum_of_squares_of_a_loaded_tile(dtype, nki):
    prog, source, out, x = _run(ROW_SQ.format(M=300, N=700), dtype, nki)
    assert_matches(prog, "s", out["s"], (x["A"] ** 2).sum(axis=1))
    assert "nl.square" in source and "tensor_reduce" not in source and "gpsimd" not in source


def test_a_product_of_two_tensors_is_not_a_square():
    prog, source, out, x = _run(ROW_DOT.format(M=130, N=300), "f32", "0.6")
    assert_matches(prog, "s", out["s"], (x["A"] * x["B"]).sum(axis=1))
    assert "nl.square" not in source and "tensor_reduce" in source


COL_SSD = """\
kernel col_ssd(A: f32[M, N], B: f32[M, N]) -> s
  default M = {M}, N = {N}
  s: f32[N]
  for j in 0..N:
    s[j] = 0
  for i in 0..M, j in 0..N:
    s[j] += (A[i, j] - B[i, j]) * (A[i, j] - B[i, j])
"""

COL_SQ = COL_SSD.replace("(A[i, j] - B[i, j]) * (A[i, j] - B[i, j])", "A[i, j] * A[i, j]")


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("M, N", [(1024, 512), (700, 1000), (130, 77)])
def test_column_sum_of_squared_differences(M, N, dtype, nki):
    """The squares TensorE sums are ScalarE activations (summed_squares), A - B shared with GpSimdE."""
    prog, source, out, x = _run(COL_SSD.format(M=M, N=N), dtype, nki)
    assert_matches(prog, "s", out["s"], ((x["A"] - x["B"]) ** 2).sum(axis=0))
    assert "nl.square" in source and "gpsimd" in source and "op=nl.multiply" not in source


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_column_sum_of_squares(dtype, nki):
    """f32: every square on ScalarE; bf16: every other one stays on VectorE (as fast there at 16 bits)."""
    prog, source, out, x = _run(COL_SQ.format(M=1024, N=600), dtype, nki)
    assert_matches(prog, "s", out["s"], (x["A"] ** 2).sum(axis=0))
    squares, products = source.count("nl.square"), source.count("op=nl.multiply")
    assert squares > 0 and (products == 0 if dtype == "f32" else 0 < products <= squares <= products + 1)


# ---- the schedule names the squares (instruction selection by the rules, shown by `tilec explain`) -------------------


def _schedule(src: str, dtype: str = "f32") -> str:
    return compile_loaded(lang.load(src.replace("f32", dtype)), None, "0.6").stages["schedule"]


def test_the_row_rule_names_the_square_and_its_sum():
    """rules.reduce names the square and its row sum one activation (`square=sum`); a product of two tensors and a
    maximum of a square are not named."""
    assert "tensorize(p_x, square=sum)" in _schedule(ROW_SSD.format(M=256, N=512))
    assert "tensorize(p_x, square=sum)" in _schedule(ROW_SQ.format(M=256, N=512), "bf16")
    assert "square=" not in _schedule(ROW_DOT.format(M=256, N=512))
    biggest = ROW_SQ.replace("s[i] = 0", "s[i] = -inf").replace("+=", "max=")
    assert "square=" not in _schedule(biggest.format(M=256, N=512))


def test_the_column_rule_names_each_square_on_scalar_e():
    """rules.colreduce names the squares ScalarE computes (`square=scalar`): every fp32 one and every square of a
    difference; of the 16-bit squares of loaded tiles every other one, in program order (the rest stay on VectorE)."""
    f32 = _schedule(COL_SQ.format(M=1024, N=512))
    assert [f"tensorize(p_t{j}, square=scalar)" in f32 for j in range(4)] == [True] * 4
    bf16 = _schedule(COL_SQ.format(M=1024, N=512), "bf16")
    assert [f"tensorize(p_t{j}, square=scalar)" in bf16 for j in range(4)] == [True, False, True, False]
    assert "tensorize(p_t1)\n" in bf16 and "tensorize(p_t3)\n" in bf16
    ssd = _schedule(COL_SSD.format(M=1024, N=512), "bf16")
    assert ssd.count("square=scalar") == 4


def test_a_square_named_where_the_nest_computes_none_is_a_compiler_bug():
    """The lowering checks what the rule named: a nest without a square, or a square whose sum is not the next
    instruction, is an InternalError (never a silently different kernel)."""
    from tilec.compiler import ir
    from tilec.compiler.lower_tiles import square_sums, the_square
    from tilec.errors import InternalError
    from tilec.target import target
    x, y, t = (ir.Buf(n, "sbuf", "f32", (128, 64)) for n in ("x", "y", "t"))
    acc = ir.Buf("acc", "sbuf", "f32", (128, 1))
    product = ir.Binary(ir.whole(t), ir.whole(x), ir.whole(y), "multiply", 3)
    with pytest.raises(InternalError, match=r"tensorize\(p_x, square=..\) computes no square"):
        the_square([product], "p_x")
    sq = ir.Binary(ir.whole(t), ir.whole(x), ir.whole(x), "multiply", 3)
    assert the_square([sq], "p_x") is sq
    biggest = ir.Reduce(ir.whole(acc), ir.whole(t), "max", 3)
    with pytest.raises(InternalError, match="is not summed along its rows alone"):
        square_sums([sq, biggest], target(), {sq: "sum"})
    summed = square_sums([sq, ir.Reduce(ir.whole(acc), ir.whole(t), "add", 3)], target(), {sq: "sum"})
    assert summed == [ir.Act(ir.whole(t), ir.whole(x), "square", line=3, total=ir.whole(acc))]
