"""A chunked 16-bit row chain software-pipelined (chunk_pipe.py, rows12): layernorm over rows too long to fit twice.

Stage A (the loads, the mean and the squares' sums, chunk by chunk) runs on ScalarE alone; stage B (d = X - mu,
r x g on TensorE, the products on VectorE, + b on GpSimdE over a whole chunk, the stores) of row tile i after stage A
of tile i + 1. Each kernel is checked on the interpreter against its formula in NumPy (float64, same inputs) and
against the reference evaluator under the project's tolerance policy, in both NKI forms; the structure on the
kernel text."""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from test_chunk_cols import FORMS, compiled
from test_rowchain_engines import check_numbers
from tilec.compiler import chunk_pipe, ir
from tilec.compiler.api import compile_loaded
from tilec.compiler.ir import Aff, Alloc, Buf, Sl, Term, View, whole
from tilec.compiler.wrap import unwrap
from tilec.lang import api as lang
from kernel_numbers import numbered

# (dtype, rows, columns): four row tiles of 100 rows (not a multiple of 128); f16 with four tiles of 128; nine
# chunks of 2048 columns (an odd chunk count: the last tile's chunks split between GpSimdE and VectorE);
# rows of 32768 (b kept whole for its first 25 chunks of 1024 only, the other 7 broadcast again chunk by chunk)
PIPED = [("bf16", 400, 16384), ("f16", 512, 16384), ("bf16", 400, 18432), ("bf16", 400, 32768)]


def stages(src: str) -> tuple[str, str]:
    """The loop over pairs of row tiles, cut at its first TensorE transpose: (stage A of the odd tile, the rest)."""
    loop = src[src.index("pairs of row tiles"):src.index("for p1 in")]
    cut = loop.index("nc_transpose")
    return loop[:cut], loop[cut:]


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dtype,rows,cols", PIPED)
def test_long_16bit_layernorm_is_chunked_and_pipelined(dtype: str, rows: int, cols: int, nki: str) -> None:
    c = compile_loaded(lang.load(FORMS["layernorm"][0].replace("f32", dtype), {"M": rows, "N": cols}), nki=nki)
    src = unwrap(numbered(c.source))
    assert "pairs of row tiles, software-pipelined" in src and re.search(r"for cc in (nl\.affine_)?range\(", src)
    check_numbers(c, "layernorm", dtype)


def test_stage_a_is_on_scalar_engine_alone() -> None:
    """Stage A: loads and ScalarE activations only (the squares read X with bias -mu, the partial sums are folded
    by ScalarE); stage B makes d chunk by chunk on VectorE and adds b over a whole chunk on GpSimdE."""
    src = unwrap(numbered(compiled("layernorm", "bf16", 400, 16384).source))
    a, b = stages(src)
    calls = set(re.findall(r"nisa\.(\w+)\(", a))
    assert calls == {"dma_copy", "activation"}, calls
    assert re.search(r"activation\(dst=pass_discarded, op=nl\.square, data=X_tile\w*\[[^]]*\], bias=mu_rounded_neg", a)
    assert "d_bf16" not in a and "engine=" not in a
    # d is a chunk made in stage B's chunk loop (never a whole row), by VectorE
    assert re.search(r"d_bf16\w* = nl\.ndarray\(\(100, 2048\)", b)
    assert re.search(r"nisa\.tensor_scalar\(dst=d_bf16\w*, data=X_tile", b)
    # GpSimdE's + b: one instruction per chunk of TILE_C columns, after the loop of steps over PSUM banks
    assert re.search(r"tensor_tensor\(dst=Y_cast\w*, data1=Y_prod1\w*,\s*data2=b_tile\[:, cc \* Y_TILE_C:cc \* "
                     r"Y_TILE_C \+ Y_TILE_C\], op=nl\.add, engine=nisa\.engine\.gpsimd\)", b)
    assert "Y_TILE_C = 2048" in src  # chunk_pipe.PIPE_CHUNK_BYTES of bf16


