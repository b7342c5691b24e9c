"""Trace-only runs (`simulate_traced(..., numerics=False)`, what the auto-tuner uses) against full runs: on every
checked-in generated kernel, the hand-written assignment kernels and the API test kernels, the trace equals the full
run's record for record and field for field, the performance model's estimate is identical, and a kernel that breaks
a rule raises the same error in both modes. The full run is the reference throughout."""
from __future__ import annotations

import dataclasses
import pathlib
import random

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import tilec  # noqa: F401  (installs the neuronxcc shim)
import api_kernels as ak  # noqa: E402
import bad_kernels as bk  # noqa: E402
import isa_extra_kernels as xk  # noqa: E402
from test_rules import CASES as RULE_CASES  # noqa: E402
from tilec.compiler.api import compile_file
from tilec.errors import KernelError, TilecError
from tilec.nki import api, rules
from tilec.perf.api import estimate
from tilec.trace import Instr
from tilec.tune.evaluate import Job, kernel_inputs
from tilec.tune.knobs import build_space
from nki_testutil import KERNELS, ROOT

F32 = np.float32
RNG = np.random.default_rng(11)


def both_traces(fn: object, *args: object, **kwargs: object):
    """(full trace, trace-only trace) of one kernel on the same inputs (copied: a full run may write them)."""
    _, full = api.simulate_traced(fn, *[_copy(a) for a in args], numerics=True, **kwargs)
    _, only = api.simulate_traced(fn, *[_copy(a) for a in args], numerics=False, **kwargs)
    return full, only


def _copy(a: object) -> object:
    return a.copy() if isinstance(a, np.ndarray) else a


def assert_same_trace(full, only) -> None:
    assert len(full.instrs) > 0
    assert len(only.instrs) == len(full.instrs)
    for a, b in zip(full.instrs, only.instrs):
        for f in dataclasses.fields(Instr):
            assert getattr(b, f.name) == getattr(a, f.name), f"instr {a.seq} ({a.op}) differs in {f.name}"
    assert only.allocs == full.allocs
    assert (only.kernel, only.target, only.skip_middle_end) == (full.kernel, full.target, full.skip_middle_end)
    assert estimate(only).total_us == estimate(full).total_us


# ---- the checked-in generated kernels ----
LARGE_DEFAULTS = ("conv2d", "conv_bias_maxpool")  # batch 4, 224x224: covered at small shapes below
SMALL_DEFAULTS = sorted(p.stem for p in (ROOT / "examples").glob("*.tl") if p.stem not in LARGE_DEFAULTS)


@pytest.mark.parametrize("stem", SMALL_DEFAULTS)
def test_checked_in_generated_kernel(stem: str) -> None:
    """The file in generated/ itself, at the shapes it was generated for (the example's small defaults)."""
    compiled = compile_file(ROOT / "examples" / f"{stem}.tl", nki="0.1")  # generated/*.py: the 0.1 form
    path = ROOT / "generated" / f"{stem}.py"
    assert path.read_text() == compiled.source, "generated/ is stale: python -m tilec.compiler.regen"
    fn = api.load_kernel_file(path, compiled.kernel_name)
    inputs = kernel_inputs(compiled)
    assert_same_trace(*both_traces(fn, *[inputs[p.name] for p in compiled.program.kernel.params]))


CONVS = [("conv2d", {"N": 1, "H": 34, "W": 18}), ("conv2d", {"N": 2, "C": 128, "K": 128, "H": 12, "W": 20}),
         ("conv_bias_maxpool", {"N": 1, "H": 34, "W": 18}), ("conv_bias_maxpool", {"N": 2, "H": 12, "W": 20})]


@pytest.mark.parametrize("stem,shapes", CONVS, ids=[f"{s}-{'-'.join(map(str, d.values()))}" for s, d in CONVS])
def test_generated_conv_at_small_shapes(stem: str, shapes: dict) -> None:
    """The two convolutions' defaults (batch 4, 224x224) take seconds: their generator at small shapes instead,
    run through Compiled.run_traced, the tuner's entry point."""
    compiled = compile_file(ROOT / "examples" / f"{stem}.tl", shapes)
    inputs = kernel_inputs(compiled)
    _, full = compiled.run_traced(**inputs)
    _, only = compiled.run_traced(numerics=False, **inputs)
    assert_same_trace(full, only)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_generated_conv_in_low_precision(dtype: str, tmp_path: pathlib.Path) -> None:
    """Low-precision tiles take other paths (fp32 shadows of operands, rounding on store)."""
    text = (ROOT / "examples" / "conv_bias_maxpool.tl").read_text().replace("f32", dtype)
    path = tmp_path / "conv_bias_maxpool.tl"
    path.write_text(text)
    compiled = compile_file(path, {"N": 1, "H": 20, "W": 34})
    inputs = kernel_inputs(compiled)
    _, full = compiled.run_traced(**inputs)
    _, only = compiled.run_traced(numerics=False, **inputs)
    assert {i.in_dtypes for i in full.instrs if i.op == "nc_matmul"} != {("float32", "float32")}
    assert_same_trace(full, only)


