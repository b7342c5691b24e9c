"""Element-wise statements beyond same-shape operands: broadcasts of a lower-rank operand (a (P, 1) column per
tile for tensor_scalar, or a row copied to every partition by a ones-matmul on TensorE) and chains of element-wise
statements fused into one pass over tiles. Each runs end to end on the interpreter against the reference
evaluator."""
from __future__ import annotations

import pytest

from compiler_helpers import check_against_reference
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang
from kernel_numbers import numbered

ROW_BIAS = """\
kernel row_bias(A: f32[M, N], b: f32[M]) -> Y
  default M = 256, N = 384
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = max(A[i, j] + b[i], 0) * 2 - b[i]
"""

CHANNEL_BIAS = """\
kernel channel_bias(conv: f32[N, K, H, W], b: f32[K]) -> Y
  default N = 2, K = 256, H = 6, W = 10
  Y: f32[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = conv[n, k, y, x] + b[k]
"""

REVERSED = """\
kernel rev(A: f32[M, N], s: f32[M], t: f32[M]) -> Y
  default M = 96, N = 40
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = min(s[i] - A[i, j], t[i]) * A[i, j]
"""


def test_per_row_bias_is_a_tensor_scalar_column():
    c = compile_loaded(lang.load(ROW_BIAS))
    assert "b_col = nl.ndarray((128, 1)" in numbered(c.source)
    assert "nisa.tensor_scalar(A_tile, nl.add, b_col" in numbered(c.source)
    check_against_reference(c)


def test_per_channel_bias_of_a_4d_tensor():
    c = compile_loaded(lang.load(CHANNEL_BIAS))
    assert "view conv_v: hbm f32[2, 256, 60] = conv" in c.stages["loops"]
    check_against_reference(c)


def test_reversed_subtract_and_two_columns():
    """`s[i] - A` is tensor_scalar with reverse0; min against a second column; 96 rows use 96 partitions."""
    c = compile_loaded(lang.load(REVERSED))
    assert "reverse0=True" in numbered(c.source) and "nl.minimum, t_col" in numbered(c.source)
    check_against_reference(c)


def test_broadcast_schedule_tiles_the_free_dims():
    prog = lang.load(CHANNEL_BIAS)
    c = compile_loaded(prog, lang.parse_schedule("tile Y.y, 20\n", "<test>"))
    assert "TILE_F = 20" in numbered(c.source)
    check_against_reference(c)


ROW_AND_COLUMN = """\
kernel rowbc(A: f32[M, N], s: f32[N], b: f32[M]) -> Y
  default M = 256, N = 768
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = A[i, j] * s[j] + b[i]
"""

ROW_2D = """\
kernel rowbc2(A: f32[M, H, W], s: f32[H, W]) -> Y
  default M = 96, H = 4, W = 6
  Y: f32[M, H, W]
  for i in 0..M, y in 0..H, x in 0..W:
    Y[i, y, x] = s[y, x] - A[i, y, x]
"""


def test_row_broadcast_along_partitions_is_a_ones_matmul():
    """`s[j]` is the same for every partition: TensorE copies it to all of them (ones[1, P].T @ s[1, F]), once for
    the whole nest, in PSUM-bank chunks of 384, and each partition tile reads it whole (one free tile of 768);
    VectorE and GpSimdE share the row's multiply by columns (it outlasts the tile's loads: expr_instrs.LONE_CUT), so
    the column's add rides on ScalarE (activation bias)."""
    c = compile_loaded(lang.load(ROW_AND_COLUMN))
    loops = c.stages["loops"]
    head, nest = loops.split("block Y = element-wise")
    assert "matmul s_bcast[:128, :384] += ones_f32[:1, :128].T @ s_row[:1, c*ROW_CHUNK:+384]" in head
    assert "multiply.gpsimd tmp1[:128, 341:+427] <- A_tile[:128, 341:+427], s_tile[:128, 341:+427]" in nest
    assert "multiply tmp1[:128, :341] <- A_tile[:128, :341], s_tile[:128, :341]" in nest
    assert "act Y_tile[:128, :768] <- copy(tmp1[:128, :768] + b_col[:128, :1])" in nest
    check_against_reference(c)


def test_row_broadcast_leaves_the_partition_loop_when_one_free_tile_covers_it():
    """With N in one free tile the broadcast uses no loop variable: `hoist` makes it once, before the tile loop."""
    c = compile_loaded(lang.load(ROW_AND_COLUMN.replace("M = 256, N = 768", "M = 384, N = 384")))
    *before, loop = numbered(c.source).split("for pt in nl.affine_range(3):")  # b's columns loaded ahead first
    assert "s_bcast += nisa.nc_matmul(ones_f32, s_row)" in "".join(before)
    assert "nc_matmul" not in loop
    check_against_reference(c)