def test_row_broadcast_partly_whole() -> None:
    """Rows of 32768: X twice and b whole do not fit; b is broadcast before the loop for the first chunks only, and
    the loop over the chunks of stage B splits in two, the second broadcasting b again for each chunk."""
    src = unwrap(numbered(compiled("layernorm", "bf16", 400, 32768).source))
    assert "Y_TILE_C = 1024" in src
    assert re.search(r"^    b_tile = nl\.ndarray\(\(100, 25600\), dtype=nl\.bfloat16", src, re.M)
    _, b = stages(src)
    loops = re.findall(r"for cc in range\((\d+)\)", b)
    assert loops == ["25", "7", "32", "32", "25", "7"], loops  # B(2pt), A(2pt + 2), B(2pt + 1)
    second = b[b.index("for cc in range(7)"):b.index("for cc in range(32)")]  # up to A(2pt + 2)
    assert re.search(r"b_chunk\w* = nl\.ndarray\(\(100, 1024\)", second)
    assert re.search(r"dma_copy\(dst=b_part\w*, src=b\[cc \* Y_TILE_C \+ c \* 512 \+ 25600:", second)
    assert "data2=b_chunk" in second and "b_tile" not in second


def test_last_row_tile_shares_its_steps() -> None:
    """The epilogue's last stage B: the centring on ScalarE (no next tile's passes), GpSimdE's first chunks step by
    step, the last chunk's + b on VectorE reading the products from PSUM."""
    src = unwrap(numbered(compiled("layernorm", "bf16", 400, 16384).source))
    tail = src[src.index("for p1 in"):]
    last = tail[tail.rindex("for cc in range(6)"):]
    assert re.search(r"activation\(dst=d_bf16\w*, op=nl\.copy, data=X_tile", last)
    assert "for cc in range(2)" in last
    gpsimd, vector = last.split("for cc in range(2)")
    assert re.search(r"tensor_tensor\(dst=Y_cast\w*\[:, ct \* Y_TILE_F:[^]]*\], data1=Y_prod1\w*\[", gpsimd)
    assert "engine=nisa.engine.gpsimd" in gpsimd and "engine=" not in vector
    assert re.search(r"Y_psum\w* = nl\.ndarray\(\(100, 512\), dtype=nl\.float32, buffer=nl\.psum\)", vector)
    assert re.search(r"tensor_tensor\(dst=Y_cast\w*\[[^]]*\], data1=Y_psum\w*, data2=b_tile", vector)


@pytest.mark.parametrize("name,dtype,rows,cols", [("rmsnorm", "bf16", 400, 32768), ("layernorm", "bf16", 600, 16384)])
def test_other_long_chains_are_not_chunk_pipelined(name: str, dtype: str, rows: int, cols: int) -> None:
    """Two-phase chains (rmsnorm) and an odd number of row tiles (five) keep their schedules (f32 layernorm is
    pipelined with its statistics on VectorE instead: test_mean_var.py)."""
    src = unwrap(numbered(compiled(name, dtype, rows, cols).source))
    assert "pairs of row tiles" not in src


def test_f32_layernorm_is_pipelined_with_one_pass_statistics() -> None:
    """f32 layernorm over long rows: not chunk_pipe's schedule (its ScalarE passes do not move), but pipelined with
    bn_stats / bn_aggr on VectorE (build_rowchain.stats_pipelined)."""
    src = unwrap(numbered(compiled("layernorm", "f32", 400, 16384).source))
    assert "pairs of row tiles" in src and "bn_aggr" in src and "reduce_res" not in src


def test_sunk_moves_a_tile_to_its_first_reader() -> None:
    """A tile made by one instruction moves, with its allocation, to just before its first reader; not past a
    write of what it reads."""
    x, m, d, t = (Buf(n, "sbuf", "bf16", (128, 64)) for n in ("x", "m", "d", "t"))
    col = Buf("c", "sbuf", "f32", (128, 1))
    make = ir.Scalar(whole(d), whole(x), "add", whole(col))
    other = ir.Copy(whole(t), whole(x))
    use = ir.Copy(whole(m), whole(d))
    body = [Alloc(d), Alloc(t), make, other, use]
    assert chunk_pipe.sunk(body) == [Alloc(t), other, Alloc(d), make, use]
    blocked = [Alloc(d), make, ir.Act(whole(col), whole(x), "copy"), use]  # col rewritten before d's reader
    assert chunk_pipe.sunk(blocked) == blocked


