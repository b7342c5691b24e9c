"""The TensorE warm-up throttle of Trainium2 (nki-spec §2.3 "Throttling (Trn2)", sources EXSUM, EXGLOSS): "after
work begins the TensorE runs at about 50 % utilization and ramps to full over about 3 µs. If utilization drops below
50 % in any ~3 µs window, the limit re-engages (dI/dt protection)."

The rule as modelled, in terms of utilization over windows like the spec states it (params.py: f0 =
throttle_start_fraction 0.5, R = throttle_ramp_ns 3000, W = throttle_window_ns 3000, u = throttle_min_utilization
0.5):

* The limit engages when TensorE work begins (the kernel's first TensorE instruction, at its start r). For the next
  R ns the engine may use at most f0 of that time: an instruction may start while the engine's busy time since r is
  below f0 * R; one that would start later waits until r + R. From r + R on it runs at full speed. A long
  back-to-back stream of instructions of c ns each thus starts k = ceil(f0 * R / c) of them at once and then waits
  R - k * c (about R / 2 = 1.5 µs once, not per instruction).
* The limit re-engages when utilization drops: before an instruction starts at t, the engine's idle time within the
  trailing window [max(t - W, r), t] is measured, and if it exceeds (1 - u) * W (utilization over a W window below
  u) a new engagement starts at t. Time held by the limit itself counts as busy (it does not re-trigger the limit),
  and so does time before r (a window that began before the engagement is not "idle" because nothing ran then).
* f0 >= 1 or R <= 0 turns the limit off (trn1: no throttle is documented for NC-v2).

Inferred, not documented: the shape of the ramp. The spec gives its start (~50 % utilization), its length (~3 µs)
and that utilization is watched over ~3 µs windows; the model holds utilization to f0 over the first window and then
lifts the limit (a step, not a linear ramp), checked at instruction boundaries (an instruction that has started
runs at full speed). A limit that slowed every instruction from the first one (a speed ramp) would make a burst of
two matmuls cost twice its steady-state time, which the auto-tuner's lower bound (tilec/tune/bound.py: the model's
marginal cost of a second matmul times the matmul count) relies on not happening; with this rule the first
f0 * R ns of work of any burst run at full speed (a single matmul is at most ~1.05 µs), so that bound stays below
the model. Only TensorE instructions (matmuls, transposes) are throttled.
"""
from __future__ import annotations

from collections import deque

EPS = 1e-6


class TensorThrottle:
    """Limit state of one TensorE, fed its instructions in start-time order (the engine runs them in order)."""

    def __init__(self, start_fraction: float, ramp_ns: float, window_ns: float, min_utilization: float) -> None:
        self.ramp = ramp_ns
        self.allowance = start_fraction * ramp_ns  # busy time allowed during an engagement
        self.window = window_ns
        self.max_idle = (1.0 - min_utilization) * window_ns
        self.off = start_fraction >= 1.0 or ramp_ns <= 0.0
        self.engaged: float | None = None  # start of the current engagement; None: engages with the next work
        self.used = 0.0  # busy time since the engagement began
        self.busy: deque[list[float]] = deque()  # busy (or held) intervals [start, end] within the trailing window
        self.busy_total = 0.0

    def start(self, t: float, d: float) -> float:
        """Start time of an instruction of `d` ns that is ready at `t`; records it (and any hold) as busy."""
        if self.off:
            return t
        if self.engaged is None or self._idle(t) > self.max_idle + EPS:
            self.engaged, self.used = t, 0.0
            self.busy.clear()
            self.busy_total = 0.0
        r = self.engaged
        start = t
        if t < r + self.ramp and self.used >= self.allowance - EPS:
            start = r + self.ramp  # held by the limit until the engagement's window is over
        if start < r + self.ramp:
            self.used += d
        self._record(t, start + d)  # the hold counts as busy: the engine has work, the limit withholds it
        return start

    def _idle(self, t: float) -> float:
        """Idle time of the engine within [max(t - W, engagement start), t]."""
        w0 = max(t - self.window, self.engaged)
        busy = self.busy
        while busy and busy[0][1] <= w0:
            s, e = busy.popleft()
            self.busy_total -= e - s
        inside = self.busy_total
        if busy and busy[0][0] < w0:  # the oldest interval straddles the window's start
            inside -= w0 - busy[0][0]
        return max(0.0, (t - w0) - inside)

    def _record(self, s: float, e: float) -> None:
        busy = self.busy
        if busy and s <= busy[-1][1] + EPS:  # back to back: extend the last interval (keeps the deque short)
            if e > busy[-1][1]:
                self.busy_total += e - busy[-1][1]
                busy[-1][1] = e
        else:
            busy.append([s, e])
            self.busy_total += e - s
