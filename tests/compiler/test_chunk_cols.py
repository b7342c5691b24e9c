"""Row chains at long rows (chunk_cols.py): softmax, layernorm and rmsnorm whose whole-row tiles do not fit SBUF even
with shared tiles keep their one pass over HBM, X resident in SBUF and the rest column chunk by column chunk.

Each program is checked on the interpreter against its formula written in NumPy (float64, from the same inputs), at
row counts that are not a multiple of 128 (several row tiles), in f32, f16 and bf16; the structure is checked on the
kernel: a chunk loop, no intermediate through HBM, X loaded once per row tile (one DMA, chunk by chunk)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from compiler_helpers import EXAMPLES
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from tilec.compiler.wrap import unwrap
from kernel_numbers import numbered

# the examples' programs (their default sizes are replaced by each test's)
SOFTMAX, LAYERNORM, RMSNORM = ((EXAMPLES / f"{name}.tl").read_text() for name in ("softmax", "layernorm", "rmsnorm"))


def softmax(X):
    e = np.exp(X - X.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def layernorm(X, g, b):
    d = X - X.mean(axis=1, keepdims=True)
    return d / np.sqrt((d * d).mean(axis=1, keepdims=True) + 1e-5) * g + b


def rmsnorm(X, g):
    return X / np.sqrt((X * X).mean(axis=1, keepdims=True) + 1e-6) * g


FORMS = {"softmax": (SOFTMAX, softmax), "layernorm": (LAYERNORM, layernorm), "rmsnorm": (RMSNORM, rmsnorm)}
# relative to the largest output: every tensor of a narrow program is rounded (e, s, d, r, ... are f16/bf16 too)
TOLERANCE = {"f32": 2e-6, "f16": 4e-3, "bf16": 3e-2}


def compiled(name: str, dtype: str, rows: int, cols: int):
    return compile_loaded(lang.load(FORMS[name][0].replace("f32", dtype), {"M": rows, "N": cols}), nki="0.6")


# (form, dtype, rows, columns): each is chunked (checked below); rows not a multiple of 128, several row tiles
CASES = [("rmsnorm", "f32", 300, 16384), ("layernorm", "f32", 300, 16384), ("layernorm", "bf16", 300, 32768),
         ("layernorm", "f16", 150, 32768), ("softmax", "bf16", 150, 32768), ("softmax", "f16", 150, 32768),
         ("rmsnorm", "f32", 150, 32768), ("rmsnorm", "bf16", 150, 32768), ("softmax", "f32", 150, 32768)]


@pytest.mark.parametrize("name,dtype,rows,cols", CASES)
def test_long_rows_match_numpy(name: str, dtype: str, rows: int, cols: int) -> None:
    c = compiled(name, dtype, rows, cols)
    assert "for cc in range(" in numbered(c.source)  # the columns are chunked
    inputs = lang.random_inputs(c.program, seed=7)
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    want = FORMS[name][1](*(np.asarray(inputs[p.name], np.float64) for p in c.program.inputs))
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * scale)


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
def test_one_pass_over_hbm(name: str) -> None:
    """No intermediate through HBM; X read by one DMA (chunk by chunk, each chunk once per row tile), Y written by
    one; the chunk loop reads X's rows from the whole-row tile that stays in SBUF."""
    c = compiled(name, "f32", 300, 16384)
    src = unwrap(numbered(c.source))
    assert src.count("buffer=nl.shared_hbm") == 1 and "buffer=nl.hbm" not in src
    loads = [line for line in src.splitlines() if "dma_copy" in line and "src=X[" in line]
    assert len(loads) == 1 and "cc * " in loads[0]
    assert len([line for line in src.splitlines() if "dma_copy(dst=Y[" in line]) == 1
    assert re.search(r"X_tile = nl.ndarray\(\(100, 16384\)", src)  # resident: the output pass reads it again
    assert "fused row chain" in src


def test_a_chain_whose_tiles_cannot_rotate_is_chunked_with_x_allocated_once() -> None:
    """Layernorm over rows of 16384 fits with shared tiles, but their second buffers (the next row tile's) do not
    fit the budget: chunked instead, X allocated once before the row-tile loop (the next tile's chunks stream into it
    as this tile's output phase releases them). Softmax over rows of 16384 keeps no broadcast: chunked."""
    src = unwrap(numbered(compiled("layernorm", "f32", 256, 16384).source))
    assert "fused row chain" in src and "for cc in range(" in src
    head, loop = src.split("for pt in ", 1)
    assert re.search(r"X_tile = nl.ndarray\(\(\d+, 16384\)", head) and "X_tile = nl.ndarray" not in loop
    assert "for cc in range(" in numbered(compiled("softmax", "f32", 256, 16384).source)


@pytest.mark.parametrize("name,dtype,cols", [("layernorm", "f32", 8192), ("rmsnorm", "f32", 16384),
                                             ("layernorm", "bf16", 16384)])
