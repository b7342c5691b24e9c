"""Differential fuzzing of tilec: random valid programs x random schedules, compiled, run on the interpreter,
compared with the reference evaluator (and the reference with an independent NumPy formula).

    python -m tilec.testing.fuzz --minutes 10 --jobs 2 --seed 1 [--pairs N] [--out DIR] [--minimize] [--target trn1]

Each program is tried with SCHEDULES schedules (the default one, a point of the tuner's space, raw directives:
three pairs), in one worker process that loads it, draws its inputs and evaluates the reference once for all three
and compiles the default schedule once (the tuner's space starts from it). A pair that outlives --timeout seconds
is a HANG, its worker is killed and replaced (the program's remaining pairs are skipped). The time is the
worker's CPU time where the OS reports it (Linux /proc), so a pair starved by other processes on a shared machine
is not a hang; a pair also counts as one after WALL_FACTOR times the timeout of wall time. At the end the counts per class are printed (see tilec.testing.oracle for the classes) and, with --out,
one reproducer per distinct failure (a .tl file with its schedule section; --minimize shrinks it first).
Exit status 1 when any pair found a bug. Same seed, same pairs (the schedule kinds and programs are drawn from
the pair's own seed), whatever the number of jobs. --target compiles every pair for that generation and runs it
under that generation's rules (a reproducer records it in a `# target:` line).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pathlib
import re
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import wait

from tilec.target import TARGETS
from tilec.testing.oracle import BUGS, CLASSES, Verdict

KINDS = ("default", "knobs", "raw")  # the schedules tried on every program, in this order
SCHEDULES = len(KINDS)


@dataclass(frozen=True)
class Pair:
    index: int
    seed: int  # program seed
    family: str = ""
    kind: str = ""  # schedule kind (KINDS)
    schedule_seed: int = 0  # draws the schedule (and whether it goes inside the program)
    target: str | None = None  # the generation compiled for (None: the default)


@dataclass(frozen=True)
class Finding:
    pair: Pair
    verdict: Verdict
    text: str
    schedule: str | None
    seconds: float


WALL_FACTOR = 10


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (None where /proc is not available)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pair_seed(seed: int, index: int) -> int:
    return (seed * 1_000_003 + index) & 0x7FFFFFFF


def pairs_of(seed: int, program: int, target: str | None = None) -> list[Pair]:
    """The pairs of the campaign's `program`-th program: one per schedule kind, numbered consecutively."""
    pseed = pair_seed(seed, program)
    return [Pair(program * SCHEDULES + n, pseed, kind=kind, schedule_seed=pair_seed(pseed, n + 1), target=target)
            for n, kind in enumerate(KINDS)]


def run_pairs(pairs: list[Pair]):
    """(family, kind, verdict, schedule) of each pair of one program, in this process, as each finishes."""
    from tilec.testing.gen import generate
    from tilec.testing.oracle import check_prepared, prepare

    case = generate(pairs[0].seed)
    prep = prepare(case.text, case.formula, pairs[0].seed, pairs[0].target)
    label = case.family + "".join(f"/{form}" for form in case.forms)  # counted apart: e.g. conv/padded
    for pair in pairs:
        verdict, schedule = check_prepared(prep, None, pair.schedule_seed, pair.kind)
        yield label, pair.kind, verdict, schedule


def _worker(conn) -> None:
    import warnings

    warnings.simplefilter("ignore")  # the interpreter's partial-write warnings: the comparison reports them
    _ignore_stops()  # Ctrl-C reaches the whole process group: the parent reports and stops the workers
    while True:
        job = conn.recv()
        if job is None:
            return
        start, left = time.monotonic(), len(job)
        try:
            for family, kind, verdict, schedule in run_pairs(job):
                left -= 1
                conn.send((family, kind, verdict, schedule, time.monotonic() - start, left == 0))
                start = time.monotonic()
        except BaseException as err:  # the oracle itself failed: report (the program's other pairs are skipped)
            conn.send(("?", "?", Verdict("internal", "oracle", repr(err)[:300]), None, time.monotonic() - start, True))


