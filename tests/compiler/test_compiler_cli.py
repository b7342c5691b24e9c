"""The compiler's CLI commands: compile (-o, --dump-ir, --schedule), explain; user errors print no traceback."""
from __future__ import annotations

import ast

import pytest

from compiler_helpers import EXAMPLES
from tilec.compiler.api import STAGES
from tilec_cli import main

CONV = str(EXAMPLES / "conv_bias_maxpool.tl")
SMALL = ["-D", "N=1", "-D", "H=12", "-D", "W=12"]


def test_compile_writes_kernel(tmp_path, capsys):
    out = tmp_path / "k.py"
    assert main(["compile", CONV, "-o", str(out), *SMALL]) == 0
    ast.parse(out.read_text())
    assert "wrote" in capsys.readouterr().err


def test_dump_ir_all_prints_every_stage(capsys):
    assert main(["compile", CONV, "--dump-ir", "all", *SMALL]) == 0
    text = capsys.readouterr().out
    for stage in STAGES:
        assert f"=== {stage} ===" in text
    assert text.index("=== lower ===") < text.index("=== allocate ===")


def test_dump_ir_one_stage(capsys):
    assert main(["compile", CONV, "--dump-ir", "select", *SMALL]) == 0
    out = capsys.readouterr().out
    assert out.startswith("=== select ===") and "=== loops ===" not in out


def test_explain(capsys):
    assert main(["explain", CONV, *SMALL]) == 0
    out = capsys.readouterr().out
    for needle in ("schedule applied", "tile conv.k, 128", "never in HBM: fused into Y", "peak SBUF per partition",
                   "PSUM"):
        assert needle in out


def test_schedule_file(tmp_path, capsys):
    sched = tmp_path / "s.sched"
    sched.write_text("reorder conv, k, n, y\n")
    assert main(["compile", CONV, "--schedule", str(sched), "--dump-ir", "schedule", *SMALL]) == 0
    assert "reorder conv, k, n, y" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["--dump-ir", "nope"], ["--schedule", "tile conv.k, 256\n"]])
def test_user_errors_have_no_traceback(args, capsys):
    assert main(["compile", CONV, *SMALL, *args]) == 1
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_unmappable_statement_is_an_error_with_caret(tmp_path, capsys):
    prog = tmp_path / "bad.tl"
    prog.write_text("kernel shift(A: f32[L]) -> B\n  default L = 256\n  B: f32[L]\n"
                    "  for i in 0..L - 1:\n    B[i] = A[i + 1]\n")
    assert main(["compile", str(prog)]) == 1
    err = capsys.readouterr().err
    assert "cannot map `B`" in err and "^" in err


@pytest.mark.parametrize("command, args, message", [
    ("compile", ["-o", "{tmp}/missing/dir/k.py"], "cannot write the kernel to {tmp}/missing/dir/k.py: No such file"),
    ("compile", ["-o", "{tmp}"], "cannot write the kernel to {tmp}: Is a directory"),
    ("compile", ["--schedule", "{tmp}/missing.txt"], "no such schedule file: {tmp}/missing.txt"),
    ("compile", ["--schedule", "{tmp}/missing"], "no such schedule file: {tmp}/missing"),
    ("compile", ["--schedule", "{tmp}"], "schedule {tmp} is a directory, not a file"),
    ("explain", ["--schedule", "{tmp}/missing.sched"], "no such schedule file: {tmp}/missing.sched"),
    ("compile", ["--dump-ir", "bogus"], "unknown IR stage 'bogus'"),
])
def test_file_errors_are_tilec_errors_with_hint(command, args, message, tmp_path, capsys):
    args = [a.format(tmp=tmp_path) for a in args]
    assert main([command, CONV, *SMALL, *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: " + message.format(tmp=tmp_path))
    assert "\n  hint: " in err and "Traceback" not in err


def test_kernel_checks_its_input_shapes(tmp_path, capsys):
    """A kernel is specialised to its shapes: called with others it stops at the first line and says why."""
    import numpy as np

    from tilec.nki.api import load_kernel_file, simulate

    out = tmp_path / "k.py"
    assert main(["compile", str(EXAMPLES / "vector_add.tl"), "-D", "L=256", "-o", str(out)]) == 0
    kernel = load_kernel_file(str(out), "vector_add")
    x = np.ones(256, np.float32)
    assert np.array_equal(simulate(kernel, x, x), 2 * x)
    with pytest.raises(AssertionError) as err:
        simulate(kernel, np.ones(128, np.float32), np.ones(128, np.float32))
    assert str(err.value) == ("vector_add was compiled for x of shape (256,); recompile with tilec compile -D L=...")
    capsys.readouterr()
    assert main(["nki-run", str(out), "--kernel", "vector_add", "--shape", "x=256", "--shape", "y=512"]) == 1
    assert ("error: the kernel raised AssertionError: vector_add was compiled for y of shape (256,); recompile with"
            " tilec compile -D L=...") in capsys.readouterr().err
