"""The less common nisa instructions (tilec/nki/isa_extra.py) against NumPy computations written here, their rule
violations (exact first line of the message, the same in a trace-only run), and their trace records."""
from __future__ import annotations

import pathlib

import ml_dtypes
import numpy as np
import pytest

import tilec  # noqa: F401  (installs the neuronxcc shim before the kernels import neuronxcc)
import isa_extra_kernels as xk  # noqa: E402
from tilec.errors import KernelError
from tilec.nki import api, rules
from nki_testutil import first_line, line_of

KFILE = pathlib.Path(xk.__file__)
RNG = np.random.default_rng(7)
F32 = np.float32


def rand(*shape: int) -> np.ndarray:
    return RNG.random(shape, dtype=F32)


SRC, OLD, PRED = rand(128, 64), rand(128, 64), RNG.random((128, 64)) < 0.5
A, COL, B = rand(128, 64), rand(128, 1), rand(128, 64)
A3 = rand(128, 32, 4)
BITS = RNG.integers(0, 1 << 20, (64, 16)).astype(np.int32)


def traced(fn, *args):
    return api.simulate_traced(fn, *args)


def only_instr(trace, op: str):
    found = [i for i in trace.instrs if i.op == op]
    return found


# ---- tensor_copy_predicated ----
def test_copy_predicated_keeps_dst_where_the_predicate_is_false():
    out, trace = traced(xk.copy_predicated, SRC, PRED, OLD)
    np.testing.assert_array_equal(out[0], np.where(PRED, SRC, OLD))
    np.testing.assert_array_equal(out[1], np.where(PRED, OLD, F32(2.5)))  # reverse_pred with a scalar src
    np.testing.assert_array_equal(out[2], np.where(PRED, SRC, OLD))  # src read from PSUM
    instrs = only_instr(trace, "tensor_copy_predicated")
    assert [i.engine for i in instrs] == ["vector"] * 3
    assert [len(i.reads) for i in instrs] == [2, 1, 2]  # (src, predicate); a scalar src reads no tile
    assert instrs[0].in_dtypes == ("float32", "uint8") and instrs[1].attr("reverse_pred") is True
    assert [i.reads[0].memory for i in instrs] == ["sbuf", "sbuf", "psum"]
    assert len({i.writes[0].buffer for i in instrs}) == 3  # each writes its own dst in place
    assert all(i.writes[0].memory == "sbuf" and i.free == 64 and i.partitions == 128 for i in instrs)


# ---- scalar_tensor_tensor ----
def test_scalar_tensor_tensor_applies_both_operators_in_order():
    out, trace = traced(xk.scalar_tensor_tensor_forms, A, COL, B)
    np.testing.assert_allclose(out[0], (A - COL) * B, rtol=1e-6)
    np.testing.assert_allclose(out[1], B - (F32(2.0) + A), rtol=1e-6)  # both operands reversed
    instrs = only_instr(trace, "scalar_tensor_tensor")
    assert [i.attr("alu") for i in instrs] == [("subtract", "multiply"), ("add", "subtract")]
    assert [len(i.reads) for i in instrs] == [3, 2] and {i.engine for i in instrs} == {"vector"}


def test_scalar_tensor_tensor_rounds_to_bf16_on_store():
    bf = ml_dtypes.bfloat16
    a, b = A.astype(bf), B.astype(bf)
    out, trace = traced(xk.scalar_tensor_tensor_forms, a, COL, b)
    expected = ((a.astype(F32) - COL) * b.astype(F32)).astype(bf)
    assert out.dtype == bf
    np.testing.assert_array_equal(out[0].view(np.uint16), expected.view(np.uint16))
    assert only_instr(trace, "scalar_tensor_tensor")[0].in_dtypes == ("bfloat16", "float32", "bfloat16")


# ---- tensor_tensor_scan ----
def test_scan_chains_two_halves_through_initial():
    a, b = rand(128, 1024), rand(128, 1024)
    out, trace = traced(xk.scan_two_halves, a, b)
    expected = np.zeros((128, 1024))
    expected[:, 0] = b[:, 0]
    for i in range(1, 1024):
        expected[:, i] = a[:, i] * expected[:, i - 1] + b[:, i]
    np.testing.assert_allclose(out, expected, rtol=1e-4)
    instrs = only_instr(trace, "tensor_tensor_scan")
    assert len(instrs) == 2 and instrs[0].free == 512 and len(instrs[1].reads) == 3  # the second reads initial


def test_scan_reversed_operands_and_a_tile_initial():
    init = rand(128, 1)
    out, _ = traced(xk.scan_reversed, A, B, init)
    state, expected = init[:, 0].astype(F32), np.empty((128, 64), F32)
    for i in range(64):
        state = np.maximum(B[:, i], state - A[:, i])  # reverse0: state - a; reverse1: max(b, x)
        expected[:, i] = state
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, expected.astype(np.float16))


