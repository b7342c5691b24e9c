"""Cost rules of the less common VectorE/GpSimdE instructions, on hand-built traces, computed by hand from their NISA
docstring formulas (nki-spec §2.4) and the parameter table."""
from __future__ import annotations

import pytest

from tilec.perf.api import estimate
from tilec.perf.params import TRN2
from tilec.perf.tracebuild import TraceBuilder

P = {name: value for name, value, _ in TRN2.table()}
MIN_II = P["min_ii_cycles"]


def vector_ns(cycles: float, engine: str = "vector") -> float:
    return (cycles + P[f"{engine}_static_cycles"]) / P[f"{engine}_ghz"]


def one(op: str, reads: list[tuple[str, int, str]], out_free: int, out_dtype: str = "float32",
        attrs: tuple = (), engine: str = "vector") -> float:
    """Busy time of a single instruction reading (memory, free elements, dtype) operands on 128 partitions."""
    b = TraceBuilder(op)
    accs, dts = [], []
    for i, (memory, free, dtype) in enumerate(reads):
        size = 2 if dtype in ("bfloat16", "float16") else 4 if dtype == "float32" else 1
        buf = b.buffer(f"in{i}", memory, 128, free * size)
        accs.append(b.at(buf, stride_bytes=size))
        dts.append(dtype)
    out = b.buffer("out", "sbuf", 128, out_free * 4)
    b.compute(engine, op, accs, [b.at(out, stride_bytes=4)], partitions=128, free=out_free, dtypes=tuple(dts),
              out_dtype=out_dtype, attrs=attrs)
    return estimate(b.trace).busy_ns[engine]


@pytest.mark.parametrize("n", [16, 512])
def test_copy_predicated_is_2n_from_sbuf_and_n_with_a_psum_operand(n: int):
    sbuf = one("tensor_copy_predicated", [("sbuf", n, "float32"), ("sbuf", n, "uint8")], n)
    psum = one("tensor_copy_predicated", [("psum", n, "float32"), ("sbuf", n, "uint8")], n)
    assert sbuf == pytest.approx(vector_ns(max(MIN_II, 2 * n)))
    assert psum == pytest.approx(vector_ns(max(MIN_II, n)))


def test_scalar_tensor_tensor_fast_case_needs_bf16_subtract_multiply_and_even_n():
    alu = (("alu", ("subtract", "multiply")),)
    bf = [("sbuf", 512, "bfloat16"), ("sbuf", 1, "float32"), ("sbuf", 512, "bfloat16")]
    assert one("scalar_tensor_tensor", bf, 512, "bfloat16", alu) == pytest.approx(vector_ns(512))
    assert one("scalar_tensor_tensor", bf, 512, "bfloat16", (("alu", ("add", "multiply")),)) == \
        pytest.approx(vector_ns(1024))
    odd = [("sbuf", 511, "bfloat16"), ("sbuf", 511, "bfloat16")]
    assert one("scalar_tensor_tensor", odd, 511, "bfloat16", alu) == pytest.approx(vector_ns(1022))
    fp32 = [("sbuf", 512, "float32"), ("sbuf", 512, "float32")]
    assert one("scalar_tensor_tensor", fp32, 512, "float32", alu) == pytest.approx(vector_ns(1024))


def test_scan_is_max_min_ii_2n():
    two = [("sbuf", 512, "float32"), ("sbuf", 512, "float32")]
    assert one("tensor_tensor_scan", two, 512) == pytest.approx(vector_ns(1024))
    tiny = [("sbuf", 8, "float32"), ("sbuf", 8, "float32")]
    assert one("tensor_tensor_scan", tiny, 8) == pytest.approx(vector_ns(MIN_II))


def test_bn_stats_and_aggr_count_the_input_elements():
    b = TraceBuilder("bn")
    x = b.buffer("x", "sbuf", 128, 512 * 4)
    stats = b.buffer("stats", "sbuf", 128, 12 * 4)
    mv = b.buffer("mv", "sbuf", 128, 2 * 4)
    b.compute("vector", "bn_stats", [b.at(x, stride_bytes=4)], [b.at(stats, hi=24, stride_bytes=4)],
              partitions=128, free=6, attrs=(("in_free", 512),))
    b.compute("vector", "bn_aggr", [b.at(stats, stride_bytes=4)], [b.at(mv, stride_bytes=4)], partitions=128,
              free=2, attrs=(("in_free", 12),))
    busy = estimate(b.trace).busy_ns["vector"]
    assert busy == pytest.approx(vector_ns(512) + vector_ns(max(MIN_II, 13 * 12 / 3)))


def test_partition_reduce_keeps_the_default_rule():
    got = one("tensor_partition_reduce", [("sbuf", 300, "float32")], 300, engine="gpsimd")
    assert got == pytest.approx(vector_ns(max(MIN_II, 300), "gpsimd"))


@pytest.mark.parametrize("alu, dtype, out_dtype, cycles", [
    ("add", "bfloat16", "bfloat16", 256), ("maximum", "bfloat16", "bfloat16", 256),
    ("minimum", "bfloat16", "bfloat16", 512), ("multiply", "bfloat16", "bfloat16", 512),
    ("add", "float16", "float16", 512), ("add", "bfloat16", "float32", 512), ("add", "float32", "float32", 512)])
def test_tensor_reduce_halves_only_bf16_to_bf16_add_and_max(alu: str, dtype: str, out_dtype: str, cycles: int):
    """nki-spec §2.4 [NISA tensor_reduce]: N cycles, N/2 for bf16 -> bf16 add/max (pool14 saw min priced half)."""
    busy = one("tensor_reduce", [("sbuf", 512, dtype)], 1, out_dtype, (("alu", alu), ("in_free", 512)))
    assert busy == pytest.approx(vector_ns(cycles))
