"""The engine field of level-B Copy / Binary / Scalar: printed by the IR printer, checked by the verifier against
the target's `Instr.engines`, spelled by both codegens, enforced by the interpreter and run on that engine's queue
by the performance model. Values are checked against NumPy (y = (2 x) + x, one copy and one product on other
engines)."""
from __future__ import annotations

import numpy as np
import pytest

from tilec.compiler import codegen
from tilec.compiler.api import load_kernel
from tilec.compiler.ir import Alloc, Binary, Buf, Copy, Dma, Kernel, Scalar, print_ir, whole
from tilec.compiler.verify import verify
from tilec.errors import InternalError, KernelError
from tilec.nki import api as nki_api
from tilec.perf.api import estimate
from tilec.target import TRN1, TRN2

P, F = 128, 256


def kernel(copy_on: str = "gpsimd", scale_on: str = "scalar", add_on: str = "gpsimd", op: str = "multiply",
           tmp_memory: str = "sbuf") -> Kernel:
    x, y = Buf("x", "hbm", "bf16", (P, F)), Buf("y", "hbm", "bf16", (P, F))
    t, u = Buf("t", "sbuf", "bf16", (P, F)), Buf("u", tmp_memory, "f32", (P, F))
    w, v = Buf("w", "sbuf", "bf16", (P, F)), Buf("v", "sbuf", "bf16", (P, F))
    body = (Alloc(t), Dma(whole(t), whole(x)), Alloc(u), Copy(whole(u), whole(t), 1, copy_on),
            Alloc(w), Scalar(whole(w), whole(u), op, 2.0, 2, engine=scale_on),
            Alloc(v), Binary(whole(v), whole(w), whole(u), "add", 3, add_on), Dma(whole(y), whole(v)))
    return Kernel("engines", (x,), (y,), body)


def run(k: Kernel, nki: str, target: str = "trn2"):
    src = codegen.emit(k, "y = 2 * x + x", [], nki=nki)
    fn = load_kernel(src, "engines")
    x = np.random.default_rng(3).random((P, F), dtype=np.float32)
    return src, x, nki_api.simulate_traced(fn, x, target=target, strict=True)


def test_printed_with_the_engine() -> None:
    text = print_ir(kernel())
    assert "copy.gpsimd u[:128, :256] <- t[:128, :256]" in text
    assert "multiply.scalar w[" in text and "add.gpsimd v[" in text
    assert "copy u[" in print_ir(kernel(copy_on=""))  # the default prints as before


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_codegen_interpreter_and_model_put_each_instruction_on_its_engine(nki: str) -> None:
    k = kernel()
    verify(k, "test", TRN2)
    src, x, (out, trace) = run(k, nki)
    spell = (lambda e: f"engine=nisa.{e}_engine") if nki == "0.1" else (lambda e: f"engine=nisa.engine.{e}")
    assert spell("gpsimd") in src and spell("scalar") in src
    want = (2 * x.astype(np.float32) + x).astype(np.float32)
    np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=2 ** -7)  # bf16 output
    engines = {(i.engine, i.op) for i in trace.instrs if i.engine != "dma"}
    assert engines == {("gpsimd", "tensor_copy"), ("scalar", "tensor_scalar"), ("gpsimd", "tensor_tensor")}
    est = estimate(trace, "trn2")
    assert est.busy_ns.get("gpsimd", 0.0) > 0 and est.busy_ns.get("scalar", 0.0) > 0
    assert est.busy_ns.get("vector", 0.0) == 0.0  # nothing left on VectorE


def test_default_engine_is_vector() -> None:
    _, _, (_, trace) = run(kernel("", "", ""), "0.1")
    assert {i.engine for i in trace.instrs if i.engine != "dma"} == {"vector"}


@pytest.mark.parametrize("change,message", [
    (dict(add_on="scalar"), "tensor_tensor on the scalar engine; trn2 runs it on vector, gpsimd"),
    (dict(op="maximum"), "tensor_scalar maximum on the scalar engine, which runs only multiply, add"),
    (dict(scale_on="gpsimd"), "tensor_scalar multiply on the gpsimd engine, which runs only rsqrt"),
    (dict(tmp_memory="psum", add_on=""), "tensor_copy on the gpsimd engine touches PSUM"),
])
def test_verifier_rejects_an_engine_the_instruction_cannot_use(change: dict, message: str) -> None:
    with pytest.raises(InternalError, match=message):
        verify(kernel(**change), "test", TRN2)


def test_scalar_engine_copy_is_v3_only() -> None:
    verify(kernel(copy_on="scalar"), "test", TRN2)
    with pytest.raises(InternalError, match="tensor_copy on the scalar engine; trn1 runs it on vector, gpsimd"):
        verify(kernel(copy_on="scalar"), "test", TRN1)


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_interpreter_rejects_an_engine_the_hardware_rejects(nki: str) -> None:
    with pytest.raises(KernelError, match=r"tensor_tensor cannot run on the scalar engine .*\[engine_choice\]"):
        run(kernel(add_on="scalar"), nki)
    with pytest.raises(KernelError, match=r"tensor_copy cannot run on the scalar engine of NeuronCore-v2"):
        run(kernel(copy_on="scalar", scale_on=""), nki, target="trn1")
