"""`tilec nki-run` on kernel files, `python -m tilec.nki`, and the import shim for plain scripts."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tilec_cli
from nki_testutil import KERNELS, ROOT

ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_nki_run_with_npz_inputs(tmp_path, capsys) -> None:
    a = np.random.default_rng(0).random(2048, dtype=np.float32)
    b = np.random.default_rng(1).random(2048, dtype=np.float32)
    np.savez(tmp_path / "in.npz", a_vec=a, b_vec=b)
    rc = tilec_cli.main(["nki-run", str(KERNELS / "asst.py"), "--kernel", "vector_add_tiled_128",
                         "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "out.npz"), "--trace"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "kernel vector_add_tiled_128: 64 instructions" in text and "tensor_scalar" in text
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_array_equal(out["out"], a + b)


def test_nki_run_random_shapes_and_scalar_arg(capsys) -> None:
    rc = tilec_cli.main(["nki-run", str(KERNELS / "conv2d.py"), "--kernel", "fused_conv2d_maxpool",
                         "--shape", "X=1x128x6x10:float16", "--shape", "W=128x128x3x3:float16",
                         "--shape", "bias=128:float16", "--arg", "pool_size=2"])
    assert rc == 0
    assert "output out: shape (1, 128, 2, 4) float16" in capsys.readouterr().out


def test_nki_run_rule_violation_prints_no_traceback() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "tilec_cli.py"), "nki-run", str(KERNELS / "asst.py"),
                           "--kernel", "vector_add_tiled_256", "--shape", "a_vec=1024", "--shape", "b_vec=1024"],
                          capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "number of partitions 256 exceed architecture limitation of 128" in proc.stderr


def test_nki_run_unknown_kernel(capsys) -> None:
    rc = tilec_cli.main(["nki-run", str(KERNELS / "asst.py"), "--kernel", "nope", "--shape", "a=4"])
    assert rc == 1
    assert "asst.py has no kernel named 'nope'" in capsys.readouterr().err


def test_plain_script_via_python_m_tilec_nki(tmp_path) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        "import numpy as np\n"
        "import neuronxcc.nki as nki\n"
        "import neuronxcc.nki.language as nl\n"
        "@nki.jit\n"
        "def double(a):\n"
        "    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)\n"
        "    nl.store(out, nl.multiply(nl.load(a), 2.0))\n"
        "    return out\n"
        "print(nki.simulate_kernel(double, np.ones((4, 3), np.float32)).sum())\n")
    proc = subprocess.run([sys.executable, "-m", "tilec.nki", str(script)], capture_output=True, text=True,
                          env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "24.0"


def test_nki_run_kernel_assertion_is_reported_at_its_line(tmp_path, capsys) -> None:
    path = tmp_path / "k.py"
    path.write_text("import neuronxcc.nki as nki\n\n\n@nki.jit\ndef k(a):\n"
                    "    assert a.shape[0] == 64, 'expects 64 rows'\n    return a\n")
    rc = tilec_cli.main(["nki-run", str(path), "--kernel", "k", "--shape", "a=128x4"])
    assert rc == 1
    assert capsys.readouterr().err.strip() == (f"{path.resolve()}:6: error: the kernel raised "
                                               "AssertionError: expects 64 rows [kernel_exception]")


def test_nki_run_saves_arguments_the_kernel_writes(tmp_path, capsys) -> None:
    """The tutorial matmul returns nothing and writes its `result` parameter: --out must hold that array."""
    rng = np.random.default_rng(2)
    lhsT, rhs = rng.random((256, 128), dtype=np.float32), rng.random((256, 512), dtype=np.float32)
    np.savez(tmp_path / "in.npz", lhsT=lhsT, rhs=rhs, result=np.zeros((128, 512), np.float32))
    rc = tilec_cli.main(["nki-run", str(KERNELS / "asst.py"), "--kernel", "nki_matmul_tiled_",
                         "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "out.npz")])
    assert rc == 0
    assert "argument result (written by the kernel): shape (128, 512) float32" in capsys.readouterr().out
    with np.load(tmp_path / "out.npz") as out:
        assert out.files == ["result"]
        np.testing.assert_allclose(out["result"], lhsT.astype(np.float64).T @ rhs, rtol=1e-5)


ASST = str(KERNELS / "asst.py")
ADD = ["--kernel", "vector_add_tiled"]


def _mistakes(tmp_path) -> dict[str, tuple[list[str], str]]:
    (tmp_path / "garbage.npz").write_text("not an archive")
    (tmp_path / "syntax.py").write_text("import neuronxcc.nki as nki\n\ndef k(:\n")
    (tmp_path / "imports.py").write_text("import no_such_module_here\n")
    (tmp_path / "prog.tl").write_text("kernel k(A: f32[N]) -> Z\n")
    ok = ["--shape", "a_vec=256", "--shape", "b_vec=256"]
    np.savez(tmp_path / "complex.npz", a_vec=np.ones(256, np.complex64), b_vec=np.ones(256, np.float32))
    return {
        "npz_not_an_archive": ([ASST, *ADD, "--inputs", str(tmp_path / "garbage.npz")],
                               "error: cannot read inputs from"),
        "npz_missing": ([ASST, *ADD, "--inputs", str(tmp_path / "none.npz")], "error: no such file:"),
        "unknown_dtype": ([ASST, *ADD, "--shape", "a_vec=256:float17", "--shape", "b_vec=256"],
                          "unknown dtype 'float17'"),
        "bad_dims": ([ASST, *ADD, "--shape", "a_vec=25x", "--shape", "b_vec=256"], "bad shape '25x'"),
        "negative_dims": ([ASST, *ADD, "--shape", "a_vec=-3", "--shape", "b_vec=256"], "bad shape '-3'"),
        "unknown_parameter": ([ASST, *ADD, *ok, "--shape", "c=5"], "kernel vector_add_tiled has no parameter(s) c"),
        "missing_parameter": ([ASST, *ADD, "--shape", "a_vec=256"], "no input given for kernel parameter(s) b_vec"),
        "bad_arg": ([ASST, *ADD, *ok, "--arg", "x=abc"], "bad --arg 'x=abc'"),
        "out_dir_missing": ([ASST, *ADD, *ok, "--out", str(tmp_path / "no" / "o.npz")], "cannot write"),
        "tl_file": ([str(tmp_path / "prog.tl"), "--kernel", "k"], "prog.tl is not a Python file"),
        "syntax_error": ([str(tmp_path / "syntax.py"), "--kernel", "k"],
                         f"{tmp_path / 'syntax.py'}:3: error: syntax error in the kernel file"),
        "import_error": ([str(tmp_path / "imports.py"), "--kernel", "k"],
                         "importing the kernel file raised ModuleNotFoundError"),
        "complex_input": ([ASST, *ADD, "--inputs", str(tmp_path / "complex.npz")],
                          "kernel argument 'a_vec' has dtype complex64, which NKI does not support [argument_dtype]"),
    }


MISTAKES = ["npz_not_an_archive", "npz_missing", "unknown_dtype", "bad_dims", "negative_dims", "unknown_parameter",
            "missing_parameter", "bad_arg", "out_dir_missing", "tl_file", "syntax_error", "import_error",
            "complex_input"]


@pytest.mark.parametrize("name", MISTAKES)
def test_nki_run_user_mistakes_are_errors_not_tracebacks(name, tmp_path, capsys) -> None:
    argv, message = _mistakes(tmp_path)[name]
    assert tilec_cli.main(["nki-run", *argv]) == 1  # an unexpected exception would escape main and fail here
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_python_m_tilec_nki_missing_script(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "tilec.nki", str(tmp_path / "none.py")], capture_output=True,
                          text=True, env=ENV, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "can't open file" in proc.stderr


def test_shape_specs_take_the_language_dtype_spellings() -> None:
    """A user of .tl programs writes bf16; `--shape X=8x64:bf16` names the same dtype as `:bfloat16`."""
    from tilec.nki.api import parse_shape_spec
    assert parse_shape_spec("X=8x64:bf16") == ("X", ((8, 64), "bfloat16"))
    assert parse_shape_spec("w=3:f16") == ("w", ((3,), "float16"))
    assert parse_shape_spec("v=5:f32") == parse_shape_spec("v=5")
