"""Tile sharing: a tile whose life starts after another tile's has ended takes that tile's SBUF space.

A row chain keeps whole rows in SBUF (build_rowchain.py); at long rows its tiles stop fitting: a layernorm over rows
of 8192 fp32 values holds X, the activations' discarded output, the centred rows and Y, 32 KiB per partition each.
But the discarded squares are dead once the variance is summed, and X is dead once the centred rows are made, so the
centred rows can live where the squares were and Y where X was. `share_tiles` does that within each loop body:

    X_tile = alloc; load X_tile            X_Y_tile = alloc; load X_Y_tile
    discard = alloc; act(discard, X_tile)  discard_Y_centred = alloc; act(discard_Y_centred, X_Y_tile)
    Y_centred = alloc; act(Y_centred, X)   act(discard_Y_centred, X_Y_tile)
    Y_tile = alloc; ... (Y_centred)        ... (discard_Y_centred) -> X_Y_tile
    store Y_tile                           store X_Y_tile

Two tiles share when they have the same shape and dtype (columns, one value per partition, never: they save
nothing worth a name that no longer says what the column holds), are allocated in the same loop body, and every statement
that touches the first comes strictly before every statement that touches the second (a statement that reads one
and writes the other keeps them apart: no in-place reasoning). Each iteration of the loop still has its own tiles,
as before, so the sharing adds only in-iteration order, which the statements already have. The pipeline applies it
only to a chain that does not fit without it, so kernels that fit are unchanged.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from tilec.compiler import ir
from tilec.compiler.ir import Alloc, Block, Buf, Loop, Stmt, View


def share_tiles(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    """`body` with tiles of disjoint lives merged, loop body by loop body (see the module docstring)."""
    fixed = {s.buf.name for s in ir.walk(body) if isinstance(s, ir.Reshape)} | \
        {s.base.name for s in ir.walk(body) if isinstance(s, ir.Reshape)}
    taken = {v.buf.name for s in ir.walk(body) for v in ir.views(s)} | \
        {s.buf.name for s in ir.walk(body) if isinstance(s, Alloc)}
    return _share(body, fixed, taken)


def _share(body: tuple[Stmt, ...], fixed: set[str], taken: set[str]) -> tuple[Stmt, ...]:
    body = tuple(dataclasses.replace(s, body=_share(s.body, fixed, taken)) if isinstance(s, (Loop, Block)) else s
                 for s in body)
    spans = _spans(body)
    kept: list[tuple[Buf, int]] = []  # (tile, index of its last use so far)
    into: dict[str, Buf] = {}  # a tile's name -> the tile whose space it takes (before the final names)
    for s in body:
        if not (isinstance(s, Alloc) and s.buf.memory == "sbuf" and not s.zero and s.buf.name not in fixed
                and s.buf.name in spans and s.buf.bytes_per_partition() > ir.DTYPE_BYTES[s.buf.dtype]):
            continue
        first, last = spans[s.buf.name]
        for i, (host, end) in enumerate(kept):
            if (host.shape, host.dtype) == (s.buf.shape, s.buf.dtype) and end < first:
                into[s.buf.name] = host
                kept[i] = (host, last)
                break
        else:
            kept.append((s.buf, last))
    if not into:
        return body
    final = _final_names(into, taken)
    renamed = {name: final[host.name] for name, host in into.items()}
    renamed.update({host.name: final[host.name] for host in into.values()})
    out = [_rename(s, renamed) for s in body if not (isinstance(s, Alloc) and s.buf.name in into)]
    return tuple(out)


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


def _final_names(into: dict[str, Buf], taken: set[str]) -> dict[str, Buf]:
    """A shared tile is named after every tile it holds (`X_tile` + `Y_tile` -> `X_Y_tile`), unique in the
    kernel."""
    members: dict[str, list[str]] = {}
    for name, host in into.items():
        members.setdefault(host.name, [host.name]).append(name)
    final: dict[str, Buf] = {}
    for host_name, names in members.items():
        suffix = "_tile" if all(n.endswith("_tile") for n in names) else ""
        stem = "_".join(n[: len(n) - len(suffix)] if suffix else n for n in names) + suffix
        name, k = stem, 1
        while name in taken:
            k += 1
            name = f"{stem}{k}"
        taken.add(name)
        host = next(h for h in into.values() if h.name == host_name)
        final[host_name] = dataclasses.replace(host, name=name)
    return final


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
