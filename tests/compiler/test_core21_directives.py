"""Issue 10's directives on element-wise statements, continued (core21): `reorder Y, j, i` of a broadcast layout
(outer x partitions x free) puts the free tiles outside the partition tiles, `reorder Y, i, j` inside; a column sum
takes `unroll` of its row tiles or free tiles and `buffers X, 1` (rules_colreduce). Each accepted
directive changes the kernel as stated (its loop order, the model) and the interpreter's output equals a NumPy
formula; each refused one is a TilecError at its line. Small shapes for the interpreter; the model test traces
without numerics."""
from __future__ import annotations

import re

import numpy as np
import pytest

from kernel_numbers import numbered
from test_core20_directives import BCAST, FLAT, OUTER, bcast, code, compiled, matches
from tilec.errors import TilecError
from tilec.lang import api as lang

LONG_ROW = """kernel s(X: f32[M, N], beta: f32[N]) -> Y
  default M = {M}, N = {N}
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] * sigmoid(beta[j] * X[i, j])
"""

COLUMN = BCAST.replace(" * g[j]", "")  # no row: free tiles of any width (a row's are at most one PSUM bank)


def loop_order(source: str) -> list[str]:
    """The tile loops of the kernel in the order they open (pt: partition tiles, t: free tiles, o..: outer)."""
    loops = [(m.group(1), line) for line in source.splitlines() if (m := re.match(r" *for (\w+) in ", line))]
    order = [v for v, line in loops if re.fullmatch(r"pt|t|o\d*", v) and "loaded ahead" not in line]
    return [v for i, v in enumerate(order) if i == 0 or v != order[i - 1]]  # (a pipelined loop's body copies)


def outer(x: dict) -> np.ndarray:
    return x["X"] * x["s"][None, :, None] + 1


def swish(x: dict) -> np.ndarray:
    return x["X"] / (1 + np.exp(-x["beta"][None, :] * x["X"]))


@pytest.mark.parametrize("schedule, order", [
    ("tile Y.i, 64\ntile Y.j, 256", ["pt", "t"]),                     # the rule's order: free tiles inside
    ("tile Y.i, 64\ntile Y.j, 256\nreorder Y, j, i", ["t", "pt"]),
    ("reorder Y, j, i\ntile Y.j, 256\ntile Y.i, 64", ["t", "pt"]),   # (any order of the lines)
    ("tile Y.i, 64\ntile Y.j, 256\nreorder Y, i, j", ["pt", "t"]),
])
def test_reorder_orders_the_partition_and_free_tiles(schedule: str, order: list[str]) -> None:
    c = compiled(BCAST, schedule, M=256, N=512)
    assert loop_order(c.source) == order, code(c.source)
    src = code(c.source)  # the column c is loaded per partition tile (dma_streams gathers those of a loop ahead of
    # it): inside the free tiles' loop when they lead
    assert (re.search(r"c_cols? = nl.ndarray", src).start() > src.index("for t in")) == (order[0] == "t"), src
    matches(c, bcast)


def test_reorder_of_long_rows_puts_the_partition_tiles_outside() -> None:
    """Rows too long to copy to the partitions once: the rule puts the free tiles outside (each row tile copied
    once); `reorder Y, i, j` puts them inside, so each row tile is copied again for every partition tile."""
    default = compiled(LONG_ROW, "tile Y.i, 64\ntile Y.j, 512", M=128, N=9216)
    inside = compiled(LONG_ROW, "tile Y.i, 64\ntile Y.j, 512\nreorder Y, i, j", M=128, N=9216)
    assert loop_order(default.source) == ["t", "pt"] and loop_order(inside.source) == ["pt", "t"]
    matches(inside, swish)


