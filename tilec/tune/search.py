"""Search a schedule Space: a structured first guess, then an evolutionary search with local refinement.

The search knows nothing of compilers or models: it asks a batch cost function for the cost of schedules and keeps
the history. Determinism: one `random.Random(seed)`, candidates proposed in a fixed batch size (independent of the
number of worker processes), elites ordered by (cost, trial index). A time limit only cuts the same sequence short.

    small space : when every legal point fits in the budget (at most ENUMERATE_LIMIT points before the static
                  checks; under a time limit alone, at most ENUMERATE_UNBUDGETED legal points), all of them are
                  evaluated, the given seed points first: the result is then the best of the whole space, and
                  `SearchStats.exhaustive` says so
    first guess : the given seed points (the compiler's default, expert heuristics), then random legal points,
                  half of them uniform and half a knob step or two away from the given points
    each round  : BATCH children, each either a one-knob step from a tournament winner (exploitation) or a uniform
                  crossover of two tournament winners plus a mutation (exploration); points already tried, or
                  rejected by the static checks, are skipped without spending budget
"""
from __future__ import annotations

import itertools
import math
import random
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from tilec.tune.space import Point, Space

BATCH = 8  # candidates proposed and evaluated per round; fixed so results do not depend on the worker count
POPULATION = 12  # elites kept as parents
TOURNAMENT = 3
MAX_TRIES = 200  # proposals per wanted child before the space counts as exhausted
ENUMERATE_LIMIT = 50_000  # points before the static checks: enumerating them costs well under a second
ENUMERATE_UNBUDGETED = 64  # under a time limit alone, enumerate only spaces this small (grid order is not best-first)


@dataclass(frozen=True)
class Trial:
    index: int  # order of evaluation
    origin: str  # "default", "expert", "grid" (enumerated), "random", "step", "cross"
    point: Point
    schedule: str
    cost: float  # model or measured latency in µs; inf when the candidate failed
    error: str = ""  # why it failed (the compiler's or interpreter's message), empty when it ran


@dataclass(frozen=True)
class Candidate:
    origin: str
    point: Point
    schedule: str


# candidates -> (cost, error) for each, in the same order (a list, or an iterator yielding them as they finish)
BatchCost = Callable[[list[Candidate]], Iterable[tuple[float, str]]]
OnTrial = Callable[[Trial, "Trial | None"], None]  # (new trial, best so far)


@dataclass
class SearchStats:
    rejected: int = 0  # proposals the static checks turned down (no budget spent)
    duplicates: int = 0  # proposals whose schedule text was already tried
    exhausted: bool = False  # stopped because no new legal point could be found
    timed_out: bool = False
    exhaustive: bool = False  # every legal point of the space was evaluated (or pruned by its lower bound)
    legal: int | None = None  # distinct legal schedules in the space, when it was small enough to count


def best_of(trials: Iterable[Trial]) -> Trial | None:
    ok = [t for t in trials if math.isfinite(t.cost)]
    return min(ok, key=lambda t: (t.cost, t.index)) if ok else None


