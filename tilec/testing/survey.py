"""Refusal survey: the generated programs (tilec.testing.gen) under their default schedules, each compiled, run and
compared (tilec.testing.oracle), the refused ones grouped by message (names, indices and numbers blanked), so the
largest classes of programs users write that tilec still refuses stand out (lead9's script, kept by gaps11-gaps14
outside the repository until gaps14 put it here).

    python -m tilec.testing.survey --start 0 --stop 3000 [--out rows.json] [--timeout 120]

Prints the counts per verdict class, then one line per refusal class with its count and example seeds. A pair
that outlives --timeout seconds counts as a hang. Exit status 1 when any program found a bug (a class of
tilec.testing.oracle.BUGS or a hang)."""
from __future__ import annotations

import argparse
import json
import re
import signal
import sys
from collections import Counter

from tilec.testing import gen, oracle


class _Timeout(BaseException):
    """The alarm: a BaseException, so the oracle's `except Exception` (which makes any other error a verdict) does
    not turn a slow program into an `internal` one."""


def _alarm(*_: object) -> None:
    raise _Timeout()


def survey(start: int, stop: int, timeout: int = 120) -> list[dict]:
    """One row per seed: {seed, cls, stage, msg}."""
    rows = []
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for seed in range(start, stop):
            case = gen.generate(seed)
            signal.alarm(timeout)
            try:
                v, _ = oracle.check(case.text, None, case.formula, seed, "default")
                row = {"seed": seed, "cls": v.cls, "stage": v.stage, "msg": v.message or ""}
            except _Timeout:
                row = {"seed": seed, "cls": "hang", "stage": "", "msg": ""}
            finally:
                signal.alarm(0)
            rows.append(row)
    finally:
        signal.signal(signal.SIGALRM, old)
    return rows


def message_class(msg: str) -> str:
    """A refusal's message without its location, tensor names, index expressions and numbers."""
    m = re.sub(r"^.*?:\d+:\d+: (error: )?", "", msg.splitlines()[0] if msg else "")
    m = re.sub(r"the compiler cannot map `[^`]*` to Trainium engines: ", "", m)
    m = re.sub(r"`[^`]*`", "`_`", m)
    m = re.sub(r"\[[^\]]*\]", "[..]", m)
    return re.sub(r"\d+", "N", m)[:110]


def report(rows: list[dict]) -> str:
    counts = Counter(r["cls"] for r in rows)
    out = [f"{len(rows)} programs: " + ", ".join(f"{c} {n}" for c, n in counts.most_common())]
    groups: Counter = Counter()
    seeds: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        if r["cls"] == "ok":
            continue
        key = (r["cls"], message_class(r["msg"]))
        groups[key] += 1
        seeds.setdefault(key, []).append(r["seed"])
    for (cls, m), n in groups.most_common():
        out.append(f"{n:5d} {cls:9s} {m}  e.g. seeds {seeds[(cls, m)][:8]}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tilec.testing.survey", description=__doc__.splitlines()[0])
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--stop", type=int, default=1500)
    ap.add_argument("--timeout", type=int, default=120, help="seconds per program before it counts as a hang")
    ap.add_argument("--out", help="write the rows as JSON")
    a = ap.parse_args(argv)
    rows = survey(a.start, a.stop, a.timeout)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f)
    print(report(rows))
    return 1 if any(r["cls"] in oracle.BUGS or r["cls"] == "hang" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
