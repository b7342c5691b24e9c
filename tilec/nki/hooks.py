"""Hooks set by tilec's API glue, so the interpreter can use the performance model without importing it.

`tilec/__init__.py` registers `estimator(trace) -> Estimate`; `nki.benchmark` asks for it and, when absent, says
that no timing is available instead of inventing numbers.
"""
from __future__ import annotations

from typing import Callable

_estimator: Callable | None = None


def set_estimator(fn: Callable | None) -> None:
    global _estimator
    _estimator = fn


def estimator() -> Callable | None:
    return _estimator