def test_partition_tiles_outside_cost_the_row_copies_in_the_model() -> None:
    """256 x 16384 bf16, beta[j] too long to copy once: the rule's order 123.6 us in the trn2 model, `reorder Y, i, j`
    144.0 us (each row tile copied to the partitions once per partition tile), `reorder Y, j, i` the rule's kernel."""
    from tilec.perf.api import estimate

    def model_us(schedule: str) -> float:
        c = compiled(LONG_ROW.replace("f32", "bf16"), schedule, M=256, N=16384)
        _, trace = c.run_traced(**lang.random_inputs(c.program, seed=1), numerics=False)
        return estimate(trace).total_us

    default = model_us("")
    assert model_us("reorder Y, j, i") == default
    assert model_us("reorder Y, i, j") > 1.1 * default


def test_reorder_with_outer_loops_keeps_them_between() -> None:
    """Y[a, b, c] with s[b]: a outer, b on the partitions, c free: the free tiles lead, the outer loop follows."""
    c = compiled(OUTER, "tile Y.c, 10\nreorder Y, c, b")
    order = loop_order(c.source)
    assert order == ["t", "o2"] and loop_order(compiled(OUTER, "tile Y.c, 10").source) == ["o2", "t"], order
    matches(c, outer)


@pytest.mark.parametrize("text, schedule, says", [
    (FLAT, "reorder Y, j, i", "has a fixed loop order: its loops are flattened"),
    (BCAST, "reorder Y, j", "names a loop of each"),
    (BCAST, "reorder Y, j, q", "reorder lists loop variables of Y, each once: i, j"),
    (COLUMN, "tile Y.j, 700\nreorder Y, j, i", "give one free tile"),
    (BCAST, "tile Y.j, 350\nreorder Y, j, i\nreorder Y, i, j", "sets again what"),
    (OUTER, "tile Y.c, 10\nreorder Y, c, b, a", "the outer loops are taken one at a time"),
])
def test_a_reorder_that_cannot_apply_is_refused_at_its_line(text: str, schedule: str, says: str) -> None:
    sizes = {FLAT: {"M": 64, "N": 2048}, BCAST: {"M": 300, "N": 700}, COLUMN: {"M": 300, "N": 700}}.get(text, {})
    with pytest.raises(TilecError) as err:
        compiled(text, schedule, **sizes)
    line = len(schedule.split("\n"))
    assert err.value.span is not None and err.value.span.line == line, err.value.render()
    assert says in str(err.value), str(err.value)


THREE = """kernel three(X: f32[A, B, C], c: f32[A]) -> Y
  default A = 256, B = 4, C = 512
  Y: f32[A, B, C]
  for i in 0..A, j in 0..B, k in 0..C:
    Y[i, j, k] = X[i, j, k] - c[i]
"""


@pytest.mark.parametrize("schedule", ["tile Y.k, 256\nreorder Y, j, k, i\nreorder Y, i, j",
                                      "tile Y.k, 256\nreorder Y, i, j\nreorder Y, j, k, i"])
def test_two_reorders_of_one_statement_are_one_error_naming_both_lines(schedule: str) -> None:
    """Two lists of different loops still order the same tiles: an error at the later line, naming the earlier."""
    with pytest.raises(TilecError) as err:
        compiled(THREE, schedule)
    assert err.value.span is not None and err.value.span.line == 3, err.value.render()
    assert "sets again what" in str(err.value) and "(line 2)" in str(err.value), str(err.value)


def test_reorder_lists_a_run_of_loops_whole_and_in_order() -> None:
    """j, k (free) are flattened into one free tile loop: `reorder Y, k, j, i` cannot swap them; `j, k, i` works."""
    with pytest.raises(TilecError) as err:
        compiled(THREE, "tile Y.k, 256\nreorder Y, k, j, i")
    assert err.value.span is not None and err.value.span.line == 2 and "go through one tile loop" in str(err.value)
    c = compiled(THREE, "tile Y.k, 256\nreorder Y, j, k, i")
    assert loop_order(c.source)[0] == "t", code(c.source)
    matches(c, lambda x: x["X"] - x["c"][:, None, None])


