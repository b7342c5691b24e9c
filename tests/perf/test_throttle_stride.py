"""Two documented hardware effects of the performance model, with the expected times worked out by hand here:

* the Trn2 TensorE warm-up throttle (nki-spec §2.3 "Throttling (Trn2)"): about 50 % utilization for ~3 µs after
  TensorE work begins, re-engaging when utilization over a ~3 µs window drops below 50 %. The model's reading
  (tilec/perf/throttle.py): at most 1.5 µs of TensorE busy time in the 3 µs after engagement, an instruction past
  that allowance waits for the end of the 3 µs, full speed afterwards;
* the SBUF stride penalty (nki-spec §2.2, ARCH2): an innermost free stride over 16 bytes halves the SBUF interface
  bandwidth, so the instruction's streaming part costs twice; measured here both on hand-built traces and on the
  interpreter's trace of tiny NKI kernels."""
from __future__ import annotations

import math

import numpy as np
import pytest

import tilec  # noqa: F401  (installs the neuronxcc shim)
import neuronxcc.nki as nki  # noqa: E402
import neuronxcc.nki.isa as nisa  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402
from tilec.nki.api import simulate_traced  # noqa: E402
from tilec.perf.api import estimate  # noqa: E402
from tilec.perf.params import TRN1, TRN2  # noqa: E402
from tilec.perf.tracebuild import TraceBuilder  # noqa: E402

P = {name: value for name, value, _ in TRN2.table()}
P1 = {name: value for name, value, _ in TRN1.table()}
LIMIT_NS = 3000.0  # spec §2.3: "ramps to full over about 3 µs", "any ~3 µs window"
FRACTION = 0.5  # spec §2.3: "about 50 % utilization", "drops below 50 %"


def test_the_documented_throttle_numbers_are_the_parameters():
    assert (P["throttle_start_fraction"], P["throttle_ramp_ns"]) == (FRACTION, LIMIT_NS)
    assert (P["throttle_window_ns"], P["throttle_min_utilization"]) == (LIMIT_NS, FRACTION)
    assert P1["throttle_start_fraction"] >= 1.0  # trn1: off


# ---- the TensorE warm-up throttle ----

def matmul_cost(p: dict) -> float:
    """One fp16 matmul, K = M = 128, N = 512 moving columns (spec §2.4 cost plus the fitted overhead)."""
    return (max(min(64, 128), 512) + p["mm_fixed_cycles"]) / p["tensor_ghz"]


def add_matmuls(b: TraceBuilder, n: int, first_moving: int | None = None) -> int:
    """n matmuls with their own buffers (no dependence between them); the first may read `first_moving`.
    Returns the PSUM buffer of the last one."""
    acc = 0
    for i in range(n):
        w = b.buffer(f"w{i}", "sbuf", 128, 256)
        x = first_moving if i == 0 and first_moving is not None else b.buffer(f"x{i}", "sbuf", 128, 1024)
        acc = b.buffer(f"acc{i}", "psum", 128, 2048)
        b.compute("tensor", "nc_matmul", [b.at(w), b.at(x)], [b.at(acc)], partitions=128, free=512, k=128, m=128,
                  dtypes=("float16", "float16"))
    return acc


def stream(n: int) -> TraceBuilder:
    b = TraceBuilder("stream")
    add_matmuls(b, n)
    return b


def test_a_burst_within_half_of_the_window_runs_at_full_speed():
    c = matmul_cost(P)
    k = math.ceil(FRACTION * LIMIT_NS / c)  # 1500 ns / 222.1 ns: 7 matmuls start before the allowance is used up
    assert k == 7
    est = estimate(stream(k).trace)
    assert est.total_ns == pytest.approx(P["startup_ns"] + k * c, rel=1e-12)


def test_a_long_matmul_stream_pays_about_half_of_3_us_once():
    c = matmul_cost(P)
    k = 7  # start at busy 0, c, ..., 6c < 1500 ns; the 8th finds 7c = 1554.6 ns used and waits for the 3 us mark
    for n in (100, 200):
        est = estimate(stream(n).trace)
        expected = P["startup_ns"] + LIMIT_NS + (n - k) * c
        assert est.total_ns == pytest.approx(expected, rel=1e-12)
        extra = est.total_ns - (P["startup_ns"] + n * c)
        assert extra == pytest.approx(LIMIT_NS - k * c)  # 1445 ns whatever n is: once, not per matmul
        assert 1300 < extra < 1500


def gapped(gap_ns: float) -> tuple[TraceBuilder, float]:
    """20 matmuls, a VectorE copy of the last result taking `gap_ns`, then 20 matmuls, the first reading the copy."""
    b = TraceBuilder("gapped")
    acc = add_matmuls(b, 20)
    free = round(gap_ns * P["vector_ghz"] - P["vector_static_cycles"])  # fp32 PSUM -> SBUF copy: N + 100 cycles
    copy = b.buffer("copy", "sbuf", 128, 4 * free)
    b.compute("vector", "tensor_copy", [b.at(acc)], [b.at(copy)], partitions=128, free=free)
    add_matmuls(b, 20, first_moving=copy)
    return b, (free + P["vector_static_cycles"]) / P["vector_ghz"]


def test_a_gap_that_drops_utilization_below_half_pays_again():
    c, k = matmul_cost(P), 7
    burst = LIMIT_NS + (20 - k) * c  # throttled burst of 20: 7 at once, wait for the 3 us mark, 13 more
    b, gap = gapped(2000.0)  # 2 us idle in the trailing 3 us window: utilization 33 % < 50 %
    assert gap == pytest.approx(2000.0)
    assert estimate(b.trace).total_ns == pytest.approx(P["startup_ns"] + burst + gap + burst, rel=1e-12)
    b, gap = gapped(1000.0)  # 1 us idle: utilization 67 %, the limit stays off and the second burst runs freely
    assert gap == pytest.approx(1000.0)
    assert estimate(b.trace).total_ns == pytest.approx(P["startup_ns"] + burst + gap + 20 * c, rel=1e-12)


