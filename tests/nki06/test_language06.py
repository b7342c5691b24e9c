"""`nki.language` (NKI 0.6) on the interpreter: creation in named buffers, the value-returning language calls the 0.1
surface has (load/store/copy/transpose/matmul, element-wise and reduction operators, where), range-alias loops,
LNC launches, nki.simulate, the removed names, and the 0.6 memory rules (capacity by liveness)."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401
import nki
import nki.isa as nisa
import nki.language as nl
from tilec.nki import shim06
from tilec.nki.rules import NkiError

RNG = np.random.default_rng(5)
F32 = np.float32


def test_import_nki_is_served_by_tilec():
    assert shim06.active_backend() == "tilec"
    assert nki.isa is nisa and nki.language is nl
    with pytest.raises(AttributeError, match="nki.benchmark is not available in NKI 0.6"):
        nki.benchmark  # noqa: B018
    with pytest.raises(AttributeError, match="removed in NKI 0.2"):
        nl.arange  # noqa: B018


def test_creation_load_store_and_elementwise():
    @nki.jit
    def k(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        x, y = nl.load(a), nl.load(b)
        ones = nl.ones(a.shape, dtype=nl.float32)  # buffer defaults to nl.sbuf
        full = nl.full(a.shape, 0.5, dtype=nl.float32, buffer=nl.sbuf)
        z = nl.zeros_like(x)
        e = nl.empty_like(x)
        nisa.tensor_copy(dst=e, src=nl.add(z, ones))
        r = nl.multiply(nl.add(nl.maximum(x, y), e), full)
        nl.store(out, nl.exp(nl.subtract(r, 1.0)))
        return out
    a, b = RNG.standard_normal((128, 64), F32), RNG.standard_normal((128, 64), F32)
    np.testing.assert_allclose(k(a, b), np.exp((np.maximum(a, b) + 1) * 0.5 - 1), rtol=1e-5)


def test_copy_transpose_matmul_reductions_where():
    @nki.jit
    def k(a, b):
        x, y = nl.load(a), nl.load(b)
        t = nl.copy(nl.transpose(x))  # PSUM -> SBUF
        prod = nl.copy(nl.matmul(x, y, transpose_x=True))
        s = nl.sum(y, axis=1, keepdims=True)
        m = nl.max(y, axis=1, keepdims=True)
        w = nl.where(nl.greater(x, 0.0), x, 0.0)
        outs = []
        for tile in (t, prod, s, m, w):
            o = nl.ndarray(tile.shape, dtype=nl.float32, buffer=nl.shared_hbm)
            nl.store(o, tile)
            outs.append(o)
        return tuple(outs)
    a, b = RNG.standard_normal((128, 128), F32), RNG.standard_normal((128, 96), F32)
    t, prod, s, m, w = k(a, b)
    np.testing.assert_array_equal(t, a.T)
    np.testing.assert_allclose(prod, a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(s[:, 0], b.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(m[:, 0], b.max(axis=1))
    np.testing.assert_array_equal(w, np.where(a > 0, a, F32(0)))


def test_loops_are_python_range_and_run_in_order():
    assert nl.affine_range(4) == range(4) and nl.sequential_range(1, 5, 2) == range(1, 5, 2)

    @nki.jit
    def k(a):  # a loop-carried dependence: legal in 0.6, whatever the (deprecated) loop helper
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        acc = nl.load(a)
        for _ in nl.affine_range(3):
            nisa.tensor_tensor(dst=acc, data1=acc, data2=acc, op=nl.add)
        nl.store(out, acc)
        return out
    a = RNG.standard_normal((64, 8), F32)
    np.testing.assert_array_equal(k(a), a * 8)


def test_lnc_launch_program_id_and_simulate():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        half = a.shape[0] // nl.num_programs(0)
        i = nl.program_id(0)
        x = nl.load(a[i * half:(i + 1) * half])
        nl.store(out[i * half:(i + 1) * half], nl.add(x, float(i)))
        return out
    a = RNG.standard_normal((256, 16), F32)
    got = nki.simulate(k[2])(a)
    np.testing.assert_array_equal(got, np.concatenate([a[:128], a[128:] + 1]))
    np.testing.assert_array_equal(k[1](a[:128]), a[:128])


def test_string_buffers_and_mask_are_rejected():
    @nki.jit
    def strings(a):
        return nl.ndarray(a.shape, dtype=a.dtype, buffer="sbuf")
    with pytest.raises(NkiError, match="string buffer names are no longer supported"):
        strings(np.zeros((8, 8), F32))

    @nki.jit
    def masked(a):
        return nl.load(a, mask=None)
    with pytest.raises(NkiError, match="no mask="):
        masked(np.zeros((8, 8), F32))


def test_platform_target_argument_and_environment(monkeypatch):
    with pytest.raises(NkiError, match="platform_target"):
        nki.jit(platform_target="trn2")(lambda a: a)

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        return out
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen2")
    k(np.zeros((8, 8), F32))
    assert k.last_trace.target == "trn1"
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    with pytest.raises(NkiError, match="not a target tilec models"):
        k(np.zeros((8, 8), F32))


def test_capacity_by_liveness_frees_tiles_after_their_last_use():
    @nki.jit
    def rebinding(a):  # each iteration's tile dies at its last use: 9 PSUM tiles in sequence fit 8 banks
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        total = nl.zeros((128, 128), dtype=nl.float32)
        for _ in range(9):
            t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_transpose(dst=t, data=x)
            nisa.tensor_tensor(dst=total, data1=total, data2=t, op=nl.add)
        nl.store(out, total)
        return out
    a = RNG.standard_normal((128, 128), F32)
    np.testing.assert_allclose(rebinding(a), 9 * a.T, rtol=1e-6)

    @nki.jit
    def kept(a):  # nine PSUM tiles used together at the end: more than the 8 banks
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        tiles = []
        for _ in range(9):
            t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_transpose(dst=t, data=x)
            tiles.append(t)
        total = nl.zeros((128, 128), dtype=nl.float32)
        for t in tiles:
            nisa.tensor_tensor(dst=total, data1=total, data2=t, op=nl.add)
        nl.store(out, total)
        return out
    with pytest.raises(NkiError, match="PSUM has 8 banks"):
        kept(a)


def test_access_pattern_view_and_typing_annotations():
    from nki.typing import tensor  # noqa: F401  (annotations are accepted)

    @nki.jit
    def avgpool2(x_hbm):  # a 2x2 average pool through a 5-D .ap() view reduced over its two trailing axes
        C, H, W = x_hbm.shape
        out = nl.ndarray((C, H // 2, W // 2), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((C, H, W), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=x_hbm)
        windows = x.ap([[H * W, C], [2 * W, H // 2], [2, W // 2], [W, 2], [1, 2]])
        s = nl.sum(windows, axis=[3, 4])
        avg = nl.ndarray(s.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=avg, data=s, op0=nl.multiply, operand0=0.25)
        nisa.dma_copy(dst=out, src=avg)
        return out
    x = RNG.standard_normal((16, 8, 12), F32)
    np.testing.assert_allclose(avgpool2(x), x.reshape(16, 4, 2, 6, 2).mean(axis=(2, 4)), rtol=1e-6)

    @nki.jit
    def outside(x_hbm):
        x = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
        return x.ap([[8, 16], [1, 9]])
    with pytest.raises(NkiError, match="leaves tensor"):
        outside(np.zeros((16, 8), F32))


def test_indirect_gather_and_scatter_through_ap_vector_offset():
    @nki.jit
    def gather_scatter(data, indices, out_rows):
        P, F = indices.shape[0], data.shape[1]
        idx = nl.ndarray((P, 1), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=indices)
        rows = nl.ndarray((P, F), dtype=data.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=data.ap(pattern=[[F, P], [1, F]], vector_offset=idx, indirect_dim=0))
        nisa.dma_copy(dst=out_rows.ap(pattern=[[F, P], [1, F]], vector_offset=idx, indirect_dim=0), src=rows)
        gathered = nl.ndarray((P, F), dtype=data.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=gathered, src=rows)
        return gathered
    data = RNG.standard_normal((300, 24), F32)
    indices = RNG.permutation(300)[:64].reshape(64, 1).astype(np.uint32)
    out_rows = np.zeros((300, 24), F32)
    got = gather_scatter(data, indices, out_rows)
    np.testing.assert_array_equal(got, data[indices[:, 0]])
    want = np.zeros_like(out_rows)
    want[indices[:, 0]] = data[indices[:, 0]]
    np.testing.assert_array_equal(out_rows, want)  # the argument written in place

    @nki.jit
    def shifted(data, at):  # a scalar offset: rows at..at+8 of data
        s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=at)
        t = nl.ndarray((8, 24), dtype=data.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=data.ap(pattern=[[24, 8], [1, 24]], scalar_offset=s, indirect_dim=0))
        out = nl.ndarray((8, 24), dtype=data.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out
    np.testing.assert_array_equal(shifted(data, np.array([[17]], np.int32)), data[17:25])


def test_load_transpose2d_broadcast_expand_ds_and_device_print(capsys):
    @nki.jit
    def k(a, col):
        t = nl.load_transpose2d(a)  # HBM [a, b] -> SBUF [b, a]
        c = nl.load(col)  # (P, 1)
        wide = nl.add(nl.broadcast_to(c, (col.shape[0], a.shape[0])), t)
        part = nl.load(a[nl.ds(0, 16), nl.ds(8, 8)])
        nl.device_print("part", part)
        assert nl.expand_dims(c, 2).shape == (col.shape[0], 1, 1) and nl.program_ndim() == 0
        out = nl.ndarray(wide.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, wide)
        return out
    a, col = RNG.standard_normal((32, 64), F32), RNG.standard_normal((64, 1), F32)
    np.testing.assert_allclose(k(a, col), a.T + col, rtol=1e-6)
    assert capsys.readouterr().out.startswith("part [[")


def test_integer_partition_index_keeps_a_size_one_dim_on_chip():
    @nki.jit
    def k(a):
        x = nl.load(a)
        row = x[32]  # on-chip: shape (1, 16), still a tile (starting at an engine-reachable partition)
        assert tuple(row.shape) == (1, 16) and tuple(x[3, 2:4].shape) == (1, 2)
        assert tuple(a[3].shape) == (16,)  # HBM: the dim is dropped
        out = nl.ndarray((1, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(row, 2.0))
        return out
    a = RNG.standard_normal((64, 16), F32)
    np.testing.assert_array_equal(k(a), a[32:33] * 2)


def test_shared_identity_matrix_and_shared_constant():
    @nki.jit
    def k(a):
        ident = nl.shared_identity_matrix(n=128, dtype=nl.float32)
        t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=t, stationary=nl.load(a), moving=ident, accumulate=False)  # a.T @ I: a transpose
        table = nl.shared_constant(np.arange(128, dtype=np.float32).reshape(128, 1))
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.copy(t), nl.broadcast_to(nl.load(table), (128, 128))))
        return out
    a = RNG.standard_normal((128, 128), F32)
    np.testing.assert_allclose(k(a), a.T + np.arange(128, dtype=F32)[:, None], rtol=1e-6)
    assert sum(i.op == "dma_copy" for i in k.last_trace.instrs) == 4  # identity, a, table in; out