def test_reorder_in_rmsnorm_matches_numpy() -> None:
    """The order-independence case (test_directive_order's rmsnorm_order) computes RMS normalisation."""
    from compiler_helpers import compile_example
    c = compile_example("rmsnorm", dict(M=300, N=1024), schedule="tile Y.i, 100\ntile Y.j, 256\nreorder Y, j, i")
    assert loop_order(c.source) == ["pt", "t", "pt"], code(c.source)  # (ms's row tiles, then Y's tiles)
    matches(c, lambda x: x["X"] / np.sqrt((x["X"] ** 2).mean(axis=1, keepdims=True) + 1e-6) * x["g"][None, :])


def test_explain_prints_the_order_back() -> None:
    schedule = "tile Y.i, 64\ntile Y.j, 256\nreorder Y, j, i"
    c = compiled(BCAST, schedule, M=256, N=512)
    printed = [ln.strip() for ln in c.stages["schedule"].splitlines() if ln.strip() and not ln.startswith("#")]
    assert "reorder Y, j, i" in printed, printed
    again = compiled(BCAST, "\n".join(printed), M=256, N=512)
    assert code(again.source) == code(c.source)


# ---- column sums (rules_colreduce): unroll of the row tiles or the free tiles, one buffer of the operand's tiles ----


COLSUM = """kernel cs(X: f32[M, N]) -> s
  default M = {M}, N = {N}
  s: f32[N]
  for j in 0..N:
    s[j] = 0
  for i in 0..M, j in 0..N:
    s[j] += X[i, j] * 2
"""
COLMAX = COLSUM.replace("s[j] = 0", "s[j] = -inf").replace("s[j] += X[i, j] * 2", "s[j] max= X[i, j]")


def colsum(x: dict) -> np.ndarray:
    return (x["X"] * 2).sum(axis=0)


@pytest.mark.parametrize("schedule, M, static", [
    ("unroll s.i", 384, "rt"),      # three row tiles of 128, summed in one PSUM row
    ("unroll s.i", 2048, "rt"),     # four groups of four tiles (fp32 pairs)
    ("unroll s.j", 384, "ft"),      # two free tiles of 512
])
def test_unroll_of_a_column_sum(schedule: str, M: int, static: str) -> None:
    c = compiled(COLSUM, schedule, "0.1", M=M, N=1024)
    loops = dict(re.findall(r"for (\w+) in nl\.(\w+)_range", c.source))
    assert {v for v, kind in loops.items() if kind == "static"} == {static}, loops
    matches(c, colsum, "s")


def test_one_buffer_of_a_column_sums_operand() -> None:
    c = compiled(COLSUM, "buffers X, 1", "0.1", M=384, N=1024)
    src = code(c.source)
    loop = re.search(r"\n +for ft in nl\.sequential_range", src)
    assert loop and "X_tile = nl.ndarray" in src[:loop.start()] and "X_tile = nl.ndarray" not in src[loop.start():]
    assert "for rt in nl.sequential_range(3)" in numbered(c.source)
    matches(c, colsum, "s")


@pytest.mark.parametrize("text, schedule, M, says", [
    (COLSUM, "unroll s.i", 128, "its tile loop `rt` has one iteration: nothing to unroll"),
    (COLSUM, "buffers X, 1\nunroll s.i", 128, "`unroll` cannot apply to s"),   # (located at the unroll)
    (COLSUM, "buffers X, 1", 2048, "row tiles loaded in groups, each in a buffer of its own"),
    (COLSUM, "buffers s, 1", 384, "s is the result of the reduction s"),
    (COLMAX, "unroll s.i", 384, "scheduled by a builder of its own"),
])
def test_a_column_sum_refuses_what_its_layout_has_not(text: str, schedule: str, M: int, says: str) -> None:
    with pytest.raises(TilecError) as err:
        compiled(text, schedule, M=M, N=1024)
    line = len(schedule.split("\n"))
    assert err.value.span is not None and err.value.span.line == line, err.value.render()
    assert says in str(err.value), str(err.value)


def test_explain_prints_a_column_sums_settings_back() -> None:
    c = compiled(COLSUM, "unroll s.i\nbuffers X, 1", M=384, N=1024)
    printed = [ln.strip() for ln in c.stages["schedule"].splitlines() if ln.strip() and not ln.startswith("#")]
    assert {"unroll s.i", "buffers X, 1"} <= set(printed), printed
    again = compiled(COLSUM, "\n".join(printed), M=384, N=1024)
    assert code(again.source) == code(c.source)


