"""Text reports of an Estimate: the profiler-style summary, and time per source line (kernel and .tl).

`summary_text` follows `neuron-profile view --output-format summary-text`: one `key value` line per metric, keys in
alphabetical order, times in seconds. Every figure is a model estimate, and the first line says so.
"""
from __future__ import annotations

import re
from pathlib import Path

from tilec.perf.api import ENGINE_NAMES, Estimate


def summary_text(est: Estimate) -> str:
    total_s = est.total_ns * 1e-9
    rows: dict[str, str] = {
        "kernel_name": est.kernel,
        "latency_source": f"estimated (tilec performance model, target {est.target}; not measured)",
        "total_time": _sec(est.total_ns),
        "neuroncore_cycle_count": str(round(total_s * est.params.base_ghz.value * 1e9)),
        "dma_transfer_count": str(est.dma_transfer_count),
        "dma_transfer_total_bytes": str(est.dma_bytes),
        "dma_transfer_average_bytes": _num(est.dma_bytes / est.dma_transfer_count if est.dma_transfer_count else 0),
        "dma_active_time": _sec(est.busy_ns["dma"]),
        "dma_active_time_percent": _pct(est.utilisation["dma"]),
        "hbm_read_bytes": str(est.hbm_read_bytes),
        "hbm_write_bytes": str(est.hbm_write_bytes),
        "mfu_estimated_percent": _pct(est.mfu),
        "hfu_estimated_percent": _pct(est.hfu),
        "mbu_estimated_percent": _pct(est.mbu),
        "hardware_flops": str(est.hardware_flops),
        "model_flops": str(est.useful_flops),
        "sbuf_peak_bytes_per_partition": str(est.sbuf_peak_bytes),
        "psum_peak_bytes_per_partition": str(est.psum_peak_bytes),
    }
    counts = est.instr_counts
    for engine, name in ENGINE_NAMES.items():
        rows[f"{name}_active_time"] = _sec(est.busy_ns.get(engine, 0.0))
        rows[f"{name}_active_time_percent"] = _pct(est.utilisation.get(engine, 0.0))
        rows[f"{name}_instruction_count"] = str(sum(n for k, n in counts.items() if k.split(".")[0] == engine))
    for key, n in counts.items():
        rows[f"instruction_count_{key.replace('.', '_')}"] = str(n)
    return "".join(f"{k} {rows[k]}\n" for k in sorted(rows))


def line_report(est: Estimate, tl_map: dict[int, int] | None = None, top: int = 20) -> str:
    """Busy time per kernel source line (and per .tl line when `tl_map` maps kernel lines to .tl lines)."""
    lines = est.line_time_ns
    total = sum(lines.values()) or 1.0
    out = ["busy time by kernel source line (engine and DMA-queue time, summed over instructions):"]
    ranked = sorted(lines.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    for (file, line), ns in ranked:
        out.append(f"  {Path(file).name}:{line:<5d} {ns / 1000:12.3f} us {100 * ns / total:6.1f} %")
    if tl_map:
        per_tl: dict[int, float] = {}
        for (_, line), ns in lines.items():
            tl = tl_map.get(line)
            if tl is not None:
                per_tl[tl] = per_tl.get(tl, 0.0) + ns
        out.append("busy time by .tl source line:")
        for tl, ns in sorted(per_tl.items(), key=lambda kv: (-kv[1], kv[0]))[:top]:
            out.append(f"  line {tl:<5d} {ns / 1000:12.3f} us {100 * ns / total:6.1f} %")
    return "\n".join(out) + "\n"


TL_MARK = re.compile(r"#.*\btl:\s*(?:[\w./-]+:)?(\d+)")


def tl_line_map(kernel_source: str) -> dict[int, int]:
    """Generated-kernel line -> .tl line, from `# tl:LINE` (or `# tl: file.tl:LINE`) comments.

    A marked line maps to its mark; an unmarked line inherits the nearest mark above it, so a comment placed above a
    statement covers the statement's lines. Lines before the first mark map to nothing.
    """
    out: dict[int, int] = {}
    current: int | None = None
    for number, text in enumerate(kernel_source.splitlines(), start=1):
        m = TL_MARK.search(text)
        if m:
            current = int(m.group(1))
        if current is not None:
            out[number] = current
    return out


def _sec(ns: float) -> str:
    return f"{ns * 1e-9:.9f}"


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.2f}"


def _num(x: float) -> str:
    return f"{x:.1f}"
