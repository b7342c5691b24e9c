"""A hardware measurement for whoever has a Trn2: does an engine's write to one part of an SBUF tile wait for another
engine's write to a disjoint part of the same tile? It decides the performance model's on-chip dependence rule
(tilec/perf/deps.py: today a byte box [p0, p1) x [lo, hi) per access, so interleaved strided columns written by two
engines wait for each other, move10's case; docs/notes/fid12.md says why the documentation does not settle it).

    python benchmarks/trn2_sbuf_deps.py                  # here: every kernel on tilec's interpreter, checked against
                                                         # NumPy, and the model's latency
    python benchmarks/trn2_sbuf_deps.py --hardware       # on a trn2 instance with neuronxcc (SDK 2.21-2.26): check
                                                         # each kernel's output, then time it (nki.benchmark)
    python benchmarks/trn2_sbuf_deps.py --hardware --profile DIR
                                                         # also write NEFF + NTFF profiles of interleaved / halves
    python benchmarks/trn2_sbuf_deps.py --nki06 [--hardware]
                                                         # the NKI 0.6 kernels (SDK 2.29+, `import nki`): median
                                                         # wall time of --iters calls (host overhead included):
                                                         # profile with `neuron-explorer capture`
    options: --reps N (default 64) --free F (default 1024: x is (128, 2F) fp32, each region F columns)
             --iters N (default 100) --kernels none,scalar_i,...

The kernels are benchmarks/kernels/sbuf_deps.py (its docstring says what each one writes) and sbuf_deps_nki06.py.
Reading the hardware table: for each kind that runs both engines, the printed overlap

    overlap = (scalar + vector - both) / min(scalar, vector), each less `none`     1: side by side, 0: in turn
    (interleaved against scalar_i and vector_i; halves, tiles and same against scalar_h and vector_h)

    tiles ~1, halves ~1, interleaved ~1   dependences are found per element (access pattern): the model is
                                          pessimistic for interleaved writes; give deps.py a pattern rule for on-chip
                                          accesses (the HBM one, TILEC_MODEL_HBM_DEPS=pattern, is the template)
    tiles ~1, halves ~1, interleaved ~0   per byte range (the model's rule today): keep it
    tiles ~1, halves ~0, interleaved ~0   per tile: the model is optimistic wherever two engines fill disjoint
                                          ranges of one tile (row and column bands); deps.py needs a tile rule
    tiles well below 1                    the engines do not overlap even without sharing (ScalarE and VectorE
                                          contend for something else): repeat with another --free before concluding
    same ~0                               the control: a true dependence serialises

"well below" means by more than the run-to-run spread (run the table twice). The profile (neuron-profile view -n
file.neff -s profile.ntff) shows it directly: in interleaved, does each VectorE instruction wait on a ScalarE
semaphore (and the other way round)?
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import trn2_probe as probe  # noqa: E402

KERNEL_FILE = ROOT / "benchmarks" / "kernels" / "sbuf_deps.py"
KERNEL_FILE06 = ROOT / "benchmarks" / "kernels" / "sbuf_deps_nki06.py"
NAMES = ("none", "scalar_i", "vector_i", "scalar_h", "vector_h", "interleaved", "halves", "tiles", "same")
PAIRS = {"interleaved": ("scalar_i", "vector_i"), "halves": ("scalar_h", "vector_h"),
         "tiles": ("scalar_h", "vector_h"), "same": ("scalar_h", "vector_h")}


def inputs(free: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    x = rng.integers(-64, 64, (128, 2 * free)).astype(np.float32)
    c = rng.integers(-4, 5, (128, 2)).astype(np.float32)
    return x, c


def expected(name: str, x: np.ndarray, c: np.ndarray, reps: int) -> np.ndarray:
    """The NumPy result of kernel `name` (benchmarks/kernels/sbuf_deps.py docstring)."""
    f = x.shape[1] // 2
    out = x.copy()
    a, b = (slice(0, 2 * f, 2), slice(1, 2 * f, 2)) if name in ("scalar_i", "vector_i", "interleaved") else \
        (slice(0, f), slice(f, 2 * f))
    if name == "same":
        b = a
    if name.startswith("scalar") or name in PAIRS:
        out[:, a] += reps * c[:, 0:1]
    if name.startswith("vector") or name in PAIRS:
        out[:, b] += reps * c[:, 1:2]
    return out


def _check(name: str, result: object, args: tuple, reps: int) -> str:
    got, want = np.asarray(result), expected(name, *args, reps)
    return "ok" if got.shape == want.shape and np.array_equal(got, want) else "WRONG"


def overlaps(times: dict[str, float]) -> dict[str, float]:
    """Per kind running both engines: (scalar + vector - both) / min(scalar, vector), each less `none`; 1 side by
    side, 0 one after the other."""
    out = {}
    base = times.get("none", 0.0)
    for both, (sc, vec) in PAIRS.items():
        if {both, sc, vec} <= times.keys():
            s, v, w = (times[k] - base for k in (sc, vec, both))
            out[both] = (s + v - w) / min(s, v) if min(s, v) > 0 else float("nan")
    return out


def run_model(names: list[str], reps: int, free: int, path: pathlib.Path = KERNEL_FILE) -> int:
    """Every kernel on tilec's interpreter (checked against NumPy) and on the model."""
    from tilec.nki.api import load_kernel_file, simulate_traced
    from tilec.perf.api import estimate

    args = inputs(free)
    print(f"tilec's interpreter and model (trn2), x (128, {2 * free}) fp32, regions of {free} columns, {reps} "
          "iterations")
    print(f"{'kernel':<12} {'result':>6} {'model us':>9} {'ScalarE us':>11} {'VectorE us':>11}")
    bad = 0
    times: dict[str, float] = {}
    engine: dict[str, dict[str, float]] = {}
    for name in names:
        kernel = load_kernel_file(path, name, force_interpreter=True)
        sys.modules[kernel.func.__module__].REPS = reps  # the kernel file's global, read when it is traced
        result, trace = simulate_traced(kernel, *args)
        status = _check(name, result, args, reps)
        bad += status != "ok"
        est = estimate(trace)
        times[name] = est.total_us
        engine[name] = {e: est.busy_ns[e] / 1000 for e in ("scalar", "vector")}
        print(f"{name:<12} {status:>6} {times[name]:>9.2f} {engine[name]['scalar']:>11.2f} "
              f"{engine[name]['vector']:>11.2f}")
    ov = overlaps(times)
    if ov:
        print("overlap (model): " + ", ".join(f"{k} {v:.2f}" for k, v in ov.items()))
    return 1 if bad else 0


