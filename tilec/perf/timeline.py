"""The timeline picture: a self-contained HTML page with one SVG lane per engine and per DMA queue.

Each instruction is a rectangle; hovering shows its `<title>`: op, shapes, dtypes, operands, kernel file:line and
its start/end. Long traces stay readable and small: on each lane, consecutive items of the same op and source line
that are narrower than a pixel and closer than a pixel are merged into one rectangle ("37 x nc_matmul ..."); if the
picture still holds more than MAX_RECTS rectangles, the rest are dropped and a note says how many.
"""
from __future__ import annotations

from html import escape
from pathlib import Path

WIDTH = 2400  # px of the time axis
LANE_H = 22
LABEL_W = 230
MAX_RECTS = 30000
COLORS = {"tensor": "#4e79a7", "vector": "#59a14f", "scalar": "#f28e2b", "gpsimd": "#b07aa1", "dma": "#9c755f"}
ENGINE_ORDER = ("tensor", "vector", "scalar", "gpsimd")


def lanes_of(items) -> list[str]:
    dma = sorted({it.lane for it in items if it.lane not in ENGINE_ORDER})
    used = {it.lane for it in items}
    return [e for e in ENGINE_ORDER if e in used] + dma


def merged_rects(items, scale: float) -> list[tuple[float, float, str, int, object]]:
    """(start, end, lane, count, first item) groups; tiny neighbours of the same op and line are merged."""
    by_lane: dict[str, list] = {}
    for it in items:
        by_lane.setdefault(it.lane, []).append(it)
    out = []
    for lane in sorted(by_lane):
        group = None
        for it in sorted(by_lane[lane], key=lambda x: (x.start_ns, x.seq)):
            tiny = (it.end_ns - it.start_ns) * scale < 1.0
            if (group and tiny and group[4].op == it.op and group[4].line == it.line
                    and (it.start_ns - group[1]) * scale < 1.0):
                group[1] = max(group[1], it.end_ns)
                group[3] += 1
                continue
            if group:
                out.append(tuple(group))
            group = [it.start_ns, it.end_ns, lane, 1, it]
        if group:
            out.append(tuple(group))
    return out


def write_timeline(est, path: str | Path, tl_map: dict[int, int] | None = None) -> None:
    """The picture; with `tl_map` (kernel line -> .tl line) each hover also names the .tl line."""
    items = est.timeline
    total = max(est.total_ns, 1.0)
    scale = WIDTH / total
    lanes = lanes_of(items)
    row = {lane: i for i, lane in enumerate(lanes)}
    rects = merged_rects(items, scale)
    dropped = max(0, len(rects) - MAX_RECTS)
    rects = sorted(rects, key=lambda r: (r[0], r[2]))[:MAX_RECTS]
    height = (len(lanes) + 2) * LANE_H
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL_W + WIDTH + 20}" height="{height}" '
           f'font-family="monospace" font-size="12">']
    startup = est.params.startup_ns.value
    if items and startup > 0:  # the modelled start-up before the first instruction
        svg.append(f'<rect x="{LABEL_W}" y="{LANE_H - 2}" width="{startup * scale:.2f}" height="{height - LANE_H}" '
                   f'fill="#f4f4f4"><title>kernel start-up: {startup / 1000:g} us before the first instruction '
                   f'(calibrated)</title></rect>')
    for lane, i in row.items():
        y = (i + 1) * LANE_H
        svg.append(f'<text x="4" y="{y + 15}">{escape(lane)}</text>'
                   f'<line x1="{LABEL_W}" x2="{LABEL_W + WIDTH}" y1="{y + LANE_H}" y2="{y + LANE_H}" stroke="#ddd"/>')
    svg.extend(_axis(total, scale, height))
    for start, end, lane, count, it in rects:
        x = LABEL_W + start * scale
        w = max((end - start) * scale, 0.5)
        y = (row[lane] + 1) * LANE_H + 2
        color = COLORS.get(lane if lane in COLORS else "dma")
        title = _title(it, start, end, count, tl_map or {})
        svg.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{LANE_H - 4}" fill="{color}">'
                   f'<title>{escape(title)}</title></rect>')
    svg.append("</svg>")
    note = f"<p>{dropped} more rectangles not drawn (picture capped at {MAX_RECTS}).</p>" if dropped else ""
    page = (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{escape(est.kernel)} timeline</title>"
            "<style>body{font-family:sans-serif} .wrap{overflow-x:auto}</style></head><body>\n"
            f"<h3>{escape(est.kernel)}: estimated {est.total_us:.3f} us on {escape(est.target)} "
            f"(tilec performance model, not a measurement)</h3>\n"
            f"<p>MFU {100 * est.mfu:.1f} %, HFU {100 * est.hfu:.1f} %, {est.dma_transfer_count} DMA transfers. "
            f"Hover a rectangle for the instruction and its kernel source line{' and .tl line' if tl_map else ''}."
            "</p>\n"
            f"{note}<div class=\"wrap\">\n" + "\n".join(svg) + "\n</div></body></html>\n")
    Path(path).write_text(page)


def _axis(total: float, scale: float, height: int) -> list[str]:
    step = _nice_step(total / 10)
    out, t = [], 0.0
    while t <= total:
        x = LABEL_W + t * scale
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{LANE_H - 4}" y2="{height}" stroke="#eee"/>'
                   f'<text x="{x + 2:.1f}" y="{LANE_H - 8}">{t / 1000:g} us</text>')
        t += step
    return out


def _nice_step(x: float) -> float:
    power = 1.0
    while power * 10 <= x:
        power *= 10
    for m in (1, 2, 5, 10):
        if m * power >= x:
            return m * power
    return 10 * power


def _title(it, start: float, end: float, count: int, tl_map: dict[int, int]) -> str:
    where = f"{Path(it.file).name}:{it.line}" if it.file else "?"
    if it.line in tl_map:
        where += f" (.tl line {tl_map[it.line]})"
    head = f"{count} x " if count > 1 else ""
    return f"{head}{it.detail}\n{where}\n{start / 1000:.3f} - {end / 1000:.3f} us"
