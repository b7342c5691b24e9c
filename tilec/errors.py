"""User-facing errors: a TilecError carries a source span and renders as file:line:col, the line, a caret, a hint.

A user's mistake is always a TilecError (never a bare traceback); a compiler bug is an InternalError raised by an
IR verifier. The CLI prints TilecError.render() and exits 1.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """A half-open region of a source file; lines and columns count from 1."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int
    source: str = ""  # whole text of the file, so errors can quote the line

    def __repr__(self) -> str:  # keep printed IR and goldens short
        return f"{self.file}:{self.line}:{self.col}"

    def line_text(self) -> str:
        # lines as the lexer counts them: only \n ends a line (splitlines() also splits at \f, U+2028, ...)
        lines = [line.rstrip("\r") for line in self.source.split("\n")]
        return lines[self.line - 1] if 0 < self.line <= len(lines) else ""


class TilecError(Exception):
    """A mistake in the user's program, schedule or inputs."""

    def __init__(self, message: str, span: Span | None = None, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.span = span
        self.hint = hint

    def render(self) -> str:
        if self.span is None:
            head = f"error: {self.message}"
            return head + (f"\n  hint: {self.hint}" if self.hint else "")
        s = self.span
        out = [f"{s.file}:{s.line}:{s.col}: error: {self.message}"]
        text = s.line_text()
        if text:
            width = max(1, (s.end_col - s.col) if s.end_line == s.line else len(text) - s.col + 1)
            out.append(f"  {text}")
            out.append("  " + " " * (s.col - 1) + "^" * width)
        if self.hint:
            out.append(f"  hint: {self.hint}")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.render()


class InternalError(Exception):
    """A compiler bug: an IR invariant was broken by a pass. Never the user's fault."""


class KernelError(Exception):
    """An NKI kernel broke a hardware or API rule while running on tilec's interpreter.

    The interpreter's specific errors subclass this (and, where NKI raises SyntaxError/ValueError/IndexError, that
    class too); the message names the rule, the tile, the shape and the kernel's file:line. The CLI prints it
    without a traceback.
    """
