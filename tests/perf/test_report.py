"""The timeline picture and source-line reports."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from tilec.perf.api import estimate, write_timeline
from tilec.perf.report import line_report, tl_line_map
from tilec.perf.tracebuild import TraceBuilder


def small_trace():
    b = TraceBuilder("small", file="/tmp/k.py")
    x_hbm, out = b.buffer("x", "hbm", 1, 128 * 1024), b.buffer("out", "hbm", 1, 128 * 1024)
    x, y = b.buffer("x_sb", "sbuf", 128, 1024), b.buffer("y_sb", "sbuf", 128, 1024)
    b.dma(b.at(x), b.at(x_hbm), 128, 128 * 1024, line=7)
    b.compute("vector", "tensor_scalar", [b.at(x)], [b.at(y)], 128, 256, line=8)
    b.dma(b.at(out), b.at(y), 128, 128 * 1024, line=9)
    return b.trace


def svg_of(path) -> ET.Element:
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    svg = text[text.index("<svg"):text.index("</svg>") + len("</svg>")]
    return ET.fromstring(svg)  # well-formed XML, or this raises


def test_timeline_has_one_lane_per_engine_and_queue_and_hover_text(tmp_path):
    path = tmp_path / "t.html"
    write_timeline(estimate(small_trace()), str(path))
    svg = svg_of(path)
    ns = "{http://www.w3.org/2000/svg}"
    rects = svg.findall(f"{ns}rect")
    labels = [t.text for t in svg.findall(f"{ns}text") if t.text and "us" not in t.text]
    assert labels == ["vector", "dma vector"]  # one trigger stream: the load VectorE reads, the store of its result
    titles = [r.find(f"{ns}title").text for r in rects]
    assert titles[0].startswith("kernel start-up")  # a shaded band, then one rectangle per instruction
    titles = titles[1:]
    assert len(titles) == 3
    assert any("tensor_scalar [128x256]" in t and "k.py:8" in t for t in titles)


def test_long_traces_merge_tiny_items(tmp_path):
    b = TraceBuilder("long")
    t0, t1, big = b.buffer("t0", "sbuf", 128, 64), b.buffer("t1", "sbuf", 128, 64), b.buffer("b", "sbuf", 128, 4)
    for _ in range(3000):
        b.compute("vector", "tensor_copy", [b.at(t0)], [b.at(t1)], 128, 1, line=3)
    b.compute("scalar", "activation", [b.at(big)], [b.at(big)], 128, 2_000_000, line=4)
    path = tmp_path / "long.html"
    write_timeline(estimate(b.trace), str(path))
    rects = svg_of(path).findall("{http://www.w3.org/2000/svg}rect")
    assert 2 <= len(rects) < 100
    assert any("3000 x tensor_copy" in r.find("{http://www.w3.org/2000/svg}title").text for r in rects)


def test_line_report_and_tl_map():
    kernel = "import x\n# tl:4\na = 1\nb = 2\nc = 3  # tl: conv.tl:9\nd = 4\n"
    assert tl_line_map(kernel) == {2: 4, 3: 4, 4: 4, 5: 9, 6: 9}
    est = estimate(small_trace())
    text = line_report(est, tl_map={7: 2, 8: 2, 9: 3})
    assert "k.py:8" in text and "line 2" in text and "line 3" in text
    assert sum(est.line_time_ns.values()) > 0


def test_timeline_is_deterministic(tmp_path):
    a, b = tmp_path / "a.html", tmp_path / "b.html"
    write_timeline(estimate(small_trace()), str(a))
    write_timeline(estimate(small_trace()), str(b))
    assert a.read_bytes() == b.read_bytes()
