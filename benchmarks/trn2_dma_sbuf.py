"""A hardware measurement for whoever has a Trn2: two DMA costs no document gives (docs/notes/model14.md).

1. SBUF -> SBUF DMA: the model charges it like a load, its bytes once on the engines of its destination's partitions
   (costs.dma_occupancy_ns; stem17.md). If the hardware pays a read and a write on the SBUF side, `copies` takes up
   to twice `loads`' DMA time.
2. The HWDGE issue cost, ~600 ns per DMA instruction on NC-v3 [ARCH3, DGE]: the model charges nothing on the
   trigger stream beyond the fitted 1.15 us semaphore-to-start latency, which overlaps (params.dma_latency_ns;
   fid15.md section 5). If the cost is serial on the trigger engine, `small_hwdge` takes ~600 ns per small DMA more
   than `small_static`.

    python benchmarks/trn2_dma_sbuf.py                # here: every kernel on tilec's interpreter, checked against
                                                      # NumPy, and the model's latency
    python benchmarks/trn2_dma_sbuf.py --hardware     # on a trn2 instance with neuronxcc (SDK 2.21-2.26): check each
                                                      # kernel's output, then time it (nki.benchmark)
    options: --total N (fp32 per partition of x, default 1024) --reps N (default 8) --small N (default 8) --iters N

The kernels are benchmarks/kernels/dma_sbuf.py (its docstring says what each copies). Reading the times:

    copies - loads  ~ one load of x (B = 128 x TOTAL x 4 bytes: B / 368 B/ns + one latency)
                                                       SBUF -> SBUF pays its bytes once, as the model has it
                    ~ that + REPS x B / 368 B/ns        it pays them twice: charge on-chip DMAs 2x in
                                                       costs.dma_occupancy_ns (a new Param, this probe its source)
    (small_hwdge - small_static) / (TOTAL / SMALL)
                    ~ 0                                 the issue cost overlaps (the model's reading)
                    ~ 600 ns                            serial per DMA on its trigger engine: add it to the trigger
                                                       stream (schedule.py), for DMAs the compiler gives HWDGE
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

KERNEL_FILE = ROOT / "benchmarks" / "kernels" / "dma_sbuf.py"
NAMES = ("loads", "copies", "small_hwdge", "small_static")


def inputs(total: int) -> tuple[np.ndarray]:
    return (np.random.default_rng(7).standard_normal((128, total)).astype(np.float32),)


def expected(name: str, x: np.ndarray, reps: int) -> np.ndarray:
    return np.tile(x, reps) if name in ("loads", "copies") else x


def run_model(names: list[str], total: int, reps: int, small: int) -> int:
    """Every kernel on tilec's interpreter (checked against NumPy) and on the model."""
    from tilec.nki.api import load_kernel_file, simulate_traced
    from tilec.perf.api import estimate

    (x,) = inputs(total)
    print(f"tilec's interpreter and model (trn2): x (128, {total}) fp32, {reps} copies, small DMAs of {small} fp32")
    print(f"{'kernel':<13} {'result':>6} {'DMAs':>5} {'model us':>9}")
    bad, us = 0, {}
    for name in names:
        kernel = load_kernel_file(KERNEL_FILE, name, force_interpreter=True)
        module = sys.modules[kernel.func.__module__]
        module.TOTAL, module.REPS, module.SMALL = total, reps, small
        result, trace = simulate_traced(kernel, x)
        ok = np.array_equal(np.asarray(result), expected(name, x, reps))
        bad += not ok
        us[name] = estimate(trace).total_us
        dmas = sum(1 for ins in trace.instrs if ins.engine == "dma")
        print(f"{name:<13} {'ok' if ok else 'WRONG':>6} {dmas:>5} {us[name]:>9.2f}")
    _readings(us, total, small)
    return 1 if bad else 0


def _readings(us: dict[str, float], total: int, small: int) -> None:
    if "loads" in us and "copies" in us:
        print(f"copies - loads: {us['copies'] - us['loads']:.2f} us")
    if "small_hwdge" in us and "small_static" in us:
        per = 1000 * (us["small_hwdge"] - us["small_static"]) / (total // small)
        print(f"(small_hwdge - small_static) per small DMA: {per:.0f} ns")


def run_hardware(names: list[str], total: int, reps: int, small: int, iters: int) -> int:
    """On a Trn2 with the Neuron SDK (NKI 0.1): each kernel's output against NumPy, then nki.benchmark's p50."""
    (x,) = inputs(total)
    module = probe.load_module(KERNEL_FILE, TOTAL=total, REPS=reps, SMALL=small)
    print(f"Trn2: x (128, {total}) fp32, {reps} copies, small DMAs of {small} fp32, {iters} runs")

    def check(name: str, result: object) -> str:
        return "ok" if np.array_equal(np.asarray(result), expected(name, x, reps)) else "WRONG"

    bad, times = probe.time_nki01(module, names, (x,), check, iters, width=13)
    _readings(times, total, small)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", action="store_true", help="run on the local Trn2 with the Neuron SDK (not tilec)")
    ap.add_argument("--total", type=int, default=1024, help="fp32 elements per partition of x")
    ap.add_argument("--reps", type=int, default=8, help="copies of x in the first two kernels")
    ap.add_argument("--small", type=int, default=8, help="fp32 elements per partition of each small DMA")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--kernels", help="comma-separated kernel names (default: all)")
    args = ap.parse_args(argv)
    names = probe.chosen(ap, args.kernels, NAMES)
    if args.small <= 0 or args.total % args.small:
        ap.error(f"--small must divide --total {args.total}")
    if args.hardware:
        return run_hardware(names, args.total, args.reps, args.small, args.iters)
    return run_model(names, args.total, args.reps, args.small)


if __name__ == "__main__":
    sys.exit(main())
