"""Progress for long commands: after DELAY_S seconds of work a tqdm status line appears on stderr (the stage, the
instructions the interpreter has executed so far, the elapsed time) and is erased when the work ends. Nothing is
drawn when stderr is not a terminal (logs and pipes stay clean), with --quiet, or with TILEC_PROGRESS=0.

    with progress.stage("running on the interpreter"):
        outputs = compiled.run(**inputs)
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import IO, Iterator

DELAY_S = 2.0  # shorter runs show nothing
REFRESH_S = 0.25

_enabled: bool | None = None  # None: decide from the stream (a terminal) and TILEC_PROGRESS


def configure(enabled: bool | None) -> None:
    """Force progress on or off for this process (the CLI's --quiet); None restores the automatic choice."""
    global _enabled
    _enabled = enabled


def wanted(stream: IO[str]) -> bool:
    if _enabled is not None:
        return _enabled
    env = os.environ.get("TILEC_PROGRESS")
    if env is not None:
        return env not in ("0", "", "no", "off")
    return bool(getattr(stream, "isatty", lambda: False)())


def _instructions_so_far() -> int | None:
    """Instructions the interpreter has executed in the kernel running now (None when no kernel runs)."""
    from tilec.nki import runtime

    run = runtime.active()
    trace = getattr(run, "trace", None)
    return len(trace.instrs) if trace is not None else None


@contextlib.contextmanager
def stage(label: str, stream: IO[str] | None = None, delay: float = DELAY_S) -> Iterator[None]:
    """Show `label` with a live instruction count while the block runs longer than `delay` seconds."""
    stream = stream or sys.stderr
    if not wanted(stream):
        yield
        return
    done = threading.Event()
    worker = threading.Thread(target=_draw, args=(label, stream, delay, done, time.time()), daemon=True)
    worker.start()
    try:
        yield
    finally:
        done.set()
        worker.join()


def _draw(label: str, stream: IO[str], delay: float, done: threading.Event, started: float) -> None:
    if done.wait(delay):
        return
    from tqdm import tqdm

    bar = tqdm(desc=label, unit=" instr", file=stream, leave=False, dynamic_ncols=True, mininterval=REFRESH_S,
               bar_format="{desc}: {n_fmt}{unit} [{elapsed}, {rate_fmt}]")
    bar.start_t = started  # the elapsed time counts from the start of the work, not from when the line appears
    try:
        while not done.wait(REFRESH_S):
            n = _instructions_so_far()
            if n is not None and n >= bar.n:
                bar.update(n - bar.n)
            else:
                bar.refresh()
    finally:
        bar.close()
