"""A row tile's loads on a DMA trigger stream of their own, apart from its stores.

A DMA is triggered from an engine's instruction stream, in that stream's program order: the model puts a load on the
stream of the engine that first reads what it loaded and a store on the stream of the engine that produced what it
stores (tilec/perf/schedule.py, "DMA trigger streams"). When VectorE both first reads a row tile's loads and makes
the tiles the loop stores, the loads of the next row tiles are triggered behind this tile's stores, which wait for
all of this tile's work: the loop runs one tile at a time, with the DMA queues idle in between. A residual add
before an RMSNorm (`h = X + R`: VectorE adds the two loaded tiles, VectorE scales the result by g) ran so at 1.85x
its DMA floor on the model (M = 2048, N = 1024 fp32), 1.10x with the add on GpSimdE.

`loads_apart` moves such a first reader, a tensor_tensor of two SBUF tiles, to GpSimdE (which reads SBUF only and
runs tensor_tensor like VectorE [NISA tensor_tensor engine=, target.py]) when GpSimdE has no other work in the loop:
the loads then have GpSimdE's stream, the stores keep VectorE's, and VectorE sheds a pass.
"""
from __future__ import annotations

import dataclasses
import math

from tilec.compiler import ir
from tilec.compiler.expr_instrs import shared_binary
from tilec.compiler.ir import Binary, Dma, Loop, Stmt
from tilec.compiler.names import unique
from tilec.target import Target


def loads_apart(stmts: list[Stmt]) -> list[Stmt]:
    """`stmts` with every loop (at any depth) whose loads and stores share VectorE's stream rewritten as above."""
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, (Loop, ir.Block)):
            s = dataclasses.replace(s, body=tuple(loads_apart(list(s.body))))
            if isinstance(s, Loop):
                s = _apart(s)
        out.append(s)
    return out


def _apart(loop: Loop) -> Loop:
    body = list(ir.walk(loop.body))
    loaded = {s.dst.buf.name for s in body if isinstance(s, Dma) and s.src.buf.memory == "hbm"}
    stored = [s.src.buf.name for s in body if isinstance(s, Dma) and s.dst.buf.memory == "hbm"]
    if not loaded or not stored or any(ir.engine_of(s) == "gpsimd" for s in body):
        return loop
    readers: dict[str, Stmt] = {}  # loaded buffer -> the first statement reading it (a store, too)
    for s in body:
        for v in ir.views(s)[1:] if not isinstance(s, ir.Matmul) else ir.views(s):
            if v.buf.name in loaded:
                readers.setdefault(v.buf.name, s)
    producers = _stored_producers(body)
    first = {id(s): s for s in readers.values()}
    if not producers or any(ir.engine_of(p) != "vector" for p in producers) or not first or \
            any(not _movable(s) for s in first.values()):
        return loop
    return dataclasses.replace(loop, body=tuple(_moved(loop.body, set(first))))


def _movable(s: Stmt) -> bool:
    return isinstance(s, Binary) and not s.engine and s.scale0 == 1.0 and \
        all(v.buf.memory == "sbuf" for v in (s.dst, s.a, s.b))


def _moved(body: tuple[Stmt, ...], ids: set[int]) -> list[Stmt]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, (Loop, ir.Block)):
            s = dataclasses.replace(s, body=tuple(_moved(s.body, ids)))
        elif isinstance(s, Binary) and id(s) in ids:
            s = dataclasses.replace(s, engine="gpsimd")
        out.append(s)
    return out


# ---- columns loaded ahead ------------------------------------------------------------------------------------------

AHEAD_BYTES = 2048  # per partition: the gathered columns of one loop (a few hundred tiles' columns: 512 fp32)


def columns_ahead(k: ir.Kernel) -> ir.Kernel:
    """Every loop that loads a (P, 1) column of an input each iteration (`a[pt * P:(pt + 1) * P]`, the scalar per
    partition of a broadcast `a[i] * b[j]`, a bias column) loads all of them before it, into one (P, T) tile read
    column pt by iteration pt. Each such load depends on nothing, so it is triggered at the kernel's start; inside
    the loop it was triggered on the stream of the engine reading it, behind the previous iteration's stores when
    that engine also made what they store (an outer product's ScalarE: its next column waited for this tile's
    store, 2.22x the DMA floor at 2048 x 2048 fp32, 1.6x with the columns ahead)."""
    written = {s.dst.buf.name for s in ir.walk(k.body) if isinstance(s, Dma) and s.dst.buf.memory == "hbm"}
    taken = {b.name for b in k.params + k.outputs} | {s.buf.name for s in ir.walk(k.body) if isinstance(s, ir.Alloc)}
    return dataclasses.replace(k, body=_ahead(k.body, written, taken))


def _ahead(body: tuple[Stmt, ...], written: set[str], taken: set[str]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, (Loop, ir.Block)):
            s = dataclasses.replace(s, body=_ahead(s.body, written, taken))
        if isinstance(s, Loop):
            for load in _column_loads(s, written):
                pre, s = _gathered(s, load, taken)
                out += pre
        out.append(s)
    return tuple(out)


