"""The shared steps of the source rewrites that run before lowering (pad_split, reduce_split, permute_split,
inplace_split): each turns a statement no rule maps into ordinary statements over new temporaries, then checks the
rewritten kernel again as if the user had written it (so the temporaries get shapes, dtypes and proven bounds the
same way as declared tensors)."""
from __future__ import annotations

from dataclasses import replace

from tilec.lang import syntax as sx


def taken_names(kernel: sx.Kernel) -> set[str]:
    """The names a new temporary must not take: parameters, declarations and lets."""
    return {p.name for p in kernel.params} | {d.name for d in kernel.decls} | {lt.name for lt in kernel.lets}


def unique(base: str, taken: set[str]) -> str:
    """`base`, or `base2`, `base3` ... the first not in `taken`; the name is added to `taken`."""
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}{n}"
    taken.add(name)
    return name


def written(st: sx.Stmt) -> set[str]:
    """The tensors a statement (with its nested loops) stores into."""
    if isinstance(st, sx.Loop):
        return set().union(*(written(c) for c in st.body)) if st.body else set()
    return {st.target.tensor} if isinstance(st, sx.Assign) else set()


def nested(st: sx.Stmt, loops: list[sx.Loop] | tuple[sx.Loop, ...]) -> sx.Stmt:
    """`st` inside `loops` (outermost first), each running as the program's loop of that name runs."""
    for lp in reversed(loops):
        st = sx.Loop(lp.var, lp.start, lp.stop, (st,), lp.span)
    return st


def rechecked(program, decls: list[sx.Decl], body: list[sx.Stmt] | tuple[sx.Stmt, ...]):
    """The program with `decls` added and `body` as its kernel's body, checked and resolved again; the same object
    when nothing was declared (nothing was rewritten)."""
    from tilec.lang import api, bounds, checker
    if not decls:
        return program
    kernel = replace(program.kernel, decls=program.kernel.decls + tuple(decls), body=tuple(body))
    facts = checker.check(kernel)
    pending = bounds.prove(facts)
    bound = {k: v for k, v in program.sizes.items() if k in facts.symbols}
    return api._resolve(kernel, program.path, program.source, facts, pending, program.defines, bound)
