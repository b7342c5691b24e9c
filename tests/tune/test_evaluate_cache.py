"""The on-disk cache (a re-run evaluates nothing), parallel evaluation order, the hardware evaluator's ranking."""
from __future__ import annotations

import math
import time

import pytest

from synthetic import SPACE, cost_of
from tilec.errors import TilecError
from tilec.tune.api import CachedCost
from tilec.tune.cache import DiskCache, model_version
from tilec.tune.evaluate import HardwareEvaluator, Job, ModelEvaluator, Outcome
from tilec.tune.search import search

JOB = Job("prog.tl", "kernel k(...)", (("C", 128), ("H", 8)), "trn2")


class FakeModel:
    """An evaluator whose latency is the synthetic cost of the schedule's point; counts what it evaluates."""

    name = "fake-model"

    def __init__(self) -> None:
        self.evaluated: list[str] = []
        self.by_text = {}

    def evaluate(self, job, schedules):
        self.evaluated += schedules
        return [Outcome(self.by_text[s], mfu=0.5) if s in self.by_text else Outcome(math.inf, error="unknown")
                for s in schedules]


def text_costs() -> dict[str, float]:
    import itertools
    table = {}
    for point in itertools.product(*(k.values for k in SPACE.knobs)):
        if SPACE.check(point) is None:
            table[SPACE.render(point)] = cost_of(point)
    return table


def test_rerun_with_the_cache_evaluates_nothing_and_repeats_the_history(tmp_path):
    costs = text_costs()
    runs = []
    for _ in range(2):
        model = FakeModel()
        model.by_text = costs
        cost = CachedCost(JOB, model, DiskCache(tmp_path, version="v1"))
        history, _ = search(SPACE, cost, budget=24, seed=5)
        runs.append((history, model, cost))
    (h1, m1, c1), (h2, m2, c2) = runs
    assert c1.evaluations == 24 and len(m1.evaluated) == 24
    assert c2.evaluations == 0 and m2.evaluated == []
    assert [(t.schedule, t.cost) for t in h1] == [(t.schedule, t.cost) for t in h2]
    assert c2.outcomes[h2[0].schedule].mfu == 0.5


def test_cache_key_covers_program_shapes_schedule_target_evaluator_and_model(tmp_path):
    cache = DiskCache(tmp_path, version="v1")
    base = cache.key(JOB, "split conv.y, 2\n", "model")
    variants = [
        cache.key(Job(JOB.path, JOB.program_text + " ", JOB.shapes, JOB.target), "split conv.y, 2\n", "model"),
        cache.key(Job(JOB.path, JOB.program_text, (("C", 256), ("H", 8)), JOB.target), "split conv.y, 2\n", "model"),
        cache.key(Job(JOB.path, JOB.program_text, JOB.shapes, "trn1"), "split conv.y, 2\n", "model"),
        cache.key(JOB, "split conv.y, 4\n", "model"),
        cache.key(JOB, "split conv.y, 2\n", "hardware"),
        DiskCache(tmp_path, version="v2").key(JOB, "split conv.y, 2\n", "model"),
    ]
    assert base not in variants and len(set(variants)) == len(variants)
    assert len(model_version()) == 16 and model_version() == model_version()


def test_cache_round_trips_failures_and_ignores_torn_files(tmp_path):
    cache = DiskCache(tmp_path, version="v1")
    cache.put("ab12", Outcome(math.inf, error="tile of 256 on the partition dimension exceeds 128"))
    cache.put("cd34", Outcome(812.5, mfu=0.91))
    assert cache.get("ab12") == Outcome(math.inf, 0.0, "tile of 256 on the partition dimension exceeds 128")
    assert cache.get("cd34") == Outcome(812.5, 0.91, "")
    (tmp_path / "ef").mkdir()
    (tmp_path / "ef" / "ef56.json").write_text('{"us": 1')
    assert cache.get("ef56") is None and cache.get("0000") is None


