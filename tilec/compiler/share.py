"""Tile sharing: a tile whose life starts after another tile's has ended takes that tile's SBUF space.

A row chain keeps whole rows in SBUF (build_rowchain.py); at long rows its tiles stop fitting: a layernorm over rows
of 8192 fp32 values holds X, the activations' discarded output, the centred rows and Y, 32 KiB per partition each,
528 bytes over the budget. But the discarded output is dead once the variance is summed, before the centred rows
are made, so they can live in one tile:

    discard = alloc                          discard_Y_centred = alloc
    act(discard, X_tile) -> mean             act(discard_Y_centred, X_tile) -> mean
    act(discard, X_tile) -> variance         act(discard_Y_centred, X_tile) -> variance
    Y_centred = alloc; act(Y_centred, X)     act(discard_Y_centred, X_tile)
    act(Y_tile, Y_centred)                   act(Y_tile, discard_Y_centred)

Two tiles share when they have the same shape and dtype (columns, one value per partition, never: they save
nothing worth a name that no longer says what the column holds), are allocated in the same loop body, and every
statement that touches the first comes strictly before every statement that touches the second (a statement that
reads one and writes the other keeps them apart: no in-place reasoning). Each iteration of the loop still has its
own tiles, so the sharing adds only in-iteration order, which the statements already have. Pairs are merged one at
a time until the body fits the budget; the pipeline calls it only for a chain that does not fit without it, so
kernels that fit are unchanged.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from tilec.compiler import ir, passes
from tilec.compiler.ir import Alloc, Block, Buf, Loop, Stmt, View


def share_tiles(body: tuple[Stmt, ...], budget: int) -> tuple[Stmt, ...]:
    """`body` with pairs of tiles of disjoint lives merged (see the module docstring) until its peak SBUF use per
    partition fits `budget`, or no pair is left. The pair merged first is the one whose merged life is shortest:
    merging the tile loaded first in an iteration with the tile stored last would make the next iteration's load
    wait for this one's store, so that pair comes last."""
    fixed = {s.buf.name for s in ir.walk(body) if isinstance(s, ir.Reshape)} | \
        {s.base.name for s in ir.walk(body) if isinstance(s, ir.Reshape)}
    taken = {v.buf.name for s in ir.walk(body) for v in ir.views(s)} | \
        {s.buf.name for s in ir.walk(body) if isinstance(s, Alloc)}
    while passes.peak_usage(body)[0] > budget:
        best = min(_pairs(body, (), fixed), default=None)
        if best is None:
            break
        _, _, path, a, b = best
        body = _at(body, path, lambda stmts: _merge(stmts, a, b, taken))
    return body


def _pairs(body: tuple[Stmt, ...], path: tuple[int, ...], fixed: set[str]):
    """(merged span, -bytes, path of the loop body, earlier tile, later tile) for every pair that may share, in
    every loop body."""
    for i, s in enumerate(body):
        if isinstance(s, (Loop, Block)):
            yield from _pairs(s.body, path + (i,), fixed)
    spans = _spans(body)
    tiles = [s.buf for s in body if isinstance(s, Alloc) and s.buf.memory == "sbuf" and not s.zero
             and s.buf.name not in fixed and s.buf.name in spans
             and s.buf.bytes_per_partition() > ir.DTYPE_BYTES[s.buf.dtype]]
    for k, a in enumerate(tiles):
        for b in tiles[k + 1:]:
            if (a.shape, a.dtype) == (b.shape, b.dtype) and spans[a.name][1] < spans[b.name][0]:
                yield spans[b.name][1] - spans[a.name][0], -a.bytes_per_partition(), path, a.name, b.name


def _at(body: tuple[Stmt, ...], path: tuple[int, ...], fn) -> tuple[Stmt, ...]:
    """`body` with the statement list at `path` (indices of nested loops and blocks) replaced by fn(list)."""
    if not path:
        return fn(body)
    i = path[0]
    inner = body[i]
    assert isinstance(inner, (Loop, Block))
    return body[:i] + (dataclasses.replace(inner, body=_at(inner.body, path[1:], fn)),) + body[i + 1:]


def _merge(body: tuple[Stmt, ...], a: str, b: str, taken: set[str]) -> tuple[Stmt, ...]:
    """Tile `b` takes tile `a`'s space; the shared tile is named after both (`X_tile` + `Y_tile` -> `X_Y_tile`),
    unique in the kernel."""
    host = next(s.buf for s in body if isinstance(s, Alloc) and s.buf.name == a)
    suffix = "_tile" if a.endswith("_tile") and b.endswith("_tile") else ""
    stem = f"{a[:len(a) - len(suffix)]}_{b}" if suffix else f"{a}_{b}"
    name, k = stem, 1
    while name in taken:
        k += 1
        name = f"{stem}{k}"
    taken.add(name)
    shared = dataclasses.replace(host, name=name)
    renamed = {a: shared, b: shared}
    return tuple(_rename(s, renamed) for s in body if not (isinstance(s, Alloc) and s.buf.name == b))


def _spans(body: tuple[Stmt, ...]) -> dict[str, tuple[int, int]]:
    """Each buffer's (first, last) index of a statement of `body` that touches it (nested statements count as
    their enclosing one; allocations do not count)."""
    spans: dict[str, tuple[int, int]] = {}
    for i, s in enumerate(body):
        for x in ir.walk((s,)):
            for v in ir.views(x):
                first, _ = spans.get(v.buf.name, (i, i))
                spans[v.buf.name] = (first, i)
    return spans


def _rename(s: Stmt, renamed: dict[str, Buf]) -> Stmt:
    if isinstance(s, (Loop, Block)):
        return dataclasses.replace(s, body=tuple(_rename(x, renamed) for x in s.body))
    if isinstance(s, Alloc):
        return dataclasses.replace(s, buf=renamed.get(s.buf.name, s.buf))
    changes: dict[str, Any] = {f.name: _view(getattr(s, f.name), renamed) for f in dataclasses.fields(s)
                               if isinstance(getattr(s, f.name), View)}
    return dataclasses.replace(s, **changes)


def _view(v: View, renamed: dict[str, Buf]) -> View:
    return dataclasses.replace(v, buf=renamed[v.buf.name]) if v.buf.name in renamed else v
