"""NKI 0.1 semantics that AWS's nki-samples kernels rely on (issue 15), each on a small kernel of our own checked
against NumPy: slices past a tensor's end under mask=, broadcasting a lower-rank tile, block-dimension PSUM tiles,
and the race check on block-dimension buffers."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401  (installs the neuronxcc shim)
import neuronxcc.nki as nki
import neuronxcc.nki.compiler as ncc
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from tilec.errors import KernelError
from tilec.nki import api, rules

RNG = np.random.default_rng(15)
F32 = np.float32


# ---- a basic slice running past the end of a tensor is legal where mask= cuts the tail off ----
@nki.jit
def _row_tiles_doubled(x, masked):
    rows, cols = x.shape
    out = nl.ndarray((rows, cols), F32, buffer=nl.shared_hbm)
    for i in nl.affine_range((rows + 127) // 128):
        ip = nl.arange(128)[:, None] + i * 128
        t = nl.ndarray((128, cols), F32, buffer=nl.sbuf)
        mask = (ip < rows) if masked else None
        nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :], mask=mask)
        d = nl.multiply(t, 2.0, mask=mask)
        nl.store(out[i * 128:(i + 1) * 128, :], value=d, mask=mask)
    return out


def test_slice_past_the_end_under_a_mask_moves_only_the_rows_inside() -> None:
    x = RNG.random((300, 24), dtype=F32)
    np.testing.assert_array_equal(api.simulate(_row_tiles_doubled, x, True), 2 * x)


def test_slice_past_the_end_without_a_mask_is_the_out_of_bound_error() -> None:
    with pytest.raises(KernelError) as info:
        api.simulate(_row_tiles_doubled, RNG.random((300, 24), dtype=F32), False)
    assert isinstance(info.value, rules.NkiIndexError)
    assert "index range [256, 383] exceed dimension size of 300 [err_tensor_access_out_of_bound]" in str(info.value)


@nki.jit
def _slice_starts_outside(x):
    out = nl.ndarray((128, 8), F32, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 8), F32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[300:428, :], mask=(nl.arange(128)[:, None] < 0))
    nl.store(out, t)
    return out


def test_slice_starting_outside_the_tensor_stays_an_error() -> None:
    with pytest.raises(KernelError, match="err_tensor_access_out_of_bound"):
        api.simulate(_slice_starts_outside, RNG.random((300, 8), dtype=F32))


# ---- broadcast_to of a lower-rank on-chip tile keeps its partition dimension ----
@nki.jit
def _rows_over_their_sum(x):
    p, f = x.shape
    out = nl.ndarray((p, 16), F32, buffer=nl.shared_hbm)
    t = nl.load(x)
    sums = nisa.tensor_reduce(np.add, data=t, axis=(1,), dtype=F32)  # (P,): keepdims=False
    nl.store(out, nl.copy((1.0 / sums).broadcast_to((p, 16)), dtype=F32))
    return out


def test_broadcast_of_row_sums_repeats_each_partition_along_the_free_dim() -> None:
    x = RNG.random((128, 40), dtype=F32) + 0.5
    want = np.repeat(1.0 / x.sum(axis=1, keepdims=True), 16, axis=1)
    np.testing.assert_allclose(api.simulate(_rows_over_their_sum, x), want, rtol=1e-6)


# ---- PSUM block dimensions: the bank limit applies to each block's tile ----
@nki.jit
def _blocked_psum_matmuls(a, b):
    k, m = a.shape
    out = nl.ndarray((m, 4 * 512), F32, buffer=nl.shared_hbm)
    lhs = nl.load(a)
    acc = nl.ndarray((4, nl.par_dim(m), 512), F32, buffer=nl.psum)  # 4 banks' worth, one bank per block
    for j in nl.affine_range(4):
        acc[j] = nisa.nc_matmul(lhs, nl.load(b[:, j * 512:(j + 1) * 512]))
        nl.store(out[:, j * 512:(j + 1) * 512], value=nl.copy(acc[j]))
    return out


def test_block_dimension_psum_tile_is_one_bank_per_block() -> None:
    a, b = RNG.random((64, 128), dtype=F32), RNG.random((64, 2048), dtype=F32)
    with pytest.warns(rules.NkiPortabilityWarning, match="block dimensions"):
        got = api.simulate(_blocked_psum_matmuls, a, b)
    np.testing.assert_allclose(got, a.T @ b, rtol=1e-4)


@nki.jit
def _psum_tile_over_a_bank(a):
    out = nl.ndarray((128, 1024), F32, buffer=nl.shared_hbm)
    acc = nl.zeros((nl.par_dim(128), 1024), F32, buffer=nl.psum)
    nl.store(out, nl.copy(acc))
    return out


def test_a_psum_tile_over_one_bank_stays_an_error() -> None:
    with pytest.raises(KernelError, match="more than one 2048-byte PSUM bank"):
        api.simulate(_psum_tile_over_a_bank, np.zeros((1, 1), F32))


# ---- activation_reduce: np.sum is an addition ----
@nki.jit
def _exp_and_row_sums(x):
    p, f = x.shape
    out_e = nl.ndarray((p, f), F32, buffer=nl.shared_hbm)
    out_s = nl.ndarray((p, 1), F32, buffer=nl.shared_hbm)
    sums = nl.ndarray((p, 1), F32, buffer=nl.sbuf)
    e = nisa.activation_reduce(np.exp, data=nl.load(x), reduce_op=np.sum, reduce_res=sums)
    nl.store(out_e, e)
    nl.store(out_s, sums)
    return out_e, out_s


def test_activation_reduce_accepts_np_sum() -> None:
    x = RNG.random((128, 96), dtype=F32)
    e, s = api.simulate(_exp_and_row_sums, x)
    np.testing.assert_allclose(e, np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(s, np.exp(x).sum(axis=1, keepdims=True), rtol=1e-5)


# ---- the race check on block-dimension buffers (accesses of different shapes per iteration) ----
@nki.jit
def _blocks_of_varying_width(x, clash):
    n = x.shape[0] // 128
    out = nl.ndarray((128, n), F32, buffer=nl.shared_hbm)
    buf = nl.zeros((n, nl.par_dim(128), 12), F32, buffer=nl.sbuf)
    sums = nl.ndarray((128, n), F32, buffer=nl.sbuf)
    for i in nl.affine_range(n):
        w = 5 + i % 7  # each iteration's access has its own shape
        blk = (i + 1) % n if clash else i
        nisa.dma_copy(dst=buf[blk, :, 0:w], src=x[i * 128:(i + 1) * 128, 0:w])
        sums[:, i] = nl.sum(buf[i, :, 0:w], axis=[1])
    nl.store(out, sums)
    return out


def test_block_buffers_of_independent_iterations_do_not_race() -> None:
    x = RNG.random((128 * 16, 12), dtype=F32)
    with pytest.warns(rules.NkiPortabilityWarning):
        got = api.simulate(_blocks_of_varying_width, x, False)
    want = np.stack([x[i * 128:(i + 1) * 128, :5 + i % 7].sum(axis=1) for i in range(16)], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_block_buffer_written_by_one_iteration_and_read_by_another_races() -> None:
    with pytest.warns(rules.NkiPortabilityWarning), pytest.raises(KernelError) as info:
        api.simulate(_blocks_of_varying_width, RNG.random((128 * 16, 12), dtype=F32), True)
    assert isinstance(info.value, rules.LoopCarriedDependenceError)
    assert "loop-carried dependence in affine_range loop" in str(info.value)


# ---- direct allocation: a PSUM accumulation group opens on a fresh tile; stale reads are not errors ----
@nki.jit
def _k_tiled_matmul(a, b, direct):
    k, m = a.shape
    out = nl.ndarray((m, b.shape[1]), F32, buffer=nl.shared_hbm)
    buffer = ncc.psum.mod_alloc(base_bank=0, num_bank_tiles=(1,)) if direct else nl.psum
    acc = nl.ndarray((nl.par_dim(m), b.shape[1]), F32, buffer=buffer)
    for i in nl.affine_range(k // 128):
        acc += nisa.nc_matmul(nl.load(a[i * 128:(i + 1) * 128, :]), nl.load(b[i * 128:(i + 1) * 128, :]))
    nl.store(out, nl.copy(acc))
    return out


def test_direct_psum_accumulation_group_starts_by_overwriting() -> None:
    a, b = RNG.random((384, 64), dtype=F32), RNG.random((384, 96), dtype=F32)
    np.testing.assert_allclose(api.simulate(_k_tiled_matmul, a, b, True), a.T @ b, rtol=1e-4)


def test_auto_allocated_psum_without_zeros_stays_an_uninitialized_read() -> None:
    with pytest.raises(KernelError) as info:
        api.simulate(_k_tiled_matmul, RNG.random((384, 64), dtype=F32), RNG.random((384, 96), dtype=F32), False)
    assert isinstance(info.value, rules.UninitializedReadError)


@nki.jit
def _stale_direct_tile(x):
    out = nl.ndarray(x.shape, F32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, F32, buffer=ncc.sbuf.mod_alloc(base_addr=0))
    t[0:64, :] = nl.load(x[0:64, :])
    nl.store(out, nl.copy(t))  # the lower rows were never written: stale bytes on hardware
    return out


def test_direct_sbuf_read_of_unwritten_rows_gives_unknown_values() -> None:
    x = RNG.random((128, 8), dtype=F32)
    got = api.simulate(_stale_direct_tile, x)
    np.testing.assert_array_equal(got[:64], x[:64])
    assert np.isnan(got[64:]).all()


# ---- a loop-index condition (a Python bool in an unrolled loop) conjoined with an affine predicate ----
@nki.jit
def _tiles_masked_by_loop_index(x):
    n, f = x.shape
    out = nl.ndarray((n, f), F32, buffer=nl.shared_hbm)
    ip, jf = nl.mgrid[0:128, 0:f]
    for i in nl.affine_range(2):
        t = nl.load(x[i * 128 + ip, jf])
        nl.store(out[i * 128 + ip, jf], value=nl.multiply(t, 3.0), mask=(jf < f - 2) & (i * 128 < 128))
    return out


def test_predicate_and_a_constant_condition() -> None:
    x = RNG.random((256, 8), dtype=F32)
    with pytest.warns(UserWarning, match="only partly written"):
        got = api.simulate(_tiles_masked_by_loop_index, x)
    np.testing.assert_allclose(got[:128, :6], 3 * x[:128, :6], rtol=1e-6)
    assert np.isnan(got[128:]).all() and np.isnan(got[:, 6:]).all()


# ---- nc_matmul under an output mask reads only the operand columns of the outputs it computes ----
@nki.jit
def _matmul_nothing_computed(a, b):
    out = nl.ndarray((64, 32), F32, buffer=nl.shared_hbm)
    lhs = nl.ndarray((128, 64), F32, buffer=nl.sbuf)  # never written
    rhs = nl.load(b)
    acc = nl.zeros((64, 32), F32, buffer=nl.psum)
    acc += nisa.nc_matmul(lhs, rhs, mask=(a.shape[0] < 0))
    nl.store(out, nl.copy(acc))
    return out


def test_fully_masked_matmul_reads_no_operand_and_adds_nothing() -> None:
    got = api.simulate(_matmul_nothing_computed, np.zeros((1, 1), F32), RNG.random((128, 32), dtype=F32))
    np.testing.assert_array_equal(got, np.zeros((64, 32), F32))


# ---- an nc_transpose result the compiler placed (PSUM) as a matmul operand ----
@nki.jit
def _transposed_lhs_matmul(a, b):
    out = nl.ndarray((a.shape[0], b.shape[1]), F32, buffer=nl.shared_hbm)
    tr = nisa.nc_transpose(nl.load(a))  # (K, M) in PSUM: TensorE transposes into PSUM
    nl.store(out, nl.copy(nisa.nc_matmul(tr, nl.load(b))))
    return out


def test_psum_transpose_as_matmul_operand_is_copied_to_sbuf_with_a_warning() -> None:
    a, b = RNG.random((96, 128), dtype=F32), RNG.random((128, 40), dtype=F32)
    with pytest.warns(rules.NkiPortabilityWarning, match="NKI 0.2 \\(Neuron SDK 2.27\\)"):
        got, trace = api.simulate_traced(_transposed_lhs_matmul, a, b)
    np.testing.assert_allclose(got, a @ b, rtol=1e-4)
    ops = [(i.engine, i.op) for i in trace.instrs]
    assert ops.index(("vector", "tensor_copy")) < ops.index(("tensor", "nc_matmul"))


def test_psum_transpose_as_matmul_operand_is_an_error_under_a_later_api() -> None:
    a, b = RNG.random((96, 128), dtype=F32), RNG.random((128, 40), dtype=F32)
    with pytest.raises(KernelError) as info:
        api.simulate(_transposed_lhs_matmul, a, b, strict=True)
    assert isinstance(info.value, rules.MemoryRuleError)


@nki.jit
def _placed_psum_operand(a, b):
    out = nl.ndarray((a.shape[1], b.shape[1]), F32, buffer=nl.shared_hbm)
    p = nl.ndarray(a.shape, F32, buffer=nl.psum)
    p[...] = nl.copy(nl.load(a))
    nl.store(out, nl.copy(nisa.nc_matmul(p, nl.load(b))))
    return out


def test_a_psum_tile_the_kernel_placed_is_no_matmul_operand() -> None:
    with pytest.raises(KernelError, match="TensorE reads only SBUF"):
        api.simulate(_placed_psum_operand, RNG.random((64, 32), dtype=F32), RNG.random((64, 16), dtype=F32))


# ---- in-place operators on tiles: VectorE updates; += across affine_range iterations is a reduction ----
@nki.jit
def _sum_of_tiles(x):
    n = x.shape[0] // 128
    out = nl.ndarray((128, x.shape[1]), F32, buffer=nl.shared_hbm)
    acc = nl.zeros((128, x.shape[1]), F32, buffer=nl.sbuf)
    for i in nl.affine_range(n):
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        acc += t
    nl.store(out, acc)
    return out


def test_sbuf_plus_equals_across_affine_iterations_sums_the_tiles() -> None:
    x = RNG.random((128 * 6, 40), dtype=F32)
    np.testing.assert_allclose(api.simulate(_sum_of_tiles, x), x.reshape(6, 128, 40).sum(axis=0), rtol=1e-5)


@nki.jit
def _in_place_chain(x, col):
    out = nl.ndarray(x.shape, F32, buffer=nl.shared_hbm)
    t = nl.load(x)
    c = nl.load(col)
    t -= 1.0
    t *= c  # a (P, 1) column: broadcast along the free dim
    t /= 4.0
    p = nl.ndarray(x.shape, F32, buffer=nl.psum)
    p[...] = nl.copy(t)
    p += t  # PSUM, not a matmul: a VectorE add
    nl.store(out, nl.copy(p))
    return out


def test_in_place_operators_with_scalars_columns_and_psum() -> None:
    x, col = RNG.random((64, 24), dtype=F32), RNG.random((64, 1), dtype=F32)
    want = 2 * ((x - 1.0) * col / 4.0)
    np.testing.assert_allclose(api.simulate(_in_place_chain, x, col), want, rtol=1e-6)


@nki.jit
def _in_place_bad_shape(x):
    t = nl.load(x)
    u = nl.load(x[:, 0:3])
    t += u
    return x


def test_in_place_operand_that_does_not_broadcast_is_an_error() -> None:
    with pytest.raises(KernelError, match="does not broadcast"):
        api.simulate(_in_place_bad_shape, RNG.random((64, 8), dtype=F32))


# ---- an SBUF tile returned from a kernel: AWS's 0.1 simulator returned it; the hardware path rejects it ----
def _doubled_tile(x):
    t = nl.multiply(nl.load(x), 2.0)
    return t


def test_on_chip_output_is_returned_in_simulation_mode_with_a_warning() -> None:
    x = RNG.random((32, 16), dtype=F32)
    with pytest.warns(rules.NkiSimulationOnlyWarning, match="must return HBM tensors"):
        got = nki.jit(mode="simulation")(_doubled_tile)(x)
    np.testing.assert_array_equal(got, 2 * x)
    with pytest.warns(rules.NkiSimulationOnlyWarning):
        np.testing.assert_array_equal(nki.simulate_kernel(nki.jit(_doubled_tile), x), 2 * x)


def test_on_chip_output_is_an_error_outside_simulation() -> None:
    with pytest.raises(KernelError, match="must be an HBM tensor"):
        nki.jit(_doubled_tile)(RNG.random((32, 16), dtype=F32))
    with pytest.raises(KernelError, match="must be an HBM tensor"):
        nki.baremetal(_doubled_tile)(RNG.random((32, 16), dtype=F32))
