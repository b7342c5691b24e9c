"""Canonical formatting of .tl programs (`tilec fmt`).

The canonical form: two-space indentation; in the kernel body `default`, `assume` and `let` each on one line (in
that order), then declarations, then statements; a loop whose body is one loop is written as one
`for a in .., b in ..:` line; operators spaced (`a + b`, `Ho / 2`) except `*` between two plain operands (`2*i`);
minimal parentheses; no blank lines. Comments stay attached to the code they precede or end.

`format_source(fmt(x)) == fmt(x)`, and parsing the output gives a tree equal to the input's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tilec.lang import syntax as s
from tilec.lang.parser import parse

INDENT = "  "
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "%": 2}


# ---- expressions ----------------------------------------------------------------------------------------------------


def _prec(e: s.Expr) -> int:
    if isinstance(e, s.Access) and e.fill is not None:
        return 0  # a padded read is a whole expression: an operand of an operator is parenthesised
    if isinstance(e, s.BinOp):
        return _PREC[e.op]
    if isinstance(e, s.Neg) or (isinstance(e, s.Num) and e.value < 0):
        return 3
    return 4


def expr(e: s.Expr) -> str:
    if isinstance(e, s.Num):
        return _num(e.value)
    if isinstance(e, s.Name):
        return e.id
    if isinstance(e, s.Neg):
        inner = expr(e.x)
        return f"-({inner})" if _prec(e.x) <= 3 else f"-{inner}"
    if isinstance(e, s.BinOp):
        return _binop(e)
    if isinstance(e, s.Call):
        return f"{e.fn}({', '.join(expr(a) for a in e.args)})"
    read = f"{e.tensor}[{', '.join(expr(i) for i in e.indices)}]"
    return read if e.fill is None else f"{read} ?? {_num(e.fill)}"


def _num(value: int | float) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def _binop(e: s.BinOp) -> str:
    p = _PREC[e.op]
    lhs = expr(e.lhs) if _prec(e.lhs) >= p else f"({expr(e.lhs)})"
    rhs = expr(e.rhs) if _prec(e.rhs) > p else f"({expr(e.rhs)})"
    if e.op == "*" and _plain(e.lhs) and _plain(e.rhs):
        return f"{lhs}*{rhs}"
    return f"{lhs} {e.op} {rhs}"


def _plain(e: s.Expr) -> bool:
    return isinstance(e, s.Name) or (isinstance(e, s.Num) and e.value >= 0)


def tensor_type(t: s.TensorType) -> str:
    return f"{t.dtype}[{', '.join(expr(d) for d in t.shape)}]"


def directive(d: s.Directive) -> str:
    args = ", ".join(_arg(a) for a in d.args)
    return f"{d.name} {args}" if args else d.name


def _arg(a: s.Ref | int | s.KeyArg) -> str:
    if isinstance(a, s.KeyArg):
        return f"{a.key}={_arg(a.value)}"
    if isinstance(a, s.Ref):
        return ".".join(a.parts)
    return str(a)


# ---- lines ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One output line: its depth, its text, and the source lines of the nodes it prints (to place comments)."""

    depth: int
    text: str
    keys: tuple[int, ...]


def _key(*nodes) -> tuple[int, ...]:
    return tuple(n.span.line for n in nodes if n.span.line > 0)


def kernel_lines(k: s.Kernel) -> list[Line]:
    params = ", ".join(f"{p.name}: {tensor_type(p.type)}" for p in k.params)
    out = [Line(0, f"kernel {k.name}({params}) -> {', '.join(k.outputs)}", _key(k) + _key(*k.params))]
    for word, items in (("default", k.defaults), ("assume", k.assumes), ("let", k.lets)):
        if items:
            out.append(Line(1, f"{word} {', '.join(_item(i) for i in items)}", _key(*items)))
    out += [Line(1, f"{d.name}: {tensor_type(d.type)}", _key(d)) for d in k.decls]
    for st in k.body:
        out += stmt_lines(st, 1)
    if k.schedule:
        out.append(Line(1, "schedule:", ()))
        out += [Line(2, directive(d), _key(d)) for d in k.schedule]
    return out


def _item(i: s.Let | s.Assume) -> str:
    if isinstance(i, s.Assume):
        return f"{expr(i.cond.lhs)} {i.cond.op} {expr(i.cond.rhs)}"
    return f"{i.name} = {expr(i.value)}"


def stmt_lines(st: s.Stmt, depth: int) -> list[Line]:
    if isinstance(st, s.Assign):
        return [Line(depth, f"{expr(st.target)} {st.op} {expr(st.value)}", _key(st))]
    ranges, loops = [], [st]
    while len(loops[-1].body) == 1 and isinstance(loops[-1].body[0], s.Loop):
        loops.append(loops[-1].body[0])
    ranges = ", ".join(f"{lp.var} in {expr(lp.start)}..{expr(lp.stop)}" for lp in loops)
    out = [Line(depth, f"for {ranges}:", _key(*loops))]
    for child in loops[-1].body:
        out += stmt_lines(child, depth + 1)
    return out


# ---- comments -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comment:
    line: int
    text: str
    own_line: bool  # alone on its line (else it ends a line of code)
    depth: int


def comments_of(source: str) -> list[Comment]:
    """`#` starts a comment anywhere (the language has no strings)."""
    out = []
    for number, line in enumerate(source.splitlines(), start=1):
        at = line.find("#")
        if at >= 0:
            own = not line[:at].strip()
            out.append(Comment(number, line[at:].rstrip(), own, 1 if own and at > 0 else 0))
    return out


def place_comments(lines: list[Line], comments: list[Comment]) -> list[str]:
    """Render lines, putting each own-line comment above the code that follows it in the source and each
    end-of-line comment after the line printing that code."""
    starts = sorted({k for ln in lines for k in ln.keys})
    before: dict[int, list[Comment]] = {}
    after: dict[int, list[Comment]] = {}
    tail: list[Comment] = []
    for c in comments:
        target = c.line if not c.own_line else next((k for k in starts if k > c.line), None)
        if target is None or (not c.own_line and target not in starts):
            tail.append(c)
        else:
            (before if c.own_line else after).setdefault(target, []).append(c)
    out: list[str] = []
    for ln in lines:
        pad = INDENT * ln.depth
        out += [pad + c.text for k in ln.keys for c in before.pop(k, [])]
        trailing = [c.text for k in ln.keys for c in after.pop(k, [])]
        out.append(pad + ln.text + "".join("  " + t for t in trailing))
    out += [INDENT * c.depth + c.text for c in tail]
    return out


# ---- entry points ---------------------------------------------------------------------------------------------------


def format_kernel(k: s.Kernel) -> str:
    """A tree without its source: the kernel's leading comments, then the canonical text."""
    lines = list(k.comments) + [INDENT * ln.depth + ln.text for ln in kernel_lines(k)]
    return "\n".join(lines) + "\n"


def format_source(text: str, filename: str = "<string>") -> str:
    """Canonical text of a program, keeping its comments."""
    kernel = parse(text, filename)
    source = text if text.endswith("\n") else text + "\n"
    return "\n".join(place_comments(kernel_lines(kernel), comments_of(source))) + "\n"


def format_schedule(directives: tuple[s.Directive, ...]) -> str:
    return "".join(directive(d) + "\n" for d in directives)
