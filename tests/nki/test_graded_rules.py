"""Rules graded by the toolchain they come from (issue 15). Each kernel in fidelity_cases/ shows a construct the
course's Trn2 toolchain (Neuron SDK 2.21, `skip_middle_end_transformations`) accepted: it must run and give the
hardware's result (checked against NumPy by the case's own check()), with a warning that names the release that
forbids it; what the hardware cannot do stays an error."""
from __future__ import annotations

import importlib.util
import pathlib
import warnings

import numpy as np
import pytest

import tilec  # noqa: F401  (installs the neuronxcc shim before the cases import neuronxcc)
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from tilec.errors import KernelError
from tilec.nki import api, rules

CASES = pathlib.Path(__file__).parent / "fidelity_cases"

# case -> the words its warning must contain (the release that forbids it), or None: no warning at all
EXPECTED = {
    "affine_carried": "sequential_range keeps the order",
    "bias_broadcast": "Neuron SDK 2.32",
    "block_dims": "Neuron SDK 2.25",
    "reduce_inner_axes": "Neuron SDK 2.29",
    "sbuf_215k": None,
    "transpose_into_sbuf": "Neuron SDK 2.27",
}


def load(name: str) -> object:
    spec = importlib.util.spec_from_file_location(f"fidelity_{name}", CASES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_case_is_listed() -> None:
    assert sorted(p.stem for p in CASES.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_case_runs_with_the_hardware_result(name: str) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        load(name).check()  # asserts against NumPy
    texts = [str(w.message) for w in seen if issubclass(w.category, rules.NkiPortabilityWarning)]
    if EXPECTED[name] is None:
        assert texts == []
    else:
        assert texts and all(EXPECTED[name] in t for t in texts), texts
        assert all(": warning: " in t.splitlines()[0] and "[" in t for t in texts)


def test_a_warning_is_an_error_under_a_later_api() -> None:
    class StrictRun:
        strict, warned = True, set()

    with pytest.raises(rules.NkiError, match=r"construct; Neuron SDK 9.9 \[rule_id\]"):
        rules.later_release(StrictRun(), "construct", "rule_id", ("k.py", 3), "Neuron SDK 9.9")


# ---- the limits of each relaxation: what the hardware cannot do stays an error ----
@nki.compiler.skip_middle_end_transformations
@nki.jit
def _mismatched_free(x):
    a = nl.load(x[:, 0:2])
    b = nl.load(x[:, 0:3])
    return nisa.tensor_tensor(a, b, op=nl.add)


@nki.jit
def _column_first(x, col):
    out = nl.ndarray((128, 2, 6), x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    c = nl.load(col)
    nl.store(out, nisa.tensor_tensor(c, t, op=nl.subtract))
    return out


@nki.jit
def _too_big(x):
    t = nl.ndarray((128, 224 * 1024 // 4 + 1), nl.float32, buffer=nl.sbuf)
    return x


@nki.jit
def _carried_without_decorator(x):
    best = nl.load(x[0])
    for i in nl.affine_range(3):
        best[...] = nl.maximum(best, nl.load(x[i + 1]))
    return x


@nki.jit
def _blocks_matmul(x):  # x: (2, 128, 128): out = sum_b x[b].T @ x[b], blocks of a block-dimension tile
    out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
    blk = nl.ndarray((2, nl.par_dim(128), 128), x.dtype, buffer=nl.sbuf)
    acc = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
    for b in nl.affine_range(2):
        blk[b] = nl.load(x[b])
        acc += nisa.nc_matmul(blk[b], blk[b])
    nl.store(out, nl.copy(acc))
    return out


def test_other_free_size_mismatches_stay_errors() -> None:
    with pytest.raises(KernelError, match=r"differ in elements per partition: 2 vs 3 \[tensor_tensor_shape\]"):
        api.simulate(_mismatched_free, np.ones((128, 4), np.float32))


def test_column_broadcasts_as_first_operand_too() -> None:
    x = np.random.default_rng(0).random((128, 2, 6), dtype=np.float32)
    col = np.random.default_rng(1).random((128, 1), dtype=np.float32)
    with pytest.warns(rules.NkiPortabilityWarning):
        got = api.simulate(_column_first, x, col)
    np.testing.assert_allclose(got, col[:, :, None] - x, rtol=1e-6)


def test_more_sbuf_than_the_hardware_has_is_an_error() -> None:
    with pytest.raises(rules.MemoryRuleError, match="exceeds the usable 229376 bytes of trn2"):
        api.simulate(_too_big, np.ones((2, 2), np.float32))


def test_carried_dependence_without_skip_middle_end_is_an_error() -> None:
    with pytest.raises(rules.LoopCarriedDependenceError):
        api.simulate(_carried_without_decorator, np.ones((4, 128, 8), np.float32))


def test_block_dimension_tiles_feed_the_engines() -> None:
    x = np.random.default_rng(2).random((2, 128, 128), dtype=np.float32)
    with pytest.warns(rules.NkiPortabilityWarning, match="Neuron SDK 2.25"):
        got = api.simulate(_blocks_matmul, x)
    np.testing.assert_allclose(got, sum(x[b].T @ x[b] for b in range(2)), rtol=1e-4)


@pytest.mark.parametrize("name,error", [("bias_broadcast", rules.NkiSyntaxError), ("block_dims", rules.NkiSyntaxError),
                                        ("reduce_inner_axes", rules.NkiSyntaxError),
                                        ("transpose_into_sbuf", rules.MemoryRuleError),
                                        ("affine_carried", rules.LoopCarriedDependenceError)])
def test_strict_runs_hold_kernels_to_later_releases(name, error) -> None:
    """simulate(strict=True), as tilec's compiler runs its own kernels: each relaxation is its rule's error again."""
    mod = load(name)
    kernel = next(v for v in vars(mod).values() if hasattr(v, "skip_middle_end"))
    args = {"bias_broadcast": (np.ones((128, 420), np.float32), np.ones((128, 1), np.float32)),
            "block_dims": (np.ones((4, 128, 64), np.float32),),
            "reduce_inner_axes": (np.ones((128, 4, 14), np.float32),),
            "transpose_into_sbuf": (np.ones((128, 2, 128), np.float32),),
            "affine_carried": (np.ones((8, 128, 32), np.float32),)}[name]
    with pytest.raises(error, match=r"Neuron SDK 2\.\d\d"):
        api.simulate(kernel, *args, strict=True)
