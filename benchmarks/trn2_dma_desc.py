"""A hardware measurement for whoever has a Trn2: what a small DMA costs the DMA engines. It decides the performance
model's per-descriptor time (params.dma_desc_ns, 14 ns fitted to calibration rows 1, 2, 4) against the ~105 ns per
partition row that nki-spec fits to the DMA efficiency figure (v2.32.0 nki/get-started/about/nki-dma-overview.rst;
docs/notes/fid14.md says why the documents and the measured rows do not settle it).

    python benchmarks/trn2_dma_desc.py                # here: every kernel on tilec's interpreter, checked against
                                                      # NumPy, and the model's latency under three readings
    python benchmarks/trn2_dma_desc.py --hardware     # on a trn2 instance with neuronxcc (SDK 2.21-2.26): check
                                                      # each kernel's output, then time it (nki.benchmark)
    python benchmarks/trn2_dma_desc.py --nki06 [--hardware]
                                                      # the NKI 0.6 kernels (SDK 2.29+, `import nki`): median
                                                      # wall time of --iters calls
    options: --total N (default 2048 fp32 per partition) --free F,F,... (default 8,32,128,512,1024) --iters N

The kernels are benchmarks/kernels/dma_desc.py (its docstring says what each copies) and dma_desc_nki06.py. Per
FREE, the script prints each kernel's time beyond `whole`'s (which moved the same bytes in one DMA) per small DMA
per engine (TOTAL / FREE of them on each engine in both kernels), d = (t - t_whole) / (TOTAL / FREE):

    rows128: d128 ~ x + 8 r (+ the bytes' share of the efficiency loss)   per engine, in sequence
    rows8:   d8   ~ d128 + 15 s                                            the other engines' semaphore writes

with r the engine time per descriptor (row), x per DMA, s per foreign semaphore write. Reading it:

    d128 ~ 8 x 14 = 112 ns at small FREE, falling as the bytes dominate     the model's 14 ns per row holds
    d128 ~ 8 x 105 = 840 ns at FREE <= 512 B, still ~300 ns at 1 KiB        nki-spec's fit holds: set dma_desc_ns
                                                                            (or a per-DMA cost, dma_xfer_fixed_ns,
                                                                            if rows8 - rows128 is large too)
    rows8 well above rows128                                                a per-DMA cost exists (x or s)
    d128 ~ 1.2 us whatever FREE                                             latency-bound: the DMAs did not overlap
                                                                            (queue depth): the model's
                                                                            dma_latency_ns, not a per-row cost

The model columns: "model" (the parameter table), "row105" (dma_desc_ns = 105) and "dma840" (dma_xfer_fixed_ns =
840 ns per DMA per engine: the same figure explained per DMA instead of per row). Rows 2 and 4 of calibration.md
(128 rows of 4 B per DMA, three DMAs per 1.9 us iteration) already bound the time per row below ~78 ns if each row
is one descriptor; this probe measures it directly.
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import trn2_probe as probe  # noqa: E402

KERNEL_FILE = ROOT / "benchmarks" / "kernels" / "dma_desc.py"
KERNEL_FILE06 = ROOT / "benchmarks" / "kernels" / "dma_desc_nki06.py"
NAMES = ("whole", "rows128", "rows8")
FREES = (8, 32, 128, 512, 1024)


def inputs(total: int) -> tuple[np.ndarray]:
    return (np.random.default_rng(5).standard_normal((128, total)).astype(np.float32),)


def _check(name: str, result: object, args: tuple) -> str:
    got = np.asarray(result)
    return "ok" if got.shape == args[0].shape and np.array_equal(got, args[0]) else "WRONG"


def readings() -> dict[str, object]:
    """The parameter tables of the model's three readings of the DMA efficiency figure."""
    from tilec.perf.params import TRN2, Param

    return {"model": TRN2,
            "row105": dataclasses.replace(TRN2, dma_desc_ns=Param(105.0, "nki-spec §5 fit to DMAINTRO's figure")),
            "dma840": dataclasses.replace(TRN2, dma_xfer_fixed_ns=Param(840.0, "the same figure, per DMA"))}


