"""16-bit row chains with work on the idle engines (rows10): softmax's sum riding on its exp, column roundings on
GpSimdE, and the software-pipelined layernorm (pair_tiles.py: the mean and the centring on VectorE, the shift by b
on GpSimdE, ScalarE's passes two per row tile).

Each program is checked on the interpreter against its formula in NumPy (float64, same inputs) and against the
reference evaluator under the project's tolerance policy; the structure on the kernel text (NKI 0.6)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import check_against_reference
from test_chunk_cols import FORMS, TOLERANCE, compiled
from tilec.lang import api as lang
from tilec.perf.api import estimate
from tilec.perf.params import TRN2
from tilec.perf.tracebuild import TraceBuilder
from tilec.compiler.wrap import unwrap


def check_numbers(c, name: str, dtype: str) -> None:
    inputs = lang.random_inputs(c.program, seed=11)
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    want = FORMS[name][1](*(np.asarray(inputs[p.name], np.float64) for p in c.program.inputs))
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * scale)
    check_against_reference(c, seed=3)


@pytest.mark.parametrize("dtype,rows,cols", [("bf16", 512, 1024), ("f16", 768, 1024), ("bf16", 512, 1536)])
def test_layernorm_16bit_is_software_pipelined(dtype: str, rows: int, cols: int) -> None:
    c = compiled("layernorm", dtype, rows, cols)
    src = unwrap(c.source)
    assert "software-pipelined" in src and src.count("for pt in range(") == 1
    assert "engine=nisa.engine.gpsimd" in src  # the shift by b
    passes = [line for line in src.splitlines() if re.search(r"nisa\.activation\(dst=(discard|Y_tile)", line)]
    # stage A is written out four times (prologue, twice in the loop, epilogue): ScalarE's squares and scaling by
    # r, and the mean unless it is on VectorE (a mean over a power of two of 16-bit values: rounded exactly)
    pow2 = cols & (cols - 1) == 0
    assert len(passes) == 4 * (2 if pow2 else 3)
    assert ("nisa.tensor_reduce(dst=mu_sum" in src) == pow2
    check_numbers(c, "layernorm", dtype)


def test_odd_row_tile_count_keeps_one_tile_per_iteration() -> None:
    c = compiled("layernorm", "bf16", 384, 1024)  # three row tiles
    assert "software-pipelined" not in c.source
    check_numbers(c, "layernorm", "bf16")


@pytest.mark.parametrize("name", ["rmsnorm", "softmax"])
def test_chains_without_work_to_move_are_not_pipelined(name: str) -> None:
    c = compiled(name, "bf16", 512, 1024)
    assert "software-pipelined" not in c.source
    check_numbers(c, name, "bf16")


def test_softmax_16bit_sums_on_its_exp() -> None:
    c = compiled("softmax", "bf16", 256, 2048)
    src = unwrap(c.source)
    exp = [line for line in src.splitlines() if "op=nl.exp" in line]
    assert len(exp) == 1 and "reduce_res=s_col" in exp[0] and "dst=e_bf16" in exp[0]
    assert "tensor_copy(dst=m_rounded, src=m_bf16, engine=nisa.engine.gpsimd)" in src  # a column rounding
    check_numbers(c, "softmax", "bf16")


def test_f32_chains_are_unchanged_in_form() -> None:
    for name in FORMS:
        src = unwrap(compiled(name, "f32", 512, 1024).source)
        assert "software-pipelined" not in src and "gpsimd" not in src


def test_vector_tensor_scalar_16bit_mode_with_an_fp32_column() -> None:
    """A bf16 tile times an fp32 (P, 1) column into a bf16 tile streams in 16-bit performance mode (ARCH3: the
    data and the output decide; the column is one value per partition), as a bf16 copy does."""
    p = {name: value for name, value, _ in TRN2.table()}
    n = 4096

    def busy(reads: list[tuple[int, str, int]]) -> float:
        b = TraceBuilder("ts")
        accs = [b.at(b.buffer(f"in{i}", "sbuf", 128, free * size), stride_bytes=size if free > 1 else 0)
                for i, (free, _, size) in enumerate(reads)]
        out = b.buffer("out", "sbuf", 128, n * 2)
        b.compute("vector", "tensor_scalar", accs, [b.at(out, stride_bytes=2)], partitions=128, free=n,
                  dtypes=tuple(d for _, d, _ in reads), out_dtype="bfloat16")
        return estimate(b.trace).busy_ns["vector"]

    with_column = busy([(n, "bfloat16", 2), (1, "float32", 4)])
    assert with_column == pytest.approx((n / p["perf_mode_copy"] + p["vector_static_cycles"]) / p["vector_ghz"])
    assert busy([(n, "float32", 4), (1, "float32", 4)]) > 3 * with_column  # fp32 data: no 16-bit mode
