"""Evaluators rank schedules: the performance model (default) or real hardware (NKI 0.1: `nki.benchmark`; NKI 0.6:
NKI_ARTIFACTS_DIR + nrtpy `benchmark(mode="device")`, hardware06.py).

    Job       = the program being tuned (path, its text, shapes, target), picklable for worker processes
    Outcome   = latency in µs (inf when the candidate failed), MFU, and the error message of a failure
    Evaluator = anything with `name` (part of the cache key) and `evaluate(job, schedules) -> [Outcome]`

ModelEvaluator: compile -> run on the interpreter, trace-only (numerics=False: same trace and rule checks as a
full run, no arithmetic; the winner is verified with full numerics in verify.py) ->
`tilec.perf.api.estimate(trace).total_us`, over a pool of worker processes; results come back in input order
whatever finishes first. HardwareEvaluator screens with the model and re-ranks the model's top k by measured p99
latency; its measuring function is injectable, so its selection logic is tested here without hardware.
"""
from __future__ import annotations

import functools
import importlib.util
import math
import multiprocessing
import pathlib
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

import numpy as np

from tilec.errors import KernelError, TilecError

INF = math.inf


@dataclass(frozen=True)
class Job:
    path: str
    program_text: str
    shapes: tuple[tuple[str, int], ...]  # sorted (name, size) pairs given by the user
    target: str = "trn2"
    nki: str = "0.6"  # the NKI API the kernels are written for (both forms have the same model latency)

    @staticmethod
    def of(path: str, shapes: dict[str, int] | None, target: str = "trn2", nki: str | None = None) -> "Job":
        from tilec.compiler.codegen import check_nki
        try:
            text = pathlib.Path(path).read_text()
        except OSError as err:
            raise TilecError(f"cannot read {path}: {err.strerror}", hint="give the path of a .tl program") from None
        return Job(str(path), text, tuple(sorted((shapes or {}).items())), target, check_nki(nki))


@dataclass(frozen=True)
class Outcome:
    us: float  # latency in µs; inf when the candidate failed
    mfu: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return math.isfinite(self.us)


class Evaluator(Protocol):
    name: str

    def evaluate(self, job: Job, schedules: list[str]) -> Iterable[Outcome]: ...  # in input order


# ---- the performance model -------------------------------------------------------------------------------------


def compile_job(job: Job, schedule: str | None):  # -> tilec.compiler.api.Compiled
    from tilec.compiler.api import compile_file  # glue through public APIs only, imported late: workers start fast
    return compile_file(job.path, dict(job.shapes) or None, schedule, job.nki, job.target)


def kernel_inputs(compiled, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for the compiled program, in the kernel's dtypes, keyed by parameter name."""
    from tilec.lang.api import NP_DTYPES, random_inputs
    tensors = compiled.program.tensors
    return {name: a.astype(NP_DTYPES[tensors[name].dtype]) if name in tensors else a
            for name, a in random_inputs(compiled.program, seed=seed).items()}


def placeholder_inputs(compiled) -> dict[str, np.ndarray]:
    """Zero inputs in the kernel's shapes and dtypes, for a trace-only run. No rule reads input values (indirect
    DMA, the one interpreter feature whose trace does, refuses to run trace-only), and np.zeros costs nothing up
    front where drawing random inputs for the batch-4 conv2d takes about a second."""
    from tilec.lang.api import NP_DTYPES
    return {t.name: np.zeros(t.shape, NP_DTYPES[t.dtype]) for t in compiled.program.inputs}


def model_outcome(job: Job, schedule: str, kernel_cache: str | None = None) -> Outcome:
    """One candidate through compiler, interpreter and model. A rejected schedule is an Outcome, not an exception.

    Different schedule texts often compile to the same kernel (e.g. a reorder of loops with one iteration); the
    trace and so the latency depend only on the kernel and the shapes, so with `kernel_cache` (a directory) the
    interpreter runs once per distinct kernel source."""
    from tilec.perf.api import estimate
    try:
        compiled = compile_job(job, schedule)
        cache, key = kernel_cache_entry(kernel_cache, job, compiled.source)
        if cache and (hit := cache.get(key)):
            return hit
        _, trace = compiled.run_traced(numerics=False, **placeholder_inputs(compiled))
        est = estimate(trace, job.target)
    except (TilecError, KernelError) as err:
        return Outcome(INF, error=first_line(err))
    except Exception as err:  # a compiler or interpreter bug must not end the search; it is reported
        return Outcome(INF, error=f"internal: {type(err).__name__}: {first_line(err)}")
    outcome = Outcome(float(est.total_us), float(getattr(est, "mfu", 0.0)))
    if cache:
        cache.put(key, outcome)
    return outcome


def kernel_cache_entry(directory: str | None, job: Job, source: str):
    """(DiskCache, key) for a kernel source at the job's target, or (None, "") without a directory."""
    if directory is None:
        return None, ""
    from tilec.tune.cache import DiskCache  # the cache module imports this one; import late
    cache = DiskCache(directory)
    # the program and shapes stay in the key: the trace also depends on the input arrays' shapes
    return cache, cache.key(Job("", job.program_text, job.shapes, job.target), source, "model-kernel")


def first_line(err: BaseException) -> str:
    text = err.message if isinstance(err, TilecError) else str(err)
    return (text.strip().splitlines() or [type(err).__name__])[0]


class ModelEvaluator:
    """Ranks by the performance model, over `jobs` worker processes (1 = in this process)."""

    def __init__(self, jobs: int = 2, outcome: Callable[..., Outcome] = model_outcome,
                 kernel_cache: str | None = None) -> None:
        self.name = "model"
        self.jobs = max(1, jobs)
        # a module-level function (or a partial of one), so worker processes can unpickle it
        self.outcome: Callable[..., Outcome] = outcome
        if kernel_cache:
            self.outcome = functools.partial(outcome, kernel_cache=kernel_cache)
        self._pool: Executor | None = None

    def evaluate(self, job: Job, schedules: list[str]) -> Iterable[Outcome]:
        """Outcomes in input order, each yielded as soon as it and those before it are done."""
        if self.jobs == 1 or len(schedules) <= 1:
            return (self.outcome(job, s) for s in schedules)
        if self._pool is None:  # started on first need, so fully cached re-runs start no processes
            self._pool = start_pool(self.jobs)
        return self._pool.map(self.outcome, [job] * len(schedules), schedules)  # map keeps input order

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)  # after Ctrl-C: finish the running candidates, start no more
            self._pool = None


