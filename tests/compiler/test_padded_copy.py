"""Padded copies (issue 13 item 5): `Y[i, j] = X[i - 2, j + 1] ?? 0` and its relatives (torch's F.pad then a crop,
a shifted image with zeros entering, a padded copy into a larger tensor, any constant fill) compiled by the copy
rule (rules_copy.py): the interior HBM -> HBM, the fill stored from a constant SBUF tile set once. Each kernel's
output is compared exactly with np.pad + slicing of the (dtype-rounded) input, and with the reference evaluator."""
from __future__ import annotations

import math
import pathlib
import re

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import check_against_reference, inputs_for
from tilec.compiler import rules, rules_copy
from tilec.compiler.api import compile_loaded
from tilec.compiler.lower_tiles import copy_nest
from tilec.compiler.ir import Aff, Term
from tilec.compiler.nest import Access, Assign, Buffer, Const, Kernel, Load, Loop, walk
from tilec.compiler.nest_eval import evaluate_nest
from tilec.errors import TilecError
from tilec.lang import api as lang
from tilec.target import TRN2
from kernel_numbers import numbered

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def program(dims: list[tuple[str, int, int, int]], fill: str, dtype: str = "f32", out_dtype: str = "") -> str:
    """A padded copy over len(dims) dimensions: (loop, X's size, Y's size, read offset c: X[.., v + c, ..])."""
    xs = ", ".join(str(n) for _, n, _, _ in dims)
    ys = ", ".join(str(m) for _, _, m, _ in dims)
    loops = ", ".join(f"{v} in 0..{m}" for v, _, m, _ in dims)
    read = ", ".join(v if c == 0 else f"{v} + {c}" if c > 0 else f"{v} - {-c}" for v, _, _, c in dims)
    out = ", ".join(v for v, _, _, _ in dims)
    return (f"kernel pad(X: {dtype}[{xs}]) -> Y\n  Y: {out_dtype or dtype}[{ys}]\n  for {loops}:\n"
            f"    Y[{out}] = X[{read}] ?? {fill}\n")


def expected(x: np.ndarray, dims: list[tuple[str, int, int, int]], fill: float) -> np.ndarray:
    """np.pad of X with the fill (wide enough on each side), then the slice Y reads: Y[v] = padded[v + c + lo]."""
    widths = [(max(0, -c), max(0, m + c - n)) for _, n, m, c in dims]
    padded = np.pad(x, widths, constant_values=fill)
    return padded[tuple(slice(c + lo, c + lo + m) for (_, _, m, c), (lo, _) in zip(dims, widths))]


CASES = {
    # torch's F.pad then crop: 2 rows of zeros enter at the top, one column leaves on the right; 300 = 2 x 128 + 44
    "shift2d": ([("i", 300, 300, -2), ("j", 70, 70, 1)], "0"),
    "shift1d": ([("i", 1000, 1000, 3)], "0"),
    # a padded copy into a larger tensor (a "same" conv's input), fill on both sides of two dimensions
    "pad3d": ([("c", 200, 200, 0), ("y", 10, 12, -1), ("x", 12, 14, -1)], "0"),
    "pad4d_neg_inf": ([("n", 2, 2, 0), ("c", 40, 40, 0), ("y", 9, 9, 1), ("x", 11, 11, -2)], "-inf"),
    "constant": ([("i", 130, 140, -7), ("j", 33, 30, 5)], "1.5"),
    # a fill box larger than a tile of 128 rows, and one larger than a fill tile per partition (16 KiB)
    "fill_many_rows": ([("i", 400, 400, -300), ("j", 24, 24, 0)], "0"),
    "fill_wide": ([("c", 128, 128, 0), ("y", 64, 64, -40), ("x", 128, 128, 0)], "-2"),
}
ROW_BLOCKS = {"pad3d", "pad4d_neg_inf", "shift1d"}  # the cases whose rows are padded at their ends
ALL_FILL = [("i", 300, 300, 500), ("j", 8, 8, 0)]  # a shift entirely out of range: the checker refuses it


