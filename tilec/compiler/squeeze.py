"""The `squeeze` pass: drop dimensions of extent 1 so generated kernels read like hand-written NKI.

The builders share one layout per op kind, so a plain matmul comes out as a degenerate convolution: its tiles and
the HBM views the compiler makes carry dimensions of extent 1 (`A_T[:, k_t, 0, 0, i]`, `B.reshape((1, K, 1, N))`).
This pass owns removing them, after every scheduling pass and before the allocation report and codegen:

- an SBUF/PSUM tile the kernel allocates loses its free dimensions of extent 1; its partition dimension (the first)
  always stays, and so does one free dimension (the last) when all are 1: engines take 2-D operands;
- a compiler-made HBM view (Reshape) loses its dimensions of extent 1 (one stays if all are 1); a view left with its
  base's shape is no view at all: it goes, and its accesses read the kernel argument itself;
- every access to such a buffer drops the index at each removed position (0, or a 1-long slice: no information);
- an on-chip operand's other 1-long slices become single indices (`t[:, j:j + 1]` -> `t[:, j]`), so a squeezed tile
  and the views it meets keep one rank; again one free slice always stays (a (P, 1) column stays a column).

Kernel arguments, HBM intermediates (user tensors) and everything a dma_transpose touches (its axes follow the
rank of its source) keep their shapes. Only shapes change: the same instructions read and write the same bytes, so
the trace and the performance model see the same kernel.
"""
from __future__ import annotations

import dataclasses
from typing import Collection

from tilec.compiler.build_util import used_consts
from tilec.compiler.ir import Alloc, Block, Buf, Kernel, Loop, Reshape, Sl, Stmt, Transpose, View, views, walk

Plan = dict[str, tuple[Buf, tuple[int, ...]]]  # buffer name -> (the buffer that replaces it, dims it keeps)


def squeeze(k: Kernel) -> Kernel:
    """Unit dimensions leave the matmul's views and tiles (golden excerpt: tests/golden/compiler/passes/squeeze.txt):

        -  view B_v: hbm f32[1, 256, 1, 640] = B  # tl:7
        -    alloc A_T: sbuf f32[128, 2, 1, 1, 256]  # tl:9
        +    alloc A_T: sbuf f32[128, 2, 256]  # tl:9
        -          matmul C_acc[:128, :1, :320] += A_T[:128, k_t, 0, 0, i_t*TILE_I:+128].T @ B_tiles[:128, k_t, :1, j_t*TILE_J:+320]  # tl:9
        +          matmul C_acc[:128, :320] += A_T[:128, k_t, i_t*TILE_I:+128].T @ B_tiles[:128, k_t, j_t*TILE_J:+320]  # tl:9
    """
    fixed = _dma_transposed(k.body)
    plan = _plan(k.body, fixed)
    body = _body(k.body, plan, fixed)
    return dataclasses.replace(k, body=body, consts=tuple(used_consts(list(body), list(k.consts))))


def _dma_transposed(body: tuple[Stmt, ...]) -> set[str]:
    return {v.buf.name for s in walk(body) if isinstance(s, Transpose) and s.engine == "dma" for v in (s.dst, s.src)}


def kept_dims(shape: tuple[int, ...], lead: int, needed: Collection[int] = ()) -> tuple[int, ...]:
    """The first `lead` dims, every dim longer than 1, the `needed` ones, and the last dim if no dim past `lead`
    is left."""
    keep = [d for d, n in enumerate(shape) if d < lead or n > 1 or d in needed]
    if len(keep) == lead:
        keep.append(len(shape) - 1)
    return tuple(keep)


def _plan(body: tuple[Stmt, ...], fixed: set[str]) -> Plan:
    needed = _needed(body)
    plan: Plan = {}
    for s in walk(body):
        if isinstance(s, (Alloc, Reshape)) and s.buf.name not in fixed and _squeezable(s):
            on_chip = isinstance(s, Alloc)
            keep = kept_dims(s.buf.shape, 1 if on_chip else 0, needed.get(s.buf.name, ()) if on_chip else ())
            if len(keep) < len(s.buf.shape):
                shape = tuple(s.buf.shape[d] for d in keep)
                same_as_base = isinstance(s, Reshape) and shape == s.base.shape
                new = s.base if same_as_base and isinstance(s, Reshape) else dataclasses.replace(s.buf, shape=shape)
                plan[s.buf.name] = (new, keep)
    return plan


