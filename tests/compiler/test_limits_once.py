"""Hardware limits are defined once, in tilec/target.py (issue 10: "limits are defined once"). A constant elsewhere
in tilec/ named after a hardware figure (partitions, PSUM banks and their free size, matmul free sizes, SBUF bytes,
DMA engines) must be read from a Target, never written as a number: audit10 found `PSUM_F32 = 512`
(build_rowchain), `PSUM_FP32 = 512` (depthwise_layout), `BN_STATS_FMAX = 512` (the interpreter) and
`psum_bank_fmax = 512`, `psum_num_banks = 8`, `sbuf_size_bytes = 224 * 1024` (nl.tile_size in 0.6)."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
# an assignment of a plain number (or a product of numbers) to a name that says it is a hardware figure
FIGURE = re.compile(r"^\s*(?P<name>\w*(?:pmax|psum|fmax|bank|partitions|dma_engines|sbuf_bytes|sbuf_size)\w*)"
                    r"\s*(?::\s*\w+)?\s*=\s*\d[\d_ *]*(?:#.*)?$", re.I | re.M)


def figures_written_as_numbers(text: str) -> list[str]:
    return [m.group("name") for m in FIGURE.finditer(text)]


def test_the_check_finds_a_figure_written_as_a_number() -> None:
    assert figures_written_as_numbers("PSUM_F32 = 512  # one bank\n    psum_num_banks = 8\nSBUF_SIZE = 224 * 1024\n") \
        == ["PSUM_F32", "psum_num_banks", "SBUF_SIZE"]
    assert figures_written_as_numbers('PSUM_F32 = invariant("psum_fmax")\nSBUF_BUDGET = 96 * 1024\n') == []


def test_no_hardware_figure_is_written_outside_the_target() -> None:
    found = {str(p.relative_to(ROOT)): names for p in sorted((ROOT / "tilec").rglob("*.py"))
             if p.name != "target.py" and (names := figures_written_as_numbers(p.read_text()))}
    assert not found, f"hardware figures written as numbers (read them from tilec.target): {found}"
