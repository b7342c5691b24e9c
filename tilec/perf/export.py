"""What `tilec profile` hands to people and tools: a Perfetto / Chrome trace-event JSON of the modelled timeline, the
headline (total time, what bounds the kernel) and the summary as JSON.

The trace follows the Trace Event Format (the JSON that ui.perfetto.dev and chrome://tracing open): one process for
the modelled NeuronCore, one thread (track) per compute engine and per DMA queue (the model's queue: one `dma_copy`
call site), a complete event ("ph": "X") per instruction with its description, kernel file:line and .tl line in
`args` (a DMA also names the hardware DMA engines it is spread over), and counter events ("ph": "C") giving
each engine's utilisation over fixed windows. Times are in microseconds, as the format requires; every number is
an estimate of the tilec model, and the process name says so.
"""
from __future__ import annotations

import json
from pathlib import Path

from tilec.perf.api import ENGINE_NAMES, Estimate, describe

PID = 1
ENGINE_TITLES = {"tensor": "TensorE", "vector": "VectorE", "scalar": "ScalarE", "gpsimd": "GpSimd", "dma": "DMA"}
COUNTER_WINDOWS = 200  # utilisation is sampled over this many equal windows of the kernel's run
BOUND_THRESHOLD = 0.6  # an engine busy at least this fraction of the run is what the kernel waits for


def trace_events(est: Estimate, tl_map: dict[int, int] | None = None) -> dict:
    """The trace-event JSON object (`{"traceEvents": [...], ...}`) of an estimate."""
    items = est.timeline
    lanes = [e for e in ENGINE_NAMES if any(it.lane == e for it in items)]
    lanes += sorted({it.lane for it in items} - set(ENGINE_NAMES))
    tid = {lane: i + 1 for i, lane in enumerate(lanes)}
    events: list[dict] = [_meta("process_name", 0, f"{est.kernel} on {est.target} (tilec model estimate)")]
    for lane, t in tid.items():
        events.append(_meta("thread_name", t, _lane_title(lane)))
        events.append({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": t, "args": {"sort_index": t}})
    engines = est._schedule.dma_engines  # per instruction, in trace order (as est.timeline): [first, last)
    for i, it in sorted(enumerate(items), key=lambda x: (x[1].start_ns, x[1].seq)):
        args: dict[str, object] = {"instruction": describe(it.instr), "kernel_line": f"{Path(it.file).name}:{it.line}",
                                   "seq": it.seq}
        if tl_map and it.line in tl_map:
            args["tl_line"] = tl_map[it.line]
        if engines[i][1] > engines[i][0]:
            args["dma_engines"] = f"{engines[i][0]}..{engines[i][1] - 1}"  # the hardware DMA engines it is spread on
        events.append({"ph": "X", "name": it.op, "cat": "dma" if it.lane.startswith("dma") else it.lane,
                       "pid": PID, "tid": tid[it.lane], "ts": it.start_ns / 1000.0,
                       "dur": (it.end_ns - it.start_ns) / 1000.0, "args": args})
    events += _utilisation_counters(est)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"kernel": est.kernel, "target": est.target, "total_us": est.total_us,
                          "source": "tilec performance model (estimated, not measured)"}}


