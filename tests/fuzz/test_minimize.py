"""The reproducer minimiser: delta debugging keeps a failure's class and stage while dropping directives,
statements and size."""
from __future__ import annotations

import pytest

from tilec.testing.minimize import _ddmin, minimize
from tilec.testing.oracle import check


def test_ddmin_finds_the_two_items_that_fail_together():
    assert _ddmin(list(range(10)), lambda items: {3, 7} <= set(items)) == [3, 7]


def test_minimize_keeps_the_failing_directive_and_shrinks_the_program():
    text = ("kernel k(A: f32[N, M]) -> Y\n  default N = 64, M = 96\n  T: f32[N, M]\n  Y: f32[N, M]\n"
            "  for i in 0..N, j in 0..M:\n    T[i, j] = A[i, j] * 2.0\n"
            "  for i in 0..N, j in 0..M:\n    Y[i, j] = relu(T[i, j])\n")
    schedule = "tile Y.i, 8\ntile Y.i, 100\ntile Y.i, 16\n"  # 100 > the 48 elements per partition: rejected
    verdict, _ = check(text, schedule)
    assert verdict.cls == "rejected" and verdict.stage == "compile", verdict.line()
    small_text, small_schedule = minimize(text, schedule, verdict, timeout=30)
    assert small_schedule.split("\n")[0] == "tile Y.i, 100"
    assert len(small_text) < len(text)
    again, _ = check(small_text, small_schedule)
    assert (again.cls, again.stage) == ("rejected", "compile"), again.line()


def test_findings_are_written_as_runnable_tl_reproducers(tmp_path):
    from tilec.testing.fuzz import Finding, Pair, write_findings

    text = "kernel k(A: f32[N]) -> Y\n  default N = 96\n  Y: f32[N]\n  for i in 0..N:\n    Y[i] = A[i] + 1.0\n"
    verdict, _ = check(text, "tile Y.i, 5\n")
    write_findings(str(tmp_path), [Finding(Pair(0, 123), verdict, text, "tile Y.i, 5\n", 0.1)], True, 30)
    (path,) = tmp_path.glob("*.tl")
    written = path.read_text()
    assert written.startswith("# class: rejected (compile)") and "  schedule:\n    tile Y.i, 5\n" in written
    again, _ = check(written, None)  # the program's own schedule section reproduces it
    assert (again.cls, again.stage) == ("rejected", "compile"), again.line()


def test_minimize_checks_with_the_pairs_input_seed(monkeypatch):
    """A failure that shows only with the pair's own inputs (seed 1234) is kept: every candidate is checked with
    that seed (the fuzzer draws each program's inputs from its seed; seed-0 inputs may not fail at all)."""
    from tilec.testing import minimize as mod
    from tilec.testing.oracle import Verdict

    def fake_check(text, schedule, formula=None, seed=0, schedule_kind="given", target=None):
        fails = seed == 1234 and "Y[i] = T[i]" in text
        return (Verdict("wrong", "compare", "Y: ...") if fails else Verdict("ok")), schedule

    monkeypatch.setattr(mod, "check", fake_check)  # the candidates run in forked processes: they see it too
    text = ("kernel k(A: f32[N]) -> Y\n  default N = 64\n  T: f32[N]\n  U: f32[N]\n  Y: f32[N]\n"
            "  for i in 0..N:\n    T[i] = A[i] * 2.0\n  for i in 0..N:\n    U[i] = A[i]\n"
            "  for i in 0..N:\n    Y[i] = T[i]\n")
    wrong = Verdict("wrong", "compare", "Y: ...")
    small, _ = minimize(text, None, wrong, timeout=30, seed=1234)
    assert "Y[i] = T[i]" in small and len(small) < len(text)
    assert minimize(text, None, wrong, timeout=30, seed=0)[0] == text  # with seed-0 inputs nothing fails


