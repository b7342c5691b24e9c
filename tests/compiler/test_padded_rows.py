"""Padded copies whose rows are padded at their ends, built by rules_copy.row_blocks (issue 13 item 5): whole rows on
the partitions, (outer unit, row block) pairs when the outer units are fewer than 128, X loaded contiguously and
copied on chip, tiles stored whole. Every kernel's output is compared exactly with np.pad + slicing of the
dtype-rounded input (test_padded_copy.expected), an independent NumPy formula."""
from __future__ import annotations

import pathlib
import re

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import check_against_reference, inputs_for
from test_padded_copy import expected, program
from tilec.compiler import ir
from tilec.compiler.api import compile_loaded, explain
from tilec.lang import api as lang
from kernel_numbers import numbered

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
FAMILIES = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "families"

CASES = {
    # (loop, X's size, Y's size, read offset): Y[.., v, ..] = X[.., v + offset, ..] ?? fill
    # 16 channels of 7 rows: 7 row blocks of one row each (112 partitions), a "same" pad of both dimensions
    "pad_16x7x5": [("c", 16, 16, 0), ("y", 7, 9, -1), ("x", 5, 7, -1)],
    # 20 channels, 2 rows of fill enter at the top, a column leaves: 7 rows read = 6 blocks of 1 row + 1 row left
    "shift_20x9x7": [("c", 20, 20, 0), ("y", 9, 9, -2), ("x", 7, 7, 1)],
    # 2 x 130 units (more than 128): blocks of 128 units and a ragged last block of 4
    "batch_2x130": [("n", 2, 2, 0), ("c", 130, 130, 0), ("y", 6, 8, -1), ("x", 5, 7, -1)],
    # 64 channels of 40 rows of 300: blocks of 20 rows, each in 4 steps of 5 rows
    "steps_64x40x300": [("c", 64, 64, 0), ("y", 40, 40, 0), ("x", 300, 302, -1)],
    # a crop of 15 of X's 40 columns plus 5 of fill: only those columns are loaded
    "crop_24x6x40": [("c", 24, 24, 0), ("y", 6, 9, -2), ("x", 40, 20, 25)],
}


