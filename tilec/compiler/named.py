"""Named sizes: an int that remembers the constant expression it was computed from (issue 10, readable kernels).

A builder that reads a tile size as `name(plan.tile_k, "TILE_K")` and a program whose sizes are `Named(1024,
"SIZE_K")` compute `K // TILE_K` tiles as `Named(8, "SIZE_K // TILE_K")`; codegen prints a loop's trip count or an
allocation's dimension by its text (`text_of`), so `nl.affine_range(SIZE_K // TILE_K)` reads as intended. The
value is an ordinary int everywhere else: equality, hashing, `str`, `repr` and formatting are the number's, so a
record holding one compares, hashes and prints as before (same input, same output bytes), and the performance
model sees the same numbers. The verifier re-evaluates each text over the kernel's declared constants
(`evaluate`): a text that names an undeclared constant or evaluates to another number is a compiler bug.

Only `+ - * //` between sizes keep a name, and only a short one (MAX_OPS operators, MAX_CHARS characters, never
negative); anything else (`%`, `/`, unary minus, a longer expression) is a plain int: the kernel then prints the
number, which is a readability loss, never a wrong value.
"""
from __future__ import annotations

import ast
import dataclasses
import re
from typing import Any, Callable, Iterator, Mapping

MAX_OPS = 3  # operators in one name: `SIZE_H // TILE_ROWS * 2` still reads, longer chains print the number
MAX_CHARS = 40
_PREC = {"+": 1, "-": 1, "*": 2, "//": 2}  # binding strength; an atom (a name or a literal) is 3
_IDENT = r"(?<!\w)[^\W\d]\w*"  # an identifier, Unicode ones too (`名前_TILE_C`: one name, not `_TILE_C`)
_NODES = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//"}


class Named(int):
    """An int with `text`, the expression over named constants it equals. `prec`: how tightly the text binds (3 an
    atom, 2 a product or quotient, 1 a sum), `ops`: its operator count; both decide parentheses and length."""
    text: str
    prec: int
    ops: int
    parts: tuple  # (left, operator, right) of a computed name (not pickled: only cancellation reads it)

    def __new__(cls, value: int, text: str, prec: int = 3, ops: int = 0) -> "Named":
        obj = super().__new__(cls, value)
        obj.text, obj.prec, obj.ops = text, prec, ops
        return obj

    def __getnewargs__(self) -> tuple[int, str, int, int]:  # type: ignore[override]  # pickle, deepcopy: the text too
        return int(self), self.text, self.prec, self.ops

    def __add__(self, other: Any) -> Any:
        return _combine(self, "+", other, int.__add__(self, other)) if isinstance(other, int) else NotImplemented

    def __radd__(self, other: Any) -> Any:
        return _combine(other, "+", self, int.__add__(self, other)) if isinstance(other, int) else NotImplemented

    def __sub__(self, other: Any) -> Any:
        return _combine(self, "-", other, int.__sub__(self, other)) if isinstance(other, int) else NotImplemented

    def __rsub__(self, other: Any) -> Any:
        return _combine(other, "-", self, int.__rsub__(self, other)) if isinstance(other, int) else NotImplemented

    def __mul__(self, other: Any) -> Any:
        return _combine(self, "*", other, int.__mul__(self, other)) if isinstance(other, int) else NotImplemented

    def __rmul__(self, other: Any) -> Any:
        return _combine(other, "*", self, int.__mul__(self, other)) if isinstance(other, int) else NotImplemented

    def __floordiv__(self, other: Any) -> Any:
        if not isinstance(other, int) or other == 0:
            return int.__floordiv__(self, other)
        return _combine(self, "//", other, int.__floordiv__(self, other))

    def __rfloordiv__(self, other: Any) -> Any:
        if not isinstance(other, int) or self == 0:
            return int.__rfloordiv__(self, other)
        return _combine(other, "//", self, int.__rfloordiv__(self, other))


