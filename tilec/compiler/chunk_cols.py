"""Column chunking of a row chain at long rows: a chain whose whole-row tiles do not fit SBUF keeps its one pass.

A row chain (build_rowchain.py) holds whole rows of TILE_P rows in SBUF. At rows of 16384 fp32 each such tile is
64 KiB per partition, and an rmsnorm's X, discarded squares, Y and g's row (1, F) no longer fit. This pass rewrites
the chain's loop body so that only the tiles read in two phases of the chain stay whole (X, read by the statistics
and again by the output), and everything else is made and consumed column chunk by column chunk (TILE_C columns):

    for pt in range(R / TILE_P):                    for pt in range(R / TILE_P):
        X_tile = [P, F]; load X rows                    X_tile = [P, F]
        discard = [P, F]                                for cc in range(F / TILE_C):   # phase 1
        act(discard, X_tile) -> ms_col                      load X[rows, cc chunk] into X_tile[:, cc chunk]
        r = rsqrt(ms_col)                                   act(discard[P, C], X_tile[:, cc]) -> ms_parts[:, cc]
        Y_tile = [P, F]; act(Y_tile, X_tile, r)         ms_col = sum(ms_parts)
        for ct in range(F / TILE_F):                    r = rsqrt(ms_col)
            g_psum = ones.T @ g_row[:, ct]              for cc in range(F / TILE_C):   # phase 2
            Y_tile[:, ct] *= g_psum                         g_chunk = load g[cc chunk]
        store Y_tile                                        Y_tile = [P, C]; act(Y_tile, X_tile[:, cc], r)
                                                            for ct in range(TILE_C / TILE_F): ... Y_tile[:, ct]
                                                            store Y_tile into Y[rows, cc chunk]

The phases are the runs of whole-row statements between the statements on columns ((P, 1) values: rsqrt of a
variance, -mean): a statement reading a column that a row reduction of the current phase makes also starts a new
phase. A row reduction inside a phase writes one partial per chunk (an activation's reduce_res, a tensor_reduce)
into a (P, F / TILE_C) tile, folded into its column by one tensor_reduce after the phase. A tile touched by one
phase only becomes a (P, TILE_C) tile allocated inside the chunk loop; a tile touched by several phases stays whole
(resident), read and written at the chunk's columns. Rows (1, F) loaded once before the loop (g, b) are loaded chunk
by chunk where they are read (a (1, F) row costs F * 4 bytes of a partition like a whole tile). The chunk loop of
the chain's VectorE steps (TILE_F, one PSUM bank) runs inside, over the chunk's TILE_C / TILE_F banks.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from tilec.compiler import ir, passes
from tilec.compiler.ir import Act, Aff, Alloc, Block, Buf, Dma, Loop, Reduce, Sl, Stmt, Term, View, whole

CHUNK_MAX = 4096  # columns of a chunk at most (16 KiB of fp32 per partition per chunk tile)
# with rows broadcast again per chunk, smaller chunks leave room for the next row tile's load to overlap: on the
# model, layernorm over rows of 32768 fp32 is 2.62x the floor with chunks of 2048, 2.13x with 1024, 2.32x with 512
REBUILT_CHUNK_MAX = 1024
# with X allocated once (chunk_columns' `rotating`), the next row tile's chunk k loads as soon as this tile's last
# phase has read chunk k: smaller chunks start the stream sooner. Bytes per partition of a chunk of X at most (on the
# model under the "fit" rule, fp32 softmax over rows of 16384 1.26x the floor with chunks of 4096, 1.13x with 2048,
# 1.28x with 1024; rmsnorm over rows of 8192 1.40 / 1.27 / 1.25x, of 16384 1.26 / 1.20 / 1.30x; bf16 softmax over
# rows of 32768 1.49x with chunks of 4096, 1.69x with 2048)
ROTATING_CHUNK_BYTES = 8192


class _NoChunk(Exception):
    """A statement this pass does not know how to chunk: the chain is left as it was."""


def chunk_columns(consts: list[tuple[str, int]], stmts: list[Stmt], free: int, budget: int, fresh,
                  rotating: bool = False, widest: int = CHUNK_MAX) -> tuple[list[tuple[str, int]], list[Stmt]] | None:
    """The chain (consts, stmts from build_rowchain) with its columns chunked (see the module docstring) with the
    largest chunk (of at most `widest` columns) that fits `budget`, or None when no chunking fits or applies.
    `rotating`: the whole-row tiles kept across phases (X) are allocated once before the row-tile loop and every
    tile allocated in a loop must fit twice (`rotation_need`): the next row tile's loads then stream into X chunk by
    chunk, each as soon as this tile's last phase has read that chunk, instead of waiting for a second whole X that
    does not fit. Tried first (any chunk size) with X allocated in the loop like the rest, where its two buffers fit
    too: the next row tile then loads whole while this one is worked on (on the model under "fit": layernorm over
    rows of 8192 fp32 1.62x -> 1.37x the floor, rmsnorm over rows of 8192 / 16384 fp32 1.27 / 1.20x -> 1.10 /
    1.17x)."""
    tile_f = dict(consts).get("TILE_F", 1)
    sizes = [c for c in range(min(CHUNK_MAX, widest), 0, -1)
             if free % c == 0 and c % tile_f == 0 and c < free and c >= 128]
    # tiles read in later phases kept whole, else made again there; rows on every partition made before the loop,
    # else broadcast again chunk by chunk where they are read
    if rotating:
        loaded = [x.dst.buf for x in ir.walk(tuple(stmts)) if isinstance(x, Dma) and x.dst.buf.memory == "sbuf"
                  and len(x.dst.buf.shape) == 2 and x.dst.buf.shape[1] == free]
        most = ROTATING_CHUNK_BYTES // max((ir.DTYPE_BYTES[b.dtype] for b in loaded), default=4)
        sizes = [c for c in sizes if c <= most]
    tries = [(False, False, False)] if rotating else []
    tries += [(False, False, rotating), (True, False, rotating), (True, True, rotating)]
    for remake, rebuild, hoist in tries:
        for size in [c for c in sizes if not rebuild or c <= REBUILT_CHUNK_MAX]:
            try:
                out = _Chunker(stmts, free, size, tile_f, fresh, remake, rebuild, hoist=hoist).run()
            except _NoChunk:
                return None
            need = rotation_need(out) if rotating else passes.peak_usage(tuple(out))[0]
            if need <= budget:
                return consts + [("TILE_C", size)], out
    return None


def rotation_need(stmts: list[Stmt] | tuple[Stmt, ...], depth: int = 2, least: int = 0) -> int:
    """SBUF bytes per partition a kernel needs when every tile allocated inside a loop rotates through `depth`
    buffers (the performance model's buffer_rotation, and what overlapping one row tile's loads with the previous
    tile's work takes), each allocation site counted over the whole loop (the model's site spans: tiles of two
    phases of one loop body count together). Tiles allocated outside every loop count once; tiles of fewer than
    `least` bytes per partition are not counted."""
    def walk(body: tuple[Stmt, ...], looped: bool) -> int:
        total = 0
        for s in body:
            if isinstance(s, Alloc) and s.buf.memory == "sbuf" and s.buf.bytes_per_partition() >= least:
                total += s.buf.bytes_per_partition() * (depth if looped else 1)
            elif isinstance(s, Loop):
                total += walk(s.body, looped or s.extent > 1)
            elif isinstance(s, Block):
                total += walk(s.body, looped)
        return total
    return walk(tuple(stmts), False)


def chunked_at(consts: list[tuple[str, int]], stmts: list[Stmt], free: int, size: int,
               fresh, hoist: bool = False) -> tuple[list[tuple[str, int]], list[Stmt]] | None:
    """The chain with its columns chunked by `size` (TILE_C), its rows on every partition kept whole before the
    loop, whatever it takes in SBUF (the caller checks); None when the chunking does not apply. `hoist`: the
    whole-row tiles kept across phases (X) allocated once before the row-tile loop (chunk_columns' `rotating`)."""
    tile_f = dict(consts).get("TILE_F", 1)
    if free % size or size % tile_f or size >= free:
        return None
    try:
        return consts + [("TILE_C", size)], _Chunker(stmts, free, size, tile_f, fresh, hoist=hoist).run()
    except _NoChunk:
        return None


class _Chunker:
    def __init__(self, stmts: list[Stmt], free: int, size: int, tile_f: int, fresh, remake: bool = False,
                 rebuild: bool = False, hoist: bool = False) -> None:
        self.stmts, self.F, self.C, self.TF, self.fresh = stmts, free, size, tile_f, fresh
        self.hoist = hoist  # whole-row tiles kept across phases allocated once, before the row-tile loop
        self.remake = remake  # a tile made by one instruction and read in later phases is made again in each
        self.rebuild = rebuild  # a whole-row tile made before the loop (a row on every partition) made per chunk
        self.built: dict[str, tuple[Alloc, Loop]] = {}
        self.inner = {"ct"}  # loops over a row's columns inside the chunk loop
        self.names: dict[str, str] = {}

    def run(self) -> list[Stmt]:
        k = len(self.stmts) - 1
        block = self.stmts[k]
        if not (isinstance(block, Block) and len(block.body) == 1 and isinstance(block.body[0], Loop)):
            raise _NoChunk
        outer = block.body[0]
        # rows (1, F) loaded before the loop: loaded chunk by chunk where they are read
        self.rows: dict[str, View] = {}
        setup: list[Stmt] = []
        for s in self.stmts[:k]:
            if isinstance(s, Dma) and self.is_row(s.dst.buf) and s.dst == whole(s.dst.buf):
                self.rows[s.dst.buf.name] = s.src
        before = self.stmts[:k]
        for i, s in enumerate(before):
            if self.rebuild and isinstance(s, Alloc) and self.tile(s.buf) and i + 1 < len(before) \
                    and isinstance(before[i + 1], Loop):
                self.built[s.buf.name] = (s, before[i + 1])  # type: ignore[assignment]
        skip = {id(x) for pair in self.built.values() for x in pair}
        for s in before:
            if isinstance(s, Alloc) and s.buf.name in self.rows or isinstance(s, Dma) and s.dst.buf.name in self.rows:
                continue
            if id(s) in skip:
                continue
            setup.append(s)  # a whole-row tile made here (a row on every partition) stays whole: read at the chunk
        phases = self.phases(outer.body)
        remade = self.remade(phases) if self.remake else set()
        touched: dict[str, set[int]] = {}
        for n, phase in enumerate(phases):
            if isinstance(phase, list):
                for s in phase:
                    for x in ir.walk((s,)):
                        for v in ir.views(x):
                            touched.setdefault(v.buf.name, set()).add(n)
        inside = {s.buf.name for s in outer.body if isinstance(s, Alloc)}
        read = {v.buf.name for p in phases if isinstance(p, list) for s in p for x in ir.walk((s,)) for v in _reads(x)}
        # a tile of one phase, or one only ever written (the activations' discarded output), is made chunk by chunk
        self.local = {name for name, ns in touched.items()
                      if name in inside and (len(ns) == 1 or name not in read or name in remade)}
        self.local |= set(self.built)
        body: list[Stmt] = []
        allocs: dict[str, Alloc] = {}
        for n, phase in enumerate(phases):
            if not isinstance(phase, list):
                if isinstance(phase, Alloc) and self.tile(phase.buf) and phase.buf.name in self.local:
                    allocs[phase.buf.name] = phase  # allocated inside the chunk loop of its phase
                elif isinstance(phase, Alloc) and self.hoist and self.tile(phase.buf):
                    setup.append(phase)
                else:
                    body.append(phase)
                continue
            body += self.phase(phase, allocs)
        loop = dataclasses.replace(outer, body=tuple(body))
        return setup + [dataclasses.replace(block, body=(loop,))]

    # ---- shapes --------------------------------------------------------------------------------------------------

    def wide(self, buf: Buf) -> bool:
        return len(buf.shape) == 2 and buf.shape[1] == self.F

    def tile(self, buf: Buf) -> bool:
        return buf.memory == "sbuf" and self.wide(buf) and buf.shape[0] > 1

    def is_row(self, buf: Buf) -> bool:
        return buf.memory == "sbuf" and self.wide(buf) and buf.shape[0] == 1

    def column(self, v: View) -> bool:
        return v.buf.memory != "hbm" and len(v.buf.shape) == 2 and v.buf.shape[1] == 1

    # ---- phases --------------------------------------------------------------------------------------------------

    def phases(self, body: tuple[Stmt, ...]) -> list["Stmt | list[Stmt]"]:
        """The loop body as column statements and allocations (as they are) and phases (lists of whole-row
        statements to run chunk by chunk)."""
        out: list[Stmt | list[Stmt]] = []
        cur: list[Stmt] = []
        pending: set[str] = set()  # columns a row reduction of the current phase makes
        for s in body:
            if isinstance(s, Alloc):
                out.append(s)
                continue
            if self.chunkable(s):
                reads = {v.buf.name for x in ir.walk((s,)) for v in ir.views(x)} - {_total(s)}
                if reads & pending:
                    out.append(cur)
                    cur, pending = [], set()
                cur.append(s)
                if _total(s):
                    pending.add(_total(s))
                continue
            if any(self.wide(v.buf) for x in ir.walk((s,)) for v in ir.views(x)):
                raise _NoChunk
            if cur and _independent(s, cur, pending):
                out.append(s)  # runs before the phase (a column turned into a row): the phase goes on
                continue
            if cur:
                out.append(cur)
                cur, pending = [], set()
            out.append(s)
        if cur:
            out.append(cur)
        return out

    def remade(self, phases: list["Stmt | list[Stmt]"]) -> set[str]:
        """Whole-row tiles written by one element-wise instruction (of tiles that stay whole and columns) and read
        in later phases: the instruction (without its row sums) is repeated at the start of each later phase that
        reads the tile (softmax over rows of 32768 fp32: exp(X - m) again in the output phase instead of a 128 KiB
        tile of it). `phases` is updated in place; returns the tiles' names."""
        lists = [p for p in phases if isinstance(p, list)]
        names: set[str] = set()
        for k, phase in enumerate(lists):
            for w in phase:
                if not isinstance(w, (Act, ir.Binary, ir.Scalar)) or w.dst != whole(w.dst.buf) \
                        or not self.tile(w.dst.buf):
                    continue
                tile = w.dst.buf
                later = [p for p in lists[k + 1:] if any(v.buf == tile for s in p for x in ir.walk((s,))
                                                         for v in ir.views(x))]
                writes = [s for p in lists for s in p if s is not w and _writes(s, tile)]
                if not later or writes or any(v.buf == tile for v in _reads(w)):
                    continue
                again = dataclasses.replace(w, total=None) if isinstance(w, Act) else w
                for p in later:
                    p.insert(0, again)
                names.add(tile.name)
        return names

    def chunkable(self, s: Stmt) -> bool:
        if isinstance(s, Loop):
            return all(self.chunkable(x) or isinstance(x, Alloc) for x in s.body)
        if isinstance(s, Reduce):
            return self.wide(s.src.buf) and self.column(s.dst)
        if isinstance(s, (Act, ir.Binary, ir.Scalar, ir.Copy, Dma, ir.Matmul)):
            dst = s.acc if isinstance(s, ir.Matmul) else s.dst
            return self.wide(dst.buf) or dst.buf.memory == "psum"
        return False

    def phase(self, stmts: list[Stmt], allocs: dict[str, Alloc]) -> list[Stmt]:
        """One phase: its partial sums' tiles, the chunk loop, then each partial folded into its column."""
        cc = Term("cc", self.C, "TILE_C")
        parts = self.F // self.C
        before: list[Stmt] = []
        after: list[Stmt] = []
        inner: list[Stmt] = []
        used = {v.buf.name for s in stmts for x in ir.walk((s,)) for v in ir.views(x)}
        for name, alloc in allocs.items():
            if name in used:
                buf = alloc.buf
                inner.append(dataclasses.replace(alloc, buf=dataclasses.replace(buf, shape=(buf.shape[0], self.C))))
        for name, (alloc, made) in self.built.items():
            if name in used:
                buf = alloc.buf
                inner += [dataclasses.replace(alloc, buf=dataclasses.replace(buf, shape=(buf.shape[0], self.C))),
                          self.stmt(made, cc)]
        for name in self.rows:
            if name in used:
                part = self.part(name)
                inner += [Alloc(part, line=stmts[0].line),
                          Dma(whole(part), self.view(self.rows[name], cc), stmts[0].line)]
        for s in stmts:
            if isinstance(s, (Act, Reduce)) and _total(s):
                col = s.total if isinstance(s, Act) else s.dst
                assert col is not None
                # a max/min of f16/bf16 values is one of them: its partials keep the dtype (exact), and a VectorE
                # tensor_reduce with 16-bit input and output streams at N/2 cycles (nki-spec 2.4), N with fp32 out
                narrow = isinstance(s, Reduce) and s.op in ("maximum", "minimum") and s.src.buf.dtype in ("f16", "bf16")
                dt = s.src.buf.dtype if narrow else "f32"
                partial = Buf(self.fresh(f"{_stem(col.buf.name)}_parts"), "sbuf", dt, (col.buf.shape[0], parts))
                before.append(Alloc(partial, line=s.line))
                at = View(partial, (ir.full(col.buf.shape[0]), Sl(Aff((Term("cc"),)), 1)))
                one = self.stmt(s, cc)
                if isinstance(one, Act):
                    inner.append(dataclasses.replace(one, total=at))
                    after.append(Reduce(col, whole(partial), "add", s.line))
                else:
                    assert isinstance(s, Reduce) and isinstance(one, Reduce)
                    inner.append(dataclasses.replace(one, dst=at))
                    after.append(Reduce(col, whole(partial), s.op, s.line))
            else:
                inner.append(self.stmt(s, cc))
        note = "for the columns (chunks of TILE_C): the rows stay in SBUF"
        return before + [Loop("cc", parts, tuple(inner), "affine", "", stmts[0].line, note)] + after

    def part(self, name: str) -> Buf:
        if name not in self.names:
            self.names[name] = self.fresh(f"{_stem(name.removesuffix('_row'))}_chunk")
        return Buf(self.names[name], "sbuf", self.rows[name].buf.dtype, (1, self.C))

    # ---- statements in the chunk loop ----------------------------------------------------------------------------

    def stmt(self, s: Stmt, cc: Term) -> Stmt:
        if isinstance(s, Loop):
            step = self.F // s.extent
            if s.extent * step != self.F or self.C % step:
                raise _NoChunk
            self.inner.add(s.var)
            return dataclasses.replace(s, extent=self.C // step, body=tuple(self.stmt(x, cc) for x in s.body))
        if isinstance(s, Alloc):
            return s
        changes: dict[str, Any] = {f.name: self.view(getattr(s, f.name), cc) for f in dataclasses.fields(s)
                                   if isinstance(getattr(s, f.name), View)}
        return dataclasses.replace(s, **changes)

    def view(self, v: View, cc: Term) -> View:
        if not self.wide(v.buf):
            return v
        col = v.idx[-1]
        if not isinstance(col, Sl) or col.step != 1:
            raise _NoChunk
        if v.buf.name in self.rows:
            buf = self.part(v.buf.name)
            local = True
        elif self.tile(v.buf) and v.buf.name in self.local:
            buf = dataclasses.replace(v.buf, shape=(v.buf.shape[0], self.C))
            local = True
        else:
            buf, local = v.buf, False
        if col.size == self.F and not col.start.terms and col.start.const == 0:
            start = Aff() if local else Aff((cc,))
            sl = Sl(start, self.C, 1, "" if local else "TILE_C")
            if local:
                return View(buf, v.idx[:-1] + (ir.full(self.C),))
            return View(buf, v.idx[:-1] + (sl,))
        if col.size > self.C or col.start.const or any(t.var not in self.inner for t in col.start.terms):
            raise _NoChunk
        return View(buf, v.idx[:-1] + (col if local else Sl(Aff((cc,) + col.start.terms), col.size, 1, col.name),))


def _total(s: Stmt) -> str:
    """The column a row reduction writes (an activation's reduce_res, a tensor_reduce of a whole-row tile)."""
    if isinstance(s, Act) and s.total is not None:
        return s.total.buf.name
    if isinstance(s, Reduce) and s.dst.buf.shape[1] == 1 and len(s.src.buf.shape) == 2 and s.src.buf.shape[1] > 1:
        return s.dst.buf.name
    return ""


def _independent(s: Stmt, phase: list[Stmt], totals: set[str]) -> bool:
    """Whether `s` (after the phase's statements) may run before them: it reads nothing they write (their row
    reductions' columns included) and touches nothing they touch."""
    touched = {v.buf.name for p in phase for x in ir.walk((p,)) for v in ir.views(x)}
    written = {b.name for b in touched_bufs(phase) if any(_writes(p, b) for p in phase)} | totals
    mine = {v.buf.name for x in ir.walk((s,)) for v in ir.views(x)}
    reads = {v.buf.name for x in ir.walk((s,)) for v in _reads(x)}
    return not (reads & written) and not ((mine - reads) & touched) and not (mine & written)


def touched_bufs(stmts: list[Stmt]) -> list[Buf]:
    return list({v.buf.name: v.buf for p in stmts for x in ir.walk((p,)) for v in ir.views(x)}.values())


def _writes(s: Stmt, buf: Buf) -> bool:
    """Whether a statement (or one nested in it) writes `buf`."""
    for x in ir.walk((s,)):
        dst = getattr(x, "acc", None) if isinstance(x, ir.Matmul) else getattr(x, "dst", None)
        if isinstance(dst, View) and dst.buf == buf:
            return True
    return False


def _reads(s: Stmt) -> list[View]:
    """The views a statement reads (its destination and an activation's row sums are written only)."""
    if isinstance(s, (Loop, Block, Alloc, ir.Reshape)):
        return []
    written = {id(getattr(s, f, None)) for f in ("dst", "total")}
    return [getattr(s, f.name) for f in dataclasses.fields(s)
            if isinstance(getattr(s, f.name), View) and id(getattr(s, f.name)) not in written]


def _stem(name: str) -> str:
    return name.removesuffix("_col").removesuffix("_tile")
