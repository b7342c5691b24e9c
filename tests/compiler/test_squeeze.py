"""The `squeeze` pass by meaning: unit dimensions leave tiles and compiler-made views, and nothing else changes.

"Nothing else" is checked on the hardware's side of the kernel: the kernel emitted from the IR before the pass and
the one emitted after it record the same instruction stream on the interpreter (every instruction's engine, shape,
bytes and the byte regions it reads and writes; only the kernel file line differs) and the performance model gives
them the same latency. The results against the reference evaluator are checked by test_ir_golden (every IR stage)
and test_end_to_end (every final kernel).
"""
from __future__ import annotations

import dataclasses

import pytest

from compiler_helpers import compile_example
from tilec.compiler import ir
from tilec.compiler.api import Compiled, compile_loaded
from tilec.compiler.codegen import emit
from tilec.compiler.squeeze import kept_dims, squeeze
from tilec.lang import api as lang
from tilec.compiler.wrap import unwrap
from kernel_numbers import numbered

ROW_AND_COLUMN = """\
kernel rowbc(A: f32[M, N], s: f32[N], b: f32[M]) -> Y
  default M = 256, N = 384
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = A[i, j] * s[j] + b[i]
"""

CASES = {
    "matmul": ("matmul", {"M": 256, "K": 256, "N": 640}, None),
    "matmul_1x1x1": ("matmul", {"M": 1, "K": 1, "N": 1}, None),
    "matmul_rows_1": ("matmul", {"M": 128, "K": 128, "N": 384}, "tile C.j, 128\n"),
    "conv_relu": ("conv_relu", {"N": 1, "C": 128, "K": 128, "H": 10, "W": 10}, None),
    "conv_bias_maxpool": ("conv_bias_maxpool", {"N": 2, "C": 256, "K": 256, "H": 10, "W": 8}, None),
    "conv_one_row": ("conv2d", {"N": 1, "C": 128, "K": 128, "H": 10, "W": 8}, "tile Y.y, 1\n"),
    "conv_pool_rows_2": ("conv_bias_maxpool", {"N": 2, "C": 256, "K": 256, "H": 10, "W": 8}, "tile conv.y, 2\n"),
    **{f"conv_pool_{key}": ("conv_bias_maxpool", {"N": 2, "C": 256, "K": 256, "H": 10, "W": 8}, schedule)
       for key, schedule in {"place_hbm": "place conv, hbm\n", "compute_at_root": "compute_at conv, root\n",
                             "hoist_weights": "hoist Wt, conv.k\n", "buffers_1": "buffers X, 1\n",
                             "split_weights": "split Wt, conv.c\n", "unroll": "unroll conv.s\n"}.items()},
    "avgpool": ("avgpool", {"N": 1, "C": 128, "H": 8, "W": 8}, None),
    "transpose_dma": ("transpose", {"M": 256, "N": 384}, "method Y, dma\n"),
    "vector_add": ("vector_add", {"L": 1024}, None),
}


def _compiled(case: str) -> Compiled:
    if case == "row_and_column":
        return compile_loaded(lang.load(ROW_AND_COLUMN))
    name, sizes, schedule = CASES[case]
    return compile_example(name, sizes, schedule=schedule)


ALL = sorted(CASES) + ["row_and_column"]


def _at(c: Compiled, stage: str) -> Compiled:
    source = emit(c.result.kernels[stage], "squeeze_test.tl", [])
    return Compiled(source, c.kernel_name, c.stages, c.program, c.result)


def _trace(c: Compiled):
    inputs = lang.random_inputs(c.program, seed=1)
    _, trace = c.run_traced(**inputs, numerics=False)
    return trace


@pytest.mark.parametrize("case", ALL)
def test_squeeze_keeps_the_instruction_stream_and_the_modelled_latency(case):
    from tilec.perf.api import estimate

    c = _compiled(case)
    before, after = _trace(_at(c, "legalise")), _trace(_at(c, "squeeze"))
    assert len(after.instrs) == len(before.instrs) > 0
    for b, a in zip(before.instrs, after.instrs):
        assert dataclasses.replace(a, file="", line=0) == dataclasses.replace(b, file="", line=0)
    assert estimate(after).total_us == estimate(before).total_us


