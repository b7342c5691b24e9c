"""Issue 10: "the tuner has no regex over printed IR". The tuner draws its knobs from the compiler's records (the
rules' parameters, tilec/tune/knobs.py and space.py); no module of tilec/tune imports `re` or reads a compiled
kernel's printed stages, so a change to how a stage prints cannot change what the tuner searches."""
from __future__ import annotations

import ast
import pathlib

TUNE = pathlib.Path(__file__).resolve().parents[2] / "tilec" / "tune"


def _modules() -> list[pathlib.Path]:
    found = sorted(TUNE.glob("*.py"))
    assert len(found) > 5
    return found


def test_no_tuner_module_imports_re() -> None:
    imported = [(p.name, a.name) for p in _modules() for n in ast.walk(ast.parse(p.read_text()))
                if isinstance(n, ast.Import) for a in n.names if a.name == "re"]
    imported += [(p.name, n.module) for p in _modules() for n in ast.walk(ast.parse(p.read_text()))
                 if isinstance(n, ast.ImportFrom) and n.module == "re"]
    assert imported == []


def test_no_tuner_module_reads_the_printed_stages() -> None:
    reads = [(p.name, n.lineno) for p in _modules() for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.Attribute) and n.attr == "stages"]
    assert reads == []
