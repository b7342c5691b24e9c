"""The instruction trace of small kernels: instruction kinds, engines, shapes, dtypes, bytes, DMA chunks, matmul
k/m, accumulation, access regions, kernel lines, and allocations with live ranges."""
from __future__ import annotations

import numpy as np

from tilec.nki import api
from nki_testutil import KERNELS, kernel


def test_vector_add_stream_trace() -> None:
    a = np.arange(25600, dtype=np.float32)
    out, trace = api.simulate_traced(kernel("asst.py", "vector_add_stream_200"), a, a)
    ops = [(i.engine, i.op) for i in trace.instrs]
    assert ops == [("dma", "dma_copy"), ("dma", "dma_copy"), ("vector", "tensor_tensor"), ("dma", "dma_copy")]
    load, _, add, store = trace.instrs
    assert [i.seq for i in trace.instrs] == [0, 1, 2, 3]
    # a_vec_re[:, 0:200] of a (128, 200) view: one contiguous 800-byte row per partition
    assert (load.partitions, load.free, load.bytes) == (128, 200, 128 * 200 * 4)
    assert (load.dma_chunks, load.dma_chunk_bytes) == (128, 800)
    assert load.in_dtypes == ("float32",) and load.out_dtype == "float32"
    (src,), (dst,) = load.reads, load.writes
    assert (src.memory, src.name, src.p0, src.p1, src.lo, src.hi) == ("hbm", "a_vec", 0, 1, 0, 102400)
    assert (dst.memory, dst.name, dst.p0, dst.p1, dst.lo, dst.hi) == ("sbuf", "a_tile", 0, 128, 0, 800)
    assert add.attr("alu") == "add" and add.bytes == 0 and (add.partitions, add.free) == (128, 200)
    assert [a.name for a in add.reads] == ["a_tile", "b_tile"] and add.writes[0].name == "res"
    assert store.writes[0].memory == "hbm" and store.reads[0].name == "res"
    assert load.file == str(KERNELS / "asst.py")
    lines = (KERNELS / "asst.py").read_text().splitlines()
    start = lines.index("def vector_add_stream_200(a_vec, b_vec):")
    store_line = next(i + 1 for i in range(start, len(lines)) if "nisa.dma_copy(src=res, dst=out" in lines[i])
    assert store.line == store_line and add.line == store_line - 3
    allocs = {a.name: a for a in trace.allocs}
    assert allocs["a_tile"].memory == "sbuf" and allocs["a_tile"].partitions == 128
    assert allocs["a_tile"].bytes_per_partition == 800
    assert (allocs["a_tile"].first_seq, allocs["a_tile"].last_seq) == (0, 2)
    assert (allocs["res"].first_seq, allocs["res"].last_seq) == (2, 3)
    assert allocs["a_vec"].memory == "hbm" and allocs["a_vec"].bytes_per_partition == 102400


def test_matmul_trace_accumulates_into_psum() -> None:
    lhsT = np.ones((256, 128), np.float16)
    rhs = np.ones((256, 512), np.float16)
    result = np.zeros((128, 512), np.float16)
    _, trace = api.simulate_traced(kernel("asst.py", "nki_matmul_tiled_"), lhsT, rhs, result)
    ops = [i.op for i in trace.instrs]
    # zeros(psum) is a memset; 2 x (2 loads + matmul); PSUM -> SBUF copy; store
    assert ops == ["memset", "dma_copy", "dma_copy", "nc_matmul", "dma_copy", "dma_copy", "nc_matmul",
                   "tensor_copy", "dma_copy"]
    mms = [i for i in trace.instrs if i.op == "nc_matmul"]
    for mm in mms:
        assert (mm.engine, mm.k, mm.m, mm.free, mm.partitions, mm.accumulate) == ("tensor", 128, 128, 512, 128, True)
        assert mm.in_dtypes == ("float16", "float16") and mm.out_dtype == "float32"
        assert mm.writes[0].name == "res_psum" and mm.writes[0].memory == "psum"
        assert (mm.writes[0].lo, mm.writes[0].hi) == (0, 2048)
    copy = trace.instrs[7]
    assert copy.engine == "vector" and copy.out_dtype == "float16" and copy.reads[0].memory == "psum"
    psum = [a for a in trace.allocs if a.memory == "psum"]
    assert len(psum) == 1 and psum[0].bytes_per_partition == 2048  # the matmul results never got their own bank
    np.testing.assert_array_equal(result, np.full((128, 512), 256, np.float16))


def test_trace_is_deterministic() -> None:
    a = np.random.default_rng(0).random(2048, dtype=np.float32)
    _, t1 = api.simulate_traced(kernel("asst.py", "vector_add_tiled_128"), a, a)
    _, t2 = api.simulate_traced(kernel("asst.py", "vector_add_tiled_128"), a, a)
    assert t1.instrs == t2.instrs and t1.allocs == t2.allocs
    assert t1.kernel == "vector_add_tiled_128" and t1.target == "trn2" and t1.skip_middle_end
