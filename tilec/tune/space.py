"""The schedule space as data: knobs with legal values, static legality checks, and rendering to schedule text.

    Knob   = name, directive kind, target (`conv`, `conv.y`, `X`), legal values (values[0] is the default)
    Point  = one value per knob, in the space's knob order (a hashable tuple)
    Space  = knobs, static checks (point -> reason or None), fixed directives emitted before the knobs

The knob -> directive mapping lives in ONE table, `DIRECTIVES` (kind -> renderer), so the space follows the
compiler's directive set by editing one place. A renderer returns the directive line (or None for "no
directive"); the value None always means "leave it to the compiler". Which knobs a program gets, and their legal
values, is decided in `tilec.tune.knobs`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

Value = object
Point = tuple[Value, ...]


@dataclass(frozen=True)
class Knob:
    name: str  # unique within a space, e.g. "split conv.y"
    kind: str  # key of DIRECTIVES
    target: str  # what the directive names: a stage, `stage.loop` or a buffer
    values: tuple[Value, ...]  # legal values in a stable order; values[0] is the default guess

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"knob {self.name} has no legal values")


def _loop_list(value: Value) -> str:
    assert isinstance(value, tuple)  # a reorder knob's values are tuples of loop names
    return ", ".join(value)


# kind -> render(knob, value) -> directive line or None. This is the one place that speaks the compiler's directive
# syntax (documented in tilec/compiler/schedule.py, applied by tilec/compiler/directives.py): keep it in step.
DIRECTIVES: dict[str, Callable[[Knob, Value], str | None]] = {
    "tile": lambda k, v: f"tile {k.target}, {v}",  # target `op.loop`
    "split": lambda k, v: f"split {k.target}, {v}",
    "reorder": lambda k, v: f"reorder {k.target}, {_loop_list(v)}",  # target `op`, value a tuple of loops
    "partition": lambda k, v: f"partition {k.target}.{v}",
    "compute_at": lambda k, v: f"compute_at {k.target}, {v}",
    "place": lambda k, v: f"place {k.target}, {v}",  # sbuf | hbm
    "hoist": lambda k, v: f"hoist {k.target}, {v}",  # root | op.loop
    "buffers": lambda k, v: f"buffers {k.target}, {v}",
    "unroll": lambda k, v: f"unroll {k.target}" if v else None,  # a bool
    "method": lambda k, v: f"method {k.target}, {v}",  # pe | dma
}

Check = Callable[[dict[str, Value]], "str | None"]  # named knob values -> reason it is illegal, or None


@dataclass(frozen=True)
class Space:
    knobs: tuple[Knob, ...]
    checks: tuple[Check, ...] = ()
    fixed: tuple[str, ...] = ()  # directives every point carries (e.g. ones no knob varies)
    experts: tuple[Point, ...] = ()  # heuristic first guesses, tried right after the default point
    bound: Callable[[dict[str, Value]], float] | None = None  # named values -> lower bound of the latency in µs

    def __post_init__(self) -> None:
        names = [k.name for k in self.knobs]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate knob names in {names}")

    # ---- points -------------------------------------------------------------------------------------------------

    def default_point(self) -> Point:
        return tuple(k.values[0] for k in self.knobs)

    def named(self, point: Point) -> dict[str, Value]:
        return {k.name: v for k, v in zip(self.knobs, point)}

    def point(self, **overrides: Value) -> Point:
        """The default point with some knobs (by name) set; unknown names are an error."""
        named = dict(self.named(self.default_point()))
        unknown = set(overrides) - set(named)
        if unknown:
            raise KeyError(f"no knob named {sorted(unknown)}")
        named.update(overrides)
        return tuple(named[k.name] for k in self.knobs)

    def size(self) -> int:
        n = 1
        for k in self.knobs:
            n *= len(k.values)
        return n

    def random_point(self, rng: random.Random) -> Point:
        return tuple(rng.choice(k.values) for k in self.knobs)

    # ---- legality -----------------------------------------------------------------------------------------------

    def check(self, point: Point) -> str | None:
        """Why `point` is illegal by the cheap static checks, or None. The compiler remains the authority."""
        if len(point) != len(self.knobs):
            return f"point has {len(point)} values, the space has {len(self.knobs)} knobs"
        for knob, value in zip(self.knobs, point):
            if value not in knob.values:
                return f"{knob.name}: {value!r} is not one of the legal values {list(knob.values)}"
        named = self.named(point)
        for check in self.checks:
            reason = check(named)
            if reason:
                return reason
        return None

    def lower_bound(self, point: Point) -> float:
        """A latency no evaluation of `point` can go below (0 when the space has no bound; see bound.py)."""
        return self.bound(self.named(point)) if self.bound else 0.0

    # ---- rendering ----------------------------------------------------------------------------------------------

    def render(self, point: Point) -> str:
        """Schedule text in the compiler's directive syntax, one directive per line, stable order."""
        lines = list(self.fixed)
        for knob, value in zip(self.knobs, point):
            line = None if value is None else DIRECTIVES[knob.kind](knob, value)  # None: leave it to the compiler
            if line is not None:
                lines.append(line)
        return "\n".join(lines) + ("\n" if lines else "")

    def describe(self) -> str:
        rows = [f"{k.name}: {list(k.values)}" for k in self.knobs]
        return "\n".join(rows + [f"({self.size()} points before static checks)"])
