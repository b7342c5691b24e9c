"""A hardware measurement for whoever has a Trn2: an fp32 DMA transpose's throughput against a DMA copy's, SBUF ->
SBUF and HBM -> SBUF. ARCH3 gives "up to" 50 % and 90 %; the model charges exactly those (tilec/perf/params.py
dma_transpose_sbuf_factor, dma_transpose_factor), so xpose20's rows_dma (fp32 SBUF -> SBUF transposes of an NHWC
1x1 conv's stationary) rests on the best case (docs/notes/xpose20.md, lead20.md).

    python benchmarks/trn2_dma_transpose.py               # here: every kernel on tilec's interpreter, checked against
                                                          # NumPy, and the model's microseconds (trn2)
    python benchmarks/trn2_dma_transpose.py --hardware    # on a trn2 instance with neuronxcc (SDK 2.21-2.26): check
                                                          # each kernel's output, then time it
    options: --reps N (default 32) --iters N (default 100) --kernels none,copy_sbuf,...

The kernels are benchmarks/kernels/dma_transpose.py (its docstring says what each one does). Reading the table:
subtract `none` from every row and divide by --reps for one operation's time (a (128, 128) fp32 tile, 64 KiB); then

    sbuf factor = copy_sbuf / transpose_sbuf    the model says 0.5 up to its fixed costs: set
                                                dma_transpose_sbuf_factor to what is measured
    hbm factor = copy_hbm / transpose_hbm       the model says 0.9 likewise: dma_transpose_factor

The model's own reading (printed here) sits above those Params: each operation also pays the fixed DMA costs
(descriptors, latency) a copy pays, which the factors do not scale.
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

KERNEL_FILE = ROOT / "benchmarks" / "kernels" / "dma_transpose.py"
NAMES = ("none", "copy_sbuf", "transpose_sbuf", "copy_hbm", "transpose_hbm")


def inputs() -> tuple[np.ndarray]:
    rng = np.random.default_rng(7)
    return (rng.standard_normal((128, 128)).astype(np.float32),)


def _check(name: str, result: object, args: tuple) -> str:
    want = args[0].T if name.startswith("transpose") else args[0]
    return "ok" if np.array_equal(np.asarray(result), want) else "WRONG"  # DMAs move bits: exact


def factors(each: dict[str, float]) -> dict[str, float]:
    """copy time / transpose time, SBUF -> SBUF and HBM -> SBUF, where measured."""
    pairs = {"sbuf factor": ("copy_sbuf", "transpose_sbuf"), "hbm factor": ("copy_hbm", "transpose_hbm")}
    return {k: each[a] / each[b] for k, (a, b) in pairs.items() if a in each and b in each and each[b] > 0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", action="store_true", help="run on the local Trn2 with the Neuron SDK (not tilec)")
    ap.add_argument("--reps", type=int, default=32)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--kernels", help="comma-separated kernel names (default: all)")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    names = probe.chosen(ap, args.kernels, NAMES)
    x = inputs()
    check = lambda name, result: _check(name, result, x)  # noqa: E731
    if args.hardware:
        print(f"Trn2, (128, 128) fp32, {args.reps} operations, {args.iters} runs")
        bad, times = probe.time_nki01(probe.load_module(KERNEL_FILE, REPS=args.reps), names, x, check, args.iters,
                                      width=15)
        label = "measured (p50)"
    else:
        print(f"tilec's interpreter and model, (128, 128) fp32, {args.reps} operations; model us (trn2)")
        bad, times = probe.model_nki01(KERNEL_FILE, names, x, check, args.reps, width=15)
        label = "model"
    print(f"{label}: " + ", ".join(f"{k} {v:.2f}" for k, v in factors(probe.per_rep(times, args.reps)).items()))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
