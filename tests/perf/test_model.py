"""The performance model on hand-built traces: costs computed by hand from the parameter table, dependences,
utilisation formulas, determinism."""
from __future__ import annotations

import dataclasses
import math

import pytest

from tilec.errors import TilecError
from tilec.perf.api import estimate
from tilec.perf.params import TRN2
from tilec.perf.tracebuild import TraceBuilder

P = {name: value for name, value, _ in TRN2.table()}
PEAK = 2 * 128 * 128 * P["tensor_ghz"]  # FLOP per ns


def dma_matmul_trace(dtype: str = "float32") -> TraceBuilder:
    """x [128, 256] loaded from HBM, then one matmul with it as moving operand (K = M = 128, N = 256)."""
    b = TraceBuilder("one_dma_one_matmul")
    size = 4 if dtype == "float32" else 2
    x_hbm = b.buffer("x", "hbm", 1, 128 * 256 * size)
    w = b.buffer("w", "sbuf", 128, 128 * size)
    x = b.buffer("x_sb", "sbuf", 128, 256 * size)
    out = b.buffer("acc", "psum", 128, 256 * 4)
    b.dma(b.at(x), b.at(x_hbm), partitions=128, nbytes=128 * 256 * size, line=3, dtype=dtype)
    b.compute("tensor", "nc_matmul", [b.at(w), b.at(x)], [b.at(out)], partitions=128, free=256, line=4, k=128, m=128,
              dtypes=(dtype, dtype))
    return b


def test_one_dma_one_matmul_by_hand():
    est = estimate(dma_matmul_trace().trace)
    # DMA: 128 partitions -> 16 engines, 8 descriptors and 128*256*4/16 bytes on each engine
    per_engine = 128 * 256 * 4 / 16
    dma = math.hypot(P["dma_xfer_fixed_ns"] + 8 * P["dma_desc_ns"], per_engine / P["dma_engine_bw"])
    # matmul fp32: (max(min(64, M), N) + fixed) cycles, times the fp32 factor, at the TensorE clock
    mm = (max(min(64, 128), 256) + P["mm_fixed_cycles"]) * P["mm_fp32_factor"] / P["tensor_ghz"]
    # the warm-up throttle allows the first 1.5 us of TensorE work at full speed: one matmul does not wait
    expected = P["startup_ns"] + dma + mm  # the first DMA starts at start-up; the matmul waits for its data
    assert est.total_ns == pytest.approx(expected, rel=1e-9)
    assert est.dma_transfer_count == 1
    assert est.hbm_read_bytes == 128 * 256 * 4 and est.hbm_write_bytes == 0
    assert est.busy_ns["tensor"] == pytest.approx(mm)
    assert est.busy_ns["dma"] == pytest.approx(dma)
    flops = 2 * 128 * 128 * 256
    assert est.mfu == pytest.approx(flops / (PEAK * expected))
    assert est.hfu == pytest.approx(est.mfu)
    text = est.summary_text()
    assert f"total_time {expected * 1e-9:.9f}\n" in text
    assert "dma_transfer_count 1\n" in text
    assert f"mfu_estimated_percent {100 * flops / (PEAK * expected):.2f}\n" in text


def test_fp16_matmul_is_cheaper_by_the_fp32_factor():
    mm32 = estimate(dma_matmul_trace("float32").trace).busy_ns["tensor"]
    mm16 = estimate(dma_matmul_trace("float16").trace).busy_ns["tensor"]
    assert mm32 / mm16 == pytest.approx(P["mm_fp32_factor"])


def test_summary_is_alphabetical_key_value_lines():
    lines = estimate(dma_matmul_trace().trace).summary_text().splitlines()
    keys = [line.split(" ", 1)[0] for line in lines]
    assert keys == sorted(keys) and len(keys) == len(set(keys))
    assert {"total_time", "dma_transfer_count", "mfu_estimated_percent", "hfu_estimated_percent",
            "tensor_engine_active_time_percent", "sbuf_peak_bytes_per_partition"} <= set(keys)