class Search:
    """One search run. `run()` returns the history of trials in evaluation order."""

    def __init__(self, space: Space, cost: BatchCost, *, budget: int | None = 64, time_s: float | None = None,
                 seed: int = 0, first: Iterable[tuple[str, Point]] = (), on_trial: OnTrial | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if budget is None and time_s is None:
            raise ValueError("give a budget, a time limit, or both")
        self.space, self.cost = space, cost
        self.budget = budget if budget is not None else 10**9
        self.enumerate_max = budget if budget is not None else ENUMERATE_UNBUDGETED
        self.deadline = None if time_s is None else clock() + time_s
        self.rng = random.Random(seed)
        self.first = list(first)
        self.on_trial, self.clock = on_trial, clock
        self.trials: list[Trial] = []
        self.seen: set[str] = set()
        self.stats = SearchStats()

    # ---- driver -------------------------------------------------------------------------------------------------

    def run(self) -> list[Trial]:
        every = self._enumerate()
        if every is not None and len(every) <= self.enumerate_max:
            self._evaluate(every)
            self.stats.exhaustive = len(self.trials) == len(every)
            return self.trials
        self.seen.clear()
        self._evaluate(self._first_guess())
        while self._left() > 0 and not self._out_of_time():
            batch = self._children(min(BATCH, self._left()))
            if not batch:
                self.stats.exhausted = True
                break
            self._evaluate(batch)
        return self.trials

    def _left(self) -> int:
        return self.budget - len(self.trials)

    def _out_of_time(self) -> bool:
        if self.deadline is not None and self.clock() >= self.deadline:
            self.stats.timed_out = True
        return self.stats.timed_out

    def _evaluate(self, batch: list[Candidate]) -> None:
        # evaluate in chunks of BATCH so a time limit can stop between them
        for start in range(0, len(batch), BATCH):
            if start and self._out_of_time():
                return
            chunk = batch[start:start + BATCH]
            for cand, (cost, error) in zip(chunk, self.cost(chunk)):
                trial = Trial(len(self.trials), cand.origin, cand.point, cand.schedule, cost, error)
                self.trials.append(trial)
                if self.on_trial:
                    self.on_trial(trial, best_of(self.trials))

    # ---- proposals ----------------------------------------------------------------------------------------------

    def _accept(self, origin: str, point: Point) -> Candidate | None:
        """A candidate if `point` is legal by the static checks and its schedule is new."""
        if self.space.check(point) is not None:
            self.stats.rejected += 1
            return None
        text = self.space.render(point)
        if text in self.seen:
            self.stats.duplicates += 1
            return None
        self.seen.add(text)
        return Candidate(origin, point, text)

    def _enumerate(self) -> list[Candidate] | None:
        """Every legal, distinct candidate, the given points first; None when the space is too big to list."""
        if self.space.size() > ENUMERATE_LIMIT:
            return None
        given = [c for origin, p in self.first if (c := self._accept(origin, p))]
        grid = itertools.product(*(k.values for k in self.space.knobs))
        rest = [c for p in grid if (c := self._accept("grid", p))]
        self.stats.legal = len(given) + len(rest)
        self.stats.rejected = self.stats.duplicates = 0  # counted again by the search proper, if it runs
        return given + rest

    def _first_guess(self) -> list[Candidate]:
        """The given points, then random legal points up to POPULATION: half uniform over the space, half one
        or two knob steps away from a given point (near the structured guesses, where good points tend to be)."""
        out = [c for origin, p in self.first if (c := self._accept(origin, p))]
        seeds = [c.point for c in out]
        tries = 0
        while len(out) < min(POPULATION, self.budget) and tries < MAX_TRIES * POPULATION:
            tries += 1
            if seeds and tries % 2:
                c = self._accept("step", self._mutate(self.rng.choice(seeds), strength=self.rng.choice((1, 2))))
            else:
                c = self._accept("random", self.space.random_point(self.rng))
            if c:
                out.append(c)
        return out[:self.budget]

    def _children(self, n: int) -> list[Candidate]:
        elites = self._elites()
        out: list[Candidate] = []
        tries = 0
        while len(out) < n and tries < MAX_TRIES * n:
            tries += 1
            if c := self._child(elites):
                out.append(c)
        if len(out) < n:  # random proposals dried up: sweep the best point's one-knob neighbours in order
            out += self._neighbours(elites[0], n - len(out))
        return out

    def _neighbours(self, point: Point, n: int) -> list[Candidate]:
        out: list[Candidate] = []
        for i, knob in enumerate(self.space.knobs):
            for value in knob.values:
                if len(out) < n and value != point[i]:
                    if c := self._accept("step", point[:i] + (value,) + point[i + 1:]):
                        out.append(c)
        return out

    def _elites(self) -> list[Point]:
        ok = sorted((t for t in self.trials if math.isfinite(t.cost)), key=lambda t: (t.cost, t.index))
        elites = [t.point for t in ok[:POPULATION]]
        return elites or [self.space.default_point()]

    def _child(self, elites: list[Point]) -> Candidate | None:
        if self.rng.random() < 0.5:
            return self._accept("step", self._mutate(self._pick(elites), strength=1))
        a, b = self._pick(elites), self._pick(elites)
        child = tuple(x if self.rng.random() < 0.5 else y for x, y in zip(a, b))
        return self._accept("cross", self._mutate(child, strength=self.rng.choice((0, 1, 2))))

    def _pick(self, elites: list[Point]) -> Point:
        """Tournament selection: elites are sorted best first, so the smallest drawn index wins."""
        return elites[min(self.rng.randrange(len(elites)) for _ in range(TOURNAMENT))]

    def _mutate(self, point: Point, strength: int) -> Point:
        values = list(point)
        variable = [i for i, k in enumerate(self.space.knobs) if len(k.values) > 1]
        for _ in range(strength if variable else 0):
            i = self.rng.choice(variable)
            choices = self.space.knobs[i].values
            at = choices.index(values[i])
            if self.rng.random() < 0.7:  # a neighbouring value: nearby points tend to have nearby costs
                at = min(max(at + self.rng.choice((-1, 1)), 0), len(choices) - 1)
            else:
                at = self.rng.randrange(len(choices))
            values[i] = choices[at]
        return tuple(values)


def search(space: Space, cost: BatchCost, **kwargs: object) -> tuple[list[Trial], SearchStats]:
    """Run one search; see `Search` for the keyword arguments."""
    run = Search(space, cost, **kwargs)  # type: ignore[arg-type]
    return run.run(), run.stats