def _value(fill: str) -> float:
    return {"-inf": -math.inf, "inf": math.inf}.get(fill, None) or float(fill)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_padded_copy_matches_np_pad(case: str, dtype: str) -> None:
    dims, fill = CASES[case]
    c = compile_loaded(lang.load(program(dims, fill, dtype)))
    rows = case in ROW_BLOCKS  # rows padded at their ends: whole rows on the partitions (test_padded_rows.py)
    assert ("rules_copy.row_blocks builds it" in c.stages["schedule"]) == rows
    assert rows or ("resolve_fill" in c.stages["schedule"] and "fill_from" in c.stages["schedule"])
    inputs = inputs_for(c.program)
    got = np.asarray(c.run(**inputs)["Y"], np.float32)
    x = np.asarray(inputs["X"]).astype(NP[dtype]).astype(np.float32)
    want = expected(x, dims, float(np.float32(_value(fill)).astype(NP[dtype])))
    np.testing.assert_array_equal(got, want)  # a copy moves bits: exact
    if dtype == "f32" and "inf" not in fill:
        check_against_reference(c)


def test_fill_rounds_to_the_input_dtype_then_converts() -> None:
    dims = [("i", 130, 140, -7), ("j", 20, 20, 0)]
    c = compile_loaded(lang.load(program(dims, "0.1", "bf16", "f32")))
    got = np.asarray(c.run(**inputs_for(c.program))["Y"], np.float32)
    assert got[0, 0] == np.float32(ml_dtypes.bfloat16(0.1)) != np.float32(0.1)  # the reference's rounding
    check_against_reference(c)


def test_interior_moves_hbm_to_hbm_and_the_fill_tile_is_set_once() -> None:
    """Rows padded only before and after (whole rows of fill): the interior is HBM -> HBM DMAs in blocks of 128
    rows and a ragged last block, the fill rows stored from one constant tile set at the kernel's top level."""
    c = compile_loaded(lang.load(program([("i", 400, 430, -300), ("j", 24, 24, 0)], "0")))
    src = numbered(c.source)
    for line in src.splitlines():
        if "src=X[" in line:
            assert "dst=Y[" in line  # X is never staged
    sets = [line for line in src.splitlines() if "nisa.memset(" in line or "nl.zeros(" in line]  # (0.6 / 0.1 forms)
    assert len(sets) == 1 and sets[0].startswith("    fill")
    # X's 130 read rows: two blocks of 65 (a divisor makes as few blocks as 128 would); 300 fill rows: 3 x 100
    assert src.count("src=X[") == 1 and "src=X[i_o * 65:i_o * 65 + 65]" in src
    assert src.count("src=fill") == 1 and "range(3)" in src


def test_a_ragged_block_of_padded_rows_is_staged_apart() -> None:
    """shift2d: 298 rows read (the 2 first are fill), 69 columns read and 1 of fill at the end of each row: blocks
    of 128 rows and a last one of 42 (298 has no good divisor), each made in SBUF and stored as whole rows. (One
    outer unit: row_blocks leaves it to the box schedule, whose blocks of rows fill the partitions in one DMA.)"""
    c = compile_loaded(lang.load(program(CASES["shift2d"][0], "0")))
    src = numbered(c.source)
    assert "Y_tile = nl.ndarray((128, 70)" in src and "Y_tile2 = nl.ndarray((42, 70)" in src
    assert "dst=Y[258:300], src=Y_tile2)" in src


def test_the_rule_keeps_the_nest_meaning() -> None:
    """resolve_fill and fill_from, applied with the rule's other primitives, keep the level-A meaning."""
    for case in ("shift2d", "pad3d", "fill_wide", "shift1d"):
        dims, fill = CASES[case]
        c = compile_loaded(lang.load(program(dims, fill)))
        op = next(o for o in c.result.ops if getattr(o, "copy", False))
        nest = copy_nest(op, c.program)
        prims = rules.copy(nest, TRN2)
        assert prims is not None
        done = rules.apply(nest, prims, TRN2)
        assert not any(isinstance(s.expr, Load) and s.expr.access.fill is not None for s in walk(done.body)
                       if hasattr(s, "expr"))
        x = np.random.default_rng(1).random(nest.params[0].shape, dtype=np.float32)
        np.testing.assert_array_equal(evaluate_nest(done, {"X": x})["Y"], evaluate_nest(nest, {"X": x})["Y"])


def test_resolve_fill_refuses_a_read_partly_outside() -> None:
    c = compile_loaded(lang.load(program(CASES["shift2d"][0], "0")))
    nest = copy_nest(next(o for o in c.result.ops if getattr(o, "copy", False)), c.program)
    with pytest.raises(TilecError, match="partly inside"):
        rules_copy.resolve_fill(nest)
    done = rules_copy.resolve_fill(_all_fill_nest())
    assert [s.expr for s in walk(done.body) if isinstance(s, Assign)] == [Const(2.0)]


