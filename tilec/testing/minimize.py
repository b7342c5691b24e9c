"""Delta debugging of a failing pair down to a short reproducer.

    minimize(text, schedule, verdict) -> (text, schedule)

"Still failing" means: the same class and stage as the original verdict (a hang: still over the time limit), with
the pair's own inputs (`seed`: the fuzzer draws every program's inputs from its seed; a regression file records it
in a `# seed: N` line).
Reductions, repeated until none applies (each candidate is checked in a fresh process, so a hang is a hang):
    1. drop schedule directives (halves first, then one at a time);
    2. drop statements (lines of the body, with the block under a loop) that the outputs do not need;
    3. shrink every size in the `default` line (to 1, to half, to minus one);
    4. simplify expressions: a sub-expression in parentheses replaced by one of its operands.
A candidate that no longer loads is simply not kept.
"""
from __future__ import annotations

import multiprocessing as mp
import re

from tilec.testing.oracle import Verdict, check


def _verdict_in_process(text: str, schedule: str | None, timeout: float, seed: int = 0,
                        target: str | None = None) -> Verdict:
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()

    def run(conn) -> None:
        import warnings

        warnings.simplefilter("ignore")
        try:
            conn.send(check(text, schedule, seed=seed, target=target)[0])
        except BaseException as err:
            conn.send(Verdict("internal", "oracle", repr(err)))

    proc = ctx.Process(target=run, args=(child,), daemon=True)
    proc.start()
    child.close()
    try:
        if parent.poll(timeout):
            return parent.recv()
        return Verdict("hang", "", f"> {timeout:g} s")
    except EOFError:
        return Verdict("internal", "worker", "worker process died")
    finally:
        proc.kill()
        proc.join()
        parent.close()


def _same(a: Verdict, b: Verdict) -> bool:
    return a.cls == b.cls and (a.cls == "hang" or a.stage == b.stage)


def minimize(text: str, schedule: str | None, verdict: Verdict, timeout: float = 20.0,
             max_checks: int = 400, seed: int = 0, target: str | None = None) -> tuple[str, str | None]:
    checks = [0]

    def fails(t: str, s: str | None) -> bool:
        if checks[0] >= max_checks:
            return False
        checks[0] += 1
        return _same(_verdict_in_process(t, s, timeout, seed, target), verdict)

    text = text.split("\n  schedule:\n")[0].rstrip("\n") + "\n" if schedule is not None else text
    changed = True
    while changed and checks[0] < max_checks:
        changed = False
        if schedule:
            lines = [ln for ln in schedule.splitlines() if ln.strip()]
            reduced = _ddmin(lines, lambda ls: fails(text, "\n".join(ls) + "\n" if ls else ""))
            if len(reduced) < len(lines):
                schedule, changed = ("\n".join(reduced) + "\n") if reduced else "", True
        for cand in _statement_drops(text) + _size_shrinks(text) + _expr_simplifications(text):
            if fails(cand, schedule):
                text, changed = cand, True
                break
    return text, schedule


def _ddmin(items: list, fails) -> list:
    """Zeller's ddmin over a list: the smallest sublist found that still fails."""
    n = 2
    while len(items) >= 1:
        chunk = max(1, len(items) // n)
        subsets = [items[i:i + chunk] for i in range(0, len(items), chunk)]
        reduced = False
        for i in range(len(subsets)):
            complement = [x for j, s in enumerate(subsets) if j != i for x in s]
            if fails(complement):
                items, n, reduced = complement, max(n - 1, 2), True
                break
        if not reduced:
            if chunk == 1:
                break
            n = min(len(items), n * 2)
        if not items:
            break
    return items


def _statement_drops(text: str) -> list[str]:
    """Candidates without one top-level loop nest (its whole indented block)."""
    lines = text.splitlines()
    out = []
    starts = [i for i, ln in enumerate(lines) if ln.startswith("  for ")]
    for s in starts:
        e = s + 1
        while e < len(lines) and lines[e].startswith("    "):
            e += 1
        out.append("\n".join(lines[:s] + lines[e:]) + "\n")
    return out


def _size_shrinks(text: str) -> list[str]:
    m = re.search(r"^  default (.*)$", text, re.M)
    if not m:
        return []
    pairs = [p.split("=") for p in m.group(1).split(",")]
    out = []
    for i, (name, value) in enumerate(pairs):
        v = int(value)
        for new in sorted({1, v // 2, v - 1} - {v}):
            if new < 1:
                continue
            changed = [f"{n.strip()} = {new if j == i else int(val)}" for j, (n, val) in enumerate(pairs)]
            out.append(text[:m.start(1)] + ", ".join(changed) + text[m.end(1):])
    return out


def _expr_simplifications(text: str) -> list[str]:
    """`(a op b)` -> `a` or `b`, and `f(a)` -> `a`, one occurrence at a time."""
    out = []
    for m in re.finditer(r"\(([^()]+?) [-+*/] ([^()]+?)\)", text):
        for keep in (m.group(1), m.group(2)):
            out.append(text[:m.start()] + keep + text[m.end():])
    for m in re.finditer(r"\b(relu|exp)\(([^()]+)\)", text):
        out.append(text[:m.start()] + m.group(2) + text[m.end():])
    return out
