"""`nki` (NKI 0.6, Neuron SDK 2.32): `nki.jit`, `nki.simulate`, and what running a 0.6 kernel changes.

The 0.6 API runs on the same interpreter core as 0.1 (tiles, rules, numerics, trace); a 0.6 run differs in:

  * loops are Python `range` (nl.affine_range & co. are aliases of it): iterations run in order, no loop scopes and
    no affine-loop race check; the trace is the unrolled program, as the NKI 0.6 compiler specialises it;
  * SBUF/PSUM capacity is checked by liveness (a tile lives from its allocation to its last use) when the run ends,
    not by loop scopes at allocation: a Python loop rebinding `t = nl.ndarray(...)` frees the old tile only after
    the new one exists, and tiles kept in lists live as long as they are used;
  * returned outputs must be allocated in nl.shared_hbm [MIG 0.3];
  * PSUM remembers which elements a matmul wrote (accumulate= inference and the undefined-behaviour rule of
    accumulating onto memset/copy-initialised PSUM, isa06.nc_matmul).

Standalone runs: a kernel called with NumPy arrays runs on the interpreter (as 0.6 runs it on a NeuronDevice);
`nki.simulate(kernel)(*arrays)` does the same, as the 0.6 simulator does. The target comes from
NEURON_PLATFORM_TARGET_OVERRIDE (trn2 when unset: tilec models trn1 and trn2, not trn3). 0.6 has no nki.benchmark:
tilec's model times a kernel through `tilec.nki.top06.estimate(kernel, *arrays)` or `tilec profile`.
"""
from __future__ import annotations

import functools
import os

import numpy as np

from tilec.nki import rules, runtime
from tilec.nki.kernel import Kernel, _Launcher, launch
from tilec.nki.runtime import Run
from tilec.nki.tensor import Tensor

# NEURON_PLATFORM_TARGET_OVERRIDE values [NKI6 jit] -> tilec's targets
_TARGETS = {"trn1": "trn1", "inf2": "trn1", "gen2": "trn1", "trn2": "trn2", "gen3": "trn2"}
_REMOVED = {  # top-level 0.1 APIs that 0.6 does not have, and what replaces them [RN 2.27/2.28, MIG]
    "benchmark": "time kernels with tilec's model (tilec.nki.top06.estimate, `tilec profile`) or on hardware with "
                 "NKI_ARTIFACTS_DIR + nrtpy NrtpyModel.benchmark(mode=\"device\")",
    "profile": "profile on hardware with `neuron-explorer capture`; `tilec profile` gives the model's view",
    "baremetal": "call the @nki.jit kernel with NumPy arrays (standalone mode)",
    "simulate_kernel": "use nki.simulate(kernel)(*arrays)",
    "compiler": "NKI 0.6 has no nki.compiler (skip_middle_end_transformations is gone)",
}


class Run06(Run):
    """One execution of an NKI 0.6 kernel."""

    api = "0.6"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.shared_ids: set[int] = set()  # buffers allocated in nl.shared_hbm (the only legal outputs)
        self.matmul_written: dict[int, np.ndarray] = {}  # PSUM buffer id -> per element: last written by a matmul

    def _charge(self, buf: object) -> None:
        """Capacity is checked by liveness when the run ends (check_capacity), not at allocation."""

    def finish(self):
        self.flush()
        check_capacity(self)
        return super().finish()


def check_capacity(run: Run) -> None:
    """Peak SBUF bytes per partition and live PSUM tiles, each tile live from its allocation to its last use."""
    events = []
    for info in run.infos.values():
        if info.committed and info.memory in ("sbuf", "psum") and info.last_seq >= info.first_seq:
            events += [(info.first_seq, 1, info), (info.last_seq + 1, 0, info)]
    events.sort(key=lambda e: (e[0], e[1]))  # at one seq, frees before allocations
    live: dict[int, object] = {}
    sbuf = psum = 0
    tgt = run.target
    for _, alloc, info in events:
        delta = 1 if alloc else -1
        if not alloc:
            live.pop(info.id, None)
        if info.memory == "sbuf":
            sbuf += delta * info.bpp
        else:
            psum += delta
        if alloc:
            live[info.id] = info
            if sbuf > tgt.sbuf_usable or psum > tgt.psum_banks:
                _capacity_error(run, info, live, sbuf, psum)


def _capacity_error(run: Run, info: object, live: dict, sbuf: int, psum: int) -> None:
    tgt = run.target
    names = ", ".join(f"'{i.name}'" for i in live.values() if i.memory == info.memory)
    if info.memory == "psum":
        raise rules.MemoryRuleError(
            f"PSUM has {tgt.psum_banks} banks of {tgt.psum_bank_bytes} bytes per partition; allocating "
            f"'{info.name}' makes {psum} PSUM tiles live at once", "psum_bank_overflow", info.where,
            f"PSUM tiles live (allocated and used later): {names}",
            hint="a tile lives until its last use: copy accumulators out of PSUM before allocating the next ones")
    raise rules.MemoryRuleError(
        f"SBUF usage per partition exceeds the usable {tgt.sbuf_usable} bytes of {tgt.name}: {sbuf} bytes live "
        f"once '{info.name}' is allocated", "sbuf_capacity", info.where, f"SBUF tiles live: {names}",
        hint="a tile lives until its last use: use smaller tiles, or finish with a tile before allocating the next")


