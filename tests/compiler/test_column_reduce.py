"""Sums over leading or middle dimensions (column sums, a mean over a middle axis): the reduced rows go on the
partitions and a ones-matmul on TensorE adds them up in PSUM. Plain sums (one row tile per matmul) are scheduled
by the level-A rule rules.colreduce; grouped, stacked and wide steps and epilogues by build_colreduce. Checked
against NumPy and the reference evaluator."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import check_against_reference, inputs_for
from tilec.compiler import rules, wrap
from tilec.compiler.api import compile_loaded
from tilec.compiler.lower import lower
from tilec.compiler.lower_tiles import colreduce_nest
from tilec.compiler.nest import lower_nest, print_nest
from tilec.compiler.nest_eval import evaluate_nest
from tilec.compiler.schedule import default_plan
from tilec.compiler.select import select
from tilec.errors import TilecError
from tilec.lang import api as lang
from tilec.target import target
from kernel_numbers import numbered

COLSUM = """kernel colsum(A: f32[M, N]{extra}) -> s
  default M = {m}, N = {n}
  s: f32[N]
  for j in 0..N:
    s[j] = {init}
  for i in 0..M, j in 0..N:
    s[j] += {term}
"""
MIDMEAN = """kernel midmean(A: f32[B, M, N]) -> s
  default B = 3, M = 200, N = 96
  s: f32[B, N]
  for b in 0..B, n in 0..N:
    s[b, n] = 0
    for m in 0..M:
      s[b, n] += A[b, m, n] / M
"""


def compile_text(text: str, schedule: str | None = None):
    directives = lang.parse_schedule(schedule, "<test>") if schedule is not None else None
    return compile_loaded(lang.load(text), directives)


def colsum(m=256, n=384, init="0", term="A[i, j]", extra=""):
    return COLSUM.format(m=m, n=n, init=init, term=term, extra=extra)


@pytest.mark.parametrize("text,schedule", [
    (colsum(), None), (colsum(), "tile s.i, 64\ntile s.j, 128"), (colsum(300, 1000), None),
    (colsum(init="b[j]", extra=", b: f32[N]"), None), (colsum(term="A[i, j] * A[i, j] / M"), None),
    (MIDMEAN, None),
])
def test_sums_over_leading_dimensions(text, schedule):
    c = compile_text(text, schedule)
    assert "nisa.nc_matmul(ones_f32" in numbered(c.source)
    check_against_reference(c)


def test_column_sum_against_numpy():
    c = compile_text(colsum())
    a = inputs_for(c.program)["A"]
    got = np.asarray(c.run(A=a)["s"], np.float32)
    np.testing.assert_allclose(got, a.astype(np.float64).sum(axis=0), rtol=1e-5)


def test_column_sum_directives_are_checked():
    with pytest.raises(TilecError, match="exceeds the 512 one matmul sums"):
        compile_text(colsum(n=1024), "tile s.j, 1024")


@pytest.mark.parametrize("m,group", [(512, 4), (768, 2), (384, 1), (100, 1)])
@pytest.mark.parametrize("term,init", [("A[i, j]", "0"), ("(A[i, j] - 1) * (A[i, j] - 1) / M", "b[j]")])
def test_fp32_row_tiles_are_grouped_and_added_in_pairs(m, group, term, init):
    """fp32 tiles load GROUP per step and VectorE adds them in pairs before the ones-matmul (half the fp32
    matmuls); a tile count that is not a multiple of 2 keeps one matmul per tile. Same sums either way."""
    text = colsum(m=m, n=384, init=init, term=term, extra=", b: f32[N]" if init != "0" else "")
    c = compile_text(text)
    assert ("in pairs on VectorE first" in numbered(c.source)) == (group > 1)
    assert numbered(c.source).count("nc_matmul(") == max(1, group // 2)  # one matmul per pair of tiles in a step
    ins = inputs_for(c.program)
    got = np.asarray(c.run(**ins)["s"], np.float64)
    a = ins["A"].astype(np.float64)
    want = (a if term == "A[i, j]" else (a - 1) ** 2 / m).sum(axis=0) + (ins["b"] if init != "0" else 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_16bit_column_sums_stream_every_tile_through_tensore(dtype):
    c = compile_text(colsum(m=1024).replace("A: f32", f"A: {dtype}"))
    assert "in pairs on VectorE" not in numbered(c.source)
    assert "groups of 4 TILE_P tiles" in c.source and c.source.count("nc_matmul(") == 4  # 4 loads in flight
    check_against_reference(c)


@pytest.mark.parametrize("dtype,m,act", [("bf16", 512, True), ("f16", 200, True), ("f32", 64, True),
                                         ("f32", 384, False)])
def test_a_mean_is_evicted_by_scalare_unless_fp32_matmuls_bound_it(dtype, m, act):
    """The factor of a mean rides on ScalarE's eviction (one instruction instead of VectorE's copy and multiply)
    for 16-bit sources and for one row tile per eviction; three fp32 row tiles (TensorE-bound) keep VectorE's."""
    text = colsum(m=m, n=1024, term="A[i, j] / M").replace("f32[", f"{dtype}[")
    c = compile_text(text)
    evictions = [ln for ln in numbered(c.source).splitlines() if "s_row" in ln and "s_acc" in ln]
    assert len(evictions) == 1 and ("activation" in evictions[0]) == act
    check_against_reference(c)
    inputs = inputs_for(c.program)
    want = inputs["A"].astype(np.float64).mean(axis=0)
    got = np.asarray(c.run(**inputs)["s"], np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-2 if dtype != "f32" else 1e-5, atol=1e-2 if dtype != "f32" else 1e-6)


