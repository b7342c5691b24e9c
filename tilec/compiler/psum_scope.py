"""PSUM tiles at the kernel's top level in the NKI 0.1 form. The IR verifier frees a PSUM tile at its last use (the
allocator's liveness, which the 0.6 interpreter checks: tilec/nki/top06.py), but the 0.1 interpreter keeps a tile
allocated at the top level until the kernel returns: only a loop body's tiles die, at the end of each iteration
(tilec/nki/runtime.end_iteration; its psum_bank_overflow hint: "allocate PSUM tiles inside the loop body so they die
each iteration"). A kernel of many small top-level matmuls (an SE block's two FCs beside its weights' transposes,
user24's mbconv_se: nine PSUM tiles) passed the verifier and failed in the 0.1 interpreter.

So, in the 0.1 form only and only when the top level allocates more PSUM tiles than the target has banks, each
top-level span from a PSUM allocation to the tile's last use runs in a one-trip loop: the tile dies there, where the
verifier said it would. A span is wrapped only when it lies in one statement list and nothing else allocated in it
is used after it. Kernels within the banks are emitted unchanged."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.ir import Alloc, Block, Loop, Reshape, Stmt, views, walk

Path = tuple[int, ...]


def scoped_psum(body: tuple[Stmt, ...], banks: int) -> tuple[Stmt, ...]:
    """`body` with its top-level PSUM tiles' spans in one-trip loops when they outnumber `banks`."""
    flat = _positions(body)
    if _scope_peak(body) <= banks:
        return body
    last = _last_uses([s for _, s in flat])
    spans: dict[Path, list[tuple[int, int, int]]] = {}  # parent list -> (first, last position, line)
    end = -1
    for a, (path, s) in enumerate(flat):
        if a <= end or not isinstance(s, Alloc) or s.buf.memory != "psum":
            continue
        b = last.get(s.buf.name, a)
        made = [x.buf.name for _, x in flat[a:b + 1] if isinstance(x, (Alloc, Reshape))]
        if flat[b][0][:-1] != path[:-1] or any(last.get(name, a) > b for name in made):
            continue
        spans.setdefault(path[:-1], []).append((path[-1], flat[b][0][-1], s.line))
        end = b
    return _rebuilt(body, (), spans)


def _scope_peak(stmts: tuple[Stmt, ...]) -> int:
    """The most PSUM tiles live at once as the 0.1 interpreter counts them: in each body (blocks opened), every
    tile allocated in it so far (they die when the body ends, the kernel or a loop's iteration, or when their name
    is bound again), plus the peak of a loop run there."""
    peak, held = 0, set()
    for _, s in _positions(stmts):
        if isinstance(s, Alloc) and s.buf.memory == "psum":
            held.add(s.buf.name)
        peak = max(peak, len(held) + (_scope_peak(s.body) if isinstance(s, Loop) else 0))
    return peak


def _positions(stmts: tuple[Stmt, ...], path: Path = ()) -> list[tuple[Path, Stmt]]:
    """The top-level statements, blocks opened (they group, they are no scope), each with its place."""
    out: list[tuple[Path, Stmt]] = []
    for i, s in enumerate(stmts):
        out += _positions(s.body, path + (i,)) if isinstance(s, Block) else [(path + (i,), s)]
    return out


def _last_uses(flat: list[Stmt]) -> dict[str, int]:
    """Each buffer's index of the last statement that reads, writes or reshapes it."""
    last: dict[str, int] = {}
    for i, s in enumerate(flat):
        for x in walk((s,)):
            for v in views(x):
                last[v.buf.name] = i
            if isinstance(x, Reshape):
                last[x.base.name] = i
    return last


def _rebuilt(stmts: tuple[Stmt, ...], path: Path, spans: dict[Path, list[tuple[int, int, int]]]
             ) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    starts = {first: (stop, line) for first, stop, line in spans.get(path, [])}
    i = 0
    while i < len(stmts):
        s = stmts[i]
        if i in starts:
            stop, line = starts[i]
            out.append(Loop("once", 1, stmts[i:stop + 1], line=line))
            i = stop + 1
            continue
        out.append(replace(s, body=_rebuilt(s.body, path + (i,), spans)) if isinstance(s, Block) else s)
        i += 1
    return tuple(out)
