"""Running a kernel: the `@nki.jit` object, argument wrapping (numpy array -> HBM tensor), outputs, SPMD grids.

Kernel arguments are HBM tensors wrapping the caller's numpy arrays (written in place when the kernel writes them,
as AWS's simulator does); returned HBM tensors come back as numpy arrays; the run's trace is kept on the kernel.
"""
from __future__ import annotations

import gc
import inspect
import itertools
import warnings

import numpy as np

from tilec.nki import blas, dtypes, rules, runtime
from tilec.nki.runtime import Buffer, Run
from tilec.nki.tensor import Tensor
from tilec.trace import Trace

DEFAULT_TARGET = "trn2"


class Kernel:
    """What `@nki.jit` returns: call it with numpy arrays to run it on tilec's interpreter."""

    run_type = Run  # the state of one execution; NKI 0.6 kernels (top06.Kernel06) use their own

    def __init__(self, func, mode: str = "auto", **options: object) -> None:
        self.func = func
        self.mode = mode
        self.options = dict(options)
        self.skip_middle_end = False
        self.last_trace: Trace | None = None
        self.benchmark_result = None
        self.__name__ = getattr(func, "__name__", "kernel")
        self.__doc__ = getattr(func, "__doc__", None)
        self.__wrapped__ = func

    def __call__(self, *args: object, **kwargs: object) -> object:
        if runtime.active() is not None:  # a kernel calling another kernel: inline it
            return self.func(*args, **kwargs)
        outputs, trace = run_kernel(self, args, kwargs, simulation=self.mode == "simulation")
        if self.options.get("benchmark"):
            from tilec.nki.top import BenchmarkResult

            self.benchmark_result = BenchmarkResult(trace)
        return outputs

    def __getitem__(self, grid: object) -> "_Launcher":
        return _Launcher(self, grid if isinstance(grid, tuple) else (grid,))

    def __repr__(self) -> str:
        return f"<nki kernel {self.__name__} on tilec's interpreter>"


class _Launcher:
    def __init__(self, kernel: Kernel, grid: tuple) -> None:
        self.kernel, self.grid = kernel, tuple(int(g) for g in grid)

    def __call__(self, *args: object, **kwargs: object) -> object:
        outputs, _ = run_kernel(self.kernel, args, kwargs, grid=self.grid,
                                simulation=self.kernel.mode == "simulation")
        return outputs


def as_kernel(func: object) -> Kernel:
    return func if isinstance(func, Kernel) else Kernel(func)


def launch(fn: object, args: tuple, kwargs: dict, target: str | None = None,
           numerics: bool = True, strict: bool = False, simulation: bool = False) -> tuple[object, Trace]:
    """run_kernel for what a caller may hand in: a kernel, a plain function, or a `kernel[grid]` launcher (whose
    grid must reach this run; called as a function it would start a second run and leave this trace empty)."""
    if isinstance(fn, _Launcher):
        return run_kernel(fn.kernel, args, kwargs, grid=fn.grid, target=target, numerics=numerics, strict=strict,
                          simulation=simulation)
    return run_kernel(as_kernel(fn), args, kwargs, target=target, numerics=numerics, strict=strict,
                      simulation=simulation)


def run_kernel(kernel: Kernel, args: tuple, kwargs: dict, grid: tuple = (), target: str | None = None,
               numerics: bool = True, strict: bool = False, simulation: bool = False) -> tuple[object, Trace]:
    """Execute the kernel; numerics=False is a trace-only run (same trace and errors, output values unspecified,
    the caller's arrays never written); simulation=True runs it as AWS's 0.1 simulator did (kernel._output)."""
    target = target or _target(kernel.options)
    run = kernel.run_type(kernel.__name__, target, kernel.skip_middle_end, numerics)
    # NKI 0.6 is a later release: what only SDK 2.21-2.26 accepted is an error there (rules.later_release)
    run.strict = strict or getattr(run, "api", "0.1") == "0.6"
    run.simulation = simulation and not run.strict
    gc_was_on = gc.isenabled()
    gc.disable()  # a run allocates ~10 objects per instruction, none cyclic: the cyclic GC only costs time here
    try:
        with blas.single_thread():
            outputs = _execute(run, kernel, args, kwargs, grid)
    finally:
        if gc_was_on:
            gc.enable()
    trace = run.trace
    kernel.last_trace = trace
    return outputs, trace


def _execute(run: Run, kernel: Kernel, args: tuple, kwargs: dict, grid: tuple) -> object:
    prev = runtime.activate(run)
    try:
        outputs = None
        wrapped, writebacks = _wrap_args(run, kernel.func, args, kwargs)
        result = None
        for pid in itertools.product(*[range(g) for g in grid]) if grid else [()]:
            # SPMD instances run one after another; their k-th shared_hbm allocation is the same tensor
            run.program_ids, run.grid, run.shared_next = pid, grid, 0
            result = kernel.func(*wrapped.args, **wrapped.kwargs)
            run.flush()
        outputs = _outputs(result, kernel, run)
        for arr, t in writebacks if run.numerics else ():  # a trace-only run has no values to give back
            np.copyto(arr, t.arr, casting="unsafe")
        run.finish()
    finally:
        run.running = False
        runtime.activate(prev)
    return outputs