def _needed(body: tuple[Stmt, ...]) -> dict[str, set[int]]:
    """Per buffer, the unit dims some on-chip view slices as its only free slices: the last of them stays, so the
    operand keeps a free dimension (a (P, 1) view read by nc_transpose stays 2-D when all its tile's dims are 1)."""
    found: dict[str, set[int]] = {}
    for s in walk(body):
        for v in views(s):
            n = v.buf.shape
            free = [d for d, i in enumerate(v.idx) if d > 0 and isinstance(i, Sl)]
            if free and all(n[d] == 1 for d in free):
                found.setdefault(v.buf.name, set()).add(free[-1])
    return found


def _squeezable(s: Alloc | Reshape) -> bool:
    return isinstance(s, Reshape) or s.buf.memory != "hbm"  # an HBM Alloc is a user's intermediate tensor


def _body(body: tuple[Stmt, ...], plan: Plan, fixed: set[str]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, (Loop, Block)):
            out.append(dataclasses.replace(s, body=_body(s.body, plan, fixed)))
        elif isinstance(s, (Alloc, Reshape)):
            out += _declaration(s, plan)
        else:
            out.append(_stmt(s, plan, fixed))
    return tuple(out)


def _declaration(s: Alloc | Reshape, plan: Plan) -> list[Stmt]:
    """The statement with its squeezed buffer; none for a view squeezed to its base's shape (its accesses now read
    the base directly)."""
    if isinstance(s, Reshape) and s.base.name in plan:  # a view of a squeezed view: same element count
        s = dataclasses.replace(s, base=plan[s.base.name][0])
    if s.buf.name not in plan:
        return [s]
    new = plan[s.buf.name][0]
    return [dataclasses.replace(s, buf=new)] if new.name == s.buf.name else []


def _stmt(s: Stmt, plan: Plan, fixed: set[str]) -> Stmt:
    if isinstance(s, Transpose) and s.engine == "dma":
        return s
    changes = {f.name: _view(x, plan, fixed) for f in dataclasses.fields(s)
               if isinstance(x := getattr(s, f.name), View)}
    return dataclasses.replace(s, **changes)  # type: ignore[arg-type]  # the View fields of s's own kind, by name


def _view(v: View, plan: Plan, fixed: set[str]) -> View:
    if v.buf.name in plan:
        buf, keep = plan[v.buf.name]
        # a blocked axis steps along its dim, which is longer than 1 and so kept: renumbered like the dims
        blocks = tuple((keep.index(axis), count, step) for axis, count, step in v.blocks)
        v = dataclasses.replace(v, buf=buf, idx=tuple(v.idx[d] for d in keep), perm=_kept_axes(v, keep),
                                blocks=blocks)
    if v.buf.memory == "hbm" or v.buf.name in fixed:
        return v
    return View(v.buf, _points(v.idx))


def _kept_axes(v: View, keep: tuple[int, ...]) -> tuple[int, ...]:
    """A permuted view's order of its slices (ir.View.perm) once the slices at removed dims (1 long) are gone."""
    sliced = [d for d, i in enumerate(v.idx) if isinstance(i, Sl)]
    kept = [q for q, d in enumerate(sliced) if d in keep]
    return tuple(kept.index(q) for q in v.perm if q in kept)


def _points(idx: tuple) -> tuple:
    """1-long free slices -> single indices; if no longer free slice is left, the last 1-long one stays."""
    free = [d for d, i in enumerate(idx) if d > 0 and isinstance(i, Sl)]
    longer = [d for d in free if idx[d].size > 1]
    stay = set(longer) if longer else set(free[-1:])
    return tuple(i.start if d in free and d not in stay else i for d, i in enumerate(idx))


__all__ = ["squeeze", "kept_dims"]