def test_widened_and_narrowed_views() -> None:
    """A view of chunk ct (TILE_F columns) as the view of all the loop's chunks, and back."""
    buf = Buf("b_tile", "sbuf", "bf16", (128, 16384))
    cc = Term("cc", 4096, "TILE_C")
    per = View(buf, (ir.full(128), Sl(Aff((cc, Term("ct", 512, "TILE_F"))), 512, 1, "TILE_F")))
    wide = chunk_pipe._widened(per, 8)
    assert wide == View(buf, (ir.full(128), Sl(Aff((cc,)), 4096)))
    assert chunk_pipe._narrowed(wide, 8) == per
    assert chunk_pipe._widened(View(buf, (ir.full(128), Sl(Aff((cc,)), 512))), 8) is None  # not indexed by ct


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_last_banks_of_a_whole_pipelined_chain_on_vector_engine(nki: str) -> None:
    """A chain pipelined whole (rows of 4096: two halves of 4 PSUM banks): in the last row tile's last half, the
    + b of its last bank on VectorE from PSUM, the others on GpSimdE."""
    c = compile_loaded(lang.load(FORMS["layernorm"][0].replace("f32", "bf16"), {"M": 512, "N": 4096}), nki=nki)
    src = unwrap(numbered(c.source))
    tail = src[src.index("for p1 in"):]
    gpsimd, vector = tail.rsplit("for ct in ", 2)[1:]
    on_gpsimd = r"engine=nisa\.(engine\.gpsimd|gpsimd_engine)"  # NKI 0.6 and 0.1
    assert gpsimd.startswith("nl.affine_range(3)" if nki == "0.1" else "range(3)") and re.search(on_gpsimd, gpsimd)
    assert "engine=" not in vector and re.search(r"Y_psum\w*", vector) and re.search(r"Y_cast_2\[", vector)
    assert len(re.findall(on_gpsimd, src)) > 4  # every other half row: all banks on GpSimdE
    check_numbers(c, "layernorm", "bf16")


@pytest.mark.parametrize("cols,chunks,group", [(16384, 8, 4), (18432, 9, 3)])
def test_scalar_passes_cover_groups_of_chunks(cols: int, chunks: int, group: int) -> None:
    """Stage A's two ScalarE passes (the copy with the mean's partial sums, the square with the variance's) cover
    `group` chunks of 2048 columns per activation (TILE_PASS), the loads staying chunk by chunk; one partial per
    group; their discarded output is one tile allocated before every loop. The first row tile's mean pass (in the
    prologue) stays chunk by chunk: test_first_tile_mean_pass_stays_per_chunk."""
    src = unwrap(numbered(compiled("layernorm", "bf16", 400, cols).source))
    assert f"Y_TILE_PASS = {2048 * group}" in src and "Y_TILE_C = 2048" in src
    groups = chunks // group
    assert len(re.findall(rf"for cc in range\({groups}\):  # tl:\d+  for the columns \(groups of TILE_PASS", src)) == 7
    assert src.count(f"for ck in range({group}):") == 3  # the mean's pass: the loop's two, the epilogue's
    assert re.search(r"dma_copy\(dst=X_tile\w*\[:, cc \* Y_TILE_PASS \+ ck \* Y_TILE_C:", src)
    passes = re.findall(r"nisa\.activation\(dst=(\w+), op=nl\.(copy|square),\s*data=X_tile\w*\[:, cc \* Y_TILE_PASS:"
                        r"cc \* Y_TILE_PASS \+ Y_TILE_PASS\][^)]*reduce_res=(\w+)\[:, cc:cc \+ 1\]\)", src)
    assert len(passes) == 7 and {p[0] for p in passes} == {"pass_discarded"}, passes
    assert re.search(rf"^    pass_discarded = nl\.ndarray\(\(100, {2048 * group}\), dtype=nl\.bfloat16", src, re.M)
    assert not re.search(r"\bdiscard\w* = nl\.ndarray", src)
    assert re.search(rf"mu_neg_parts = nl\.ndarray\(\(100, {groups}\), dtype=nl\.float32", src)



