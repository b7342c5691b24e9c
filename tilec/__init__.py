"""tilec: a loop-nest language compiled to NKI kernels, with a CPU interpreter of NKI and a Trainium2 model.

The public API is re-exported here lazily, so `import tilec` stays cheap and the layers keep their one-way imports:

    load / check_file / evaluate ... the language (tilec.lang)
    simulate ....................... run an NKI kernel on the CPU interpreter (tilec.nki)
    simulate_traced ................ the same, with its instruction trace (numerics=False: the trace alone, faster)
    compile_file ................... .tl -> NKI kernel source, IR stages, runnable kernel (tilec.compiler)
    profile ........................ performance model report of a kernel (tilec.perf)
    jit ............................ tilec.jit("prog.tl")(X, W): compiled per input shape and dtype, NumPy or torch
                                     (a callable module: tilec.jit.bundle writes one module for many shapes)
    tune ........................... the schedule-search package: tilec.tune.tune(path, shapes, budget=48)
                                     (a package, not a function: importing tilec.tune.api binds that name to
                                     the package whatever this module says, so it is one thing everywhere)
"""
from __future__ import annotations

import importlib

from tilec.errors import InternalError, Span, TilecError

__version__ = "0.1.0"  # the one place the version is written (pyproject reads it)

# public name -> module that defines it
_API = {
    "load": "tilec.lang.api",
    "check_file": "tilec.lang.api",
    "evaluate": "tilec.lang.api",
    "simulate": "tilec.nki.api",
    "simulate_traced": "tilec.nki.api",
    "compile_file": "tilec.compiler.api",
    "profile": "tilec.perf.api",
}
_PACKAGES = ("lang", "nki", "compiler", "perf", "tune", "jit")

__all__ = ["TilecError", "InternalError", "Span", *_API, *_PACKAGES]


def _install_nki() -> None:
    """NKI interpreter glue (issue 3): serve `import neuronxcc.nki` when the real package is absent, and let
    nki.benchmark ask the performance model for an estimate without tilec.nki importing tilec.perf."""
    from tilec.nki import hooks, shim

    def estimate(trace: object) -> object:
        from tilec.perf.api import estimate as perf_estimate

        return perf_estimate(trace)

    shim.install()
    hooks.set_estimator(estimate)


_install_nki()


def __getattr__(name: str) -> object:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    if name in _PACKAGES:
        return importlib.import_module(f"tilec.{name}")
    raise AttributeError(f"module 'tilec' has no attribute {name!r}")
