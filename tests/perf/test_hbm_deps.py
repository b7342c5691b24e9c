"""How the model orders instructions touching one HBM tensor (tilec/perf/deps.py), on small NKI kernels
(hbm_order_kernels.py) run by the interpreter.

Documented (docs/notes/model8.md): the compiler orders instructions by their data dependences (v2.26.1
nki/arch/trainium_inferentia2_arch.rst; v2.32.0 nki/get-started/nki-language-guide.rst: the logical order is the
program order, only operations without data dependences are reordered). So under either rule a write after a write
of a common element, and a read after a write of a common element, wait. Not documented: whether disjoint elements
inside one byte range count as a dependence. The default "range" rule says they do; the "pattern" rule (a what-if,
until benchmarks/trn2_hbm_order.py is run on a Trn2) says they do not.
"""
from __future__ import annotations

import itertools
import pathlib
import sys

import numpy as np
import pytest

from tilec import patterns
from tilec.errors import TilecError
from tilec.nki import api
from tilec.nki.rules import LoopCarriedDependenceError
from tilec.perf import deps
from tilec.perf.api import estimate
from tilec.perf.deps import DepTracker

KERNELS = pathlib.Path(__file__).with_name("hbm_order_kernels.py")
RULES = ("range", "pattern")


def run(name: str, x: np.ndarray | None = None):
    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64) if x is None else x
    return api.simulate_traced(api.load_kernel_file(KERNELS, name), x)


def dmas(trace) -> list:
    return [ins for ins in trace.instrs if ins.engine == "dma"]


def waits(first, second, rule: str) -> bool:
    """Whether `second` must wait for `first` alone (one earlier instruction recorded, ending at t = 1)."""
    tracker = DepTracker(by_pattern=rule == "pattern")
    tracker.record(first.reads, first.writes, 1.0)
    return tracker.ready(second.reads, second.writes) >= 1.0


@pytest.mark.parametrize("rule", RULES)
def test_stores_to_separate_blocks_never_wait(rule):
    out, trace = run("blocks")
    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    assert np.array_equal(out, np.stack([x[:, :32], x[:, 32:]]))
    _, s1, s2 = dmas(trace)
    assert not waits(s1, s2, rule)


def test_stores_to_interleaved_halves_wait_only_under_the_range_rule():
    out, trace = run("halves")
    assert np.array_equal(out, np.arange(128 * 64, dtype=np.float32).reshape(128, 64))
    _, s1, s2 = dmas(trace)
    assert s1.writes[0].lo < s2.writes[0].hi and s2.writes[0].lo < s1.writes[0].hi  # the byte ranges overlap
    assert waits(s1, s2, "range")
    assert not waits(s1, s2, "pattern")


@pytest.mark.parametrize("rule", RULES)
def test_write_after_write_of_common_elements_waits(rule):
    out, trace = run("overwrite")
    assert np.array_equal(out, np.arange(128 * 64, dtype=np.float32).reshape(128, 64))
    _, s1, s2 = dmas(trace)
    assert waits(s1, s2, rule)


@pytest.mark.parametrize("rule", RULES)
def test_load_of_an_hbm_intermediate_waits_for_the_store_of_its_elements(rule):
    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    out, trace = run("read_one_half", x)
    assert np.array_equal(out, x[:, :32])
    _, s1, s2, load, _ = dmas(trace)
    assert waits(s1, load, rule)  # read after write: a correctness matter, under every rule
    assert waits(s2, load, rule) == (rule == "range")  # the other half: a dependence only by byte range


def test_a_strided_write_does_not_hide_the_dense_write_before_it():
    """The tracker drops entries a new write covers; under the pattern rule a strided write covers only its own
    elements, so a later read of the elements it skips still waits for the earlier dense write."""
    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    out, trace = run("read_after_strided", x)
    assert np.array_equal(out, x[:, 32:])
    _, dense, strided, load, _ = dmas(trace)
    for rule in RULES:
        tracker = DepTracker(by_pattern=rule == "pattern")
        tracker.record(dense.reads, dense.writes, 1.0)
        tracker.record(strided.reads, strided.writes, 2.0)
        ready = tracker.ready(load.reads, load.writes)
        assert ready == (2.0 if rule == "range" else 1.0)