class Pool:
    """K worker processes; a pair running longer than `timeout` gets its worker killed (a HANG)."""

    def __init__(self, jobs: int, timeout: float) -> None:
        self.ctx = mp.get_context("fork")
        self.timeout = timeout
        # [process, conn, pending pairs, started (wall), CPU seconds at the start]
        self.workers: list[list] = [self._spawn() for _ in range(jobs)]

    def _spawn(self) -> list:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child,), daemon=True)
        proc.start()
        child.close()
        return [proc, parent, None, 0.0, 0.0]

    def run(self, programs, deadline: float, on_result) -> None:
        """`programs`: lists of pairs of one program each; on_result(pair, family, kind, verdict, schedule, secs)."""
        programs = iter(programs)
        exhausted = False
        while True:
            for w in self.workers:
                if w[2] is None and not exhausted and time.monotonic() < deadline:
                    nxt = next(programs, None)
                    if nxt is None:
                        exhausted = True
                        continue
                    w[1].send(nxt)
                    w[2], w[3], w[4] = list(nxt), time.monotonic(), cpu_seconds(w[0].pid) or 0.0
            busy = [w for w in self.workers if w[2] is not None]
            if not busy:
                return
            ready = wait([w[1] for w in busy], timeout=0.5)
            now = time.monotonic()
            for w in busy:
                if w[1] in ready:
                    pair = w[2][0]
                    try:
                        family, kind, verdict, schedule, secs, last = w[1].recv()
                    except (EOFError, OSError):  # the worker died (killed by the OS: memory); the rest is skipped
                        family, kind, verdict, schedule, secs, last = "?", pair.kind, Verdict(
                            "internal", "worker", "worker process died"), None, 0, True
                        self._replace(w)
                    on_result(pair, family, kind, verdict, schedule, secs)
                    w[2], w[3], w[4] = (None if last else w[2][1:]), now, cpu_seconds(w[0].pid) or 0.0
                elif self._overdue(w, now):
                    pair = w[2][0]
                    self._replace(w)
                    on_result(pair, "?", pair.kind, Verdict("hang", "", f"> {self.timeout:g} s"), None, now - w[3])

    def _overdue(self, w: list, now: float) -> bool:
        cpu = cpu_seconds(w[0].pid)
        used = now - w[3] if cpu is None else cpu - w[4]
        return used > self.timeout or now - w[3] > WALL_FACTOR * self.timeout

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


def drawn_schedule(text: str, pair: Pair) -> str | None:
    """The schedule a pair ran with, drawn again from its seed as the worker drew it (for a hang: the worker was
    killed before it could report it); None for the default schedule or when it cannot be drawn here."""
    import random

    from tilec.testing.oracle import knob_schedule, prepare, raw_schedule

    prep = prepare(text, None, pair.seed, pair.target)
    if prep.verdict is not None or pair.kind not in ("knobs", "raw"):
        return None
    rng = random.Random(pair.schedule_seed)
    try:
        return knob_schedule(prep.default(), rng) if pair.kind == "knobs" else raw_schedule(prep.program, rng)
    except Exception:
        return None


def input_seed(text: str) -> int:
    """The `# seed: N` line among a reproducer's comments on top (the seed of the inputs its pair ran with), else 0."""
    value = _header(text, "seed")
    return int(value) if value is not None else 0


def input_target(text: str) -> str | None:
    """The `# target: NAME` line among a reproducer's comments on top (the generation it ran for), else None."""
    return _header(text, "target")


def _header(text: str, key: str) -> str | None:
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if line.startswith(f"# {key}:"):
            return line.split()[2]
    return None