STACKED = """kernel midmean(A: {dtype}[B, M, N]{extra}) -> s
  default B = {b}, M = {m}, N = {n}
  s: {out}[B, N]
  for b in 0..B, n in 0..N:
    s[b, n] = {init}
    for m in 0..M:
      s[b, n] += A[b, m, n] / M
"""


@pytest.mark.parametrize("b,m,n,dtype,out,init,k,w", [
    (8, 64, 1024, "f32", "f32", "0", 4, 2), (4, 64, 4096, "bf16", "bf16", "0", 2, 4),
    (6, 32, 512, "bf16", "f32", "0", 3, 1), (8, 32, 96, "f32", "bf16", "c[b, n]", 4, 1),
    (3, 64, 512, "f32", "f32", "0", 1, 1), (4, 48, 128, "f32", "f32", "0", 1, 1),
    (4, 128, 2048, "bf16", "f32", "0", 1, 4), (1, 128, 2048, "f32", "f32", "0", 1, 1)])
def test_middle_means_stack_several_os_on_the_partitions(b, m, n, dtype, out, init, k, w):
    """A middle mean whose reduced rows fill at most half the partitions (M = 64, 32) sums K o's per step: K * M
    partitions, a block-diagonal (K * M, K) ones matrix, one (K, TILE_F) store, and loads W PSUM banks' worth of
    columns at once (one matmul per bank); O = 3 (no divisor) and M = 48 (blocks would start off a multiple of 32)
    keep one o per step (N = 128: rows too short for build_global_axes.py's pieces). M = 128 fills the partitions
    alone: wide loads still (not for one fp32 o). fp32 rows go two to a partition when one row tile holds an o
    (build_colreduce.row_pairs): M = 64 stacks 4 o's."""
    extra = ", c: f32[B, N]" if init != "0" else ""
    c = compile_text(STACKED.format(b=b, m=m, n=n, dtype=dtype, out=out, init=init, extra=extra))
    assert re.search(rf"s_acc = nl\.\w+\(\({k}, ", numbered(c.source)), numbered(c.source)
    assert ("stacked on the partitions" in c.source) == (k > 1) and c.source.count("nc_matmul(") == w
    check_against_reference(c)
    inputs = inputs_for(c.program)
    want = inputs["A"].astype(np.float64).mean(axis=1) + (inputs["c"] if init != "0" else 0)
    got = np.asarray(c.run(**inputs)["s"], np.float64)
    tol = 1e-2 if "bf16" in (dtype, out) else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


