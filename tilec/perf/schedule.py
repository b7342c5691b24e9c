"""List scheduling of a trace on the engines of one NeuronCore: one pass over the instructions in program order.

    compute instruction:  start = max(engine free, dependences ready, start-up);  the engine runs its stream in order
    DMA transfer:         its trigger issues once its dependences are ready and after the previous trigger of its
                          stream (a sequencer issues its triggers in program order; a transfer that depends on nothing
                          leads its stream instead); on each of its DMA engines it starts >= trigger + DMA latency
                          (semaphore-to-start), >= start-up, and after its queue's previous transfer on that engine
                          (each engine runs a queue in order; engines run in parallel), then it needs its occupancy
                          on each of its DMA engines (descriptors and bytes), taken from their idle time from there on:
                          streams share the engines round-robin per packet, so a transfer may use gaps left between
                          transfers placed earlier, split over several gaps; a transfer writing HBM completes (frees
                          its source, counts for the kernel's end) an HBM write acknowledgement after its last byte

DMA issue order (params.DMA_QUEUE, "engine" since fid15): a DMA is triggered by a control instruction in a
sequencer's instruction stream, issued in program order after its semaphore waits (v2.32.0 trainium_inferentia2_arch
.rst); a transfer goes to one queue ID on all 16 DMA engines, and "DMA transfers within a queue on the same DMA engine
are executed in order", queues being served round robin (v2.32.0 nki-dma-overview.rst, DMA Queues). So a trigger
waits for the stream's previous trigger, not for that transfer to start: a transfer on engines 8-15 does not wait for
one still queued behind busy engines 0-7. TILEC_MODEL_DMA_QUEUE=stream is the rule before fid15 (start no
earlier than the stream's previous transfer started, on any engine), kept as a what-if (docs/notes/fid15.md).

DMA trigger streams (`dma_streams`): a load issues on the stream of the engine that first reads what it loaded, a
store on the stream of the engine that produced what it stores [inferred: the queue is the compiler's choice; the
documents name the Sync engine (queues qSyncIO0...), ScalarE (HWDGE) and GpSimdE (SWDGE) as triggers]. On a stream a
DMA's trigger cannot issue before the one before it: in a tiny loop (calibration rows 1, 2, 4: load, load, compute,
store per iteration) the next iteration's loads wait behind this iteration's store, which waits for the compute, so
an iteration costs one DMA latency plus the compute (1.5-1.9 us measured); loads feeding TensorE in a conv (rows
9-12) are not held up by the stores of VectorE's results. There is no fixed engine time per transfer: the public
kernel behind rows 9-12 moves 3,552 DMAs beside 811 us of matmuls (see params.py). A DMA with no dependence at all
(its source never written, its destination untouched before and reusing no earlier buffer's memory) is ready when
the kernel starts, so the compiler's scheduler puts it at the head of its stream: it neither waits behind the stream
nor holds it up. That is why row 7 (two iterations of FREE_DIM 1000, 26 us) beats row 6 (one of 2000, 28 us): its
second iteration's loads go to the second rotation buffers and move during the first iteration's add; in rows 1, 2
and 4 only the first two iterations' loads are that free.

Why a DMA costs what it does: row 8 (1024x1024 fp32 transpose, 86 us) moves its 128 x 512 B tiles at 1.14 us per
tile, while the public conv moves 128 x 448 B row loads, the same shape, at more than 3 per us (2,664 beside its
matmuls in 824 us). The shape is not the difference, so no per-transfer engine cost or per-descriptor cost can fit
both (a fixed 450 ns per transfer puts the conv at 2.2 ms; a serial ~0.57 us per DMA issue, which fits rows 1, 2, 4
and 8 alone at 0.49-0.61 us per DMA, puts it at 1.5 ms or more). What differs is direction and what waits: row 8's
SBUF result tile (2 rotating buffers) can be rewritten only when the store reading it has completed, and a store
writes HBM, which acknowledges the writes one round trip after the last byte (`dma_write_ack_ns`, 650 ns fitted
[inferred: not documented]); a load completes when its bytes are in SBUF. Row 8's cycle copy -> store latency ->
transfer -> acknowledgement -> the copy two tiles later takes 0.24 + 1.15 + 0.21 + 0.65 us over 2 buffers = 1.13 us
per tile. The conv's row loads are loads into 16 renamed copies, and its few stores (one per output row) are off
TensorE's path; in rows 1, 2, 4 a result buffer is rewritten two iterations (~3 us) after its store began, later
than the acknowledgement (1.9 us). The acknowledgement orders nothing between DMAs: writes to HBM are ordered by
their queue, so a later DMA writing the same HBM waits for the data, not the ack.

A `memset` of a PSUM region whose next use is an accumulating `nc_matmul` into it (`acc = nl.zeros(...,
buffer=nl.psum)` then `acc += nc_matmul(...)`) takes no engine time: the hardware starts a PSUM accumulation group
by overwriting, so the compiler needs no separate zeroing. An SBUF memset whose engine the kernel left to the
compiler (`nl.zeros`, `nisa.memset` without engine=) runs on whichever of VectorE and GpSimdE is free first
[ISA1 memset], so it does not hold up the in-order VectorE behind its own dependences.

Buffers are rotated like the allocator does for tiles declared in a loop body: the k-th buffer allocated at a source
line reuses the memory of the (k-R)-th (R = `buffer_rotation`), so an instruction touching it waits until every
instruction touching the older one has finished. A buffer declared once and refilled whole by DMA loads (one load
buffer reused by many small DMAs of one call site, `renamed`) gets a fresh version per load, rotating through at most
`load_versions` copies, and only through as many as fit (`load_copies`): each copy is a whole buffer of SBUF, so the
copies, the kernel's other allocations live beside them and the rotation buffers of its loop tiles must fit in the
usable SBUF per partition (Target.sbuf_usable), as they must for the hardware compiler's allocator [ALLOC: every
tile is placed in the usable SBUF range; the renaming itself is inferred, see params.load_versions]. The rotation
buffers themselves are bounded by default ("fit", since rows13): a site gets its further buffers only while they
fit (`sbuf_plan`); TILEC_MODEL_SBUF_ROTATION=free (every site rotates through R buffers, fitting or not) is the
what-if (docs/notes/fid12.md, rows13.md). PSUM tiles rotate the same way but are placed in the 8 PSUM banks, a
tile per bank (`place_psum`, "fit" by default since fid14): where the sites' rotation buffers do not all fit,
a tile takes a free bank another site's tile held and waits until that tile has ended (TILEC_MODEL_PSUM_ROTATION=free
is the what-if without the banks: docs/notes/fid14.md).

Engines that must not access one memory at the same time (tilec/perf/conflicts.py, the Target's `exclusions`): on
trn1 (NeuronCore-v2) a VectorE instruction touching SBUF never overlaps a GpSimdE one, nor one of VectorE and one of
ScalarE both touching PSUM (ARCH2: the compiler serialises them); on trn2 (NeuronCore-v3) only VectorE and ScalarE
instructions touching the same PSUM bank are kept apart (ARCH3; that a collision serialises is inferred). Each such
instruction starts no earlier than the first gap in the other engine's intervals on the same memory or bank long
enough to hold it (TILEC_MODEL_ENGINE_ACCESS=off is the what-if without the rule). With the "exclusive" VectorE/GpSimdE
bus rule (TILEC_MODEL_SHARED_BUS=exclusive, params.py; off by default), a VectorE instruction in performance mode
(costs.gpsimd_bus) and a GpSimdE instruction are kept apart the same way (ARCH3: the two share an SBUF bus and the
hardware arbitrates; its cost is not documented).

TensorE instructions run under the Trn2 warm-up throttle (throttle.py): when TensorE work begins, or after its
utilization over a trailing 3 us window fell below 50 %, it may be busy at most half of the next 3 us; an instruction
past that allowance waits for the end of those 3 us.
"""
from __future__ import annotations

