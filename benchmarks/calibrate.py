"""Calibration of the performance model against the hardware measurements of docs/calibration.md §1.

Each row runs one of the assignment's kernels (benchmarks/kernels/, written by the NKI engineer) on tilec's
interpreter, feeds the trace to the model, and compares the estimate with the measured latency:

    python benchmarks/calibrate.py                 # all rows (row 1 takes a while: 76,800 DMAs)
    python benchmarks/calibrate.py --rows 2,4,5    # a subset
    python benchmarks/calibrate.py --fit           # also search the free parameters (prints, never writes;
                                                   # minutes with row 1 in the set: use --rows 2,4,5,6,7,8,9,10)
    python benchmarks/calibrate.py --public-conv PATH/conv2d.py
                                                   # also rows 9p-12p: the public kernel rows 9-12 were measured
                                                   # with, run as written (or set TILEC_PUBLIC_CONV=PATH)

The public kernel is xaviergonzalez/asst4-trainium2 `part2/conv2d.py` at commit d155261 (a student's submission,
measured 3832 / 824 / 3830 / 825 us); it is not ours to ship, so it is read from a local path and never committed.
Its rows run trace-only (numerics=False: the same trace and rule checks, no arithmetic).

Targets: every row within 10 % (issue 15; issue 5 asked 20 %), 9p-12p included, the ROW_CHUNK 1 -> 128 -> stream
ratios reproduced, row 7 (FREE_DIM 1000) faster than row 6 (2000) as measured.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import os
import pathlib
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tilec.perf.api import estimate  # noqa: E402
from tilec.perf.params import TRN2, Param, Params  # noqa: E402

KERNELS = ROOT / "benchmarks" / "kernels"


@dataclass(frozen=True)
class Row:
    number: int | str
    file: str
    kernel: str
    config: str
    shapes: tuple[tuple[tuple[int, ...], str], ...]  # positional array inputs: (shape, dtype)
    kwargs: tuple[tuple[str, int], ...]
    measured_us: float
    measured_mfu: float | None = None


def _vec(n: int) -> tuple:
    return (((n,), "float32"), ((n,), "float32"))


def _conv(dtype: str) -> tuple:
    return (((1, 256, 224, 224), dtype), ((256, 256, 3, 3), dtype), ((256,), dtype))


ROWS = (
    Row(1, "asst.py", "vector_add_tiled", "n=25600 ROW_CHUNK=1", _vec(25600), (), 37318),
    Row(2, "asst.py", "vector_add_tiled_128", "n=25600 ROW_CHUNK=128", _vec(25600), (), 378),
    Row(4, "asst.py", "vector_add_stream", "n=25600 FREE_DIM=2", _vec(25600), (), 186),
    Row(5, "asst.py", "vector_add_stream_200", "n=25600 FREE_DIM=200", _vec(25600), (), 15),
    Row(6, "asst.py", "vector_add_stream_2000", "n=256000 FREE_DIM=2000", _vec(256000), (), 28),
    Row(7, "asst.py", "vector_add_stream_1000", "n=256000 FREE_DIM=1000", _vec(256000), (), 26),
    Row(8, "asst.py", "matrix_transpose", "1024x1024 fp32", (((1024, 1024), "float32"),), (), 86),
    Row(9, "conv2d.py", "fused_conv2d_maxpool", "224x224 fp32 pool 1", _conv("float32"), (("pool_size", 1),), 3832,
        0.41),
    Row(10, "conv2d.py", "fused_conv2d_maxpool", "224x224 fp16 pool 1", _conv("float16"), (("pool_size", 1),), 824,
        0.90),
    Row(11, "conv2d.py", "fused_conv2d_maxpool", "224x224 fp32 pool 2", _conv("float32"), (("pool_size", 2),), 3830),
    Row(12, "conv2d.py", "fused_conv2d_maxpool", "224x224 fp16 pool 2", _conv("float16"), (("pool_size", 2),), 825),
)
DMA_COUNTS = {6: 3, 7: 6}  # the profiled rows also report dma_transfer_count
# Row 9's profiler MFU (41 %) is not reachable with calibration.md §3's formula, which the model follows:
# 58.14 GFLOP / (2 * 16384 * 2.4 GHz * 3832 us) = 19.3 %. The profiler evidently weighs fp32 matmuls differently
# (undocumented); the fp16 row (90 %) does follow the formula, so only it is a calibration target for MFU.


def public_rows(path: str) -> tuple[Row, ...]:
    """Rows 9-12 again, from the public kernel they were measured with (a local file, see the module docstring)."""
    return tuple(dataclasses.replace(r, number=f"{r.number}p", file=str(pathlib.Path(path).resolve()))
                 for r in ROWS if r.file == "conv2d.py")


def trace_of(row: Row):
    """Run the row's kernel on the interpreter; return its trace."""
    import warnings

    from tilec.nki.api import load_kernel_file, simulate_traced
    from tilec.nki.rules import NkiPortabilityWarning

    public = isinstance(row.number, str)
    kernel = load_kernel_file(row.file if public else str(KERNELS / row.file), row.kernel)
    rng = np.random.default_rng(42)
    arrays = [rng.random(shape).astype(dtype) for shape, dtype in row.shapes]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NkiPortabilityWarning)  # the public kernel uses SDK 2.21-only constructs
        _, trace = simulate_traced(kernel, *arrays, numerics=not public, **dict(row.kwargs))
    return trace


