"""The VectorE/GpSimdE shared SBUF bus (ARCH3: VectorE's performance mode borrows GpSimdE's bus and the hardware
arbitrates), an option of the model: "off" (default) lets the engines overlap, "exclusive" never runs a VectorE
instruction in performance mode beside a GpSimdE one. Costs are computed by hand from the parameter table."""
from __future__ import annotations

import pytest

from tilec.errors import TilecError
from tilec.perf.api import estimate
from tilec.perf.params import TRN2
from tilec.perf.tracebuild import TraceBuilder

P = {name: value for name, value, _ in TRN2.table()}


def pair(vector_dtype: str, vector_op: str = "tensor_copy", gpsimd_first: bool = False,
         psum_input: bool = False) -> TraceBuilder:
    """Independent work: VectorE's `vector_op` over [128, 2048] of `vector_dtype` and GpSimdE's fp32 add over
    [128, 512]; nothing is shared, so only the bus can order them."""
    b = TraceBuilder("bus")
    size = 2 if vector_dtype == "bfloat16" else 4
    x = b.buffer("x", "psum" if psum_input else "sbuf", 128, 2048 * size)
    x2 = b.buffer("x2", "sbuf", 128, 2048 * size)
    v = b.buffer("v", "sbuf", 128, 2048 * size)
    g0, g1, g = (b.buffer(n, "sbuf", 128, 512 * 4) for n in ("g0", "g1", "g"))
    reads = [b.at(x)] if vector_op == "tensor_copy" else [b.at(x), b.at(x2)]

    def vec():
        b.compute("vector", vector_op, reads, [b.at(v)], 128, 2048, dtypes=(vector_dtype,) * len(reads),
                  out_dtype=vector_dtype, line=1)

    def gps():
        b.compute("gpsimd", "tensor_tensor", [b.at(g0), b.at(g1)], [b.at(g)], 128, 512,
                  dtypes=("float32", "float32"), line=2)
    for f in ((gps, vec) if gpsimd_first else (vec, gps)):
        f()
    return b


def spans(est):
    return {it.lane: (it.start_ns, it.end_ns) for it in est.timeline}


def vector_ns(n: float, perf: float) -> float:
    return (max(P["min_ii_cycles"], n / perf) + P["vector_static_cycles"]) / P["vector_ghz"]


GPSIMD_NS = (max(P["min_ii_cycles"], 2 * 512) + P["gpsimd_static_cycles"]) / P["gpsimd_ghz"]


@pytest.mark.parametrize("gpsimd_first", [False, True])
def test_exclusive_serialises_a_performance_mode_copy_and_gpsimd(gpsimd_first):
    trace = pair("bfloat16", gpsimd_first=gpsimd_first).trace
    v_ns = vector_ns(2048, P["perf_mode_copy"])  # 16-bit SBUF -> SBUF, contiguous: 4x
    start = P["startup_ns"]
    off = spans(estimate(trace, shared_bus="off"))
    assert off["vector"] == pytest.approx((start, start + v_ns))
    assert off["gpsimd"] == pytest.approx((start, start + GPSIMD_NS))
    ex = spans(estimate(trace, shared_bus="exclusive"))
    first, second = ("gpsimd", "vector") if gpsimd_first else ("vector", "gpsimd")
    d = {"vector": v_ns, "gpsimd": GPSIMD_NS}
    assert ex[first] == pytest.approx((start, start + d[first]))
    assert ex[second] == pytest.approx((start + d[first], start + d[first] + d[second]))
    assert estimate(trace, shared_bus="exclusive").total_ns == pytest.approx(start + v_ns + GPSIMD_NS)


def test_exclusive_covers_psum_side_copies_and_16_bit_tensor_tensor_from_sbuf():
    psum = spans(estimate(pair("bfloat16", psum_input=True).trace, shared_bus="exclusive"))
    assert psum["gpsimd"][0] == pytest.approx(psum["vector"][1])  # 2x mode with a PSUM side: still the bus
    tt = spans(estimate(pair("bfloat16", "tensor_tensor").trace, shared_bus="exclusive"))
    assert tt["gpsimd"][0] == pytest.approx(tt["vector"][1])