def name(value: int, text: str) -> int:
    """`value` named `text` (a constant's identifier); a bool or a non-identifier stays as it is."""
    if isinstance(value, bool) or not text.isidentifier():
        return value
    return Named(value, text)


def named_fields(record: Any, **names: str) -> Any:
    """A frozen record (a schedule's plan) with the given int fields named: `named_fields(plan, tile_k="TILE_K")`."""
    return dataclasses.replace(record, **{f: name(getattr(record, f), text) for f, text in names.items()})


def text_of(x: object) -> str:
    """The name of a size ("" for a plain int)."""
    return x.text if isinstance(x, Named) else ""


def show(x: int) -> str:
    """A size as codegen prints it: its name, else its number."""
    return text_of(x) or str(int(x))


def _identity(a: int, op: str, b: int) -> int | None:
    """The operand `a op b` equals without computing a new text (x * 1, x + 0, x // 1, 1 * x, 0 + x)."""
    if op in "+-" and isinstance(b, int) and not isinstance(b, Named) and b == 0:
        return a
    if op in ("*", "//") and not isinstance(b, Named) and b == 1:
        return a
    if op in "+*" and not isinstance(a, Named) and a == (0 if op == "+" else 1):
        return b
    return None


def _combine(a: int, op: str, b: int, value: int) -> int:
    if op in "+-" and not isinstance(b, Named) and b < 0:  # x - -1 reads x + 1
        op, b = ("-" if op == "+" else "+"), -b
    if any(not isinstance(x, Named) and x < 0 for x in (a, b)):  # a negative literal is no size
        return value
    same = _identity(a, op, b)
    if same is None:
        same = _cancelled(a, op, b)
    if same is not None:
        return same
    if value <= 0:  # no size is negative or empty: such a value is an offset, not a dimension
        return value
    if op == "+" and isinstance(a, Named) and isinstance(b, Named) and a.text == b.text and a.prec == 3:
        return _combine(2, "*", a, value)  # C + C: a band of two copies reads `2 * SIZE_C`
    ta, tb = _operand(a, _PREC[op], False), _operand(b, _PREC[op], True)
    ops = 1 + (a.ops if isinstance(a, Named) else 0) + (b.ops if isinstance(b, Named) else 0)
    text = f"{ta} {op} {tb}"
    if ops > MAX_OPS or len(text) > MAX_CHARS:
        return value
    out = Named(value, text, _PREC[op], ops)
    out.parts = (a, op, b)
    return out


def _cancelled(a: int, op: str, b: int) -> int | None:
    """x for `x - c + c` and `x + c - c` (a span's `last - first + 1` of a tile starting at 0), and for `x // t * t`
    or `t * (x // t)` when t divides x (a strip of whole tiles)."""
    if op == "*":
        for whole, t in ((a, b), (b, a)):
            parts = getattr(whole, "parts", None)
            if parts and parts[1] == "//" and text_of(parts[2]) == text_of(t) and parts[2] == t \
                    and int(parts[0]) == int(whole) * int(t):
                return parts[0]
        return None
    parts = getattr(a, "parts", None)
    if op in "+-" and parts and parts[1] in "+-" and parts[1] != op and not isinstance(b, Named) \
            and not isinstance(parts[2], Named) and parts[2] == b:
        return parts[0]
    return None


def _operand(x: int, prec: int, right: bool) -> str:
    """x's text inside an operator of binding strength `prec`: parenthesised when it binds more loosely (or as
    tightly on the right: `a - (b - c)`, `a // (b * c)`)."""
    text, own = (x.text, x.prec) if isinstance(x, Named) else (str(int(x)), 3)
    return f"({text})" if own < prec or (right and own == prec) else text


# ---- the verifier's check: a text over declared constants --------------------------------------------------------


def evaluate(text: str, values: Mapping[str, int]) -> int:
    """The value of a name over the declared constants: KeyError for an undeclared one, ValueError for anything but
    `+ - * //` of names and integer literals."""
    return _eval(ast.parse(text, mode="eval").body, values)


