"""Long lines of a generated kernel, wrapped the way a careful person would (PEP 8 continuation lines).

The templates lay out one statement per line; Python decides here, after rendering, where a statement longer than
LINE_MAX breaks:
- a call is broken at the commas between its arguments, continuation lines aligned with the first argument, or,
  when an argument would not fit there, with the arguments on lines of their own indented two levels deeper;
- a comment line is filled at spaces, continuation lines aligned with its text;
- a trailing string literal (the shape checks' messages) becomes two adjacent literals in parentheses.
A statement's `# tl:N` tag stays on its first line: Python reports a call by its first line, and the profile maps a
kernel line to the `.tl` line of the nearest tag at or above it (tilec/perf/report.py). `unwrap` undoes the calls'
wrapping, for tests and tools that read a kernel a statement per line.
"""
from __future__ import annotations

import textwrap
from typing import Iterator

LINE_MAX = 120  # the longest line of a generated kernel
HANG = 8  # extra indent of arguments on lines of their own: two levels, so they do not read as a block


def wrap_text(text: str, width: int = LINE_MAX) -> str:
    """The kernel's code lines wrapped; the module docstring above its `def` is left as written."""
    lines = text.split("\n")
    start = next((n for n, line in enumerate(lines) if line.startswith("def ")), len(lines))
    return "\n".join(lines[:start] + [piece for line in lines[start:] for piece in wrap_line(line, width)])


def wrap_line(line: str, width: int = LINE_MAX) -> list[str]:
    """`line` as one or more lines of at most `width` characters where a rule applies, else unchanged."""
    if len(line) <= width:
        return [line]
    code, comment = _split_comment(line)
    if not code.strip():
        return _fill_comment(line, width)
    call = _outer_call(code)
    if call is not None:
        head, args = call
        return (_pack(head, " " * len(head), args, comment, width)
                or _pack(head, _indent(code) + " " * HANG, args, comment, width, hang=True) or [line])
    return _split_string(code, comment, width) or [line]


def _indent(code: str) -> str:
    return code[:len(code) - len(code.lstrip())]


def _scan(code: str) -> Iterator[tuple[int, str, int]]:
    """(index, character, bracket depth before it) for every character outside string literals."""
    depth, quote, i = 0, "", 0
    while i < len(code):
        ch = code[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        else:
            yield i, ch, depth
            depth += (ch in "([{") - (ch in ")]}")
        i += 1


def _split_comment(line: str) -> tuple[str, str]:
    for i, ch, _ in _scan(line):
        if ch == "#":
            return line[:i].rstrip(), line[i:]
    return line, ""


def _outer_call(code: str) -> tuple[str, list[str]] | None:
    """(text up to and including the `(` of the call that ends the line, its arguments) or None."""
    if not code.endswith(")"):
        return None
    chars = list(_scan(code))
    stack: list[int] = []
    start = None
    for i, ch, _ in chars:
        if ch in "([{":
            stack.append(i)
        elif ch in ")]}" and stack:
            start = stack.pop()  # the last one popped matches the final `)`
    if start is None or stack or start == 0 or not (code[start - 1].isalnum() or code[start - 1] == "_"):
        return None
    depth = next(d for i, _, d in chars if i == start) + 1
    cuts = [i for i, ch, d in chars if ch == "," and d == depth and i > start]
    starts, ends = [start + 1, *[c + 1 for c in cuts]], [*cuts, len(code) - 1]
    return code[:start + 1], [code[a:b].strip() for a, b in zip(starts, ends)]


def _pack(head: str, indent: str, args: list[str], comment: str, width: int, hang: bool = False) -> list[str] | None:
    """The call's arguments filled into lines of at most `width` (the tag after the first), or None."""
    lines: list[str] = []
    current = head if not hang else indent
    if hang:
        lines.append(head)
    for n, arg in enumerate(args):
        piece = arg + ("," if n < len(args) - 1 else ")")
        joined = current + piece if current.endswith("(") or current == indent else current + " " + piece
        room = width - (len(comment) + 2 if comment and not lines else 0)
        if len(joined) <= room:
            current = joined
            continue
        if current == indent or current == head and not hang:
            return None  # this argument does not fit even on a line of its own
        lines.append(current)
        current = indent + piece
        if len(current) > width:
            return None
    lines.append(current)
    if comment:
        lines[0] += "  " + comment
    return lines if all(len(line) <= width for line in lines) else None


def _split_string(code: str, comment: str, width: int) -> list[str] | None:
    """`..., 'a long message'` as `..., ('a long '` / `'message')`, broken after a `; ` or a space, or None."""
    chars = list(_scan(code))
    commas = [i for i, ch, depth in chars if ch == "," and depth == 0]
    if not commas or code[-1] not in "'\"" or code[commas[-1] + 1:].strip()[:1] not in ("'", '"'):
        return None
    head = code[:commas[-1] + 1] + " ("
    literal = code[commas[-1] + 1:].strip()
    quote, body = literal[0], literal[1:-1]
    first_room = width - len(head) - 2 - (len(comment) + 2 if comment else 0)
    clause = body.rfind("; ", 0, first_room - 1)  # break after a clause, else after a word
    cut = clause + 2 if clause >= 0 else body.rfind(" ", 0, first_room) + 1
    if cut <= 0 or len(" " * len(head) + quote + body[cut:] + quote + ")") > width:
        return None
    first = head + quote + body[:cut] + quote + ("  " + comment if comment else "")
    return [first, " " * len(head) + quote + body[cut:] + quote + ")"]


def _fill_comment(line: str, width: int) -> list[str]:
    """A whole-line comment (`# ---- label` of a block) filled at spaces, later lines aligned with its text."""
    head = line[:len(line) - len(line.lstrip("# -"))]
    rest = " " * (len(head) - len(_indent(line)) - 1)
    return textwrap.wrap(line[len(head):], width, initial_indent=head, subsequent_indent=_indent(line) + "#" + rest,
                         break_long_words=False, break_on_hyphens=False) or [line]


def unwrap(text: str) -> str:
    """The kernel with one line per statement again (the tag back at its end): for reading it with a line grep."""
    lines = text.split("\n")
    start = next((n for n, line in enumerate(lines) if line.startswith("def ")), len(lines))
    out, pending, tag = lines[:start], "", ""
    for line in lines[start:]:
        code, comment = _split_comment(line)
        if not pending and not code.strip():
            out.append(line)
            continue
        joined = code if not pending else pending + ("" if pending.endswith("(") else " ") + code.strip()
        tag = tag or comment
        if sum((ch in "([{") - (ch in ")]}") for _, ch, _ in _scan(joined)) > 0:
            pending = joined
            continue
        out.append(joined + ("  " + tag if tag else ""))
        pending, tag = "", ""
    return "\n".join(out + ([pending] if pending else []))
