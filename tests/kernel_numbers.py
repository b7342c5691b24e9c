"""A generated kernel with its named trip counts and allocation shapes printed as numbers again, for tests that state
their expectations about a kernel's text in numbers (`(64, 2, 13)`, `range(2)`).

Kernels print `nl.affine_range(SIZE_K // TILE_K)` and `nl.ndarray((TILE_K, SIZE_M), ...)` (tilec/compiler/named.py);
`numbered` evaluates each such expression with Python over the module's own constants (`TILE_K = 128` lines of the
kernel's text, not the compiler's records), drops the constants nothing reads any more, and lays the lines out again
(tilec's line wrapper: formatting only)."""
from __future__ import annotations

import ast
import re

from tilec.compiler.wrap import unwrap, wrap_line

_NESTED = r"[^()]*(?:\([^()]*\)[^()]*)*"  # a text with parenthesised groups one level deep
_RANGE = re.compile(rf"(\b(?:affine_range|sequential_range|static_range|range)\()({_NESTED})(\))")
_SHAPE = re.compile(rf"((?:nl\.ndarray|nl\.zeros|\.reshape)\(\()({_NESTED})(\))")
_CONST = re.compile(r"^([^\W\d]\w*) = (\d+)$", re.M)


def numbered(source: str) -> str:
    consts = {name: int(value) for name, value in _CONST.findall(source)}
    lines = source.split("\n")
    start = next((n for n, line in enumerate(lines) if line.startswith("def ")), len(lines))
    out, group = lines[:start], []
    for line in lines[start:]:  # statement by statement: a statement it changes is wrapped again, the rest kept
        group.append(line)
        if _open("\n".join(group)):
            continue
        stmt = unwrap("def _():\n" + "\n".join(group)).split("\n", 1)[1]
        new = _SHAPE.sub(lambda m: m[1] + _dims(m[2], consts) + m[3],
                         _RANGE.sub(lambda m: m[1] + _value(m[2], consts) + m[3], stmt))
        out += group if new == stmt else wrap_line(new)
        group = []
    text = "\n".join(out + group)
    code = text[text.index("\ndef "):] if "\ndef " in text else text
    for name in consts:  # constants no statement reads now
        if not re.search(rf"\b{name}\b", code):
            text = re.sub(rf"^{name} = \d+\n", "", text, flags=re.M)
    return re.sub(r"\n\n\n\n+", "\n\n\n", text)


def _open(text: str) -> bool:
    """Whether a statement's brackets are still open (it continues on the next line); comments left out."""
    code = "\n".join(line.split("  #")[0] for line in text.split("\n"))
    return sum(code.count(c) for c in "([{") > sum(code.count(c) for c in ")]}")


def _dims(text: str, consts: dict[str, int]) -> str:
    dims = _top_level_split(text)
    if dims and dims[-1] == "":  # a one-dimensional shape `(n,)`
        return _value(dims[0], consts) + ","
    return ", ".join(_value(d, consts) for d in dims)


def _top_level_split(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts + [cur.strip()]


def _value(expr: str, consts: dict[str, int]) -> str:
    """The number a size expression of names and integers (+ - * //) stands for; anything else as it is."""
    try:
        tree = ast.parse(expr.strip(), mode="eval").body
    except SyntaxError:
        return expr
    if not all(isinstance(n, (ast.BinOp, ast.Name, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Load))
               for n in ast.walk(tree)) or any(isinstance(n, ast.Name) and n.id not in consts for n in ast.walk(tree)):
        return expr
    return str(eval(compile(ast.Expression(tree), "<size>", "eval"), {"__builtins__": {}}, dict(consts)))
