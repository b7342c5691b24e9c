"""Engines that must not access one memory at the same time (Target.exclusions, tilec/perf/conflicts.py): trn1
(NeuronCore-v2) keeps VectorE and GpSimdE apart on SBUF and VectorE and ScalarE apart on PSUM (ARCH2); trn2
(NeuronCore-v3) keeps only VectorE and ScalarE apart on the same PSUM bank (ARCH3). Hand-made traces of independent
instructions: only the rule can order them, so under "serial" the second starts where the first ends, under "off"
both start at start-up."""
from __future__ import annotations

import dataclasses

import pytest

from tilec.errors import TilecError
from tilec.perf.api import estimate
from tilec.perf.params import TRN1, TRN2
from tilec.perf.tracebuild import TraceBuilder
from tilec.target import TRN1 as HW1, TRN2 as HW2

BANK = 2048
START = TRN2.startup_ns.value


def evictions(first: str, second: str, same_bank: bool, lo: tuple[int, int] = (0, 0)) -> TraceBuilder:
    """`first` then `second` (engines) each copy 256 fp32 of PSUM to SBUF: the same PSUM tile (one bank), or two
    tiles (two banks); `lo`: the byte offset each reads at within its tile."""
    b = TraceBuilder("evict")
    acc = b.buffer("acc", "psum", 128, BANK)
    other = acc if same_bank else b.buffer("acc2", "psum", 128, BANK)
    outs = [b.buffer(n, "sbuf", 128, 1024) for n in ("o1", "o2")]
    for engine, src, out, off in zip((first, second), (acc, other), outs, lo):
        op = "activation" if engine == "scalar" else "tensor_copy"
        b.compute(engine, op, [b.at(src, lo=off, hi=off + 1024)], [b.at(out)], 128, 256, line=1)
    return b


def spans(est) -> dict[int, tuple[float, float]]:
    return {it.seq: (it.start_ns, it.end_ns) for it in est.timeline}


def serialised(est) -> bool:
    s = spans(est)
    (a0, a1), (b0, b1) = s[0], s[1]
    return b0 == pytest.approx(a1) or a0 == pytest.approx(b1)


def overlapped(est) -> bool:
    s = spans(est)
    return s[0][0] == s[1][0] == pytest.approx(START)


@pytest.mark.parametrize("order", [("vector", "scalar"), ("scalar", "vector")])
def test_trn2_vector_and_scalar_on_one_psum_bank_run_one_after_the_other(order):
    trace = evictions(*order, same_bank=True).trace
    est = estimate(trace)
    assert serialised(est)
    off = spans(estimate(trace, engine_access="off"))
    s = spans(est)
    assert s[0] == pytest.approx(off[0])  # the first keeps its place, the second follows it
    assert s[1][0] == pytest.approx(off[0][1])
    assert s[1][1] - s[1][0] == pytest.approx(off[1][1] - off[1][0])
    assert overlapped(estimate(trace, engine_access="off"))


def test_trn2_vector_and_scalar_on_different_banks_overlap():
    assert overlapped(estimate(evictions("vector", "scalar", same_bank=False).trace))
    # without the bank placement (the "free" PSUM what-if) a tile is a bank of its own
    assert overlapped(estimate(evictions("vector", "scalar", same_bank=False).trace, psum_rotation="free"))
    assert serialised(estimate(evictions("vector", "scalar", same_bank=True).trace, psum_rotation="free"))


def test_trn2_a_tile_of_two_banks_collides_only_where_both_read_one_bank():
    """An NKI 0.1 block tile of 2 banks: halves in different banks overlap, two reads in its first bank do not."""
    def two_bank(lo):
        b = TraceBuilder("block")
        acc = b.buffer("acc", "psum", 128, 2 * BANK)
        for engine, off, name in zip(("vector", "scalar"), lo, ("o1", "o2")):
            out = b.buffer(name, "sbuf", 128, 1024)
            b.compute(engine, "activation" if engine == "scalar" else "tensor_copy",
                      [b.at(acc, lo=off, hi=off + 1024)], [b.at(out)], 128, 256)
        return b.trace
    assert overlapped(estimate(two_bank((0, BANK))))
    assert serialised(estimate(two_bank((0, 1024))))


def test_trn2_lets_vector_and_gpsimd_share_sbuf_and_two_vector_reads_of_a_bank_need_no_rule():
    assert overlapped(estimate(evictions("vector", "gpsimd", same_bank=False).trace))
    same_engine = spans(estimate(evictions("vector", "vector", same_bank=True).trace))
    assert same_engine[1][0] == pytest.approx(same_engine[0][1])  # in order on its engine anyway


def test_trn1_keeps_vector_and_scalar_apart_on_all_of_psum():
    trace = evictions("vector", "scalar", same_bank=False).trace
    assert serialised(estimate(trace, target="trn1"))
    assert overlapped(estimate(trace, target="trn1", engine_access="off"))