def run_hardware(names: list[str], reps: int, free: int, iters: int, profile: str | None) -> int:
    """On a Trn2 with the Neuron SDK (NKI 0.1): each kernel's output against NumPy, then its latency."""
    args = inputs(free)
    print(f"Trn2, x (128, {2 * free}) fp32, regions of {free} columns, {reps} iterations, {iters} runs")
    bad, p50 = probe.time_nki01(probe.load_module(KERNEL_FILE, REPS=reps), names, args,
                                lambda name, result: _check(name, result, args, reps), iters, profile,
                                lambda name: name in ("interleaved", "halves"))
    print("overlap (p50): " + ", ".join(f"{k} {v:.2f}" for k, v in overlaps(p50).items()))
    return 1 if bad else 0


def run_hardware06(names: list[str], reps: int, free: int, iters: int) -> int:
    """NKI 0.6 on a Trn2: each kernel's output against NumPy, then the median wall time of `iters` calls."""
    args = inputs(free)
    print(f"Trn2 (NKI 0.6), x (128, {2 * free}) fp32, regions of {free} columns, {reps} iterations, median wall "
          f"time of {iters} calls (host overhead included)")
    bad, median = probe.time_nki06(probe.load_module(KERNEL_FILE06, REPS=reps), names, args,
                                   lambda name, result: _check(name, result, args, reps), iters)
    print("overlap (median): " + ", ".join(f"{k} {v:.2f}" for k, v in overlaps(median).items()))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", action="store_true", help="run on the local Trn2 with the Neuron SDK (not tilec)")
    ap.add_argument("--profile", metavar="DIR", help="with --hardware: also profile interleaved and halves into DIR")
    ap.add_argument("--reps", type=int, default=64)
    ap.add_argument("--free", type=int, default=1024, help="free size of each engine's region")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--kernels", help="comma-separated kernel names (default: all)")
    ap.add_argument("--nki06", action="store_true", help="the NKI 0.6 kernels (sbuf_deps_nki06.py)")
    args = ap.parse_args(argv)
    names = probe.chosen(ap, args.kernels, NAMES)
    if args.hardware:
        if args.nki06:
            return run_hardware06(names, args.reps, args.free, args.iters)
        return run_hardware(names, args.reps, args.free, args.iters, args.profile)
    return run_model(names, args.reps, args.free, KERNEL_FILE06 if args.nki06 else KERNEL_FILE)


if __name__ == "__main__":
    sys.exit(main())
