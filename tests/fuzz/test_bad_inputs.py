"""Items of the bad-input catalogue (shared/fuzz-findings/README.md): each is a clean TilecError through `tilec
run`, located in the program where the program is at fault, never a traceback."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEAD = "kernel k(A: f32[N]) -> Y\n  default N = {n}\n  Y: f32[N]\n"


def run(tmp_path, text: str, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "p.tl"
    path.write_text(text)
    return subprocess.run([sys.executable, str(ROOT / "tilec_cli.py"), "run", str(path), *args], capture_output=True,
                          text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("text, where, quoted", [
    (HEAD.format(n=10**23) + "  for i in 0..N:\n    Y[i] = A[i] * 2.0\n", ":1:10:", "kernel k(A: f32[N]) -> Y"),
    (HEAD.format(n=16) + "  for i in 0..N:\n    Y[i] = A[i] / 0\n", ":5:19:", "Y[i] = A[i] / 0"),
    (HEAD.format(n=16) + "  # a\fcomment\u2028here\n  for i in 0..N:\n    Y[i] = B[i]\n", ":6:12:", "Y[i] = B[i]"),
], ids=["size-1e23", "divide-by-0", "form-feed-in-comment"])
def test_program_error_is_located_with_its_own_line(tmp_path, text, where, quoted):
    result = run(tmp_path, text)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    first = result.stderr.splitlines()[0]
    assert where in first and "error:" in first, result.stderr
    assert result.stderr.splitlines()[1].strip() == quoted, result.stderr


def test_negative_seed_is_a_clean_error(tmp_path):
    result = run(tmp_path, (ROOT / "examples" / "vector_add.tl").read_text(), "--seed", "-1")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "non-negative integer" in result.stderr
