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
from tilec.compiler import ir
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from tilec.perf.api import estimate
from tilec.perf.params import TRN2
from tilec.perf.tracebuild import TraceBuilder
from tilec.compiler.wrap import unwrap
from kernel_numbers import numbered


def check_numbers(c, name: str, dtype: str) -> None:
    inputs = lang.random_inputs(c.program, seed=11)
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    want = FORMS[name][1](*(np.asarray(inputs[p.name], np.float64) for p in c.program.inputs))
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * scale)
    check_against_reference(c, seed=3)


@pytest.mark.parametrize("dtype,rows,cols", [("bf16", 512, 1024), ("f16", 768, 1024), ("bf16", 512, 1536)])
def test_layernorm_16bit_is_software_pipelined(dtype: str, rows: int, cols: int) -> None:
    """Rows shorter than TURN_MIN_F: r scales d on ScalarE, the centring moves to VectorE."""
    c = compiled("layernorm", dtype, rows, cols)
    src = unwrap(numbered(c.source))
    assert "software-pipelined" in src and src.count("for pt in range(") == 1
    assert "engine=nisa.engine.gpsimd" in src  # the shift by b
    passes = [line for line in src.splitlines() if re.search(r"nisa\.activation\(dst=(discard|Y_tile)", line)]
    # stage A is written out four times (prologue, twice in the loop, epilogue): ScalarE's squares and scaling by
    # r, and the mean unless it is on VectorE (a mean over a power of two of 16-bit values: rounded exactly)
    pow2 = cols & (cols - 1) == 0
    assert len(passes) == 4 * (2 if pow2 else 3)
    assert ("nisa.tensor_reduce(dst=mu_sum" in src) == pow2
    assert "nc_transpose" not in src
    check_numbers(c, "layernorm", dtype)


@pytest.mark.parametrize("dtype,rows,cols", [("bf16", 512, 2048), ("f16", 768, 2048), ("bf16", 512, 3072)])
def test_layernorm_16bit_pipelined_scales_on_the_broadcast(dtype: str, rows: int, cols: int) -> None:
    """Rows of TURN_MIN_F or more: r scales g's broadcast (r x g in PSUM), the centring stays on ScalarE."""
    c = compiled("layernorm", dtype, rows, cols)
    src = unwrap(numbered(c.source))
    assert "software-pipelined" in src and src.count("for pt in range(") == 1
    assert "engine=nisa.engine.gpsimd" in src  # the shift by b
    passes = [line for line in src.splitlines() if re.search(r"nisa\.activation\(dst=(discard|d_)", line)]
    # stage A is written out four times (prologue, twice in the loop, epilogue): ScalarE's centring and squares,
    # and the mean unless it is on VectorE (a mean over a power of two of 16-bit values: rounded exactly)
    pow2 = cols & (cols - 1) == 0
    assert len(passes) == 4 * (2 if pow2 else 3)
    assert ("nisa.tensor_reduce(dst=mu_sum" in src) == pow2
    # r (rounded to the dtype) turned into a row, the stationary of the broadcast: r x g in PSUM
    assert f"nc_transpose(dst=r_{dtype}_turned, data=r_{dtype})" in src and f"stationary=r_{dtype}_row" in src
    assert not re.search(r"activation\(dst=\w+, op=nl.copy, data=d_\w+, scale=", src)
    check_numbers(c, "layernorm", dtype)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_rmsnorm_scales_by_r_on_the_broadcast_of_g(dtype: str) -> None:
    """16-bit rmsnorm's X * r * g: one ScalarE pass per row tile (the squares), X times the PSUM broadcast of r x g
    on VectorE; pipelined (four row tiles)."""
    c = compiled("rmsnorm", dtype, 512, 2048)
    src = unwrap(numbered(c.source))
    assert "software-pipelined" in src
    whole = [line for line in src.splitlines() if re.search(r"nisa\.activation\(dst=\w+, op=", line)
             and "[128, 1]" not in line and "discard" in line]
    assert len(whole) == 4  # the squares, once per row-tile stage (prologue, two in the loop, epilogue)
    assert f"nc_transpose(dst=r_{dtype}_turned, data=r_{dtype})" in src
    assert re.search(rf"nc_matmul\(dst=g_scaled_psum\w*, stationary=r_{dtype}_row\w*, moving=g_row", src)
    assert re.search(r"tensor_tensor\(dst=Y_\w+\[:, ct \* Y_TILE_F:ct \* Y_TILE_F \+ Y_TILE_F\], "
                     r"data1=X_tile\w*\[:, ct \* Y_TILE_F:ct \* Y_TILE_F \+ Y_TILE_F\], data2=g_scaled_psum", src)
    check_numbers(c, "rmsnorm", dtype)


def test_f32_rmsnorm_keeps_its_scaling_pass() -> None:
    """f32 rmsnorm: two ScalarE passes take less than the row tile's DMA time (ScalarE is not the bound), so r
    scales X on ScalarE and g is broadcast alone (turning r into a row would only lengthen each tile's path)."""
    c = compiled("rmsnorm", "f32", 512, 2048)
    assert "nc_transpose" not in numbered(c.source) and "stationary=ones_f32" in numbered(c.source)
    check_numbers(c, "rmsnorm", "f32")


