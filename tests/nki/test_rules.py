"""Every hardware/API rule the interpreter enforces, each on a small kernel (bad_kernels.py), checked on the exact
first line of the message: `<kernel file>:<line of the offending call>: error: <rule text> [<rule id>]`."""
from __future__ import annotations

import pathlib

import ml_dtypes
import numpy as np
import pytest

import tilec  # noqa: F401  (installs the neuronxcc shim before bad_kernels imports neuronxcc)
import bad_kernels as bk  # noqa: E402
from tilec.errors import KernelError
from tilec.nki import api, rules
from nki_testutil import first_line, line_of

BAD = pathlib.Path(bk.__file__)
A = np.random.default_rng(0).random((128, 512), dtype=np.float32)
B = np.random.default_rng(1).random((128, 1024), dtype=np.float32)
S = np.random.default_rng(2).random((128, 64), dtype=np.float32)
V = np.random.default_rng(3).random(200, dtype=np.float32)
W = np.random.default_rng(4).random((2, 70000), dtype=np.float32).astype(ml_dtypes.bfloat16)

CASES = [
    ("psum_tile_too_big", (A,), "PSUM_BANK_SIZE", rules.NkiSyntaxError,
     "PSUM tile needs 4096 bytes per partition, more than one 2048-byte PSUM bank [psum_tile_exceeds_bank]"),
    ("nine_psum_banks", (A,), "PSUM_BANKS", rules.MemoryRuleError,
     "PSUM has 8 banks of 2048 bytes per partition; allocating 'zeros' would make 9 PSUM tiles live at once "
     "[psum_bank_overflow]"),
    ("sbuf_overflow", (A,), "SBUF_FULL", rules.MemoryRuleError,
     "SBUF usage per partition exceeds the usable 229376 bytes of trn2: 160000 bytes live + 80000 bytes for 'more' "
     "[sbuf_capacity]"),
    ("stationary_too_wide", (A,), "STATIONARY", rules.NkiSyntaxError,
     "nc_matmul stationary free size 256 exceeds gemm_stationary_fmax 128 [matmul_stationary_size]"),
    ("moving_too_wide", (A, B), "MOVING", rules.NkiSyntaxError,
     "nc_matmul moving free size 1024 exceeds gemm_moving_fmax 512 [matmul_moving_size]"),
    ("matmul_fp32_with_fp16", (A,), "FP32_MIXED", rules.NkiTypeError,
     "nc_matmul operands must both be fp32/tf32 when one is: stationary is float32, moving is float16 "
     "[matmul_fp32_operands]"),
    ("contraction_mismatch", (A,), "CONTRACTION", rules.NkiSyntaxError,
     "nc_matmul contraction mismatch: stationary has 128 partitions, moving has 64 [matmul_contraction_mismatch]"),
    ("matmul_reads_psum", (A,), "TENSORE_READS_PSUM", rules.MemoryRuleError,
     "TensorE reads only SBUF: operand 'moving' of 'nc_matmul' is in psum [engine_memory_access]"),
    ("matmul_into_sbuf", (A,), "TENSORE_WRITES_SBUF", rules.MemoryRuleError,
     "TensorE writes only PSUM: the result of 'nc_matmul' cannot be stored into a tile in sbuf "
     "[engine_memory_access]"),
    ("dma_from_psum", (A,), "DMA_PSUM", rules.MemoryRuleError,
     "dma_copy cannot access PSUM: operand 'src' is in psum [dma_psum_access]"),
    ("two_psum_operands", (A,), "TWO_PSUM", rules.MemoryRuleError,
     "'tensor_tensor' can read at most one operand from PSUM; both are in psum [tensor_tensor_psum_operands]"),
    ("partition_mismatch", (A,), "PARTITION_MISMATCH", rules.NkiSyntaxError,
     "number of partitions mismatch in 'tensor_tensor': 'data1' has 128, 'data2' has 1 [err_num_partition_mismatch]"),
    ("vector_free_size", (A,), "FREE_SIZE", rules.NkiSyntaxError,
     "free size 70000 of operand 'src' of 'tensor_copy' exceeds the vector engine limit of 65536 elements per "
     "partition from sbuf [engine_free_size_limit]"),
    ("slice_out_of_bounds", (V,), "OOB", rules.NkiIndexError,
     "index range [128, 255] exceed dimension size of 200 [err_tensor_access_out_of_bound]"),
    ("read_unwritten", (S,), "UNWRITTEN", rules.UninitializedReadError,
     "read of memory that was never written: element [0, 32] of 't' (sbuf, shape (128, 64), float32) "
     "[uninitialized_read]"),
    ("read_partly_written", (S,), "PARTLY_WRITTEN", rules.UninitializedReadError,
     "read of memory that was never written: element [0, 32] of 't' (sbuf, shape (128, 64), float32) "
     "[uninitialized_read]"),
    ("affine_read_after_write", (S,), "RACE_RW", rules.LoopCarriedDependenceError,
     "loop-carried dependence in affine_range loop: iteration 1 writes element [0, 0] of tile 'acc' (sbuf, shape "
     "(128, 64)), which iteration 0 reads [loop_carried_dependence]"),
    ("affine_same_output", (S,), "RACE_WW", rules.LoopCarriedDependenceError,
     "loop-carried dependence in affine_range loop: iteration 1 writes element [0, 0] of tile 'out' (hbm, shape "
     "(128, 64)), which iteration 0 writes [err_unexpected_output_dependencies]"),
    ("affine_tail_overlap", (S,), "RACE_TAIL", rules.LoopCarriedDependenceError,
     "loop-carried dependence in affine_range loop: iteration 1 writes element [0, 16] of tile 'out' (hbm, shape "
     "(128, 64)), which iteration 0 writes [err_unexpected_output_dependencies]"),
    ("gpsimd_reads_psum", (A,), "GPSIMD_PSUM", rules.MemoryRuleError,
     "GpSimdE cannot access PSUM: operand 'src' of 'tensor_copy' is in psum [engine_memory_access]"),
    ("partition_not_first", (A,), "PARTITION_FIRST", rules.NkiSyntaxError,
     "operand 'src' of 'tensor_copy': the partition dimension must be the first dimension of a tile "
     "[err_failed_to_infer_tile_from_local_tensor]"),
    ("hbm_with_init", (A,), "HBM_INIT", rules.NkiSyntaxError,
     "HBM tensor 'out' cannot be created with an initial value [err_hbm_tensor_with_init_value_not_supported]"),
    ("shared_hbm_in_loop", (A,), "SHARED_HBM_LOOP", rules.NkiSyntaxError,
     "shared_hbm tensor 'out' must be created at the top level of the kernel [err_shared_hbm_must_in_kernel_level]"),
    ("tile_out_of_scope", (S,), "OUT_OF_SCOPE", rules.ScopeError,
     "tile 't' is used outside the loop iteration that allocated it [err_local_variable_used_out_of_scope]"),
    ("compute_on_hbm", (S,), "HBM_OPERAND", rules.MemoryRuleError,
     "Expected operand 'data' of 'tensor_scalar' to be in address space 'sbuf' or 'psum', but got a tile in 'hbm' "
     "instead [err_unsupported_memory]"),
    ("tensor_truth", (S,), "TRUTH", rules.NkiValueError,
     "the truth value of a tensor is ambiguous [err_ambiguous_tensor_truth_value]"),
    ("reduce_partition_axis", (S,), "REDUCE_AXIS", rules.NkiSyntaxError,
     "tensor_reduce reduces up to four free dimensions (e.g. (1,)), got axis 0 [reduce_axis]"),
    ("activation_scale_fp16", (S,), "ACT_SCALE", rules.NkiTypeError,
     "activation scale vector must be float32, got float16 [err_activation_scale_invalid_type]"),
    ("output_never_written", (S,), "NOT_WRITTEN", rules.NkiError,
     "output tensor 'out' is never written [err_tensor_output_not_written_to]"),
    ("vector_transpose_too_big", (S,), "VECTOR_TRANSPOSE", rules.NkiSyntaxError,
     "nc_transpose on the vector engine supports at most [32, 32], got [128, 64] "
     "[err_size_of_dimension_exceed_arch_limit]"),
    ("scalar_engine_maximum", (S,), "SCALAR_ENGINE_OP", rules.NkiSyntaxError,
     "tensor_scalar on the scalar engine supports only (multiply, add), (multiply) or (add); got (maximum) "
     "[scalar_engine_alu]"),
    ("operator_partition_broadcast", (S,), "OPERATOR_BROADCAST", rules.NkiSyntaxError,
     "operator '+' does not broadcast along the partition dimension: shapes (128, 64) and (1, 64) "
     "[operator_partition_broadcast]"),
    ("partition_start_misaligned", (S,), "PARTITION_START", rules.NkiSyntaxError,
     "operand 'data' of 'activation' starts at partition 16; an access of 32 partition(s) must start at partition "
     "0 or 32 or 64 or 96 [partition_start_alignment]"),
    ("partition_start_half_at_32", (S,), "PARTITION_START_64", rules.NkiSyntaxError,
     "operand 'data1' of 'tensor_tensor' starts at partition 32; an access of 64 partition(s) must start at "
     "partition 0 or 64 [partition_start_alignment]"),
    ("partition_start_accumulate", (A,), "PARTITION_START_ACC", rules.NkiSyntaxError,
     "operand 'dst' of 'nc_matmul' starts at partition 16; an access of 32 partition(s) must start at partition "
     "0 or 32 or 64 or 96 [partition_start_alignment]"),
    ("ap_dim_dma", (W,), "AP_DIM", rules.NkiSyntaxError,
     "free dimension 1 of the destination of 'dma_copy' has 70000 elements; an access-pattern dimension counts at "
     "most 65535 (a uint16 size) [access_pattern_dim_size]"),
    ("ap_dim_engine", (S,), "AP_DIM_ENGINE", rules.NkiSyntaxError,
     "free dimension 1 of the input of 'tensor_copy' has 65536 elements; an access-pattern dimension counts at "
     "most 65535 (a uint16 size) [access_pattern_dim_size]"),
    ("ap_stride", (W,), "AP_STRIDE", rules.NkiSyntaxError,
     "free dimension 1 of the destination of 'dma_copy' steps by 35000 elements; an access-pattern stride is at "
     "most 32767 (an int16) [access_pattern_stride]"),
    ("partition_stride", (S,), "PARTITION_STRIDE", rules.NkiSyntaxError,
     "operand 'data' of 'activation' steps over partitions by 2; an access covers a contiguous range of partitions "
     "[partition_stride]"),
]


