"""A row chain software-pipelined by one row tile (unrolled by 2), so that engines overlap instead of taking turns.

Each engine runs its instructions in program order. A chain's loop body over row tiles puts one tile's work on
several engines in turn; in a 16-bit layernorm built for pipelining (build_rowchain `skewed`): VectorE the mean
and the centring, ScalarE the squares and the scaling by r, then VectorE and GpSimdE the steps against g and b.
Issued in that order, VectorE's first step on row tile i + 1 queues behind its steps on tile i, which wait for
ScalarE: each engine idles while the others work. Here the body splits at its first loop of VectorE steps
(stage A: loads, reductions, ScalarE passes; stage B: the steps and the stores) and stage B of tile i is issued
after stage A of tile i + 1. The tiles A hands to B (r-scaled rows) alternate between two buffers by parity,
allocated before the loop; the loop is unrolled by 2 so that the parity is static:

    A(0)                                                                   prologue (a loop of one iteration)
    for pt in range(R / TILE_PAIR - 1): A(2pt+1) B(2pt) A(2pt+2) B(2pt+1)  sequential: B reads what A wrote
    A(last) B(last - 1) B(last)                                            epilogue

The odd copies' buffers are the even ones' under other names (`X_tile_2`). Applied by build_rowchain.pipelined
when the chain fits whole, has an even number (>= 4) of row tiles, and everything fits the SBUF budget.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from tilec.compiler import ir
from tilec.compiler.ir import Aff, Alloc, Block, Buf, Loop, Sl, Stmt, Term, View
from tilec.compiler.passes import peak_usage

Built = tuple[list[tuple[str, int]], list[Stmt]]
VAR = "pt"  # the chain's row-tile loop (build_rowchain._Chain.build)
FUSED = "for the columns of two row tiles"  # a fused chunk loop's note (`fused`)


NOTE = "pairs of row tiles, software-pipelined: a tile's steps after the next one's ScalarE passes"


def skew_row_tiles(built: Built, budget: int, fresh, fuse: bool = False, var: str = VAR,
                   tile_const: str = "TILE_P", note: str = NOTE, min_tiles: int = 4,
                   split_at: Callable[[tuple[Stmt, ...]], int | None] | None = None) -> Built | None:
    """The chain software-pipelined by one row tile: its body splits at its first loop of VectorE steps (stage A:
    the loads, the reductions and ScalarE's passes; stage B: the steps and the stores), and stage B of row tile i
    is issued after stage A of tile i + 1, so VectorE's steps on tile i never hold up its first work on tile i + 1.
    Unrolled by 2 so that the tiles A hands to B (by parity, allocated before the loop) need no modular index:

        A(0)                                                  prologue
        for pt in range(R / TILE_PAIR - 1): A(2pt+1) B(2pt) A(2pt+2) B(2pt+1)
        A(last) B(last - 1) B(last)                           epilogue

    None when the chain has no such split, an odd number of row tiles, or does not fit the budget. `fuse`: stage A
    of tile i + 1 and stage B of tile i each with one chunk loop (cc) of the same trip count have those loops fused
    (`fused`), so that an engine with work in both stages interleaves them chunk by chunk. `var` and `tile_const`:
    the loop over tiles and its tile constant (an element-wise nest's `t` and TILE_F: pipeline._scheduled);
    `min_tiles`: fewer tiles are left as they are (the unrolled code is four copies of the body); `split_at`: where
    stage B begins in the loop's body, when its builder knows better (a column chain's second half of work)."""
    consts, stmts = built
    tp = dict(consts).get(tile_const)
    at = [i for i, s in enumerate(stmts) if isinstance(s, Block) and len(s.body) == 1
          and isinstance(s.body[0], Loop) and s.body[0].var == var]
    if tp is None or len(at) != 1:
        return None
    block = stmts[at[0]]
    assert isinstance(block, Block)
    loop = block.body[0]
    assert isinstance(loop, Loop)
    T = loop.extent
    # stage B starts at the first loop of steps, or at the TensorE transpose feeding its broadcasts (a column turned
    # into a row): in A it would hold TensorE's in-order queue, and the previous tile's broadcasts, behind this
    # tile's ScalarE passes
    split = next((i for i, s in enumerate(loop.body) if isinstance(s, ir.Transpose) or _steps(s)), None)
    split = split if split is not None else _after_loads(loop.body)
    if split_at is not None:  # the builder's own stage boundary (build_colchain.stage_b)
        split = split_at(loop.body)
    while split and _psum_alloc(loop.body[split - 1]):
        split -= 1
    if T % 2 or T < min_tiles or not split:
        return None
    a_part, b_part = list(loop.body[:split]), list(loop.body[split:])
    allocs_a = {s.buf.name: s for s in a_part if isinstance(s, Alloc)}
    used_a = {v.buf.name for s in a_part if not isinstance(s, Alloc) for x in ir.walk((s,)) for v in ir.views(x)}
    used_b = {v.buf.name for s in b_part for x in ir.walk((s,)) for v in ir.views(x)}
    crossing = [n for n in allocs_a if n in used_a and n in used_b]
    late = [allocs_a[n] for n in allocs_a if n not in used_a]  # allocated early, first used in B
    # a tile only ever written (an activation's discarded output, kept for its row sums): one buffer for both
    # parities, allocated once (its writers are in-order on one engine: sharing it makes nothing wait)
    read = {v.buf.name for s in a_part + b_part for x in ir.walk((s,)) for v in _views_read(x)}
    discarded = [n for n in allocs_a if n in used_a and n not in read and n not in crossing]
    a_part = [s for s in a_part if not (isinstance(s, Alloc) and (s.buf.name in crossing + discarded or s in late))]
    b_part = late + b_part
    # a tile of stage B that no store reads (the steps' products GpSimdE adds b to): one buffer for both parities,
    # allocated once. Its writer (VectorE) and reader (GpSimdE) run in order on every row tile, chunk by chunk:
    # tile i + 1's chunk k is written after tile i's chunk k is read, which its steps wait for anyway
    stored = {v.buf.name for x in ir.walk(tuple(b_part)) if isinstance(x, ir.Dma) for v in _views_read(x)}
    # (not a tile B's top level hands from one engine to another: rowrange_bf16's half tiles, GpSimdE's fold read
    # by ScalarE's negation read by VectorE's max; shared, the next tile's fold waited for this tile's negation,
    # and the engines took turns: 5.3 us a row tile, 3.7 with a buffer per parity)
    handed = _handed_over(b_part)
    passed = [s for s in b_part if isinstance(s, Alloc) and s.buf.memory == "sbuf" and s.buf.name not in stored
              and s not in late and s.buf.name not in handed]
    b_part = [s for s in b_part if not any(s is x for x in passed)]
    inner = {s.buf.name: s.buf for s in ir.walk(tuple(a_part + b_part)) if isinstance(s, Alloc)}
    writers = {ir_engine(s) for s in ir.walk(tuple(a_part)) for v in ir.views(s) if v.buf.name in discarded}
    if len(writers) > 1:  # written by several engines: each parity keeps its own
        return None
    odd = {name: dataclasses.replace(buf, name=fresh(f"{name}_2")) for name, buf in inner.items()}
    for n in crossing:
        odd[n] = dataclasses.replace(allocs_a[n].buf, name=fresh(f"{n}_2"))

    def copy(part: list[Stmt], tile: "int | tuple[int, int]", parity: int) -> list[Stmt]:
        """`part` for row tile `tile`: a constant, or (2, k) for 2 * pt + k inside the loop."""
        names = odd if parity else {}
        return [_at(s, (var, tile_const), tile, names) for s in part]

    hoisted = [allocs_a[n] for n in crossing + discarded] + \
        [dataclasses.replace(allocs_a[n], buf=odd[n]) for n in crossing]
    hoisted += passed
    pair = fused if fuse else _joined
    if not fuse and _passed_on(copy(a_part, (2, 1), 1), copy(b_part, (2, 0), 0)):
        return None  # B would read what the next tile's A wrote over (a whole-row tile allocated once)
    body: list[Stmt] = pair(copy(a_part, (2, 1), 1), copy(b_part, (2, 0), 0)) + \
        pair(copy(a_part, (2, 2), 0), copy(b_part, (2, 1), 1))
    loops = [Loop(var, T // 2 - 1, tuple(body), "sequential", "", loop.line,
                  note)]
    prologue = _scoped("p0", copy(a_part, 0, 0), loop.line, "the first tile's loads, ahead of the pipelined loop")
    epilogue = _scoped("p1", pair(copy(a_part, T - 1, 1), copy(b_part, T - 2, 0)) + copy(b_part, T - 1, 1),
                       loop.line, "the last two tiles' work and stores (the pipeline's drain)")
    out = list(stmts)
    out[at[0]] = dataclasses.replace(block, body=tuple(hoisted + prologue + loops + epilogue))
    if peak_usage(tuple(out))[0] > budget:
        return None
    return consts + [("TILE_PAIR", 2 * tp)], out


def _handed_over(part: list[Stmt]) -> set[str]:
    """Tiles (not (P, 1) columns) that an instruction at the top level of `part` (not in a chunk loop) writes on
    one engine and another there reads on another engine."""
    writer: dict[str, str] = {}
    out: set[str] = set()
    for s in part:
        if isinstance(s, (Loop, Block, Alloc, ir.Reshape, ir.Dma)):
            continue
        for v in _views_read(s):
            if v.buf.name in writer and writer[v.buf.name] != _engine(s) and v.buf.shape[-1] > 1:
                out.add(v.buf.name)
        for v in ir.views(s):
            if v not in _views_read(s):
                writer[v.buf.name] = _engine(s)
    return out


def _engine(s: Stmt) -> str:
    return ir.engine_of(s) or "vector"


def _joined(a: list[Stmt], b: list[Stmt]) -> list[Stmt]:
    return a + b


def fused(a: list[Stmt], b: list[Stmt]) -> list[Stmt]:
    """Stage A of one row tile then stage B of the previous one, their chunk loops (cc, one each, of one trip count)
    fused: A's statements before its loop, B's before its loop, the loop of B's chunk then A's chunk, A's statements
    after its loop, B's after its loop; a + b when the stages do not have such loops. The stages touch different
    row tiles' buffers (by parity), except a whole-row tile allocated once before the loop (X at long rows): B
    reads this tile's chunk k of it before A loads the next tile's chunk k into it, each chunk once. A stage B
    whose chunk loop is split in two (a row kept whole for its first chunks only, chunk_pipe.partly_whole) has
    each half fused with the matching chunks of A's loop."""
    ia = [i for i, s in enumerate(a) if isinstance(s, Loop) and s.var == "cc"]
    ib = [i for i, s in enumerate(b) if isinstance(s, Loop) and s.var == "cc"]
    if len(ia) == 1 and len(ib) == 2 and ib[1] == ib[0] + 1:
        from tilec.compiler.build_rowchain import _shifted
        la, l1, l2 = a[ia[0]], b[ib[0]], b[ib[1]]
        assert isinstance(la, Loop) and isinstance(l1, Loop) and isinstance(l2, Loop)
        if la.extent == l1.extent + l2.extent:
            a1 = dataclasses.replace(la, extent=l1.extent, extent_name="")
            a2 = dataclasses.replace(la, extent=l2.extent, extent_name="",
                                     body=tuple(_shifted(x, "cc", l1.extent) for x in la.body))
            first = fused(a[:ia[0]] + [a1], b[:ib[0]] + [l1])
            second = fused([a2] + a[ia[0] + 1:], [l2] + b[ib[1] + 1:])
            return first + second
    if len(ia) != 1 or len(ib) != 1:
        return a + b
    la, lb = a[ia[0]], b[ib[0]]
    assert isinstance(la, Loop) and isinstance(lb, Loop)
    if la.extent != lb.extent:
        return a + b
    if _passed_on(a, b):  # B's chunk k, then the next tile's chunk k into the same columns
        loop = dataclasses.replace(lb, body=lb.body + la.body, note=FUSED + ": this tile's, then the next one's")
    else:  # the next tile's chunk first: its loads stream ahead of this tile's steps
        loop = dataclasses.replace(lb, body=la.body + lb.body, note=FUSED + ": the next tile's, then this one's")
    return a[:ia[0]] + b[:ib[0]] + [loop] + a[ia[0] + 1:] + b[ib[0] + 1:]


def _passed_on(a: list[Stmt], b: list[Stmt]) -> bool:
    """Whether stage A (of the next row tile) writes a buffer stage B (of this tile) reads: one buffer for both
    parities, allocated before the loop."""
    written = {v.buf.name for x in ir.walk(tuple(a)) for v in ir.views(x) if v not in _views_read(x)}
    read = {v.buf.name for x in ir.walk(tuple(b)) for v in _views_read(x)}
    return bool(written & read)


def _after_loads(body: tuple[Stmt, ...]) -> int | None:
    """For a chain without steps (its statistics stored: a mean and a variance), where its work begins: after the
    loads it starts with. Stage A is the loads alone, so that the next row tile's load is issued before this tile's
    passes and stores: a DMA trigger waits for the previous trigger of its stream (perf/schedule.py), and a store
    waits for this tile's passes. None when the body does not start with a load or stores nothing."""
    split = next((i for i, s in enumerate(body) if not isinstance(s, (Alloc, ir.Dma))), None)
    loads = [s for s in body[:split] if isinstance(s, ir.Dma) and s.src.buf.memory == "hbm"]
    stores = [x for x in ir.walk(tuple(body[split:])) if isinstance(x, ir.Dma) and x.dst.buf.memory == "hbm"]
    return split if loads and stores else None


def _steps(s: Stmt) -> bool:
    """A loop of the chain's steps over column chunks (TILE_F), or a loop over column chunks (TILE_C) holding one."""
    return isinstance(s, Loop) and any(isinstance(x, Loop) and x.var == "ct" for x in ir.walk((s,)))


def _views_read(s: Stmt) -> list[View]:
    """The views an instruction reads (not its destination, nor an activation's row sums)."""
    if isinstance(s, (Loop, Block, Alloc, ir.Reshape)):
        return []
    written = {id(getattr(s, f, None)) for f in ("dst", "acc", "total")}
    return [getattr(s, f.name) for f in dataclasses.fields(s)
            if isinstance(getattr(s, f.name), View) and id(getattr(s, f.name)) not in written]


def ir_engine(s: Stmt) -> str:
    """The engine an instruction runs on, as far as sharing a written-only tile goes."""
    if isinstance(s, ir.Act):
        return "scalar"
    return f"{type(s).__name__}:{getattr(s, 'engine', '')}"


def _psum_alloc(s: Stmt) -> bool:
    return isinstance(s, Alloc) and s.buf.memory == "psum"


def _scoped(var: str, stmts: list[Stmt], line: int, note: str) -> list[Stmt]:
    """Statements in a loop of one iteration: their tiles are released after it (as the loop's are)."""
    return [Loop(var, 1, tuple(stmts), "static", "", line, note)]


def _at(s: Stmt, loop: tuple[str, str], tile: "int | tuple[int, int]", renamed: dict[str, Buf]) -> Stmt:
    """`s` for tile `tile` of the loop (its variable, its tile constant), buffers renamed."""
    if isinstance(s, (Loop, Block)):
        return dataclasses.replace(s, body=tuple(_at(x, loop, tile, renamed) for x in s.body))
    changes: dict[str, object] = {}
    for f in dataclasses.fields(s):
        value = getattr(s, f.name)
        if isinstance(value, View):
            changes[f.name] = View(renamed.get(value.buf.name, value.buf),
                                   tuple(_tile_idx(i, loop, tile) for i in value.idx))
        elif isinstance(value, Buf) and f.name == "buf":
            changes[f.name] = renamed.get(value.name, value)
    return dataclasses.replace(s, **changes)  # type: ignore[arg-type]


def _tile_idx(i: "Aff | Sl", loop: tuple[str, str], tile: "int | tuple[int, int]") -> "Aff | Sl":
    if isinstance(i, Sl):
        named = [t.name for t in i.start.terms if t.var == loop[0] and t.coef == i.size and t.name]
        return dataclasses.replace(i, start=_tile_aff(i.start, loop, tile), name=i.name or (named or [""])[0])
    return _tile_aff(i, loop, tile)


def _tile_aff(a: Aff, loop: tuple[str, str], tile: "int | tuple[int, int]") -> Aff:
    var, tile_const = loop
    if var not in a.vars():
        return a
    per_tile = sum(t.coef for t in a.terms if t.var == var)
    rest = tuple(t for t in a.terms if t.var != var)
    if isinstance(tile, int):
        return Aff(rest, a.const + per_tile * tile)
    mult, k = tile
    terms = tuple(Term(t.var, mult * t.coef, "TILE_PAIR" if t.name == tile_const else "") for t in a.terms
                  if t.var == var)
    return Aff(rest + terms, a.const + per_tile * k)


def skew_inner_tiles(built: Built, budget: int, fresh, var: str, tile_const: str, note: str,
                     min_tiles: int, split_at: Callable[[tuple[Stmt, ...]], int | None] | None = None) -> Built | None:
    """skew_row_tiles of a loop of tiles one level down, inside a loop of the kernel (or of its block): a broadcast
    layout's free tiles inside its partition tiles, or its partition tiles inside the free tiles that copy a long
    row to the partitions per tile (in a block of their own there). The pairs restart at each iteration of the
    outer loop (prologue and epilogue inside it)."""
    consts, stmts = built
    for i, s in enumerate(stmts):
        outer = s.body[0] if isinstance(s, Block) and len(s.body) == 1 else s
        if not isinstance(outer, Loop):
            continue
        bare = [j for j, x in enumerate(outer.body) if isinstance(x, Loop) and x.var == var]
        body = list(outer.body)
        if len(bare) == 1:  # the loop of tiles alone in the outer loop's body: a block for skew_row_tiles
            body[bare[0]] = Block("", (body[bare[0]],))
        inner = skew_row_tiles((consts, body), budget, fresh, var=var, tile_const=tile_const, note=note,
                               min_tiles=min_tiles, split_at=split_at)
        if inner is None:
            continue
        made = list(inner[1])
        if len(bare) == 1:
            made[bare[0]:bare[0] + 1] = list(made[bare[0]].body)  # type: ignore[union-attr]
        paired = dataclasses.replace(outer, body=tuple(made))
        out = list(stmts)
        out[i] = dataclasses.replace(s, body=(paired,)) if isinstance(s, Block) else paired
        return (inner[0], out) if peak_usage(tuple(out))[0] <= budget else None
    return None
