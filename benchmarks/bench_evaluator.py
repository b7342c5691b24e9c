"""Speed of tilec's reference evaluator (tilec.lang, NumPy) on the assignment's largest case: conv_bias_maxpool at
batch 4, 256 -> 256 channels, 224x224, 3x3, bias, pool 2, fp32 (issue 2's target: under 30 s and 4 GiB on the
2-core machine). Correctness of the same run is a test (tests/lang/test_evaluator.py); the time lives here, because
the machines are shared and a timed unit test fails on load, not on a slower evaluator.

    python benchmarks/bench_evaluator.py
"""
from __future__ import annotations

import os
import pathlib
import resource
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tilec.lang import api  # noqa: E402

TARGET_S = 30.0  # issue 2
TARGET_GIB = 4.0


def main() -> None:
    prog = api.load(ROOT / "examples" / "conv_bias_maxpool.tl")
    rng = np.random.default_rng(42)
    inputs = {"X": rng.random((4, 256, 224, 224), dtype=np.float32),
              "Wt": rng.random((256, 256, 3, 3), dtype=np.float32), "b": rng.random(256, dtype=np.float32)}
    wall, cpu = time.perf_counter(), time.process_time()
    api.evaluate(prog, inputs)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2  # KiB on Linux
    print(f"evaluator, conv_bias_maxpool batch 4 fp32: wall {wall:.1f} s, cpu {cpu:.1f} s (target < {TARGET_S:.0f} s),"
          f" peak {peak:.2f} GiB (target < {TARGET_GIB:.0f} GiB), load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