import dataclasses
import functools
from bisect import bisect_right
from dataclasses import dataclass
from typing import Callable

from tilec.perf.conflicts import Conflicts
from tilec.perf.costs import Costs
from tilec.perf.deps import DepTracker, hbm_rule as _hbm_rule
from tilec.perf.params import dma_queue as _dma_queue, engine_access as _engine_access, \
    psum_rotation as _psum_rotation, sbuf_rotation as _sbuf_rotation, shared_bus as _shared_bus
from tilec.perf.throttle import TensorThrottle
from tilec.trace import Access, Instr, Trace

EPS = 1e-6
MAX_INTERVALS = 4096  # per DMA engine; older ones become a floor (can only delay later transfers)


@dataclass(frozen=True)
class Schedule:
    start: list[float]  # ns, per instruction (trace order)
    end: list[float]  # a DMA writing HBM ends when acknowledged (`dma_write_ack_ns` after its last byte)
    lane: list[str]  # engine name, or DMA trigger stream "dma <engine>"
    dma_engines: list[tuple[int, int]]  # [first, last) DMA engines, (0, 0) for compute
    total_ns: float
    trigger: list[float] = dataclasses.field(default_factory=list)  # ns, per instruction: when a DMA's trigger
    #        issued on its stream (its dependences met, the stream's previous trigger issued; "stream" rule: its start
    #        less the DMA latency), a compute instruction's start


