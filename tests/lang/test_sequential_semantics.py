"""Random small loop programs (recurrences, reads at neighbouring indices, stores and accumulations at different
depths) give the same result on the evaluator as on a scalar interpreter of the sequential loop nest written
here: this checks the evaluator's decisions about which loops it may run as whole-array operations."""
from __future__ import annotations

import operator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilec.lang import api
from tilec.lang import syntax as s
from tilec.lang.fmt import format_source


def naive(kernel: s.Kernel, sizes: dict[str, int], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One statement instance at a time, in float64."""
    arrays = {p.name: inputs[p.name].astype(np.float64) for p in kernel.params}
    for d in kernel.decls:
        arrays[d.name] = np.zeros([int(ev(x, sizes, arrays)) for x in d.type.shape])

    def run(stmts: tuple, env: dict) -> None:
        for st_ in stmts:
            if isinstance(st_, s.Loop):
                for v in range(int(ev(st_.start, env, arrays)), int(ev(st_.stop, env, arrays))):
                    run(st_.body, {**env, st_.var: v})
                continue
            where = tuple(int(ev(i, env, arrays)) for i in st_.target.indices)
            value = ev(st_.value, env, arrays)
            old = arrays[st_.target.tensor][where]
            new = {"=": lambda: value, "+=": lambda: old + value, "max=": lambda: max(old, value),
                   "min=": lambda: min(old, value)}[st_.op]()
            arrays[st_.target.tensor][where] = new

    run(kernel.body, dict(sizes))
    return {o: arrays[o] for o in kernel.outputs}


def ev(e: s.Expr, env: dict, arrays: dict) -> float:
    if isinstance(e, s.Num):
        return e.value
    if isinstance(e, s.Name):
        return env[e.id]
    if isinstance(e, s.Neg):
        return -ev(e.x, env, arrays)
    if isinstance(e, s.BinOp):
        a, b = ev(e.lhs, env, arrays), ev(e.rhs, env, arrays)
        return {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}[e.op](a, b)
    if isinstance(e, s.Call):
        args = [ev(a, env, arrays) for a in e.args]
        return {"max": max, "min": min, "relu": lambda x: max(x, 0.0)}[e.fn](*args)
    return arrays[e.tensor][tuple(int(ev(i, env, arrays)) for i in e.indices)]


@st.composite
def index(draw, rank: int) -> str:
    """An in-bounds index near the current element: i (and k) shifted by -1, 0 or 1."""
    shifts = [draw(st.sampled_from(["- 1", "", "+ 1"])) for _ in range(rank)]
    return ", ".join(f"{v} {sh}".strip() for v, sh in zip("ik", shifts))


@st.composite
def reads(draw, inner: bool, rank: int) -> str:
    choices = ["A", "T", "Y"] + (["j"] if inner else [])
    what = draw(st.sampled_from(choices))
    term = "j" if what == "j" else f"{what}[{draw(index(rank))}]"
    coef = draw(st.sampled_from(["0.5", "-0.5", "0.25"]))
    return f"{coef} * {term}"


@st.composite
def statement(draw, inner: bool, rank: int) -> str:
    target = draw(st.sampled_from(["T", "Y"]))
    op = draw(st.sampled_from(["=", "+=", "max="]))
    terms = draw(st.lists(reads(inner, rank), min_size=1, max_size=2))
    value = " + ".join(terms)
    if draw(st.booleans()):
        value = f"max({value}, {draw(reads(inner, rank))})"
    return f"{target}[{draw(index(rank))}] {op} {value}"


@st.composite
def programs(draw, rank: int) -> str:
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            lines.append("    for j in 0..3:")
            lines += ["      " + draw(statement(True, rank)) for _ in range(draw(st.integers(1, 2)))]
        else:
            lines.append("    " + draw(statement(False, rank)))
    body = "\n".join(lines)
    shape, every, inside = ("N", "i in 0..N", "i in 1..N - 1") if rank == 1 else (
        "N, M", "i in 0..N, k in 0..M", "i in 1..N - 1, k in 1..M - 1")
    at = "i" if rank == 1 else "i, k"
    return f"""\
kernel rnd(A: f32[{shape}]) -> Y
  T: f32[{shape}]
  Y: f32[{shape}]
  for {every}:
    T[{at}] = A[{at}]
    Y[{at}] = 0
  for {inside}:
{body}
"""


@settings(max_examples=30, deadline=None)
@given(text=programs(1), n=st.integers(3, 12), seed=st.integers(0, 1000))
def test_evaluator_matches_sequential_loops(text: str, n: int, seed: int) -> None:
    check(text, {"N": n}, seed)


@settings(max_examples=30, deadline=None)
@given(text=programs(2), n=st.integers(3, 7), m=st.integers(3, 7), seed=st.integers(0, 1000))
def test_evaluator_matches_sequential_loops_2d(text: str, n: int, m: int, seed: int) -> None:
    check(text, {"N": n, "M": m}, seed)


def check(text: str, sizes: dict[str, int], seed: int) -> None:
    assert api.parse(format_source(text)) == api.parse(text)
    prog = api.load(text, sizes)
    inputs = api.random_inputs(prog, seed)
    got = api.evaluate(prog, inputs)["Y"]
    want = naive(prog.kernel, prog.sizes, inputs)["Y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=text)


# a store index combining loops (`2*y + a`, a transposed conv's store): the evaluator runs the nest open only when
# no two iterations of the combined loops meet one element (fuzz24: the open nest turned a 68 s evaluation into 0.06)
COMBINED = """\
kernel c(X: f32[H, {taps}], W: f32[{taps}, R]) -> Y
  default H = 5, R = 3
  Y: f32[{n}]
  for y in 0..H, a in 0..{taps}:
    Y[{store}] = {init}
    for r in 0..R:
      Y[{store}] += X[y, a] * W[a, r]
"""
FORMS = [  # (store, taps, elements of Y): disjoint (2*y + a, a < 2), reversed, overlapping (y + a, 2*y + a with a < 3)
    ("2 * y + a", 2, "2 * H"), ("a * H + y", 2, "2 * H"), ("2 * H - 1 - 2 * y - a", 2, "2 * H"),
    ("y + a", 2, "H + 1"), ("2 * y + a", 3, "2 * H + 1")]


@pytest.mark.parametrize("store, taps, n", FORMS)
@pytest.mark.parametrize("init", ["0", "X[y, a] * 2"])
def test_combined_store_indices_match_sequential_loops(store: str, taps: int, n: str, init: str) -> None:
    text = COMBINED.format(store=store, taps=taps, n=n, init=init)
    check(text, {"H": 5, "R": 3}, 7)


def test_a_disjoint_combined_store_runs_open() -> None:
    """The planner proves `Y[2*y + a]` (a in 0..2) safe to run over all (y, a) at once; `Y[y + a]` it does not."""
    from tilec.lang.evaluator import Machine

    for store, taps, n, want in [("2 * y + a", 2, "2 * H", True), ("y + a", 2, "H + 1", False)]:
        prog = api.load(COMBINED.format(store=store, taps=taps, n=n, init="0"))
        store_ = {t.name: np.zeros(t.shape, np.float32) for t in prog.tensors.values()}
        machine = Machine(prog.sizes, {}, store_)
        assert machine.planner.can_open(prog.kernel.body[0], {}) == want, store