def test_trn1_has_no_throttle():
    c1 = matmul_cost(P1)
    est = estimate(stream(100).trace, "trn1")
    assert est.total_ns == pytest.approx(P1["startup_ns"] + 100 * c1, rel=1e-12)


# ---- the SBUF stride penalty, on hand-built traces ----

def one_copy(stride: int, memory: str = "sbuf", dtype: str = "float32", free: int = 512) -> TraceBuilder:
    b = TraceBuilder("copy")
    size = 4 if dtype == "float32" else 2
    src = b.buffer("src", memory, 128, 8 * free * size)
    dst = b.buffer("dst", "sbuf", 128, free * size)
    b.compute("vector", "tensor_copy", [b.at(src, stride_bytes=stride)], [b.at(dst, stride_bytes=size)],
              partitions=128, free=free, dtypes=(dtype,), out_dtype=dtype)
    return b


def busy(b: TraceBuilder, engine: str, target: str = "trn2") -> float:
    return estimate(b.trace, target).busy_ns[engine]


def test_vector_copy_pays_the_stride_penalty_above_16_bytes():
    plain = (512 + P["vector_static_cycles"]) / P["vector_ghz"]  # max(64, N) + static, fp32: no performance mode
    strided = (2 * 512 + P["vector_static_cycles"]) / P["vector_ghz"]  # the 512 streamed elements count twice
    for stride, expected in ((0, plain), (4, plain), (8, plain), (16, plain), (20, strided), (32, strided)):
        assert busy(one_copy(stride), "vector") == pytest.approx(expected), stride
    assert busy(one_copy(32, memory="psum"), "vector") == pytest.approx(plain)  # documented for SBUF only
    assert busy(one_copy(32), "vector", "trn1") == pytest.approx((2 * 512 + 100) / 1.12)  # v2: ARCH2 itself


def test_min_ii_still_bounds_a_short_strided_instruction():
    # N = 20: max(64, 2 * 20) = 64 cycles, the penalty hides under the initiation interval
    assert busy(one_copy(32, free=20), "vector") == pytest.approx((64 + P["vector_static_cycles"]) / P["vector_ghz"])


def test_16_bit_performance_mode_needs_a_contiguous_innermost_dimension():
    cycles = {2: 512 / 4, 4: 512 / 2, 32: 2 * 512 / 2}  # 4x contiguous, 2x otherwise (ARCH3), then the penalty
    for stride, n in cycles.items():
        expected = (n + P["vector_static_cycles"]) / P["vector_ghz"]
        assert busy(one_copy(stride, dtype="float16"), "vector") == pytest.approx(expected), stride


def test_tensor_engine_pays_it_on_a_strided_moving_operand_only():
    def matmul(moving_stride: int, stationary_stride: int) -> float:
        b = TraceBuilder("mm")
        w, x, acc = b.buffer("w", "sbuf", 128, 256), b.buffer("x", "sbuf", 128, 16384), b.buffer("a", "psum", 128, 2048)
        b.compute("tensor", "nc_matmul", [b.at(w, stride_bytes=stationary_stride), b.at(x, stride_bytes=moving_stride)],
                  [b.at(acc)], partitions=128, free=512, k=128, m=128, dtypes=("float16", "float16"))
        return busy(b, "tensor")
    assert matmul(2, 2) == pytest.approx((512 + P["mm_fixed_cycles"]) / P["tensor_ghz"])
    assert matmul(2, 32) == pytest.approx((512 + P["mm_fixed_cycles"]) / P["tensor_ghz"])
    assert matmul(32, 2) == pytest.approx((2 * 512 + P["mm_fixed_cycles"]) / P["tensor_ghz"])


# ---- the SBUF stride penalty, through the interpreter ----

@nki.jit
def add_one_strided(a, step):
    """VectorE tensor_scalar on 512 fp32 elements per partition taken every `step` elements of a loaded tile."""
    out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
    t = nl.load(a)
    r = nisa.tensor_scalar(t[:, 0:512 * step:step], nl.add, 1.0)
    nl.store(out, r)
    return out


@pytest.mark.parametrize("step", [1, 2, 8])
def test_interpreter_records_the_stride_and_the_model_charges_it(step):
    a = np.random.default_rng(0).random((128, 4096), dtype=np.float32)
    traces = []
    for numerics in (True, False):
        out, trace = simulate_traced(add_one_strided, a.copy(), step=step, numerics=numerics)
        traces.append(trace)
        if numerics:
            np.testing.assert_array_equal(out, a[:, 0:512 * step:step] + np.float32(1.0))
    full, only = traces
    (op,) = [i for i in full.instrs if i.op == "tensor_scalar"]
    (op_only,) = [i for i in only.instrs if i.op == "tensor_scalar"]
    assert op_only == op  # a trace-only run records the same strides
    stride = 4 * step  # fp32 elements `step` apart: 4, 8, 32 bytes
    assert [r.stride_bytes for r in op.reads if r.memory == "sbuf"] == [stride]
    assert [w.stride_bytes for w in op.writes] == [4]  # the result tile is contiguous
    est = estimate(full)
    (item,) = [it for it in est.timeline if it.op == "tensor_scalar"]
    n = 2 * 512 if stride > 16 else 512  # only step 8 (32 bytes) pays: 8 bytes is within the 16-byte limit
    assert item.end_ns - item.start_ns == pytest.approx((n + P["vector_static_cycles"]) / P["vector_ghz"])