@pytest.mark.parametrize("case", ALL)
def test_no_unit_dims_left_but_partitions_and_one_free_dim(case):
    """After squeeze an on-chip tile has a free dim of extent 1 only if all are (a (P, 1) column), and a
    compiler-made view has none unless it is one element long; the partition dim is never touched."""
    c = _compiled(case)
    before, after = c.result.kernels["legalise"], c.result.kernels["squeeze"]
    for s in ir.walk(after.body):
        if isinstance(s, ir.Alloc) and s.buf.memory != "hbm":
            assert 1 not in s.buf.shape[1:] or set(s.buf.shape[1:]) == {1}, ir.fmt_buf(s.buf)
        if isinstance(s, ir.Reshape):
            assert 1 not in s.buf.shape or s.buf.shape == (1,), ir.fmt_buf(s.buf)
    partitions = {s.buf.name: s.buf.shape[0] for s in ir.walk(before.body) if isinstance(s, ir.Alloc)}
    assert partitions == {s.buf.name: s.buf.shape[0] for s in ir.walk(after.body) if isinstance(s, ir.Alloc)}


def _operand_shapes(k: ir.Kernel) -> list[bool]:
    """Per engine statement: does the result have the shape of its operands (matmul: (stationary free, moving
    free...)), as NKI's assignment wants (the source broadcasts into the destination by numpy rules)?"""
    same = []
    for s in ir.walk(k.body):
        if isinstance(s, ir.Matmul):
            same.append(s.acc.shape() == s.stationary.shape()[1:] + s.moving.shape()[1:])
        elif isinstance(s, (ir.Copy, ir.Act, ir.Binary, ir.Scalar)):
            operands = (s.a, s.b) if isinstance(s, ir.Binary) else (s.src,)
            same.append(all(s.dst.shape() == v.shape() for v in operands))
    return same


@pytest.mark.parametrize("case", ALL)
def test_results_keep_the_shape_of_their_operands(case):
    """A squeezed tile and the views it meets lose the same unit dims: no rank mismatch appears."""
    c = _compiled(case)
    before, after = _operand_shapes(c.result.kernels["legalise"]), _operand_shapes(c.result.kernels["squeeze"])
    assert len(before) == len(after)
    assert all(a or not b for b, a in zip(before, after))


def test_matmul_reads_like_a_hand_written_kernel():
    """The plain matmul is no longer a degenerate convolution: 2-D tiles and operands, the arguments read directly."""
    source = unwrap(numbered(compile_example("matmul", CASES["matmul"][1]).source))
    assert ".reshape(" not in source
    assert "C_acc = nl.zeros((128, 320), dtype=nl.float32, buffer=nl.psum)" in source
    assert "nisa.nc_matmul(A_T[:, k_t, i_t * TILE_I:i_t * TILE_I + TILE_I], " \
           "B_tiles[:, k_t, j_t * TILE_J:j_t * TILE_J + TILE_J])" in source
    assert "nisa.dma_copy(dst=C[i_t * TILE_I:i_t * TILE_I + TILE_I], src=C_rows)" in source


def test_a_lone_unit_slice_stays_a_slice():
    """The (P, 1) bias column keeps its free dim; a 1-long slice of a longer dim becomes a single index."""
    source = unwrap(numbered(_compiled("conv_pool_rows_2").source))
    assert "bias=b_col[:, k_t:k_t + 1]" in source
    assert "nisa.tensor_tensor(conv_act[:, 0], conv_act[:, 1], " in source


def test_dma_transpose_operands_keep_their_rank():
    c = _compiled("transpose_dma")
    assert "nisa.dma_transpose(X[" in unwrap(numbered(c.source))
    transposes = [s for s in ir.walk(c.result.kernels["squeeze"].body) if isinstance(s, ir.Transpose)]
    assert transposes and all(len(t.src.idx) == 2 for t in transposes)


@pytest.mark.parametrize("case", ALL)
def test_squeeze_is_idempotent(case):
    k = _compiled(case).result.kernels["squeeze"]
    assert squeeze(k) == k


@pytest.mark.parametrize("shape,lead,needed,kept", [
    ((128, 8, 1, 1, 512), 1, set(), (0, 1, 4)),
    ((128, 1, 1), 1, set(), (0, 2)),  # one free dim stays: tiles are 2-D
    ((128, 1, 1), 1, {1}, (0, 1)),  # ... the one a view slices, if any
    ((1, 64), 1, set(), (0, 1)),  # a single partition stays a partition
    ((1, 1024, 1, 768), 0, set(), (1, 3)),
    ((1, 1), 0, set(), (1,)),
])
def test_kept_dims(shape, lead, needed, kept):
    assert kept_dims(shape, lead, needed) == kept