def write_trace(est: Estimate, path: str | Path, tl_map: dict[int, int] | None = None) -> None:
    """Write the trace JSON to `path` (through a temporary file, so an interrupted write leaves nothing behind)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    try:
        with open(tmp, "w") as f:
            json.dump(trace_events(est, tl_map), f, separators=(",", ":"))
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def bound(est: Estimate) -> tuple[str, float]:
    """(what bounds the kernel, its busy fraction): the busiest engine or DMA when it is busy most of the run,
    else "latency" (dependences and DMA latency leave every engine idle much of the time)."""
    util = est.utilisation
    name, frac = max(util.items(), key=lambda kv: (kv[1], kv[0]))
    return (ENGINE_TITLES.get(name, name) if frac >= BOUND_THRESHOLD else "latency", frac)


def headline(est: Estimate) -> str:
    """The first lines of `tilec profile`: total time in µs, what bounds the kernel, the busy share of each unit."""
    what, frac = bound(est)
    busy = ", ".join(f"{ENGINE_TITLES[k]} {100 * v:.0f}%" for k, v in est.utilisation.items())
    if what == "latency":
        why = (f"latency-bound: no engine is busy more than {100 * frac:.0f}% of the run (waiting on dependences "
               f"and DMA latency)")
    else:
        why = f"bound by {what}: busy {100 * frac:.0f}% of the run"
    return (f"{est.kernel}: {est.total_us:.1f} us estimated on {est.target} (tilec model, not measured)\n"
            f"{why}\nbusy: {busy}; MFU {100 * est.mfu:.1f}%\n")


def summary_json(est: Estimate, tl_map: dict[int, int] | None = None) -> dict:
    """The profile as data, for `tilec profile --json`."""
    what, frac = bound(est)
    lines = [{"file": Path(f).name, "line": line, "busy_us": ns / 1000.0}
             for (f, line), ns in sorted(est.line_time_ns.items(), key=lambda kv: (-kv[1], kv[0]))]
    out: dict[str, object] = {
        "kernel": est.kernel, "target": est.target, "estimated": True, "total_us": est.total_us,
        "bound_by": what, "bound_busy_fraction": frac,
        "utilisation": dict(est.utilisation), "busy_us": {k: v / 1000.0 for k, v in est.busy_ns.items()},
        "mfu": est.mfu, "hfu": est.hfu, "mbu": est.mbu,
        "useful_flops": est.useful_flops, "hardware_flops": est.hardware_flops,
        "dma_transfer_count": est.dma_transfer_count, "dma_bytes": est.dma_bytes,
        "hbm_read_bytes": est.hbm_read_bytes, "hbm_write_bytes": est.hbm_write_bytes,
        "sbuf_peak_bytes_per_partition": est.sbuf_peak_bytes, "psum_peak_bytes_per_partition": est.psum_peak_bytes,
        "instruction_counts": dict(est.instr_counts), "kernel_lines": lines,
    }
    if tl_map:
        per_tl: dict[int, float] = {}
        for (_, line), ns in est.line_time_ns.items():
            if line in tl_map:
                per_tl[tl_map[line]] = per_tl.get(tl_map[line], 0.0) + ns
        out["tl_lines"] = [{"line": k, "busy_us": v / 1000.0} for k, v in sorted(per_tl.items(), key=lambda kv: -kv[1])]
    return out


def _meta(name: str, tid: int, value: str) -> dict:
    return {"ph": "M", "name": name, "pid": PID, "tid": tid, "args": {"name": value}}


def _lane_title(lane: str) -> str:
    if lane in ENGINE_TITLES:
        return ENGINE_TITLES[lane]
    return "DMA queue " + lane.removeprefix("dma ")


def _utilisation_counters(est: Estimate) -> list[dict]:
    """One counter track per engine (and DMA): the % of each window it was busy, the profiler's utilisation view."""
    total = est.total_ns
    if total <= 0:
        return []
    width = total / COUNTER_WINDOWS
    busy: dict[str, list[float]] = {}
    for it in est.timeline:
        key = "dma" if it.lane.startswith("dma") else it.lane
        _add_interval(busy.setdefault(key, [0.0] * COUNTER_WINDOWS), it.start_ns, it.end_ns, width)
    events = []
    for key, windows in busy.items():
        name = f"{ENGINE_TITLES.get(key, key)} utilisation %"
        for i, ns in enumerate(windows):
            # DMA transfers overlap on their queues: cap at 100% (busy = at least one transfer in flight, roughly)
            events.append({"ph": "C", "name": name, "pid": PID, "ts": i * width / 1000.0,
                           "args": {"busy": round(min(100.0, 100.0 * ns / width), 2)}})
        events.append({"ph": "C", "name": name, "pid": PID, "ts": total / 1000.0, "args": {"busy": 0.0}})
    return events


def _add_interval(windows: list[float], start: float, end: float, width: float) -> None:
    first, last = int(start // width), min(int(end // width), len(windows) - 1)
    for w in range(first, last + 1):
        lo, hi = max(start, w * width), min(end, (w + 1) * width)
        if hi > lo:
            windows[w] += hi - lo
