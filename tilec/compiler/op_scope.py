"""Each op's on-chip buffers in a scope of their own when the kernel would not fit otherwise. Buffers allocated at
the kernel's top level live until it returns (the SBUF peak, passes.peak_usage, counts them so, as the 0.1
interpreter does), so a kernel of several ops each holding large weights (a SwiGLU FFN: W1, W3 and W2 held whole,
48 KiB a partition each at 768 x 2048 fp32, 265 KiB in all of 192) was refused as an SBUF overflow although each op
alone fits. As the last resort (pipeline._op_scoped: after the convs' halved bands), each op's statements run in a
one-trip loop, so its buffers die at the op's end; an op that leaves a buffer (or view) to a later op keeps its
statements at the top level. The hoist pass does not lift loads out of these loops (passes._hoist_body). Kernels
that fit otherwise are unchanged."""
from __future__ import annotations

from tilec.compiler import ir
from tilec.compiler.ir import Alloc, Loop, Reshape, Stmt, views, walk

SCOPE = "one op: its buffers die at its end (op_scope.py)"  # the loop's note: the hoist pass keeps loads inside


def scoped_parts(head: list[Stmt], parts: list[list[Stmt]], fresh) -> list[Stmt]:
    """`head` then each part's statements, in a one-trip loop where nothing it allocates is used after it."""
    out = list(head)
    for i, stmts in enumerate(parts):
        later = {name for rest in parts[i + 1:] for s in walk(tuple(rest)) for name in _used(s)}
        made = {s.buf.name for s in walk(tuple(stmts)) if isinstance(s, (Alloc, Reshape))}
        if made and not made & later:
            out.append(Loop(fresh("op"), 1, tuple(stmts), line=_line(stmts), note=SCOPE))
        else:
            out += stmts
    return out


def _used(s: Stmt) -> set[str]:
    names = {v.buf.name for v in views(s)}
    return names | ({s.base.name} if isinstance(s, Reshape) else set())


def _line(stmts: list[Stmt]) -> int:
    return next((s.line for s in walk(tuple(stmts)) if getattr(s, "line", 0)), 0)


def is_scope(s: Stmt) -> bool:
    return isinstance(s, ir.Loop) and s.note == SCOPE
