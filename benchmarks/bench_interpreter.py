"""Speed of tilec's NKI interpreter: instructions executed, wall time, and time per instruction.

    python benchmarks/bench_interpreter.py [--quick]

Workloads:
- conv: fused_conv2d_maxpool, batch 1, 256 -> 256 channels, 224x224, 3x3, fp16, pool 1 (~8,000 matmuls; the
  issue's target is under 20 s on the 2-core machine);
- small: vector_add_tiled with ROW_CHUNK = 1 on n = 25600 (calibration row 1): 102,400 one-element instructions,
  i.e. pure per-instruction overhead.
Wall time depends on machine load (the machine is shared); the process CPU time and the load average are printed
too. BLAS runs single-threaded inside the interpreter (tilec/nki/blas.py), so CPU time ~ wall time when unloaded.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tilec.nki import api  # noqa: E402

KERNELS = ROOT / "benchmarks" / "kernels"


def measure(label: str, kernel: object, *args: object, **kwargs: object) -> None:
    load = os.getloadavg()[0]
    start, cpu_start = time.perf_counter(), time.process_time()
    _, trace = api.simulate_traced(kernel, *args, **kwargs)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    n = len(trace.instrs)
    matmuls = sum(i.op == "nc_matmul" for i in trace.instrs)
    print(f"{label}\n    {n} instructions ({matmuls} matmuls): wall {wall:.2f} s = {wall / n * 1e6:.1f} us/instr; "
          f"cpu {cpu:.2f} s = {cpu / n * 1e6:.1f} us/instr (load avg {load:.1f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller shapes (a smoke run)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    hw, n = (34, 2560) if args.quick else (224, 25600)
    conv = api.load_kernel_file(KERNELS / "conv2d.py", "fused_conv2d_maxpool")
    x = rng.random((1, 256, hw, hw), dtype=np.float32).astype(np.float16)
    w = rng.random((256, 256, 3, 3), dtype=np.float32).astype(np.float16)
    bias = rng.random(256, dtype=np.float32).astype(np.float16)
    measure(f"conv 256->256 {hw}x{hw} 3x3 fp16 pool 1", conv, x, w, bias, pool_size=1)
    small = api.load_kernel_file(KERNELS / "asst.py", "vector_add_tiled")
    a = rng.random(n, dtype=np.float32)
    measure(f"vector_add_tiled ROW_CHUNK=1 n={n}", small, a, a)


if __name__ == "__main__":
    main()