def run_case(dims, fill: str, dtype: str, out_dtype: str = "") -> tuple[np.ndarray, np.ndarray, str]:
    c = compile_loaded(lang.load(program(dims, fill, dtype, out_dtype)))
    assert "rules_copy.row_blocks builds it" in c.stages["schedule"]
    inputs = inputs_for(c.program)
    got = np.asarray(c.run(**inputs)["Y"], np.float32)
    x = np.asarray(inputs["X"]).astype(NP[dtype]).astype(np.float32)
    value = {"-inf": -np.inf}.get(fill, None)
    value = float(np.float32(value if value is not None else float(fill)).astype(NP[dtype]))
    want = expected(x, dims, value)
    if out_dtype:
        want = want.astype(NP[out_dtype]).astype(np.float32)
    return got, want, numbered(c.source)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("fill", ["0", "-inf", "1.5"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_row_blocks_match_np_pad(case: str, fill: str, dtype: str) -> None:
    got, want, _ = run_case(CASES[case], fill, dtype)
    np.testing.assert_array_equal(got, want)  # a copy moves bits: exact


@pytest.mark.parametrize("dtype, out_dtype", [("f32", "bf16"), ("bf16", "f32"), ("f16", "bf16")])
def test_a_converting_copy_rounds_as_the_reference(dtype: str, out_dtype: str) -> None:
    got, want, _ = run_case(CASES["shift_20x9x7"], "0.1", dtype, out_dtype)
    np.testing.assert_array_equal(got, want)


def test_the_reference_evaluator_agrees() -> None:
    c = compile_loaded(lang.load(program(CASES["batch_2x130"], "1.5")))
    check_against_reference(c)


def test_row_blocks_fill_the_partitions_at_batch_1() -> None:
    """pad1 at its benchmark size (64 channels, 56 -> 58 rows): (channel, block of 28 rows) pairs on 128
    partitions, one load and one store DMA for both row blocks (dma_merge: the blocks a leading axis of the HBM access
    pattern), each partition's rows whole and contiguous."""
    c = compile_loaded(lang.load(str(FAMILIES / "pad1.tl")))
    src = numbered(c.source)
    assert "X_rows = nl.ndarray((128, 28, 56)" in src and "P_tile = nl.ndarray((128, 28, 58)" in src
    dmas = [line for line in src.splitlines() if "dma_copy" in line]
    assert len(dmas) == 3  # the two fill rows (one DMA, rows 0 and 57), one load and one store of both row blocks
    assert "nisa.dma_copy(dst=P_v[:, 0:58:57], src=P_fill)" in src
    # block b of channel c on partition 64 b + c: the HBM side's blocks 28 rows apart (ir.View.blocks)
    hbm = [v for s in ir.walk(c.result.kernel.body) if isinstance(s, ir.Dma) for v in (s.dst, s.src) if v.blocks]
    assert [(v.buf.name, v.blocks) for v in hbm] == [("X_v", ((1, 2, 28),)), ("P_v", ((1, 2, 28),))]
    assert "rb" not in src


def test_units_fill_the_partitions_at_batch_8() -> None:
    """pad1 at batch 8: 512 (n, c) units in 4 blocks of 128, a unit's rows in steps; no row blocks."""
    c = compile_loaded(lang.load(str(FAMILIES / "pad1.tl"), {"N": 8}))
    src = numbered(c.source)
    assert re.search(r"for o_t in (nl\.affine_)?range\(4\):", src)
    assert re.search(r"for r_t in (nl\.affine_)?range\(2\):", src)
    assert "P_tile = nl.ndarray((128, 28, 58)" in src
    assert "dst=X_rows, src=X_v[o_t * 128:o_t * 128 + 128, r_t * ROWS:r_t * ROWS + ROWS])" in src
    assert "rb" not in src


def test_steps_split_a_block_of_rows() -> None:
    _, _, src = run_case(CASES["steps_64x40x300"], "0", "f32")
    assert "ROWS = 5" in src and re.search(r"for r_t in (nl\.affine_)?range\(4\):", src)


def test_a_crop_loads_only_the_columns_it_reads() -> None:
    _, _, src = run_case(CASES["crop_24x6x40"], "0", "f32")
    assert "X_rows = nl.ndarray((120, 15)" in src  # one DMA of 5 blocks of 24 units, 15 of each row's 40 columns
    assert "dst=X_rows, src=X" in src and "rb" not in src


def test_explain_names_the_layout() -> None:
    text = explain(compile_loaded(lang.load(str(FAMILIES / "pad1.tl"))))
    assert "rules_copy.row_blocks builds it: P = X with its rows padded (0) in SBUF: (unit, block of 28 rows) " \
           "pairs on 128 partitions" in text


def test_few_outer_units_keep_the_box_schedule() -> None:
    """One outer unit (a 2-D shift): row blocks would give each DMA one partition; the box schedule stays."""
    c = compile_loaded(lang.load(program([("i", 300, 300, -2), ("j", 70, 70, 1)], "0")))
    assert "rules.copy writes its schedule as" in c.stages["schedule"] and "row_blocks" not in c.stages["schedule"]


FLAT = {
    # (X's size, Y's size, offset): Y[i] = X[i + offset] ?? fill, both seen as rows of a common divisor
    "shift_right_4096": (4096, 4096, -1),
    "shift_left_1000": (1000, 1000, 3),
    "wider_1024_1152": (1024, 1152, -64),  # a padded copy into a larger vector: fill on both sides
    "narrower_1536_1024": (1536, 1024, 200),
    "beyond_a_row_2048": (2048, 2048, -37),  # rows of 16: the offset crosses two rows
    "back_2048": (2048, 2048, 45),
}


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("fill", ["0", "-inf", "1.5"])
@pytest.mark.parametrize("case", sorted(FLAT))
def test_a_1d_padded_copy_as_rows_matches_np_pad(case: str, fill: str, dtype: str) -> None:
    n, m, c = FLAT[case]
    got, want, src = run_case([("i", n, m, c)], fill, dtype)
    np.testing.assert_array_equal(got, want)
    assert src.count("dma_copy") <= 6  # two copies and the fill's pieces, never a DMA per block of 128 elements


def test_a_million_element_shift_is_two_dmas_of_128_rows() -> None:
    c = compile_loaded(lang.load(program([("i", 1 << 20, 1 << 20, -1)], "0")))
    src = numbered(c.source)
    assert "X_v = X.reshape((128, 8192))" in src and "dst=Y_v[:, 1:8192], src=X_v[:, 0:8191])" in src
    assert "dst=Y_v[1:128, 0:1], src=X_v[0:127, 8191:8192])" in src


def test_a_1d_copy_of_a_prime_size_keeps_the_box_schedule() -> None:
    """1009 elements: no divisor gives rows for a DMA engine's partitions; the box schedule stays."""
    c = compile_loaded(lang.load(program([("i", 1009, 1009, 2)], "0")))
    assert "rules.copy writes its schedule as" in c.stages["schedule"]
    inputs = inputs_for(c.program)
    got = np.asarray(c.run(**inputs)["Y"], np.float32)
    np.testing.assert_array_equal(got, expected(np.asarray(inputs["X"], np.float32), [("i", 1009, 1009, 2)], 0.0))