# ---- the hand-written assignment kernels ----
def asst(name: str) -> object:
    return api.load_kernel_file(KERNELS / "asst.py", name)


def rand(shape: tuple, dtype: object = F32) -> np.ndarray:
    return RNG.random(shape, dtype=np.float32).astype(dtype)


ASST = [("vector_add_naive", (128,)), ("vector_add_tiled", (512,)), ("vector_add_tiled_128", (2048,)),
        ("vector_add_stream", (2560,)), ("vector_add_stream_200", (25600,)), ("vector_add_stream_1000", (256000,))]


@pytest.mark.parametrize("name,shape", ASST, ids=[a[0] for a in ASST])
def test_assignment_vector_add(name: str, shape: tuple) -> None:
    assert_same_trace(*both_traces(asst(name), rand(shape), rand(shape)))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_assignment_transpose_and_matmul(dtype: object) -> None:
    assert_same_trace(*both_traces(asst("matrix_transpose"), rand((256, 384), dtype)))
    lhsT, rhs, result = rand((256, 128), dtype), rand((256, 1024), dtype), np.zeros((128, 1024), dtype)
    assert_same_trace(*both_traces(asst("nki_matmul_tiled_"), lhsT, rhs, result))


@pytest.mark.parametrize("dtype,pool", [(np.float16, 1), (np.float16, 2), (np.float32, 2)])
def test_assignment_conv(dtype: object, pool: int) -> None:
    conv = api.load_kernel_file(KERNELS / "conv2d.py", "fused_conv2d_maxpool")
    x, w, bias = rand((2, 256, 12, 16), dtype), rand((256, 256, 3, 3), dtype), rand((256,), dtype)
    assert_same_trace(*both_traces(conv, x, w, bias, pool_size=pool))


def test_trace_only_leaves_written_arguments_alone() -> None:
    """Values are unspecified in a trace-only run, so it gives nothing back through the caller's arrays; outputs
    keep their shapes and dtypes."""
    lhsT, rhs = rand((256, 128)), rand((256, 512))
    result = np.full((128, 512), 7.0, F32)
    api.simulate_traced(asst("nki_matmul_tiled_"), lhsT, rhs, result, numerics=False)
    assert (result == 7.0).all()
    api.simulate_traced(asst("nki_matmul_tiled_"), lhsT, rhs, result)
    np.testing.assert_allclose(result, lhsT.T @ rhs, rtol=1e-5)  # the full run does write it
    out, _ = api.simulate_traced(asst("vector_add_tiled"), rand((512,), np.float16), rand((512,), np.float16),
                                 numerics=False)
    assert (out.shape, out.dtype) == ((512,), np.float16)


# ---- the API test kernels (every isa / language entry point) ----
API_CASES = [
    ("scalar_forms", lambda: (rand((128, 64)), rand((128, 1)) + 0.5)),
    ("reduce_and_activation", lambda: (rand((128, 64)), rand((128, 1)))),
    ("causal_mask", lambda: ()),
    ("transposes", lambda: (rand((128, 64), np.float16), rand((32, 32)))),
    ("gather_with_mgrid", lambda: (rand((128, 64)),)),
    ("matmul_3d_moving", lambda: (rand((128, 128), np.float16), rand((128, 2, 100), np.float16))),
    ("casts", lambda: ((RNG.standard_normal((128, 32)) * 10).astype(F32),)),
    ("language_ops", lambda: (rand((128, 64)), rand((1, 64)))),
    ("six_d_tiles", lambda: (rand((128, 2, 2, 2, 2, 4)),)),
    ("masked_and_language_matmul", lambda: (rand((128, 64)), rand((64, 64)))),
    ("broadcast_and_transpose", lambda: (rand((128, 1)), rand((128, 64)))),
    ("masked_tail_rows", lambda: (rand((300, 8)),)),
    ("rmsnorm_rows", lambda: (RNG.standard_normal((256, 96)).astype(F32), rand((96,)))),
    ("softmax_rows", lambda: (RNG.standard_normal((128, 200)).astype(F32),)),
    ("matmul_ragged_k", lambda: (rand((200, 64)), rand((200, 256)))),
    ("load_transposed", lambda: (rand((64, 128), np.float16),)),
    ("tensor_add_masked", lambda: (rand((300, 700), np.float16), rand((300, 700), np.float16))),
    ("where_masked", lambda: (rand((128, 300)),)),
]


