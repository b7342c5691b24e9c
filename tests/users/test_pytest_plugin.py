"""The pytest plugin: a user's test module importing `neuronxcc.nki` first finds tilec's interpreter.

Run as subprocesses (a pytest inside pytest): once with the plugin as pytest loads it from tilec's `pytest11` entry
point (here by `-p tilec.pytest_plugin`, since tests run from the source tree; .ci/run checks the installed entry
point), once without it, to show the import fails there."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
USER_TEST = '''import numpy as np
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def add(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out


def test_add(nki_simulate, nki_profile):
    a, b = np.ones((128, 64), np.float32), np.full((128, 64), 2, np.float32)
    assert np.array_equal(nki_simulate(add, a, b), a + b)
    assert np.array_equal(nki.simulate_kernel(add, a, b), a + b)
    assert nki_profile(add, a, b).total_us > 0
'''


def _pytest(tmp_path: pathlib.Path, *options: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_user_kernel.py").write_text(USER_TEST)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options,
                           "test_user_kernel.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_user_tests_import_nki_kernels_with_the_plugin(tmp_path: pathlib.Path) -> None:
    done = _pytest(tmp_path, "-p", "tilec.pytest_plugin")
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr


def test_without_the_plugin_the_import_fails(tmp_path: pathlib.Path) -> None:
    done = _pytest(tmp_path)
    assert done.returncode != 0 and "No module named 'neuronxcc'" in done.stdout


def test_the_plugin_is_a_pytest11_entry_point() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert '[project.entry-points.pytest11]\ntilec = "tilec.pytest_plugin"\n' in text
