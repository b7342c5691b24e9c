"""CI's seeded, time-boxed differential fuzzing run: a few hundred program/schedule pairs (seed fixed, so the same
pairs every run), none of which may give a wrong answer, an internal error, a hang, an error without a location,
or a reference that disagrees with its NumPy formula. Long runs: `python -m tilec.testing.fuzz --minutes N`.
"""
from __future__ import annotations

import os

from tilec.testing.fuzz import campaign

PAIRS = int(os.environ.get("TILEC_FUZZ_PAIRS", "250"))


def test_seeded_fuzz_run_finds_no_bug(capsys):
    findings: list = []
    counts = campaign(seed=20261126, minutes=1.5, jobs=2, pairs=PAIRS, timeout=60, out=None, minimize_=False,
                      quiet=True, findings=findings)
    report = capsys.readouterr().out
    assert sum(counts.values()) >= min(PAIRS, 100), report  # the time box must not starve the run
    assert counts["ok"] > 0, report
    assert not findings, report