def _target(options: dict) -> str:
    t = str(options.get("platform_target") or DEFAULT_TARGET)
    return {"trn2": "trn2", "gen3": "trn2", "trn1": "trn1", "gen2": "trn1", "inf2": "trn1"}.get(t, t)


def _wrap_args(run: Run, func, args: tuple, kwargs: dict):
    sig = inspect.signature(func)
    bound = sig.bind(*args, **kwargs)
    writebacks = []
    code = getattr(func, "__code__", None)
    where = (code.co_filename, code.co_firstlineno) if code is not None else ("<kernel>", 0)
    for name, value in list(bound.arguments.items()):
        if isinstance(value, np.ndarray) or _is_array_like(value):
            t, wb = _hbm_arg(run, name, np.asarray(value), where)
            bound.arguments[name] = t
            if wb is not None:
                writebacks.append((value, t))
    return bound, writebacks


def _is_array_like(value: object) -> bool:
    return hasattr(value, "__array__") and hasattr(value, "shape") and not isinstance(value, Tensor)


def _hbm_arg(run: Run, name: str, arr: np.ndarray, where: tuple[str, int]) -> tuple[Tensor, object]:
    """A kernel argument: HBM wrapping the caller's array when its dtype is an NKI one (written in place)."""
    storage = dtypes.storage_dtype(arr.dtype)
    if storage not in dtypes.SUPPORTED:
        raise rules.NkiTypeError(f"kernel argument '{name}' has dtype {arr.dtype}, which NKI does not support",
                                 "argument_dtype", where, f"argument '{name}' of shape {tuple(arr.shape)}",
                                 hint="pass float32, float16, bfloat16, float8 or integer arrays")
    if storage == arr.dtype and arr.flags.c_contiguous and arr.flags.writeable:
        buf = Buffer(run, name, "hbm", arr, written=True, where=where)
        run.allocate(buf)
        return Tensor.whole(buf), None
    data = np.ascontiguousarray(arr, dtype=storage)
    buf = Buffer(run, name, "hbm", data, written=True, where=where)
    run.allocate(buf)
    return Tensor.whole(buf), arr if arr.flags.writeable else None


def _outputs(result: object, kernel: Kernel, run: Run) -> object:
    if result is None:
        return None
    if isinstance(result, (tuple, list)):
        return type(result)(_output(r, kernel, run) for r in result)
    return _output(result, kernel, run)


def _output(t: object, kernel: Kernel, run: Run) -> object:
    if not isinstance(t, Tensor):
        return t
    if t.buf.memory != "hbm" and run.simulation:
        _simulated_on_chip_output(t)
    elif t.buf.memory != "hbm":
        raise rules.NkiSyntaxError(f"kernel output '{t.buf.name}' must be an HBM tensor, got a {t.buf.memory} tile",
                                   "kernel_output_memory", t.buf.where,
                                   hint="create outputs with nl.ndarray(..., buffer=nl.shared_hbm) and dma_copy "
                                        "results into them")
    if t.buf.all_written:
        return _values(t, run)
    written = t.written_view()
    if not written.any():
        raise rules.NkiError(f"output tensor '{t.buf.name}' is never written", "err_tensor_output_not_written_to",
                             t.buf.where, f"tensor {t.describe()}",
                             hint="check the loop trip counts that should write it")
    if not written.all():
        warnings.warn(f"{kernel.__name__}: output '{t.buf.name}' is only partly written; the rest holds garbage on "
                      "hardware (NaN here)", stacklevel=3)
    return _values(t, run)


def _simulated_on_chip_output(t: Tensor) -> None:
    """"Top-level tensors must be on HBM ... We currently do not support using tensors stored in SBUF or PSUM as the
    input or output of the top-level kernel" [KI, v2.26.1 nki_known_issues.rst]: the compiler rejects it, and so
    does tilec outside simulation. AWS's 0.1 simulator returned the tile's values (its own v2.26.1 doc test
    test_nki_isa_range_select.py checks a returned SBUF tile), so in simulation mode tilec does too, and warns."""
    where = t.buf.where
    warnings.warn_explicit(
        f"{where[0]}:{where[1]}: warning: kernel output '{t.buf.name}' is a {t.buf.memory} tile; AWS's NKI 0.1 "
        "simulator returns its values, but kernels compiled for the hardware must return HBM tensors (top-level "
        "tensors must be on HBM) [kernel_output_memory]\n  hint: create outputs with nl.ndarray(..., "
        "buffer=nl.shared_hbm) and store results into them", rules.NkiSimulationOnlyWarning, where[0], where[1])


def _values(t: Tensor, run: Run) -> np.ndarray:
    """A copy of an output (it may view an argument); a trace-only run's values are unspecified, so its storage
    is returned as is (copying a never-written 200 MB output would touch every page)."""
    return np.array(t.arr) if run.numerics else t.arr
