"""Names the compiler invents (buffers such as `X_band`, `Wt_T`, `conv_acc`; loop variables such as `kt`).

One `NameAllocator` per kernel knows every name of the user's program (tensors, loop variables, the kernel) and
the names generated code cannot use (Python keywords and builtins, the NKI module aliases). A derived name is
unique by construction: `fresh("X_band")` returns `X_band` unless that is taken, then `X_band2`, `X_band3`, ...
Builders ask for a name by (owner, base), so the same request inside one operation gets the same name back and two
operations never share a derived buffer.
"""
from __future__ import annotations

import builtins
import keyword
import unicodedata

from tilec.lang import syntax as sx

RESERVED = frozenset({"nki", "nl", "nisa", "np", "numpy", "neuronxcc"} | set(dir(builtins)) | set(keyword.kwlist))


def sanitised(name: str) -> str:
    """The identifier codegen prints for a DSL name: reserved words get a trailing underscore, and so do dunder
    names (a kernel `__class__` would otherwise be looked up as the module's own attribute). A non-ASCII name is
    printed the way Python reads it (NFKC: `ﬁ` is `fi`; the callers' `unique` then keeps two such names apart),
    or spelled in ASCII (`_u2460`) when that is no identifier."""
    if not name.isascii():
        py = unicodedata.normalize("NFKC", name)
        name = py if py.isidentifier() else "_" + "".join(
            c if c.isascii() and (c.isalnum() or c == "_") else f"u{ord(c):x}" for c in name)
    dunder = len(name) > 4 and name.startswith("__") and name.endswith("__")
    return name + "_" if name in RESERVED or dunder else name


class NameAllocator:
    def __init__(self, user_names: set[str]) -> None:
        self.taken = set(RESERVED) | set(user_names) | {sanitised(n) for n in user_names}
        self.given: dict[tuple[str, str], str] = {}

    def fresh(self, base: str, owner: str = "") -> str:
        """A name for `base` that no user name and no other derived name has; stable per (owner, base)."""
        key = (owner, base)
        if key not in self.given:
            self.given[key] = unique(base, self.taken)
        return self.given[key]


def unique(base: str, taken: set[str]) -> str:
    """`base`, or `base2`, `base3`, ... whichever is not taken yet; it is then taken."""
    cand, n = base, 1
    while cand in taken:
        n += 1
        cand = f"{base}{n}"
    taken.add(cand)
    return cand


def program_names(program) -> set[str]:
    """Every name a .tl program defines: kernel, tensors, size symbols and lets, loop variables."""
    names = {program.kernel.name} | set(program.tensors) | set(program.sizes)
    names |= {v for stmt in program.kernel.body for v in _loop_vars(stmt)}
    return names


def _loop_vars(stmt: sx.Stmt) -> set[str]:
    if isinstance(stmt, sx.Loop):
        return {stmt.var}.union(*(_loop_vars(s) for s in stmt.body))
    return set()
