"""A hardware measurement for whoever has a Trn2: does VectorE's 16-bit performance mode hold GpSimdE up (they share
an SBUF bus, ARCH3)? It decides the performance model's bus rule (tilec/perf/params.py SHARED_BUS: "off" today,
"exclusive" the pessimistic reading; docs/notes/fid11.md has the what-if numbers of both).

    python benchmarks/trn2_shared_bus.py                     # here: every kernel on tilec's interpreter, checked
                                                             # against NumPy, and the model under both rules
    python benchmarks/trn2_shared_bus.py --hardware          # on a trn2 instance with neuronxcc (SDK 2.21-2.26):
                                                             # check each kernel's output, then time it
    python benchmarks/trn2_shared_bus.py --hardware --profile DIR
                                                             # also write NEFF + NTFF profiles of both16 / both32
    python benchmarks/trn2_shared_bus.py --nki06 [--hardware]
                                                             # the NKI 0.6 kernels (SDK 2.29+, `import nki`):
                                                             # median wall time of --iters calls (host overhead
                                                             # included): profile with `neuron-explorer capture`
    options: --reps N (default 64) --fv F (VectorE's free size, default 2048) --fg F (GpSimdE's, default 256)
             --iters N (default 100) --kernels none,vector16,...

The kernels are benchmarks/kernels/shared_bus.py (its docstring says what each one does) and shared_bus_nki06.py.
Reading the hardware table: subtract `none` from every row (the loads, stores and start-up), then for each pair
(both16: vector16 + gpsimd, bothtt16: vectortt16 + gpsimd, both32: vector32 + gpsimd) the printed overlap

    overlap = (vector + gpsimd - both) / min(vector, gpsimd)      1: the two ran side by side, 0: one after the other

    both32 ~1 and both16, bothtt16 ~1     no contention to speak of: keep SHARED_BUS = "off"
    both32 ~1, both16 / bothtt16 ~0       performance mode and GpSimdE exclude each other: set SHARED_BUS =
                                          "exclusive" in tilec/perf/params.py (what-if numbers today:
                                          TILEC_MODEL_SHARED_BUS=exclusive python benchmarks/families.py)
    both32 ~1, both16 in between          they share the bus's bandwidth: the model needs a rule between the two
                                          (e.g. both run at a fraction of their rate while they overlap); also
                                          compare vector16 alone with --fg 0 to see whether VectorE loses its 4x
    both32 well below 1                   VectorE and GpSimdE contend even without performance mode (the NC-v2
                                          rule): the model is optimistic for every VectorE + GpSimdE split

"well below" means by more than the run-to-run spread (run the table twice). The profile (neuron-profile view -n
file.neff -s profile.ntff) shows it directly: in both16 do the VectorE and GpSimdE instructions overlap in time?
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

KERNEL_FILE = ROOT / "benchmarks" / "kernels" / "shared_bus.py"
KERNEL_FILE06 = ROOT / "benchmarks" / "kernels" / "shared_bus_nki06.py"
NAMES = ("none", "vector16", "vectortt16", "vector32", "gpsimd", "both16", "bothtt16", "both32")
PAIRS = {"both16": "vector16", "bothtt16": "vectortt16", "both32": "vector32"}


def inputs(fv: int, fg: int) -> tuple[np.ndarray, ...]:
    import ml_dtypes

    rng = np.random.default_rng(7)
    x32 = rng.integers(-8, 8, (128, fv)).astype(np.float32)  # small integers: every sum below is exact
    y = rng.integers(-8, 8, (128, fg)).astype(np.float32)
    return x32.astype(ml_dtypes.bfloat16), x32, y


def expected(name: str, x16: np.ndarray, x32: np.ndarray, y: np.ndarray, reps: int) -> tuple[np.ndarray, ...]:
    """NumPy results of kernel `name` (benchmarks/kernels/shared_bus.py docstring)."""
    v = {"vectortt16": x16 + x16, "bothtt16": x16 + x16, "vector32": x32, "both32": x32}.get(name, x16)
    g = y * (reps + 1) if name == "gpsimd" or name.startswith("both") else y
    return v.astype(x32.dtype if v is x32 else x16.dtype), g


def _check(name: str, result: object, args: tuple, reps: int) -> str:
    got = tuple(np.asarray(r) for r in result)
    want = expected(name, *args, reps)
    ok = len(got) == 2 and all(g.shape == w.shape and np.array_equal(g.astype(np.float32), w.astype(np.float32))
                               for g, w in zip(got, want))
    return "ok" if ok else "WRONG"


def overlaps(times: dict[str, float]) -> dict[str, float]:
    """Per pair: (vector + gpsimd - both) / min(vector, gpsimd), each less `none`; 1 side by side, 0 serialised."""
    out = {}
    base = times.get("none", 0.0)
    for both, vec in PAIRS.items():
        if {both, vec, "gpsimd"} <= times.keys():
            v, g, b = (times[k] - base for k in (vec, "gpsimd", both))
            out[both] = (v + g - b) / min(v, g) if min(v, g) > 0 else float("nan")
    return out


def run_model(names: list[str], reps: int, fv: int, fg: int, path: pathlib.Path = KERNEL_FILE) -> int:
    """Every kernel on tilec's interpreter (checked against NumPy) and on the model under both bus rules."""
    from tilec.nki.api import load_kernel_file, simulate_traced
    from tilec.perf.api import estimate

    args = inputs(fv, fg)
    print(f"tilec's interpreter and model (trn2), VectorE (128, {fv}), GpSimdE (128, {fg}) fp32, {reps} iterations")
    print(f"{'kernel':<12} {'result':>6} {'model us (off)':>15} {'model us (exclusive)':>21}")
    bad = 0
    times: dict[str, dict[str, float]] = {"off": {}, "exclusive": {}}
    for name in names:
        kernel = load_kernel_file(path, name, force_interpreter=True)
        sys.modules[kernel.func.__module__].REPS = reps  # the kernel file's global, read when it is traced
        result, trace = simulate_traced(kernel, *args)
        status = _check(name, result, args, reps)
        bad += status != "ok"
        for rule in times:
            times[rule][name] = estimate(trace, shared_bus=rule).total_us
        print(f"{name:<12} {status:>6} {times['off'][name]:>15.2f} {times['exclusive'][name]:>21.2f}")
    for rule, t in times.items():
        ov = overlaps(t)
        if ov:
            print(f"overlap under {rule!r}: " + ", ".join(f"{k} {v:.2f}" for k, v in ov.items()))
    return 1 if bad else 0


