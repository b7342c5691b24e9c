"""Issue 10's directives on row reductions and their chains (core22): a `tile` of a row reduction that does not
divide the rows or the reduced elements leaves a smaller last tile (the rule's cuts), and `place T, hbm` of a
statistic a row chain would keep on chip builds T alone, stored and read back. Each accepted directive changes the
kernel as stated and the interpreter's output equals a NumPy formula; each refused one is a TilecError at its line.
Small shapes for the interpreter."""
from __future__ import annotations

import numpy as np
import pytest

from test_core20_directives import code, compiled, matches
from tilec.compiler.api import explain
from tilec.errors import TilecError

SSD = """kernel r(A: f32[M, N], P: f32[M, N]) -> s
  default M = {M}, N = {N}
  s: f32[M]
  for i in 0..M:
    s[i] = 0
    for j in 0..N:
      s[i] {op} (A[i, j] - P[i, j]) * (A[i, j] - P[i, j])
"""

CENTRE = """kernel c(X: f32[M, N]) -> Y
  default M = {M}, N = {N}
  mu: f32[M]
  Y: f32[M, N]
  for i in 0..M:
    mu[i] = 0
    for j in 0..N:
      mu[i] += X[i, j] / N
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] - mu[i]
"""


def ssd(x: dict) -> np.ndarray:
    return ((x["A"] - x["P"]) ** 2).sum(axis=1)


def ssd_max(x: dict) -> np.ndarray:
    return ((x["A"] - x["P"]) ** 2).max(axis=1)


def centre(x: dict) -> np.ndarray:
    return x["X"] - x["X"].mean(axis=1, keepdims=True)


@pytest.mark.parametrize("schedule, consts", [
    ("tile s.j, 64", {"for ft in range(3)", "src=A[:, 192:200]"}),  # 200 = 3 x 64 + 8 along each row
    ("tile s.i, 48", {"for pt in range(2)", "src=A[96:100]"}),      # 100 rows = 2 x 48 + 4
    ("tile s.i, 48\ntile s.j, 64", {"for pt in range(2)", "for ft in range(3)", "src=A[96:100, 192:200]"}),
])
@pytest.mark.parametrize("op, formula", [("+=", ssd), ("max=", ssd_max)])
def test_a_tile_that_does_not_divide_a_row_reduction_leaves_a_smaller_last_tile(schedule, consts, op, formula):
    c = compiled(SSD.replace("{op}", op).replace("0\n", "0\n" if op == "+=" else "-inf\n", 1), schedule,
                 M=100, N=200)
    src = code(c.source)
    assert all(k in src for k in consts), src
    matches(c, formula, "s")


@pytest.mark.parametrize("schedule, says", [
    ("tile s.i, 128", "a tile of 128 rows is more than the 100 rows"),
    ("tile s.j, 256", "a tile of 256 elements is more than the 200 each row reduces"),
])
def test_a_row_reduction_tile_beyond_its_data_is_refused_at_its_line(schedule, says):
    with pytest.raises(TilecError) as e:
        compiled(SSD.replace("{op}", "+="), schedule, M=100, N=200)
    assert says in e.value.message and e.value.span is not None and e.value.span.line == 1


@pytest.mark.parametrize("schedule", ["place mu, hbm", "compute_at mu, root"])
def test_place_hbm_builds_a_chained_statistic_alone(schedule):
    default = compiled(CENTRE, "", M=200, N=96)
    assert "mu = nl.ndarray" not in default.source  # the row chain keeps mu on chip
    c = compiled(CENTRE, schedule, M=200, N=96)
    assert "mu = nl.ndarray" in c.source and "HBM scratch" in explain(c)
    matches(c, centre)


def test_place_hbm_of_a_tensor_already_in_hbm_is_refused():
    """A directive naming Y builds Y alone: mu cannot join a chain with it and goes through HBM either way."""
    with pytest.raises(TilecError) as e:
        compiled(CENTRE, "tile Y.j, 32\nplace mu, hbm", M=200, N=64)
    assert e.value.span is not None and e.value.span.line == 2
    assert "goes through HBM without the directive too" in e.value.message


def test_place_sbuf_of_a_statistic_says_what_to_write():
    """(core23) The row chain keeps mu on chip without the directive: refused as changing nothing."""
    with pytest.raises(TilecError) as e:
        compiled(CENTRE, "place mu, sbuf", M=200, N=96)
    assert e.value.span is not None and "stays on chip without the directive: the row chain" in e.value.message
    assert "place mu, hbm" in e.value.hint


SCALE = """kernel sc(X: f32[M, N], beta: f32[N]) -> Y
  default M = {M}, N = {N}
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] * beta[j]
"""


def scale(x: dict) -> np.ndarray:
    return x["X"] * x["beta"][None, :]


def tile_loops(source: str) -> list[str]:
    """The tile loops (pt, t) in the order they open, a pipelined loop's copies counted once."""
    import re
    order = [m.group(1) for line in source.splitlines() if (m := re.match(r" *for (pt|t) in ", line))]
    return [v for i, v in enumerate(order) if v not in order[:i]]


@pytest.mark.parametrize("sizes, order", [
    (dict(M=256, N=4096), ["pt", "t"]),     # beta copied whole once: 8 free tiles inside each partition tile
    (dict(M=512, N=10240), ["t", "pt"]),    # too long to copy once: 4 partition tiles inside each free tile
])
def test_a_broadcast_layouts_inner_loop_of_tiles_is_software_pipelined(sizes, order):
    c = compiled(SCALE, "", **sizes)
    assert tile_loops(c.source) == order and "software-pipelined" in c.source, code(c.source)
    matches(c, scale)


def test_the_pipelined_inner_loop_is_faster_in_the_model():
    """1024 x 4096 f32 (floor 91 us): 127.7 us with the free tiles one after the other (`unroll Y.i` keeps the
    loop as it is, the same code in NKI 0.6), 107.2 us pipelined: each tile's load no longer waits behind the
    previous tile's store (before the multiply was shared with GpSimdE: 218.9 and 129.7 us)."""
    from tilec.lang import api as lang
    from tilec.perf.api import estimate

    def model_us(schedule: str) -> float:
        c = compiled(SCALE, schedule, M=1024, N=4096)
        _, trace = c.run_traced(**lang.random_inputs(c.program, seed=1), numerics=False)
        return estimate(trace).total_us

    assert model_us("") < 0.9 * model_us("unroll Y.i")


ADD = """kernel a(X: f32[M, N], Z: f32[M, N]) -> Y
  default M = {M}, N = {N}
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] + Z[i, j]
"""


def test_a_lone_tensor_tensor_is_shared_with_gpsimd_where_it_outlasts_its_loads():
    """X * beta[j]: X loaded, Y stored per tile (beta's tile made once), VectorE's 2 cycles an fp32 element take 0.76
    of the DMA time: the columns are cut between GpSimdE and VectorE. X + Z: three tiles of DMA per tile (0.51):
    VectorE alone, the tensor_tensor waits on its loads anyway (expr_instrs.LONE_CUT)."""
    shared = compiled(SCALE, "", M=256, N=4096)
    assert "engine=nisa.engine.gpsimd" in shared.source, code(shared.source)
    matches(shared, scale)
    alone = compiled(ADD, "", M=256, N=4096)
    assert "gpsimd" not in alone.source