def test_reproducers_record_the_input_seed_and_the_regression_runner_reads_it(tmp_path):
    from tilec.testing.fuzz import Finding, Pair, input_seed, write_findings

    text = "kernel k(A: f32[N]) -> Y\n  default N = 96\n  Y: f32[N]\n  for i in 0..N:\n    Y[i] = A[i] + 1.0\n"
    verdict, _ = check(text, "tile Y.i, 5\n", seed=13014653)
    write_findings(str(tmp_path), [Finding(Pair(0, 13014653), verdict, text, "tile Y.i, 5\n", 0.1)], False, 30)
    (path,) = tmp_path.glob("*.tl")
    assert "# seed: 13014653 " in path.read_text()
    assert input_seed(path.read_text()) == 13014653
    assert input_seed("# expect: match\nkernel k(A: f32[N]) -> Y\n") == 0


def test_a_hung_pairs_schedule_is_drawn_again_as_the_worker_drew_it():
    """A hang's worker is killed before it reports its schedule: the supervisor draws it again from the pair's seeds
    (campaign 4 of fuzz3: seed 19002218's knobs schedule `tile Y.math, 1` was missing from its reproducer)."""
    from tilec.testing.fuzz import drawn_schedule, pairs_of
    from tilec.testing.gen import generate
    from tilec.testing.oracle import check_prepared, prepare

    for pair in pairs_of(7, 3)[1:]:  # knobs, raw
        text = generate(pair.seed).text
        _, ran = check_prepared(prepare(text, None, pair.seed), None, pair.schedule_seed, pair.kind)
        assert drawn_schedule(text, pair) == ran
    assert drawn_schedule(generate(pairs_of(7, 3)[0].seed).text, pairs_of(7, 3)[0]) is None  # the default


def test_a_stop_while_minimising_writes_every_reproducer_as_found(tmp_path, monkeypatch, capsys):
    """Ctrl-C or SIGTERM during minimisation (a hang's takes minutes) must not lose the findings or print a
    traceback: the interrupted one and the rest are written unminimised."""
    import signal

    from tilec.testing import fuzz, minimize as minimize_module
    from tilec.testing.fuzz import Finding, Pair, write_findings

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    before = signal.getsignal(signal.SIGINT)  # SIG_IGN already when pytest was started in the background (`&`)
    monkeypatch.setattr(minimize_module, "minimize", stopped)
    monkeypatch.setattr(fuzz, "_ignore_stops", lambda: None)  # the test process keeps its own signal handlers
    text = "kernel k(A: f32[N]) -> Y\n  default N = 96\n  Y: f32[N]\n  for i in 0..N:\n    Y[i] = A[i] + 1.0\n"
    verdict, _ = check(text, "tile Y.i, 5\n")
    found = [Finding(Pair(n, 100 + n), verdict, text, "tile Y.i, 5\n", 0.1) for n in range(2)]
    try:
        write_findings(str(tmp_path), found, True, 30)
    except KeyboardInterrupt:
        pytest.fail("the stop escaped write_findings: the report would end in a traceback")
    written = sorted(tmp_path.glob("*.tl"))
    assert len(written) == 2 and all("(minimised)" not in p.read_text() for p in written)
    assert "minimising interrupted" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGINT) == before  # the handlers the process had, not the stop's


def test_a_target_reaches_the_compiler_and_the_reproducer(tmp_path):
    """--target trn1: the program is compiled for trn1 (and run under its rules), the reproducer says so in a
    `# target:` line, and the regression runner reads it back."""
    from tilec.testing.fuzz import Finding, Pair, input_target, write_findings
    from tilec.testing.oracle import Verdict, prepare

    text = "kernel k(A: f32[N]) -> Y\n  default N = 96\n  Y: f32[N]\n  for i in 0..N:\n    Y[i] = A[i] + 1.0\n"
    assert prepare(text, target="trn1").default().result.target.name == "trn1"
    verdict = Verdict("rejected", "compile", "<schedule>:1:1: a tile of 5 ...")
    write_findings(str(tmp_path), [Finding(Pair(0, 7, target="trn1"), verdict, text, "tile Y.i, 5\n", 0.1)], False, 30)
    (path,) = tmp_path.glob("*.tl")
    assert input_target(path.read_text()) == "trn1" and input_target(text) is None