# ---- bn_stats / bn_aggr ----
def test_bn_stats_and_aggr_give_mean_and_population_variance():
    b = rand(128, 1024)
    out, trace = traced(xk.bn_mean_var, b)
    np.testing.assert_allclose(out[:, 0], b.mean(axis=1, dtype=np.float64), rtol=1e-5)
    np.testing.assert_allclose(out[:, 1], b.var(axis=1, dtype=np.float64), rtol=1e-4)
    stats, aggr = only_instr(trace, "bn_stats"), only_instr(trace, "bn_aggr")
    assert [(i.free, i.attr("in_free")) for i in stats] == [(6, 512), (6, 512)]
    assert (aggr[0].free, aggr[0].attr("in_free"), aggr[0].engine) == (2, 12, "vector")


@pytest.mark.parametrize("n", [1, 7, 512])
def test_bn_stats_splits_even_and_odd_elements(n: int):
    x = (RNG.standard_normal((128, n)) * 3).astype(F32)
    out, _ = traced(xk.bn_stats_raw, x)
    for part, col in ((x[:, 0::2].astype(np.float64), 0), (x[:, 1::2].astype(np.float64), 3)):
        k = part.shape[1]
        mean = part.mean(axis=1) if k else np.zeros(128)
        np.testing.assert_array_equal(out[:, col], np.full(128, k, F32))
        np.testing.assert_allclose(out[:, col + 1], mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out[:, col + 2], ((part - mean[:, None]) ** 2).sum(axis=1), rtol=1e-4, atol=1e-5)


def test_bn_in_bf16_rounds_its_results():
    x = rand(128, 300).astype(ml_dtypes.bfloat16)
    out, _ = traced(xk.bn_low_precision, x)
    assert out.dtype == ml_dtypes.bfloat16
    xf = x.astype(np.float64)
    np.testing.assert_allclose(out[:, 0].astype(F32), xf.mean(axis=1), rtol=1e-2)
    np.testing.assert_allclose(out[:, 1].astype(F32), xf.var(axis=1), rtol=5e-2)


# ---- tensor_partition_reduce ----
def test_partition_reduce_add_max_or():
    (total, top, bits), trace = traced(xk.partition_reduce_forms, A3, BITS)
    np.testing.assert_allclose(total, A3.sum(axis=0, keepdims=True, dtype=np.float64), rtol=1e-5)
    np.testing.assert_array_equal(top, A3.reshape(128, 128).max(axis=0, keepdims=True))
    np.testing.assert_array_equal(bits, np.bitwise_or.reduce(BITS, axis=0, keepdims=True))
    instrs = only_instr(trace, "tensor_partition_reduce")
    assert [(i.engine, i.partitions, i.attr("alu")) for i in instrs] == [
        ("gpsimd", 1, "add"), ("gpsimd", 1, "maximum"), ("gpsimd", 1, "bitwise_or")]


# ---- rule violations ----
S513 = rand(128, 513)
ERRORS = [
    ("copy_predicated_float_pred", (SRC, PRED, OLD), "PRED_DTYPE", rules.NkiTypeError,
     "tensor_copy_predicated predicate must be uint8, uint16 or uint32, got float32 [predicate_dtype]"),
    ("copy_predicated_dtypes_differ", (SRC, PRED, OLD), "SRC_DST_DTYPE", rules.NkiTypeError,
     "tensor_copy_predicated src and dst must share the same data type: src is float32, dst is bfloat16 "
     "[copy_predicated_dtype]"),
    ("copy_predicated_unwritten_dst", (SRC, PRED, OLD), "DST_UNWRITTEN", rules.UninitializedReadError,
     "read of memory that was never written: element [0, 0] of 'd' (sbuf, shape (128, 64), float32) "
     "[uninitialized_read]"),
    ("copy_predicated_shape", (SRC, PRED, OLD), "PRED_SHAPE", rules.NkiSyntaxError,
     "tensor_copy_predicated operands differ in elements per partition: 'dst' has 64, 'src' has 32 "
     "[tensor_copy_predicated_shape]"),
    ("stt_operand1_shape", (A, COL, B), "STT_SHAPE", rules.NkiSyntaxError,
     "scalar_tensor_tensor operands differ in elements per partition: 'data' has 64, 'operand1' has 32 "
     "[scalar_tensor_tensor_shape]"),
    ("stt_bitvec", (A, COL, B), "STT_BITVEC", rules.NkiTypeError,
     "scalar_tensor_tensor takes binary arithmetic operators; nl.bitwise_and is not one [unsupported_op]"),
    ("stt_two_psum", (A, COL, B), "STT_PSUM", rules.MemoryRuleError,
     "'scalar_tensor_tensor' can read at most one of 'data' and 'operand1' from PSUM; both are in psum "
     "[scalar_tensor_tensor_psum_operands]"),
    ("scan_masked", (A, B, COL), "SCAN_MASK", rules.NkiValueError,
     "tilec does not support mask= on 'tensor_tensor_scan': the NKI reference does not say how a mask applies to "
     "it [unsupported_mask]"),
    ("scan_wide_initial", (A, B, COL), "SCAN_INITIAL", rules.NkiSyntaxError,
     "tensor_tensor_scan initial must be a scalar or a per-partition vector of shape (128, 1), got shape (128, 2) "
     "[tensor_scalar_operand]"),
    ("bn_stats_too_wide", (S513,), "BN_WIDE", rules.NkiSyntaxError,
     "bn_stats free size 513 exceeds bn_stats_fmax 512 [bn_stats_free_size]"),
    ("bn_aggr_not_triples", (A,), "BN_TRIPLES", rules.NkiSyntaxError,
     "bn_aggr input holds (count, mean, variance*count) triples: its free size 7 is not a multiple of 3 "
     "[bn_aggr_free_size]"),
    ("partition_reduce_subtract", (A3, BITS), "PR_OP", rules.NkiTypeError,
     "tensor_partition_reduce supports add, max, bitwise_or and bitwise_and; got nl.subtract [unsupported_op]"),
    ("partition_reduce_psum", (A3, BITS), "PR_PSUM", rules.MemoryRuleError,
     "GpSimdE cannot access PSUM: operand 'data' of 'tensor_partition_reduce' is in psum [engine_memory_access]"),
    ("partition_reduce_bitvec_float", (A3, BITS), "PR_BITVEC", rules.NkiTypeError,
     "bitvec operator nl.bitwise_or needs integer operands, got float32 [bitvec_dtype]"),
]