def _column_loads(loop: Loop, written: set[str]) -> list[Dma]:
    """The loop's own (not nested) loads of a column of an input that nothing else in the loop writes."""
    allocs = {s.buf.name: s for s in loop.body if isinstance(s, ir.Alloc)}
    inside = {s.buf.name for s in ir.walk(loop.body) if isinstance(s, (ir.Alloc, ir.Reshape))}
    writes: dict[str, int] = {}
    for s in ir.walk(loop.body):
        for v in ir.views(s)[:1] if not isinstance(s, ir.Matmul) else ():
            writes[v.buf.name] = writes.get(v.buf.name, 0) + 1
    found = []
    for s in loop.body:
        if not isinstance(s, Dma) or s.src.buf.memory != "hbm" or s.src.buf.name in written | inside:
            continue  # (a source viewed inside the loop would be read before its view exists)
        col = s.dst.buf
        alloc = allocs.get(col.name)
        if alloc is None or alloc.zero or col.memory != "sbuf" or len(col.shape) != 2 or col.shape[1] != 1 or \
                s.dst != ir.whole(col) or writes.get(col.name) != 1 or loop.var not in ir.view_vars(s.src) or \
                s.src.perm or s.src.blocks or loop.extent * ir.DTYPE_BYTES[col.dtype] > AHEAD_BYTES:
            continue
        if _behind_stores(loop, col.name):
            found.append(s)
    return found


def _behind_stores(loop: Loop, name: str) -> bool:
    """Whether loading buffer `name` in the loop waits behind its stores and nothing else would: the engine that
    first reads it makes a tile the loop stores, and no other load of the loop is first read by that engine (that
    load would wait behind the same stores: a row bias beside its row tile's load gains nothing on the model)."""
    body = list(ir.walk(loop.body))
    first = _first_readers(body)
    if name not in first:
        return False
    eng = ir.engine_of(first[name])
    if any(ir.engine_of(r) == eng for b, r in first.items() if b != name and not _column(b, body)):
        return False
    return any(ir.engine_of(p) == eng for p in _stored_producers(body))


def _stored_producers(body: list[Stmt]) -> list[Stmt]:
    """The statement that last wrote each tile a store of `body` reads (in program order, before that store)."""
    writers: dict[str, Stmt] = {}  # buffer -> its latest writer so far
    producers: list[Stmt] = []
    for s in body:
        if isinstance(s, Dma) and s.dst.buf.memory == "hbm" and s.src.buf.name in writers:
            producers.append(writers[s.src.buf.name])
        if ir.views(s) and not isinstance(s, ir.Matmul):
            writers[ir.views(s)[0].buf.name] = s
        if isinstance(s, ir.Act) and s.total is not None:  # the row sums an activation writes on the side
            writers[s.total.buf.name] = s
    return producers


def _first_readers(body: list[Stmt]) -> dict[str, Stmt]:
    """Per buffer loaded from HBM in `body`: the first statement that reads it."""
    loaded = {s.dst.buf.name for s in body if isinstance(s, Dma) and s.src.buf.memory == "hbm"}
    first: dict[str, Stmt] = {}
    for s in body:
        if isinstance(s, Dma):
            continue
        for v in ir.views(s) if isinstance(s, ir.Matmul) else ir.views(s)[1:]:
            if v.buf.name in loaded:
                first.setdefault(v.buf.name, s)
    return first


def _column(name: str, body: list[Stmt]) -> bool:
    return any(isinstance(s, Dma) and s.dst.buf.name == name and len(s.dst.buf.shape) == 2 and
               s.dst.buf.shape[1] == 1 for s in body)


def _gathered(loop: Loop, load: Dma, taken: set[str]) -> tuple[list[Stmt], Loop]:
    col = load.dst.buf
    name = unique(f"{col.name}s", taken)
    cols = ir.Buf(name, "sbuf", col.dtype, (col.shape[0], loop.extent))
    at = ir.Sl(ir.aff(loop.var), 1)
    ahead = Loop(loop.var, loop.extent, (Dma(ir.View(cols, (ir.full(col.shape[0]), at)), load.src, load.line),),
                 "affine", loop.extent_name, loop.line, "the columns loaded ahead")
    body = tuple(s for s in loop.body if s is not load and not (isinstance(s, ir.Alloc) and s.buf == col))
    return [ir.Alloc(cols, line=load.line), ahead], dataclasses.replace(loop, body=_renamed(body, col, cols, loop.var))


def _renamed(body: tuple[Stmt, ...], col: ir.Buf, cols: ir.Buf, var: str) -> tuple[Stmt, ...]:
    """`body` with every view of the column `col` a view of column `var` of `cols`."""
    def view(v: ir.View) -> ir.View:
        p, f = v.idx
        at = ir.Sl(ir.aff(var).plus(f.start), f.size, f.step, f.name) if isinstance(f, ir.Sl) else ir.aff(var).plus(f)
        return ir.View(cols, (p, at), v.perm, v.blocks)

    out: list[Stmt] = []
    for s in body:
        if isinstance(s, (Loop, ir.Block)):
            s = dataclasses.replace(s, body=_renamed(s.body, col, cols, var))
        else:
            fields: dict[str, object] = {k: view(v) for k, v in vars(s).items()
                                         if isinstance(v, ir.View) and v.buf == col}
            s = dataclasses.replace(s, **fields) if fields else s  # type: ignore[arg-type]
        out.append(s)
    return tuple(out)