def test_trn1_keeps_vector_and_gpsimd_apart_on_sbuf_only():
    b = TraceBuilder("sbuf")
    x, y, g, h = (b.buffer(n, "sbuf", 128, 2048) for n in ("x", "y", "g", "h"))
    b.compute("vector", "tensor_copy", [b.at(x)], [b.at(y)], 128, 512)
    b.compute("gpsimd", "tensor_copy", [b.at(g)], [b.at(h)], 128, 512)
    assert serialised(estimate(b.trace, target="trn1"))
    assert overlapped(estimate(b.trace, target="trn2"))
    scalar = TraceBuilder("sbuf2")  # ScalarE beside GpSimdE on SBUF: no rule on either generation
    x, y, g, h = (scalar.buffer(n, "sbuf", 128, 2048) for n in ("x", "y", "g", "h"))
    scalar.compute("scalar", "activation", [scalar.at(x)], [scalar.at(y)], 128, 512)
    scalar.compute("gpsimd", "tensor_copy", [scalar.at(g)], [scalar.at(h)], 128, 512)
    assert overlapped(estimate(scalar.trace, target="trn1"))


def test_a_later_instruction_fills_an_earlier_gap_long_enough():
    """trn1: VectorE copies, waits for a load, copies again; GpSimdE's short copy fits in the wait."""
    b = TraceBuilder("gap")
    x, v, w = (b.buffer(n, "sbuf", 128, 2048) for n in ("x", "v", "w"))
    hbm = b.buffer("h", "hbm", 1, 128 * 2048)
    g0, g = b.buffer("g0", "sbuf", 128, 256), b.buffer("g", "sbuf", 128, 256)
    b.compute("vector", "tensor_copy", [b.at(x)], [b.at(v)], 128, 512)
    b.dma(b.at(w), b.at(hbm), partitions=128, nbytes=128 * 2048, line=3)
    b.compute("vector", "tensor_copy", [b.at(w)], [b.at(v)], 128, 512)
    b.compute("gpsimd", "tensor_copy", [b.at(g0)], [b.at(g)], 128, 64)
    s = {(it.lane, it.seq): (it.start_ns, it.end_ns) for it in estimate(b.trace, target="trn1").timeline}
    first, second, gps = s[("vector", 0)], s[("vector", 2)], s[("gpsimd", 3)]
    assert gps[0] == pytest.approx(first[1]) and gps[1] <= second[0]


def test_the_rules_are_target_data():
    assert [(r.engines, r.memory, r.per_bank) for r in HW1.exclusions] == [
        (("vector", "gpsimd"), "sbuf", False), (("vector", "scalar"), "psum", False)]
    assert [(r.engines, r.memory, r.per_bank) for r in HW2.exclusions] == [(("vector", "scalar"), "psum", True)]
    assert TRN1.exclusions == HW1.exclusions and TRN2.exclusions == HW2.exclusions
    assert all("ARCH" in r.source for r in HW1.exclusions + HW2.exclusions)
    assert "exclusions" not in {name for name, _, _ in TRN2.table()}  # records, not numbers
    trace = evictions("vector", "scalar", same_bank=False).trace
    assert overlapped(estimate(trace, target="trn1", params=dataclasses.replace(TRN1, exclusions=())))
    assert serialised(estimate(trace, params=dataclasses.replace(TRN2, exclusions=HW1.exclusions)))


def test_the_default_follows_the_environment_and_refuses_unknown_rules(monkeypatch):
    trace = evictions("vector", "scalar", same_bank=True).trace
    assert estimate(trace).total_ns == estimate(trace, engine_access="serial").total_ns
    monkeypatch.setenv("TILEC_MODEL_ENGINE_ACCESS", "off")
    assert estimate(trace).total_ns == estimate(trace, engine_access="off").total_ns
    with pytest.raises(TilecError, match="TILEC_MODEL_ENGINE_ACCESS"):
        estimate(trace, engine_access="apart")


def test_the_hardware_probe_runs_and_separates_the_readings(capsys):
    """benchmarks/trn2_psum_bank.py: every kernel copies exactly on the interpreter; on the trn2 model VectorE and
    ScalarE on one bank run one after the other and on two banks side by side, without the rule both overlap, on
    trn1 neither does."""
    import pathlib
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import trn2_psum_bank as bench
    finally:
        sys.path.pop(0)
    assert bench.main(["--reps", "8", "--free", "256"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[2:2 + len(bench.NAMES)]}
    assert set(rows) == set(bench.NAMES) and all(r[1] == "ok" for r in rows.values())
    serial, off, trn1 = ({k: float(r[i]) for k, r in rows.items()} for i in (2, 3, 4))
    assert bench.overlaps(serial)["same"] < 0.2 and bench.overlaps(serial)["apart"] == pytest.approx(1, abs=0.05)
    assert bench.overlaps(off) == pytest.approx({"same": 1, "apart": 1}, abs=0.05)
    assert all(v < 0.2 for v in bench.overlaps(trn1).values())
