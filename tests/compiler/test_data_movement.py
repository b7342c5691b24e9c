"""Data movement (issue 13 item 5): crop/shift, nearest upsampling, channel concatenation, compiled by the copy
rule (rules.copy: HBM -> HBM DMAs, or replication in SBUF), at sizes that are not one tile, for f32, f16 and bf16.
Each kernel's output is compared exactly with NumPy slicing / repeat / concatenate of the (dtype-rounded) inputs,
and with the reference evaluator within the project's tolerance."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import assert_matches, check_against_reference, inputs_for
from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang
from kernel_numbers import numbered

SHIFT = """kernel shift(X: f32[N, C, H, W]) -> Y
  default N = 2, C = 200, H = 5, W = 9
  Y: f32[N, C, H - 2, W - 1]
  for n in 0..N, c in 0..C, i in 0..H - 2, j in 0..W - 1:
    Y[n, c, i, j] = X[n, c, i + 2, j + 1]
"""
UPSAMPLE = """kernel up(X: f32[N, C, H, W]) -> Y
  default N = 2, C = 160, H = 3, W = 5
  Y: f32[N, C, 2*H, 2*W]
  for n in 0..N, c in 0..C, i in 0..2*H, j in 0..2*W:
    Y[n, c, i, j] = X[n, c, i / 2, j / 2]
"""
CONCAT = """kernel cat(A: f32[N, C1, H, W], B: f32[N, C2, H, W]) -> Y
  default N = 2, C1 = 136, C2 = 40, H = 3, W = 4
  Y: f32[N, C1 + C2, H, W]
  for n in 0..N, c in 0..C1, i in 0..H, j in 0..W:
    Y[n, c, i, j] = A[n, c, i, j]
  for n in 0..N, c in 0..C2, i in 0..H, j in 0..W:
    Y[n, C1 + c, i, j] = B[n, c, i, j]
"""
CROP2D = """kernel crop(X: f32[M, K]) -> Y
  default M = 300, K = 70
  Y: f32[M - 44, K - 6]
  for i in 0..M - 44, j in 0..K - 6:
    Y[i, j] = X[i + 40, j + 3]
