"""Progress on a terminal for work over ~2 s (quiet on pipes), and Ctrl-C: exit 130, one line, nothing half-written."""
from __future__ import annotations

import io
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tilec import progress

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_the_stage_and_instruction_count_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    import tilec

    monkeypatch.delenv("TILEC_PROGRESS", raising=False)
    screen = Terminal()
    compiled = tilec.compile_file(ROOT / "examples" / "conv2d.tl", {"N": 1, "C": 128, "K": 128, "H": 34, "W": 34})
    x = np.zeros((1, 128, 34, 34), np.float32)
    w = np.zeros((128, 128, 3, 3), np.float32)
    with progress.stage("running conv2d", stream=screen, delay=0.0):
        started = time.monotonic()
        # long enough for a few redraws, and on a loaded machine (CI's workers) until the drawing thread got its
        # turn: the drawing thread starts with tqdm's import while this thread holds the interpreter
        while time.monotonic() - started < 0.6 or \
                " instr [" not in screen.getvalue() and time.monotonic() - started < 60:
            compiled.run_traced(x, w, numerics=False)
    text = screen.getvalue()
    assert "running conv2d: " in text and " instr [" in text


def test_progress_is_quiet_on_a_pipe_and_when_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TILEC_PROGRESS", raising=False)
    pipe = io.StringIO()
    with progress.stage("work", stream=pipe, delay=0.0):
        time.sleep(0.3)
    assert pipe.getvalue() == ""
    screen = Terminal()
    progress.configure(False)  # --quiet
    try:
        with progress.stage("work", stream=screen, delay=0.0):
            time.sleep(0.3)
    finally:
        progress.configure(None)
    assert screen.getvalue() == ""
    monkeypatch.setenv("TILEC_PROGRESS", "0")
    assert not progress.wanted(Terminal())
    monkeypatch.setenv("TILEC_PROGRESS", "1")
    assert progress.wanted(io.StringIO())


def test_short_work_shows_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TILEC_PROGRESS", raising=False)
    screen = Terminal()
    with progress.stage("quick", stream=screen):  # the default delay: about 2 s
        time.sleep(0.05)
    assert screen.getvalue() == ""


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_tune_exits_130_with_one_line_and_writes_nothing(tmp_path: pathlib.Path) -> None:
    kernel, schedule = tmp_path / "tuned.py", tmp_path / "tuned.sched"
    cmd = [sys.executable, str(ROOT / "tilec_cli.py"), "tune", str(ROOT / "examples" / "conv_bias_maxpool.tl"),
           "-D", "N=1", "--budget", "200", "--no-cache", "--jobs", "2", "-o", str(kernel), "--save-schedule",
           str(schedule)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # its own process group, so the signal reaches the workers too, as a terminal's Ctrl-C does; and Ctrl-C's
    # default disposition, as a terminal gives it: a test run started in the background (`pytest &`, nohup) ignores
    # SIGINT, and a child inherits that, so tilec would rightly go on
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
                            start_new_session=True, preexec_fn=_default_sigint)
    time.sleep(6)
    assert proc.poll() is None, "tune finished before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert err == "tilec: interrupted\n" and out == ""
    assert not kernel.exists() and not schedule.exists() and not list(tmp_path.glob("*.part"))
