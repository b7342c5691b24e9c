"""The NKI 0.1 APIs AWS's suites use beyond the core set (issue 15), each against NumPy on kernels of our own."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401  (installs the neuronxcc shim)
import neuronxcc.nki as nki
import neuronxcc.nki.compiler as ncc
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from tilec.errors import KernelError
from tilec.nki import api

RNG = np.random.default_rng(7)
F32 = np.float32


@nki.jit
def _top8(x):
    out_v = nl.ndarray((x.shape[0], 8), F32, buffer=nl.shared_hbm)
    out_i = nl.ndarray((x.shape[0], 8), nl.uint32, buffer=nl.shared_hbm)
    out_r = nl.ndarray(x.shape, F32, buffer=nl.shared_hbm)
    idx = nl.ndarray((x.shape[0], 8), nl.uint32, buffer=nl.sbuf)
    t = nl.load(x)
    vals = nisa.max8(src=t)
    nl.store(out_v, vals)
    nl.store(out_i, nisa.nc_find_index8(data=t, vals=vals))
    nl.store(out_r, nisa.nc_match_replace8(data=t, vals=vals, imm=-1.0, dst_idx=idx))
    return out_v, out_i, out_r


def test_max8_find_index8_match_replace8() -> None:
    x = RNG.permutation(32 * 40).reshape(32, 40).astype(F32)  # distinct values: one first occurrence each
    vals, idx, replaced = api.simulate(_top8, x)
    want_idx = np.argsort(-x, axis=1)[:, :8]
    np.testing.assert_array_equal(vals, np.take_along_axis(x, want_idx, axis=1))
    np.testing.assert_array_equal(idx, want_idx.astype(np.uint32))
    want = x.copy()
    np.put_along_axis(want, want_idx, -1.0, axis=1)
    np.testing.assert_array_equal(replaced, want)


@nki.jit
def _shuffle(x):
    out = nl.ndarray((64, 16), F32, buffer=nl.shared_hbm)
    a = nl.load(x)
    b = nl.ndarray((64, 16), F32, buffer=nl.sbuf)
    nisa.nc_stream_shuffle(src=a, dst=b, shuffle_mask=[31 - i for i in range(32)])
    nl.store(out, b)
    return out


def test_stream_shuffle_reverses_each_quadrant() -> None:
    x = RNG.random((64, 16), dtype=F32)
    want = np.concatenate([x[31::-1], x[63:31:-1]])
    np.testing.assert_array_equal(api.simulate(_shuffle, x), want)


@nki.jit
def _random(x):
    out = nl.ndarray((2, 128, 64), F32, buffer=nl.shared_hbm)
    nl.random_seed(seed=5)
    nl.store(out[0], nl.rand((128, 64)))
    t = nl.load(x)
    nl.store(out[1], nl.dropout(t, rate=0.25))
    return out


def test_rand_is_uniform_and_seeded_and_dropout_zeroes_a_quarter() -> None:
    x = np.ones((128, 64), F32)
    a, b = api.simulate(_random, x), api.simulate(_random, x)
    np.testing.assert_array_equal(a, b)  # the same seed, the same draws
    assert 0 <= a[0].min() and a[0].max() < 1 and abs(a[0].mean() - 0.5) < 0.02
    zeros = (a[1] == 0).mean()
    assert abs(zeros - 0.25) < 0.03 and set(np.unique(a[1])) == {0.0, 1.0}  # kept values are not rescaled


@nki.jit
def _reductions(x, col):
    out = nl.ndarray((128, 3), F32, buffer=nl.shared_hbm)
    t = nl.load(x)
    c = nl.load(col)
    r = nl.ndarray((128, 3), F32, buffer=nl.sbuf)
    nisa.activation_reduce(op=nl.exp, data=t, reduce_op=nl.add, reduce_res=r[:, 0:1])
    nisa.tensor_scalar_reduce(data=t, op0=nl.multiply, operand0=c, reduce_op=nl.max, reduce_res=r[:, 1:2])
    r[:, 2:3] = nl.copy(nisa.reciprocal(c))
    nl.store(out, r)
    return out


def test_activation_reduce_tensor_scalar_reduce_reciprocal() -> None:
    x = RNG.random((128, 50), dtype=F32)
    col = RNG.random((128, 1), dtype=F32) + 0.5
    got = api.simulate(_reductions, x, col)
    np.testing.assert_allclose(got[:, 0], np.exp(x).sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(got[:, 1], (x * col).max(axis=1), rtol=1e-6)
    np.testing.assert_allclose(got[:, 2], 1 / col[:, 0], rtol=1e-6)


@nki.jit
def _loop_sum(x):  # x: (4, 128, 32) -> sum over the 4 blocks with nl.loop_reduce
    out = nl.ndarray((128, 32), F32, buffer=nl.shared_hbm)
    acc = nl.zeros((128, 32), F32, buffer=nl.sbuf)
    for i in nl.sequential_range(4):
        acc[...] = nl.loop_reduce(nl.load(x[i]), op=np.add, loop_indices=[i])
    nl.store(out, acc)
    return out


def test_loop_reduce_folds_into_its_destination() -> None:
    x = RNG.random((4, 128, 32), dtype=F32)
    np.testing.assert_allclose(api.simulate(_loop_sum, x), x.sum(axis=0), rtol=1e-6)


@nki.trace
def _identity_matmul(x):  # nki.trace + nki.compiler allocation + nl.shared_constant, as AWS's allocation tests use them
    out = nl.ndarray((128, 128), F32, buffer=nl.shared_hbm)
    ident = nl.shared_constant(np.identity(128, dtype=np.int8), dtype=nl.float32)
    i_sb = nl.ndarray((nl.par_dim(128), 128), F32, buffer=ncc.sbuf.mod_alloc(base_addr=0))
    i_sb[...] = nl.load(ident)
    x_sb = nl.ndarray((nl.par_dim(128), 128), F32, buffer=ncc.sbuf.mod_alloc(base_addr=512))
    x_sb[...] = nl.load(x)
    acc = nl.ndarray((128, 128), F32, buffer=ncc.psum.alloc(lambda *a: (0, 0, 0)))
    acc[...] = nisa.nc_matmul(x_sb, i_sb)
    nl.store(out, nl.copy(acc))
    return out


def test_trace_shared_constant_and_direct_allocation() -> None:
    x = RNG.random((128, 128), dtype=F32)
    np.testing.assert_allclose(api.simulate(_identity_matmul, x), x.T, rtol=1e-6)


@nki.jit
def _scatter_add(x, idx):  # out rows idx[p] += x[p], out starting at 1 (indirect destination, dst_rmw_op)
    out = nl.ndarray((2, 64, 8), F32, buffer=nl.shared_hbm)
    ones = nl.full((64, 8), 1.0, F32, buffer=nl.sbuf)
    nl.store(out[1], ones)
    t = nl.load(x)
    i = nl.load(idx)
    nisa.dma_copy(dst=out[1, i, :], src=t, dst_rmw_op=np.add)  # indirect index after an integer index
    return out


def test_indirect_store_adds_with_dst_rmw_op() -> None:
    x = RNG.random((32, 8), dtype=F32)
    idx = (2 * np.arange(32, dtype=np.int32)).reshape(32, 1)
    got = api.simulate(_scatter_add, x, idx)[1]
    want = np.ones((64, 8), F32)
    want[2 * np.arange(32)] += x
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_static_cast_and_finfo() -> None:
    a = nl.static_cast(np.array([1.5, 2.25]), nl.bfloat16)
    assert a.dtype == np.dtype(nl.bfloat16) and nl.static_cast(3.7, np.int32) == 3
    assert nl.finfo(nl.float16).max == 65504.0 and nl.finfo(nl.bfloat16).bits == 16
    assert nl.finfo(np.float32).min == np.finfo(np.float32).min


@nki.jit
def _bad_shuffle(x):
    a = nl.load(x)
    nisa.nc_stream_shuffle(src=a, dst=a, shuffle_mask=[0] * 31)
    return x


def test_bad_shuffle_mask_is_an_error() -> None:
    with pytest.raises(KernelError, match="shuffle_mask must list 32 partitions"):
        api.simulate(_bad_shuffle, np.ones((32, 4), F32))


@nki.jit
def _masked_rows(x, lo, hi):
    out = nl.ndarray((2, 128, 32), F32, buffer=nl.shared_hbm)
    t = nl.load(x)
    r = nl.ndarray((128, 1), F32, buffer=nl.sbuf)
    sel = nisa.range_select(on_true_tile=t, comp_op0=np.greater_equal, comp_op1=np.less, bound0=nl.load(lo),
                            bound1=nl.load(hi), reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=r,
                            reduce_op=np.max, range_start=4)
    nl.store(out[0], sel)
    nl.store(out[1], r.broadcast_to((128, 32)))
    return out


def test_range_select_keeps_the_index_window_and_reduces_its_max() -> None:
    x = RNG.random((128, 32), dtype=F32)
    lo = RNG.integers(4, 20, (128, 1)).astype(F32)
    hi = lo + RNG.integers(1, 10, (128, 1)).astype(F32)
    sel, red = api.simulate(_masked_rows, x, lo, hi)
    idx = 4 + np.arange(32)[None, :]
    keep = (idx >= lo) & (idx < hi)
    np.testing.assert_array_equal(sel, np.where(keep, x, np.finfo(F32).min))
    np.testing.assert_array_equal(red[:, 0], np.where(keep, x, -np.inf).max(axis=1))


@nki.jit
def _bounds(ids):
    out = nl.ndarray((1, 2, ids.shape[1]), F32, buffer=nl.shared_hbm)
    nl.store(out, nisa.sequence_bounds(segment_ids=nl.load(ids)))
    return out


def test_sequence_bounds() -> None:
    ids = np.array([[1, 1, 2, 2, 2, 0, 3, 0]], F32)
    want = np.array([[[0, 0, 2, 2, 2, 8, 6, 8], [2, 2, 5, 5, 5, -1, 7, -1]]], F32)
    np.testing.assert_array_equal(api.simulate(_bounds, ids), want)


@nki.jit
def _gather_and_rmw(x, idx, rows):
    out = nl.ndarray((2, 64, 16), F32, buffer=nl.shared_hbm)
    t = nl.load(x[0])
    g = nl.gather_flattened(data=t, indices=nl.load(idx))
    nl.store(out[0], g)
    nl.store(out[1], nl.load(x[1]))
    nl.atomic_rmw(out[1, nl.load(rows), :], value=t, op=np.add)
    return out


def test_gather_flattened_and_atomic_rmw() -> None:
    x = RNG.random((2, 64, 16), dtype=F32)
    idx = RNG.integers(0, 16, (64, 16)).astype(np.uint32)
    rows = RNG.permutation(64).astype(np.int32).reshape(64, 1)
    g, r = api.simulate(_gather_and_rmw, x, idx, rows)
    np.testing.assert_array_equal(g, np.take_along_axis(x[0], idx.astype(np.int64), axis=1))
    want = x[1].copy()
    want[rows[:, 0]] += x[0]
    np.testing.assert_allclose(r, want, rtol=1e-6)


@nki.jit
def _column_scale(x, m):  # AWS flash-attention idioms: a PSUM tile into affine_select, `t[:, i]` columns
    out = nl.ndarray((128, 64), F32, buffer=nl.shared_hbm)
    cols = nl.load(m)  # (128, 4)
    ps = nl.ndarray((128, 64), F32, buffer=nl.psum)
    ps[...] = nl.copy(nl.load(x))
    iy, ix = nl.mgrid[0:128, 0:64]
    causal = nisa.affine_select(iy >= ix, ps, -1.0)
    col = cols[:, 2]  # the (128, 1) column 2
    nl.store(out, nl.multiply(causal, col[:, 0]))
    return out


def test_psum_affine_select_and_integer_column_indexing() -> None:
    x = RNG.random((128, 64), dtype=F32)
    m = RNG.random((128, 4), dtype=F32)
    want = np.where(np.arange(128)[:, None] >= np.arange(64)[None, :], x, -1.0) * m[:, 2:3]
    np.testing.assert_allclose(api.simulate(_column_scale, x, m), want, rtol=1e-6)


@nki.jit(platform_target="trn2")
def _double_row(a, b):
    out = nl.ndarray((a.shape[2], b.shape[2]), F32, buffer=nl.shared_hbm)
    s = nl.load(a.view(nl.float8_e5m2))
    m = nl.load(b.view(nl.float8_e5m2))
    nl.store(out, nl.copy(nisa.nc_matmul(s, m, perf_mode="double_row_gen3")))
    return out


def test_double_row_matmul_contracts_partitions_and_both_rows() -> None:
    a = RNG.integers(0, 4, (128, 2, 8)).astype(nl.float8_e5m2)
    b = RNG.integers(0, 4, (128, 2, 64)).astype(nl.float8_e5m2)
    want = np.einsum("kli,klj->ij", a.astype(F32), b.astype(F32))
    np.testing.assert_array_equal(api.simulate(_double_row, a, b), want)


@nki.jit
def _local_gather(src, idx):
    out = nl.ndarray((32, 6, 2), F32, buffer=nl.shared_hbm)
    nl.store(out, nisa.local_gather(nl.load(src), nl.load(idx), 2, 6))
    return out


def test_local_gather_per_16_partition_group() -> None:
    src = RNG.random((32, 20), dtype=F32)
    idx = (2 * RNG.integers(0, 10, (32, 1))).astype(np.uint16)  # element offsets of runs of 2
    got = api.simulate(_local_gather, src, idx)
    for g in (0, 16):
        pick = idx[g:g + 16, 0][:6].astype(np.int64)  # column-major over the group, the first 6 valid
        want = src[g:g + 16][:, pick[:, None] + np.arange(2)[None, :]]
        np.testing.assert_array_equal(got[g:g + 16], want)


@nki.jit
def _dynamic_columns(x, offsets):  # out[:, k] = x[:, offsets[k]], offsets read from SBUF at run time
    out = nl.ndarray((128, 8), F32, buffer=nl.shared_hbm)
    t = nl.load(x)
    off = nl.load(offsets)
    o = nl.ndarray((128, 8), F32, buffer=nl.sbuf)
    ix, iy = nl.mgrid[0:128, 0:1]
    for k in nl.affine_range(8):
        o[ix, k] = nisa.tensor_copy_dynamic_src(t[ix, off[0, k] + iy])
    nl.store(out, o)
    return out


def test_tensor_copy_dynamic_src_reads_its_offset_from_sbuf() -> None:
    x = RNG.random((128, 40), dtype=F32)
    offsets = RNG.integers(0, 40, (1, 8)).astype(np.int32)
    np.testing.assert_array_equal(api.simulate(_dynamic_columns, x, offsets), x[:, offsets[0]])


@nki.jit
def _masked_sum(x):  # sum of the first 5 of 8 columns: the mask covers the reduced input
    out = nl.ndarray((128, 1), F32, buffer=nl.shared_hbm)
    t = nl.load(x)
    iy, ix = nl.mgrid[0:128, 0:8]
    nl.store(out, nl.sum(t, axis=[1], mask=(ix < 5), keepdims=True))
    return out


def test_reduction_mask_over_its_input() -> None:
    x = RNG.random((128, 8), dtype=F32)
    np.testing.assert_allclose(api.simulate(_masked_sum, x), x[:, :5].sum(axis=1, keepdims=True), rtol=1e-6)


@nki.jit
def _affine_loop_sum(x):  # loop_reduce across affine_range iterations is a reduction, not a race
    out = nl.ndarray((128, 32), F32, buffer=nl.shared_hbm)
    acc = nl.zeros((128, 32), F32, buffer=nl.sbuf)
    for i in nl.affine_range(4):
        acc[...] = nl.loop_reduce(nl.load(x[i]), op=np.add, loop_indices=[i])
    nl.store(out, acc)
    return out


def test_loop_reduce_across_affine_iterations() -> None:
    x = RNG.random((4, 128, 32), dtype=F32)
    np.testing.assert_allclose(api.simulate(_affine_loop_sum, x), x.sum(axis=0), rtol=1e-6)


@nki.jit
def _shared_identity(x):  # nl.shared_identity_matrix (SDK 2.21+): an HBM constant loaded by one DMA
    out = nl.ndarray((128, 64), F32, buffer=nl.shared_hbm)
    ident = nl.shared_identity_matrix(128, dtype=nl.float32)
    acc = nisa.nc_matmul(ident, nl.load(x))
    nl.store(out, nl.copy(acc, dtype=F32))
    return out


def test_shared_identity_matrix_is_an_hbm_constant_loaded_by_dma() -> None:
    x = RNG.random((128, 64), dtype=F32)
    got, trace = api.simulate_traced(_shared_identity, x)
    np.testing.assert_array_equal(got, x)  # I.T @ x, one product by 1.0 per output: exact
    loads = [i for i in trace.instrs if i.engine == "dma" and [a.memory for a in i.writes] == ["sbuf"]]
    assert len(loads) == 2 and not any(i.op in ("memset", "affine_select", "iota") for i in trace.instrs)