def test_a_chunked_chain_whose_x_fits_twice_rotates_it(name: str, dtype: str, cols: int) -> None:
    """Layernorm over rows of 8192 fp32: chunked, X (32 KiB per partition) allocated in the row-tile loop, because
    two of it fit beside b and the chunk tiles' two buffers: the next row tile loads whole into its own buffer
    while this one is worked on (on the model under "fit" 1.62x -> 1.37x the floor; X allocated once before the
    loop waits for this tile's output phase chunk by chunk). The same for rmsnorm over rows of 16384 (no b) and
    16-bit layernorm over rows of 16384 in three row tiles (too few for chunk_pipe)."""
    from tilec.compiler.build_rowchain import ROTATING_MIN
    from tilec.compiler.schedule import sbuf_budget
    from tilec.target import target

    src = unwrap(numbered(compiled(name, dtype, 300, cols).source))
    head, loop = src.split("for pt in ", 1)
    assert "for cc in range(" in loop and "X_tile = nl.ndarray" not in head
    assert re.search(rf"X_tile = nl.ndarray\(\(\d+, {cols}\)", loop)
    sizes = [int(m.group(1)) * {"float32": 4, "bfloat16": 2}[m.group(2)]
             for m in re.finditer(r"nl.ndarray\(\(\d+, (\d+)\), dtype=nl.(\w+), buffer=nl.sbuf", loop)]
    whole = [int(m.group(1)) * {"float32": 4, "bfloat16": 2}[m.group(2)]
             for m in re.finditer(r"nl.ndarray\(\(\d+, (\d+)\), dtype=nl.(\w+), buffer=nl.sbuf", head)]
    assert 2 * sum(size for size in sizes if size >= ROTATING_MIN) + sum(whole) <= sbuf_budget(target("trn2"))


@pytest.mark.parametrize("name,rows,cols", [("softmax", 256, 32768), ("rmsnorm", 256, 32768),
                                            ("layernorm", 256, 16384)])
def test_tiles_rotating_across_row_tiles_fit_twice(name: str, rows: int, cols: int) -> None:
    """Every tile allocated inside the row-tile loop fits twice in the compiler's SBUF budget beside X (the second
    buffer is the next row tile's), counting every allocation site over the whole loop as the performance model
    does; the whole-row X (128 KiB at 32768 fp32) is allocated once, before the loop."""
    from tilec.compiler.build_rowchain import ROTATING_MIN
    from tilec.compiler.schedule import sbuf_budget
    from tilec.target import target

    head, loop = unwrap(numbered(compiled(name, "f32", rows, cols).source)).split("for pt in ", 1)
    assert re.search(rf"X_tile = nl.ndarray\(\(\d+, {cols}\)", head) and "X_tile = nl.ndarray" not in loop
    sizes = [int(m.group(1)) * {"float32": 4, "bfloat16": 2}[m.group(2)]
             for m in re.finditer(r"nl.ndarray\(\(\d+, (\d+)\), dtype=nl.(\w+), buffer=nl.sbuf", loop)]
    assert sizes and 2 * sum(size for size in sizes if size >= ROTATING_MIN) + 4 * cols <= sbuf_budget(target("trn2"))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("name,dtype,rows,cols,once", [("softmax", "f32", 150, 32768, True),
                                                       ("layernorm", "f32", 150, 16384, True),
                                                       ("rmsnorm", "f32", 200, 16384, False),
                                                       ("layernorm", "bf16", 150, 16384, False),
                                                       ("layernorm", "f32", 150, 8192, False),
                                                       ("rmsnorm", "f32", 200, 8192, False)])
def test_x_allocated_once_matches_numpy_in_both_nki_forms(nki: str, name: str, dtype: str, rows: int,
                                                          cols: int, once: bool) -> None:
    """The chunked chains with X allocated once before the row-tile loop (its chunks refilled row tile by row tile),
    or (`once` false) in the loop, rotating through two buffers, against NumPy (float64), in both NKI forms, with
    row tiles that are not 128 rows."""
    c = compile_loaded(lang.load(FORMS[name][0].replace("f32", dtype), {"M": rows, "N": cols}), nki=nki)
    head, loop = unwrap(numbered(c.source)).split("for pt in ", 1)
    assert re.search(r"for cc in (nl\.\w+_)?range\(", loop)
    assert bool(re.search(rf"X_tile = nl.ndarray\(\(\d+, {cols}\)", head)) == once
    assert ("X_tile = nl.ndarray" in loop) != once
    inputs = lang.random_inputs(c.program, seed=3)
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    want = FORMS[name][1](*(np.asarray(inputs[p.name], np.float64) for p in c.program.inputs))
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * scale)


