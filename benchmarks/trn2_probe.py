"""What the Trn2 probe scripts share (trn2_hbm_order.py, trn2_shared_bus.py, trn2_sbuf_deps.py): a kernel file loaded
with its size globals set, and the hardware loop that checks each kernel's output against NumPy and then times it,
in either NKI dialect. The probes differ in their kernels, inputs, NumPy results and how they read the times."""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import time
from typing import Callable, Sequence

import numpy as np

Check = Callable[[str, object], str]  # a kernel's name and its result -> "ok" or "WRONG"


def load_module(path: pathlib.Path, **sizes: int) -> object:
    """The kernel file as a module, with its size globals (REPS, BANDS) set: a kernel reads them when it is traced."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, value in sizes.items():
        setattr(module, name, value)
    return module


def chosen(ap: argparse.ArgumentParser, kernels: str | None, known: Sequence[str]) -> list[str]:
    """The kernels `--kernels` names (comma-separated; default: all of `known`), or the parser's usage error."""
    names = kernels.split(",") if kernels else list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"unknown kernels {', '.join(unknown)}; choose from {', '.join(known)}")
    return names


def time_nki01(module: object, names: Sequence[str], args: tuple, check: Check, iters: int,
               profile: str | None = None, profiled: Callable[[str], bool] = lambda name: False,
               width: int = 12) -> tuple[int, dict[str, float]]:
    """NKI 0.1 (neuronxcc, SDK 2.21-2.26) on a Trn2: each kernel's output against NumPy (with NumPy arguments
    nki.jit runs it on the device), then its latency by nki.benchmark; a kernel `profiled` names also gets a NEFF
    and an NTFF profile in profile/NAME. Prints a row per kernel; returns the wrong results' count and the p50s
    (µs)."""
    import neuronxcc.nki as nki

    print(f"{'kernel':<{width}} {'result':>6} {'p50 us':>9} {'p99 us':>9}")
    bad, p50 = 0, {}
    for name in names:
        kernel = getattr(module, name)
        status = check(name, kernel(*args))
        bad += status != "ok"
        bench = nki.benchmark(warmup=10, iters=iters)(kernel)
        bench(*args)
        lat = bench.benchmark_result.nc_latency
        p50[name] = lat.get_latency_percentile(50)
        print(f"{name:<{width}} {status:>6} {p50[name]:>9.1f} {lat.get_latency_percentile(99):>9.1f}", flush=True)
        if profile and profiled(name):
            folder = pathlib.Path(profile).resolve() / name
            folder.mkdir(parents=True, exist_ok=True)
            nki.profile(working_directory=str(folder), save_neff_name="file.neff",
                        save_trace_name="profile.ntff", overwrite=True)(kernel)(*args)
    return bad, p50


def time_nki06(module: object, names: Sequence[str], args: tuple, check: Check, iters: int,
               width: int = 12) -> tuple[int, dict[str, float]]:
    """NKI 0.6 (`import nki`, SDK 2.29+) on a Trn2: each kernel's output against NumPy (with NumPy arguments it is
    compiled and run standalone on the device), then the median wall time of `iters` calls, host overhead included
    (profile with `neuron-explorer capture`). Prints a row per kernel; returns the wrong results' count and the
    medians (µs)."""
    print(f"{'kernel':<{width}} {'result':>6} {'median us':>10}")
    bad, median = 0, {}
    for name in names:
        kernel = getattr(module, name)
        status = check(name, kernel(*args))
        bad += status != "ok"
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            kernel(*args)
            times.append(time.perf_counter() - t0)
        median[name] = 1e6 * float(np.median(times))
        print(f"{name:<{width}} {status:>6} {median[name]:>10.1f}", flush=True)
    return bad, median


def model_nki01(path: pathlib.Path, names: Sequence[str], args: tuple, check: Check, reps: int,
                width: int = 12) -> tuple[int, dict[str, float]]:
    """The same kernels on tilec's interpreter (each output against NumPy) and the trn2 model (trn2_onezero.py,
    trn2_dma_transpose.py): a row per kernel; returns the wrong results' count and the model's µs."""
    from tilec.nki.api import load_kernel_file, simulate_traced
    from tilec.perf.api import estimate

    print(f"{'kernel':<{width}} {'result':>6} {'model us':>9}")
    bad, times = 0, {}
    for name in names:
        kernel = load_kernel_file(path, name, force_interpreter=True)
        sys.modules[kernel.func.__module__].REPS = reps  # the kernel file's global, read when it is traced
        result, trace = simulate_traced(kernel, *args)
        status = check(name, result)
        bad += status != "ok"
        times[name] = estimate(trace, "trn2").total_us
        print(f"{name:<{width}} {status:>6} {times[name]:>9.2f}")
    return bad, times


def per_rep(times: dict[str, float], reps: int) -> dict[str, float]:
    """One repetition's time per kernel: (kernel - none) / reps."""
    base = times.get("none", 0.0)
    return {k: (v - base) / reps for k, v in times.items() if k != "none"}
