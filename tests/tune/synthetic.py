"""A synthetic schedule space and cost function with a known optimum, shared by the tuner's unit tests."""
from __future__ import annotations

import math

from tilec.tune.search import Candidate
from tilec.tune.space import Knob, Space

KNOBS = (
    Knob("split conv.y", "split", "conv.y", (None, 1, 2, 4, 8, 16, 32, 64)),
    Knob("split conv.x", "split", "conv.x", (None, 1, 2, 4, 8, 16, 32, 64, 128)),
    Knob("tile conv.k", "tile", "conv.k", (None, 1, 2, 3, 4)),
    Knob("buffers X", "buffers", "X", (None, 1, 2, 3)),
    Knob("reorder conv", "reorder", "conv", (None, ("y", "x"), ("x", "y"))),
)


def too_big(named: dict) -> str | None:
    """Static check: a tile of y*x elements must fit 512 (the moving free limit)."""
    y, x = named["split conv.y"] or 1, named["split conv.x"] or 1
    return f"tile {y}x{x} exceeds 512 elements" if y * x > 512 else None


SPACE = Space(KNOBS, checks=(too_big,))
OPTIMUM = SPACE.point(**{"split conv.y": 8, "split conv.x": 64, "tile conv.k": 3, "buffers X": 2,
                         "reorder conv": ("x", "y")})


def cost_of(point: tuple) -> float:
    """A smooth bowl in log2 tile sizes plus discrete terms; minimum 100 exactly at OPTIMUM."""
    y, x, rows, bufs, order = point
    ly, lx = math.log2(y or 1), math.log2(x or 1)
    c = 100 + 7 * (ly - 3) ** 2 + 5 * (lx - 6) ** 2 + 4 * abs((rows or 1) - 3) + 6 * abs((bufs or 1) - 2)
    return c + (0 if order == ("x", "y") else 9)


class CountingCost:
    """A batch cost function over SPACE that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, batch: list[Candidate]) -> list[tuple[float, str]]:
        self.calls += len(batch)
        return [(cost_of(c.point), "") for c in batch]
