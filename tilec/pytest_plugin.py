"""The pytest plugin (entry point `pytest11: tilec`, loaded by pytest wherever tilec is installed): a user's tests that
import NKI kernel modules (`import neuronxcc.nki as nki`) find tilec's interpreter when the real neuronxcc is absent,
whatever is imported first, with no `import tilec` at the top of each test file.

Where neuronxcc is installed it is used, as everywhere in tilec; `TILEC_NKI=interp` (or `pytest --nki-interp`)
forces the interpreter. Fixtures: `nki_simulate(kernel, *arrays, **kwargs)` runs a kernel on the interpreter and
returns its outputs; `nki_profile(kernel, *arrays, **kwargs)` returns the performance model's estimate
(`.total_us`, `.mfu`, ...).
"""
from __future__ import annotations

from typing import Any, Callable

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("tilec").addoption("--nki-interp", action="store_true",
                                       help="serve `import neuronxcc.nki` from tilec's interpreter even where the "
                                            "real neuronxcc is installed")


def pytest_configure(config: pytest.Config) -> None:
    """Before any test module is collected (imported): install the `neuronxcc` import shim."""
    import tilec  # noqa: F401  (installs the shim and the interpreter's benchmark estimator)
    from tilec.nki import shim

    shim.install(force=True if config.getoption("--nki-interp", default=False) else None)


@pytest.fixture
def nki_simulate() -> Callable[..., Any]:
    from tilec.nki.api import simulate

    return simulate


@pytest.fixture
def nki_profile() -> Callable[..., Any]:
    def run(kernel: Any, *arrays: Any, **kwargs: Any) -> Any:
        from tilec.nki.api import simulate_traced
        from tilec.perf.api import estimate

        _, trace = simulate_traced(kernel, *arrays, numerics=False, **kwargs)
        return estimate(trace, trace.target or "trn2")

    return run
