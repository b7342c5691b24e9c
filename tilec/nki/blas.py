"""Keep numpy's BLAS single-threaded while a kernel runs.

A kernel issues thousands of small matmuls (128 x 128 x <=512); a multi-threaded OpenBLAS spends more time waking
threads than computing, and on a loaded 2-core machine a single small sgemm was measured at 0.08 ms with one thread
and up to 13 ms with the default pool. The thread count is restored when the run ends. Best effort: without a
findable OpenBLAS this does nothing.
"""
from __future__ import annotations

import contextlib
import ctypes

_FUNCS: tuple | None = None


def _find() -> tuple:
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
    except OSError:
        return ()
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for stem in ("scipy_openblas_", "openblas_"):
            for suffix in ("64_", ""):
                get = getattr(lib, f"{stem}get_num_threads{suffix}", None)
                set_ = getattr(lib, f"{stem}set_num_threads{suffix}", None)
                if get is not None and set_ is not None:
                    return (get, set_)
    return ()


@contextlib.contextmanager
def single_thread():
    global _FUNCS
    if _FUNCS is None:
        _FUNCS = _find()
    if not _FUNCS:
        yield
        return
    get, set_ = _FUNCS
    before = get()
    set_(1)
    try:
        yield
    finally:
        set_(before)