def test_row_broadcast_of_two_trailing_indices():
    check_against_reference(compile_loaded(lang.load(ROW_2D)))


def test_row_broadcast_tile_is_limited_to_one_psum_bank():
    """Rows broadcast tile by tile (here: ragged partition tiles of 96 over 256 rows) go through one PSUM bank each;
    rows copied whole once take the default's 768 (core24: `tile Y.j, 768` alone is the default plan)."""
    with pytest.raises(TilecError, match="wider than the 512 columns"):
        compile_loaded(lang.load(ROW_AND_COLUMN), lang.parse_schedule("tile Y.i, 96\ntile Y.j, 768\n", "<test>"))


CHAIN = """\
kernel chain(A: f32[M, N], B: f32[M, N]) -> Y
  default M = 256, N = 512
  T: f32[M, N]
  U: f32[M, N]
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    T[i, j] = A[i, j] * B[i, j] - 0.5
  for i in 0..M, j in 0..N:
    U[i, j] = exp(min(T[i, j], 0.25)) + relu(T[i, j])
  for a in 0..M, b in 0..N:
    Y[a, b] = max(U[a, b], 0) * 3
  for i in 0..M, j in 0..N:
    Y[i, j] = 1 - Y[i, j]
"""


def test_element_wise_chain_is_one_pass():
    c = compile_loaded(lang.load(CHAIN))
    select = c.stages["select"]
    assert select.count("eltwise") == 1 and "(fused T, U)" in select
    loops = c.stages["loops"]
    assert loops.count("dma ") == 3  # A and B in, Y out: T and U never reach HBM
    # the tile in two column halves (ScalarE's exp and relu between VectorE steps: expr_instrs.interleaved)
    assert loops.count("multiply tmp") == 2  # A * B once per half (shared by both reads of T)
    assert loops.count(", 0 then multiply 3  # tl:11") == 2  # max(U, 0) * 3: one tensor_scalar, two operators
    assert "nl.exp" in numbered(c.source) and "nl.relu" in numbered(c.source)
    # each instruction is tagged with the statement its part of the expression comes from
    assert "minimum tmp3[:128, :512] <- tmp2[:128, :512], 0.25  # tl:9" in loops
    assert "subtract Y_tile[:128, :512] <- 1, tmp8[:128, :512]  # tl:13" in loops
    check_against_reference(c)


CHAIN_WITH_BIAS = """\
kernel chain_bias(X: f32[N, K, H, W], b: f32[K]) -> Y
  default N = 2, K = 128, H = 4, W = 8
  T: f32[N, K, H, W]
  Y: f32[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    T[n, k, y, x] = X[n, k, y, x] * b[k]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = relu(T[n, k, y, x] + 1)
"""


def test_chain_with_a_broadcast():
    c = compile_loaded(lang.load(CHAIN_WITH_BIAS))
    assert c.stages["select"].count("eltwise") == 1
    check_against_reference(c)


REJECTED = {  # (a transposed read, `A[i, j] + c[j, i]`, is permuted first now: test_transposed_reads.py)
    "diagonal_read": ("Y[i, j] = A[i, j] + c[i, i]", "consecutive output indices in order"),
}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_unmappable_broadcasts_are_clear_errors(name):
    stmt, message = REJECTED[name]
    text = ("kernel bad(A: f32[M, N], b: f32[M], c: f32[M, M]) -> Y\n  default M = 128, N = 64\n  Y: f32[M, N]\n"
            f"  for i in 0..M, j in 0..N:\n    {stmt}\n")
    with pytest.raises(TilecError, match=message) as info:
        compile_loaded(lang.load(text))
    assert info.value.span is not None and info.value.span.line == 5


@pytest.mark.parametrize("name,text", [("eltwise_chain", CHAIN), ("eltwise_broadcast", ROW_AND_COLUMN)])
@pytest.mark.parametrize("stage", ["select", "loops"])
def test_eltwise_stage_golden(name, text, stage, golden):
    golden.check(f"compiler/stages/{name}.{stage}.txt", compile_loaded(lang.load(text)).stages[stage])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_broadcasts_in_half_precision(dtype):
    """nc_matmul takes fp32 operands only in pairs: the ones row of the broadcast matmul has the row's dtype."""
    c = compile_loaded(lang.load(ROW_AND_COLUMN.replace("f32", dtype)))
    assert f"ones_{dtype}: sbuf {dtype}[1, 128]" in c.stages["loops"]
    check_against_reference(c)