@pytest.mark.parametrize("name,args", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_kernel(name: str, args) -> None:
    assert_same_trace(*both_traces(getattr(ak, name), *args()))


# ---- the less common isa instructions (isa_extra_kernels.py) ----
EXTRA_CASES = [
    ("copy_predicated", lambda: (rand((128, 64)), RNG.random((128, 64)) < 0.5, rand((128, 64)))),
    ("scalar_tensor_tensor_forms", lambda: (rand((128, 64), ml_dtypes.bfloat16), rand((128, 1)),
                                            rand((128, 64), ml_dtypes.bfloat16))),
    ("scan_two_halves", lambda: (rand((128, 1024)), rand((128, 1024)))),
    ("scan_reversed", lambda: (rand((128, 64)), rand((128, 64)), rand((128, 1)))),
    ("bn_mean_var", lambda: (rand((128, 1024)),)),
    ("bn_stats_raw", lambda: (rand((128, 7)),)),
    ("bn_low_precision", lambda: (rand((128, 300), ml_dtypes.bfloat16),)),
    ("partition_reduce_forms", lambda: (rand((128, 32, 4)), RNG.integers(0, 1 << 20, (64, 16)).astype(np.int32))),
    ("select_forms", lambda: (RNG.random((128, 64)) < 0.5, rand((128, 64)), rand((128, 1)))),
    ("masked_forms", lambda: (rand((128, 64)), RNG.random((128, 64)) < 0.5, rand((128, 64)), rand((128, 1)))),
]


@pytest.mark.parametrize("name,args", EXTRA_CASES, ids=[c[0] for c in EXTRA_CASES])
def test_isa_extra_kernel(name: str, args) -> None:
    assert_same_trace(*both_traces(getattr(xk, name), *args()))


def test_spmd_grid_and_device_print(capsys) -> None:
    a = rand((384, 16))
    _, full = api.simulate_traced(ak.spmd_rows[3], a)
    _, only = api.simulate_traced(ak.spmd_rows[3], a, numerics=False)
    assert_same_trace(full, only)
    assert_same_trace(*both_traces(ak.printing, np.ones((2, 3), F32)))
    shown = capsys.readouterr().out
    assert "[[1. 1. 1.]" in shown and "(values not computed: trace-only run)" in shown


# ---- rule violations: the same error in both modes ----
def error_in(numerics: bool, fn: object, *args: object) -> KernelError:
    with pytest.raises(KernelError) as info:
        api.simulate_traced(fn, *[_copy(a) for a in args], numerics=numerics)
    return info.value


@pytest.mark.parametrize("name,args,cls", [(c[0], c[1], c[3]) for c in RULE_CASES], ids=[c[0] for c in RULE_CASES])
def test_rule_violation_is_the_same_error(name: str, args: tuple, cls: type) -> None:
    full, only = error_in(True, getattr(bk, name), *args), error_in(False, getattr(bk, name), *args)
    assert type(full) is cls and type(only) is cls
    assert str(only) == str(full)


def test_unmasked_out_of_bounds_tail_is_the_same_error() -> None:
    a = rand((300, 8))
    full, only = error_in(True, ak.unmasked_tail_rows, a), error_in(False, ak.unmasked_tail_rows, a)
    assert isinstance(full, rules.NkiIndexError) and str(only) == str(full)


def test_indirect_dma_refuses_to_run_trace_only() -> None:
    """Its rows come from tensor values: a trace-only run cannot know its trace, so it says so."""
    table, idx = rand((512, 16)), RNG.permutation(512)[:128].astype(np.int32).reshape(128, 1)
    with pytest.warns(UserWarning, match="partly written"):  # (the kernel scatters into part of an output)
        api.simulate_traced(ak.gather_scatter_rows, table.copy(), idx)  # fine with numerics
    err = error_in(False, ak.gather_scatter_rows, table, idx)
    assert isinstance(err, rules.NkiError) and err.rule == "trace_only_needs_values"
    assert "numerics=False" in str(err) and "indirect DMA" in str(err)


# ---- random legal schedules of the tuner's space ----
def _space(stem: str, shapes: dict):
    job = Job.of(str(ROOT / "examples" / f"{stem}.tl"), shapes)
    return job, build_space(job)


SPACES = {"conv": _space("conv_bias_maxpool", {"N": 2, "H": 14, "W": 22}),
          "matmul": _space("matmul", {"M": 256, "K": 384, "N": 640})}


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.filter_too_much])
@given(which=st.sampled_from(sorted(SPACES)), seed=st.integers(0, 2**32 - 1))
def test_random_schedules(which: str, seed: int) -> None:
    job, space = SPACES[which]
    point = space.random_point(random.Random(seed))
    assume(space.check(point) is None)
    try:
        compiled = compile_file(job.path, dict(job.shapes), space.render(point) or None)
    except TilecError:
        assume(False)
    inputs = kernel_inputs(compiled)
    try:
        _, full = compiled.run_traced(**inputs)
    except KernelError as err:  # a schedule the static checks let through but the hardware rules refuse
        with pytest.raises(type(err)) as info:
            compiled.run_traced(numerics=False, **inputs)
        assert str(info.value) == str(err)
        return
    _, only = compiled.run_traced(numerics=False, **inputs)
    assert_same_trace(full, only)
