"""The Target records: one place for the hardware limits, read by the compiler, its verifier, the tuner and the
interpreter; `--target` selects one."""
from __future__ import annotations

import dataclasses

import pytest

from compiler_helpers import ROOT
from tilec import target as hw
from tilec.compiler import ir
from tilec.compiler.api import compile_file
from tilec.compiler.schedule import SBUF_PLANNING_MARGIN, sbuf_budget
from tilec.compiler.verify import verify
from tilec.errors import InternalError, TilecError
from tilec.nki import language as nl
from tilec.nki import rules


def test_targets_carry_the_documented_figures() -> None:
    assert hw.TRN2.sbuf_bytes == 224 * 1024 and hw.TRN1.sbuf_bytes == 192 * 1024  # spec §2.2 ARCH3 / ARCH2
    assert hw.TRN1.sbuf_usable == 176 * 1024  # the 16 KiB reserve documented for v2 [ALLOC]
    assert hw.TRN2.psum_fmax == 512 and hw.TRN2.psum_bytes == 16 * 1024
    mm = hw.TRN2.instr("nc_matmul")
    assert (mm.limit("k"), mm.limit("m"), mm.limit("n")) == (128, 128, 512) and mm.writes == ("psum",)


def test_the_interpreter_and_tile_size_read_the_target() -> None:
    assert rules.target("trn1") is hw.TRN1 and rules.target("trn2") is hw.TRN2
    assert nl.tile_size.total_available_sbuf_size == hw.TRN2.sbuf_usable
    assert nl.tile_size.gemm_moving_fmax == hw.TRN2.moving_fmax


def test_unknown_target_is_a_user_error() -> None:
    with pytest.raises(TilecError, match="unknown target 'trn9'"):
        compile_file(ROOT / "examples" / "vector_add.tl", target="trn9")


def test_target_sets_the_compilers_sbuf_budget() -> None:
    path = ROOT / "examples" / "vector_add.tl"
    for t in (hw.TRN2, hw.TRN1):
        report = compile_file(path, target=t.name).stages["allocate"]
        assert f"of {(t.sbuf_usable - SBUF_PLANNING_MARGIN) // 1024} KiB usable" in report
    assert sbuf_budget(hw.TRN2) == 192 * 1024  # the budget every generated kernel was measured with


def test_verifier_limits_come_from_the_instruction_table() -> None:
    """A target whose matmul moving size were 256 rejects a 512-column matmul that trn2 accepts."""
    kernel = compile_file(ROOT / "examples" / "matmul.tl").result.kernel
    verify(kernel, "test", hw.TRN2)
    narrow = tuple(dataclasses.replace(i, limits=(("k", 128), ("m", 128), ("n", 256))) if i.name == "nc_matmul"
                   else i for i in hw.TRN2.instructions)
    with pytest.raises(InternalError, match="exceeds 256 free elements"):
        verify(kernel, "test", dataclasses.replace(hw.TRN2, instructions=narrow))
    assert any(isinstance(s, ir.Matmul) for s in ir.walk(kernel.body))