def vec(b: TraceBuilder, engine: str, reads, writes, free: int = 1000, line: int = 0):
    return b.compute(engine, "tensor_copy", reads, writes, partitions=128, free=free, line=line)


def starts(est):
    return [(it.start_ns, it.end_ns) for it in est.timeline]


def test_raw_chain_serialises_across_engines():
    b = TraceBuilder("raw")
    t0, t1, t2 = (b.buffer(n, "sbuf", 128, 4096) for n in ("t0", "t1", "t2"))
    vec(b, "vector", [b.at(t0)], [b.at(t1)])
    vec(b, "scalar", [b.at(t1)], [b.at(t2)])
    (s0, e0), (s1, e1) = starts(estimate(b.trace))
    assert s1 == pytest.approx(e0)


def test_independent_instructions_on_different_engines_overlap():
    b = TraceBuilder("indep")
    t0, t1, t2, t3 = (b.buffer(n, "sbuf", 128, 4096) for n in ("t0", "t1", "t2", "t3"))
    vec(b, "vector", [b.at(t0)], [b.at(t1)])
    vec(b, "scalar", [b.at(t2)], [b.at(t3)])
    (s0, e0), (s1, e1) = starts(estimate(b.trace))
    assert s0 == s1 == P["startup_ns"]


def test_same_engine_runs_in_order():
    b = TraceBuilder("inorder")
    t0, t1, t2, t3 = (b.buffer(n, "sbuf", 128, 4096) for n in ("t0", "t1", "t2", "t3"))
    vec(b, "vector", [b.at(t0)], [b.at(t1)])
    vec(b, "vector", [b.at(t2)], [b.at(t3)])
    (s0, e0), (s1, e1) = starts(estimate(b.trace))
    assert s1 == pytest.approx(e0)


def test_anti_dependence_write_waits_for_reader():
    b = TraceBuilder("war")
    t0, t1, t2 = (b.buffer(n, "sbuf", 128, 4096) for n in ("t0", "t1", "t2"))
    vec(b, "vector", [b.at(t0)], [b.at(t1)], free=1000)  # reads t0 for a long time
    vec(b, "scalar", [b.at(t2)], [b.at(t0)], free=10)  # overwrites t0
    (s0, e0), (s1, e1) = starts(estimate(b.trace))
    assert s1 == pytest.approx(e0)


def test_output_dependence_write_waits_for_writer():
    b = TraceBuilder("waw")
    t0, t1, t2 = (b.buffer(n, "sbuf", 128, 4096) for n in ("t0", "t1", "t2"))
    vec(b, "vector", [b.at(t0)], [b.at(t2)], free=1000)
    vec(b, "gpsimd", [b.at(t1)], [b.at(t2)], free=10)
    (s0, e0), (s1, e1) = starts(estimate(b.trace))
    assert s1 == pytest.approx(e0)


def test_disjoint_regions_of_one_buffer_do_not_depend():
    b = TraceBuilder("disjoint")
    u0, u1, u2 = (b.buffer(n, "sbuf", 128, 4096) for n in ("u0", "u1", "u2"))
    vec(b, "vector", [b.at(u0)], [b.at(u1, p0=0, p1=64)])  # writes partitions 0-63 of u1
    vec(b, "scalar", [b.at(u1, p0=64, p1=128)], [b.at(u2, lo=0, hi=2048)])  # reads partitions 64-127: no wait
    vec(b, "gpsimd", [b.at(u1, p0=0, p1=128, lo=100, hi=200)], [b.at(u2, lo=2048, hi=4096)])  # overlaps: waits
    (s0, e0), (s1, e1), (s2, e2) = starts(estimate(b.trace))
    assert s0 == s1 and s2 == pytest.approx(e0)