def run_hardware(names: list[str], reps: int, fv: int, fg: int, iters: int, profile: str | None) -> int:
    """On a Trn2 with the Neuron SDK (NKI 0.1): each kernel's output against NumPy, then its latency."""
    args = inputs(fv, fg)
    print(f"Trn2, VectorE (128, {fv}), GpSimdE (128, {fg}) fp32, {reps} iterations, {iters} runs")
    bad, p50 = probe.time_nki01(probe.load_module(KERNEL_FILE, REPS=reps), names, args,
                                lambda name, result: _check(name, result, args, reps), iters, profile,
                                lambda name: name in ("both16", "both32"))
    print("overlap (p50): " + ", ".join(f"{k} {v:.2f}" for k, v in overlaps(p50).items()))
    return 1 if bad else 0


def run_hardware06(names: list[str], reps: int, fv: int, fg: int, iters: int) -> int:
    """NKI 0.6 on a Trn2: each kernel's output against NumPy, then the median wall time of `iters` calls."""
    args = inputs(fv, fg)
    print(f"Trn2 (NKI 0.6), VectorE (128, {fv}), GpSimdE (128, {fg}) fp32, {reps} iterations, median wall time of "
          f"{iters} calls (host overhead included)")
    bad, median = probe.time_nki06(probe.load_module(KERNEL_FILE06, REPS=reps), names, args,
                                   lambda name, result: _check(name, result, args, reps), iters)
    print("overlap (median): " + ", ".join(f"{k} {v:.2f}" for k, v in overlaps(median).items()))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", action="store_true", help="run on the local Trn2 with the Neuron SDK (not tilec)")
    ap.add_argument("--profile", metavar="DIR", help="with --hardware: also profile both16 and both32 into DIR")
    ap.add_argument("--reps", type=int, default=64)
    ap.add_argument("--fv", type=int, default=2048, help="VectorE's free size per instruction")
    ap.add_argument("--fg", type=int, default=256, help="GpSimdE's free size per instruction")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--kernels", help="comma-separated kernel names (default: all)")
    ap.add_argument("--nki06", action="store_true", help="the NKI 0.6 kernels (shared_bus_nki06.py)")
    args = ap.parse_args(argv)
    names = probe.chosen(ap, args.kernels, NAMES)
    if args.hardware:
        if args.nki06:
            return run_hardware06(names, args.reps, args.fv, args.fg, args.iters)
        return run_hardware(names, args.reps, args.fv, args.fg, args.iters, args.profile)
    return run_model(names, args.reps, args.fv, args.fg, KERNEL_FILE06 if args.nki06 else KERNEL_FILE)


if __name__ == "__main__":
    sys.exit(main())
