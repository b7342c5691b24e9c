"""The CLI entry point: each kind of failure is printed once, without a traceback, with its own exit code."""
from __future__ import annotations

import argparse

import pytest

import tilec_cli
from tilec.errors import InternalError, KernelError, TilecError


def _run_raising(monkeypatch: pytest.MonkeyPatch, err: Exception) -> int:
    def boom(args: argparse.Namespace) -> int:
        raise err

    monkeypatch.setattr(tilec_cli, "COMMANDS", [("boom", "raise", lambda p: None, boom)])
    monkeypatch.delenv("TILEC_TRACEBACK", raising=False)
    return tilec_cli.main(["boom"])


def test_user_error_exits_1_with_message(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    assert _run_raising(monkeypatch, TilecError("bad thing", hint="do this")) == 1
    assert capsys.readouterr().err == "error: bad thing\n  hint: do this\n"


def test_kernel_error_printed_as_is(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    assert _run_raising(monkeypatch, KernelError("k.py:3: error: rule [id]")) == 1
    assert capsys.readouterr().err == "k.py:3: error: rule [id]\n"


def test_internal_error_exits_3_without_traceback(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    assert _run_raising(monkeypatch, InternalError("IR verifier after `loops`: broken")) == 3
    err = capsys.readouterr().err
    assert err.startswith("internal compiler error: IR verifier after `loops`: broken\n")
    assert "bug in tilec" in err and "Traceback" not in err


def test_bad_define_is_a_user_error() -> None:
    with pytest.raises(TilecError, match="bad -D option 'C'"):
        tilec_cli.parse_defines(["C"])
    assert tilec_cli.parse_defines(["N=1", "C=256"]) == {"N": 1, "C": 256}


def test_output_files_that_cannot_be_written_are_user_errors(tmp_path) -> None:
    # compile -o, tune -o and tune --save-schedule share this writer: a bad path gets a hint naming the option
    with pytest.raises(TilecError) as err:
        tilec_cli._write_text(str(tmp_path / "missing" / "s.txt"), "tile Y.k, 128\n", "the schedule", "--save-schedule")
    assert err.value.message.startswith(f"cannot write the schedule to {tmp_path}/missing/s.txt: No such file")
    assert err.value.hint == "give --save-schedule a writable file path in an existing directory"
    tilec_cli._write_text(str(tmp_path / "k.py"), "x = 1\n")
    assert (tmp_path / "k.py").read_text() == "x = 1\n"


def test_a_reader_closing_the_pipe_early_is_not_a_traceback() -> None:
    import pathlib
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[1]
    # about 100 KB of trace on stdout: more than a pipe holds, so the writer meets the closed pipe
    cmd = [sys.executable, str(root / "tilec_cli.py"), "nki-run", str(root / "benchmarks" / "kernels" / "asst.py"),
           "--kernel", "vector_add_tiled_128", "--shape", "a_vec=25600:float32", "--shape", "b_vec=25600:float32",
           "--trace"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(10)
    proc.stdout.close()  # like `| head -c 10`
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and proc.returncode == 1, err.decode()