def dma_at(b: TraceBuilder, p0: int, p1: int, line: int):
    src = b.buffer("h", "hbm", 1, 1 << 20)
    dst = b.buffer("s", "sbuf", 128, 8192)
    return b.dma(b.at(dst, p0=p0, p1=p1), b.at(src), partitions=p1 - p0, nbytes=(p1 - p0) * 8192, line=line)


def test_dma_engines_split_by_partition_groups():
    b = TraceBuilder("dma_split")
    src = b.buffer("h", "hbm", 1, 1 << 20)
    dsts = [b.buffer("s", "sbuf", 128, 8192) for _ in range(3)]  # all live at once: no buffer rotation between them
    for dst, (p0, p1) in zip(dsts, [(0, 8), (8, 16), (0, 8)]):  # engine 0, engine 1 (at the same time), engine 0
        b.dma(b.at(dst, p0=p0, p1=p1), b.at(src), partitions=p1 - p0, nbytes=(p1 - p0) * 8192, line=p1)
    (s0, e0), (s1, e1), (s2, e2) = starts(estimate(b.trace))
    assert s0 == s1 and s2 == pytest.approx(e0)
    one_engine = math.hypot(P["dma_xfer_fixed_ns"] + 8 * P["dma_desc_ns"], 8 * 8192 / P["dma_engine_bw"])
    assert e0 - s0 == pytest.approx(one_engine)


def test_dma_waits_for_producer_plus_latency():
    b = TraceBuilder("store")
    t0, t1 = b.buffer("t0", "sbuf", 128, 4096), b.buffer("t1", "sbuf", 128, 4096)
    out = b.buffer("out", "hbm", 1, 128 * 4096)
    vec(b, "vector", [b.at(t0)], [b.at(t1)])
    b.dma(b.at(out), b.at(t1), partitions=128, nbytes=128 * 4096, line=5)
    (s0, e0), (s1, e1) = starts(estimate(b.trace))
    assert s1 == pytest.approx(e0 + P["dma_latency_ns"])


def test_mfu_counts_matmuls_hfu_also_transposes():
    b = TraceBuilder("mfu")
    w, x = b.buffer("w", "sbuf", 128, 256), b.buffer("x", "sbuf", 128, 1024)
    acc, tp = b.buffer("acc", "psum", 128, 2048), b.buffer("tp", "psum", 128, 512)
    b.compute("tensor", "nc_matmul", [b.at(w), b.at(x)], [b.at(acc)], 128, 512, k=128, m=128,
              dtypes=("bfloat16", "bfloat16"))
    b.compute("tensor", "nc_transpose", [b.at(w)], [b.at(tp)], 128, 128, k=128, m=128, dtypes=("bfloat16",),
              out_dtype="bfloat16")
    est = estimate(b.trace)
    useful, transpose = 2 * 128 * 128 * 512, 2 * 128 * 128 * 128
    assert est.useful_flops == useful and est.hardware_flops == useful + transpose
    assert est.mfu == pytest.approx(useful / (PEAK * est.total_ns))
    assert est.hfu == pytest.approx((useful + transpose) / (PEAK * est.total_ns))


def test_sbuf_and_psum_peaks_from_allocations():
    b = TraceBuilder("peaks")
    t0 = b.buffer("t0", "sbuf", 128, 1000)
    t1 = b.buffer("t1", "sbuf", 128, 3000)
    vec(b, "vector", [b.at(t0)], [b.at(t1)])  # both live at seq 0
    t2 = b.buffer("t2", "sbuf", 64, 500)  # allocated after t0 and t1 were last touched
    ps = b.buffer("ps", "psum", 128, 2048)
    vec(b, "vector", [b.at(t2)], [b.at(ps)])
    est = estimate(b.trace)
    assert est.sbuf_peak_bytes == 4000 and est.psum_peak_bytes == 2048


def test_same_trace_same_summary_bytes():
    a = estimate(dma_matmul_trace().trace).summary_text()
    b = estimate(dma_matmul_trace().trace).summary_text()
    assert a.encode() == b.encode()