def error_in(numerics: bool, fn, *args) -> KernelError:
    with pytest.raises(KernelError) as info:
        api.simulate_traced(fn, *[a.copy() for a in args], numerics=numerics)
    return info.value


@pytest.mark.parametrize("name,args,marker,cls,text", ERRORS, ids=[e[0] for e in ERRORS])
def test_rule_violation(name: str, args: tuple, marker: str, cls: type, text: str):
    full = error_in(True, getattr(xk, name), *args)
    assert type(full) is cls
    assert first_line(full) == f"{KFILE}:{line_of(KFILE, '# <- ' + marker)}: error: {text}"
    only = error_in(False, getattr(xk, name), *args)
    assert type(only) is cls and str(only) == str(full)


# ---- select_reduce ----
FALSE_COL = rand(128, 1)


def test_select_reduce_selects_and_keeps_a_running_max():
    (res, red), trace = traced(xk.select_forms, PRED, SRC, FALSE_COL)
    fp32_min = np.finfo(F32).min
    np.testing.assert_array_equal(res[0], np.where(PRED, SRC, fp32_min))
    np.testing.assert_array_equal(res[1], np.where(PRED, SRC, FALSE_COL))
    np.testing.assert_array_equal(res[2], np.where(PRED, F32(-1.0), SRC))  # reverse_pred
    np.testing.assert_array_equal(red[0], res[1].max(axis=1, keepdims=True))  # reset_reduce
    np.testing.assert_array_equal(red[1], np.maximum(res[1], res[2]).max(axis=1, keepdims=True))  # reduce
    instrs = only_instr(trace, "select_reduce")
    assert [(i.engine, len(i.reads), len(i.writes)) for i in instrs] == [("vector", 2, 1), ("vector", 3, 2),
                                                                       ("vector", 2, 2)]
    assert [i.attr("reduce_cmd") for i in instrs] == [0, 3, 2]
    assert instrs[1].writes[1].name == "r0" and instrs[2].writes[1].name == "r1"


SELECT_ERRORS = [
    ("select_reduce_without_reset", "SR_NORESET", rules.NkiValueError,
     "select_reduce with reduce_cmd=reduce accumulates onto registers no reset defined [accumulator_undefined]"),
    ("select_reduce_idle_readout", "SR_IDLE", rules.NkiValueError,
     "select_reduce reduce_res reads the accumulator registers, undefined with reduce_cmd=idle "
     "[accumulator_undefined]"),
    ("select_reduce_add", "SR_OP", rules.NkiTypeError, "select_reduce reduces only with max; got nl.add "
                                                       "[unsupported_op]"),
    ("select_reduce_int32", "SR_INT32", rules.NkiTypeError, "select_reduce on_true cannot be int32 "
                                                            "[select_reduce_dtype]"),
]


@pytest.mark.parametrize("name,marker,cls,text", SELECT_ERRORS, ids=[e[0] for e in SELECT_ERRORS])
def test_select_reduce_rule_violation(name: str, marker: str, cls: type, text: str):
    test_rule_violation(name, (PRED, SRC, FALSE_COL), marker, cls, text)


def test_mask_limits_the_element_wise_ones():
    out, trace = traced(xk.masked_forms, SRC, PRED, OLD, COL)
    copied = np.where(PRED, SRC, OLD)[:, 0:40]
    np.testing.assert_array_equal(out[0], copied)
    np.testing.assert_allclose(out[1], SRC[:, 0:40] * COL + copied, rtol=1e-6)