MIDSUM = """kernel midsum(A: {dtype}[B, M, N]) -> s
  default B = {b}, M = {m}, N = {n}
  s: {out}[B, N]
  for b in 0..B, n in 0..N:
    s[b, n] = 0
    for m in 0..M:
      s[b, n] += A[b, m, n]
"""
MID4D = """kernel mid4d(A: f32[B, C, H, W]) -> s
  default B = 2, C = 3, H = 100, W = 50
  s: f32[B, W]
  for b in 0..B, w in 0..W:
    s[b, w] = 0
    for c in 0..C, h in 0..H:
      s[b, w] += A[b, c, h, w]
"""
RULE = {"colsum_three_tiles": colsum(384, 1024), "colsum_bf16": colsum(384, 96).replace("f32", "bf16"),
        "colsum_ragged_divisor": colsum(129, 33),
        "midsum_bf16": MIDSUM.format(dtype="bf16", out="f32", b=3, m=300, n=96), "midsum_two_dims": MID4D,
        # epilogues: the factor on VectorE (three fp32 row tiles) or on ScalarE's eviction (bf16, one row tile), a
        # constant or a column's initial value, a narrower output cast after them
        "colmean_three_tiles": colsum(384, 1024, term="A[i, j] / M"),
        "colmean_bf16": colsum(384, 96, term="A[i, j] / M").replace("f32", "bf16"),
        "colmean_one_tile": colsum(100, 1000, term="A[i, j] / M", init="0.5"),
        "colsum_init_column": colsum(129, 33, init="b[j]", extra=", b: f32[N]"),
        # 16-bit row tiles in groups of 4 (or 2), each tile loaded into a buffer of its own (unroll copies)
        "colsum_groups_bf16": colsum(1024, 96).replace("f32", "bf16"),
        "colmean_groups_f16_init": colsum(256, 40, term="A[i, j] / M", init="0.5").replace("A: f32", "A: f16"),
        "midsum_groups_bf16": MIDSUM.format(dtype="bf16", out="f32", b=2, m=512, n=64),
        # fp32 row tiles in groups, added in pairs first (pair, bind_expr; ScalarE evicts, the factor on the way)
        "colsum_pairs_f32": colsum(1024, 96), "colsum_pairs_two_tiles_init": colsum(256, 40, init="b[j]",
                                                                                   extra=", b: f32[N]"),
        "colmean_pairs_f32": colsum(512, 64, term="A[i, j] / M", init="0.5"),
        "midmean_init_bf16": STACKED.format(dtype="bf16", out="bf16", b=3, m=300, n=96, init="c[b, n]",
                                            extra=", c: f32[B, N]"),
        # reduced expressions: the loaded tiles' terms bound to a tile (bind_expr; the source's 16-bit dtype for a
        # 16-bit sum, else f32: rules_colreduce.terms_dtype), then summed as a source is (one tile per matmul, 16-bit
        # groups, fp32 pairs of terms)
        "colsq_one_tile": colsum(128, 96, term="A[i, j] * A[i, j]"),
        "coldot_mean_three_tiles": colsum(384, 96, term="A[i, j] * B[i, j] / M", extra=", B: f32[M, N]"),
        "colsq_pairs_f32_init": colsum(1024, 96, term="A[i, j] * A[i, j]", init="b[j]", extra=", b: f32[N]"),
        "colsq_groups_bf16": colsum(512, 64, term="(A[i, j] - 1.5) * A[i, j]").replace("f32", "bf16"),
        # wide loads (one row tile holds the reduced rows): W PSUM banks' worth of columns per load, each bank a
        # matmul and an eviction of its own (the factor on it), the terms of an expression over the whole tile
        "colsum_wide_bf16": colsum(128, 2048).replace("f32", "bf16"),
        "colmean_wide_init_bf16": colsum(128, 1024, term="A[i, j] / M", init="b[j]", extra=", b: f32[N]").replace(
            "A: f32", "A: bf16"),
        "colsq_wide_bf16": colsum(128, 1024, term="A[i, j] * A[i, j] / M").replace("A: f32", "A: bf16"),
        "midsum_wide_f32": MIDSUM.format(dtype="f32", out="f32", b=2, m=96, n=1024),
        # o's stacked on the partitions (K * R of them, merge_dims), a block-diagonal ones matrix per step
        "midsum_stacked_bf16": MIDSUM.format(dtype="bf16", out="f32", b=6, m=32, n=512),
        "midsum_stacked_f32": MIDSUM.format(dtype="f32", out="f32", b=8, m=32, n=96),
        "midsum_stacked_once_bf16": MIDSUM.format(dtype="bf16", out="bf16", b=2, m=64, n=512),
        "midmean_stacked_once_init_bf16": STACKED.format(dtype="bf16", out="f32", b=2, m=64, n=512, init="c[b, n]",
                                                         extra=", c: f32[B, N]"),
        "midmean_stacked_init_bf16": STACKED.format(dtype="bf16", out="f32", b=4, m=64, n=512, init="c[b, n]",
                                                    extra=", c: f32[B, N]"),
        "midsum_stacked_wide_init_bf16": STACKED.format(dtype="bf16", out="f32", b=4, m=64, n=1024, init="c[b, n]",
                                                        extra=", c: f32[B, N]").replace(" / M", ""),
        "midmean_stacked_wide_bf16": STACKED.format(dtype="bf16", out="bf16", b=4, m=32, n=2048, init="0", extra=""),
        # fp32 rows two to a partition (build_colreduce.row_pairs): K o's of R / 2 partitions, the pairs added on
        # GpSimdE/VectorE into one tile (bind_expr merged), wide loads, a factor on ScalarE's eviction, an init
        "midsum_pairs_stacked_f32": MIDSUM.format(dtype="f32", out="f32", b=4, m=64, n=1024),
        "midmean_pairs_wide_f32": STACKED.format(dtype="f32", out="f32", b=4, m=128, n=2048, init="0", extra=""),
        "midmean_pairs_init_f32": STACKED.format(dtype="f32", out="bf16", b=6, m=64, n=512, init="c[b, n]",
                                                 extra=", c: f32[B, N]"),
        "midsum_pairs_init_const_f32": MIDSUM.format(dtype="f32", out="f32", b=2, m=128, n=1024).replace(
            "s[b, n] = 0", "s[b, n] = 0.5"),
        # loops the program names like the rule's (o, f): the epilogue's loop is the second of its name
        "midmean_loops_named_o_f_bf16": STACKED.format(dtype="bf16", out="f32", b=4, m=64, n=512, init="0", extra="")
        .replace("b, n", "o, f").replace("b in", "o in").replace("n in", "f in").replace("A[b, m, n]", "A[o, m, f]"),
        "midmean_loops_named_o_f_f32": STACKED.format(dtype="f32", out="f32", b=4, m=64, n=512, init="0", extra="")
        .replace("b, n", "o, f").replace("b in", "o in").replace("n in", "f in").replace("A[b, m, n]", "A[o, m, f]"),
        # stacked o's of an expression: the terms of the whole (K*R, TILE_F) tile (bind_expr merged), squares on
        # ScalarE (square=scalar); wide loads; a factor on the eviction
        "midsq_stacked_bf16": MIDSUM.format(dtype="bf16", out="f32", b=4, m=64, n=512).replace(
            "+= A[b, m, n]", "+= A[b, m, n] * A[b, m, n]"),
        "midsq_stacked_wide_f32": MIDSUM.format(dtype="f32", out="f32", b=4, m=64, n=2048).replace(
            "+= A[b, m, n]", "+= A[b, m, n] * A[b, m, n] / M"),
        "midabs_stacked_f32": MIDSUM.format(dtype="f32", out="bf16", b=6, m=32, n=512).replace(
            "+= A[b, m, n]", "+= abs(A[b, m, n])"),
        "midabs_bf16": MIDSUM.format(dtype="bf16", out="f32", b=3, m=300, n=96).replace("+= A[b, m, n]",
                                                                                         "+= abs(A[b, m, n])")}
