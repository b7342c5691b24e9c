"""benchmarks/families.py (issue 13's table) runs on tiny sizes and prints one row per family: a floor, and either a
model latency with its ratio or the compiler's rejection. No timing is asserted (benchmarks print, tests check)."""
from __future__ import annotations

import dataclasses
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import families  # noqa: E402
from tilec.lang import api  # noqa: E402
from tilec.target import TRN2  # noqa: E402


def test_every_family_gets_a_row_at_tiny_sizes(capsys: pytest.CaptureFixture) -> None:
    assert families.main(["--tiny", "--batch", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {line.split(":")[0]: line for line in out[3:-3]}
    assert set(rows) == {f.program[:-3] for f in families.FAMILIES}
    for name, line in rows.items():
        assert line.rstrip().endswith("x") or "rejected: " in line, line
    for name in ("conv_residual", "conv3x3same", "resnet_block", "mobilenet_block"):  # compile: a latency and ratio
        assert rows[name].rstrip().endswith("x"), rows[name]
    assert out[-3].endswith("within 1.5x of the floor (start-up excluded)")
    assert out[-2].endswith("within 1.5x of max(floor, engines1), the one-pass bound before model14 (start-up excluded)")
    assert out[-1].endswith("within 1.5x of max(floor, engines) (start-up excluded)")
    head = out[1].split()
    assert head[-7:] == ["run", "µs", "ratio", "vs", "eng", "vs", "eng1"] and "engines" in head


def test_floor_counts_the_contraction_and_the_hbm_bytes() -> None:
    program = api.load(families.FOLDER / "conv_c3.tl", {"N": 2, "C": 3, "H": 10, "W": 9, "K": 8})
    flops = 2 * 2 * 8 * 8 * 7 * 3 * 3 * 3  # 2 x N K Ho Wo C R S
    assert families.contraction_flops(program.kernel, program.sizes) == flops
    floor, bound = families.floor_us(program, TRN2)
    compute = flops / (2 * 128 * 128 * TRN2.tensor_ghz / families.FP32_SLOWDOWN) / 1000
    dma = 4 * (2 * 3 * 10 * 9 + 8 * 3 * 9 + 2 * 8 * 8 * 7) / (TRN2.dma_engines * TRN2.dma_engine_bw) / 1000
    assert (floor, bound) == ((compute, "TensorE") if compute >= dma else (dma, "DMA"))
    pool = api.load(families.FOLDER / "global_avgpool.tl", {"C": 4})
    assert families.contraction_flops(pool.kernel, pool.sizes) == 0  # a sum of one read is no TensorE work


def test_floor_counts_factors_that_read_through_functions() -> None:
    """`min(relu(A[..] ?? 0), 6) * Wd[..]` is a product of two tensor reads (the depthwise of the MobileNet block)."""
    program = api.load(families.FOLDER / "mobilenet_block.tl", {"N": 1, "C": 2, "E": 4, "H": 3, "W": 5})
    macs = 4 * 3 * 5 * 2 + 4 * 3 * 5 * 9 + 2 * 3 * 5 * 4  # expand (E C), depthwise (E R S), project (C E)
    assert families.contraction_flops(program.kernel, program.sizes) == 2 * macs


def _rates(fp32: bool) -> tuple[float, float]:
    """TensorE columns per ns and the vector engines' multiply-adds per ns, written out from the Target's fields:
    VectorE adds ScalarE's products at one per cycle each (ScalarE, 1.2 GHz, outpaces VectorE, 0.96), GpSimdE fuses
    product and add at 2 cycles (128 x (0.96 + 1.2 / 2) = 199.68 per ns)."""
    assert TRN2.scalar_ghz >= TRN2.vector_ghz
    return TRN2.tensor_ghz / (4 if fp32 else 1), 128 * (TRN2.vector_ghz + TRN2.gpsimd_ghz / 2)


def test_vector_rate_counts_two_passes_per_multiply_add() -> None:
    """The one-pass bound of earlier sessions (VectorE and GpSimdE at one multiply-add per lane per cycle) against
    the two-pass one, and a target whose ScalarE is slower than its VectorE (VectorE fuses what ScalarE cannot
    feed)."""
    assert families.vector_macs_per_ns(TRN2, passes=1) == pytest.approx(128 * 2.16)
    assert families.vector_macs_per_ns(TRN2) == pytest.approx(199.68)
    slow = dataclasses.replace(TRN2, scalar_ghz=0.5)
    assert families.vector_macs_per_ns(slow) == pytest.approx(128 * (0.5 + 0.46 / 2 + 0.6))


def test_engines_bound_of_a_depthwise_conv_by_hand() -> None:
    """144 channels, 3x3, 8 x 6 outputs: no channel contraction, so TensorE makes 128 useful multiply-adds per
    column (one diagonal matmul per tap) while VectorE and GpSimdE make 128 per cycle each."""
    program = api.load(families.FOLDER / "depthwise3x3.tl", {"N": 1, "C": 144, "H": 10, "W": 8})
    (dw,) = families.contractions(program.kernel, program.sizes, 128, 128)
    macs = 144 * 8 * 6 * 9
    assert (dw.macs, dw.per_column, dw.grouped) == (macs, 128, True)
    columns, vector = _rates(fp32=True)  # 2.4 / 4 = 0.6 columns per ns; 199.68 multiply-adds per ns
    assert families.engines_us(program, TRN2) == pytest.approx(macs / (128 * columns + vector) / 1000, rel=1e-9)
    assert families.engines_us(program, TRN2) == pytest.approx(62208 / (76.8 + 199.68) / 1000, rel=1e-9)
    assert families.engines_us(program, TRN2, passes=1) == pytest.approx(62208 / (76.8 + 276.48) / 1000, rel=1e-9)
    # 40 channels: 40 diagonal rows, or 4 taps x 32 channels stacked on 128 rows (a folded stationary); 5 channels:
    # all 9 taps x 5 channels on 45 rows
    for channels, useful in ((40, 128), (5, 45)):
        few = api.load(families.FOLDER / "depthwise3x3.tl", {"N": 1, "C": channels, "H": 10, "W": 8})
        assert families.contractions(few.kernel, few.sizes, 128, 128)[0].per_column == useful


def test_engines_bound_of_grouped_convs_per_column() -> None:
    """A block-diagonal stationary: 32 groups of 4 -> 4 fill 128 rows x 128 columns with 32 blocks of 4 x 4 (512
    non-zeros per column); a multiplier of 2 (64 channels) folds 2 taps: 64 blocks of 2 rows x 2 columns (256);
    one output per group (4 inputs): 128 per column, as the depthwise diagonal."""
    def per_column(name: str, sizes: dict[str, int]) -> list[int]:
        program = api.load(families.FOLDER / name, sizes)
        return [c.per_column for c in families.contractions(program.kernel, program.sizes, 128, 128)]

    assert per_column("grouped3x3.tl", {"N": 1, "G": 32, "Cg": 4, "Kg": 4, "H": 6, "W": 6}) == [512]
    assert per_column("depthwise_mult3x3.tl", {"N": 1, "C": 64, "M": 2, "H": 6, "W": 6}) == [256]
    assert per_column("grouped_kg1.tl", {"N": 1, "G": 128, "Cg": 4, "H": 6, "W": 6}) == [128]
    assert per_column("conv3x3same.tl", {"N": 1, "C": 8, "K": 8, "H": 6, "W": 5}) == [128 * 128]  # dense


def test_engines_bound_shares_tensore_between_dense_and_depthwise_work() -> None:
    """The MobileNet block at bf16: the 1x1 convs (dense, D multiply-adds at 128 x 128 per column) and the depthwise
    (m at 128 per column). TensorE runs the dense work, then diagonal taps x; the vector engines the other m - x:
    D / (16384 c) + x / (128 c) = T and m - x = V T give T = (m + D / 128) / (128 c + V)."""
    text = (families.FOLDER / "mobilenet_block.tl").read_text().replace("f32[", "bf16[")
    program = api.load(text, {"N": 1, "C": 24, "E": 144, "H": 14, "W": 14})
    work = families.contractions(program.kernel, program.sizes, 128, 128)
    dense, m = 2 * 24 * 144 * 14 * 14, 144 * 14 * 14 * 9
    assert [(c.macs, c.per_column) for c in work] == [(dense // 2, 16384), (m, 128), (dense // 2, 16384)]
    columns, vector = _rates(fp32=False)
    expect = (m + dense / 128) / (128 * columns + vector) / 1000
    assert families.engines_us(program, TRN2) == pytest.approx(expect, rel=1e-9)
    floor, _ = families.floor_us(program, TRN2)
    assert floor < expect  # the floor counts the depthwise at the dense rate


def test_engines_bound_of_a_dense_conv_is_below_its_floor() -> None:
    """Without groups every multiply-add runs at the floor's rate, and the vector engines only add to it: the
    table's engines column (max with the floor) is the floor."""
    program = api.load(families.FOLDER / "conv3x3same.tl", {"N": 1, "C": 64, "K": 64, "H": 20, "W": 20})
    floor, bound = families.floor_us(program, TRN2)
    assert bound == "TensorE" and families.engines_us(program, TRN2) < floor


def test_core_rows_carry_the_model_latency_and_its_start_up() -> None:
    """benchmarks/core.py builds families.Row too: a column added to the row once shifted its positional arguments,
    so core.py printed the start-up as the run time and counted every row within 1.5x."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import core  # imported as a script module: core.py itself imports `families` from its own folder

    family, sizes = core.PROGRAMS[0]
    row = core.measure(family, sizes, True, TRN2)
    assert isinstance(row.tilec, float) and row.tilec > row.startup_us > 0
    assert row.engines_us >= row.floor_us > 0
    assert row.run_us == row.tilec - row.startup_us
