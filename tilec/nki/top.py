"""`neuronxcc.nki`: the decorators (jit, baremetal, benchmark, profile), simulate_kernel, nki.compiler and nki.typing.

Every mode runs on tilec's interpreter (there is no NeuronDevice here). `nki.benchmark` has no hardware to time:
it reports the performance model's estimate when tilec registered one (hooks.py), labelled as an estimate, and
otherwise says plainly that no timing is available.
"""
from __future__ import annotations

import types

from tilec.nki import hooks
from tilec.nki.kernel import Kernel, as_kernel, launch
from tilec.trace import Trace


def _decorator(func, mode: str, **options: object):
    def wrap(f):
        if isinstance(f, Kernel):
            f.mode = mode
            f.options.update(options)
            return f
        return Kernel(f, mode=mode, **options)

    return wrap(func) if func is not None else wrap


def jit(func=None, mode: str = "auto", **kwargs: object):
    return _decorator(func, mode, **kwargs)


def baremetal(kernel=None, **kwargs: object):
    return _decorator(kernel, "baremetal", **kwargs)


def benchmark(kernel=None, **kwargs: object):
    return _decorator(kernel, "benchmark", benchmark=True, **kwargs)


def profile(func=None, **kwargs: object):
    return _decorator(func, "profile", **kwargs)


def simulate_kernel(kernel, *args: object, **kwargs: object) -> object:
    outputs, _ = launch(kernel, args, kwargs, simulation=True)
    return outputs


class _Latency:
    def __init__(self, estimate: object, note: str) -> None:
        self.estimate, self.note = estimate, note

    def get_latency_percentile(self, p: int) -> float:
        if self.estimate is None:
            raise RuntimeError(self.note)
        return float(self.estimate.total_us)


class BenchmarkResult:
    """`fn.benchmark_result.nc_latency.get_latency_percentile(p)`: tilec's model estimate, same for every p."""

    def __init__(self, trace: Trace) -> None:
        est, note = None, ("no timing available: nki.benchmark needs a NeuronDevice, and tilec's performance "
                           "model is not available in this installation")
        fn = hooks.estimator()
        if fn is not None:
            try:
                est = fn(trace)
                note = f"estimated by tilec's model: {est.total_us:.1f} us (not a hardware measurement)"
            except ImportError:
                est = None
        self.nc_latency = _Latency(est, note)
        self.note = note
        print(f"nki.benchmark[{trace.kernel}]: {note}")


def _skip_middle_end(func=None):
    def wrap(f):
        k = as_kernel(f)
        k.skip_middle_end = True
        return k

    return wrap(func) if func is not None else wrap


def _passthrough(func=None, **kwargs: object):
    return func if func is not None else (lambda f: f)


def trace(func=None, **kwargs: object):
    """`nki.trace`: the tracing decorator of NKI 0.1 (AWS's allocation tests use it as their jit); runs like jit."""
    return _decorator(func, "trace", **kwargs)


class _Allocator:
    """`nki.compiler.sbuf` / `.psum`: direct allocation (`ncc.sbuf.mod_alloc(base_addr=...)`,
    `ncc.psum.alloc(func)`). The interpreter keeps its own storage per tensor, so an allocation names only the
    memory; the addresses are the compiler's business [NCC1]."""

    def __init__(self, memory: str) -> None:
        self.memory = memory

    def _buffer(self):
        from tilec.nki import language

        return language.Buffer(self.memory, self.memory, direct=True)

    def mod_alloc(self, *args: object, **kwargs: object):
        return self._buffer()

    def alloc(self, *args: object, **kwargs: object):
        return self._buffer()

    def auto_alloc(self, *args: object, **kwargs: object):
        return self._buffer()


compiler = types.SimpleNamespace(
    skip_middle_end_transformations=_skip_middle_end,
    enable_stack_allocator=_passthrough,
    force_auto_alloc=_passthrough,
    sbuf=_Allocator("sbuf"),
    psum=_Allocator("psum"),
)


class _TensorType:
    """`nt.tensor[shape, dtype]` / `nt.mutable_tensor` annotations: accepted, not enforced."""

    def __getitem__(self, item: object) -> "_TensorType":
        return self


typing = types.SimpleNamespace(tensor=_TensorType(), mutable_tensor=_TensorType())