# the reduced terms by NumPy (float64), per expression a case sums
TERMS = {"A[i, j] * A[i, j]": lambda x: x["A"] ** 2, "A[i, j] * A[i, j] / M": lambda x: x["A"] ** 2,
         "A[i, j] * B[i, j]": lambda x: x["A"] * x["B"],
         "(A[i, j] - 1.5) * A[i, j]": lambda x: (x["A"] - 1.5) * x["A"], "abs(A[b, m, n])": lambda x: abs(x["A"]),
         "A[b, m, n] * A[b, m, n]": lambda x: x["A"] ** 2, "A[b, m, n] * A[b, m, n] / M": lambda x: x["A"] ** 2}


def _rule(text: str):
    prog = lang.load(text)
    op = select(lower(prog.kernel, prog.sizes), prog)[0]
    nest = colreduce_nest(op, prog)
    assert nest is not None
    return prog, nest, rules.colreduce(nest, target("trn2"), default_plan(op, {}))


def _numpy_sum(text: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The program's value by NumPy: the reduced axes are the ones the output's indices skip; a mean divides by
    their size; then the initial value (a constant, or the tensor b or c) is added."""
    a = inputs["A"].astype(np.float64)
    for term, value in TERMS.items():
        if f"+= {term}" in text:
            a = value({n: x.astype(np.float64) for n, x in inputs.items()})
    axes = (1, 2) if "mid4d" in text else 0 if "colsum" in text else 1
    total = a.sum(axis=axes)
    if "/ M" in text:
        total = total / a.shape[0 if "colsum" in text else 1]
    start = re.search(r"s\[[^]]*\] = (.+)\n", text)
    assert start is not None
    init = start.group(1)
    if init in ("b[j]", "c[b, n]"):
        return total + inputs[init[0]]
    return total + float(init)


@pytest.mark.parametrize("name", sorted(RULE))
def test_column_rule_keeps_the_meaning(name, golden):
    """rules.colreduce on the nest in (o, r, f) order: the scheduled nest evaluates like the program and NumPy."""
    prog, nest, prims = _rule(RULE[name])
    assert prims is not None
    scheduled = rules.apply(nest, prims, target("trn2"))
    inputs = inputs_for(prog)
    got = evaluate_nest(scheduled, inputs)["s"]
    tol = 8e-3 if "bf16" in RULE[name] else 1e-4  # bf16 inputs or output: 8 bits
    # (a bf16 output rounds once here, after the fp32 sum and its epilogue; the program rounds at each step)
    np.testing.assert_allclose(got, evaluate_nest(lower_nest(prog), inputs)["s"], rtol=1e-5 if tol < 1e-3 else tol)
    np.testing.assert_allclose(got, _numpy_sum(RULE[name], inputs), rtol=tol, atol=tol)
    golden.check(f"compiler/rules/colreduce_{name}.txt", rules.print_prims(prims) + "\n" + print_nest(scheduled))


@pytest.mark.parametrize("name", sorted(RULE))
def test_column_rule_kernels_match_numpy(name):
    c = compile_text(RULE[name])
    assert "rules.colreduce expands its plan into" in c.stages["schedule"]
    inputs = inputs_for(c.program)
    got = np.asarray(c.run(**inputs)["s"], np.float64)
    tol = 8e-3 if "bf16" in RULE[name] else 1e-4
    np.testing.assert_allclose(got, _numpy_sum(RULE[name], inputs), rtol=tol, atol=tol)


UNIT_STACKED = """kernel u(A: bf16[B, E, M, N]) -> s
  default B = 4, E = 1, M = 64, N = 512
  s: f32[B, E, N]
  for b in 0..B, e in 0..E, n in 0..N:
    s[b, e, n] = 0
    for m in 0..M:
      s[b, e, n] += A[b, e, m, n]
"""


@pytest.mark.parametrize("text", [UNIT_STACKED, MIDSUM.format(dtype="f32", out="f32", b=3, m=128, n=2048)])
def test_the_column_rule_leaves_unit_stacks_and_one_o_of_row_pairs_to_the_builder(text):
    """Stacked o's of a nest with a loop of extent 1, and fp32 row pairs of one o at a time (K = 1, wide loads):
    build_colreduce still writes these (the rule declines, and the kernel says so; checked against NumPy).
    Grouped row tiles, expressions, stacked and wide sums, stacked expressions and stacked row pairs are the
    rule's."""
    prog = lang.load(text)
    op = select(lower(prog.kernel, prog.sizes), prog)[0]
    nest = colreduce_nest(op, prog)
    assert nest is None or rules.colreduce(nest, target("trn2"), default_plan(op, {})) is None
    c = compile_text(text)
    assert "rules.colreduce" not in c.stages["schedule"]
    inputs = inputs_for(prog)
    got = np.asarray(c.run(**inputs)["s"], np.float64)
    want = inputs["A"].astype(np.float64).sum(axis=2 if "E = 1" in text else 1)
    np.testing.assert_allclose(got, want.reshape(got.shape), rtol=1e-2, atol=1e-2)


MIDMIN = """kernel midmin(X: f32[A, B, C], Y0: f32[A, C]) -> Y
  default A = 4, B = 256, C = 1024
  Y: f32[A, C]
  for a in 0..A, c in 0..C:
    Y[a, c] = Y0[a, c]
    for b in 0..B:
      Y[a, c] min= X[a, b, c]
"""


def test_a_split_fold_reads_each_loaded_tile_on_gpsimd_first():
    """A fold split between GpSimdE and VectorE puts GpSimdE's part first: the loads then issue on GpSimdE's DMA
    stream, apart from the stores of VectorE's results, so an o's loads do not wait behind the last o's store
    (the model's DMA trigger streams; 16 x 256 x 4096 min from Y0: 330 -> 218 us). Checked against NumPy."""
    c = compile_text(MIDMIN)
    lines = wrap.unwrap(numbered(c.source)).splitlines()
    folds = [ln for ln in lines if "nisa.tensor_tensor(" in ln and "X_r" in ln]
    assert folds and any("gpsimd" in ln for ln in folds)
    for n, ln in enumerate(lines):  # every VectorE fold follows the GpSimdE fold of the same tile pair
        if ln in folds and "gpsimd" not in ln:
            assert "gpsimd" in lines[n - 1] and "nisa.tensor_tensor(" in lines[n - 1]
    ins = inputs_for(c.program)
    np.testing.assert_array_equal(np.asarray(c.run(**ins)["Y"]), np.minimum(ins["Y0"], ins["X"].min(axis=1)))


@pytest.mark.parametrize("b,m,n,k,w", [(64, 64, 4096, 4, 4), (16, 128, 4096, 2, 4), (4, 64, 1024, 4, 1),
                                       (8, 64, 96, 4, 1)])
def test_fp32_rows_go_two_to_a_partition_when_one_row_tile_holds_an_o(b, m, n, k, w):
    """An fp32 middle mean whose reduced rows fit one row tile: rows 2q, 2q+1 of an o share partition q (one load of
    a (TILE_P, 2, TILE_F) tile), GpSimdE/VectorE add them, and TensorE's block-diagonal ones sum M / 2 partitions
    per o, K o's at a time (model: 64 x 64 x 4096 300.7 -> 249.1 us). Checked against NumPy."""
    c = compile_text(STACKED.format(b=b, m=m, n=n, dtype="f32", out="f32", init="0", extra=""))
    src = wrap.unwrap(numbered(c.source))
    assert re.search(r"A_rows = nl\.ndarray\(\(128, 2, ", src) and re.search(rf"s_acc = nl\.\w+\(\({k}, ", src), src
    assert src.count("nc_matmul(") == w and "two rows per partition" in src
    inputs = inputs_for(c.program)
    got = np.asarray(c.run(**inputs)["s"], np.float64)
    np.testing.assert_allclose(got, inputs["A"].astype(np.float64).mean(axis=1), rtol=1e-5, atol=1e-5)


def test_a_grouped_sum_reaching_the_builder_is_a_compiler_bug():
    """rules.colreduce schedules every sum of several row tiles per step (16-bit groups, fp32 pairs): the builder's
    grouped path is gone, and a grouped sum handed to it is an InternalError, not a kernel. The same program
    compiles through the rule and matches NumPy."""
    from tilec.compiler import ir
    from tilec.compiler.build_colreduce import build_column_reduce
    from tilec.errors import InternalError
    text = colsum(1024, 96)
    prog = lang.load(text)
    op = select(lower(prog.kernel, prog.sizes), prog)[0]
    hbm = {n: ir.Buf(n, "hbm", t.dtype, tuple(t.shape)) for n, t in prog.tensors.items()}
    with pytest.raises(InternalError, match="rules.colreduce schedules those"):
        build_column_reduce(op, default_plan(op, {}), hbm, lambda name: name)
    c = compile_text(text)
    inputs = inputs_for(c.program)
    np.testing.assert_allclose(np.asarray(c.run(**inputs)["s"], np.float64), _numpy_sum(text, inputs), rtol=1e-4)


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("name", ["midsum_pairs_stacked_f32", "midmean_pairs_wide_f32", "midmean_pairs_init_f32"])
def test_row_pairs_by_the_rule_in_both_dialects(name, nki):
    """fp32 rows two to a partition (rules.colreduce, pairs): one load of (K*R/2, 2, TILE_F), the two rows of each
    partition added by GpSimdE and VectorE (each its columns) into one tile read twice (A_rows[:, 0], A_rows[:, 1]),
    ScalarE evicting; the kernel against NumPy in both NKI dialects."""
    text = RULE[name]
    prog = lang.load(text)
    c = compile_loaded(prog, None, nki)
    source = wrap.unwrap(numbered(c.source))
    assert "rules.colreduce expands its plan into" in c.stages["schedule"]
    adds = [ln for ln in source.splitlines() if "nisa.tensor_tensor(" in ln and "s_pair" in ln]
    assert len(adds) == 2 and "gpsimd" in adds[0] and "gpsimd" not in adds[1], adds
    assert all("A_rows[:, 0, " in ln and "A_rows[:, 1, " in ln for ln in adds)
    inputs = inputs_for(prog)
    got = np.asarray(c.run(**inputs)["s"], np.float64)
    tol = 8e-3 if "bf16" in text else 1e-4
    np.testing.assert_allclose(got, _numpy_sum(text, inputs), rtol=tol, atol=tol)


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("name", ["midsq_stacked_bf16", "midsq_stacked_wide_f32", "midabs_stacked_f32"])
def test_stacked_expressions_by_the_rule_in_both_dialects(name, nki):
    """Stacked o's of an expression (rules.colreduce): the terms of the whole stacked tile in one instruction (a
    square on ScalarE), one block-diagonal matmul per PSUM bank; the kernel against NumPy in both NKI dialects."""
    text = RULE[name]
    prog = lang.load(text)
    c = compile_loaded(prog, None, nki)
    source = wrap.unwrap(numbered(c.source))
    assert "rules.colreduce expands its plan into" in c.stages["schedule"]
    assert ("nl.square" in source) == ("* A[b, m, n]" in text)
    inputs = inputs_for(prog)
    got = np.asarray(c.run(**inputs)["s"], np.float64)
    tol = 8e-3 if "bf16" in text else 1e-4
    np.testing.assert_allclose(got, _numpy_sum(text, inputs), rtol=tol, atol=tol)