class DmaEngines:
    """Busy intervals of each DMA engine, sorted and merged when they touch."""

    def __init__(self, n: int) -> None:
        self.starts: list[list[float]] = [[] for _ in range(n)]
        self.ends: list[list[float]] = [[] for _ in range(n)]
        self.floor = [0.0] * n

    def place(self, t: float, d: float, e0: int, e1: int, after: dict[int, float] | None = None
              ) -> tuple[float, float, list[float]]:
        """Run a transfer needing `d` ns on each of engines e0..e1-1, from time t (on engine e no earlier than
        after[e]: the end of its queue's previous transfer there), in their idle gaps.

        Arbitration between queues is per packet, so a transfer may be spread over several gaps of an engine.
        Returns (first start, last end, the end on each engine e0..e1-1) and marks the used time busy.
        """
        first, last = float("inf"), t
        ends = []
        for e in range(e0, e1):
            pieces = self._fill(e, t if after is None else max(t, after.get(e, 0.0)), d)
            for s, f in pieces:
                self._insert(e, s, f)
            first, last = min(first, pieces[0][0]), max(last, pieces[-1][1])
            ends.append(pieces[-1][1])
        return first, last, ends

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


def rotation_predecessors(trace: Trace, depth: int, depths: dict[tuple[str, int], int] | None = None
                          ) -> dict[int, int]:
    """On-chip buffer -> the buffer whose memory it reuses: the one allocated `depth` allocations earlier at the same
    source line, if that one is dead (last touched) before the new one is allocated. `depths` (`sbuf_plan`): an SBUF
    site's own depth where fewer buffers fit."""
    sites: dict[tuple[str, int, str], list] = {}
    out: dict[int, int] = {}
    for a in sorted(trace.allocs, key=lambda a: (a.first_seq, a.buffer)):
        if a.memory == "hbm" or depth < 1:
            continue
        site = sites.setdefault((a.file, a.line, a.memory), [])
        n = depth if depths is None or a.memory != "sbuf" else max(1, min(depth, depths.get((a.file, a.line), depth)))
        if len(site) >= n and 0 <= site[-n].last_seq < a.first_seq:
            out[a.buffer] = site[-n].buffer
        site.append(a)
    return out


def psum_plan(trace: Trace, rotation: int, banks: int, bank_bytes: int) -> dict[int, tuple[int, ...]]:
    """PSUM buffer -> the buffers that held its banks before it (`place_psum`)."""
    return place_psum(trace, rotation, banks, bank_bytes)[0]


def place_psum(trace: Trace, rotation: int, banks: int, bank_bytes: int) -> tuple[dict[int, tuple[int, ...]], int]:
    """`psum_banks`'s first two answers."""
    out, used, _ = psum_banks(trace, rotation, banks, bank_bytes)
    return out, used