# ---- one tile's work cut between two engines -----------------------------------------------------------------------


def cut_apart(k: ir.Kernel, target: Target) -> ir.Kernel:
    """Every innermost loop whose one VectorE tensor_tensor both first reads the loop's loads and makes what it
    stores (`Y[b, s, d] = X[b, s, d] + P[s, d]` with P's tile loaded once for every b: load X, add, store Y per b)
    with that instruction's columns cut between GpSimdE (first in program order) and VectorE (shared_binary): the
    loads then issue on GpSimdE's stream, the stores on VectorE's, and the next iteration's load no longer waits
    behind this iteration's store (which waits for the add). Only where GpSimdE has nothing else in the loop and
    the loop loads one tile (the add's other operand is loaded outside it, reused by every iteration)."""
    return dataclasses.replace(k, body=_cut_loops(k.body, target))


def _cut_loops(body: tuple[Stmt, ...], target: Target) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, (Loop, ir.Block)):
            s = dataclasses.replace(s, body=_cut_loops(s.body, target))
            if isinstance(s, Loop) and not any(isinstance(x, Loop) for x in s.body):
                s = _cut(s, target)
        out.append(s)
    return tuple(out)


def _cut(loop: Loop, target: Target) -> Loop:
    body = list(ir.walk(loop.body))
    if any(ir.engine_of(s) == "gpsimd" for s in body):
        return loop
    first = _first_readers(body)
    readers = {id(s): s for s in first.values()}
    producers = {id(s): s for s in _stored_producers(body)}
    if len(first) != 1 or readers.keys() != producers.keys():
        return loop  # (two loads per tile, `a + b`: their bytes bound it, cut or not: vector add 24.0 -> 24.2 us)
    work = next(iter(readers.values()))
    if not _movable(work) or work not in loop.body:
        return loop
    assert isinstance(work, Binary)
    parts = shared_binary(work.dst, work.a, work.b, work.op, work.line, target)
    if len(parts) != 2:
        return loop  # (too narrow, all 16-bit, or not a plain 2-D tile)
    at = next(n for n, s in enumerate(loop.body) if s is work)
    return dataclasses.replace(loop, body=loop.body[:at] + tuple(parts) + loop.body[at + 1:])


# ---- loads triggered by the Sync engine ------------------------------------------------------------------------------

def loads_on_sync(k: ir.Kernel, t: Target) -> ir.Kernel:
    """A loop whose loads are first read by the engine that makes the tiles it stores: those loads are issued by the
    Sync engine (NKI 0.6 `dge_mode=hwdge, engine=nisa.engine.sync`, NeuronCore-v3: Target.hwdge), so the next tile's
    load no longer waits on that engine's stream behind this tile's store (batch norm at inference: one VectorE
    multiply-add a tile). Each such trigger takes the Sync engine Target.hwdge_issue_ns, so only loops whose
    iteration moves enough bytes to cover their loads' issue times; loads that cast (HWDGE copies the dtype as it
    is) and loops with matmuls (whose loads feed TensorE, not the storing engine) keep the compiler's choice."""
    if not t.hwdge:
        return k
    return dataclasses.replace(k, body=tuple(_synced(s, t) for s in k.body))


def _synced(s: Stmt, t: Target) -> Stmt:
    if isinstance(s, ir.Block):
        return dataclasses.replace(s, body=tuple(_synced(x, t) for x in s.body))
    if not isinstance(s, Loop):
        return s
    body = list(ir.walk(s.body))
    if any(isinstance(x, (ir.Matmul, ir.Transpose)) for x in body):
        return s
    makers = {ir.engine_of(p) for p in _stored_producers(body)}
    first = _first_readers(body)
    picked = {id(d) for d in body if isinstance(d, Dma) and d.src.buf.memory == "hbm" and d.dst.buf.memory == "sbuf"
              and d.src.buf.dtype == d.dst.buf.dtype and d.dst.buf.name in first
              and ir.engine_of(first[d.dst.buf.name]) in makers}
    moved = sum(_bytes(d) for d in body if isinstance(d, Dma))
    if not picked or moved / min(t.dma_engines * t.dma_engine_bw, t.hbm_bw) < len(picked) * t.hwdge_issue_ns:
        return s
    return dataclasses.replace(s, body=_triggered(s.body, picked))


def _bytes(d: Dma) -> int:
    side = d.dst if d.dst.buf.memory != "hbm" else d.src
    return math.prod(side.shape()) * ir.DTYPE_BYTES[side.buf.dtype]


def _triggered(body: tuple[Stmt, ...], picked: set[int]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, (Loop, ir.Block)):
            s = dataclasses.replace(s, body=_triggered(s.body, picked))
        elif isinstance(s, Dma) and id(s) in picked:
            s = dataclasses.replace(s, trigger="sync")
        out.append(s)
    return tuple(out)