def start_pool(jobs: int) -> Executor:
    """Worker processes forked from this one where the platform allows: they start with everything imported and
    need no `if __name__ == "__main__"` guard in the user's script (spawned workers re-import the main module)."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    return ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_ignore_interrupts)


def _ignore_interrupts() -> None:
    """Ctrl-C reaches every process of the terminal's group: the parent stops the search and reports it once;
    workers ignore it instead of each printing a traceback."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


# ---- real hardware ---------------------------------------------------------------------------------------------

Benchmark = Callable[[Job, str], float]  # (job, schedule) -> measured p99 latency in µs


@dataclass(frozen=True)
class Measured:
    schedule: str
    model_us: float
    p99_us: float  # inf when the measurement failed
    error: str = ""


def real_neuronxcc() -> bool:
    """True when the installed `neuronxcc` is AWS's package, not tilec's interpreter shim."""
    spec = importlib.util.find_spec("neuronxcc")
    return spec is not None and spec.origin is not None and "tilec" not in spec.origin and "shim" not in spec.origin


class HardwareEvaluator:
    """Screens candidates with `screen` (the model); `select` re-ranks the top k by measured p99 latency."""

    def __init__(self, top_k: int = 5, benchmark: Benchmark | None = None, screen: Evaluator | None = None,
                 warmup: int = 10, iters: int = 100, nki: str | None = None) -> None:
        from tilec.compiler.codegen import check_nki
        from tilec.tune import hardware06
        nki = check_nki(nki)
        if benchmark is None and not (real_neuronxcc() if nki == "0.1" else hardware06.available()):
            raise TilecError("the hardware evaluator needs AWS neuronxcc (NKI 0.1) or AWS nki with nrtpy "
                             "(NKI 0.6) and a Trainium device",
                             hint="tune with the performance model (the default evaluator) on this machine"
                                  if nki == "0.1" else hardware06.SETUP_HINT)
        self.top_k = top_k
        self.benchmark = benchmark or (lambda job, s: neuron_benchmark(job, s, warmup, iters) if job.nki == "0.1"
                                       else hardware06.nrtpy_benchmark(job, s, warmup, iters))
        self.screen = screen or ModelEvaluator()
        self.name = self.screen.name  # search outcomes are the screen's (cached as such); measurements are not

    def evaluate(self, job: Job, schedules: list[str]) -> Iterable[Outcome]:
        return self.screen.evaluate(job, schedules)

    def select(self, job: Job, ranked: list[tuple[str, float]]) -> list[Measured]:
        """Measure the first top_k distinct schedules of `ranked` ((schedule, model µs), best first); return
        them ordered by p99, ties broken by model latency then rank, failures last."""
        chosen: list[tuple[str, float]] = []
        for schedule, model_us in ranked:
            if math.isfinite(model_us) and schedule not in {s for s, _ in chosen}:
                chosen.append((schedule, model_us))
        measured = [self._measure(job, s, us) for s, us in chosen[:self.top_k]]
        order = sorted(range(len(measured)), key=lambda i: (measured[i].p99_us, measured[i].model_us, i))
        return [measured[i] for i in order]

    def _measure(self, job: Job, schedule: str, model_us: float) -> Measured:
        try:
            return Measured(schedule, model_us, float(self.benchmark(job, schedule)))
        except Exception as err:  # one kernel failing on the device must not lose the others' measurements
            return Measured(schedule, model_us, INF, f"{type(err).__name__}: {first_line(err)}")

    def close(self) -> None:
        close = getattr(self.screen, "close", None)
        if close:
            close()


def neuron_benchmark(job: Job, schedule: str, warmup: int, iters: int) -> float:  # pragma: no cover - hardware
    """p99 latency in µs of the compiled kernel measured by real `nki.benchmark` (inputs are ignored by it)."""
    import neuronxcc.nki as nki
    from tilec.compiler.api import load_kernel
    compiled = compile_job(job, schedule)
    inputs = kernel_inputs(compiled)
    bench = nki.benchmark(warmup=warmup, iters=iters)(load_kernel(compiled.source, compiled.kernel_name))
    bench(*[inputs[p.name] for p in compiled.program.kernel.params])
    return float(bench.benchmark_result.nc_latency.get_latency_percentile(99))
