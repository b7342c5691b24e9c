"""NKI API semantics and numerics on small kernels (api_kernels.py), each against a NumPy reference."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tilec  # noqa: F401  (installs the neuronxcc shim)
import api_kernels as k  # noqa: E402
from tilec.nki import api

F32 = np.float32
RNG = np.random.default_rng(7)


def test_tensor_scalar_forms() -> None:
    a = RNG.random((128, 64), dtype=F32)
    v = RNG.random((128, 1), dtype=F32) + 0.5
    out = k.scalar_forms(a, v)
    np.testing.assert_array_equal(out[0], F32(1) - a)
    np.testing.assert_array_equal(out[1], a * v + F32(2.5))
    np.testing.assert_array_equal(out[2], F32(4.0) / (a - v))  # reverse1: operand1 op1 (data op0 operand0)
    np.testing.assert_array_equal(out[3], a * v + F32(0.5))


def test_reduce_and_activation() -> None:
    a = RNG.random((128, 64), dtype=F32)
    bias = RNG.random((128, 1), dtype=F32)
    mx, sm, act, acc = k.reduce_and_activation(a, bias)
    t = a.reshape(128, 4, 16)
    np.testing.assert_array_equal(mx[:, 0], t.max(axis=(1, 2)))
    np.testing.assert_allclose(sm, -t.sum(axis=2), rtol=1e-6)
    ref = np.exp(t.astype(np.float64) * 0.5 + bias[:, :, None])
    np.testing.assert_allclose(act, ref, rtol=1e-6)  # fp32 exp: a few ulp
    np.testing.assert_allclose(acc[:, 0], ref.sum(axis=(1, 2)), rtol=1e-5)


def test_iota_and_affine_select() -> None:
    out = k.causal_mask()
    p, f = np.mgrid[0:128, 0:128]
    np.testing.assert_array_equal(out, np.where(f <= p, p * 1000 + f, -1.0).astype(F32))


def test_dma_and_vector_transpose() -> None:
    a = RNG.random((128, 64), dtype=F32).astype(np.float16)
    small = RNG.random((32, 32), dtype=F32)
    t1, t2 = k.transposes(a, small)
    np.testing.assert_array_equal(t1, a.T)
    np.testing.assert_array_equal(t2, small.T)


def test_mgrid_strided_gather() -> None:
    a = RNG.random((128, 64), dtype=F32)
    np.testing.assert_array_equal(k.gather_with_mgrid(a), a[:, 1::2])


def test_matmul_with_3d_moving_operand() -> None:
    w = RNG.random((128, 128), dtype=F32).astype(np.float16)
    x = RNG.random((128, 2, 100), dtype=F32).astype(np.float16)
    out = k.matmul_3d_moving(w, x)
    ref = 2 * np.einsum("km,kab->mab", w.astype(np.float64), x.astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_low_precision_storage_rounds_like_hardware() -> None:
    a = (RNG.standard_normal((128, 32)) * 10).astype(F32)
    bf, f8, h = k.casts(a)
    # round-to-nearest-even into the tile dtype, as ml_dtypes / numpy casts do
    np.testing.assert_array_equal(bf.view(np.uint16), a.astype(ml_dtypes.bfloat16).view(np.uint16))
    np.testing.assert_array_equal(f8.view(np.uint8), a.astype(ml_dtypes.float8_e4m3).view(np.uint8))
    np.testing.assert_array_equal(h, a.astype(np.float16))
    assert bf.dtype == ml_dtypes.bfloat16 and not np.array_equal(bf.astype(F32), a)  # really rounded


def test_language_ops_and_operators() -> None:
    a = RNG.random((128, 64), dtype=F32)
    row = RNG.random((1, 64), dtype=F32)
    out = k.language_ops(a, row)
    np.testing.assert_array_equal(out[0], a * F32(2) + F32(1))
    np.testing.assert_array_equal(out[1], a + row)
    np.testing.assert_allclose(out[2], np.exp(a - a.max(axis=1, keepdims=True)), rtol=1e-6)


def test_six_dimensional_tiles() -> None:
    a = RNG.random((128, 2, 2, 2, 2, 4), dtype=F32)
    np.testing.assert_array_equal(k.six_d_tiles(a), a * F32(3))


def test_spmd_grid_runs_each_program() -> None:
    a = RNG.random((384, 16), dtype=F32)
    out = k.spmd_rows[3](a)
    np.testing.assert_array_equal(out, a + np.repeat(np.arange(3, dtype=F32), 128)[:, None])


def test_device_print_prints_in_simulation(capsys) -> None:
    a = np.ones((2, 3), F32)
    import neuronxcc.nki as nki

    np.testing.assert_array_equal(nki.simulate_kernel(k.printing, a), a)
    assert capsys.readouterr().out.startswith("tile t: [[1. 1. 1.]")


def test_benchmark_reports_the_model_estimate_labelled_as_such(capsys) -> None:
    import neuronxcc.nki as nki

    from tilec.perf.api import estimate

    bench = nki.benchmark(warmup=1, iters=1)(k.printing.__wrapped__)
    bench(np.ones((128, 4), F32))
    expected = estimate(bench.last_trace).total_us
    assert f"estimated by tilec's model: {expected:.1f} us (not a hardware measurement)" in capsys.readouterr().out
    assert bench.benchmark_result.nc_latency.get_latency_percentile(99) == expected


def test_benchmark_without_the_model_says_no_timing(capsys, monkeypatch) -> None:
    import neuronxcc.nki as nki

    from tilec.nki import hooks

    monkeypatch.setattr(hooks, "_estimator", None)
    bench = nki.benchmark(warmup=1, iters=1)(k.printing.__wrapped__)
    bench(np.ones((128, 4), F32))
    assert "no timing available" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="no timing available"):
        bench.benchmark_result.nc_latency.get_latency_percentile(99)


def test_shim_serves_the_interpreter_when_neuronxcc_is_absent() -> None:
    from tilec.nki import shim

    assert shim.active_backend() == "tilec"
    import neuronxcc.nki.language as nl

    assert nl.tile_size.pmax == 128 and nl.bfloat16 == np.dtype(ml_dtypes.bfloat16)


def test_mask_psum_indexed_accumulate_and_nl_matmul() -> None:
    a = RNG.random((128, 64), dtype=F32)
    b = RNG.random((64, 64), dtype=F32)
    out, out_mm = k.masked_and_language_matmul(a, b)
    np.testing.assert_array_equal(out[:, :32], a[:, :32] * F32(2))
    np.testing.assert_array_equal(out[:, 32:], np.zeros((128, 32), F32))
    np.testing.assert_allclose(out_mm, a.astype(np.float64) @ b, rtol=1e-5)


def test_broadcast_and_nl_transpose() -> None:
    col = RNG.random((128, 1), dtype=F32)
    sq = RNG.random((128, 64), dtype=F32)
    out, out_t = k.broadcast_and_transpose(col, sq)
    np.testing.assert_array_equal(out, np.repeat(col, 16, axis=1))
    np.testing.assert_array_equal(out_t, sq.T)


def test_masked_tail_rows() -> None:
    a = RNG.random((300, 8), dtype=F32)
    np.testing.assert_array_equal(k.masked_tail_rows(a), a * a)


def test_tail_without_mask_is_out_of_bounds() -> None:
    from tilec.nki import rules
    from nki_testutil import first_line, line_of

    with pytest.raises(rules.NkiIndexError) as info:
        api.simulate(k.unmasked_tail_rows, RNG.random((300, 8), dtype=F32))
    assert first_line(info.value) == (f"{k.__file__}:{line_of(k.__file__, '# <- TAIL_NO_MASK')}: error: index range "
                                      "[256, 383] exceed dimension size of 300 [err_tensor_access_out_of_bound]")


def test_rmsnorm_with_language_ops() -> None:
    a = RNG.standard_normal((256, 96)).astype(F32)
    gamma = RNG.random(96, dtype=F32)
    out = k.rmsnorm_rows(a, gamma)
    ref = a / np.sqrt((a.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-6) * gamma
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)  # fp32 mean, rsqrt and products: a few ulp


def test_softmax_with_language_ops() -> None:
    a = RNG.standard_normal((128, 200)).astype(F32)
    out = k.softmax_rows(a)
    e = np.exp(a.astype(np.float64) - a.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-8)


def test_indirect_gather_and_scatter() -> None:
    table = RNG.random((512, 16), dtype=F32)
    idx = RNG.permutation(512)[:128].astype(np.int32).reshape(128, 1)
    with pytest.warns(UserWarning, match="output 'table2' is only partly written"):
        out, table2 = k.gather_scatter_rows(table, idx)
    np.testing.assert_array_equal(out, table[idx[:, 0]])
    np.testing.assert_array_equal(table2[idx[:, 0]], table[idx[:, 0]] * F32(2))


def test_indirect_out_of_bounds_raises_index_error_or_skips() -> None:
    from tilec.nki import rules
    from nki_testutil import first_line, line_of

    table = RNG.random((64, 8), dtype=F32)
    idx = np.arange(128, dtype=np.int32).reshape(128, 1)  # rows 64.. are outside
    with pytest.raises(IndexError) as info:
        api.simulate(k.gather_out_of_bounds, table, idx, False)
    # NumPy's class and wording, as AWS's simulator raises it (its v2.26.1 doc tests compare both); the kernel line
    # rides along as a note
    assert type(info.value) is IndexError
    assert str(info.value) == "index 512 is out of bounds for axis 0 with size 512"
    assert first_line(info.value.__notes__[0]) == (
        f"{k.__file__}:{line_of(k.__file__, '# <- GATHER_OOB')}: error: indirect DMA row out of bounds "
        "[dma_indirect_out_of_bounds]")
    out = api.simulate(k.gather_out_of_bounds, table, idx, True)
    np.testing.assert_array_equal(out[:64], table)
    np.testing.assert_array_equal(out[64:], np.zeros((64, 8), F32))  # skipped rows keep their old values


@pytest.mark.parametrize("m", [64, 128])  # M = 128 makes a (K, 1) mask also fit the output: still the K rows
def test_matmul_operand_mask_on_ragged_contraction(m: int) -> None:
    a = RNG.random((200, m), dtype=F32)
    b = RNG.random((200, 256), dtype=F32)
    out = k.matmul_ragged_k(a, b)
    # 200 exact fp32 products of values < 1 summed in fp32: relative error well under 1e-5
    np.testing.assert_allclose(out, a.astype(np.float64).T @ b.astype(np.float64), rtol=1e-5, atol=0)


def test_load_transpose2d_moves_bits() -> None:
    a = RNG.random((64, 128), dtype=F32).astype(np.float16)
    out, trace = api.simulate_traced(k.load_transposed, a)
    np.testing.assert_array_equal(out.view(np.uint16), np.ascontiguousarray(a.T).view(np.uint16))
    assert [i.op for i in trace.instrs] == ["dma_transpose", "dma_copy"]


def test_language_compute_honours_masks_on_ragged_tiles() -> None:
    a = RNG.random((300, 700), dtype=F32).astype(np.float16)
    b = RNG.random((300, 700), dtype=F32).astype(np.float16)
    out = k.tensor_add_masked(a, b)
    # VectorE adds in fp32 and rounds to fp16; doubling is exact
    expected = (a.astype(F32) + b.astype(F32)).astype(np.float16).astype(F32) * 2
    np.testing.assert_array_equal(out.astype(F32), expected)


def test_where_honours_its_mask() -> None:
    a = RNG.random((128, 300), dtype=F32)
    np.testing.assert_array_equal(k.where_masked(a), np.where(a > 0.5, a, F32(0)))
