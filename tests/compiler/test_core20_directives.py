"""Issue 10's directives on element-wise statements (core20): `tile` of a broadcast layout's partition loop sets the
partitions per tile, `unroll Y.v` makes the tile loop v runs through a static range, `buffers X, 1` keeps X's tiles
in one buffer allocated before the loops (which become sequential). Each accepted directive changes the kernel as
stated (its text, the model) and the interpreter's output equals a NumPy formula; each refused one is a TilecError
at its line. Small shapes: the interpreter runs every case in well under a second."""
from __future__ import annotations

import re

import numpy as np
import pytest

from kernel_numbers import numbered
from tilec.compiler.api import compile_loaded, read_schedule
from tilec.errors import TilecError
from tilec.lang import api as lang

FLAT = """kernel k(X: f32[M, N], Z: f32[M, N]) -> Y
  default M = {M}, N = {N}
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = tanh(X[i, j]) * 2 - Z[i, j]
"""
BCAST = """kernel b(X: f32[M, N], g: f32[N], c: f32[M]) -> Y
  default M = {M}, N = {N}
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] * g[j] - c[i]
"""
OUTER = """kernel o(X: f32[A, B, C], s: f32[B]) -> Y
  default A = 3, B = 40, C = 50
  Y: f32[A, B, C]
  for a in 0..A, b in 0..B, c in 0..C:
    Y[a, b, c] = X[a, b, c] * s[b] + 1
"""
ONE = """kernel k(X: f32[M, N]) -> Y
  default M = {M}, N = {N}
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = tanh(X[i, j])
"""
ROWSUM = """kernel r(X: f32[M, N]) -> s
  default M = {M}, N = {N}
  s: f32[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] += X[i, j] * 2
"""


def flat(x: dict) -> np.ndarray:
    return np.tanh(x["X"]) * 2 - x["Z"]


def bcast(x: dict) -> np.ndarray:
    return x["X"] * x["g"][None, :] - x["c"][:, None]


def compiled(text: str, schedule: str, nki: str = "0.6", **sizes: int):
    return compile_loaded(lang.load(text.format(**sizes)), read_schedule(schedule), nki)


def rowsum(x: dict) -> np.ndarray:
    return (x["X"] * 2).sum(axis=1)


def matches(c, formula, out: str = "Y") -> None:
    rng = np.random.default_rng(20)
    given = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5) * 4 for t in c.program.inputs}
    got = np.asarray(c.run(**given)[out], np.float64)
    want = formula({k: v.astype(np.float64) for k, v in given.items()})
    np.testing.assert_allclose(got, want, rtol=2.0**-20, atol=2.0**-20 * np.abs(want).max())


def code(source: str) -> str:
    return numbered(source).split('"""', 2)[-1]  # without the docstring, which lists the directives


# ---- unroll --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule, loops", [
    ("tile Y.j, 256\nunroll Y.i", 1),           # 4 free tiles of flattened data: t
    ("tile Y.j, 64\nunroll Y.j", 1),            # 16 tiles, pipelined in pairs: the loop of pairs is static
])
def test_unroll_of_flattened_data_makes_the_tile_loop_static(schedule: str, loops: int) -> None:
    c = compiled(FLAT, schedule, "0.1", M=64, N=2048)
    assert len(re.findall(r"for t in nl\.static_range\(", c.source)) == loops, c.source
    assert "nl.affine_range" not in c.source and "for t in nl.sequential_range" not in c.source
    plain = compiled(FLAT, schedule.split("\n")[0], "0.1", M=64, N=2048).source
    assert len(re.findall(r"for t in nl\.(affine|sequential)_range\(", plain)) == loops  # before: not static
    matches(c, flat)


def test_unroll_keeps_the_software_pipelined_pairs() -> None:
    """16 tiles: the default pairs them (the next tile's loads first); unroll makes that loop static, no more."""
    unrolled = compiled(FLAT, "tile Y.j, 64\nunroll Y.i", "0.1", M=64, N=2048).source
    pipelined = compiled(FLAT, "tile Y.j, 64", "0.1", M=64, N=2048).source
    assert "software-pipelined" in unrolled
    assert code(unrolled).replace("nl.static_range(7)", "nl.sequential_range(7)") == code(pipelined)


