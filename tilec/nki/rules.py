"""Hardware and API rules of NeuronCore targets: the per-target limits table and the interpreter's error classes.

Every rule violation is a `KernelError` whose message reads

    kernel.py:42: error: <rule, in NKI's wording where the spec gives one> [<NKI error id or tilec rule id>]
      <the tile(s) involved and their shapes/buffers>
      hint: <what to do>

Shape and tile-size violations also subclass SyntaxError, out-of-bounds accesses IndexError, truthiness misuse
ValueError, as NKI raises them (spec §1.11).
"""
from __future__ import annotations

import warnings

from tilec import target as hardware
from tilec.errors import KernelError

# The per-target limits (partitions, SBUF/PSUM, matmul and engine free sizes) and their sources: tilec/target.py.
# Not a rule here: the engines that must not access one memory at the same time (Target.exclusions: NC-v2 VectorE and
# GpSimdE on SBUF, VectorE and ScalarE on PSUM; NC-v3 VectorE and ScalarE on one PSUM bank). ARCH2 says the Neuron
# compiler serialises such instructions itself ("NKI developers are not required to program such serializations"),
# ARCH3 that NC-v3 loses only bandwidth; so a kernel doing it is valid and only the performance model orders them.
Target = hardware.Target
TARGETS = hardware.TARGETS


def target(name: str) -> Target:
    if name not in TARGETS:
        raise KernelError(f"unknown target {name!r}; known targets: {', '.join(TARGETS)}")
    return TARGETS[name]


class NkiError(KernelError):
    """A kernel broke a rule; `rule` is NKI's error id (err_...) or tilec's own rule name."""

    def __init__(self, message: str, rule: str, where: tuple[str, int] | None, detail: str = "", hint: str = ""):
        self.message, self.rule, self.where, self.detail, self.hint = message, rule, where, detail, hint
        super().__init__(self.render())

    def render(self) -> str:
        loc = f"{self.where[0]}:{self.where[1]}: " if self.where else ""
        out = [f"{loc}error: {self.message} [{self.rule}]"]
        if self.detail:
            out.append(f"  {self.detail}")
        if self.hint:
            out.append(f"  hint: {self.hint}")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.render()


class NkiSyntaxError(NkiError, SyntaxError):
    """Tile-shape and tile-size violations: NKI reports these as SyntaxError (spec §1.8)."""


class NkiIndexError(NkiError, IndexError):
    """Out-of-bounds access."""


class NkiValueError(NkiError, ValueError):
    """Truthiness misuse and bad argument values."""


class NkiTypeError(NkiError, TypeError):
    """An argument of the wrong kind (e.g. an HBM tensor where a tile is required)."""


class MemoryRuleError(NkiError):
    """An engine touched a memory it cannot access, or capacity was exceeded."""


class UninitializedReadError(NkiError):
    """A read of memory that no instruction ever wrote (garbage on hardware)."""


class LoopCarriedDependenceError(NkiError):
    """Two iterations of an affine_range loop touch the same element (one of them writing)."""


class ScopeError(NkiError):
    """A tensor used outside the loop body that allocated it."""


# ---- rules graded by the toolchain they come from ----
class NkiPortabilityWarning(UserWarning):
    """A construct the course's toolchain (Neuron SDK 2.21-2.26, NKI 0.1) accepted and ran, which a later release
    forbids; the message names that release. The kernel runs with the result the hardware computed."""


class NkiSimulationOnlyWarning(UserWarning):
    """A construct AWS's NKI 0.1 simulator (`mode="simulation"`, `nki.simulate_kernel`) ran but the compiler for the
    hardware rejects: tilec runs it only in those modes, and says so."""


def later_release(run: object, message: str, rule: str, where: tuple[str, int] | None, release: str,
                  detail: str = "", hint: str = "", error: type = None) -> None:
    """Accepted by SDK 2.21-2.26 (the result is computed as the hardware did), forbidden by `release`: a warning,
    once per kernel line and rule; an error in a run under a later API (`run.strict`, set by the NKI 0.6 API)."""
    text = f"{message}; {release}"
    if getattr(run, "strict", False):
        raise (error or NkiError)(text, rule, where, detail, hint)
    key, warned = (where, rule), run.warned
    if key in warned:
        return
    warned.add(key)
    loc = f"{where[0]}:{where[1]}: " if where else ""
    lines = [f"{loc}warning: {text} [{rule}]"] + ([f"  {detail}"] if detail else []) + \
        ([f"  hint: {hint}"] if hint else [])
    warnings.warn_explicit("\n".join(lines), NkiPortabilityWarning, where[0] if where else "<kernel>",
                           where[1] if where else 0)
