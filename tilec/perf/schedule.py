"""List scheduling of a trace on the engines of one NeuronCore: one pass over the instructions in program order.

    compute instruction:  start = max(engine free, dependences ready, start-up);  the engine runs its stream in order
    DMA transfer:         start >= dependences ready + DMA latency (semaphore-to-start), >= start-up,
                          >= the previous transfer's start on the same queue (queues run in order),
                          then it needs its occupancy on each of its DMA engines, taken from their idle time
                          from there on: queues share the engines round-robin per packet, so a transfer may use
                          gaps left between transfers placed earlier, split over several gaps

A `memset` of a PSUM region whose next use is an accumulating `nc_matmul` into it (`acc = nl.zeros(...,
buffer=nl.psum)` then `acc += nc_matmul(...)`) takes no engine time: the hardware starts a PSUM accumulation group
by overwriting, so the compiler needs no separate zeroing. Without this rule the in-order VectorE would hold every
output row's matmuls behind the previous row's PSUM evacuation, which the measured conv (rows 9-12: TensorE busy
back to back, 103 ns per matmul) rules out.

Buffers are rotated like the allocator does for tiles declared in a loop body: the k-th buffer allocated at a source
line reuses the memory of the (k-R)-th (R = `buffer_rotation`, fitted: 3), so an instruction touching it waits until
every instruction touching the older one has finished. Without it, loads would run arbitrarily far ahead of compute
(the interpreter gives every allocation a fresh buffer id).

TensorE instructions run under the Trn2 warm-up throttle (throttle.py): when TensorE work begins, or after its
utilization over a trailing 3 us window fell below 50 %, it may be busy at most half of the next 3 us; an instruction
past that allowance waits for the end of those 3 us.

A DMA queue is one `dma_copy` call site (kernel file:line): the compiler gives each DMA instruction its queue, and a
load that is ready early is not held up by a store of the same loop that waits for compute.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from tilec.perf.costs import Costs
from tilec.perf.deps import DepTracker
from tilec.perf.throttle import TensorThrottle
from tilec.trace import Trace

EPS = 1e-6
MAX_INTERVALS = 4096  # per DMA engine; older ones become a floor (can only delay later transfers)


@dataclass(frozen=True)
class Schedule:
    start: list[float]  # ns, per instruction (trace order)
    end: list[float]
    lane: list[str]  # engine name, or DMA queue "dma <file>:<line>"
    dma_engines: list[tuple[int, int]]  # [first, last) DMA engines, (0, 0) for compute
    total_ns: float


class DmaEngines:
    """Busy intervals of each DMA engine, sorted and merged when they touch."""

    def __init__(self, n: int) -> None:
        self.starts: list[list[float]] = [[] for _ in range(n)]
        self.ends: list[list[float]] = [[] for _ in range(n)]
        self.floor = [0.0] * n

    def place(self, t: float, d: float, e0: int, e1: int) -> tuple[float, float]:
        """Run a transfer needing `d` ns on each of engines e0..e1-1, from time t, in their idle gaps.

        Arbitration between queues is per packet, so a transfer may be spread over several gaps of an engine.
        Returns (first start, last end) and marks the used time busy.
        """
        first, last = float("inf"), t
        for e in range(e0, e1):
            pieces = self._fill(e, t, d)
            for s, f in pieces:
                self._insert(e, s, f)
            first, last = min(first, pieces[0][0]), max(last, pieces[-1][1])
        return first, last

    def _fill(self, e: int, t: float, d: float) -> list[tuple[float, float]]:
        t = max(t, self.floor[e])
        starts, ends = self.starts[e], self.ends[e]
        i = bisect_right(starts, t) - 1
        if i >= 0 and ends[i] > t + EPS:
            t = ends[i]
        i += 1
        pieces = []
        while d > EPS:
            gap_end = starts[i] if i < len(starts) else float("inf")
            if gap_end - t > EPS:
                use = min(d, gap_end - t)
                pieces.append((t, t + use))
                d -= use
            if i < len(starts):
                t = max(t, ends[i])
            i += 1
        return pieces or [(t, t)]

    def _insert(self, e: int, s: float, f: float) -> None:
        starts, ends = self.starts[e], self.ends[e]
        i = bisect_right(starts, s)
        if i > 0 and ends[i - 1] >= s - EPS:  # touches the previous interval: extend it
            i -= 1
            ends[i] = max(ends[i], f)
        else:
            starts.insert(i, s)
            ends.insert(i, f)
        while i + 1 < len(starts) and starts[i + 1] <= ends[i] + EPS:  # swallow following touching intervals
            ends[i] = max(ends[i], ends[i + 1])
            del starts[i + 1], ends[i + 1]
        if len(starts) > MAX_INTERVALS:
            half = MAX_INTERVALS // 2
            self.floor[e] = max(self.floor[e], ends[half - 1])
            del starts[:half], ends[:half]


def folded_memsets(trace: Trace) -> set[int]:
    """Indices of PSUM memsets whose region is next touched by an accumulating matmul writing it."""
    pending: dict[int, int] = {}  # PSUM buffer -> index of its latest memset not yet followed by a use
    folded = set()
    for i, ins in enumerate(trace.instrs):
        for a in ins.reads + ins.writes:
            j = pending.pop(a.buffer, None)
            if j is not None and ins.op == "nc_matmul" and any(w.buffer == a.buffer for w in ins.writes):
                folded.add(j)
        if ins.op == "memset" and ins.writes and all(w.memory == "psum" for w in ins.writes):
            for w in ins.writes:
                pending[w.buffer] = i
    return folded


def rotation_predecessors(trace: Trace, depth: int) -> dict[int, int]:
    """On-chip buffer -> the buffer whose memory it reuses: the one allocated `depth` allocations earlier at the same
    source line, if that one is dead (last touched) before the new one is allocated."""
    sites: dict[tuple[str, int, str], list] = {}
    out: dict[int, int] = {}
    for a in sorted(trace.allocs, key=lambda a: (a.first_seq, a.buffer)):
        if a.memory == "hbm" or depth < 1:
            continue
        site = sites.setdefault((a.file, a.line, a.memory), [])
        if len(site) >= depth and 0 <= site[-depth].last_seq < a.first_seq:
            out[a.buffer] = site[-depth].buffer
        site.append(a)
    return out


def schedule(trace: Trace, costs: Costs) -> Schedule:
    n = len(trace.instrs)
    start, end, lane = [0.0] * n, [0.0] * n, [""] * n
    dma_engines: list[tuple[int, int]] = [(0, 0)] * n
    deps = DepTracker({a.buffer for ins in trace.instrs for a in ins.writes})
    slots = DmaEngines(costs.n_dma)
    engine_free = {"tensor": 0.0, "vector": 0.0, "scalar": 0.0, "gpsimd": 0.0}
    queue_start: dict[str, float] = {}
    queue_names: dict[tuple[str, int], str] = {}
    startup, latency = costs.startup, costs.dma_latency
    folded = folded_memsets(trace)
    reuses = rotation_predecessors(trace, costs.rotation)
    last_end: dict[int, float] = {}  # per buffer, the latest end of an instruction touching it
    throttle = TensorThrottle(*costs.throttle)
    for i, ins in enumerate(trace.instrs):
        engine = ins.engine
        accesses = ins.reads + ins.writes
        reuse = 0.0
        for a in accesses:  # a buffer reusing an earlier one's memory waits until that one is done
            p = reuses.get(a.buffer)
            if p is not None and last_end.get(p, 0.0) > reuse:
                reuse = last_end[p]
        if i in folded:
            q, d = engine, 0.0
            t = deps.ready(ins.reads, ins.writes, max(reuse, startup))
        elif engine == "dma":
            q = queue_names.get((ins.file, ins.line))
            if q is None:
                q = queue_names[(ins.file, ins.line)] = f"dma {ins.file.rsplit('/', 1)[-1]}:{ins.line}"
            e0, e1 = costs.dma_engines(ins)
            d = costs.dma_occupancy_ns(ins, e1 - e0)
            t = max(deps.ready(ins.reads, ins.writes, reuse) + latency, startup, queue_start.get(q, 0.0))
            t, t_end = slots.place(t, d, e0, e1)
            d = t_end - t  # spread over gaps, a transfer can take longer than its occupancy
            queue_start[q] = t
            dma_engines[i] = (e0, e1)
        else:
            q = engine
            d = costs.compute_ns(ins)
            t = deps.ready(ins.reads, ins.writes, max(reuse, startup, engine_free.get(q, 0.0)))
            if engine == "tensor":
                t = throttle.start(t, d)
            engine_free[q] = t + d
        start[i], end[i], lane[i] = t, t + d, q
        deps.record(ins.reads, ins.writes, t + d)
        for a in accesses:
            if last_end.get(a.buffer, 0.0) < t + d:
                last_end[a.buffer] = t + d
    total = max(end, default=0.0)
    return Schedule(start, end, lane, dma_engines, max(total, startup if n else 0.0))
