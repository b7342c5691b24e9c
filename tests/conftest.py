"""Shared test fixtures: golden files compared byte for byte, refreshed with `pytest --update-golden`."""
from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files from current output")


class Golden:
    """`golden.check("lang/errors/bad_arity.txt", text)` compares text with tests/golden/<name>."""

    def __init__(self, update: bool) -> None:
        self.update = update

    def check(self, name: str, text: str) -> None:
        path = ROOT / "tests" / "golden" / name
        if self.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        if not path.exists():
            pytest.fail(f"golden file {path} is missing; run pytest --update-golden and review the diff")
        expected = path.read_text()
        assert text == expected, f"output differs from golden {path} (pytest --update-golden to refresh)"


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Golden:
    return Golden(request.config.getoption("--update-golden"))
