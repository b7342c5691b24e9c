"""`tilec profile`: the Perfetto / Chrome trace-event JSON, the headline and --json.

The trace is checked against the Trace Event Format's rules (the JSON Object Format that ui.perfetto.dev and
chrome://tracing load): a "traceEvents" list; complete events "X" with name, numeric ts/dur in microseconds, integer
pid/tid; metadata "M" events naming the process and every thread; counter events "C" with numeric args. That a real
viewer imports it (every track and slice) is checked in a headless Chromium by test_perfetto_browser.py."""
from __future__ import annotations

import json
import pathlib

import pytest

import tilec_cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "examples" / "conv_bias_maxpool.tl"
SIZES = ["-D", "N=1", "-D", "C=128", "-D", "K=128", "-D", "H=18", "-D", "W=18"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, dict]:
    out = tmp_path_factory.mktemp("prof")
    trace = out / "conv.trace.json"
    assert tilec_cli.main(["profile", str(PROGRAM), *SIZES, "-o", str(trace)]) == 0
    import io
    from contextlib import redirect_stdout

    text, data = io.StringIO(), io.StringIO()
    with redirect_stdout(text):
        assert tilec_cli.main(["profile", str(PROGRAM), *SIZES, "-o", str(out / "again.json")]) == 0
    with redirect_stdout(data):
        assert tilec_cli.main(["profile", str(PROGRAM), *SIZES, "--json", "-o", str(out / "j.json")]) == 0
    assert (out / "again.json").read_bytes() == trace.read_bytes()  # same input, same bytes
    return json.loads(trace.read_text()), text.getvalue(), json.loads(data.getvalue())


def test_trace_follows_the_trace_event_format(profiled: tuple[dict, str, dict]) -> None:
    trace, _, _ = profiled
    events = trace["traceEvents"]
    assert isinstance(events, list) and events and trace["displayTimeUnit"] in ("ms", "ns")
    named_threads = {}
    for e in events:
        assert e["ph"] in ("X", "M", "C") and isinstance(e["name"], str) and isinstance(e["pid"], int)
        if e["ph"] == "X":
            assert isinstance(e["tid"], int) and isinstance(e["ts"], (int, float)) and e["ts"] >= 0
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0 and isinstance(e["args"], dict)
        elif e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "thread_sort_index") and isinstance(e["args"], dict)
            if e["name"] == "thread_name":
                named_threads[e["tid"]] = e["args"]["name"]
        else:
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values())
    used = {e["tid"] for e in events if e["ph"] == "X"}
    assert used <= set(named_threads)  # every track has a name


def test_a_track_per_engine_and_per_dma_queue_with_source_lines(profiled: tuple[dict, str, dict]) -> None:
    trace, _, _ = profiled
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"TensorE", "VectorE"} <= set(names.values()) or {"TensorE", "ScalarE"} <= set(names.values())
    queues = [n for n in names.values() if n.startswith("DMA queue ")]
    assert len(queues) >= 3  # X bands, weights, bias, stores
    slices = [e for e in events if e["ph"] == "X"]
    matmuls = [e for e in slices if e["name"] == "nc_matmul"]
    assert matmuls and all(names[e["tid"]] == "TensorE" for e in matmuls)
    for e in slices:
        assert e["args"]["instruction"].startswith(e["name"])
        assert e["args"]["kernel_line"].startswith("conv_bias_maxpool.py:")
        assert 1 <= e["args"]["tl_line"] <= len(PROGRAM.read_text().splitlines())
    # the matmuls come from the `+=` statement of the convolution
    conv_line = next(i for i, line in enumerate(PROGRAM.read_text().splitlines(), 1) if "+=" in line)
    assert {e["args"]["tl_line"] for e in matmuls} == {conv_line}
    dmas = [e for e in slices if e["cat"] == "dma"]
    assert dmas and all(names[e["tid"]].startswith("DMA queue ") for e in dmas)
    for e in dmas:  # spread over some of the 16 DMA engines
        first, last = map(int, e["args"]["dma_engines"].split(".."))
        assert 0 <= first <= last < 16
    end = max(e["ts"] + e["dur"] for e in slices)
    assert end == pytest.approx(trace["otherData"]["total_us"], rel=1e-6)


def test_utilisation_counters_match_busy_time(profiled: tuple[dict, str, dict]) -> None:
    trace, _, summary = profiled
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    tensor = sorted((e["ts"], e["args"]["busy"]) for e in counters if e["name"] == "TensorE utilisation %")
    assert tensor and all(0 <= v <= 100 for _, v in tensor)
    # the windows are equal: their mean busy % is the engine's utilisation over the run
    windows = [v for _, v in tensor[:-1]]
    assert sum(windows) / len(windows) == pytest.approx(100 * summary["utilisation"]["tensor"], abs=0.1)


def test_summary_leads_with_total_us_and_what_bounds_the_kernel(profiled: tuple[dict, str, dict]) -> None:
    _, text, summary = profiled
    first, second = text.splitlines()[:2]
    assert first == f"conv_bias_maxpool: {summary['total_us']:.1f} us estimated on trn2 (tilec model, not measured)"
    assert second.startswith(("bound by ", "latency-bound: "))
    if summary["bound_by"] != "latency":
        assert second.startswith(f"bound by {summary['bound_by']}: busy")
        assert summary["bound_busy_fraction"] == max(summary["utilisation"].values())
    assert summary["estimated"] is True and summary["kernel_lines"] and summary["tl_lines"]
    # the per-line busy times add up to the slices' durations in the trace
    trace, _, _ = profiled
    slices = sum(e["dur"] for e in trace["traceEvents"] if e["ph"] == "X")
    assert sum(r["busy_us"] for r in summary["kernel_lines"]) == pytest.approx(slices, rel=1e-9)
