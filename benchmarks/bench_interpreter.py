"""Speed of tilec's NKI interpreter: instructions executed, wall time and time per instruction, for a full run
(numerics) side by side with a trace-only run (numerics=False, what the auto-tuner uses), and their ratio.

    python benchmarks/bench_interpreter.py [--quick]

Workloads:
- fused conv: the generated kernel of examples/conv_bias_maxpool.tl at N=1 (256 -> 256 channels, 224x224, 3x3,
  bias, pool 2; ~5,100 instructions), in fp32 and in fp16 (the program's f32 declarations rewritten to f16);
- conv2d: the generated kernel of examples/conv2d.tl at its defaults (batch 4, 224x224; ~18,400 instructions);
- hand-written conv: benchmarks/kernels/conv2d.py fused_conv2d_maxpool, batch 1, 256 -> 256, 224x224, fp16, pool 1
  (~8,000 matmuls; the issue's target is under 20 s on the 2-core machine);
- small: vector_add_tiled with ROW_CHUNK = 1 on n = 25600 (calibration row 1): 102,400 one-element instructions,
  i.e. pure per-instruction overhead.
Both modes run on the same inputs and their traces are checked equal. Wall time depends on machine load (the
machine is shared); the process CPU time and the load average are printed too. BLAS runs single-threaded inside the
interpreter (tilec/nki/blas.py), so CPU time ~ wall time when unloaded.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time
from typing import Callable

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tilec.compiler.api import compile_file  # noqa: E402
from tilec.nki import api  # noqa: E402
from tilec.tune.evaluate import kernel_inputs  # noqa: E402

KERNELS = ROOT / "benchmarks" / "kernels"
Runner = Callable[[bool], object]  # numerics -> Trace


def timed(run: Runner, numerics: bool) -> tuple[object, float, float]:
    start, cpu_start = time.perf_counter(), time.process_time()
    trace = run(numerics)
    return trace, time.perf_counter() - start, time.process_time() - cpu_start


def measure(label: str, run: Runner) -> None:
    """One row: the full run, then the trace-only run, per-instruction costs and the speedup."""
    load = os.getloadavg()[0]
    full, wall, cpu = timed(run, True)
    only, wall_t, cpu_t = timed(run, False)
    if only.instrs != full.instrs:
        raise SystemExit(f"{label}: the trace-only trace differs from the full run's")
    n = len(full.instrs)
    matmuls = sum(i.op == "nc_matmul" for i in full.instrs)
    print(f"{label}\n    {n} instructions ({matmuls} matmuls), load avg {load:.1f}\n"
          f"    numerics   : wall {wall:6.2f} s = {wall / n * 1e6:6.1f} us/instr; cpu {cpu:6.2f} s\n"
          f"    trace-only : wall {wall_t:6.2f} s = {wall_t / n * 1e6:6.1f} us/instr; cpu {cpu_t:6.2f} s\n"
          f"    ratio      : {wall / wall_t:.2f}x wall, {cpu / cpu_t:.2f}x cpu", flush=True)


def program(path: pathlib.Path, shapes: dict[str, int], dtype: str = "f32") -> Runner:
    """A .tl example compiled at `shapes` (its f32 declarations rewritten to `dtype`), on fixed random inputs."""
    if dtype != "f32":
        copy = pathlib.Path(tempfile.mkdtemp()) / path.name
        copy.write_text(path.read_text().replace("f32", dtype))
        path = copy
    compiled = compile_file(path, shapes)
    inputs = kernel_inputs(compiled)
    return lambda numerics: compiled.run_traced(numerics=numerics, **inputs)[1]


def kernel(fn: object, *args: object, **kwargs: object) -> Runner:
    return lambda numerics: api.simulate_traced(fn, *args, numerics=numerics, **kwargs)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller shapes (a smoke run)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    hw, n = (34, 2560) if args.quick else (224, 25600)
    fused = {"N": 1} if not args.quick else {"N": 1, "H": hw, "W": hw}
    for dtype in ("f32", "f16"):
        measure(f"fused conv (conv_bias_maxpool.tl) N=1 256->256 {hw}x{hw} {dtype}",
                program(ROOT / "examples" / "conv_bias_maxpool.tl", fused, dtype))
    batch = {} if not args.quick else {"N": 2, "H": hw, "W": hw}
    measure(f"conv2d.tl {'defaults: N=4 256->256 224x224' if not args.quick else f'N=2 {hw}x{hw}'} f32",
            program(ROOT / "examples" / "conv2d.tl", batch))
    conv = api.load_kernel_file(KERNELS / "conv2d.py", "fused_conv2d_maxpool")
    x = rng.random((1, 256, hw, hw), dtype=np.float32).astype(np.float16)
    w = rng.random((256, 256, 3, 3), dtype=np.float32).astype(np.float16)
    bias = rng.random(256, dtype=np.float32).astype(np.float16)
    measure(f"hand-written conv 256->256 {hw}x{hw} 3x3 fp16 pool 1", kernel(conv, x, w, bias, pool_size=1))
    small = api.load_kernel_file(KERNELS / "asst.py", "vector_add_tiled")
    a = rng.random(n, dtype=np.float32)
    measure(f"vector_add_tiled ROW_CHUNK=1 n={n}", kernel(small, a, a))


if __name__ == "__main__":
    main()