@pytest.mark.parametrize("name,args,marker,cls,message", CASES, ids=[c[0] for c in CASES])
def test_rule_violation(name: str, args: tuple, marker: str, cls: type, message: str) -> None:
    with pytest.raises(KernelError) as info:
        api.simulate(getattr(bk, name), *args)
    err = info.value
    assert type(err) is cls
    assert first_line(err) == f"{BAD}:{line_of(BAD, '# <- ' + marker)}: error: {message}"
    assert len(str(err).splitlines()) >= 2  # followed by the tiles involved (and usually a hint)


def test_error_classes_match_python_kinds() -> None:
    assert issubclass(rules.NkiSyntaxError, SyntaxError) and issubclass(rules.NkiIndexError, IndexError)
    assert issubclass(rules.NkiValueError, ValueError) and issubclass(rules.NkiError, KernelError)


def test_api_outside_kernel() -> None:
    with pytest.raises(rules.NkiError) as info:
        bk.api_outside_kernel()
    assert first_line(info.value) == (f"{BAD}:{line_of(BAD, '# <- OUTSIDE')}: error: NKI API called outside of an "
                                      "NKI kernel [err_nki_api_outside_of_nki_kernel]")


@pytest.mark.parametrize("name,args", [
    ("eight_psum_banks_in_loop", (S,)),  # 8 live banks is the limit, and loop-body tiles die each iteration
    ("sequential_read_after_write", (S,)),  # the same carried dependence is fine in a sequential_range
    ("affine_strided_disjoint", (S,)),  # interleaved columns: bounding boxes overlap, elements do not
    ("psum_accumulate_affine", (A,)),  # `acc += nc_matmul` across affine iterations is the documented idiom
    ("matmul_both_fp16", (A,)),  # the fp32 rule binds only mixed pairs: fp16 x fp16 accumulates in fp32 PSUM
    ("partition_start_aligned_quadrants", (S,)),  # starts 0, 32, 64, 96 with the counts that allow them
    ("ap_dim_split", (W,)),  # the 70000 elements per partition as 4 x 17500: sizes fit a uint16, steps an int16
])
def test_legal_lookalikes_pass(name: str, args: tuple) -> None:
    out = api.simulate(getattr(bk, name), *args)
    if name == "sequential_read_after_write":
        expected = np.zeros_like(S)
        for _ in range(4):
            expected = expected + S  # the same fp32 additions, in the same order
        np.testing.assert_array_equal(out, expected)
    if name == "affine_strided_disjoint":
        np.testing.assert_array_equal(out, S)
    if name == "ap_dim_split":
        np.testing.assert_array_equal(out, W)
    if name == "partition_start_aligned_quadrants":
        np.testing.assert_array_equal(out, np.concatenate([S[64:128], S[32:64], S[96:128]]))
    if name == "matmul_both_fp16":
        h = A.astype(np.float16).astype(np.float64)
        np.testing.assert_allclose(out, h[:, 128:256].T @ h[:, 0:128], rtol=1e-5)
    if name == "psum_accumulate_affine":
        ref = sum(A[:, k * 128:(k + 1) * 128].astype(np.float64).T @ A[:, 0:128] for k in range(4))
        np.testing.assert_allclose(out, ref, rtol=1e-5)
