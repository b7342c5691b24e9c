"""The tuning progress bar on stderr: trials done, best latency so far, the default's latency.

On a terminal a tqdm bar is redrawn in place; written to a file or pipe (a log), a line is added only when the best
latency improves and at the end, so the log stays readable."""
from __future__ import annotations

import math
from typing import IO

from tilec.tune.search import Trial

WIDTH = 24


class Progress:
    """`update(trial, best)` redraws one line; `close()` ends it. A None stream makes it silent."""

    def __init__(self, total: int | None, stream: IO[str] | None) -> None:
        self.total, self.stream = total, stream
        self.done = self.failed = self.pruned = 0
        self.default_us = math.inf
        self.in_place = bool(getattr(stream, "isatty", lambda: False)())
        self.best_us = math.inf
        self.bar = None
        if stream is not None and self.in_place:
            from tqdm import tqdm

            self.bar = tqdm(total=total, file=stream, ascii=".#", mininterval=0, dynamic_ncols=False,
                            bar_format=self.bar_format(None))

    def update(self, trial: Trial, best: Trial | None) -> None:
        self.done += 1
        pruned = trial.error.startswith("pruned")  # see api.PRUNED: not a failure, just not worth running
        self.pruned += pruned
        self.failed += 0 if math.isfinite(trial.cost) or pruned else 1
        if trial.origin == "default":
            self.default_us = trial.cost
        if self.stream is None:
            return
        if self.bar is not None:
            self.bar.bar_format = self.bar_format(best)
            self.bar.update(1)
        elif (best is not None and best.cost < self.best_us) or self.done == self.total:
            self.stream.write(self.line(best) + "\n")
            self.stream.flush()
        self.best_us = best.cost if best is not None else self.best_us

    def bar_format(self, best: Trial | None) -> str:
        """tqdm's template for the line: the same words as the log lines (the status holds no braces)."""
        head = f"tune [{{bar:{WIDTH}}}] {{n_fmt}}/{{total_fmt}}" if self.total else "tune {n_fmt} tried"
        return f"{head}  {self.status(best)}"

    def status(self, best: Trial | None) -> str:
        best_text = f"best {best.cost:.1f} us" if best else "best -"
        default_text = f"default {self.default_us:.1f} us" if math.isfinite(self.default_us) else "default -"
        return f"{best_text}  ({default_text}, {self.failed} failed, {self.pruned} pruned)"

    def line(self, best: Trial | None) -> str:
        if self.total:
            filled = min(WIDTH, WIDTH * self.done // self.total)
            head = f"tune [{'#' * filled}{'.' * (WIDTH - filled)}] {self.done}/{self.total}"
        else:
            head = f"tune {self.done} tried"
        return f"{head}  {self.status(best)}"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
