"""The latency lower bound: below the model's latency on real kernels, and pruning that never drops a winner."""
from __future__ import annotations

import dataclasses
import math
import pathlib
import random

from synthetic import OPTIMUM, SPACE, cost_of
from test_evaluate_cache import JOB, FakeModel, text_costs
from tilec.tune.api import PRUNED, CachedCost
from tilec.tune.bound import startup_us
from tilec.tune.evaluate import Job, model_outcome
from tilec.tune.knobs import build_space
from tilec.tune.search import search

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def test_bound_is_below_the_model_latency_of_real_conv_and_matmul_kernels():
    cases = [("conv_bias_maxpool.tl", dict(N=1, C=128, K=128, H=10, W=34)), ("matmul.tl", dict(M=128, K=256, N=512))]
    for program, shapes in cases:
        job = Job.of(str(EXAMPLES / program), shapes)
        space = build_space(job)
        rng = random.Random(3)
        points = [space.default_point()] + [p for p in (space.random_point(rng) for _ in range(60))
                                            if space.check(p) is None][:3]
        for point in points:
            outcome = model_outcome(job, space.render(point))
            low = space.lower_bound(point)
            assert outcome.ok, outcome.error
            # a bound is useful only if it sees the matmuls: well above the start-up alone
            assert startup_us(job.target) < low <= outcome.us, (program, space.render(point), low, outcome.us)


def test_pruning_skips_hopeless_candidates_and_never_drops_a_winner(tmp_path):
    costs = text_costs()
    slack = 3.0  # the bound sits this far below the true cost
    space = dataclasses.replace(SPACE, bound=lambda named: cost_of(tuple(named.values())) - slack)
    runs = []
    for _ in range(2):
        model = FakeModel()
        model.by_text = costs
        cost = CachedCost(JOB, model, None, space.lower_bound)
        history, _ = search(space, cost, budget=40, seed=7)
        runs.append((history, model, cost))
    (history, model, cost), (again, _, _) = runs
    pruned = [t for t in history if t.error.startswith(PRUNED)]
    assert pruned and cost.pruned == len(pruned)
    assert cost.evaluations == len(model.evaluated) == len(history) - len(pruned)
    assert not {t.schedule for t in pruned} & set(model.evaluated)  # pruned means never run
    best = min(t.cost for t in history)
    for trial in pruned:
        before = min([math.inf] + [u.cost for u in history[:trial.index]])
        assert costs[trial.schedule] - slack > before >= best  # its true cost could not have beaten the best
    assert [(t.schedule, t.cost, t.error) for t in again] == [(t.schedule, t.cost, t.error) for t in history]


def test_the_first_batch_runs_the_default_alone_and_prunes_the_rest_against_it():
    costs = text_costs()
    space = dataclasses.replace(SPACE, bound=lambda named: cost_of(tuple(named.values())) - 1.0)
    calls: list[list[str]] = []

    class Recording(FakeModel):
        def evaluate(self, job, schedules):
            calls.append(list(schedules))
            return super().evaluate(job, schedules)

    model = Recording()
    model.by_text = costs
    default = OPTIMUM  # a good default: random points of the first batch are far worse
    history, _ = search(space, CachedCost(JOB, model, None, space.lower_bound), budget=12, seed=5,
                        first=[("default", default)])
    assert calls[0] == [space.render(default)]  # alone: nothing is known to prune against before it
    first_batch = history[1:8]  # the rest of the first batch of 8
    pruned = [t for t in first_batch if t.error.startswith(PRUNED)]
    assert pruned, "random points far worse than the default are pruned in the first batch already"
    assert all(costs[t.schedule] - 1.0 > history[0].cost for t in pruned)