def slow_outcome(job: Job, schedule: str) -> Outcome:
    """Finishes in reverse order of submission, so an order-keeping pool must reorder."""
    n = int(schedule)
    time.sleep(0.05 * (4 - n))
    return Outcome(float(n * 10), error=job.target)


def text_outcome(job: Job, schedule: str) -> Outcome:
    """A deterministic latency from the schedule text alone (for comparing serial and parallel searches)."""
    return Outcome(float(sum(map(ord, schedule)) % 97 + len(schedule)))


def test_parallel_evaluation_keeps_input_order_and_search_results():
    model = ModelEvaluator(jobs=2, outcome=slow_outcome)
    try:
        got = list(model.evaluate(JOB, ["0", "1", "2", "3"]))
        model.outcome = text_outcome
        parallel, _ = search(SPACE, CachedCost(JOB, model, None), budget=20, seed=9)
    finally:
        model.close()
    assert [o.us for o in got] == [0.0, 10.0, 20.0, 30.0] and {o.error for o in got} == {"trn2"}
    serial, _ = search(SPACE, CachedCost(JOB, ModelEvaluator(jobs=1, outcome=text_outcome), None), budget=20, seed=9)
    assert [(t.schedule, t.cost) for t in parallel] == [(t.schedule, t.cost) for t in serial]


def test_hardware_evaluator_reranks_the_model_top_k_by_measured_p99():
    measured = {"a": 900.0, "b": 700.0, "c": 800.0, "d": 100.0}
    calls = []

    def bench(job, schedule):
        calls.append(schedule)
        if schedule == "c":
            raise RuntimeError("neuron-bench: device busy")
        return measured[schedule]

    hw = HardwareEvaluator(top_k=3, benchmark=bench, screen=FakeModel())
    ranked = [("a", 500.0), ("a", 500.0), ("x", math.inf), ("b", 510.0), ("c", 520.0), ("d", 530.0)]
    out = hw.select(JOB, ranked)
    assert calls == ["a", "b", "c"]  # the top 3 distinct finite candidates; d is never measured
    assert [(m.schedule, m.p99_us) for m in out] == [("b", 700.0), ("a", 900.0), ("c", math.inf)]
    assert "device busy" in out[-1].error


def test_hardware_evaluator_breaks_measurement_ties_by_model_latency():
    hw = HardwareEvaluator(top_k=5, benchmark=lambda job, s: 50.0, screen=FakeModel())
    out = hw.select(JOB, [("p", 3.0), ("q", 1.0), ("r", 2.0)])
    assert [m.schedule for m in out] == ["q", "r", "p"]


def test_hardware_evaluator_without_neuronxcc_says_what_to_do():
    with pytest.raises(TilecError, match="needs AWS neuronxcc"):
        HardwareEvaluator()


class _Stream:
    def __init__(self, tty: bool) -> None:
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_progress_redraws_on_a_terminal_and_logs_only_improvements_elsewhere():
    from tilec.tune.progress import Progress
    from tilec.tune.search import Trial, best_of
    costs = [50.0, 60.0, 40.0, 45.0]
    for tty in (True, False):
        stream = _Stream(tty)
        bar, history = Progress(len(costs), stream), []
        for i, c in enumerate(costs):
            history.append(Trial(i, "default" if i == 0 else "random", (), f"s{i}", c))
            bar.update(history[-1], best_of(history))
        bar.close()
        if tty:
            redraws = stream.text.split("\r")  # tqdm redraws the line in place after each trial
            assert len(redraws) >= 5 and stream.text.endswith("\n") and "4/4  best 40.0 us" in redraws[-1]
        else:
            lines = stream.text.splitlines()  # the first result, the improvement to 40, the end
            assert "\r" not in stream.text and len(lines) == 3
            assert "1/4  best 50.0 us" in lines[0] and "3/4  best 40.0 us" in lines[1] and "4/4" in lines[2]
