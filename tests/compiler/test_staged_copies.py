"""16-bit data movement near the DMA floor (issue 13 item 5, move10): copies whose contiguous runs are short go
through SBUF so that every DMA moves one long run per partition.

- a crop/shift of the last dimension with short rows (`Y[n, c, i, j] = X[n, c, i, j + 1]`, 16-bit rows of 55
  elements) is built by rules_copy.row_blocks without a fill: X's rows loaded whole, cut on chip, stored whole;
  long rows (and f32 rows above rules_copy.STAGE_RUN_BYTES) stay one HBM -> HBM DMA per block of partitions.

Every kernel's output is compared exactly with NumPy slicing of the dtype-rounded input (a copy moves bits), on
both NKI dialects, at odd sizes, batch 1 and > 1."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import check_against_reference, inputs_for
from tilec.compiler import rules_copy
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from kernel_numbers import numbered

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}

def crop_program(dtype: str, out_dtype: str = "", A: int = 0, B: int = 1, R: int = 0, S: int = 1,
                 **sizes: int) -> tuple[str, dict[str, int]]:
    """`Y[n, c, i, j] = X[n, c, i + A, j + B]` with R rows and S columns fewer in Y, in `dtype` (Y in `out_dtype`)."""
    text = (f"kernel crop(X: {dtype}[N, C, H, W]) -> Y\n"
            f"  Y: {out_dtype or dtype}[N, C, H - {R}, W - {S}]\n"
            f"  for n in 0..N, c in 0..C, i in 0..H - {R}, j in 0..W - {S}:\n"
            f"    Y[n, c, i, j] = X[n, c, i + {A}, j + {B}]\n")
    return text, sizes


def run_crop(dtype: str, nki: str, out_dtype: str = "", a: int = 0, b: int = 1, r: int = 0, s: int = 1, **sizes):
    text, sizes = crop_program(dtype, out_dtype, a, b, r, s, **sizes)
    c = compile_loaded(lang.load(text, sizes), nki=nki)
    inputs = inputs_for(c.program)
    got = np.asarray(c.run(**inputs)["Y"], np.float32)
    x = np.asarray(inputs["X"]).astype(NP[dtype]).astype(np.float32)
    H, W = x.shape[2:]
    want = x[:, :, a:a + H - r, b:b + W - s]
    if out_dtype:
        want = want.astype(NP[out_dtype]).astype(np.float32)
    return c, got, want


SHAPES = {
    # 64 channels of 7 rows: fewer units than partitions, (channel, row block) pairs; a row crop as well
    "pairs_64x7x9": dict(N=1, C=64, H=7, W=9, a=1, r=2),
    # 3 x 130 units: blocks of 128 and a ragged last one, rows of 10 of 11
    "batch_3x130": dict(N=3, C=130, H=4, W=11),
    # a crop at the end of the rows (no offset) keeping 13 of 17 columns, 2 images
    "end_2x40": dict(N=2, C=40, H=5, W=17, b=0, s=4),
}


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_crop_of_short_rows_is_staged_and_exact(shape: str, dtype: str, nki: str) -> None:
    c, got, want = run_crop(dtype, nki, **SHAPES[shape])
    assert "cropped in SBUF" in numbered(c.source) and "nl.sbuf" in numbered(c.source)
    np.testing.assert_array_equal(got, want)  # a copy moves bits: exact


@pytest.mark.parametrize("dtype, out_dtype", [("f32", "bf16"), ("bf16", "f32"), ("f16", "bf16")])
def test_a_converting_staged_crop_rounds_as_numpy(dtype: str, out_dtype: str) -> None:
    c, got, want = run_crop(dtype, "0.6", out_dtype, N=2, C=70, H=3, W=9)
    assert "cropped in SBUF" in numbered(c.source)
    np.testing.assert_array_equal(got, want)
    check_against_reference(c)


def test_the_shift_family_loads_and_stores_one_run_per_partition() -> None:
    """The bf16 shift at its benchmark shape: per block of 128 channels one load of whole rows (56 x 56), the cut
    on VectorE and ScalarE, one store of whole result rows (56 x 55): 4 DMAs in all."""
    c, got, want = run_crop("bf16", "0.6", N=1, C=256, H=56, W=56)
    np.testing.assert_array_equal(got, want)
    src = numbered(c.source)
    assert "X_rows = nl.ndarray((128, 56, 56)" in src and "Y_tile = nl.ndarray((128, 56, 55)" in src
    assert src.count("nisa.dma_copy(") == 2 and "for o_t in range(2):" in src
    assert "nisa.tensor_copy(" in src and "nisa.activation(" in src
    assert all(len(line) <= 120 for line in src.splitlines() if line.lstrip().startswith("# ----"))


@pytest.mark.parametrize("dtype, width, staged", [
    ("bf16", 56, True),  # 110-byte rows
    ("f32", 40, True),  # 156 bytes
    ("f32", 42, False),  # 164 bytes: HBM -> HBM
    ("bf16", 100, False),  # 198 bytes
])
def test_only_short_rows_are_staged(dtype: str, width: int, staged: bool) -> None:
    text, sizes = crop_program(dtype, A=0, B=1, R=0, S=1, N=1, C=128, H=3, W=width)
    c = compile_loaded(lang.load(text, sizes))
    assert (((width - 1) * (4 if dtype == "f32" else 2) < rules_copy.STAGE_RUN_BYTES) == staged)
    assert ("cropped in SBUF" in numbered(c.source)) == staged
    if not staged:
        assert numbered(c.source).count("nisa.dma_copy(") == 1 and "nl.sbuf" not in numbered(c.source)


def test_a_crop_keeping_less_than_half_the_row_stays_hbm_to_hbm() -> None:
    """Loading whole rows to keep 4 of 17 elements would move 4x the bytes: the crop stays HBM -> HBM."""
    text, sizes = crop_program("bf16", A=0, B=3, R=0, S=13, N=1, C=128, H=3, W=17)
    c = compile_loaded(lang.load(text, sizes))
    assert "cropped in SBUF" not in numbered(c.source) and "nl.sbuf" not in numbered(c.source)
    check_against_reference(c)


# ---- nearest upsampling (rules_copy.upsampled_rows) ----------------------------------------------------------------

def upsample_program(dtype: str, ki: int, kj: int, out_dtype: str = "") -> str:
    rows, cols = (f"i / {ki}" if ki > 1 else "i"), (f"j / {kj}" if kj > 1 else "j")
    return (f"kernel up(X: {dtype}[N, C, H, W]) -> Y\n"
            f"  Y: {out_dtype or dtype}[N, C, {ki}*H, {kj}*W]\n"
            f"  for n in 0..N, c in 0..C, i in 0..{ki}*H, j in 0..{kj}*W:\n"
            f"    Y[n, c, i, j] = X[n, c, {rows}, {cols}]\n")


def run_upsample(dtype: str, nki: str, ki: int, kj: int, out_dtype: str = "", **sizes: int):
    c = compile_loaded(lang.load(upsample_program(dtype, ki, kj, out_dtype), sizes), nki=nki)
    inputs = inputs_for(c.program)
    got = np.asarray(c.run(**inputs)["Y"], np.float32)
    x = np.asarray(inputs["X"]).astype(NP[dtype]).astype(np.float32)
    want = x.repeat(ki, axis=2).repeat(kj, axis=3)
    if out_dtype:
        want = want.astype(NP[out_dtype]).astype(np.float32)
    return c, got, want


UPSAMPLES = {
    "2x2_batch1": (2, 2, dict(N=1, C=128, H=5, W=7)),
    "3x2_ragged": (3, 2, dict(N=3, C=50, H=3, W=5)),  # 150 units: a block of 128 and one of 22
    "1x2_cols": (1, 2, dict(N=2, C=70, H=4, W=9)),
    "2x1_rows": (2, 1, dict(N=1, C=131, H=3, W=6)),
    "steps_2x2": (2, 2, dict(N=1, C=128, H=40, W=60)),  # several steps of rows (UPSAMPLE_STEP_BYTES)
}


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("case", sorted(UPSAMPLES))
def test_upsampled_rows_match_numpy_repeat(case: str, dtype: str, nki: str) -> None:
    ki, kj, sizes = UPSAMPLES[case]
    c, got, want = run_upsample(dtype, nki, ki, kj, **sizes)
    assert f"upsampled {ki}x{kj} in SBUF" in numbered(c.source)
    np.testing.assert_array_equal(got, want)


def test_upsampled_rows_take_steps_of_rows_that_fit() -> None:
    c, _, _ = run_upsample("f32", "0.6", 2, 2, N=1, C=128, H=40, W=60)
    per_row = 2 * 120 * 4  # result bytes per row of X
    rows = max(d for d in range(1, 41) if 40 % d == 0 and d * per_row <= rules_copy.UPSAMPLE_STEP_BYTES)
    assert rows < 40 and f"for r_t in range({40 // rows}):" in numbered(c.source)
    assert f"Y_tile = nl.ndarray((128, {2 * rows}, 120)" in numbered(c.source)


@pytest.mark.parametrize("dtype, out_dtype", [("f32", "bf16"), ("bf16", "f32")])
def test_a_converting_upsample_rounds_as_numpy(dtype: str, out_dtype: str) -> None:
    c, got, want = run_upsample(dtype, "0.6", 2, 2, out_dtype, N=2, C=64, H=3, W=4)
    np.testing.assert_array_equal(got, want)
    check_against_reference(c)


def test_an_upsample_of_few_units_keeps_the_replication_rule() -> None:
    """Fewer units than partitions: the copy rule's replication (channels on the partitions) takes it."""
    c, got, want = run_upsample("bf16", "0.6", 2, 2, N=1, C=40, H=4, W=5)
    assert "upsampled" not in numbered(c.source) and "replicated" in numbered(c.source)
    np.testing.assert_array_equal(got, want)


# ---- a "same" pad's two fill rows in one DMA (rules_copy.row_blocks) -----------------------------------------------

@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_both_fill_rows_are_one_dma_and_exact(dtype: str, nki: str) -> None:
    from test_padded_copy import expected, program
    dims = [("n", 3, 3, 0), ("c", 50, 50, 0), ("y", 7, 9, -1), ("x", 5, 7, -1)]  # 150 units: 2 blocks of 75
    c = compile_loaded(lang.load(program(dims, "-2", dtype)), nki=nki)
    assert "dma_copy(dst=Y_v[o_t * 75:o_t * 75 + 75, 0:9:8]" in numbered(c.source)  # rows 0 and 8, blocks of 75 units
    inputs = inputs_for(c.program)
    got = np.asarray(c.run(**inputs)["Y"], np.float32)
    x = np.asarray(inputs["X"]).astype(NP[dtype]).astype(np.float32)
    np.testing.assert_array_equal(got, expected(x, dims, -2.0))