def campaign(seed: int, minutes: float, jobs: int, pairs: int | None, timeout: float, out: str | None,
             minimize_: bool, quiet: bool = False, findings: list | None = None, target: str | None = None) -> Counter:
    """Run pairs until `pairs` or the time box; counts per class. `findings` (a list) receives (family, verdict)
    of every bug."""
    from tilec.testing.gen import generate

    counts: Counter = Counter()
    by_family: Counter = Counter()
    first: dict[str, Finding] = {}
    start = time.monotonic()
    deadline = start + minutes * 60 if minutes else float("inf")
    total = -(-pairs // SCHEDULES) if pairs is not None else 10**12  # programs

    def on_result(pair: Pair, family, kind, verdict: Verdict, schedule, secs) -> None:
        counts[verdict.cls] += 1
        by_family[(family, verdict.cls)] += 1
        if verdict.bug:
            if findings is not None:
                findings.append((family, verdict))
            sig = signature(verdict)
            if not quiet and sig in first:  # every bug pair is listed (a signature may hide another class)
                print(f"  pair {pair.index} (seed {pair.seed}, {family}, {kind}): {verdict.line()[:200]}", flush=True)
            if sig not in first:
                case = generate(pair.seed)
                if verdict.cls == "hang" and schedule is None:  # the killed worker could not report it
                    schedule = drawn_schedule(case.text, pair)
                first[sig] = Finding(pair, verdict, case.text, schedule, secs)
                if not quiet:
                    print(f"  pair {pair.index} (seed {pair.seed}, {case.family}, {kind}): {verdict.line()[:200]}",
                          flush=True)
        done = sum(counts.values())
        if not quiet and done % 200 == 0:
            print(f"  {done} pairs, {time.monotonic() - start:.0f} s: {_counts_text(counts)}", flush=True)

    pool = Pool(jobs, timeout)
    interrupted = False
    try:
        pool.run((pairs_of(seed, i, target) for i in range(total)), deadline, on_result)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (a `timeout` around a long run): report what ran
        interrupted = True
        _ignore_stops()  # a second signal must not cut the report short
    finally:
        pool.close()
    wall = time.monotonic() - start
    print(f"fuzz: seed {seed}{f' ({target})' if target else ''}, {sum(counts.values())} pairs in {wall:.0f} s with {jobs} job(s)"
          + (" (interrupted)" if interrupted else ""), flush=True)
    print("  " + _counts_text(counts))
    fams = sorted({f for f, _ in by_family})
    for fam in fams:
        print(f"    {fam:<30} " + ", ".join(f"{c} {by_family[(fam, c)]}" for c in CLASSES if by_family[(fam, c)]))
    if first:
        print(f"  {len(first)} distinct failure(s):")
        for sig, f in sorted(first.items()):
            print(f"    seed {f.pair.seed}: {f.verdict.line()[:160]}")
    if out and first:
        write_findings(out, first.values(), minimize_ and not interrupted, timeout)
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
            try:
                text, schedule = minimize(text, schedule, f.verdict, timeout=timeout, seed=f.pair.seed,
                                          target=f.pair.target)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM while minimising (a hang takes minutes): write the rest as found
                _ignore_stops()
                minimize_ = False
                print("  minimising interrupted: this and the remaining reproducers are written as found", flush=True)
        header = [f"class: {f.verdict.cls} ({f.verdict.stage})", f"seen: {f.verdict.message[:200]}",
                  f"fuzz seed {f.pair.seed}" + (" (minimised)" if minimize_ else ""),
                  f"seed: {f.pair.seed}  (the inputs: tilec.lang.api.random_inputs(program, seed))"]
        header += [f"target: {f.pair.target}"] if f.pair.target else []
        path = folder / f"{n:03d}_{f.verdict.cls}.tl"
        path.write_text(reproducer(text, schedule, header))
        print(f"  wrote {path}")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _ignore_stops() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tilec.testing.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=1.0, help="stop starting pairs after this long (0: no limit)")
    p.add_argument("--pairs", type=int, default=None, help="stop after this many pairs")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0, help="CPU seconds per pair before it counts as a hang (wall: 10x)")
    p.add_argument("--out", help="write one reproducer .tl per distinct failure into this folder")
    p.add_argument("--minimize", action="store_true", help="delta-debug each reproducer before writing it")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--target", default=None, help="compile for and run under this generation (default: trn2)")
    args = p.parse_args(argv)
    if args.jobs < 1 or args.timeout <= 0:
        p.error("--jobs and --timeout must be positive")
    signal.signal(signal.SIGTERM, _interrupt)
    if args.target is not None and args.target not in TARGETS:
        p.error(f"--target must be one of {', '.join(TARGETS)}")
    counts = campaign(args.seed, args.minutes, args.jobs, args.pairs, args.timeout, args.out, args.minimize,
                      args.quiet, target=args.target)
    return 1 if any(counts[c] for c in BUGS) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
