"""audit15: issue 10's readability clause asks for "named tile constants used in shapes and trip counts". Over
generated/ (both NKI forms) today: 289 allocation shapes and 110 loops, not one shape nor one trip count names a
constant (`nl.ndarray((128, 512), ...)`, `for t in range(8):  # ... (tiles of TILE_F)` where TILE_F = 512); the
constants appear in slices only. The clause's spec, as a strict xfail until the named-ints work lands (named10.md)."""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
GENERATED = sorted((ROOT / "generated").rglob("*.py"))


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def uses(path: pathlib.Path) -> tuple[set[str], int, int, int, int]:
    """(module-level constants, allocations, allocations whose shape names one, loops, loops whose trip count does)"""
    tree = ast.parse(path.read_text())
    consts = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    shapes = named_shapes = loops = named_loops = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "ndarray" \
                and node.args:
            shapes += 1
            named_shapes += bool(_names(node.args[0]) & consts)
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and node.iter.args:
            loops += 1
            named_loops += bool(_names(node.iter.args[0]) & consts)
    return consts, shapes, named_shapes, loops, named_loops


def test_the_scan_sees_the_kernels() -> None:
    totals = [uses(p) for p in GENERATED]
    assert len(GENERATED) >= 20
    assert sum(t[1] for t in totals) > 200 and sum(t[3] for t in totals) > 80


@pytest.mark.xfail(strict=True, reason="tile constants appear in slices only; shapes and trip counts are numbers")
def test_kernels_with_tile_constants_use_them_in_shapes_and_trip_counts() -> None:
    missing = []
    for path in GENERATED:
        consts, shapes, named_shapes, loops, named_loops = uses(path)
        if consts and (named_shapes == 0 or named_loops == 0):
            missing.append(f"{path.relative_to(ROOT)}: {named_shapes}/{shapes} shapes, {named_loops}/{loops} loops")
    assert missing == []