def test_fp32_vector_work_and_psum_tensor_tensor_overlap_gpsimd_under_either_rule():
    for b in (pair("float32"), pair("bfloat16", "tensor_tensor", psum_input=True)):
        for rule in ("off", "exclusive"):
            s = spans(estimate(b.trace, shared_bus=rule))
            assert s["vector"][0] == s["gpsimd"][0] == P["startup_ns"]


def test_a_gpsimd_instruction_uses_a_gap_between_vector_copies():
    """VectorE: copy, then a copy that waits for a DMA; GpSimdE's add fits in the gap if it is long enough."""
    b = TraceBuilder("gap")
    x, v, w = (b.buffer(n, "sbuf", 128, 4096) for n in ("x", "v", "w"))
    h = b.buffer("h", "hbm", 1, 128 * 4096)
    g0, g = b.buffer("g0", "sbuf", 128, 2048), b.buffer("g", "sbuf", 128, 2048)
    b.compute("vector", "tensor_copy", [b.at(x)], [b.at(v)], 128, 2048, dtypes=("bfloat16",), out_dtype="bfloat16")
    b.dma(b.at(w), b.at(h), partitions=128, nbytes=128 * 4096, line=3, dtype="bfloat16")
    b.compute("vector", "tensor_copy", [b.at(w)], [b.at(v)], 128, 2048, dtypes=("bfloat16",), out_dtype="bfloat16")
    b.compute("gpsimd", "tensor_tensor", [b.at(g0), b.at(g0)], [b.at(g)], 128, 128, dtypes=("float32",) * 2)
    add_ns = (max(P["min_ii_cycles"], 2 * 128) + P["gpsimd_static_cycles"]) / P["gpsimd_ghz"]
    est = estimate(b.trace, shared_bus="exclusive")
    items = {(it.lane, it.seq): (it.start_ns, it.end_ns) for it in est.timeline}
    first, second, add = items[("vector", 0)], items[("vector", 2)], items[("gpsimd", 3)]
    assert second[0] - first[1] > add_ns  # the DMA leaves a gap on VectorE
    assert add == pytest.approx((first[1], first[1] + add_ns))


def test_the_default_follows_the_environment_and_refuses_unknown_rules(monkeypatch):
    trace = pair("bfloat16").trace
    assert estimate(trace).total_ns == estimate(trace, shared_bus="off").total_ns
    monkeypatch.setenv("TILEC_MODEL_SHARED_BUS", "exclusive")
    assert estimate(trace).total_ns == estimate(trace, shared_bus="exclusive").total_ns
    with pytest.raises(TilecError, match="TILEC_MODEL_SHARED_BUS"):
        estimate(trace, shared_bus="shared")


def test_trn1_has_no_performance_mode_to_arbitrate():
    """Without NC-v2's own SBUF rule (engine_access="off"; tests/perf/test_engine_access.py has it) the bus what-if
    orders nothing on trn1."""
    trace = pair("bfloat16").trace
    s = spans(estimate(trace, target="trn1", shared_bus="exclusive", engine_access="off"))
    assert s["vector"][0] == s["gpsimd"][0]


@pytest.mark.parametrize("nki06", [False, True])
def test_the_hardware_probe_runs_and_separates_the_rules(capsys, nki06):
    """benchmarks/trn2_shared_bus.py: every kernel matches NumPy on the interpreter; under "off" each pair overlaps
    fully, under "exclusive" the 16-bit pairs do not and the fp32 control still does."""
    import pathlib
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import trn2_shared_bus as bench
    finally:
        sys.path.pop(0)
    assert bench.main(["--reps", "4", "--fv", "256", "--fg", "64"] + (["--nki06"] if nki06 else [])) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[2:2 + len(bench.NAMES)]}
    assert set(rows) == set(bench.NAMES) and all(r[1] == "ok" for r in rows.values())
    off, ex = ({k: float(r[i]) for k, r in rows.items()} for i in (2, 3))
    assert bench.overlaps(off) == pytest.approx({"both16": 1, "bothtt16": 1, "both32": 1}, abs=0.05)
    ov = bench.overlaps(ex)
    assert ov["both16"] < 0.1 and ov["bothtt16"] < 0.1 and ov["both32"] == pytest.approx(1, abs=0.05)