"""
NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def expected(name: str, x: dict[str, np.ndarray]) -> np.ndarray:
    if name == "shift":
        return x["X"][:, :, 2:, 1:]
    if name == "up":
        return x["X"].repeat(2, axis=2).repeat(2, axis=3)
    if name == "cat":
        return np.concatenate([x["A"], x["B"]], axis=1)
    return x["X"][40:-4, 3:-3]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("text", [SHIFT, UPSAMPLE, CONCAT, CROP2D], ids=["shift", "upsample", "concat", "crop2d"])
def test_data_movement_matches_numpy(text: str, dtype: str) -> None:
    c = compile_loaded(lang.load(text.replace("f32", dtype)))
    assert "copy" in c.stages["schedule"]  # the copy rule's primitives (explain shows them)
    check_against_reference(c)
    inputs = inputs_for(c.program)
    got = c.run(**inputs)["Y"]
    rounded = {k: np.asarray(v).astype(NP[dtype]).astype(np.float32) for k, v in inputs.items()}
    want = expected(c.program.kernel.name, rounded)
    np.testing.assert_array_equal(np.asarray(got, np.float32), want)  # a copy moves bits: exact


def test_shift_is_one_hbm_to_hbm_dma_per_block_of_partitions() -> None:
    """Rows of 64 f32 (256 bytes) move HBM -> HBM; shorter ones go through SBUF (test_staged_copies.py)."""
    c = compile_loaded(lang.load(SHIFT, {"W": 65}))
    assert numbered(c.source).count("nisa.dma_copy(") == 1 and "nl.sbuf" not in numbered(c.source)
    assert "X[n, c_o * 100:c_o * 100 + 100, 2:5, 1:65]" in numbered(c.source).replace("\n", "")


def test_upsample_replicates_in_sbuf_and_stores_whole_rows() -> None:
    """rules_copy.upsampled_rows: per block of units X's rows loaded whole, written to the strided positions of the
    result's rows (one copy per column phase, then the other row of each pair copied whole), stored whole; VectorE
    and ScalarE take disjoint rows (2 x 160 units: a block of 128 and a ragged one of 64)."""
    c = compile_loaded(lang.load(UPSAMPLE), nki="0.6")
    src = numbered(c.source)
    assert src.count("nisa.dma_copy(") == 4  # per block (the loop's and the ragged one) one load and one store
    assert src.count("nisa.tensor_copy(") == 6 and src.count("nisa.activation(") == 6
    assert "nisa.tensor_copy(dst=Y_tile[:, 0, 1:10:2], src=X_rows[:, 0])" in src  # row 0 of X on VectorE
    assert "nisa.activation(dst=Y_tile[:, 3:6:2], op=nl.copy, data=Y_tile[:, 2:5:2])" in src  # rows 1, 2 on ScalarE
    assert "nisa.dma_copy(dst=Y_v[256:320], src=Y_tile2)" in src


@pytest.mark.parametrize("body, message", [
    ("    Y[n, c, i, j] = A[n, c, i, j]\n  for n in 0..N, c in 0..C2, i in 0..H, j in 0..W:\n"
     "    Y[n, C1 + c - 1, i, j] = B[n, c, i, j]\n", "both write some of its elements"),
    ("    Y[n, c, i, j] = A[n, c, i, j]\n", "writes 136 of the 176 elements"),
])
def test_parts_that_overlap_or_leave_gaps_are_located_errors(body: str, message: str) -> None:
    text = CONCAT.split("    Y[n, c, i, j]")[0] + body
    with pytest.raises(TilecError, match=message) as info:
        compile_loaded(lang.load(text))
    assert info.value.span is not None


def test_a_part_that_computes_is_computed_then_copied() -> None:
    """Refused until user20 (a part of a concatenation had to be a copy); store_split computes `2 * B` into a
    temporary, then copies it into its part."""
    text = CONCAT.replace("= B[n, c, i, j]", "= 2 * B[n, c, i, j]")
    prog = lang.load(text)
    c = compile_loaded(prog)
    inputs = lang.random_inputs(prog, seed=3)
    a, b = (np.asarray(inputs[k], np.float64) for k in ("A", "B"))
    assert_matches(prog, "Y", c.run(**inputs)["Y"], np.concatenate([a, 2 * b], axis=1))


def test_a_large_upsampled_tile_is_made_in_row_chunks_that_fit() -> None:
    c = compile_loaded(lang.load(UPSAMPLE, {"N": 1, "C": 130, "H": 112, "W": 112}), nki="0.6")
    # 65 partitions x 32 of the 224 result rows (16 of X's 112 rows per step: rules_copy.UPSAMPLE_STEP_BYTES)
    assert "for r_t in range(7):" in numbered(c.source) and "Y_tile = nl.ndarray((65, 32, 224)" in numbered(c.source)
    assert "src=X_v[o_t * 65:o_t * 65 + 65, r_t * ROWS:r_t * ROWS + ROWS]" in numbered(c.source)


def test_a_copy_takes_no_directives_and_explain_shows_it() -> None:
    with pytest.raises(TilecError, match="is a copy") as info:
        compile_loaded(lang.load(SHIFT), lang.parse_schedule("tile Y.c, 8", "<test>"))
    assert info.value.span is not None
    c = compile_loaded(lang.load(CONCAT))
    assert "copy Y -> Y" in c.stages["select"] and "Y[n, C1 + c, i, j] = B[n, c, i, j]" in c.stages["select"]


@pytest.mark.parametrize("text", [
    # replication that cannot be staged (no read loop with a result dimension of its own and a free dimension
    # inside it): HBM -> HBM DMAs with strided destinations
    "kernel a(X: f32[L]) -> Y\n  default L = 200\n  Y: f32[2*L]\n  for a in 0..2*L:\n    Y[a] = X[a / 2]\n",
    "kernel a(X: bf16[M, K]) -> Y\n  default M = 130, K = 6\n  Y: bf16[3*M, K]\n  for i in 0..3*M, j in 0..K:\n"
    "    Y[i, j] = X[i / 3, j]\n",
    "kernel a(X: f16[M]) -> Y\n  default M = 1\n  Y: f16[2*M]\n  for i in 0..2*M:\n    Y[i] = X[i / 2]\n",
    # a crop at the end (no offset), and a 3x upsample converting f32 -> bf16
    "kernel a(X: f32[M, K]) -> Y\n  default M = 300, K = 7\n  Y: f32[M - 5, K - 1]\n  for i in 0..M - 5, j in 0..K - 1:\n"
    "    Y[i, j] = X[i, j]\n",
    "kernel a(X: f32[N, C, H, W]) -> Y\n  default N = 2, C = 100, H = 4, W = 6\n  Y: bf16[N, C, 3*H, 3*W]\n"
    "  for n in 0..N, c in 0..C, i in 0..3*H, j in 0..3*W:\n    Y[n, c, i, j] = X[n, c, i / 3, j / 3]\n",
], ids=["upsample1d", "upsample_rows", "upsample_one", "crop_end", "upsample3x_convert"])
def test_copies_the_replication_rule_cannot_stage_match_the_reference(text: str) -> None:
    check_against_reference(compile_loaded(lang.load(text)))


CONCAT_ROWS = """kernel concat_rows_2d(A: f32[M1, N], B: f32[M2, N]) -> Y
  default M1 = 129, M2 = 127, N = 300
  Y: f32[M1 + M2, N]
  for i in 0..M1, j in 0..N:
    Y[i, j] = A[i, j]
  for i in 0..M2, j in 0..N:
    Y[M1 + i, j] = B[i, j]