def test_the_pattern_rule_shortens_the_schedule_only_where_elements_are_disjoint():
    _, halves = run("halves")
    _, blocks = run("blocks")
    _, over = run("overwrite")
    t = {(k, r): estimate(tr, hbm_rule=r).total_ns for k, tr in (("h", halves), ("b", blocks), ("o", over))
         for r in RULES}
    assert t["h", "pattern"] < t["h", "range"]
    assert t["h", "pattern"] == pytest.approx(t["b", "pattern"])
    assert t["b", "pattern"] == t["b", "range"]
    assert t["o", "pattern"] == t["o", "range"]


def test_the_default_rule_is_the_byte_range_and_an_unknown_rule_is_a_located_error(monkeypatch):
    _, trace = run("halves")
    monkeypatch.setenv("TILEC_MODEL_HBM_DEPS", "range")
    assert estimate(trace).total_ns == estimate(trace, hbm_rule="range").total_ns
    monkeypatch.setenv("TILEC_MODEL_HBM_DEPS", "pattern")
    assert estimate(trace).total_ns == estimate(trace, hbm_rule="pattern").total_ns
    monkeypatch.setenv("TILEC_MODEL_HBM_DEPS", "bogus")
    with pytest.raises(TilecError, match="TILEC_MODEL_HBM_DEPS"):
        estimate(trace)


def test_the_race_check_uses_the_same_rule():
    """Affine iterations writing interleaved halves of one output are legal (disjoint elements); writing the same
    half is err_unexpected_output_dependencies; and the model's pattern rule agrees on both pairs of stores."""
    _, legal = run("bands_affine")
    _, s1, s2 = dmas(legal)
    assert not waits(s1, s2, "pattern")
    with pytest.raises(LoopCarriedDependenceError, match="affine_range"):
        run("bands_affine_clash")


def _elements(p: tuple) -> list:
    off, shape, strides = p
    grid = np.array([off])
    for n, s in zip(shape, strides):
        grid = (grid[:, None] + s * np.arange(n)[None, :]).ravel()
    return sorted(grid.tolist())


def _brute(a: tuple, b: tuple) -> bool:
    return bool(set(_elements(a)) & set(_elements(b)))


def test_common_element_matches_a_brute_force_intersection():
    rng = np.random.default_rng(11)
    dims = patterns.storage_dims((6, 8, 10))
    for _ in range(400):
        pats = []
        for _ in range(2):
            shape = tuple(int(n) for n in rng.integers(1, 4, size=rng.integers(1, 4)))
            strides = tuple(int(s) for s in rng.choice([1, 2, 3, 10, 11, 20, 80], size=len(shape)))
            pats.append((int(rng.integers(0, 60)), shape, strides))
        a, b = pats
        assert patterns.meet(a, b, dims) == _brute(a, b), (a, b)
        assert patterns.meet(a, b) == _brute(a, b), (a, b)
        ca = (a[0], *patterns.canonical(a[1], a[2]))  # what the recorder stores: the same elements
        assert _elements(ca) == _elements(a) and len(ca[1]) <= len(a[1]), (a, ca)


def test_the_hardware_kernel_set_runs_and_matches_numpy(capsys):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import trn2_hbm_order as bench
    finally:
        sys.path.pop(0)
    names = [f"{k}_{loop}" for k, loop in itertools.product(bench.KINDS, ("affine", "seq"))]
    assert bench.main(["--bands", "3", "--free", "16", "--kernels", ",".join(names)]) == 0
    text = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:]}
    assert set(rows) == set(names) and all(r[1] == "ok" for r in rows.values())
    range_us = {name: float(r[3]) for name, r in rows.items()}
    pattern_us = {name: float(r[4]) for name, r in rows.items()}
    # the measurement separates the rules: interleaved rows cost what the overwrite costs under one, what separate
    # blocks cost under the other
    assert range_us["rows_affine"] > range_us["blocks_affine"]
    assert pattern_us["rows_affine"] == pytest.approx(pattern_us["blocks_affine"])
    assert pattern_us["rows_affine"] < pattern_us["overwrite_affine"]


def test_the_nki06_kernel_set_runs_and_matches_numpy(capsys):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import trn2_hbm_order as bench
    finally:
        sys.path.pop(0)
    assert bench.main(["--nki06", "--bands", "2", "--free", "8"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == set(bench.KINDS) and all(r[1] == "ok" and int(r[2]) > 1 for r in rows.values())
    assert float(rows["rows"][3]) > float(rows["blocks"][3])
    assert float(rows["rows"][4]) == pytest.approx(float(rows["blocks"][4]))
