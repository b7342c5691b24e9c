"""PSUM sums sharing a few PSUM tiles (dw17): a list of statements whose fp32 PSUM sums (each allocation of a PSUM
tile outside loops is one sum) are placed in PSUM tiles allocated once and reused sum after sum in program order.
A reused tile's next sum starts with a matmul that overwrites it (ir.Matmul.start: NKI 0.1 `t[..] = nc_matmul(..)`,
0.6 accumulate=False; "the first nc_matmul instruction overwrites the destination PSUM bank", v2.26.1
nki/arch/trainium_inferentia2_arch.rst) or with a ScalarE/VectorE write. The waits between a tile's sums are then
true data dependences the hardware pays as well, and the model (tilec/perf/schedule.place_psum) sees a few
allocation sites instead of one per sum."""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Callable

from tilec.compiler import ir
from tilec.compiler.ir import Alloc, Buf, Matmul, Stmt, Transpose, View
from tilec.errors import InternalError


def shared_sums(body: list[Stmt], banks: int, fresh: Callable[[str], str], name: str = "psum"
                ) -> tuple[list[Stmt], int]:
    """`body` with its fp32 PSUM sums (each allocation outside loops of a PSUM tile no transpose writes: one sum)
    placed in at most `banks` PSUM tiles (less the banks of the other PSUM tiles), allocated once each (named
    `name`0, `name`1, ..., at their first use) and reused sum after sum: in program order, a sum takes a tile none
    has used yet, else the one whose last sum was last touched earliest; a zeroed sum's first matmul then overwrites
    (ir.Matmul.start). A sum's views keep their indices (a tile is as large as the largest sum). Returns the body
    and the number of tiles: more than the banks where more sums are live at once (the caller refuses that)."""
    flat = list(_positions(body))
    moved_in = {st.dst.buf.name for st, _ in flat if isinstance(st, Transpose)}  # (the weights' PE transposes)
    psum = [(n, st, looped) for n, (st, looped) in enumerate(flat) if isinstance(st, Alloc) and
            st.buf.memory == "psum"]
    sums = [(n, st) for n, st, looped in psum if not looped and st.buf.dtype == "f32" and st.buf.name not in moved_in]
    if not sums:
        return body, 0
    # the other PSUM tiles (the project weights' transposes of one image's groups): a bank each, two for a name
    # allocated again (NKI 0.1 holds a tile until its name is bound again, after the next one is allocated)
    others = [st.buf.name for n, st, _ in psum if all(n != m for m, _ in sums)]
    cap = banks - sum(min(2, others.count(other)) for other in set(others))
    rank = {len(st.buf.shape) for _, st in sums}
    if len(rank) != 1:
        raise InternalError(f"PSUM sums of ranks {sorted(rank)} cannot share tiles")
    shape = tuple(max(st.buf.shape[d] for _, st in sums) for d in range(rank.pop()))
    # each sum's span: its allocation to the last statement touching its name before the name is allocated again
    span: dict[int, int] = {}
    current: dict[str, int] = {}
    for n, (st, _) in enumerate(flat):
        if isinstance(st, Alloc) and any(n == m for m, _ in sums):
            current[st.buf.name] = n
            span[n] = n
            continue
        for v in ir.views(st):
            if v.buf.name in current:
                span[current[v.buf.name]] = n
    tiles: list[list] = []  # [tile, last position of its latest sum]
    role: dict[int, Buf] = {}
    for n, st in sums:
        free = [t for t in tiles if t[1] < n]
        if free and len(tiles) >= cap:
            chosen = min(free, key=lambda t: t[1])
            chosen[1] = span[n]
        else:  # (past `cap`: more sums live at once than PSUM holds; choose() refuses such a layout)
            tiles.append([Buf(fresh(f"{name}{len(tiles)}"), "psum", "f32", shape), span[n]])
            chosen = tiles[-1]
        role[n] = chosen[0]
    pos = iter(range(len(flat)))
    now: dict[str, tuple[Buf, bool]] = {}  # a sum's name -> (its tile, whether its first matmul is yet to come)

    def moved(v: object) -> object:
        return View(now[v.buf.name][0], v.idx, v.perm) if isinstance(v, View) and v.buf.name in now else v

    def rewrite(stmts: tuple[Stmt, ...] | list[Stmt]) -> list[Stmt]:
        out: list[Stmt] = []
        for st in stmts:
            n = next(pos)
            if n in role:
                assert isinstance(st, Alloc)
                now[st.buf.name] = (role[n], st.zero)
                continue
            if isinstance(st, (ir.Block, ir.Loop)):
                out.append(replace(st, body=tuple(rewrite(st.body))))
                continue
            changes = {f.name: moved(getattr(st, f.name)) for f in fields(st)}
            for v in ir.views(st):
                if v.buf.name in now and now[v.buf.name][1]:  # a zeroed sum's first instruction
                    if not (isinstance(st, Matmul) and st.acc.buf.name == v.buf.name):
                        raise InternalError(f"the sum {v.buf.name} starts with a {type(st).__name__}, not a matmul: "
                                            "a reused PSUM tile holds no zeros")
                    now[v.buf.name] = (now[v.buf.name][0], False)
                    changes["start"] = True
            out.append(replace(st, **changes))  # type: ignore[arg-type]
        return out
    names = [t[0].name for t in tiles]
    note = ir.Block(f"PSUM: the sums below (expand, depthwise, project) take the tiles {', '.join(names)} in turn, "
                    "a new sum's first instruction overwriting its tile", ())
    return [note] + allocated_at_first_use(rewrite(body), [t[0] for t in tiles], 0), len(tiles)


def _positions(stmts, looped: bool = False):
    """(statement, inside a loop) in program order (pre-order, as ir.walk)."""
    for st in stmts:
        yield st, looped
        if isinstance(st, (ir.Block, ir.Loop)):
            yield from _positions(st.body, looped or isinstance(st, ir.Loop))


def allocated_at_first_use(body: list[Stmt], bufs: list[Buf], line: int) -> list[Stmt]:
    """`body` with an allocation of each of `bufs` it uses just before the first statement using it (inside the
    blocks: the allocation reads beside its first use); a buffer it does not use is not allocated."""
    todo = {b.name: b for b in bufs}

    def place(stmts: tuple[Stmt, ...] | list[Stmt]) -> list[Stmt]:
        out: list[Stmt] = []
        for st in stmts:
            if isinstance(st, ir.Block):
                st = replace(st, body=tuple(place(st.body)))
            else:
                for x in ir.walk((st,)):
                    for v in ir.views(x):
                        b = todo.pop(v.buf.name, None)
                        if b is not None:
                            out.append(Alloc(b, line=st.line or line))
            out.append(st)
        return out
    return place(body)
