"""Timing an NKI 0.6 kernel on a Trainium device: NKI 0.6 has no `nki.benchmark` [RN 2.27/2.28], so the documented
route is two steps [NRTPY = aws-neuron-sdk v2.32.0 neuron-runtime/nrtpy/tutorial-{debug-neff-nrtpy,
validate-benchmark}.rst]:

  1. compile and run the kernel standalone (called with NumPy arrays) with NKI_ARTIFACTS_DIR set *before* `nki` is
     imported: the NEFF stays in that directory;
  2. load the NEFF with nrtpy (`NrtpyModel.load_from_neff`) and time it with
     `model.benchmark(inputs=..., warmup_iter=W, benchmark_iter=N, mode="device")` (NeuronCore time only), which
     reports mean/min/max/std in ms. nrtpy and nki cannot share one Python environment as of 2.32 [SETUP], so this
     step runs in the Python named by TILEC_NRTPY_PYTHON (a venv with nrtpy).

Each step is a subprocess (`run` is injectable: tests pass a fake). nrtpy reports no percentiles: the hardware
evaluator ranks 0.6 kernels by the device mean.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Any, Callable

import numpy as np

from tilec.errors import TilecError

SETUP_HINT = ("install AWS's nki (pip index https://pip.repos.neuron.amazonaws.com) on a Trainium instance, and nrtpy "
              "in a separate venv whose python TILEC_NRTPY_PYTHON names; or tune with the model (the default)")

# step 1, run with the `nki` environment's python: argv = kernel file, kernel name, inputs .npz
_COMPILE = """\
import importlib.util, sys
import numpy as np
path, name, npz = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("tilec_kernel", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
arrays = np.load(npz)
getattr(module, name)(*[arrays[k] for k in arrays.files])
"""

# step 2, run with TILEC_NRTPY_PYTHON: argv = neff, inputs .npz, warmup, iterations; prints JSON
_BENCHMARK = """\
import json, sys
import numpy as np
from nrtpy import NrtpyModel, NrtpyTensor
neff, npz, warmup, iters = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
model = NrtpyModel.load_from_neff(neff)
arrays = np.load(npz)
names = list(model.input_tensors_info.keys())
by_name = all(n in arrays.files for n in names)
inputs = {n: NrtpyTensor.from_numpy(arrays[n] if by_name else arrays[arrays.files[i]], name=n)
          for i, n in enumerate(names)}
stats = model.benchmark(inputs=inputs, warmup_iter=warmup, benchmark_iter=iters, mode="device")
print(json.dumps({"mean_ms": stats.mean_ms, "min_ms": stats.min_ms, "max_ms": stats.max_ms,
                  "std_dev_ms": stats.std_dev_ms}))
"""

Runner = Callable[..., subprocess.CompletedProcess]


def real_nki() -> bool:
    """True when `import nki` would give AWS's package (not tilec's interpreter shim)."""
    module = sys.modules.get("nki")
    if module is not None:
        return not getattr(module, "__tilec_shim__", False)
    spec = importlib.util.find_spec("nki")
    return spec is not None and spec.origin is not None  # tilec's shim serves modules without an origin


def available() -> bool:
    return real_nki() and bool(os.environ.get("TILEC_NRTPY_PYTHON"))


def nrtpy_benchmark(job, schedule: str, warmup: int = 10, iters: int = 100, run: Runner = subprocess.run,
                    workdir: str | None = None) -> float:
    """Mean device latency in µs of the job's kernel (NKI 0.6 form) for `schedule`, measured through nrtpy."""
    from tilec.tune.evaluate import compile_job, kernel_inputs
    compiled = compile_job(job, schedule or None)
    if compiled.nki != "0.6":
        raise TilecError("nrtpy_benchmark times NKI 0.6 kernels", hint="time NKI 0.1 kernels with nki.benchmark")
    folder = pathlib.Path(workdir or tempfile.mkdtemp(prefix="tilec_nrtpy_"))
    folder.mkdir(parents=True, exist_ok=True)
    kernel = folder / f"{compiled.kernel_name}.py"
    kernel.write_text(compiled.source)
    inputs = kernel_inputs(compiled)
    npz = folder / "inputs.npz"
    arrays: dict[str, Any] = {p.name: inputs[p.name] for p in compiled.program.kernel.params}
    np.savez(npz, **arrays)
    artifacts = folder / "artifacts"
    artifacts.mkdir(exist_ok=True)
    env = {**os.environ, "NKI_ARTIFACTS_DIR": str(artifacts)}  # set before nki is imported (a fresh process)
    env.pop("TILEC_NKI", None)
    _checked(run([sys.executable, "-c", _COMPILE, str(kernel), compiled.kernel_name, str(npz)], env=env,
                 capture_output=True, text=True), "compiling and running the kernel with nki")
    neffs = sorted(artifacts.rglob("*.neff"))
    if not neffs:
        raise TilecError(f"no NEFF in {artifacts} after running the kernel with NKI_ARTIFACTS_DIR set",
                         hint="check that AWS's nki (not tilec's interpreter) ran the kernel")
    python = os.environ.get("TILEC_NRTPY_PYTHON") or sys.executable
    done = _checked(run([python, "-c", _BENCHMARK, str(neffs[0]), str(npz), str(warmup), str(iters)],
                        capture_output=True, text=True), "timing the NEFF with nrtpy")
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    return float(stats["mean_ms"]) * 1000.0


def _checked(done: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if done.returncode != 0:
        tail = (done.stderr or done.stdout or "").strip().splitlines()[-3:]
        raise TilecError(f"{what} failed (exit {done.returncode}): {' / '.join(tail)}", hint=SETUP_HINT)
    return done