@pytest.mark.parametrize("schedule, static", [
    ("tile Y.i, 50\nunroll Y.i", {"pt"}),       # 300 rows: 6 partition tiles
    ("tile Y.j, 100\nunroll Y.j", {"t"}),       # 700 columns: 7 free tiles
])
def test_unroll_of_a_broadcast_layout_unrolls_the_loop_v_runs_through(schedule: str, static: set[str]) -> None:
    c = compiled(BCAST, schedule, "0.1", M=300, N=700)
    loops = dict(re.findall(r"for (\w+) in nl\.(\w+)_range", c.source))
    assert {v for v, kind in loops.items() if kind == "static"} == static, loops
    matches(c, bcast)


def test_unroll_in_nki_06_leaves_the_code_as_it_is() -> None:
    """NKI 0.6 loops are Python ranges, unrolled when traced (docs nki-versions.md): only the 0.1 form differs."""
    a = compiled(FLAT, "tile Y.j, 256", M=64, N=2048).source
    b = compiled(FLAT, "tile Y.j, 256\nunroll Y.i", M=64, N=2048).source
    assert code(a) == code(b) and a != b


# ---- buffers X, 1 --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tensor", ["X", "Y"])
def test_one_buffer_is_allocated_before_the_loop_which_turns_sequential(tensor: str) -> None:
    c = compiled(FLAT, f"tile Y.j, 256\nbuffers {tensor}, 1", "0.1", M=64, N=2048)
    src = code(c.source)
    loop = src.index("for t in")
    assert re.search(rf"\n +{tensor}_tile = nl\.ndarray", src[:loop]), src  # allocated once, before the loop
    assert f"{tensor}_tile = nl.ndarray" not in src[loop:]
    assert "for t in nl.sequential_range(4)" in src
    other = "Z" if tensor == "X" else "X"
    assert f"{other}_tile = nl.ndarray" in src[loop:]  # the other tiles stay in the loop (rotated by NKI)
    matches(c, flat)


def test_one_buffer_on_a_ragged_broadcast_and_its_regions() -> None:
    """300 x 700 with tiles of 128 x 512: four regions (cuts), each region's X tile allocated once."""
    c = compiled(BCAST, "tile Y.i, 128\ntile Y.j, 512\nbuffers X, 1", "0.1", M=300, N=700)
    src = code(c.source)
    first = re.search(r"\n +for \w+ in nl\.", src).start()
    assert len(re.findall(r"X_tile\w* = nl\.ndarray", src[:first])) == 4
    assert not re.search(r"X_tile\w* = nl\.ndarray", src[first:])
    matches(c, bcast)


def test_one_buffer_is_slower_in_the_model() -> None:
    """One output tile: each tile's work waits for the previous tile's store, and the model says so (tanh of
    256 x 4096 f32: 37.7 us by default, 52.4 us); one input tile costs less here (the next load waits only for one
    short activation: 37.8 us) but never gains."""
    from tilec.perf.api import estimate

    def model_us(schedule: str) -> float:
        c = compiled(ONE, schedule, M=256, N=4096)
        _, trace = c.run_traced(**lang.random_inputs(c.program, seed=1), numerics=False)
        return estimate(trace).total_us

    default = model_us("")
    assert model_us("buffers Y, 1") > 1.2 * default and model_us("buffers X, 1") >= default


# ---- tile of the partition loop --------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule, parts, free", [("tile Y.i, 100", 100, None), ("tile Y.i, 64\ntile Y.j, 350", 64, 350),
                                                   ("tile Y.j, 350\ntile Y.i, 64", 64, 350)])
def test_a_partition_tile_sets_the_partitions_per_tile(schedule: str, parts: int, free: int | None) -> None:
    c = compiled(BCAST, schedule, M=300, N=700)
    src = numbered(c.source)
    assert re.search(rf"\n *X_tile\w* = nl\.ndarray\(\({parts}, ", src), src
    if free:
        assert f"TILE_F = {free}" in src
    matches(c, bcast)


