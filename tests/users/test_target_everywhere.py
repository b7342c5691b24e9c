"""`--target` (tilec/target.py) read everywhere a user can give it (issue 10): the compiler, the interpreter that runs
its kernel, `nl.tile_size` inside a running kernel, the model, the tuner, and every subcommand that compiles, runs
or models (run, compile, explain, profile, tune, nki-run). audit10 found `run` and `tune` without the option,
`profile PROG.tl --target trn1` modelling a kernel compiled for trn2, `Compiled.run` running a trn1 kernel under
trn2's rules, and `nl.tile_size` frozen at the default target's figures."""
from __future__ import annotations

import argparse
import pathlib

import numpy as np
import pytest

import tilec  # noqa: F401  (serves `import nki`)
import nki
import nki.isa as nisa
import nki.language as nl
import tilec_cli
from tilec import target as hw
from tilec.compiler import api as compiler_api
from tilec.errors import TilecError
from tilec.nki import api as nki_api

ROOT = pathlib.Path(__file__).resolve().parents[2]
VECTOR_ADD = str(ROOT / "examples" / "vector_add.tl")


@nki.jit
def sbuf_sized(a):
    """An output whose width is a tile_size figure (in KiB of fp32 per partition): the shape shows which target's
    figure the kernel saw while it ran."""
    width = nl.tile_size.sbuf_fmax // 1024
    out = nl.ndarray((1, width), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((1, width), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=float(nl.tile_size.psum_num_banks))
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("t", [hw.TRN2, hw.TRN1])
def test_tile_size_is_the_running_kernels_target(t: hw.Target) -> None:
    out = nki_api.simulate(sbuf_sized, np.zeros((1, 1), np.float32), target=t.name)
    assert out.shape == (1, t.sbuf_usable // 4 // 1024)  # trn2 56, trn1 44
    assert (out == t.psum_banks).all()
    assert nl.tile_size.sbuf_size_bytes == hw.TRN2.pmax * hw.TRN2.sbuf_bytes  # outside a run: the default; all
    assert nl.tile_size.bn_stats_fmax == hw.TRN2.instr("bn_stats").limit("f")  # partitions (the docs' meaning)


def test_a_compiled_kernel_runs_under_its_own_targets_rules() -> None:
    c = compiler_api.compile_file(VECTOR_ADD, {"L": 4096}, target="trn1")
    a, b = (np.random.default_rng(s).random(4096, dtype=np.float32) for s in (0, 1))
    outs, trace = c.run_traced(a, b)
    assert trace.target == "trn1"
    np.testing.assert_array_equal(next(iter(outs.values())), a + b)


def test_jit_compiles_and_runs_for_its_target() -> None:
    add = tilec.jit(VECTOR_ADD, target="trn1")
    a, b = (np.random.default_rng(s).random(1024, dtype=np.float32) for s in (0, 1))
    np.testing.assert_array_equal(add(a, b), a + b)
    (compiled,) = add.cache.values()
    assert compiled.result.target is hw.TRN1
    with pytest.raises(TilecError, match="unknown target 'trn9'"):
        tilec.jit(VECTOR_ADD, target="trn9")


COMMANDS = {  # subcommand -> its arguments before --target
    "run": ["run", VECTOR_ADD, "-D", "L=4096", "--quiet"],
    "compile": ["compile", VECTOR_ADD, "-D", "L=4096"],
    "explain": ["explain", VECTOR_ADD, "-D", "L=4096"],
    "profile": ["profile", VECTOR_ADD, "-D", "L=4096", "--quiet"],
    "tune": ["tune", VECTOR_ADD, "-D", "L=4096", "--budget", "1", "--jobs", "1", "--no-cache", "--quiet"],
}


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_every_subcommand_that_compiles_compiles_for_the_target(cmd: str, monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: pathlib.Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    """Each compilation the subcommand makes is for the named target (the compiler's own record says so)."""
    seen: list[str] = []
    real = compiler_api.compile_program

    def spy(*args, **kwargs):
        result = real(*args, **kwargs)
        seen.append(result.target.name)
        return result

    monkeypatch.setattr(compiler_api, "compile_program", spy)
    monkeypatch.chdir(tmp_path)  # profile writes its trace here
    assert tilec_cli.main(COMMANDS[cmd] + ["--target", "trn1"]) == 0
    assert seen and set(seen) == {"trn1"}, seen
    if cmd == "profile":  # and the model is trn1's
        assert "estimated on trn1" in capsys.readouterr().out


def test_the_commands_that_run_or_model_all_take_target() -> None:
    parser = tilec_cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("run", "compile", "explain", "profile", "tune", "nki-run"):
        options = {o for a in subparsers.choices[name]._actions for o in a.option_strings}
        assert "--target" in options, name


PROGRAMS = sorted([*(ROOT / "examples").glob("*.tl"), *(ROOT / "benchmarks" / "core").glob("*.tl")])


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.stem)
def test_every_example_and_core_program_compiles_for_trn1(path: pathlib.Path) -> None:
    c = compiler_api.compile_file(path, target="trn1")
    assert c.result.target is hw.TRN1