def test_unknown_target_is_a_user_error():
    with pytest.raises(TilecError, match="unknown performance-model target"):
        estimate(dma_matmul_trace().trace, target="trn9")


def test_every_parameter_cites_a_source():
    for name, value, source in TRN2.table():
        assert source.startswith(("§", "fitted")), name


def test_dma_engine_time_is_descriptors_and_bytes():
    """A [128, 448 B] load occupies its 16 engines for its descriptors and bytes only: the public conv behind rows
    9-12 runs 2,664 of them beside 811 us of matmuls, which a fixed engine time per transfer (450 ns, once fitted
    to the tiny-DMA rows; DMAINTRO's efficiency figure reads the same) would make DMA-bound at 2,200 us."""
    b = TraceBuilder("row_load")
    src, dst = b.buffer("h", "hbm", 1, 128 * 448), b.buffer("s", "sbuf", 128, 448)
    b.dma(b.at(dst), b.at(src), partitions=128, nbytes=128 * 448, line=1)
    busy = estimate(b.trace).busy_ns["dma"]
    assert busy == pytest.approx(math.hypot(8 * P["dma_desc_ns"], 8 * 448 / P["dma_engine_bw"]))
    assert busy < 811_000 / 2664  # keeps pace with the matmuls of one row load (3 x ~100 ns)


def test_psum_zeroing_before_accumulation_is_free():
    b = TraceBuilder("zero")
    w, x = b.buffer("w", "sbuf", 128, 256), b.buffer("x", "sbuf", 128, 512)
    acc, other = b.buffer("acc", "psum", 128, 1024), b.buffer("other", "psum", 128, 1024)
    b.compute("vector", "memset", [], [b.at(acc)], 128, 256)  # nl.zeros(..., buffer=nl.psum)
    b.compute("tensor", "nc_matmul", [b.at(w), b.at(x)], [b.at(acc)], 128, 256, k=128, m=128, accumulate=True,
              dtypes=("bfloat16", "bfloat16"))
    b.compute("vector", "memset", [], [b.at(other)], 128, 256)  # zeroed, then read: a real instruction
    vec(b, "vector", [b.at(other)], [b.at(x)], free=256)
    est = estimate(b.trace)
    (s0, e0), (s1, e1), (s2, e2), (s3, e3) = starts(est)
    assert e0 == s0 == s1 == P["startup_ns"]  # folded into the matmul
    assert e2 > s2 and s3 == pytest.approx(e2)


def test_loop_tiles_rotate_through_a_few_buffers():
    """The k-th tile allocated at one line reuses the memory of the (k-R)-th: it waits for its last use."""
    rotation = int(P["buffer_rotation"])
    b = TraceBuilder("rotate")
    src, sink = b.buffer("src", "sbuf", 128, 4096), b.buffer("sink", "sbuf", 128, 4096)
    for k in range(rotation + 1):
        tile = b.buffer("tile", "sbuf", 128, 4096)
        b.trace.allocs[-1] = dataclasses.replace(b.trace.allocs[-1], line=7)  # all from one allocation site
        vec(b, "vector", [b.at(src)], [b.at(tile)], free=10)
        b.compute("scalar", "activation", [b.at(tile)], [b.at(sink, lo=4 * k, hi=4 * k + 4)], 128, 4000)  # last use
    est = estimate(b.trace)
    items = est.timeline
    first_use_end = items[1].end_ns  # the activation reading tile 0
    assert items[2 * rotation].start_ns >= first_use_end  # tile R (memory of tile 0) is written after that
    assert items[2].start_ns < first_use_end  # tile 1 has its own memory


def test_trn1_uses_its_own_clocks():
    trace = dma_matmul_trace("bfloat16").trace
    trn2, trn1 = estimate(trace, "trn2"), estimate(trace, "trn1")
    assert trn1.busy_ns["tensor"] == pytest.approx(trn2.busy_ns["tensor"] * 2.4 / 2.8)
    assert trn1.busy_ns["dma"] > trn2.busy_ns["dma"]  # 17 B/ns per DMA engine instead of 23


