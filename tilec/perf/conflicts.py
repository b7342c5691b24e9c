"""Engines that must not access one on-chip memory at the same time: the schedule's rule for them.

    instruction on engine e touching memory m:  for every rule (a, b, m) with e in (a, b), the instruction holds the
        rule's key (with `per_bank`: one key per PSUM bank it touches); it starts no earlier than the first gap, in
        the busy intervals the other engine of the rule spent on the same key, long enough to hold it

The rules are the Target's data (tilec.target.Exclusion, each with its source): NeuronCore-v2 serialises VectorE
and GpSimdE on SBUF and VectorE and ScalarE on PSUM (ARCH2: the Neuron compiler enforces it), NeuronCore-v3 only
VectorE and ScalarE on the same PSUM bank (ARCH3; that a collision serialises is inferred). The optional shared-bus
what-if (params.SHARED_BUS "exclusive": a VectorE instruction in performance mode and any GpSimdE instruction) is one
more key of the same kind. Whichever instruction is placed first keeps its time (instructions are placed in program
order), a later one may still use an earlier gap: the hardware's arbitration or the compiler's order between the two
engines is not documented, only that they do not overlap.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Callable, Hashable

from tilec.target import Exclusion
from tilec.trace import Access, Instr

EPS = 1e-6


class Busy:
    """Busy intervals of one engine (appended in time order: the engine runs its instructions in order)."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def fit(self, t: float, d: float) -> float:
        """The earliest start >= t of an interval of length d overlapping none of these."""
        i = bisect_right(self.ends, t + EPS)
        while i < len(self.starts) and self.starts[i] < t + d - EPS:
            t = max(t, self.ends[i])
            i += 1
        return t

    def add(self, s: float, f: float) -> None:
        self.starts.append(s)
        self.ends.append(f)


class Conflicts:
    """The busy intervals each engine spent holding each key; `place` finds an instruction's start."""

    def __init__(self, rules: tuple[Exclusion, ...], banks: Callable[[Access], tuple[Hashable, ...]],
                 bus: Callable[[Instr, str], bool] | None = None) -> None:
        """`banks`: the PSUM banks an access touches (per-bank rules); `bus`: whether an instruction on an engine
        holds the shared VectorE/GpSimdE bus (None: the bus what-if is off)."""
        self.rules = rules
        self.banks = banks
        self.bus = bus
        self.busy: dict[Hashable, dict[str, Busy]] = {}

    def keys(self, ins: Instr, engine: str) -> list[Hashable]:
        out: list[Hashable] = []
        for k, rule in enumerate(self.rules):
            if engine not in rule.engines:
                continue
            touched = [a for a in ins.reads + ins.writes if a.memory == rule.memory]
            if rule.per_bank:
                out.extend(dict.fromkeys((k, bank) for a in touched for bank in self.banks(a)))
            elif touched:
                out.append((k, None))
        if self.bus is not None and self.bus(ins, engine):
            out.append(("bus", None))
        return out

    def place(self, ins: Instr, engine: str, t: float, d: float) -> float:
        """The earliest start >= t at which `ins` (d ns on `engine`) overlaps no other engine's interval on a key it
        holds; records its interval."""
        keys = self.keys(ins, engine)
        if not keys or d <= 0.0:
            return t
        others = [b for key in keys for e, b in self.busy.get(key, {}).items() if e != engine]
        moved = True
        while moved:  # a gap of one key may overlap another's interval: repeat until every key agrees
            moved = False
            for b in others:
                u = b.fit(t, d)
                if u > t:
                    t, moved = u, True
        for key in keys:
            self.busy.setdefault(key, {}).setdefault(engine, Busy()).add(t, t + d)
        return t