def _eval(node: ast.AST, values: Mapping[str, int]) -> int:
    if isinstance(node, ast.Name):
        return int(values[node.id])
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _NODES:
        a, b = _eval(node.left, values), _eval(node.right, values)
        return {"+": a + b, "-": a - b, "*": a * b, "//": a // b}[_NODES[type(node.op)]]
    raise ValueError(f"not a size expression: {ast.dump(node)}")


def words(text: str) -> set[str]:
    """The constants a name reads."""
    return set(re.findall(_IDENT, text))


def renamed(x: int, names: Mapping[str, str]) -> int:
    """x with its text's identifiers renamed (`TILE_P` -> `Y_TILE_P` for the second op of a kernel)."""
    if not isinstance(x, Named) or not words(x.text) & names.keys():
        return x
    text = re.sub(_IDENT, lambda m: names.get(m.group(0), m.group(0)), x.text)
    return Named(int(x), text, x.prec, x.ops)


# ---- walking frozen records ---------------------------------------------------------------------------------------


def map_ints(node: Any, fn: Callable[[Named], int]) -> Any:
    """`node` with every Named inside it (dataclass fields, tuples, lists) replaced by fn(it); unchanged parts are
    the same objects."""
    if isinstance(node, Named):
        return fn(node)
    if isinstance(node, (tuple, list)):
        items = [map_ints(x, fn) for x in node]
        if all(a is b for a, b in zip(items, node)):
            return node
        return type(node)(items)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        changes = {}
        for f in dataclasses.fields(node):
            old = getattr(node, f.name)
            new = map_ints(old, fn)
            if new is not old:
                changes[f.name] = new
        return dataclasses.replace(node, **changes) if changes else node
    return node


def named_ints(node: Any) -> Iterator[Named]:
    """Every Named inside `node`, in field order."""
    if isinstance(node, Named):
        yield node
    elif isinstance(node, (tuple, list)):
        for x in node:
            yield from named_ints(x)
    elif dataclasses.is_dataclass(node) and not isinstance(node, type):
        for f in dataclasses.fields(node):
            yield from named_ints(getattr(node, f.name))


# ---- a program's sizes --------------------------------------------------------------------------------------------


def size_const(size: str) -> str:
    """The module constant of a program size: `SIZE_K`, never the name of a kernel parameter (a tensor may be `K`)."""
    return f"SIZE_{size}"


def is_size(word: str) -> bool:
    """Whether a constant is a program size's (shared by every op of a kernel, never prefixed per op)."""
    return word.startswith("SIZE_")


def name_sizes(program: Any) -> Any:
    """The program with its sizes named (`K` -> Named(1024, "SIZE_K")) and its tensors' shapes evaluated over them
    (`[M, K]` -> (SIZE_M, SIZE_K)), so builders that compute with them keep the names; a size whose constant would
    not be an identifier (a Unicode size) stays a number."""
    from tilec.lang import bounds

    sizes = {k: name(v, size_const(k)) if k.isascii() else v for k, v in program.sizes.items()}
    declared = program.facts.tensors if program.facts is not None else {}
    tensors = {}
    for key, t in program.tensors.items():
        d = declared.get(key)
        if t.shape is not None and d is not None and len(d.shape) == len(t.shape):
            try:
                shape = tuple(bounds.evaluate_size(e, sizes) for e in d.shape)
            except KeyError:
                shape = t.shape
            t = dataclasses.replace(t, shape=shape) if shape == t.shape else t
        tensors[key] = t
    return dataclasses.replace(program, sizes=sizes, tensors=tensors)


def size_consts(program: Any) -> list[tuple[str, int]]:
    """(constant, value) of every named size of the program, in the order of the kernel's `Sizes:` line."""
    return sorted((v.text, int(v)) for v in program.sizes.values() if isinstance(v, Named))