def run_model(names: list[str], total: int, frees: list[int], path: pathlib.Path = KERNEL_FILE) -> int:
    """Every kernel on tilec's interpreter (checked against NumPy) and on the model under the three readings."""
    from tilec.nki.api import load_kernel_file, simulate_traced
    from tilec.perf.api import estimate

    args = inputs(total)
    tables = readings()
    print(f"tilec's interpreter and model (trn2), x (128, {total}) fp32; us, and the time beyond `whole` per small DMA "
          "per engine (ns)")
    print(f"{'FREE B':>7} {'kernel':<8} {'result':>6} " + " ".join(f"{k + ' us':>10} {'ns/DMA':>7}" for k in tables))
    bad = 0
    for free in frees:
        base: dict[str, float] = {}
        for name in names:
            kernel = load_kernel_file(path, name, force_interpreter=True)
            module = sys.modules[kernel.func.__module__]
            module.TOTAL, module.FREE = total, free
            result, trace = simulate_traced(kernel, *args)
            status = _check(name, result, args)
            bad += status != "ok"
            cells = []
            for key, params in tables.items():
                us = estimate(trace, params=params).total_us
                if name == "whole":
                    base[key] = us
                    cells.append(f"{us:>10.2f} {'':>7}")
                else:
                    per = 1000 * (us - base.get(key, 0.0)) / (total // free)
                    cells.append(f"{us:>10.2f} {per:>7.0f}")
            print(f"{4 * free:>7} {name:<8} {status:>6} " + " ".join(cells))
    return 1 if bad else 0


def run_hardware(names: list[str], total: int, frees: list[int], iters: int, nki06: bool = False) -> int:
    """On a Trn2 with the Neuron SDK: each kernel's output against NumPy, then its latency (NKI 0.1: nki.benchmark
    p50; NKI 0.6: the median wall time of `iters` calls, host overhead included, which cancels in t - t_whole)."""
    args = inputs(total)
    bad = 0
    for free in frees:
        print(f"Trn2{' (NKI 0.6)' if nki06 else ''}, x (128, {total}) fp32, small DMAs of {free} fp32 ({4 * free} B) "
              f"per partition, {iters} runs")
        module = probe.load_module(KERNEL_FILE06 if nki06 else KERNEL_FILE, TOTAL=total, FREE=free)
        timer = probe.time_nki06 if nki06 else probe.time_nki01
        nbad, times = timer(module, names, args, lambda name, result: _check(name, result, args), iters)
        bad += nbad
        if "whole" in times:
            for name in names:
                if name != "whole":
                    per = 1000 * (times[name] - times["whole"]) / (total // free)
                    print(f"  {name}: {per:.0f} ns per small DMA per engine beyond whole")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", action="store_true", help="run on the local Trn2 with the Neuron SDK (not tilec)")
    ap.add_argument("--total", type=int, default=2048, help="fp32 elements per partition of x")
    ap.add_argument("--free", default=",".join(map(str, FREES)), help="fp32 elements per partition per small DMA")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--kernels", help="comma-separated kernel names (default: all)")
    ap.add_argument("--nki06", action="store_true", help="the NKI 0.6 kernels (dma_desc_nki06.py)")
    args = ap.parse_args(argv)
    names = probe.chosen(ap, args.kernels, NAMES)
    frees = [int(f) for f in args.free.split(",")]
    if any(f <= 0 or args.total % f for f in frees):
        ap.error(f"every --free must divide --total {args.total}")
    if args.hardware:
        return run_hardware(names, args.total, frees, args.iters, args.nki06)
    return run_model(names, args.total, frees, KERNEL_FILE06 if args.nki06 else KERNEL_FILE)


if __name__ == "__main__":
    sys.exit(main())