"""


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
def test_concatenated_rows_move_in_blocks_of_rows_not_one_dma_per_row(nki: str) -> None:
    """129 rows (= 3 x 43) x 300 columns: the rows go on the partitions in 3 DMAs of whole rows (_hbm_copy_ns);
    the largest divisor alone put 100 columns on the partitions, one DMA per row and column block (387)."""
    c = compile_loaded(lang.load(CONCAT_ROWS), nki=nki)
    assert numbered(c.source).count("nisa.dma_copy(") == 2 and "for i in range(129)" not in numbered(c.source)
    assert "HBM -> HBM, 43 partitions" in numbered(c.source) and "src=A[i_o * 43:i_o * 43 + 43]" in numbered(c.source)
    inputs = inputs_for(c.program)
    got = np.asarray(c.run(**inputs)["Y"])
    np.testing.assert_array_equal(got, np.concatenate([inputs["A"], inputs["B"]], axis=0))


def test_a_strided_innermost_read_keeps_many_partitions_over_one_dma_of_few() -> None:
    """X[b, i, 2*j + 1]: every element is a descriptor, so one DMA with the 3 b's on the partitions (1 engine of
    16) would be ~13x slower than the i's 100 partitions; the cost counts descriptors per element there. Since
    core17 the 600 rows go on 120 partitions (5 each), loaded whole, the odd elements picked on chip
    (copy_strided.strided_rows): no DMA with a step at all."""
    text = """kernel odd(X: f32[B, M, N]) -> Y
  default B = 3, M = 200, N = 600
  Y: f32[B, M, N / 2]
  for b in 0..B, i in 0..M, j in 0..N / 2:
    Y[b, i, j] = X[b, i, 2 * j + 1]
"""
    c = compile_loaded(lang.load(text))
    assert "nl.ndarray((120, 5, 600)" in numbered(c.source) and ":2]" not in "".join(
        ln for ln in numbered(c.source).splitlines() if "dma_copy" in ln)
    inputs = inputs_for(c.program)
    np.testing.assert_array_equal(np.asarray(c.run(**inputs)["Y"]), inputs["X"][:, :, 1::2])
