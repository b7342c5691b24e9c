"""A hardware measurement for whoever has a Trn2: does an fp32 matmul marked is_stationary_onezero=True run faster,
as the nc_matmul docstrings say it "could" (2x)? It decides tilec/perf/params.py `onezero_fp32_speedup` (2 today,
the documented best case; cols20's column sums rest on it: docs/notes/cols20.md, lead20.md).

    python benchmarks/trn2_onezero.py                 # here: every kernel on tilec's interpreter, checked against
                                                      # NumPy, and the model's microseconds (trn2)
    python benchmarks/trn2_onezero.py --hardware      # on a trn2 instance with neuronxcc (SDK 2.21-2.26): check each
                                                      # kernel's output, then time it
    options: --reps N (default 64) --free F (moving columns, <= 512; default 512) --iters N (default 100)
             --kernels none,fp32,...

The kernels are benchmarks/kernels/onezero.py (its docstring says what each one does). Reading the table: subtract
`none` from every row and divide by --reps for one matmul's time; then

    speed-up = fp32 / fp32_onezero      the model says 2 (onezero_fp32_speedup): set the Param to what is measured
    fp32 factor = fp32 / bf16           the model says mm_fp32_factor (4.7, fitted to calibration rows 9, 11)
    bf16_onezero / bf16                 ~1 expected (no bf16 speed-up is documented)
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

KERNEL_FILE = ROOT / "benchmarks" / "kernels" / "onezero.py"
NAMES = ("none", "fp32", "fp32_onezero", "bf16", "bf16_onezero")


def inputs(free: int) -> tuple[np.ndarray]:
    rng = np.random.default_rng(7)
    return (rng.standard_normal((128, free)).astype(np.float32),)


def expected(name: str, x: np.ndarray) -> np.ndarray:
    """The column sums of x as the kernel's dtype holds it (NumPy, in float64 then rounded: TensorE sums in fp32)."""
    import ml_dtypes

    held = x.astype(ml_dtypes.bfloat16).astype(np.float32) if name.startswith("bf16") else x
    return held.astype(np.float64).sum(axis=0, keepdims=True).astype(np.float32)


def _check(name: str, result: object, args: tuple) -> str:
    got = np.asarray(result)
    return "ok" if got.shape == (1, args[0].shape[1]) and np.allclose(got, expected(name, args[0]), rtol=1e-4,
                                                                       atol=1e-4) else "WRONG"


def ratios(each: dict[str, float]) -> dict[str, float]:
    """speed-up (fp32 / fp32_onezero), fp32 factor (fp32 / bf16), bf16 hint (bf16_onezero / bf16), where measured."""
    pairs = {"speed-up": ("fp32", "fp32_onezero"), "fp32 factor": ("fp32", "bf16"),
             "bf16 hint": ("bf16_onezero", "bf16")}
    return {k: each[a] / each[b] for k, (a, b) in pairs.items() if a in each and b in each and each[b] > 0}


def run_model(names: list[str], reps: int, free: int) -> int:
    """Every kernel on tilec's interpreter (checked against NumPy) and on the trn2 model."""
    args = inputs(free)
    print(f"tilec's interpreter and model, ones (128, 1) x (128, {free}), {reps} matmuls; model us (trn2)")
    bad, times = probe.model_nki01(KERNEL_FILE, names, args, lambda name, result: _check(name, result, args), reps,
                                   width=13)
    print("model: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios(probe.per_rep(times, reps)).items()))
    return 1 if bad else 0


def run_hardware(names: list[str], reps: int, free: int, iters: int) -> int:
    """On a Trn2 with the Neuron SDK (NKI 0.1): each kernel's output against NumPy, then its latency."""
    args = inputs(free)
    print(f"Trn2, ones (128, 1) x (128, {free}), {reps} matmuls, {iters} runs")
    bad, p50 = probe.time_nki01(probe.load_module(KERNEL_FILE, REPS=reps), names, args,
                                lambda name, result: _check(name, result, args), iters, width=13)
    print("measured (p50): " + ", ".join(f"{k} {v:.2f}" for k, v in ratios(probe.per_rep(p50, reps)).items()))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", action="store_true", help="run on the local Trn2 with the Neuron SDK (not tilec)")
    ap.add_argument("--reps", type=int, default=64)
    ap.add_argument("--free", type=int, default=512, help="moving columns (<= 512)")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--kernels", help="comma-separated kernel names (default: all)")
    args = ap.parse_args(argv)
    if not 0 < args.free <= 512 or args.reps < 1:
        ap.error("--free must be 1..512 (one matmul's moving columns) and --reps at least 1")
    names = probe.chosen(ap, args.kernels, NAMES)
    if args.hardware:
        return run_hardware(names, args.reps, args.free, args.iters)
    return run_model(names, args.reps, args.free)


if __name__ == "__main__":
    sys.exit(main())
