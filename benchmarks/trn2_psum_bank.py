"""A hardware measurement for whoever has a Trn2: do VectorE and ScalarE reading one PSUM bank at the same time run
side by side, or one after the other (ARCH3: full bandwidth in parallel "as long as their accesses do not collide on
the same PSUM bank")? It decides the trn2 record of tilec/target.py (NC_V3_EXCLUSIONS: serialised today, an
inference; TILEC_MODEL_ENGINE_ACCESS=off is the model without it; docs/notes/fid20.md).

    python benchmarks/trn2_psum_bank.py                  # here: every kernel on tilec's interpreter, checked against
                                                         # NumPy, and the model (trn2 serial / off, trn1)
    python benchmarks/trn2_psum_bank.py --hardware       # on a trn2 instance with neuronxcc (SDK 2.21-2.26): check
                                                         # each kernel's output, then time it
    python benchmarks/trn2_psum_bank.py --hardware --profile DIR   # also NEFF + NTFF profiles of same / apart
    options: --reps N (default 64) --free F (fp32 elements per partition, <= 512: one bank; default 512)
             --iters N (default 100) --kernels none,vector,...

The kernels are benchmarks/kernels/psum_bank.py (its docstring says what each one does). Reading the hardware
table: subtract `none` from every row, then for each pair (same: vector + scalar on one bank, apart: on two banks)

    overlap = (vector + scalar - pair) / min(vector, scalar)      1: side by side, 0: one after the other

    apart ~1, same ~0            a collision serialises: keep NC_V3_EXCLUSIONS as it is
    apart ~1, same ~1            no cost to speak of: drop the trn2 record (trn2's `exclusions=()`)
    apart ~1, same in between    they share the bank's bandwidth: the model needs a sharing rule instead
    apart well below 1           VectorE and ScalarE contend on PSUM even on different banks (NC-v2's rule)
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

KERNEL_FILE = ROOT / "benchmarks" / "kernels" / "psum_bank.py"
NAMES = ("none", "vector", "scalar", "same", "apart")
READINGS = (("trn2", "serial"), ("trn2", "off"), ("trn1", "serial"))


def inputs(free: int) -> tuple[np.ndarray]:
    rng = np.random.default_rng(7)
    return (rng.standard_normal((128, free)).astype(np.float32),)


def _check(name: str, result: object, args: tuple) -> str:
    got = tuple(np.asarray(r) for r in result)
    ok = len(got) == 2 and all(np.array_equal(g, args[0]) for g in got)  # copies: exact
    return "ok" if ok else "WRONG"


def overlaps(times: dict[str, float]) -> dict[str, float]:
    """Per pair: (vector + scalar - pair) / min(vector, scalar), each less `none`; 1 side by side, 0 serialised."""
    out = {}
    base = times.get("none", 0.0)
    for pair in ("same", "apart"):
        if {pair, "vector", "scalar"} <= times.keys():
            v, s, b = (times[k] - base for k in ("vector", "scalar", pair))
            out[pair] = (v + s - b) / min(v, s) if min(v, s) > 0 else float("nan")
    return out


def run_model(names: list[str], reps: int, free: int) -> int:
    """Every kernel on tilec's interpreter (checked against NumPy) and on the model under three readings."""
    from tilec.nki.api import load_kernel_file, simulate_traced
    from tilec.perf.api import estimate

    args = inputs(free)
    print(f"tilec's interpreter and model, (128, {free}) fp32 out of PSUM, {reps} iterations; model us per reading")
    print(f"{'kernel':<8} {'result':>6} " + " ".join(f"{t + ' ' + r:>12}" for t, r in READINGS))
    bad = 0
    times: dict[tuple[str, str], dict[str, float]] = {reading: {} for reading in READINGS}
    for name in names:
        kernel = load_kernel_file(KERNEL_FILE, name, force_interpreter=True)
        sys.modules[kernel.func.__module__].REPS = reps  # the kernel file's global, read when it is traced
        result, trace = simulate_traced(kernel, *args)
        status = _check(name, result, args)
        bad += status != "ok"
        for tgt, rule in READINGS:
            times[tgt, rule][name] = estimate(trace, tgt, engine_access=rule).total_us
        print(f"{name:<8} {status:>6} " + " ".join(f"{times[r][name]:>12.2f}" for r in READINGS))
    for (tgt, rule), t in times.items():
        ov = overlaps(t)
        if ov:
            print(f"overlap, {tgt} {rule}: " + ", ".join(f"{k} {v:.2f}" for k, v in ov.items()))
    return 1 if bad else 0


def run_hardware(names: list[str], reps: int, free: int, iters: int, profile: str | None) -> int:
    """On a Trn2 with the Neuron SDK (NKI 0.1): each kernel's output against NumPy, then its latency."""
    args = inputs(free)
    print(f"Trn2, (128, {free}) fp32 out of PSUM, {reps} iterations, {iters} runs")
    bad, p50 = probe.time_nki01(probe.load_module(KERNEL_FILE, REPS=reps), names, args,
                                lambda name, result: _check(name, result, args), iters, profile,
                                lambda name: name in ("same", "apart"), width=8)
    print("overlap (p50): " + ", ".join(f"{k} {v:.2f}" for k, v in overlaps(p50).items()))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", action="store_true", help="run on the local Trn2 with the Neuron SDK (not tilec)")
    ap.add_argument("--profile", metavar="DIR", help="with --hardware: also profile same and apart into DIR")
    ap.add_argument("--reps", type=int, default=64)
    ap.add_argument("--free", type=int, default=512, help="fp32 elements per partition of each PSUM tile (<= 512)")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--kernels", help="comma-separated kernel names (default: all)")
    args = ap.parse_args(argv)
    if not 0 < args.free <= 512:
        ap.error("--free must be 1..512 (one PSUM bank of fp32)")
    names = probe.chosen(ap, args.kernels, NAMES)
    if args.hardware:
        return run_hardware(names, args.reps, args.free, args.iters, args.profile)
    return run_model(names, args.reps, args.free)


if __name__ == "__main__":
    sys.exit(main())