@pytest.mark.parametrize("cols,chunks", [(16384, 8), (18432, 9)])
def test_first_tile_mean_pass_stays_per_chunk(cols: int, chunks: int) -> None:
    """The first row tile's mean pass (the pipeline's prologue, the only pass with nothing else to overlap) is one
    activation per chunk of 2048 columns, each right after its chunk's load, into the first TILE_C columns of the
    shared discarded tile; its partials (one per chunk) and their fold's spare output are buffers of its own, while
    every later pass covers groups of chunks (ScalarE starts after one chunk's load, not a group's)."""
    src = unwrap(numbered(compiled("layernorm", "bf16", 400, cols).source))
    prologue = src[src.index("for p0 in range(1):"):src.index("for pt in range(")]
    first = re.search(rf"for cc in range\({chunks}\):  # tl:\d+  for the columns \(chunks of TILE_C\)[^\n]*\n"
                      r"\s*nisa\.dma_copy\(dst=X_tile\[:, cc \* Y_TILE_C:cc \* Y_TILE_C \+ Y_TILE_C\], src=X\[0:100, "
                      r"cc \* Y_TILE_C:cc \* Y_TILE_C \+ Y_TILE_C\]\)[^\n]*\n"
                      r"\s*nisa\.activation\(dst=pass_discarded\[:, 0:2048\], op=nl\.copy, data=X_tile\[:, cc \* "
                      r"Y_TILE_C:cc \* Y_TILE_C \+ Y_TILE_C\], scale=[-0-9.e]+, reduce_op=nl\.add, "
                      r"reduce_res=mu_neg_parts_first\[:, cc:cc \+ 1\]\)", prologue)
    assert first, prologue[:3000]
    assert re.search(rf"mu_neg_parts_first = nl\.ndarray\(\(100, {chunks}\), dtype=nl\.float32", prologue)
    assert re.search(rf"mu_neg_parts_copy_first = nl\.ndarray\(\(100, {chunks}\), dtype=nl\.float32", prologue)
    assert re.search(r"nisa\.activation\(dst=mu_neg_parts_copy_first, op=nl\.copy, data=mu_neg_parts_first, "
                     r"reduce_op=nl\.add, reduce_res=mu_neg\)", prologue)
    # the prologue's variance pass and every pass after it are grouped
    assert "for cc in range(" in prologue and "groups of TILE_PASS" in prologue
    assert "mu_neg_parts_first" not in src[src.index("for pt in range("):]
    assert src.index("pass_discarded = nl.ndarray") < src.index("for p0 in range(1):")

def _rounded(a):
    return np.asarray(a, np.float64).astype(ml_dtypes.bfloat16).astype(np.float64)


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_grouped_passes_on_rows_far_from_zero(nki: str) -> None:
    """Rows with a mean ~125 times their spread, in bf16: the grouped passes sum 8192 columns of X * -1/N each and
    square X - mu with mu's bf16 value; Y matches NumPy's float64 formula with the program's bf16 roundings (mu,
    v, r and Y are bf16 tensors; d is bf16 where the steps read it)."""
    c = compile_loaded(lang.load(FORMS["layernorm"][0].replace("f32", "bf16"), {"M": 400, "N": 16384}), nki=nki)
    assert "Y_TILE_PASS = 8192" in numbered(c.source)
    rng = np.random.default_rng(7)
    X = (1000.0 + 8.0 * rng.standard_normal((400, 16384))).astype(ml_dtypes.bfloat16)
    g = rng.standard_normal(16384).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal(16384).astype(ml_dtypes.bfloat16)
    got = np.asarray(c.run(X=X, g=g, b=b)["Y"], np.float64)
    x = X.astype(np.float64)
    mu = _rounded(x.mean(axis=1, keepdims=True))
    v = _rounded(((x - mu) ** 2).mean(axis=1, keepdims=True))
    r = _rounded(1.0 / np.sqrt(v + 1e-5))
    want = _rounded(_rounded(x - mu) * r * g.astype(np.float64) + b.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * float(np.abs(want).max()))
    # the rounding of mu matters here: without it (the float64 mean) Y would be off by far more
    exact = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-5) * g.astype(
        np.float64) + b.astype(np.float64)
    assert float(np.abs(got - want).max()) < float(np.abs(got - exact).max())