def psum_banks(trace: Trace, rotation: int, banks: int, bank_bytes: int
               ) -> tuple[dict[int, tuple[int, ...]], int, dict[int, list[int]]]:
    """(PSUM buffer -> the buffers that held its banks before it: its instructions wait until theirs have ended;
    the banks used, more than `banks` only for a kernel the interpreter refuses).

    The tiles are placed in program order (allocation order) in the `banks` banks of PSUM, each tile in
    ceil(bytes / bank_bytes) banks of its own (a tile cannot cross a bank and every PSUM tensor starts a bank:
    params.PSUM_ROTATION). A bank is free for a new tile once its last tile was last touched earlier in program
    order. A tile takes, in this order of preference: the banks of the tile `rotation` allocations earlier at its
    site (the site's rotation, as `rotation_predecessors`); else free banks no site will rotate back to, never used
    first, then the one whose tile was last touched earliest (the shortest wait); else, in the same order, free
    banks a site keeps for its rotation (that site loses a rotation buffer there: its next tile goes elsewhere).
    Where fewer free banks exist than a tile needs (a kernel the interpreter refuses, psum_bank_overflow), it gets
    banks beyond the `banks` (no wait); PSUM buffer -> its banks, in the order of its bytes)."""
    allocs = sorted((a for a in trace.allocs if a.memory == "psum"), key=lambda a: (a.first_seq, a.buffer))
    order = {a.buffer: n for n, a in enumerate(allocs)}
    sites: dict[tuple[str, int], list] = {}
    index: dict[int, tuple[tuple[str, int], int]] = {}
    for a in allocs:
        site = sites.setdefault((a.file, a.line), [])
        index[a.buffer] = ((a.file, a.line), len(site))
        site.append(a)
    occupant: list = [None] * banks
    held: dict[int, list[int]] = {}
    out: dict[int, tuple[int, ...]] = {}

    def wanted(b: int) -> int:
        """Allocation order of the tile that rotates back to bank b (-1: none yet to come)."""
        occ = occupant[b]
        if occ is None or rotation < 1:
            return -1
        key, i = index[occ.buffer]
        site = sites[key]
        return order[site[i + rotation].buffer] if i + rotation < len(site) else -1

    for n, a in enumerate(allocs):
        need = max(1, -(-a.bytes_per_partition // bank_bytes))
        free = [b for b in range(len(occupant)) if occupant[b] is None or occupant[b].last_seq < a.first_seq]
        key, i = index[a.buffer]
        chosen: list[int] = []
        if rotation >= 1 and i >= rotation:
            prev = sites[key][i - rotation]
            mine = held.get(prev.buffer, [])
            if len(mine) == need and all(b in free and occupant[b] is prev for b in mine):
                chosen = list(mine)
        if not chosen:
            chosen = sorted(free, key=lambda b: (wanted(b) > n, -1 if occupant[b] is None else occupant[b].last_seq))
            chosen = chosen[:need]
            while len(chosen) < need:  # more tiles live than PSUM holds
                occupant.append(None)
                chosen.append(len(occupant) - 1)
        before = tuple(dict.fromkeys(occupant[b].buffer for b in chosen if occupant[b] is not None))
        if before:
            out[a.buffer] = before
        for b in chosen:
            occupant[b] = a
        held[a.buffer] = chosen
    return out, sum(occ is not None for occ in occupant), held


def _whole_loads(trace: Trace) -> dict[int, int]:
    """On-chip buffer -> how many DMAs overwrite it whole (reading nothing of it): the buffers `renamed` versions."""
    whole = {a.buffer: (a.partitions, a.bytes_per_partition) for a in trace.allocs if a.memory != "hbm"}
    out: dict[int, int] = {}
    for ins in trace.instrs:
        if ins.engine == "dma" and len(ins.writes) == 1:
            w = ins.writes[0]
            size = whole.get(w.buffer)
            if size is not None and (w.p0, w.p1, w.lo, w.hi) == (0, size[0], 0, size[1]) and \
                    all(r.buffer != w.buffer for r in ins.reads):
                out[w.buffer] = out.get(w.buffer, 0) + 1
    return out


@dataclass
class _Site:
    """One SBUF allocation site (source line): its span [first allocation, last use], its allocations, their
    largest size, and the most of its bytes live at once in the trace (a list of tiles kept alive together)."""
    first: int
    last: int
    count: int
    size: int
    live: int

    def bytes(self, buffers: int) -> int:
        return max(min(self.count, buffers) * self.size, self.live)


def _sites(trace: Trace) -> dict[tuple[str, int], _Site]:
    groups: dict[tuple[str, int], list] = {}
    for a in trace.allocs:
        if a.memory == "sbuf":
            groups.setdefault((a.file, a.line), []).append(a)
    return {key: _Site(min(a.first_seq for a in allocs), max(max(a.last_seq, a.first_seq) for a in allocs),
                       len(allocs), max(a.bytes_per_partition for a in allocs), _live_peak(allocs))
            for key, allocs in sorted(groups.items())}


def _live_peak(allocs: list) -> int:
    events = sorted([(a.first_seq, a.bytes_per_partition) for a in allocs] +
                    [(max(a.last_seq, a.first_seq) + 1, -a.bytes_per_partition) for a in allocs],
                    key=lambda e: (e[0], e[1]))
    peak = cur = 0
    for _, delta in events:
        cur += delta
        peak = max(peak, cur)
    return peak


class _Profile:
    """SBUF bytes per partition over the trace, piecewise constant between the sites' span ends."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        self.cuts = sorted({s for s, _ in spans} | {f + 1 for _, f in spans})
        self.use = [0] * len(self.cuts)  # from cuts[i] to cuts[i + 1]

    def range(self, first: int, last: int) -> tuple[int, int]:
        return bisect_right(self.cuts, first) - 1, bisect_right(self.cuts, last)

    def peak(self, first: int, last: int) -> int:
        i0, i1 = self.range(first, last)
        return max(self.use[i0:i1], default=0)

    def add(self, first: int, last: int, size: int) -> None:
        i0, i1 = self.range(first, last)
        for i in range(i0, i1):
            self.use[i] += size


def sbuf_plan(trace: Trace, rotation: int, depth: int, usable: int, bound_rotation: bool = False
              ) -> tuple[dict[tuple[str, int], int], dict[int, int]]:
    """(SBUF site -> rotation buffers, buffer refilled whole by DMA -> copies), within `usable` bytes per partition.

    Every site first gets the buffers its trace needs at once (one per allocation live together: what the kernel
    itself allocates). With `bound_rotation`, the further buffers of rotating loop tiles (up to `rotation` per site)
    are then granted one at a time to each site in turn, in allocation order, while they fit over the site's span;
    without it (the default) every site rotates through `rotation` buffers whether they fit or not (that budget is
    not checked: docs/notes/fid12.md). Then the copies of each buffer refilled whole by DMA (`renamed`, up to
    `depth`, never more than its loads) are granted the same way in the room left."""
    sites = _sites(trace)
    loads = _whole_loads(trace)
    bufs = sorted((a for a in trace.allocs if a.memory == "sbuf" and loads.get(a.buffer, 0) > 1),
                  key=lambda a: (a.first_seq, a.buffer))
    start = 1 if bound_rotation else max(1, rotation)
    depths = {key: start for key in sites}
    prof = _Profile([(site.first, site.last) for site in sites.values()])
    for key, site in sites.items():
        prof.add(site.first, site.last, site.bytes(start))
    if bound_rotation:
        grew = True
        while grew:
            grew = False
            for key, site in sites.items():
                n = depths[key]
                extra = site.bytes(n + 1) - site.bytes(n)
                if n < min(rotation, site.count) and prof.peak(site.first, site.last) + extra <= usable:
                    depths[key] = n + 1
                    prof.add(site.first, site.last, extra)
                    grew = True
    copies = {a.buffer: 1 for a in bufs}
    if depth > 1:
        grew = True
        while grew:
            grew = False
            for a in bufs:
                last = max(a.last_seq, a.first_seq)
                if copies[a.buffer] < min(depth, loads[a.buffer]) and \
                        prof.peak(a.first_seq, last) + a.bytes_per_partition <= usable:
                    copies[a.buffer] += 1
                    prof.add(a.first_seq, last, a.bytes_per_partition)
                    grew = True
    return depths, copies


def sbuf_footprint(trace: Trace, rotation: int) -> list[tuple[int, int, int]]:
    """(first seq, last seq, bytes per partition) per SBUF allocation site with `rotation` buffers: what the model's
    rotation needs (a site holds min(allocations, rotation) buffers of its largest size over its span, or more if
    more of them are live at once)."""
    return sorted((site.first, site.last, site.bytes(max(1, rotation))) for site in _sites(trace).values())


def load_copies(trace: Trace, depth: int, rotation: int, usable: int) -> dict[int, int]:
    """Buffer refilled whole by DMA -> the copies `renamed` may rotate it through: up to `depth`, as many as fit
    beside every site's rotation buffers (`sbuf_plan`). A buffer that gets 1 copy is not renamed: its next load
    waits for the readers of the previous value."""
    return sbuf_plan(trace, rotation, depth, usable)[1]


def renamed(trace: Trace, depth: int, copies: dict[int, int] | None = None) -> tuple[list[Instr], dict[int, int]]:
    """Give each whole-buffer DMA load of an on-chip buffer its own version of the buffer, as the allocator does.

    A kernel that loads every input row into one buffer declared before its loops (`X_sbuf`, refilled by one
    `dma_copy` per row and read by that row's matmuls) measured TensorE-bound on the hardware (calibration rows 9-12
    with xaviergonzalez/asst4-trainium2 conv2d.py: 824 us fp16, matmuls back to back), so the next row's load does
    not wait for the previous row's readers: a DMA overwriting the whole buffer starts a new value, which the compiler
    places in a fresh copy (renaming the anti dependence away), rotating through `depth` copies per buffer like tiles
    allocated in a loop body. Returns the instructions with accesses renamed and, per new version, the version whose
    memory it reuses (the rotation predecessor). `copies` (`load_copies`): per buffer, fewer copies than `depth`
    where fewer fit in SBUF."""
    if depth < 1:
        return trace.instrs, {}
    whole = {a.buffer: (a.partitions, a.bytes_per_partition) for a in trace.allocs if a.memory != "hbm"}
    current: dict[int, int] = {}  # buffer -> its current version id
    versions: dict[int, list[int]] = {}
    reuses: dict[int, int] = {}
    next_id = max((a.buffer for a in trace.allocs), default=0) + 1
    for ins in trace.instrs:
        for a in ins.reads + ins.writes:
            next_id = max(next_id, a.buffer + 1)
    out = []
    for ins in trace.instrs:
        reads = _rename(ins.reads, current)
        if ins.engine == "dma" and len(ins.writes) == 1:
            w = ins.writes[0]
            size = whole.get(w.buffer)
            if size is not None and (w.p0, w.p1, w.lo, w.hi) == (0, size[0], 0, size[1]) and \
                    all(r.buffer != w.buffer for r in ins.reads):
                chain = versions.setdefault(w.buffer, [w.buffer])
                if len(chain) > 1 or w.buffer in current:  # the first load keeps the buffer's own id
                    chain.append(next_id)
                    current[w.buffer] = next_id
                    next_id += 1
                    n = depth if copies is None else max(1, min(depth, copies.get(w.buffer, depth)))
                    if len(chain) > n:
                        reuses[chain[-1]] = chain[-1 - n]
                else:
                    current[w.buffer] = w.buffer
        writes = _rename(ins.writes, current)
        out.append(ins if reads is ins.reads and writes is ins.writes else
                   dataclasses.replace(ins, reads=reads, writes=writes))
    return out, reuses


def _rename(accesses: tuple[Access, ...], current: dict[int, int]) -> tuple[Access, ...]:
    if not any(a.buffer in current and current[a.buffer] != a.buffer for a in accesses):
        return accesses
    return tuple(dataclasses.replace(a, buffer=current.get(a.buffer, a.buffer)) for a in accesses)


def _in_sbuf(ins: Instr) -> bool:
    return bool(ins.writes) and all(w.memory == "sbuf" for w in ins.writes)


def dma_streams(instrs: list[Instr]) -> dict[int, str]:
    """DMA instruction -> the trigger stream it issues on: the engine the kernel named (NKI 0.6 `dge_mode=hwdge,
    engine=nisa.engine.sync` or `.scalar`: "engine= picks the HWDGE trigger", ISA6 v2.32.0 dma_copy), else a load on
    the stream of the engine that first reads what it wrote, a store on the stream of the engine that last wrote what
    it reads ("sync" when there is none)."""
    last_writer: dict[int, str] = {}
    pending: dict[int, list[int]] = {}  # buffer -> loads waiting for their first reader
    out: dict[int, str] = {}
    for i, ins in enumerate(instrs):
        if ins.engine == "dma" and ins.attr("trigger"):  # an NKI 0.6 dma_copy naming its HWDGE trigger engine
            out[i] = str(ins.attr("trigger"))
        elif ins.engine == "dma":
            src = next((a for a in ins.reads if a.memory != "hbm"), None)
            if src is not None:
                out[i] = last_writer.get(src.buffer, "sync")
            for w in ins.writes:
                if w.memory != "hbm":
                    pending.setdefault(w.buffer, []).append(i)
                    out.setdefault(i, "sync")
            if i not in out:
                out[i] = "sync"
        else:
            for r in ins.reads:
                for j in pending.pop(r.buffer, ()):
                    if out.get(j) == "sync" and not any(a.memory != "hbm" for a in instrs[j].reads):
                        out[j] = ins.engine
        for w in ins.writes:
            last_writer[w.buffer] = ins.engine
    return out


def last_accesses(instrs: list[Instr], streams: dict[int, str], folded: set[int]
                  ) -> tuple[dict[int, dict[str, int]], dict[int, dict[str, int]]]:
    """Per buffer, per clock (compute engine, "dma <stream>", "folded"), the index of the last instruction on that
    clock touching it, and of the last writing it (`schedule`'s frontier). A memset whose engine the compiler picks
    counts for both VectorE and GpSimdE."""
    use: dict[int, dict[str, int]] = {}
    write: dict[int, dict[str, int]] = {}
    for i, ins in enumerate(instrs):
        if i in folded:
            clocks: tuple[str, ...] = ("folded",)
        elif ins.engine == "dma":
            clocks = ("dma " + streams[i],)
        elif ins.op == "memset" and ins.attr("engine_choice") and _in_sbuf(ins):
            clocks = ("vector", "gpsimd")
        else:
            clocks = (ins.engine,)
        for a in ins.reads:
            for c in clocks:
                use.setdefault(a.buffer, {})[c] = i
        for a in ins.writes:
            for c in clocks:
                use.setdefault(a.buffer, {})[c] = i
                write.setdefault(a.buffer, {})[c] = i
    return use, write


def conflicts(costs: Costs, held: dict[int, list[int]], shared_bus: str | None = None,
              engine_access: str | None = None) -> Conflicts:
    """The engine access rules of the schedule: the target's exclusions (params.ENGINE_ACCESS) and the shared-bus
    what-if. `held`: PSUM buffer -> its banks (`psum_banks`); a buffer not placed (the "free" PSUM rule) is a bank
    of its own per bank-sized part."""
    bank_bytes = costs.psum_bank

    def banks(a: Access) -> tuple[object, ...]:
        parts = range(a.lo // bank_bytes, max(a.lo, a.hi - 1) // bank_bytes + 1)
        mine = held.get(a.buffer)
        if mine is None:
            return tuple(("tile", a.buffer, i) for i in parts)
        return tuple(mine[min(i, len(mine) - 1)] for i in parts)

    rules = costs.p.exclusions if _engine_access(engine_access) == "serial" else ()
    bus = None
    if _shared_bus(shared_bus) == "exclusive":
        def bus(ins: Instr, engine: str) -> bool:
            return engine == "gpsimd" or (engine == "vector" and costs.gpsimd_bus(ins))
    return Conflicts(rules, banks, bus)


def schedule(trace: Trace, costs: Costs, hbm_rule: str | None = None, shared_bus: str | None = None,
             sbuf_rotation: str | None = None, psum_rotation: str | None = None, dma_queue: str | None = None,
             engine_access: str | None = None) -> Schedule:
    """`hbm_rule`: how HBM dependences are tracked, "range" (the default) or "pattern" (tilec/perf/deps.py).
    `shared_bus`: "off" (the default) or "exclusive", VectorE's performance mode against GpSimdE (params.py).
    `sbuf_rotation`: "fit" (the default) or "free", whether loop tiles' rotation buffers must fit in SBUF
    (params.py). `psum_rotation`: "fit" (the default) or "free", whether PSUM tiles and their rotation buffers must
    be placed in the PSUM banks (`psum_plan`, params.py). `dma_queue`: "engine" (the default) or "stream", how a
    DMA transfer is ordered behind the earlier ones of its trigger stream (params.DMA_QUEUE, the module docstring).
    `engine_access`: "serial" (the default) or "off", whether the target's engine pairs that must not touch one
    memory (or PSUM bank) at the same time are kept apart (params.ENGINE_ACCESS, tilec/perf/conflicts.py)."""
    n = len(trace.instrs)
    start, end, lane, triggers = [0.0] * n, [0.0] * n, [""] * n, [0.0] * n
    dma_engines: list[tuple[int, int]] = [(0, 0)] * n
    slots = DmaEngines(costs.n_dma)
    hbm = DmaEngines(1)  # the core's HBM bandwidth: each DMA's HBM time (costs.hbm_ns) in its gaps, from its start
    queue_end: dict[str, dict[int, float]] = {}  # per trigger stream and DMA engine: the end of its latest transfer
    by_engine = _dma_queue(dma_queue) == "engine"
    startup, latency = costs.startup, costs.dma_latency
    folded = folded_memsets(trace)
    bound = _sbuf_rotation(sbuf_rotation) == "fit"
    depths, copies = sbuf_plan(trace, costs.rotation, costs.load_versions, costs.sbuf_usable, bound)
    reuses = rotation_predecessors(trace, costs.rotation, depths if bound else None)
    banked: dict[int, tuple[int, ...]] = {}
    held: dict[int, list[int]] = {}
    if _psum_rotation(psum_rotation) == "fit":
        banked, _, held = psum_banks(trace, costs.rotation, costs.psum_banks, costs.psum_bank)
        psum = {a.buffer for a in trace.allocs if a.memory == "psum"}
        reuses = {b: p for b, p in reuses.items() if b not in psum}
    instrs, versions = renamed(trace, costs.load_versions, copies)
    streams = dma_streams(instrs)
    reuses.update(versions)
    engine_free = {"tensor": 0.0, "vector": 0.0, "scalar": 0.0, "gpsimd": 0.0}
    issued: dict[str, float] = {}  # per trigger stream: when its sequencer is free to issue the next HWDGE DMA
    queue_start: dict[str, float] = {}  # per trigger stream: its latest trigger ("engine") or transfer start ("stream")
    now = [0]  # the index of the instruction being scheduled
    clocks: dict[str, Callable[[], float]] = {"folded": lambda: startup}
    for e in engine_free:
        clocks[e] = functools.partial(engine_free.__getitem__, e)
    for stream in set(streams.values()):
        q = "dma " + stream
        clocks[q] = functools.partial(queue_start.get, q, 0.0) if by_engine else \
            functools.partial(lambda q: max(queue_start.get(q, 0.0), startup) - latency, q)
    last_use, last_write = last_accesses(instrs, streams, folded)

    def frontier(buffer: int, writers: bool) -> float:
        """The earliest floor a later instruction touching `buffer` (writing it, for its readers' list) can get: its
        engine's clock, its trigger stream's latest trigger (a DMA that depends on nothing touches no tracked entry),
        start-up for a folded memset. Clocks only advance, so this holds for every later instruction."""
        i = now[0]
        return min((clocks[c]() for c, j in (last_use if writers else last_write).get(buffer, {}).items() if j > i),
                   default=float("inf"))

    deps = DepTracker({a.buffer for ins in instrs for a in ins.writes}, by_pattern=_hbm_rule(hbm_rule) == "pattern",
                      frontier=frontier)
    last_end: dict[int, float] = {}  # per buffer, the latest end of an instruction touching it
    throttle = TensorThrottle(*costs.throttle)
    apart = conflicts(costs, held, shared_bus, engine_access)
    for i, ins in enumerate(instrs):
        now[0] = i
        engine = ins.engine
        accesses = ins.reads + ins.writes
        reuse = ack = trigger = 0.0
        for a in accesses:  # a buffer reusing an earlier one's memory waits until that one is done
            p = reuses.get(a.buffer)
            if p is not None and last_end.get(p, 0.0) > reuse:
                reuse = last_end[p]
            for p in banked.get(a.buffer, ()):  # the PSUM banks it is placed in were another tile's
                reuse = max(reuse, last_end.get(p, 0.0))
        if i in folded:
            q, d = engine, 0.0
            t = deps.ready(ins.reads, ins.writes, max(reuse, startup))
        elif engine == "dma":
            q = "dma " + streams[i]
            e0, e1 = costs.dma_engines(ins)
            d = costs.dma_occupancy_ns(ins, e1 - e0)
            ready = deps.ready(ins.reads, ins.writes, reuse)
            # depends on nothing (nor on an entry the tracker dropped): the compiler puts it at the head of its stream
            leads = ready <= 0.0 and not deps.touched(ins.reads, ins.writes)
            if by_engine:  # the trigger issues after the stream's previous trigger; each engine runs its queue in order
                trigger = max(ready, 0.0) if leads else max(ready, queue_start.get(q, 0.0))
                if ins.attr("trigger"):  # a named HWDGE trigger: one issue at a time on its sequencer
                    trigger = max(trigger, issued.get(q, 0.0))
                    issued[q] = trigger + costs.hwdge_issue
                after = None if leads else queue_end.setdefault(q, {})
                t, t_end, ends = slots.place(max(trigger + latency, startup), d, e0, e1, after)
                if after is not None:
                    queue_start[q] = trigger
                    after.update(zip(range(e0, e1), ends))
            else:  # "stream": no earlier than the start of the stream's previous transfer, on any engine
                t = max(ready + latency, startup, 0.0 if leads else queue_start.get(q, 0.0))
                t, t_end, _ = slots.place(t, d, e0, e1)
                trigger = max(0.0, t - latency)
                if not leads:
                    queue_start[q] = t
            t_end = max(t_end, hbm.place(t, costs.hbm_ns(ins), 0, 1)[1])  # not before its HBM bytes have moved
            d = t_end - t  # spread over gaps, a transfer can take longer than its occupancy
            if any(w.memory == "hbm" for w in ins.writes):
                ack = costs.dma_write_ack  # complete once HBM acknowledged the writes
            dma_engines[i] = (e0, e1)
        else:
            q = engine
            if ins.op == "memset" and ins.attr("engine_choice") and _in_sbuf(ins):
                q = min(("vector", "gpsimd"), key=engine_free.__getitem__)  # the compiler picks the idle one
            d = costs.compute_ns(ins)
            t = deps.ready(ins.reads, ins.writes, max(reuse, startup, engine_free.get(q, 0.0)))
            if engine == "tensor":
                t = throttle.start(t, d)
            else:
                t = apart.place(ins, q, t, d)
            engine_free[q] = t + d
        done = t + d + ack
        start[i], end[i], lane[i] = t, done, q
        triggers[i] = trigger if engine == "dma" and i not in folded else t
        if ack:  # the SBUF source is released at completion; HBM writes are ordered by the queue, not the ack
            deps.record((), ins.writes, t + d)
            deps.record(ins.reads, (), done)
        else:
            deps.record(ins.reads, ins.writes, done)
        for a in accesses:
            if last_end.get(a.buffer, 0.0) < done:
                last_end[a.buffer] = done
    total = max(end, default=0.0)
    return Schedule(start, end, lane, dma_engines, max(total, startup if n else 0.0), triggers)