def error(predicted: float, measured: float) -> float:
    return predicted / measured - 1.0


def report(rows: list[Row], traces: dict[int, object], params: Params | None = None) -> tuple[str, list[float]]:
    lines = [f"{'row':>3}  {'kernel':<24} {'config':<24} {'measured us':>11} {'model us':>10} {'error':>7}  notes"]
    errors, predicted = [], {}
    for row in rows:
        started = time.process_time()
        est = estimate(traces[row.number], params=params)
        model_s = time.process_time() - started  # the model's own speed (issue 5 asked < 2 s for a conv's trace)
        predicted[row.number] = est.total_us
        err = error(est.total_us, row.measured_us)
        errors.append(err)
        notes = [f"model {model_s:.2f} s CPU"]
        if row.number in DMA_COUNTS:
            notes.append(f"dma_transfer_count {est.dma_transfer_count} (measured {DMA_COUNTS[row.number]})")
        if row.measured_mfu is not None:
            notes.append(f"MFU {100 * est.mfu:.1f}% (profiler {100 * row.measured_mfu:.0f}%)")
        elif est.useful_flops:
            notes.append(f"MFU {100 * est.mfu:.1f}%")
        lines.append(f"{row.number!s:>3}  {row.kernel:<24} {row.config:<24} {row.measured_us:>11.0f} "
                     f"{est.total_us:>10.1f} {100 * err:>+6.1f}%  {'; '.join(notes)}")
    if errors:
        abs_errors = [abs(e) for e in errors]
        lines.append(f"median |error| {100 * statistics.median(abs_errors):.1f}%, "
                     f"max |error| {100 * max(abs_errors):.1f}% over {len(errors)} rows")
    for a, b in ((1, 2), (2, 4)):
        if a in predicted and b in predicted:
            ra, rb = ROWS_BY_NUMBER[a], ROWS_BY_NUMBER[b]
            lines.append(f"ratio row {a} / row {b}: measured {ra.measured_us / rb.measured_us:.2f}, "
                         f"model {predicted[a] / predicted[b]:.2f}")
    return "\n".join(lines) + "\n", errors


ROWS_BY_NUMBER = {r.number: r for r in ROWS}
FREE = ("dma_xfer_fixed_ns", "dma_desc_ns", "dma_latency_ns", "dma_write_ack_ns", "startup_ns",
        "vector_static_cycles", "scalar_static_cycles", "mm_fixed_cycles", "mm_fp32_factor")


def fit(rows: list[Row], traces: dict[int, object], rounds: int = 3) -> Params:
    """Coordinate search over the free parameters minimising the sum of squared log errors (offline use)."""
    def loss(p: Params) -> float:
        return sum(math.log(estimate(traces[r.number], params=p).total_us / r.measured_us) ** 2 for r in rows)

    best, best_loss = TRN2, loss(TRN2)
    for _ in range(rounds):
        for name in FREE:
            for factor in (0.5, 0.7, 0.85, 0.95, 1.05, 1.15, 1.4, 2.0):
                old = getattr(best, name)
                cand = dataclasses.replace(best, **{name: Param(old.value * factor, old.source)})
                c_loss = loss(cand)
                if c_loss < best_loss - 1e-12:
                    best, best_loss = cand, c_loss
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", help="comma-separated row numbers (default: all)")
    ap.add_argument("--fit", action="store_true", help="search the free parameters and print the fitted values")
    ap.add_argument("--public-conv", default=os.environ.get("TILEC_PUBLIC_CONV"),
                    help="path of the public conv2d.py rows 9-12 were measured with (adds rows 9p-12p)")
    args = ap.parse_args(argv)
    wanted = {int(x) for x in args.rows.split(",")} if args.rows else set(ROWS_BY_NUMBER)
    rows = [r for r in ROWS if r.number in wanted]
    if args.public_conv:
        rows += [r for r in public_rows(args.public_conv) if int(r.number[:-1]) in wanted]
    traces = {}
    for row in rows:
        t0 = time.perf_counter()
        traces[row.number] = trace_of(row)
        t1 = time.perf_counter()
        gc.collect()  # the interpreter's garbage is not the model's time
        c0 = time.process_time()
        estimate(traces[row.number])
        c1 = time.process_time()
        print(f"row {row.number!s:>3}: {len(traces[row.number].instrs):>6} instructions, interpreter {t1 - t0:6.1f} s, "
              f"model {c1 - c0:5.2f} s cpu", flush=True)
    print("\nparameters (tilec/perf/params.py, trn2):")
    for name, value, source in TRN2.table():
        print(f"  {name:<26} {value:>10g}  {source}")
    text, _ = report(rows, traces)
    print("\n" + text, end="")
    if args.fit:
        fitted = fit(rows, traces)
        print("\nfitted free parameters:")
        for name in FREE:
            print(f"  {name:<26} {getattr(TRN2, name).value:>10g} -> {getattr(fitted, name).value:g}")
        print(report(rows, traces, fitted)[0], end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
