"""One CLI dialect: the same options everywhere, results on stdout and notes on stderr, exit codes 1/2/3/130."""
from __future__ import annotations

import argparse
import pathlib
import warnings

import numpy as np
import pytest

import tilec_cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ONE_KERNEL = '''import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def double(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.multiply(nl.load(a), 2.0))
    return out
'''


def test_version(capsys: pytest.CaptureFixture) -> None:
    import tilec

    with pytest.raises(SystemExit) as done:
        tilec_cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"tilec {tilec.__version__}\n"


@pytest.mark.parametrize("argv", [["run"], ["check", "x.tl", "--bogus"], ["profile", "x.tl", "--target", "trn9"],
                                  ["nosuch"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        tilec_cli.main(argv)
    assert done.value.code == 2 and "usage: tilec" in capsys.readouterr().err


def test_fmt_of_several_files_needs_check_or_in_place(capsys: pytest.CaptureFixture) -> None:
    files = [str(EXAMPLES / "matmul.tl"), str(EXAMPLES / "rowsum.tl")]
    assert tilec_cli.main(["fmt", *files]) == 2
    assert "several files need --check or -i" in capsys.readouterr().err
    assert tilec_cli.main(["fmt", "--check", *files]) == 0


def test_fmt_in_place_rewrites_only_what_needs_it(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    good, bad = tmp_path / "good.tl", tmp_path / "bad.tl"
    good.write_text((EXAMPLES / "vector_add.tl").read_text())
    bad.write_text((EXAMPLES / "matmul.tl").read_text().replace("for i in 0..M", "for i in 0..M  "))
    assert tilec_cli.main(["fmt", "--check", str(good), str(bad)]) == 1
    assert capsys.readouterr().err == f"{bad}: not canonically formatted (run tilec fmt -i {bad})\n"
    assert tilec_cli.main(["fmt", "-i", str(good), str(bad)]) == 0
    assert capsys.readouterr().err == f"reformatted {bad}\n"
    assert bad.read_text() == (EXAMPLES / "matmul.tl").read_text()


def test_check_several_files_reports_each(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    broken = tmp_path / "broken.tl"
    broken.write_text("kernel k(X: f32[N]) -> Y\n  Y: f32[N]\n  for i in 0..N:\n    Y[i] = X[i, 0]\n")
    assert tilec_cli.main(["check", str(EXAMPLES / "matmul.tl"), str(broken), str(EXAMPLES / "rowsum.tl")]) == 1
    captured = capsys.readouterr()
    assert captured.out.count(": OK: kernel") == 2
    assert f"{broken}:4:12: error: `X` has 1 dimension" in captured.err and "Traceback" not in captured.err


def test_unexpected_exception_is_an_internal_error_exit_3(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    def boom(args: argparse.Namespace) -> int:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(tilec_cli, "COMMANDS", [("boom", "raise", lambda p: None, boom)])
    monkeypatch.delenv("TILEC_TRACEBACK", raising=False)
    assert tilec_cli.main(["boom"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("internal error: ZeroDivisionError: division by zero\n") and "Traceback" not in err


def test_interrupt_is_one_line_exit_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(tilec_cli, "COMMANDS", [("wait", "wait", lambda p: None, interrupted)])
    assert tilec_cli.main(["wait"]) == 130
    assert capsys.readouterr().err == "tilec: interrupted\n"


def test_outputs_are_results_on_stdout_and_wrote_notes_on_stderr(tmp_path: pathlib.Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    va = str(EXAMPLES / "vector_add.tl")
    assert tilec_cli.main(["run", va, "-D", "L=256", "--out", str(tmp_path / "o.npz")]) == 0
    captured = capsys.readouterr()
    assert "output z: f32[256]" in captured.out and captured.err == f"wrote {tmp_path / 'o.npz'}\n"
    assert tilec_cli.main(["compile", va, "-D", "L=256", "-o", str(tmp_path / "k.py")]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"wrote {tmp_path / 'k.py'} (kernel vector_add)\n"
    # the compiled kernel file has one kernel: nki-run and profile need no --kernel; --shape may be unnamed;
    # --inputs takes arrays in parameter order when their names are not the parameters'
    x, y = np.arange(256, dtype=np.float32), np.full(256, 0.5, np.float32)
    np.savez(tmp_path / "in.npz", first=x, second=y)
    assert tilec_cli.main(["nki-run", str(tmp_path / "k.py"), "--inputs", str(tmp_path / "in.npz"),
                           "--out", str(tmp_path / "n.npz")]) == 0
    captured = capsys.readouterr()
    assert "kernel vector_add:" in captured.out and captured.err == f"wrote {tmp_path / 'n.npz'}\n"
    assert np.array_equal(np.load(tmp_path / "n.npz")["out"], x + y)
    trace = tmp_path / "t.json"
    assert tilec_cli.main(["profile", str(tmp_path / "k.py"), "--shape", "256", "--shape", "256", "-o",
                           str(trace)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("vector_add: ") and " us estimated on trn2" in captured.out.splitlines()[0]
    assert captured.err == f"wrote {trace} (open it in https://ui.perfetto.dev)\n" and trace.exists()
    assert not list(tmp_path.glob("*.part"))


def test_a_file_with_several_kernels_names_them(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "two.py"
    path.write_text(ONE_KERNEL + ONE_KERNEL.split("\n\n\n")[1].replace("double", "twice"))
    assert tilec_cli.main(["profile", str(path), "--shape", "128x8"]) == 1
    err = capsys.readouterr().err
    assert "two.py has 2 kernels (double, twice); profiling it needs --kernel NAME" in err
    assert "hint: e.g. --kernel double" in err
    assert tilec_cli.main(["nki-run", str(path), "--kernel", "twice", "--shape", "128x8"]) == 0


def test_examples_are_listed_and_copied(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    assert tilec_cli.main(["examples"]) == 0
    out = capsys.readouterr().out
    for path in EXAMPLES.glob("*.tl"):
        assert path.name in out
    assert tilec_cli.main(["examples", "--copy", str(tmp_path / "ex")]) == 0
    assert sorted(p.name for p in (tmp_path / "ex").glob("*.tl")) == sorted(p.name for p in EXAMPLES.glob("*.tl"))
    assert (tmp_path / "ex" / "matmul.tl").read_text() == (EXAMPLES / "matmul.tl").read_text()


def test_compile_several_shapes_and_dtypes_into_one_module(tmp_path: pathlib.Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "mm.py"
    assert tilec_cli.main(["compile", str(EXAMPLES / "matmul.tl"), "--shapes", "M=128,K=128,N=512", "--shapes",
                           "M=256,K=256,N=384", "--dtype", "f32", "--dtype", "f16", "-o", str(out)]) == 0
    assert capsys.readouterr().err == f"wrote {out} (kernel matmul, 4 specialisations)\n"
    from tilec.nki.api import load_kernel_file, simulate

    matmul = load_kernel_file(str(out), "matmul")
    rng = np.random.default_rng(3)
    for (m, k, n) in ((128, 128, 512), (256, 256, 384)):
        for dtype, tol in ((np.float32, 1e-4), (np.float16, 2e-2)):
            a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
            c = simulate(matmul, a, b)
            want = a.astype(np.float64) @ b.astype(np.float64)
            assert c.dtype == dtype and np.abs(c - want).max() <= tol * np.abs(want).max()


def test_compile_with_a_dtype_and_no_shapes(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    """`--dtype bf16` alone once failed with "bad -D option ''" (the missing --shapes read as one empty size)."""
    out = tmp_path / "mm.py"
    assert tilec_cli.main(["compile", str(EXAMPLES / "matmul.tl"), "-D", "M=128", "-D", "K=128", "-D", "N=256",
                           "--dtype", "bf16", "-o", str(out)]) == 0
    assert capsys.readouterr().err == f"wrote {out} (kernel matmul, 1 specialisation)\n"
    from ml_dtypes import bfloat16
    from tilec.nki.api import load_kernel_file, simulate

    matmul = load_kernel_file(str(out), "matmul")
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((128, 128)).astype(bfloat16), rng.standard_normal((128, 256)).astype(bfloat16)
    c = simulate(matmul, a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert c.dtype == bfloat16 and np.abs(c.astype(np.float64) - want).max() <= 2e-2 * np.abs(want).max()


def test_run_says_when_outputs_are_nan(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    """NaN on both sides compares equal, so the error line alone reads as a pass (audit10): a note says how many."""
    prog = tmp_path / "logs.tl"
    prog.write_text("kernel logs(A: f32[N]) -> Y\n  default N = 256\n  Y: f32[N]\n  for i in 0..N:\n"
                    "    Y[i] = log(A[i])\n")
    with warnings.catch_warnings():  # the interpreter computes log(-x) as the engine does, without NumPy's warning
        warnings.simplefilter("error", RuntimeWarning)
        assert tilec_cli.main(["run", str(prog), "--quiet"]) == 0
    a = np.random.default_rng(0).random(256, dtype=np.float32) * np.float32(2) - np.float32(1)  # the CLI's inputs
    err = capsys.readouterr().err
    assert f"Y: {int((a < 0).sum())} of 256 values are NaN in the reference" in err
    assert tilec_cli.main(["run", str(EXAMPLES / "vector_add.tl"), "--quiet"]) == 0
    assert "NaN" not in capsys.readouterr().err