def _all_fill_nest() -> Kernel:
    """Y[i, j] = X[i + 500, j] ?? 2 over a 300 x 8 X, built on level A (the checker refuses such a program)."""
    x, y = Buffer("X", "hbm", "f32", (300, 8)), Buffer("Y", "hbm", "f32", (300, 8))
    read = Access("X", (Aff((Term("i"),), 500), Aff((Term("j"),))), 2.0)
    body = Assign(Access("Y", (Aff((Term("i"),)), Aff((Term("j"),)))), Load(read))
    return Kernel("k", (x,), (y,), (Loop("i", 300, (Loop("j", 8, (body,)),)),))


def test_a_read_wholly_outside_is_all_fill() -> None:
    with pytest.raises(TilecError, match="never touches") as info:  # the language refuses it...
        compile_loaded(lang.load(program(ALL_FILL, "2")))
    assert info.value.span is not None
    nest = _all_fill_nest()  # ...and the rule, given one on level A, stores the fill only
    prims = rules.copy(nest, TRN2)
    assert prims is not None and not any(p.name == "cut" for p in prims)
    done = rules.apply(nest, prims, TRN2)
    x = np.random.default_rng(1).random((300, 8), dtype=np.float32)
    np.testing.assert_array_equal(evaluate_nest(done, {"X": x})["Y"], np.full((300, 8), 2, np.float32))


def test_explain_shows_the_primitives() -> None:
    from tilec.compiler.api import explain
    text = explain(compile_loaded(lang.load(program(CASES["shift2d"][0], "0"))))
    assert "rules.copy writes its schedule as" in text and "fill_from(" in text and "resolve_fill()" in text


@pytest.mark.parametrize("body, message", [
    # (element-wise statements with shifted padded reads compile since core9: tests/compiler/test_padded_eltwise.py)
    ("  Y: f32[M / 2]\n  for i in 0..M / 2:\n    Y[i] = 2 * (X[2*i - 1] ?? 0)\n", "or in an expression where"),
    ("  Y: f32[2]\n  for r in 0..2:\n    Y[r] = 0\n    for i in 0..M:\n      Y[r] += (X[i - 1] ?? 0) + 1\n",
     "inside a reduction"),
    ("  Y: f32[M / 2]\n  for i in 0..M / 2:\n    Y[i] = X[2*i - 1] ?? 0\n", "each a loop variable plus a constant"),
])
def test_other_padded_reads_are_located_errors(body: str, message: str) -> None:
    text = "kernel k(X: f32[M]) -> Y\n  default M = 64\n" + body
    with pytest.raises(TilecError, match=message) as info:
        compile_loaded(lang.load(text))
    assert info.value.span is not None and info.value.hint


def test_rows_padded_at_their_ends_are_made_in_sbuf_and_stored_whole() -> None:
    """pad3d: 12-column rows become 14-column rows, 200 channels: blocks of 100 channels, X's rows loaded whole into
    a load tile, copied on chip into the middle of a tile of whole rows, the tile stored as whole rows."""
    c = compile_loaded(lang.load(program(CASES["pad3d"][0], "0")))
    src = numbered(c.source)
    assert "Y_tile = nl.ndarray((100, 10, 14)" in src and "X_rows = nl.ndarray((100, 10, 12)" in src
    assert "dst=X_rows, src=X[o_t * 100:o_t * 100 + 100])" in src
    # the middle of the rows copied on chip, VectorE and ScalarE each taking some rows
    middle = [line for line in src.splitlines() if re.search(r"Y_tile\[:, \d+:\d+, 1:13\]", line)]
    assert len(middle) == 2 and "tensor_copy" in middle[0] and "activation" in middle[1]
    assert "dst=Y[o_t * 100:o_t * 100 + 100, 1:11], src=Y_tile)" in src


@pytest.mark.parametrize("name, sizes, want", [
    ("shift_padded", {"N": 2, "C": 130, "H": 6, "W": 5},
     lambda x: np.pad(x, [(0, 0), (0, 0), (2, 0), (0, 1)])[:, :, :6, 1:]),
    ("pad1", {"N": 2, "C": 3, "H": 6, "W": 5}, lambda x: np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)])),
])
def test_the_benchmark_families_match_numpy(name: str, sizes: dict[str, int], want) -> None:
    """benchmarks/families/{shift_padded,pad1}.tl (issue 13's table) compiled at small sizes."""
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "families" / f"{name}.tl"
    c = compile_loaded(lang.load(str(path), sizes))
    inputs = inputs_for(c.program)
    (got,) = c.run(**inputs).values()
    np.testing.assert_array_equal(np.asarray(got, np.float32), want(np.asarray(inputs["X"], np.float32)))
