"""`ir.Identity`: the on-chip identity matrix (a memset to one, then an affine_select keeping p == f) printed,
verified, emitted in both NKI dialects, run on the interpreter against NumPy's np.eye (and used as TensorE's
stationary: I.T @ X == X), and priced by the model as build_util.identity_ns says (one fact, one place)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler import build_util, codegen
from tilec.compiler.api import load_kernel
from tilec.compiler.ir import Alloc, Buf, Copy, Dma, Identity, Kernel, Matmul, print_ir, whole
from tilec.compiler.verify import verify
from tilec.errors import InternalError
from tilec.nki import api as nki_api
from tilec.perf.api import estimate

NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}


def kernel(n: int, dtype: str, f: int = 24) -> Kernel:
    """eye = I (n x n, stored as it is) and Z = I.T @ X (the identity as TensorE's stationary)."""
    x, eye, z = Buf("X", "hbm", dtype, (n, f)), Buf("eye", "hbm", dtype, (n, n)), Buf("Z", "hbm", "f32", (n, f))
    ident, xs = Buf("ident", "sbuf", dtype, (n, n)), Buf("xs", "sbuf", dtype, (n, f))
    acc, zs = Buf("acc", "psum", "f32", (n, f)), Buf("zs", "sbuf", "f32", (n, f))
    body = (Alloc(ident), Identity(whole(ident), 1), Dma(whole(eye), whole(ident)),
            Alloc(xs), Dma(whole(xs), whole(x)), Alloc(acc, zero=True), Matmul(whole(acc), whole(ident), whole(xs)),
            Alloc(zs), Copy(whole(zs), whole(acc)), Dma(whole(z), whole(zs)))
    return Kernel("ident_k", (x,), (eye, z), body)


def run(k: Kernel, nki: str, x: np.ndarray):
    source = codegen.emit(k, "(test)", [], nki=nki)
    fn = load_kernel(source, k.name)
    outs, trace = nki_api.simulate_traced(fn, x, strict=True)
    return source, [np.asarray(o) for o in outs], trace


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("n,dtype", [(128, "f32"), (128, "bf16"), (32, "f32"), (7, "bf16")])
def test_identity_matches_numpy_in_both_dialects(nki, n, dtype):
    k = kernel(n, dtype)
    verify(k, "test")
    x = np.random.default_rng(n).standard_normal((n, 24)).astype(NP[dtype])
    source, (eye, z), trace = run(k, nki, x)
    np.testing.assert_array_equal(eye.astype(np.float32), np.eye(n, dtype=np.float32))
    np.testing.assert_array_equal(z, x.astype(np.float32))  # one product of one element by 1.0: exact
    ops = [(i.engine, i.op) for i in trace.instrs if i.op in ("memset", "affine_select")
           and all(a.memory == "sbuf" for a in i.writes)]  # (not the PSUM accumulator's zeroing)
    assert [op for _, op in ops] == ["memset", "affine_select"] and ops[1][0] == "gpsimd"
    assert sum(i.op.startswith("dma") for i in trace.instrs) == 3  # X in, eye and Z out: no round trip
    assert "affine_select" in source and "memset" in source


def test_printed_and_verified():
    k = kernel(16, "f32")
    assert "identity ident[:16, :16]  # tl:1" in print_ir(k)
    bad = Buf("b", "sbuf", "f32", (16, 8))
    with pytest.raises(InternalError, match="square SBUF tile"):
        verify(Kernel("k", (), (), (Alloc(bad), Identity(whole(bad)))), "test")
    ps = Buf("p", "psum", "f32", (16, 16))
    with pytest.raises(InternalError, match="square SBUF tile"):
        verify(Kernel("k", (), (), (Alloc(ps), Identity(whole(ps)))), "test")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_model_prices_it_as_identity_ns_says(dtype):
    """The selectors' estimate (build_util.identity_ns) is the model's busy time of the two instructions."""
    from tilec.perf.api import _costs
    n = 128
    k = kernel(n, dtype)
    _, _, trace = run(k, "0.1", np.zeros((n, 24), NP[dtype]))
    costs = _costs("trn2")
    busy = sum(costs.compute_ns(i) for i in trace.instrs if i.op in ("memset", "affine_select")
               and all(a.memory == "sbuf" for a in i.writes))
    assert busy == pytest.approx(build_util.identity_ns(2 if dtype == "bf16" else 4), rel=1e-9)
    assert estimate(trace).total_ns > 0


def test_builders_share_one_helper():
    buf, stmts = build_util.identity("I", "bf16", 3)
    assert buf.shape == (128, 128) and buf.memory == "sbuf"
    assert [type(s).__name__ for s in stmts] == ["Alloc", "Identity"]