def test_a_column_not_exact_in_the_row_dtype_is_not_turned() -> None:
    """bf16 rmsnorm scaled by 0.3 as well (`X * r * 0.3 * g`): the column r * 0.3 is not a bf16 value, and its row
    in bf16 would round it, so the column scales X on ScalarE as before (the broadcast is of g alone)."""
    text = FORMS["rmsnorm"][0].replace("f32", "bf16").replace("X[i, j] * r[i] * g[j]", "X[i, j] * r[i] * 0.3 * g[j]")
    assert "* 0.3 *" in text
    c = compile_loaded(lang.load(text, {"M": 512, "N": 2048}), nki="0.6")
    assert "nc_transpose" not in numbered(c.source) and "stationary=ones_bf16" in numbered(c.source)
    inputs = lang.random_inputs(c.program, seed=11)
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    want = 0.3 * FORMS["rmsnorm"][1](*(np.asarray(inputs[p.name], np.float64) for p in c.program.inputs))
    np.testing.assert_allclose(got, want, rtol=TOLERANCE["bf16"], atol=TOLERANCE["bf16"] * float(np.abs(want).max()))
    check_against_reference(c, seed=3)


def test_odd_row_tile_count_keeps_one_tile_per_iteration() -> None:
    c = compiled("layernorm", "bf16", 384, 1024)  # three row tiles
    assert "software-pipelined" not in numbered(c.source)
    check_numbers(c, "layernorm", "bf16")


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_softmax_is_pipelined_at_its_loads(dtype: str) -> None:
    """softmax has no loop of steps to issue after the next row tile's passes: it is pipelined at its loads (rows19:
    stage A is the next row tile's load alone, issued before this tile's passes and store)."""
    c = compiled("softmax", dtype, 512, 1024)
    assert "software-pipelined" in c.source
    loop = c.source[c.source.index("pairs of row tiles"):]
    assert loop.index("nisa.dma_copy(dst=X_tile") < loop.index("nisa.activation(")
    check_numbers(c, "softmax", dtype)


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_softmax_16bit_sums_on_its_exp(nki: str) -> None:
    c = compile_loaded(lang.load(FORMS["softmax"][0].replace("f32", "bf16"), {"M": 384, "N": 2000}), nki=nki)
    src = unwrap(numbered(c.source))
    exp = [line for line in src.splitlines() if "op=nl.exp" in line]
    assert len(exp) == 1 and "reduce_res=s_col" in exp[0] and ("dst=e_bf16" in exp[0] or "e_bf16[...] =" in exp[0])
    stmts = list(ir.walk(c.result.kernel.body))
    # a column rounding on GpSimdE
    assert any(isinstance(x, ir.Copy) and x.dst.buf.name == "s_bf16" and x.engine == "gpsimd" for x in stmts)
    # the max of bf16 values is a bf16 value: reduced straight into a bf16 column, no rounding
    maxima = [x for x in stmts if isinstance(x, ir.Reduce) and x.op == "maximum"]
    assert [(x.dst.buf.name, x.dst.buf.dtype) for x in maxima] == [("m_bf16", "bf16")] and "m_col" not in src
    check_numbers(c, "softmax", "bf16")


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm"])
def test_f32_chains_are_pipelined_without_16bit_moves(name: str) -> None:
    """f32 layernorm and rmsnorm are pipelined too; the mean stays on ScalarE (no exact 16-bit rounding) and
    nothing is rounded."""
    c = compiled(name, "f32", 512, 1024)
    assert "software-pipelined" in c.source and "mu_sum" not in c.source and "bf16" not in c.source
    check_numbers(c, name, "f32")


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


# (form, dtype, rows, columns): pipelined (four row tiles); an odd tile count (five) and a row length that is not a
# multiple of the PSUM chunk (3000 = 6 x 500); chunked columns (rows of 16384) with three row tiles of 100 rows
TURNED = [("layernorm", "bf16", 512, 2048), ("rmsnorm", "f16", 640, 3000), ("layernorm", "f32", 640, 3000),
          ("rmsnorm", "bf16", 300, 16384), ("layernorm", "f32", 200, 16384)]


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("name,dtype,rows,cols", TURNED)
def test_turned_columns_in_both_nki_forms(name: str, dtype: str, rows: int, cols: int, nki: str) -> None:
    """The scaling by r on the broadcast of g, in every schedule the chain takes, in both NKI forms."""
    c = compile_loaded(lang.load(FORMS[name][0].replace("f32", dtype), {"M": rows, "N": cols}), nki=nki)
    assert "nc_transpose" in numbered(c.source) and "_scaled_psum" in numbered(c.source)
    assert ("software-pipelined" in numbered(c.source)) == (rows == 512)
    assert ("for cc in " in numbered(c.source)) == (cols == 16384)
    check_numbers(c, name, dtype)


def test_pipelined_tiles_written_only_or_not_stored_are_shared() -> None:
    """In the pipelined layernorm the discarded squares (written only, by ScalarE) and the products GpSimdE adds b
    to (never stored) are one buffer each for both parities, allocated once before the loop; the tiles handed from
    one stage to the next (d) and the stored result keep one buffer per parity."""
    c = compiled("layernorm", "bf16", 512, 2048)
    src = unwrap(numbered(c.source))
    allocs = re.findall(r"^\s*(\w+) = nl\.ndarray\(\(128, 2048\)", src, re.M)
    assert len([a for a in allocs if a.startswith("discard")]) == 1
    assert allocs.count("Y_prod1") == 1 and "Y_psum1" not in src
    assert "d_bf16" in allocs and "d_bf16_2" in allocs
    check_numbers(c, "layernorm", "bf16")
