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

from tilec.compiler import ir
from tilec.compiler.ir import Binary, Dma, Loop, Stmt


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


def engine(s: Stmt) -> str:
    """The engine whose instruction stream runs `s` (dma for transfers)."""
    if isinstance(s, Dma):
        return "dma"
    if isinstance(s, (ir.Matmul, ir.Transpose)):
        return "dma" if getattr(s, "engine", "pe") == "dma" else "pe"
    if isinstance(s, ir.Act):
        return "scalar"
    if isinstance(s, (Binary, ir.Copy, ir.Scalar)):
        return s.engine or "vector"
    return "vector" if isinstance(s, ir.Reduce) else ""


def _apart(loop: Loop) -> Loop:
    body = list(ir.walk(loop.body))
    loaded = {s.dst.buf.name for s in body if isinstance(s, Dma) and s.src.buf.memory == "hbm"}
    stored = [s.src.buf.name for s in body if isinstance(s, Dma) and s.dst.buf.memory == "hbm"]
    if not loaded or not stored or any(engine(s) == "gpsimd" for s in body):
        return loop
    readers: dict[str, Stmt] = {}  # loaded buffer -> the first statement reading it
    writers: dict[str, Stmt] = {}  # buffer -> the last statement writing it before a store reads it
    producers: list[Stmt] = []
    for s in body:
        if isinstance(s, Dma) and s.dst.buf.memory == "hbm" and s.src.buf.name in writers:
            producers.append(writers[s.src.buf.name])
        reads = ir.views(s)[1:] if not isinstance(s, ir.Matmul) else ir.views(s)
        for v in reads:
            if v.buf.name in loaded and v.buf.name not in readers:
                readers[v.buf.name] = s
        if ir.views(s) and not isinstance(s, ir.Matmul):
            writers[ir.views(s)[0].buf.name] = s
        if isinstance(s, ir.Act) and s.total is not None:  # the row sums an activation writes on the side
            writers[s.total.buf.name] = s
    first = {id(s): s for s in readers.values()}
    if not producers or any(engine(p) != "vector" for p in producers) or not first or \
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