def test_row_reductions_fold_their_partials() -> None:
    """Each row reduction of a chunked phase writes one partial per chunk, folded by one tensor_reduce."""
    src = unwrap(numbered(compiled("layernorm", "f32", 256, 16384).source))
    assert re.search(r"reduce_res=mu_neg_parts\[:, cc:cc \+ 1\]", src)
    assert "nisa.tensor_reduce(dst=mu_neg, op=nl.add, data=mu_neg_parts" in src
    assert re.search(r"g_chunk = nl.ndarray\(\(1, \d+\)", src)  # g's row is loaded chunk by chunk, not whole


def test_a_tile_too_long_to_keep_is_made_again() -> None:
    """Softmax over rows of 32768 fp32: X (128 KiB per partition) stays, e does not fit beside it, so exp(X - m) is
    computed again in the output phase (without its row sums) instead of being kept."""
    src = unwrap(numbered(compiled("softmax", "f32", 256, 32768).source))
    exps = [line for line in src.splitlines() if "op=nl.exp" in line]
    assert len(exps) == 2 and "reduce_res=s_parts" in exps[0] and "reduce_res" not in exps[1]
    assert "buffer=nl.hbm" not in src and re.search(r"e_tile = nl.ndarray\(\(128, \d+\)", src)


def test_narrow_tensors_are_written_narrow() -> None:
    """bf16 softmax: exp writes the rounded e itself (no fp32 e tile and no copy to bf16 and back), and the quotient
    writes the bf16 tile the store reads (no fp32 Y tile and cast)."""
    src = unwrap(numbered(compiled("softmax", "bf16", 256, 4096).source))
    assert re.search(r"nisa.activation\(dst=e_bf16, op=nl.exp", src)
    assert "e_tile" not in src and "e_rounded" not in src and "Y_tile" not in src
    assert "dma_copy(dst=Y[pt * Y_TILE_P:pt * Y_TILE_P + Y_TILE_P], src=Y_cast)" in src


def test_the_last_step_of_a_chunk_writes_the_narrow_output() -> None:
    """bf16 rmsnorm: the chunk loop's multiply by the broadcast of r x g writes the bf16 tile the store reads, no
    cast after."""
    src = unwrap(numbered(compiled("rmsnorm", "bf16", 256, 4096).source))
    assert re.search(r"tensor_tensor\(dst=Y_cast\[:, ct \* Y_TILE_F:ct \* Y_TILE_F \+ Y_TILE_F\], "
                     r"data1=X_tile\[:, ct \* Y_TILE_F", src)
    assert "tensor_copy(dst=Y_cast" not in src and "Y_rounded" not in src


@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_narrow_chains_match_numpy(name: str, dtype: str) -> None:
    c = compiled(name, dtype, 200, 1000)
    inputs = lang.random_inputs(c.program, seed=3)
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    want = FORMS[name][1](*(np.asarray(inputs[p.name], np.float64) for p in c.program.inputs))
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * scale)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_chunked_max_keeps_16bit_partials(dtype: str) -> None:
    """softmax over rows of 32768: the per-chunk maxima of 16-bit X are 16-bit values, kept in a 16-bit partials
    tile (exact; VectorE's 16-bit reduce streams at N/2); the sums' partials stay fp32."""
    c = compiled("softmax", dtype, 150, 32768)
    nl_dtype = {"bf16": "bfloat16", "f16": "float16"}[dtype]
    assert re.search(rf"m_\w*parts = nl.ndarray\(\(\d+, 8\), dtype=nl.{nl_dtype}", numbered(c.source))
    assert re.search(r"s_parts = nl.ndarray\(\(\d+, 8\), dtype=nl.float32", numbered(c.source))


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_16bit_layernorm_over_rows_of_16384_in_few_row_tiles_is_chunked(dtype: str) -> None:
    """A 16-bit chain's discarded activation output is in its dtype (half of fp32's space). 16-bit layernorm over
    rows of 16384 in three row tiles (too few for chunk_pipe's pipeline) would fit whole with tiles of disjoint lives
    sharing space (share.py), but not twice: chunked, X (32 KiB per partition) in the row-tile loop, where it fits
    twice beside b and the chunk tiles' two buffers."""
    c = compiled("layernorm", dtype, 300, 16384)
    assert "for cc in range(" in numbered(c.source)
    head, loop = unwrap(numbered(c.source)).split("for pt in ", 1)
    assert "X_tile = nl.ndarray" not in head and re.search(r"X_tile = nl.ndarray\(\(\d+, 16384\)", loop)
    nl_dtype = {"bf16": "bfloat16", "f16": "float16"}[dtype]
    assert re.search(rf"discard\w* = nl.ndarray\(\(\d+, \d+\), dtype=nl.{nl_dtype}", numbered(c.source))
    inputs = lang.random_inputs(c.program, seed=7)
    got = np.asarray(c.run(**inputs)["Y"], np.float64)
    want = layernorm(*(np.asarray(inputs[p.name], np.float64) for p in c.program.inputs))
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * float(np.abs(want).max()))
