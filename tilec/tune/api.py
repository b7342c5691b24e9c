"""`tune()`: search a program's schedule space, rank with an evaluator (the model by default), verify the winner.

    program --knobs--> Space --search (cached, pruned by a lower bound, parallel evaluation)--> history
            --select--> ranked candidates
            --verify on the interpreter against the reference--> TuneResult (schedule text, kernel source)
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import IO, Callable, Iterator

from tilec.errors import TilecError
from tilec.tune.cache import DiskCache
from tilec.tune.evaluate import Evaluator, Job, ModelEvaluator, Outcome
from tilec.tune.knobs import build_space
from tilec.tune.progress import Progress
from tilec.tune.search import Candidate, SearchStats, Trial, search
from tilec.tune.space import Point, Space
from tilec.tune.verify import Verdict, verify

DEFAULT_BUDGET = 48
VERIFY_TRIES = 3  # if the best candidate fails verification, try the next ones before giving up


@dataclass(frozen=True)
class TuneResult:
    best_schedule: str  # schedule text ("" = the compiler's default schedule)
    best_us: float
    default_us: float  # the compiler's default schedule under the same evaluator (inf if it failed)
    history: tuple[Trial, ...]
    verified: bool
    source: str  # NKI kernel module of the winner
    best_mfu: float = 0.0
    default_mfu: float = 0.0
    evaluations: int = 0  # candidates actually evaluated (cache misses)
    max_error: float = math.inf  # of the verification run
    wall_s: float = 0.0
    stats: SearchStats | None = None
    measured_p99_us: float | None = None  # set by the hardware evaluator
    space_points: int = 0  # points of the space before the static checks

    @property
    def speedup(self) -> float:
        return self.default_us / self.best_us if self.best_us > 0 else math.inf


PRUNED = "pruned"  # error text prefix of a candidate whose lower bound was above the best latency so far


class CachedCost:
    """The search's batch cost function: cache lookups first, then candidates that cannot beat the best so far
    (lower bound from the schedule, `Space.lower_bound`) are pruned unevaluated, the evaluator runs the rest; all
    in input order. Pruning decisions use the best latency before the batch, so they are deterministic."""

    def __init__(self, job: Job, evaluator: Evaluator, cache: DiskCache | None,
                 bound: Callable[[Point], float] | None = None) -> None:
        self.job, self.evaluator, self.cache, self.bound = job, evaluator, cache, bound
        self.outcomes: dict[str, Outcome] = {}
        self.evaluations = self.pruned = 0
        self.best = math.inf

    def __call__(self, batch: list[Candidate]) -> Iterator[tuple[float, str]]:
        """Yields (cost, error) per candidate in batch order, as soon as each is known (for the progress line).

        Until one candidate has a latency nothing can be pruned, and a random point of a large space can take
        minutes and gigabytes to run (millions of tiny matmuls): so the first batch runs its first candidate (the
        compiler's default) alone, and the rest of the batch is pruned against it."""
        if self.bound and not math.isfinite(self.best) and len(batch) > 1:
            yield from self._batch(batch[:1])
            yield from self._batch(batch[1:])
        else:
            yield from self._batch(batch)

    def _batch(self, batch: list[Candidate]) -> Iterator[tuple[float, str]]:
        keys = [self.cache.key(self.job, c.schedule, self.evaluator.name) if self.cache else "" for c in batch]
        found: list[Outcome | None] = [self.cache.get(k) if self.cache else None for k in keys]
        for i, cand in enumerate(batch):
            if found[i] is None and (low := self._bound(cand)) > self.best:
                found[i] = Outcome(math.inf, error=f"{PRUNED}: lower bound {low:.1f} us > best {self.best:.1f} us")
                self.pruned += 1
        misses = [i for i, o in enumerate(found) if o is None]
        fresh = iter(self.evaluator.evaluate(self.job, [batch[i].schedule for i in misses]) if misses else ())
        self.evaluations += len(misses)
        for i, cand in enumerate(batch):
            outcome = found[i]
            if outcome is None:
                outcome = next(fresh)
                if self.cache:
                    self.cache.put(keys[i], outcome)
            self.outcomes[cand.schedule] = outcome
            self.best = min(self.best, outcome.us)  # pruning of this batch was decided above, before any result
            yield outcome.us, outcome.error

    def _bound(self, cand: Candidate) -> float:
        return self.bound(cand.point) if self.bound else 0.0


def tune(path: str, shapes: dict[str, int] | None = None, budget: int | None = DEFAULT_BUDGET,
         time_s: float | None = None, seed: int = 0, evaluator: Evaluator | None = None, jobs: int | None = None,
         progress: bool | IO[str] = True, cache_dir: str | None = None, use_cache: bool = True,
         target: str = "trn2", space: Space | None = None, nki: str | None = None) -> TuneResult:
    """Tune the schedule of the .tl program at `path` for `shapes`; see the module docstring. `nki`: the NKI API
    the result's kernel is written for ("0.6", the default, or "0.1"); the search does not depend on it."""
    started = time.monotonic()
    job = Job.of(str(path), shapes, target, nki)
    space = space or build_space(job)
    own = evaluator is None
    cache = DiskCache(cache_dir) if use_cache else None
    jobs = jobs or default_jobs()
    evaluator = evaluator or ModelEvaluator(jobs=jobs, kernel_cache=str(cache.dir) if cache else None)
    cost = CachedCost(job, evaluator, cache, space.lower_bound if space.bound else None)
    bar = Progress(budget, stream=sys.stderr if progress is True else (progress or None))
    first = [("default", space.default_point()), *(("expert", p) for p in space.experts)]
    try:
        history, stats = search(space, cost, budget=budget, time_s=time_s, seed=seed, first=first,
                                on_trial=bar.update)
        ranked = rank(job, evaluator, history)
    finally:
        bar.close()
        if own:
            evaluator.close()  # type: ignore[attr-defined]
    return replace(finish(job, cost, history, stats, ranked, started), space_points=space.size())


def default_jobs() -> int:
    """One worker per core this process may use (results do not depend on the count, only the wall time does)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def rank(job: Job, evaluator: Evaluator, history: list[Trial]) -> list[tuple[str, float, float | None]]:
    """(schedule, model µs, measured p99 or None), best first; the hardware evaluator re-ranks its top k."""
    ok = sorted((t for t in history if math.isfinite(t.cost)), key=lambda t: (t.cost, t.index))
    ranked: list[tuple[str, float, float | None]] = [(t.schedule, t.cost, None) for t in ok]
    select = getattr(evaluator, "select", None)
    if select is None or not ranked:
        return ranked
    measured = [(m.schedule, m.model_us, m.p99_us) for m in select(job, [(s, us) for s, us, _ in ranked])
                if math.isfinite(m.p99_us)]
    rest = [r for r in ranked if r[0] not in {m[0] for m in measured}]
    return measured + rest


def finish(job: Job, cost: CachedCost, history: list[Trial], stats: SearchStats,
           ranked: list[tuple[str, float, float | None]], started: float) -> TuneResult:
    if not history:
        raise TilecError("the schedule space has no legal point to evaluate")
    default = history[0] if history[0].origin == "default" else None
    default_out = cost.outcomes.get(default.schedule) if default else None
    if not ranked:
        errors = sorted({t.error for t in history if t.error})
        raise TilecError(f"no candidate schedule compiled and ran ({len(history)} tried)",
                         hint="first errors: " + " | ".join(errors[:3]))
    verdict, (schedule, us, p99) = first_verified(job, ranked, cost.cache)
    outcome = cost.outcomes.get(schedule, Outcome(us))
    return TuneResult(
        best_schedule=schedule, best_us=us, default_us=default_out.us if default_out else math.inf,
        history=tuple(history), verified=verdict.ok, source=verdict.source, best_mfu=outcome.mfu,
        default_mfu=default_out.mfu if default_out else 0.0, evaluations=cost.evaluations,
        max_error=verdict.max_error, wall_s=time.monotonic() - started, stats=stats, measured_p99_us=p99)


def first_verified(job: Job, ranked: list[tuple[str, float, float | None]], cache: DiskCache | None = None):
    """The best candidate that matches the reference; if none of the first few does, the best one, unverified."""
    first: Verdict | None = None
    for candidate in ranked[:VERIFY_TRIES]:
        verdict = cached_verify(job, candidate[0], cache)
        if verdict.ok:
            return verdict, candidate
        first = first or verdict
    return first, ranked[0]


def cached_verify(job: Job, schedule: str, cache: DiskCache | None) -> Verdict:
    """`verify`, with the verdict (and the kernel source it checked) kept in the cache: a re-run runs nothing."""
    key = cache.key(job, schedule, "verify") if cache else ""
    record = cache.get_record(key) if cache else None
    if record is not None and {"ok", "max_error", "message", "source"} <= set(record):
        return Verdict(bool(record["ok"]), float(record["max_error"]), str(record["message"]), str(record["source"]))
    verdict = verify(job, schedule)
    if cache:
        error = verdict.max_error if math.isfinite(verdict.max_error) else "inf"  # inf is not JSON
        cache.put_record(key, {"ok": verdict.ok, "max_error": error, "message": verdict.message,
                               "source": verdict.source})
    return verdict


def summary_text(result: TuneResult) -> str:
    """The final report of a tuning run: default vs tuned latency and MFU, the schedule, how the run went."""
    tried = len(result.history)
    pruned = sum(1 for t in result.history if t.error.startswith(PRUNED))
    failed = sum(1 for t in result.history if not math.isfinite(t.cost)) - pruned
    lines = [
        f"default schedule : {_us(result.default_us)}  MFU {result.default_mfu:6.1%}",
        f"tuned schedule   : {_us(result.best_us)}  MFU {result.best_mfu:6.1%}  ({_gain(result)})",
        f"candidates       : {tried} tried: {result.evaluations} evaluated, "
        f"{tried - result.evaluations - pruned} from the cache, {pruned} pruned (lower bound above the best); "
        f"{failed} failed to compile or run; {result.wall_s:.1f} s",
        f"verified         : {'yes' if result.verified else 'NO'} (max relative error {result.max_error:.2g})",
    ]
    lines.insert(3, f"space            : {coverage(result)}")
    if result.measured_p99_us is not None:
        lines.insert(2, f"measured p99     : {result.measured_p99_us:.1f} us (nki.benchmark)")
    schedule = result.best_schedule.strip() or "(the compiler's default)"
    return "\n".join(lines + ["schedule:"] + ["  " + line for line in schedule.splitlines()])


def coverage(result: TuneResult) -> str:
    """How much of the space the run saw: all of it (then the winner is the space's optimum) or a sample."""
    stats, tried = result.stats, len(result.history)
    if stats and stats.exhaustive:
        return (f"all {stats.legal} legal schedules evaluated (or pruned by their lower bound): "
                f"the tuned schedule is the best of the whole space")
    if stats and stats.legal is not None:
        return f"{tried} of its {stats.legal} legal schedules tried"
    return f"{tried} schedules tried out of {result.space_points} points before the static checks"


def _gain(result: TuneResult) -> str:
    if not math.isfinite(result.default_us):
        return "the default schedule failed"
    if result.best_us >= result.default_us:
        return "1.00x: the default schedule is the best one found"
    return f"{result.speedup:.2f}x, {result.default_us - result.best_us:.1f} us faster than the default"


def _us(value: float) -> str:
    return f"{value:10.1f} us (model)" if math.isfinite(value) else "    failed"
