"""`tilec check`, `tilec run`, `tilec fmt` on good programs: what they print and write."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from tilec.lang import api
from tilec_cli import main

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
MATMUL = str(EXAMPLES / "matmul.tl")


def test_check_prints_shapes(capsys: pytest.CaptureFixture) -> None:
    assert main(["check", str(EXAMPLES / "conv_bias_maxpool.tl"), "-D", "N=1"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("OK: kernel conv_bias_maxpool; in X: f32[1, 256, 224, 224]; in Wt: f32[256, 256, 3, 3]; "
                        "in b: f32[256]; temp conv: f32[1, 256, 222, 222]; out Y: f32[1, 256, 111, 111]\n")


def test_run_writes_outputs_equal_to_matmul(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    out_file = tmp_path / "out.npz"
    assert main(["run", MATMUL, "-D", "M=4", "-D", "K=6", "-D", "N=3", "--seed", "5", "--out", str(out_file),
                 "--backend", "ref"]) == 0
    printed = capsys.readouterr().out
    assert "input  A: f32[4, 6]" in printed and "output C: f32[4, 3]" in printed and "sha256=" in printed
    inputs = api.random_inputs(api.load(MATMUL, {"M": 4, "K": 6, "N": 3}), 5)
    with np.load(out_file) as data:
        np.testing.assert_allclose(data["C"], inputs["A"].astype(np.float64) @ inputs["B"], rtol=1e-5, atol=1e-6)


def test_run_from_inputs_file_infers_sizes(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(0)
    A, B = rng.random((2, 3), dtype=np.float32), rng.random((3, 5), dtype=np.float32)
    np.savez(tmp_path / "in.npz", A=A, B=B)
    assert main(["run", MATMUL, "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "o.npz"),
                 "--backend", "ref"]) == 0
    assert "output C: f32[2, 5]" in capsys.readouterr().out
    with np.load(tmp_path / "o.npz") as data:
        np.testing.assert_allclose(data["C"], A.astype(np.float64) @ B, rtol=1e-5)


def test_run_is_deterministic(capsys: pytest.CaptureFixture) -> None:
    argv = ["run", str(EXAMPLES / "conv_relu.tl"), "-D", "H=8", "-D", "W=10", "--seed", "3", "--backend", "ref"]
    main(argv)
    first = capsys.readouterr().out
    main(argv)
    assert capsys.readouterr().out == first


def test_fmt_check_and_in_place(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "p.tl"
    path.write_text("kernel k(A: f32[N]) -> Z\n  Z: f32[N]\n  for i in 0..N:\n      Z[i] = (A[i]+1)  # one\n")
    assert main(["fmt", "--check", str(path)]) == 1
    assert main(["fmt", str(path)]) == 0
    printed = capsys.readouterr().out
    assert printed == "kernel k(A: f32[N]) -> Z\n  Z: f32[N]\n  for i in 0..N:\n    Z[i] = A[i] + 1  # one\n"
    assert main(["fmt", "-i", str(path)]) == 0 and path.read_text() == printed
    assert main(["fmt", "--check", str(path)]) == 0


def test_run_on_nki_backend_reports_error_against_reference(capsys: pytest.CaptureFixture) -> None:
    """The glue to the compiler: compile, run on the interpreter, compare with the evaluator."""
    assert main(["run", str(EXAMPLES / "vector_add.tl"), "-D", "L=256", "--backend", "nki"]) == 0
    printed = capsys.readouterr().out
    line = next(ln for ln in printed.splitlines() if ln.startswith("nki    z: max abs error vs reference"))
    assert float(line.rsplit(" ", 1)[1]) < 1e-6


def test_run_fails_when_the_nki_result_disagrees(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    """A wrong NKI result is an error (exit 1), not just a printed number."""
    import tilec

    real = tilec.compile_file

    class OffByOne:
        def __init__(self, compiled) -> None:
            self.compiled = compiled

        def run(self, **inputs):
            return {name: out + np.float32(1) for name, out in self.compiled.run(**inputs).items()}

    monkeypatch.setattr(tilec, "compile_file", lambda *a, **k: OffByOne(real(*a, **k)))
    assert main(["run", str(EXAMPLES / "vector_add.tl"), "-D", "L=256"]) == 1
    err = capsys.readouterr().err
    assert "error: the NKI kernel's `z` differs from the reference evaluator by 1 (tolerance" in err


def test_check_says_which_sizes_are_unknown(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "add.tl"
    path.write_text("kernel add(A: f32[N], B: f32[N]) -> Z\n  Z: f32[N]\n  for i in 0..N:\n    Z[i] = A[i] + B[i]\n")
    assert main(["check", str(path)]) == 0
    assert capsys.readouterr().out.endswith("out Z: f32[?]; sizes N unknown (give -D NAME=VALUE to check everything)\n")


@pytest.mark.parametrize("case", ["directory", "binary_file", "out_dir_missing", "npy_not_npz", "npz_garbage",
                                  "complex_input"])
def test_file_mistakes_are_errors_not_tracebacks(case: str, tmp_path: pathlib.Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    np.save(tmp_path / "one.npy", np.ones(3, np.float32))
    np.savez(tmp_path / "complex.npz", x=np.ones(3, np.complex64), y=np.ones(3, np.float32))
    (tmp_path / "garbage.npz").write_bytes(b"\x00\xffnot a zip")
    add = str(EXAMPLES / "vector_add.tl")
    argv, message = {
        "directory": (["check", str(EXAMPLES)], f"error: {EXAMPLES} is a directory"),
        "binary_file": (["check", str(tmp_path / "one.npy")], "cannot read " + str(tmp_path / "one.npy") +
                        " as a .tl program"),
        "out_dir_missing": (["run", add, "-D", "L=8", "--backend", "ref", "--out", str(tmp_path / "no" / "o.npz")],
                            "error: cannot write"),
        "npy_not_npz": (["run", add, "--inputs", str(tmp_path / "one.npy")], "holds a single array"),
        "npz_garbage": (["run", add, "--inputs", str(tmp_path / "garbage.npz")], "error: cannot read inputs from"),
        "complex_input": (["run", add, "--inputs", str(tmp_path / "complex.npz")],
                          "error: input `x` has dtype complex64, not a real number type"),
    }[case]
    assert main(argv) == 1  # anything but a TilecError would escape main and fail the test
    err = capsys.readouterr().err
    assert message in err and "hint:" in err


def test_run_out_of_memory_is_an_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    def too_big(*args, **kwargs):
        raise MemoryError("Unable to allocate 37.3 GiB")

    monkeypatch.setattr(api, "random_inputs", too_big)
    assert main(["run", MATMUL, "-D", "M=100000", "--backend", "ref"]) == 1
    assert "error: not enough memory for these sizes: Unable to allocate 37.3 GiB" in capsys.readouterr().err
