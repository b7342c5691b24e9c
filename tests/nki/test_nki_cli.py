"""`tilec nki-run` on kernel files, `python -m tilec.nki`, and the import shim for plain scripts."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

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
    assert capsys.readouterr().err.strip() == (f"kernel error: {path.resolve()}:6: error: the kernel raised "
                                               "AssertionError: expects 64 rows [kernel_exception]")
