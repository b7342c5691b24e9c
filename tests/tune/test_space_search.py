"""Schedule space legality and rendering; the search's determinism and its ability to find an optimum."""
from __future__ import annotations

import random

import pytest

from synthetic import OPTIMUM, SPACE, CountingCost, cost_of
from tilec.tune.search import best_of, search
from tilec.tune.space import Knob, Space


def test_random_points_that_pass_the_checks_are_in_range_and_render():
    rng = random.Random(1)
    legal = [p for p in (SPACE.random_point(rng) for _ in range(300)) if SPACE.check(p) is None]
    assert len(legal) > 100
    for p in legal:
        y, x = p[0] or 1, p[1] or 1
        assert y * x <= 512
        text = SPACE.render(p)
        assert all(line.split()[0] in {"split", "tile", "buffers", "reorder"} for line in text.splitlines())


def test_illegal_points_are_rejected_with_a_reason():
    big = SPACE.point(**{"split conv.y": 64, "split conv.x": 128})
    assert SPACE.check(big) == "tile 64x128 exceeds 512 elements"
    off_menu = SPACE.point(**{"tile conv.k": 7})
    assert "tile conv.k: 7 is not one of the legal values" in SPACE.check(off_menu)
    assert "2 values" in SPACE.check((None, None))


def test_render_is_the_directive_syntax_and_default_is_empty():
    assert SPACE.render(SPACE.default_point()) == ""
    text = SPACE.render(OPTIMUM)
    assert text == "split conv.y, 8\nsplit conv.x, 64\ntile conv.k, 3\nbuffers X, 2\nreorder conv, x, y\n"


def test_knob_without_values_and_duplicate_names_are_errors():
    with pytest.raises(ValueError):
        Knob("k", "split", "a.b", ())
    k = Knob("k", "split", "a.b", (None, 2))
    with pytest.raises(ValueError):
        Space((k, k))


def test_same_seed_gives_the_same_history_and_another_seed_differs():
    runs = [search(SPACE, CountingCost(), budget=40, seed=s)[0] for s in (7, 7, 8)]
    key = [[(t.origin, t.schedule, t.cost) for t in run] for run in runs]
    assert key[0] == key[1]
    assert key[0] != key[2]


def test_search_finds_the_optimum_of_a_synthetic_cost():
    counter = CountingCost()
    history, stats = search(SPACE, counter, budget=120, seed=3, first=[("default", SPACE.default_point())])
    best = best_of(history)
    assert best.point == OPTIMUM and best.cost == cost_of(OPTIMUM) == 100
    assert counter.calls == len(history) == 120
    assert history[0].origin == "default"
    assert len({t.schedule for t in history}) == len(history)  # no schedule evaluated twice
    assert all(SPACE.check(t.point) is None for t in history)


SMALL = Space((Knob("split a.i", "split", "a.i", (None, 2, 4)), Knob("buffers A", "buffers", "A", (None, 2))))


def test_a_space_within_the_budget_is_enumerated_given_points_first():
    first = [("default", SMALL.default_point()), ("expert", SMALL.point(**{"split a.i": 4}))]
    history, stats = search(SMALL, lambda b: [(float(len(c.schedule)), "") for c in b], budget=50, seed=0,
                            first=first)
    assert stats.exhaustive and stats.legal == 6 and len(history) == 6
    assert [t.origin for t in history[:2]] == ["default", "expert"] and history[1].point == (4, None)
    assert {t.point for t in history} == {(a, b) for a in (None, 2, 4) for b in (None, 2)}
    assert best_of(history).schedule == ""  # the shortest text is the cheapest here: the default


def test_a_space_over_the_budget_is_searched_not_enumerated():
    history, stats = search(SMALL, lambda b: [(1.0, "")] * len(b), budget=4, seed=0)
    assert len(history) == 4 and not stats.exhaustive and stats.legal == 6


def test_a_large_space_with_few_legal_points_is_exhausted_without_repeats(monkeypatch):
    monkeypatch.setattr("tilec.tune.search.ENUMERATE_LIMIT", 0)  # as if it were too big to list
    history, stats = search(SMALL, lambda b: [(1.0, "")] * len(b), budget=50, seed=0)
    assert len(history) == 6 and stats.exhausted and not stats.exhaustive and stats.legal is None


def test_time_limit_cuts_the_same_sequence_short():
    ticks = iter(range(10**6))
    history, stats = search(SPACE, CountingCost(), budget=None, time_s=3, seed=7, clock=lambda: next(ticks))
    full, _ = search(SPACE, CountingCost(), budget=200, seed=7)
    assert stats.timed_out and 0 < len(history) < 200
    assert [t.schedule for t in history] == [t.schedule for t in full[:len(history)]]


def test_failed_candidates_are_kept_but_never_best():
    def cost(batch):
        return [(float("inf"), "tile too big") if c.point[0] == 1 else (cost_of(c.point), "") for c in batch]
    history, _ = search(SPACE, cost, budget=30, seed=2)
    failed = [t for t in history if t.error]
    assert failed and all(t.cost == float("inf") for t in failed)
    assert best_of(history).point[0] != 1
