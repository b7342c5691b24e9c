"""Public API of the performance model: `estimate(trace, target) -> Estimate`, its summary text and timeline picture.

    est = estimate(trace)              # schedule the interpreter's trace on a modelled Trainium2 NeuronCore
    est.total_us, est.mfu, est.hfu     # latency (estimated, never measured) and profiler-style utilisation
    print(est.summary_text())          # like `neuron-profile view --output-format summary-text`
    write_timeline(est, "k.html")      # one lane per engine and DMA queue, hover for instruction and source line

The model itself is described in `tilec/perf/__init__.py`; the numbers it uses in `tilec/perf/params.py`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from tilec.perf import metrics
from tilec.perf.costs import Costs
from tilec.perf.params import Params, target_params
from tilec.perf.schedule import Schedule, schedule
from tilec.trace import Instr, Trace

ENGINE_NAMES = {"tensor": "tensor_engine", "vector": "vector_engine", "scalar": "scalar_engine",
                "gpsimd": "gpsimd_engine"}


@dataclass(frozen=True)
class TimelineItem:
    start_ns: float
    end_ns: float
    lane: str  # "tensor", "vector", "scalar", "gpsimd" or a DMA queue "dma <file>:<line>"
    seq: int
    op: str
    detail: str  # shapes and dtypes, for the hover text
    file: str
    line: int
    instr: Instr = field(repr=False, compare=False)


@dataclass(frozen=True)
class Estimate:
    kernel: str
    target: str
    total_ns: float
    busy_ns: dict[str, float]  # per engine, and "dma" (time with >= 1 transfer in flight)
    instr_counts: dict[str, int]  # "engine.op" -> count
    dma_transfer_count: int
    dma_bytes: int
    hbm_read_bytes: int
    hbm_write_bytes: int
    useful_flops: int
    hardware_flops: int
    sbuf_peak_bytes: int  # per partition
    psum_peak_bytes: int
    params: Params = field(repr=False)
    _trace: Trace = field(repr=False, compare=False)
    _schedule: Schedule = field(repr=False, compare=False)

    @property
    def total_us(self) -> float:
        return self.total_ns / 1000.0

    @property
    def bytes_moved(self) -> int:
        return self.dma_bytes

    @property
    def utilisation(self) -> dict[str, float]:
        return {k: (v / self.total_ns if self.total_ns else 0.0) for k, v in self.busy_ns.items()}

    @property
    def peak_flops_per_ns(self) -> float:
        p = self.params
        return 2 * p.pe_rows.value * p.pe_cols.value * p.tensor_ghz.value

    @property
    def mfu(self) -> float:
        """Fraction (not percent): useful matmul FLOPs / (TensorE peak * total_time)."""
        return self.useful_flops / (self.peak_flops_per_ns * self.total_ns) if self.total_ns else 0.0

    @property
    def hfu(self) -> float:
        return self.hardware_flops / (self.peak_flops_per_ns * self.total_ns) if self.total_ns else 0.0

    @property
    def mbu(self) -> float:
        hbm = self.hbm_read_bytes + self.hbm_write_bytes
        return hbm / self.total_ns / self.params.hbm_stack_bw.value if self.total_ns else 0.0

    @functools.cached_property
    def timeline(self) -> tuple[TimelineItem, ...]:
        s = self._schedule
        return tuple(TimelineItem(s.start[i], s.end[i], s.lane[i], ins.seq, ins.op, describe(ins), ins.file, ins.line,
                                  ins) for i, ins in enumerate(self._trace.instrs))

    @functools.cached_property
    def line_time_ns(self) -> dict[tuple[str, int], float]:
        """Busy time (engine or DMA-queue time) of the instructions issued by each kernel source line."""
        out: dict[tuple[str, int], float] = {}
        s = self._schedule
        for i, ins in enumerate(self._trace.instrs):
            key = (ins.file, ins.line)
            out[key] = out.get(key, 0.0) + s.end[i] - s.start[i]
        return dict(sorted(out.items()))

    def summary_text(self) -> str:
        from tilec.perf.report import summary_text
        return summary_text(self)


def estimate(trace: Trace, target: str = "trn2", params: Params | None = None,
             hbm_rule: str | None = None, shared_bus: str | None = None, sbuf_rotation: str | None = None,
             psum_rotation: str | None = None, dma_queue: str | None = None,
             engine_access: str | None = None) -> Estimate:
    """Schedule `trace` on the modelled NeuronCore of `target` and compute the profiler's figures.

    `params` replaces the target's parameter table (the calibration fit tries candidate tables this way).
    `hbm_rule`: "range" or "pattern", how DMAs touching one HBM tensor are ordered (tilec/perf/deps.py; default
    the environment's TILEC_MODEL_HBM_DEPS, else "range"). `shared_bus`: "off" or "exclusive", whether VectorE's
    performance mode and GpSimdE may overlap (tilec/perf/params.py; default TILEC_MODEL_SHARED_BUS, else "off").
    `sbuf_rotation`: "free" or "fit", whether loop tiles' rotation buffers must fit in SBUF (params.py; default
    TILEC_MODEL_SBUF_ROTATION, else "fit"). `psum_rotation`: "free" or "fit", whether PSUM tiles and their
    rotation buffers must be placed in the 8 PSUM banks (params.py; default TILEC_MODEL_PSUM_ROTATION, else "fit").
    `dma_queue`: "engine" or "stream", whether a DMA waits only for its trigger stream's previous trigger and, on each
    DMA engine, for its queue's previous transfer there, or for the stream's previous transfer to start on any engine
    (params.DMA_QUEUE; default TILEC_MODEL_DMA_QUEUE, else "engine"). `engine_access`: "serial" or "off", whether the
    target's engines that must not touch one memory (or PSUM bank) together are kept apart (params.ENGINE_ACCESS;
    default TILEC_MODEL_ENGINE_ACCESS, else "serial")."""
    costs = _costs(target) if params is None else Costs(params)
    params = costs.p
    sched = schedule(trace, costs, hbm_rule, shared_bus, sbuf_rotation, psum_rotation, dma_queue, engine_access)
    instrs = trace.instrs
    busy = {e: 0.0 for e in ENGINE_NAMES}
    dma_intervals = []
    for i, ins in enumerate(instrs):
        if ins.engine == "dma":
            dma_intervals.append((sched.start[i], sched.end[i]))
        else:
            busy[ins.engine] = busy.get(ins.engine, 0.0) + sched.end[i] - sched.start[i]
    busy["dma"] = metrics.union_ns(dma_intervals)
    useful, hardware = metrics.flops(instrs)
    read, write = metrics.hbm_bytes(instrs)
    return Estimate(
        kernel=trace.kernel, target=target, total_ns=sched.total_ns, busy_ns=busy,
        instr_counts=metrics.instr_counts(instrs), dma_transfer_count=len(dma_intervals),
        dma_bytes=sum(ins.bytes for ins in instrs if ins.engine == "dma"), hbm_read_bytes=read, hbm_write_bytes=write,
        useful_flops=useful, hardware_flops=hardware,
        sbuf_peak_bytes=metrics.peak_per_partition(trace.allocs, "sbuf"),
        psum_peak_bytes=metrics.peak_per_partition(trace.allocs, "psum"),
        params=params, _trace=trace, _schedule=sched)


profile = estimate  # `tilec.profile(trace)`: the package-level name of the same function


def write_timeline(est: Estimate, path: str, tl_map: dict[int, int] | None = None) -> None:
    from tilec.perf.timeline import write_timeline as write
    write(est, path, tl_map)


@functools.lru_cache(maxsize=None)
def _costs(target: str) -> Costs:
    return Costs(target_params(target))


def describe(ins: Instr) -> str:
    """One-line description of an instruction for hover text: op, shapes, dtypes, operands."""
    shape = f"[{ins.partitions}x{ins.free}]"
    extra = ""
    if ins.engine == "tensor":
        extra = f" K={ins.k} M={ins.m} N={ins.free}" + (" +=" if ins.accumulate else "")
    elif ins.engine == "dma":
        extra = f" {ins.bytes} B in {ins.dma_chunks or ins.partitions} chunks"
    dtypes = ",".join(ins.in_dtypes) + "->" + ins.out_dtype
    srcs = ",".join(f"{a.name}({a.memory})" for a in ins.reads)
    dsts = ",".join(f"{a.name}({a.memory})" for a in ins.writes)
    return f"{ins.op} {shape}{extra} {dtypes} {srcs} -> {dsts}"