def _returns_checked(func):
    @functools.wraps(func)
    def kernel(*args: object, **kwargs: object) -> object:
        result = func(*args, **kwargs)
        run = runtime.current()
        for t in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(t, Tensor) and t.buf.memory == "hbm" and t.buf.id not in run.shared_ids:
                raise rules.NkiSyntaxError(
                    "All kernel output (return) tensors must be allocated with `buffer=nl.shared_hbm`",
                    "kernel_output_shared_hbm", t.buf.where, f"returned tensor {t.describe()}",
                    hint="allocate outputs with nl.ndarray(shape, dtype, buffer=nl.shared_hbm) and dma_copy into "
                         "them; a kernel argument written in place need not be returned")
        return result

    return kernel


def _target() -> str | None:
    value = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "").strip().lower()
    if not value:
        return None
    if value not in _TARGETS:
        raise rules.NkiError(f"NEURON_PLATFORM_TARGET_OVERRIDE={value} is not a target tilec models",
                             "platform_target", None, hint="tilec's interpreter and model cover trn2 (gen3) and "
                                                           "trn1 (gen2); unset it for trn2")
    return _TARGETS[value]


class Kernel06(Kernel):
    """What NKI 0.6 `@nki.jit` returns: call it with NumPy arrays to run it standalone on tilec's interpreter;
    `kernel[lnc](...)` launches it on `lnc` logical cores (nl.program_id(0) tells them apart)."""

    run_type = Run06

    def __init__(self, func, **options: object) -> None:
        if "platform_target" in options:
            raise rules.NkiValueError("nki.jit(platform_target=...) is an error since NKI 0.3",
                                      "platform_target", _where(func),
                                      hint="set NEURON_PLATFORM_TARGET_OVERRIDE=trn2 (or trn1) instead")
        options.pop("mode", None)  # "deprecated and ignored" [MIG]
        super().__init__(_returns_checked(func), **options)
        self.__wrapped__ = func

    @property
    def options(self) -> dict:
        target = _target()
        return {**self._options, "platform_target": target} if target else self._options

    @options.setter
    def options(self, value: dict) -> None:
        self._options = value

    def __call__(self, *args: object, **kwargs: object) -> object:
        if runtime.active() is not None:  # a kernel calling another kernel: inline it
            return self.func(*args, **kwargs)
        outputs, _ = launch(self, args, kwargs)
        return outputs

    def __repr__(self) -> str:
        return f"<nki 0.6 kernel {self.__name__} on tilec's interpreter>"


def _where(func: object) -> tuple[str, int] | None:
    code = getattr(func, "__code__", None)
    return (code.co_filename, code.co_firstlineno) if code is not None else None


def jit(fn=None, **kwargs: object):
    """`@nki.jit` / `@nki.jit(...)`: an NKI 0.6 kernel."""
    def wrap(f):
        return f if isinstance(f, Kernel06) else Kernel06(getattr(f, "__wrapped__", f) if isinstance(f, Kernel)
                                                           else f, **kwargs)

    return wrap(fn) if fn is not None else wrap


def simulate(kernel):
    """`nki.simulate(kernel)(*arrays)`: run on tilec's CPU interpreter; `nki.simulate(kernel[2])` runs LNC=2."""
    target = kernel if isinstance(kernel, (Kernel06, _Launcher)) else jit(kernel)

    def simulated(*args: object, **kwargs: object) -> object:
        outputs, _ = launch(target, args, kwargs)
        return outputs

    return simulated


def estimate(kernel, *args: object, **kwargs: object):
    """tilec's Trainium2 model timing of one standalone run (0.6 has no nki.benchmark): a trace-only run of the
    kernel, scheduled by the model. Returns tilec.perf.api.Estimate (`.total_us`, `.summary_text()`), an
    estimate, never a measurement; on hardware time the NEFF with nrtpy (README: "Timing NKI 0.6 kernels")."""
    from tilec.perf.api import estimate as perf_estimate

    target = kernel if isinstance(kernel, (Kernel06, _Launcher)) else jit(kernel)
    _, trace = launch(target, args, kwargs, numerics=False)
    return perf_estimate(trace)


def missing(name: str) -> object:
    """Module __getattr__ of `nki`: 0.1 names that 0.6 removed say what replaced them."""
    if name in _REMOVED:
        raise AttributeError(f"nki.{name} is not available in NKI 0.6: {_REMOVED[name]}")
    raise AttributeError(f"module 'nki' has no attribute {name!r}")