# ---- row reductions ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule, static", [("tile s.j, 256\nunroll s.j", "ft"), ("tile s.i, 100\nunroll s.i", "pt")])
def test_unroll_of_a_row_reduction(schedule: str, static: str) -> None:
    """A reduced loop: the loop over free tiles (4 of 256); a kept loop: the loop over row tiles (3 of 100)."""
    c = compiled(ROWSUM, schedule, "0.1", M=300, N=1024)
    loops = dict(re.findall(r"for (\w+) in nl\.(\w+)_range", c.source))
    assert {v for v, kind in loops.items() if kind == "static"} == {static}, loops
    matches(c, rowsum, "s")


def test_one_buffer_of_a_row_reductions_operand() -> None:
    c = compiled(ROWSUM, "buffers X, 1", "0.1", M=300, N=1024)
    src = code(c.source)
    loop = re.search(r"\n +for pt in nl\.sequential_range", src)
    assert loop and "X_tile = nl.ndarray" in src[:loop.start()] and "X_tile = nl.ndarray" not in src[loop.start():]
    matches(c, rowsum, "s")


# ---- refused, at the directive's line ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, schedule, says", [
    (FLAT, "unroll Y.i", "has one iteration: nothing to unroll"),                  # 64 x 2048: one tile
    (FLAT, "tile Y.j, 8\nunroll Y.i", "has 128 iterations, more than the 64"),
    (FLAT, "tile Y.j, 1000\nunroll Y.i", "do not divide its 131072 elements"),
    (FLAT, "buffers X, 2", "already keeps several in flight"),
    (BCAST, "buffers g, 1", "g is broadcast in Y (a row copied to every partition)"),
    (BCAST, "buffers c, 1", "c is broadcast in Y (a column of one value per partition)"),
    (BCAST, "tile Y.i, 200", "a tile of 200 on the partition dimension exceeds 128"),
    (OUTER, "tile Y.a, 2", "`a` is an outer loop of Y's layout"),
    (ROWSUM, "buffers s, 1", "s is the result of the reduction s"),
    (ROWSUM, "unroll s.j", "has one iteration: nothing to unroll"),
])
def test_a_directive_that_cannot_apply_is_refused_at_its_line(text: str, schedule: str, says: str) -> None:
    sizes = {FLAT: {"M": 64, "N": 2048}, BCAST: {"M": 300, "N": 700}, ROWSUM: {"M": 300, "N": 1024}}.get(text, {})
    with pytest.raises(TilecError) as err:
        compiled(text, schedule, **sizes)
    line = len(schedule.split("\n"))
    assert err.value.span is not None and err.value.span.line == line, err.value.render()
    assert says in str(err.value), str(err.value)


@pytest.mark.parametrize("schedule", ["unroll s.i", "buffers X, 1"])
def test_short_rows_refuse_what_their_layout_has_not(schedule: str) -> None:
    """4096 rows of 8: several rows per partition (rules_reduce._short_rows), no row-tile loop or per-tile X."""
    with pytest.raises(TilecError) as err:
        compiled(ROWSUM, schedule, M=4096, N=8)
    assert err.value.span is not None and err.value.span.line == 1, err.value.render()
    assert "cannot apply to s" in str(err.value), str(err.value)


def test_buffers_of_a_tensor_two_statements_read_names_both() -> None:
    text = ("kernel t(X: f32[M, N]) -> Y\n  default M = 64, N = 256\n  T: f32[M]\n  Y: f32[M, N]\n"
            "  for i in 0..M:\n    T[i] = 0\n    for j in 0..N:\n      T[i] += X[i, j]\n"
            "  for i in 0..M, j in 0..N:\n    Y[i, j] = X[i, j] * 2 + T[i]\n")
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load(text), read_schedule("buffers X, 1"))
    assert err.value.span is not None and "X is read by T and Y" in str(err.value), str(err.value)


def test_explain_prints_the_directives_back() -> None:
    """`tilec explain` prints the schedule as directives; fed back, they give the same kernel."""
    schedule = "tile Y.i, 64\ntile Y.j, 350\nunroll Y.i\nbuffers X, 1"
    c = compiled(BCAST, schedule, M=300, N=700)
    printed = [ln.strip() for ln in c.stages["schedule"].splitlines() if ln.strip() and not ln.startswith("#")]
    assert {"unroll Y.i", "buffers X, 1", "tile Y.j, 350", "tile Y.i, 64"} <= set(printed), printed
    again = compiled(BCAST, "\n".join(printed), M=300, N=700)
    assert code(again.source) == code(c.source)
