"""Differential fuzzing of tilec: random valid programs x random schedules, compiled, run on the interpreter,
compared with the reference evaluator (and the reference with an independent NumPy formula).

    python -m tilec.testing.fuzz --minutes 10 --jobs 2 --seed 1 [--pairs N] [--out DIR] [--minimize]

Each pair runs in a worker process; a pair that outlives --timeout seconds is a HANG, its worker is killed and
replaced. At the end the counts per class are printed (see tilec.testing.oracle for the classes) and, with --out,
one reproducer per distinct failure (a .tl file with its schedule section; --minimize shrinks it first).
Exit status 1 when any pair found a bug. Same seed, same pairs (the schedule kinds and programs are drawn from
the pair's own seed), whatever the number of jobs.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pathlib
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import wait

from tilec.testing.oracle import BUGS, CLASSES, Verdict

KINDS = (("default", 0.4), ("knobs", 0.35), ("raw", 0.25))


@dataclass(frozen=True)
class Pair:
    index: int
    seed: int  # program seed; the schedule kind and schedule come from it too
    family: str = ""
    kind: str = ""


@dataclass(frozen=True)
class Finding:
    pair: Pair
    verdict: Verdict
    text: str
    schedule: str | None
    seconds: float


def pair_seed(seed: int, index: int) -> int:
    return (seed * 1_000_003 + index) & 0x7FFFFFFF


def schedule_kind(pair_seed_: int) -> str:
    x = random.Random(pair_seed_ ^ 0x5CED).random()
    acc = 0.0
    for kind, p in KINDS:
        acc += p
        if x < acc:
            return kind
    return KINDS[-1][0]


def run_pair(seed: int) -> tuple[str, str, Verdict, str | None]:
    """(family, kind, verdict, schedule) of one pair, in this process."""
    from tilec.testing.gen import generate
    from tilec.testing.oracle import check

    case = generate(seed)
    kind = schedule_kind(seed)
    verdict, schedule = check(case.text, None, case.formula, seed=seed, schedule_kind=kind)
    return case.family, kind, verdict, schedule


def _worker(conn) -> None:
    import warnings

    warnings.simplefilter("ignore")  # the interpreter's partial-write warnings: the comparison reports them
    while True:
        job = conn.recv()
        if job is None:
            return
        start = time.monotonic()
        try:
            family, kind, verdict, schedule = run_pair(job)
        except BaseException as err:  # the oracle itself failed: report, keep the worker
            family, kind, verdict, schedule = "?", "?", Verdict("internal", "oracle", repr(err)[:300]), None
        conn.send((family, kind, verdict, schedule, time.monotonic() - start))


class Pool:
    """K worker processes; a pair running longer than `timeout` gets its worker killed (a HANG)."""

    def __init__(self, jobs: int, timeout: float) -> None:
        self.ctx = mp.get_context("fork")
        self.timeout = timeout
        self.workers: list[list] = [self._spawn() for _ in range(jobs)]  # [process, conn, pair, started]

    def _spawn(self) -> list:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child,), daemon=True)
        proc.start()
        child.close()
        return [proc, parent, None, 0.0]

    def run(self, pairs, deadline: float, on_result) -> None:
        pairs = iter(pairs)
        exhausted = False
        while True:
            for w in self.workers:
                if w[2] is None and not exhausted and time.monotonic() < deadline:
                    nxt = next(pairs, None)
                    if nxt is None:
                        exhausted = True
                        continue
                    w[1].send(nxt.seed)
                    w[2], w[3] = nxt, time.monotonic()
            busy = [w for w in self.workers if w[2] is not None]
            if not busy:
                return
            ready = wait([w[1] for w in busy], timeout=0.5)
            now = time.monotonic()
            for w in busy:
                if w[1] in ready:
                    try:
                        family, kind, verdict, schedule, secs = w[1].recv()
                    except (EOFError, OSError):  # the worker died (killed by the OS: memory)
                        family, kind, verdict, schedule, secs = "?", "?", Verdict("internal", "worker",
                                                                                 "worker process died"), None, 0
                        self._replace(w)
                    on_result(w[2], family, kind, verdict, schedule, secs)
                    w[2] = None
                elif now - w[3] > self.timeout:
                    pair = w[2]
                    self._replace(w)
                    on_result(pair, "?", "?", Verdict("hang", "", f"> {self.timeout:g} s"), None, now - w[3])

    def _replace(self, w: list) -> None:
        w[0].kill()
        w[0].join()
        w[1].close()
        w[:] = self._spawn()

    def close(self) -> None:
        for w in self.workers:
            try:
                w[1].send(None)
            except (BrokenPipeError, OSError):
                pass
            w[0].join(timeout=2)
            if w[0].is_alive():
                w[0].kill()
                w[0].join()


def signature(v: Verdict) -> str:
    """Groups findings: class, stage and the message with numbers and names blurred."""
    msg = re.sub(r"[0-9.e+-]+", "#", v.message)
    msg = re.sub(r"'[^']*'|`[^`]*`", "'_'", msg)
    return f"{v.cls}|{v.stage}|{msg[:80]}"


def reproducer(text: str, schedule: str | None, header: list[str]) -> str:
    """The program with the schedule in its `schedule:` section (replacing one it had), comments on top."""
    body = text.split("\n  schedule:\n")[0].rstrip("\n") + "\n"
    if schedule and schedule.strip():
        body += "  schedule:\n" + "".join(f"    {line.strip()}\n" for line in schedule.splitlines() if line.strip())
    return "".join(f"# {h}\n" for h in header) + body


def campaign(seed: int, minutes: float, jobs: int, pairs: int | None, timeout: float, out: str | None,
             minimize_: bool, quiet: bool = False, findings: list | None = None) -> Counter:
    """Run pairs until `pairs` or the time box; counts per class. `findings` (a list) receives (family, verdict)
    of every bug."""
    from tilec.testing.gen import generate

    counts: Counter = Counter()
    by_family: Counter = Counter()
    first: dict[str, Finding] = {}
    start = time.monotonic()
    deadline = start + minutes * 60 if minutes else float("inf")
    total = pairs if pairs is not None else 10**12

    def on_result(pair: Pair, family, kind, verdict: Verdict, schedule, secs) -> None:
        counts[verdict.cls] += 1
        by_family[(family, verdict.cls)] += 1
        if verdict.bug:
            if findings is not None:
                findings.append((family, verdict))
            sig = signature(verdict)
            if sig not in first:
                case = generate(pair.seed)
                first[sig] = Finding(pair, verdict, case.text, schedule, secs)
                if not quiet:
                    print(f"  pair {pair.index} (seed {pair.seed}, {case.family}, {kind}): {verdict.line()[:200]}",
                          flush=True)
        done = sum(counts.values())
        if not quiet and done % 200 == 0:
            print(f"  {done} pairs, {time.monotonic() - start:.0f} s: {_counts_text(counts)}", flush=True)

    pool = Pool(jobs, timeout)
    try:
        pool.run((Pair(i, pair_seed(seed, i)) for i in range(total)), deadline, on_result)
    finally:
        pool.close()
    wall = time.monotonic() - start
    print(f"fuzz: seed {seed}, {sum(counts.values())} pairs in {wall:.0f} s with {jobs} job(s)")
    print("  " + _counts_text(counts))
    fams = sorted({f for f, _ in by_family})
    for fam in fams:
        print(f"    {fam:<10} " + ", ".join(f"{c} {by_family[(fam, c)]}" for c in CLASSES if by_family[(fam, c)]))
    if first:
        print(f"  {len(first)} distinct failure(s):")
        for sig, f in sorted(first.items()):
            print(f"    seed {f.pair.seed}: {f.verdict.line()[:160]}")
    if out and first:
        write_findings(out, first.values(), minimize_, timeout)
    return counts


def _counts_text(counts: Counter) -> str:
    return ", ".join(f"{c} {counts[c]}" for c in CLASSES if counts[c]) or "nothing run"


def write_findings(out: str, findings, minimize_: bool, timeout: float) -> None:
    from tilec.testing.minimize import minimize

    folder = pathlib.Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for n, f in enumerate(findings, 1):
        text, schedule = f.text, f.schedule
        if minimize_:
            text, schedule = minimize(text, schedule, f.verdict, timeout=timeout)
        header = [f"class: {f.verdict.cls} ({f.verdict.stage})", f"seen: {f.verdict.message[:200]}",
                  f"fuzz seed {f.pair.seed}" + (" (minimised)" if minimize_ else "")]
        path = folder / f"{n:03d}_{f.verdict.cls}.tl"
        path.write_text(reproducer(text, schedule, header))
        print(f"  wrote {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tilec.testing.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=1.0, help="stop starting pairs after this long (0: no limit)")
    p.add_argument("--pairs", type=int, default=None, help="stop after this many pairs")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per pair before it counts as a hang")
    p.add_argument("--out", help="write one reproducer .tl per distinct failure into this folder")
    p.add_argument("--minimize", action="store_true", help="delta-debug each reproducer before writing it")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.jobs < 1 or args.timeout <= 0:
        p.error("--jobs and --timeout must be positive")
    counts = campaign(args.seed, args.minutes, args.jobs, args.pairs, args.timeout, args.out, args.minimize,
                      args.quiet)
    return 1 if any(counts[c] for c in BUGS) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
