"""Helpers for the NKI interpreter tests (imported by name: pytest puts this directory on sys.path): loading the
hand-written kernels, locating marked kernel lines, and capturing a rule violation's message."""
from __future__ import annotations

import pathlib

import pytest

import tilec  # noqa: F401  (installs the neuronxcc shim)
from tilec.nki import api
from tilec.errors import KernelError

ROOT = pathlib.Path(__file__).resolve().parents[2]
KERNELS = ROOT / "benchmarks" / "kernels"


def kernel(file: str, name: str) -> object:
    return api.load_kernel_file(KERNELS / file, name)


def line_of(path: str | pathlib.Path, marker: str) -> int:
    """1-based line of the unique source line ending with `marker` (a trailing comment in a test kernel)."""
    lines = pathlib.Path(path).read_text().splitlines()
    hits = [i + 1 for i, text in enumerate(lines) if text.endswith(marker)]
    assert len(hits) == 1, f"marker {marker!r} found {len(hits)} times"
    return hits[0]


def error_of(fn, *args: object, **kwargs: object) -> KernelError:
    with pytest.raises(KernelError) as info:
        api.simulate(fn, *args, **kwargs)
    return info.value


def first_line(err: BaseException) -> str:
    return str(err).splitlines()[0]
