"""benchmarks/families.py (issue 13's table) runs on tiny sizes and prints one row per family: a floor, and either a
model latency with its ratio or the compiler's rejection. No timing is asserted (benchmarks print, tests check)."""
from __future__ import annotations

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
    rows = {line.split(":")[0]: line for line in out[3:-1]}
    assert set(rows) == {f.program[:-3] for f in families.FAMILIES}
    for name, line in rows.items():
        assert line.rstrip().endswith("x") or "rejected: " in line, line
    for name in ("conv_residual", "conv3x3same", "resnet_block", "mobilenet_block"):  # compile: a latency and ratio
        assert rows[name].rstrip().endswith("x"), rows[name]
    assert out[-1].endswith("within 1.5x of the floor (start-up excluded)")


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