# ---- split of flattened element-wise data: N free tiles per DMA -----------------------------------------------------


def flat(x: dict) -> np.ndarray:
    return np.tanh(x["X"]) * 2 - x["Z"]


@pytest.mark.parametrize("schedule, n, tile, loop", [
    ("tile Y.j, 256\nsplit Y.i, 2", 2, 256, "affine_range(2)"),         # 128 x 1024: 4 tiles, 2 DMAs of two
    ("tile Y.j, 64\nsplit Y.j, 2", 2, 64, "sequential_range(3)"),       # 16 tiles, 8 DMAs: pairs of blocks in flight
    ("tile Y.j, 64\nsplit Y.j, 4\nunroll Y.i", 4, 64, "static_range(4)"),  # the unroll names the loop of DMAs
    ("tile Y.j, 64\nsplit Y.j, 4\nbuffers Y, 1", 4, 64, "sequential_range(4)"),  # one result buffer of 4 tiles
])
def test_split_moves_n_tiles_per_dma_and_computes_them_one_by_one(schedule: str, n: int, tile: int,
                                                                 loop: str) -> None:
    c = compiled(FLAT, schedule, "0.1", M=64, N=2048)  # flattened: 128 partitions x 1024 elements
    src = numbered(c.source)
    assert f"DMA_F = {n * tile}" in src and f"TILE_F = {tile}" in src
    assert re.search(rf"X_tile\w* = nl\.ndarray\(\(128, {n * tile}\)", src), src   # one load moves n tiles
    assert f"for t in nl.{loop}" in src and f"for tc in nl.affine_range({n})" in src, src
    matches(c, flat)


def test_split_gives_bigger_dmas_in_the_model() -> None:
    """256 x 4096 f32 in tiles of 256 elements (1 KiB per partition per DMA): 63.8 us in the trn2 model; two tiles
    per DMA 49.7 us, as tiles of 512 (49.7): the DMAs, not the instruction width, set the time."""
    from tilec.perf.api import estimate

    def model_us(schedule: str) -> float:
        c = compiled(FLAT, schedule, M=256, N=4096)
        _, trace = c.run_traced(**lang.random_inputs(c.program, seed=1), numerics=False)
        return estimate(trace).total_us

    assert model_us("tile Y.j, 256\nsplit Y.i, 2") < 0.85 * model_us("tile Y.j, 256")


@pytest.mark.parametrize("text, schedule, says", [
    (FLAT, "tile Y.j, 256\nsplit Y.i, 3", "a DMA of 3 of them does not divide them"),
    (FLAT, "tile Y.j, 256\nsplit Y.i, 1", "moves one tile, the default"),
    (FLAT, "tile Y.j, 256\nsplit Y.i, 2\nsplit Y.j, 2", "another `split` of Y already set"),
    (FLAT, "tile Y.j, 1000\nsplit Y.i, 2", "do not divide its 131072 elements"),
    (BCAST, "split Y.j, 2", "reads a broadcast operand"),
])
def test_a_split_that_cannot_apply_is_refused_at_its_line(text: str, schedule: str, says: str) -> None:
    with pytest.raises(TilecError) as err:
        compiled(text, schedule, M=64, N=2048)
    assert err.value.span is not None and err.value.span.line == len(schedule.split("\n")), err.value.render()
    assert says in str(err.value), str(err.value)


def test_explain_prints_the_split_back() -> None:
    c = compiled(FLAT, "tile Y.j, 256\nsplit Y.i, 2", M=64, N=2048)
    printed = [ln.strip() for ln in c.stages["schedule"].splitlines() if ln.strip() and not ln.startswith("#")]
    assert "split Y.i, 2" in printed or "split Y.j, 2" in printed, printed
    again = compiled(FLAT, "\n".join(printed), M=64, N=2048)
    assert code(again.source) == code(c.source)