def test_store_completes_after_the_hbm_acknowledgement():
    """A store frees its SBUF source, and ends the kernel, `dma_write_ack_ns` after its last byte (row 8's per-tile
    chain copy -> store -> acknowledgement -> next copy); a later DMA writing the same HBM waits for the data only
    (writes are ordered by their queue)."""
    ack, latency = P["dma_write_ack_ns"], P["dma_latency_ns"]
    assert ack > 0
    b = TraceBuilder("store_ack")
    src, t = b.buffer("src", "sbuf", 128, 512), b.buffer("t", "sbuf", 128, 512)
    out = b.buffer("out", "hbm", 1, 128 * 512)
    vec(b, "vector", [b.at(src)], [b.at(t)], free=128)
    b.dma(b.at(out), b.at(t), partitions=128, nbytes=128 * 512, line=5)  # store
    b.dma(b.at(out), b.at(src), partitions=128, nbytes=128 * 512, line=6)  # same HBM again, another source
    vec(b, "vector", [b.at(src)], [b.at(t)], free=128)  # rewrites the first store's source
    est = estimate(b.trace)
    (_, e0), (s1, e1), (s2, e2), (s3, _) = starts(est)
    data_end = e1 - ack  # the first store's last byte
    assert data_end == pytest.approx(s1 + math.hypot(8 * P["dma_desc_ns"], 8 * 512 / P["dma_engine_bw"]))
    assert s2 == pytest.approx(data_end + latency)  # output dependence on the data, not on the acknowledgement
    assert s3 == pytest.approx(e1)  # the source is free once the store is acknowledged
    assert est.total_ns == pytest.approx(e2) and e2 == pytest.approx(s2 + (e1 - s1))


def test_dependence_free_dma_leads_its_stream():
    """DMAs on one trigger stream issue in order (rows 1, 2, 4: the next iteration's load waits behind this one's
    store), except a load that depends on nothing: the compiler puts it first, so it moves at once (row 7's second
    iteration, into fresh buffers, overlaps the first iteration's add: 26 us measured against row 6's 28)."""
    latency, n = P["dma_latency_ns"], 128 * 4096
    b = TraceBuilder("leads")
    x, out = b.buffer("x", "hbm", 1, n), b.buffer("out", "hbm", 1, n)
    a, a2, r, fresh, r2 = (b.buffer(name, "sbuf", 128, 4096) for name in ("a", "a2", "r", "fresh", "r2"))
    b.dma(b.at(a), b.at(x), partitions=128, nbytes=n, line=1)  # 0
    b.dma(b.at(a2, hi=2048), b.at(x, hi=n // 2), partitions=128, nbytes=n // 2, line=2)  # 1: half of a2
    vec(b, "vector", [b.at(a)], [b.at(r)])  # 2: the add
    b.dma(b.at(out), b.at(r), partitions=128, nbytes=n, line=4)  # 3: its store, on VectorE's stream
    b.dma(b.at(fresh), b.at(x), partitions=128, nbytes=n, line=5)  # 4: depends on nothing
    b.dma(b.at(a2, hi=2048), b.at(x, hi=n // 2), partitions=128, nbytes=n // 2, line=6)  # 5: after load 1 (WAW)
    vec(b, "vector", [b.at(fresh), b.at(a2)], [b.at(r2)])  # 6: VectorE reads loads 1, 4, 5: all on its stream
    (s0, e0), (s1, e1), (s2, e2), (s3, _), (s4, _), (s5, _), _ = starts(estimate(b.trace))
    assert s3 == pytest.approx(e2 + latency)
    assert s4 < s3 and s4 == pytest.approx(e1)  # moves right behind the loads before it, long before the store
    assert e1 + latency < s3 <= s5  # load 5 could start at e1 + latency; its stream holds it behind the store
