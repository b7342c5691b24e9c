"""The transpose rule (`Y[b, j, i] = X[b, i, j]`, rules.transpose) and what it sees of a nest (permute, Permute);
split from rules.py, which re-exports it."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tilec.compiler import layout
from tilec.compiler.fn_chain import nest_read
from tilec.compiler.names import unique
from tilec.compiler.nest import Access, Assign, Kernel, Load, Loop, fmt_expr, loads
from tilec.compiler.rules_base import Prim, _at, _plain, _ragged_parts, prim
from tilec.compiler.schedule import TransposePlan
from tilec.target import Target


# ---- transposes and permutes ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Permute:
    """What the transpose rule sees: Y[batch, second, first] = X[batch, first, second] over a perfect nest."""
    top: Loop
    stmt: Assign
    src: Access  # the read of X
    batch: tuple[str, ...]
    first: tuple[str, ...]
    second: tuple[str, ...]
    extents: dict[str, int]
    lines: dict[str, int]
    middle: bool = False  # the batch dimensions sit between the two swapped ones (no [B, M, N] views)


def _one_copy(k: Kernel, fns: bool = False) -> tuple[list[Loop], Assign, Access] | None:
    """(the perfect loop chain, its one assignment, the read it copies) when the nest is a single copy `Y[..] =
    X[..]` inside one perfect loop chain (what the permute and copy rules start from), else None. With `fns`, the
    copy may do work on the way (`Y[..] = relu(X[..])`, `s[j] * X[..]`: fn_chain.py, the transpose's eviction)."""
    tops = [s for s in k.body if isinstance(s, Loop)]
    if len(tops) != 1:
        return None
    chain = layout.perfect_chain(tops[0])
    body = chain[-1].body
    if len(body) != 1 or not isinstance(body[0], Assign):
        return None
    out = _plain(body[0].dst.index)
    read = nest_read(body[0].expr, [lp.var for lp in chain], out) if fns else body[0].expr
    return (chain, body[0], read.access) if isinstance(read, Load) else None


def permute(k: Kernel) -> Permute | None:
    """The nest's permute structure, or None when it is not one copy (activations allowed) that swaps two runs
    after a batch."""
    found = _one_copy(k, fns=True)
    if found is None:
        return None
    chain, stmt, read = found
    src, out = _plain(read.index), _plain(stmt.dst.index)
    if src is None or out is None or sorted(src) != sorted(out) or src == out:
        return None
    n = next(i for i, (x, y) in enumerate(zip(src, out)) if x != y)
    rest, want = src[n:], out[n:]
    cut = next((c for c in range(1, len(rest)) if rest[c:] + rest[:c] == want), None)
    swap = [p for p, (x, y) in enumerate(zip(src, out)) if x != y]
    if cut is None and len(swap) == 2:  # two single dimensions swap around dimensions that stay in place
        a, c = src[swap[0]], src[swap[1]]
        return Permute(chain[0], stmt, read, tuple(v for v in out if v not in (a, c)), (a,), (c,),
                       {lp.var: lp.extent for lp in chain}, {lp.var: lp.line for lp in chain}, middle=True)
    if cut is None:
        return None
    return Permute(chain[0], stmt, read, tuple(src[:n]), tuple(rest[:cut]), tuple(rest[cut:]),
                   {lp.var: lp.extent for lp in chain}, {lp.var: lp.line for lp in chain})


def transpose(k: Kernel, target: Target, params: TransposePlan) -> list[Prim] | None:
    """The transpose rule: super-tiles of (BI x BJ) blocks of TI x TJ; a strip of BI block rows loaded (one DMA per
    block row), BI*BJ block transposes (TensorE through PSUM, or DMA transposes straight from HBM), a strip of BJ
    block columns stored. A batched or N-D permute sees X as [B, M, N] (views) and repeats that per batch. A ragged
    plan (sizes without a large divisor, 521 x 257) cuts the rows and columns into the multiples of the block and
    the rest (up to four regions), each scheduled the same way."""
    n = permute(k)
    if n is None:
        return None
    size = lambda vs: math.prod(n.extents[v] for v in vs)  # noqa: E731
    B, M, N = size(n.batch), size(n.first), size(n.second)
    vi, vj = n.first[0], n.second[0]
    prims: list[Prim] = []
    i, j, X, Y, top = vi, vj, n.src.buf, n.stmt.dst.buf, ""
    out = _plain(n.stmt.dst.index) or []
    unbatched = out[len(n.batch):]  # like Y, or like one batch of Y: fn_chain's tiles
    tiled = [a for a in loads(n.stmt.expr) if a != n.src and _plain(a.index) in (out, unbatched)]
    twice = any(a.buf == n.src.buf for a in tiled)  # X[b, i, j] beside X[b, j, i]: one view could not show both
    if n.middle or (twice and len(n.first) == len(n.second) == 1):
        # the batch loops outermost; the accesses keep their shapes (strided 2-D slices per batch)
        order = list(n.batch) + [vi, vj]
        if [lp.var for lp in layout.perfect_chain(n.top)] != order:
            prims.append(prim("reorder", *order))
        top = n.batch[0] if n.batch else ""
    elif n.batch or len(n.first) > 1 or len(n.second) > 1:  # views: X as [B, M, N], Y as [B, N, M]
        order = list(n.batch + n.first + n.second)
        if [lp.var for lp in layout.perfect_chain(n.top)] != order:
            prims.append(prim("reorder", *order))
        loops = ((("bt", B),) if B > 1 else ()) + (("i", M), ("j", N))
        notes = ((f"for {n.batch[0]} (batch)",) if B > 1 else ()) + ("", "")
        lines = ((n.lines[n.batch[0]],) if B > 1 else ()) + (n.lines[vi], n.lines[vj])
        # loops of extent 1 leave open which old loops a new one iterates: say it (batch, first run, second run)
        groups = ((tuple(n.batch),) if B > 1 else ()) + (tuple(n.first), tuple(n.second))
        unit = 1 in (n.extents[v] for v in order)
        prims.append(prim("reshape", order[0], loops, notes=notes, lines=lines, **({"groups": groups} if unit else {})))
        i, j, X, Y, top = "i", "j", f"{X}_v", f"{Y}_v", "bt" if B > 1 else ""
    elif [lp.var for lp in layout.perfect_chain(n.top)] != [vi, vj]:
        prims.append(prim("reorder", vi, vj))
    rows, cols = _ragged_parts(M, params.tile, params.bi), _ragged_parts(N, params.tj, params.bj)
    if len(rows) > 1:
        prims.append(prim("cut", i, rows[1][0]))
    if len(cols) > 1:
        prims += [prim("cut", f"{j}{_at(len(rows), r, 1)}", cols[1][0], root=f"{i}{_at(len(rows), r, 1)}")
                  for r in range(len(rows))]
    taken = set(k.buffers())  # strips named apart from the user's tensors (`A_strip` may be one)
    strips = (unique(f"{n.src.buf}_strip", taken), unique(f"{n.stmt.dst.buf}_strip", taken))
    vecs = {a.buf: set(_plain(a.index) or ()) <= set(n.first)  # work on the way (fn_chain): over the first run?
            for a in loads(n.stmt.expr) if a.buf != n.src.buf and a not in tiled}
    views = X != n.src.buf  # the reshape saw every buffer through a view BUF_v
    vectors = tuple((f"{v}_v" if views else v, unique(f"{v}_col", taken), first) for v, first in vecs.items())
    once = {a.buf for a in tiled if _plain(a.index) == unbatched and unbatched != out}  # read by every batch
    tiles = tuple((f"{v}_v" if views else v, unique(f"{v}_tile", taken)) for v in dict.fromkeys(a.buf for a in tiled))
    # a tile every batch reads (c[i, j] of A[b, i, j] * A[b, j, i] + c[j, i]) is loaded once per super-tile when the
    # batch loop runs inside the super-tiles: one batch loop, the accesses kept (no views), one region
    inner = n.batch[0] if once and len(n.batch) == 1 and not views and len(rows) == len(cols) == 1 else ""
    top = "" if inner else top
    if any(vecs.values()) and params.method == "dma":  # work on the source block needs it on chip: TensorE
        params = replace(params, method="pe")
    ci, cj = ("TILE", "TILE") if params.tile == params.tj else ("TILE_I", "TILE_J")
    for r, rp in enumerate(rows):
        for c, cp in enumerate(cols):
            suffix = _at(len(rows), r, len(cols), c)
            tag = "" if r == c == 0 else f"_{'ab'[r]}{'ab'[c]}"
            names = (ci if rp[2] == params.tile and r == 0 else "", cj if cp[2] == params.tj and c == 0 else "")
            prims += _region(n, params, (i + suffix, j + suffix), (rp, cp), names, suffix, tag, (X, Y), strips,
                             k.buffers()[n.src.buf].dtype, vectors, tiles, (inner, once))
    work = "" if isinstance(n.stmt.expr, Load) else f" computing {fmt_expr(n.stmt.expr)}"  # fn_chain.py
    label = f"{n.stmt.dst.buf} = transpose of {n.src.buf}{work}"
    if params.ragged:
        return prims + [prim("block", top, f"{label}, ragged ({M}x{N})")]
    return prims[:-1] + [prim("block", top, f"{label} by {params.tile}x{params.tj} blocks")]


def _region(n: Permute, params: TransposePlan, loops: tuple[str, str], parts, names: tuple[str, str], suffix: str,
            tag: str, bufs: tuple[str, str], strips: tuple[str, str], src_dtype: str,
            vectors: tuple[tuple[str, str, bool], ...] = (), tiles: tuple[tuple[str, str], ...] = (),
            inner: tuple[str, set[str]] = ("", set())) -> list[Prim]:
    """The schedule of one region: blocks of TI x TJ, strips of BI x BJ blocks, strips staged, blocks tensorized.
    `tiles`: (buffer, strip name) of reads indexed like the output (or one batch of it), staged like its strip (read
    on the eviction). `inner`: (the batch loop run inside the super-tiles, the tiles loaded once per super-tile
    there), or ("", ..)."""
    (i, j), ((r0, M, TI, BI), (c0, N, TJ, BJ)), (ci, cj) = loops, parts, names
    vi, vj = n.first[0], n.second[0]
    at = lambda v: v + suffix  # noqa: E731
    prims = [prim("split", i, TI, outer=at("i_o"), inner=at("i_i"), name=ci, note=f"for {vi} (blocks of {ci or TI})"),
             prim("split", at("i_o"), BI, outer=at("bi"), inner=at("ai"), note=f"for {vi} (strips of BI blocks)"),
             prim("split", j, TJ, outer=at("j_o"), inner=at("j_i"), name=cj, note=f"for {vj} (blocks of {cj or TJ})"),
             prim("split", at("j_o"), BJ, outer=at("bj"), inner=at("bj2"), note=f"for {vj} (strips of BJ blocks)"),
             prim("reorder", *map(at, ("bi", "bj", "ai", "bj2", "i_i", "j_i"))),
             prim("partition", at("i_i"))]
    batch, once = inner
    if batch:
        prims.append(prim("reorder", *map(at, ("bi", "bj")), batch, *map(at, ("ai", "bj2", "i_i", "j_i"))))
    per = batch or at("bj")  # where the per-batch strips are staged
    dma = params.method == "dma"
    X, Y = bufs
    twice = any(buf == X for buf, _ in tiles)
    source = prim("stage_grouped", X, per, ((at("i_i"),), (at("ai"),), (at("bj2"), at("j_i"))),
                  name=strips[0] + tag, **({"unlike": Y} if twice else {}))
    if twice and not dma:  # X[i, j] beside X[j, i]: told apart by their indices (like Y's store or not), before Y's
        prims.append(source)
    for buf, name in tiles:
        like_y = ((at("j_i"),), (at("bj2"),), (at("ai"), at("i_i")))  # Y's strip's groups
        prims.append(prim("stage_grouped", buf, at("bj") if buf in once else per, like_y, name=name + tag,
                          **({"like": Y} if buf == X else {})))
    # a DMA transpose copies without casting (src.dtype == dst.dtype [ISA6 dma_transpose]): its strip keeps the
    # source dtype and the store's dma_copy converts; the PE path converts on the PSUM -> SBUF copy
    prims.append(prim("stage_grouped", Y, per, ((at("j_i"),), (at("bj2"),), (at("ai"), at("i_i"))),
                      into=False, name=strips[1] + tag, dtype=src_dtype if dma else ""))
    if not dma and not twice:
        prims.append(source)
    for vec, name, first in vectors:  # a column per block of the partitions of the source (first) or the result
        groups = ((at("i_i"),), (at("ai"),)) if first else ((at("j_i"),), (at("bj2"),))
        prims.append(prim("stage_grouped", vec, at("bj"), groups, name=name + tag, dtype="f32"))
    part = f"rows {r0}..{r0 + M} x columns {c0}..{c0 + N} by {TI}x{TJ} blocks"
    return prims + [prim("tensorize", at("i_i"), psum=f"{n.stmt.dst.buf}_tp{tag}"), prim("block", at("bi"), part)]
