"""Element-wise work on reads shifted along the last axis, `Y[i, j] = X[i, j + 1] - X[i, j]`: each row tile of X
loaded once with a halo of columns, and the shifted operands read as slices of that one SBUF tile.

permute_split.split_shifted_reads gives the element-wise rule operands indexed like the output by copying each
shifted (or cropped) read to an HBM temporary first (`X_at[i, j] = X[i, j + 1]`, `X_at2[i, j] = X[i, j]`); each
copy is an HBM -> HBM DMA (its bytes cross HBM twice), then the element-wise op reads both temporaries back: seven
units of traffic for a difference whose floor is two (gaps15 diff_adjacent 3.50x). Here the copies and the op are
built as one nest (X's leading dimensions flattened onto R rows, N its last):

    for t in range(R / TILE_P):                                    row tiles (the last, ragged one after the loop)
        X_tile[p, 0:F + h] = X[t*TILE_P + p, c0 + lo : c0 + lo + F + h]     one DMA: the columns and their halo
        Y_tile = X_tile[:, 1 - lo : 1 - lo + F] - X_tile[:, 0 - lo : 0 - lo + F]   (each shift c: offset c - lo)
        Y[t*TILE_P + p, c0 : c0 + F] = Y_tile

with lo and hi the smallest and largest shift, h = hi - lo, and F the whole output row when it fits (else column
tiles of F). Operands that are read plainly are loaded as tiles of their own. A nest of one column tile and an even
number of row tiles is software-pipelined at its loads (pair_tiles.skew_row_tiles), as element-wise nests are.

Taken (`shifted_group`) when a run of copies made by split_shifted_reads is read by the element-wise op right
after them and by nothing else, each copy reads one source tensor with its leading indices plain (the copy's
loops in order, over whole dimensions) and its last index `j + c` (c a constant >= 0), and none of them is
scheduled by a directive."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import AbstractSet

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh
from tilec.compiler.build_util import a, hbm_view, loop, sl, term
from tilec.compiler.expr_instrs import ExprCompiler
from tilec.compiler.ir import DTYPE_BYTES, Alloc, Buf, Dma, Stmt, View, full, whole
from tilec.compiler.lower import affine_index
from tilec.compiler.lower_tiles import shared_with_gpsimd
from tilec.compiler.ops import EltwiseOp
from tilec.errors import TilecError
from tilec.lang import syntax as sx
from tilec.target import compiled

TILE_BYTES = 16 * 1024  # per partition: the widest loaded tile (its columns and halo); two of each are in flight
MAX_HALO = 64  # columns: a wider spread of shifts is left to the copies (each tile would reload most of its data)


@dataclass(frozen=True)
class Halo:
    """A run of shifted copies and the element-wise op reading them: ops[at : at + count]; with siblings
    (siblings.py), further such runs over the same source and domain built in the same nest."""
    at: int
    count: int
    src: str  # the tensor every copy reads
    shifts: tuple[tuple[str, int], ...]  # each copy's temporary and the shift c of its last index
    rows: int  # R: the output's leading dimensions flattened
    cols: int  # N: the output's last dimension
    width: int  # the source's last dimension
    siblings: tuple[int, ...] = ()  # the sibling runs' op indices (their copies and users), after ops[at + count]

    @property
    def op_range(self) -> tuple[int, ...]:
        return tuple(range(self.at, self.at + self.count)) + self.siblings

    def users(self, ops: tuple) -> list[EltwiseOp]:
        """The element-wise ops the nest computes: each run's last op (the copies come before their user)."""
        return [ops[j] for j in self.op_range if not ops[j].copy]


def shifted_group(ops: tuple, i: int, keep: AbstractSet[str], scheduled: AbstractSet[str],
                  shapes: dict[str, tuple[int, ...]], sizes: dict[str, int]) -> Halo | None:
    """The group of the module docstring starting at ops[i], or None. `keep`: tensors needed after the group
    (kernel outputs); `shapes`: every tensor's shape."""
    from tilec.compiler.build_rowchain import reads_of
    copies = []
    k = i
    while k < len(ops) and type(ops[k]) is EltwiseOp and ops[k].copy:
        copies.append(ops[k])
        k += 1
    if not copies or k == len(ops) or type(ops[k]) is not EltwiseOp:
        return None
    user = ops[k]
    if user.copy or user.columns or user.rows or user.layout or user.fused:
        return None
    if any(o.name in scheduled for o in copies + [user]):
        return None
    made = {c.out for c in copies}
    if made & set(keep) or not made <= set(user.inputs):
        return None
    if any(n in reads_of(o) for j, o in enumerate(ops) if j != k for n in made):
        return None
    shape = shapes[user.out]
    found = [_shift(c, shape, shapes, sizes) for c in copies]
    srcs = {f[0] for f in found if f is not None}
    if None in found or len(srcs) != 1:
        return None
    src = srcs.pop()
    shifts = tuple((c.out, f[1]) for c, f in zip(copies, found) if f is not None)
    if too_wide(shifts, shape[-1], shapes[src][-1]) or any(shapes[n] != shape for n in user.inputs if n not in made):
        return None
    if len(shape) < 2 or shapes[src][:-1] != shape[:-1]:
        return None
    return Halo(i, len(copies) + 1, src, shifts, math.prod(shape[:-1]), shape[-1], shapes[src][-1])


def too_wide(shifts: tuple[tuple[str, int], ...], cols: int, width: int) -> bool:
    """Whether shifts spread over more than MAX_HALO columns, where a tile holding them all would reload most of its
    columns: not when the tile is the source's whole row (shifts from 0, the output's columns and the spread span
    the row, at most TILE_BYTES of fp32), which loads every row once (RoPE at Dh = 128: X[s, d], X[s, 128 + d])."""
    lo, hi = min(c for _, c in shifts), max(c for _, c in shifts)
    whole_row = lo == 0 and cols + hi == width and width * 4 <= TILE_BYTES
    return hi - lo > MAX_HALO and not whole_row


def _shift(copy: EltwiseOp, shape: tuple[int, ...], shapes: dict[str, tuple[int, ...]],
           sizes: dict[str, int]) -> tuple[str, int] | None:
    """(source, c) when the copy is `T[.., j] = S[.., j + c]`: its leading indices its loops in order over whole
    dimensions, its last `j + c` (c >= 0), T of the output's shape."""
    e = copy.expr
    if copy.out_index or not isinstance(e, sx.Access) or e.fill is not None or shapes[copy.out] != shape:
        return None
    loops = [v for v, _ in copy.loops]
    if len(e.indices) != len(loops) or [n for _, n in copy.loops] != list(shape):
        return None
    for ix, v in zip(e.indices[:-1], loops[:-1]):
        if not (isinstance(ix, sx.Name) and ix.id == v):
            return None
    try:
        coefs, c = affine_index(e.indices[-1], set(loops), sizes)
    except TilecError:
        return None
    if coefs != {loops[-1]: 1} or c < 0 or c + shape[-1] > shapes[e.tensor][-1]:
        return None
    return e.tensor, c


def build_halo(h: Halo, ops: tuple, hbm: dict[str, Buf], fresh: Fresh) -> tuple[list[tuple[str, int]], list[Stmt]]:
    """The nest of the module docstring for the group `h`."""
    users = h.users(ops)
    user = users[0]
    P = compiled().pmax
    lo = min(c for _, c in h.shifts)
    spread = max(c for _, c in h.shifts) - lo
    elem = DTYPE_BYTES[hbm[h.src].dtype]
    n_tiles = math.ceil(h.cols / max(1, TILE_BYTES // elem - spread))
    F = math.ceil(h.cols / n_tiles)
    line = user.line
    k = rows_per_partition(h.rows, F + spread if n_tiles == 1 else 0, elem, P)
    R = h.rows // k
    views: dict[str, Buf] = {}
    stmts: list[Stmt] = []
    for name, width in [(h.src, h.width)] + [(u.out, h.cols) for u in users] + \
            [(n, h.cols) for n in _plain(users, h)]:
        views[name], st = hbm_view(hbm[name], (R, width) if k == 1 else (R, k, width), fresh(f"{name}_v"), line)
        stmts += st
    nest = _Nest(h, users, hbm, views, fresh, lo, spread, F, k)
    full_rows, last_rows = divmod(R, P)
    what = f"{', '.join(u.out for u in users)} = element-wise on shifted reads of {h.src} (one load per tile " \
           f"with a halo of {spread} column{'s' if spread != 1 else ''}, the shifts as slices of it" + \
           (f"; {k} rows per partition)" if k > 1 else ")")
    note = f"for {', '.join(v for _, v in user.vars[:-1])} (TILE_P {'rows' if k == 1 else 'blocks of rows'} at a time)"
    if full_rows:
        body = nest.columns(a(term("t", P, "TILE_P")), P)
        stmts.append(ir.Block(what, tuple(loop("t", full_rows, body, note=note, line=line)), line))
    if last_rows:
        stmts.append(ir.Block(f"{what}: the last {last_rows} rows", tuple(nest.columns(a(full_rows * P), last_rows)),
                              line))
    return [("TILE_P", P), ("TILE_F", F)], stmts


def rows_per_partition(rows: int, width: int, elem: int, P: int) -> int:
    """k rows of the source per partition (each tile k * P rows) when one load holds a whole row's halo (`width`
    columns, 0 when the columns are tiled): every instruction then streams k rows, so VectorE's fixed cost per
    instruction (~100 cycles, ARCH2 static overhead: costs.py) and each DMA's descriptor costs are paid once per k
    rows. The largest power of two whose tile stays within TILE_BYTES and that leaves whole tiles, at least
    fusers.AHEAD_TILES of them (so the nest stays software-pipelined); 1 when none does."""
    from tilec.compiler.fusers import AHEAD_TILES
    k = 1
    while width and (2 * k) * width * elem <= TILE_BYTES and rows % (2 * k * P) == 0 and \
            rows // (2 * k * P) >= AHEAD_TILES:
        k *= 2
    return k


def _plain(users: list[EltwiseOp], h: Halo) -> list[str]:
    """The operands read plainly (not through a shifted copy), once each over every user."""
    return [n for n in dict.fromkeys(n for u in users for n in u.inputs) if n not in dict(h.shifts)]


class _Nest:
    """The body for one row tile: its column tiles, each a halo load, the other operands' loads, the expression
    and the store (of each sibling: the loads shared)."""

    def __init__(self, h: Halo, users: list[EltwiseOp], hbm: dict[str, Buf], views: dict[str, Buf], fresh: Fresh,
                 lo: int, spread: int, F: int, k: int = 1) -> None:
        self.h, self.users, self.user, self.hbm, self.views, self.fresh = h, users, users[0], hbm, views, fresh
        self.lo, self.spread, self.F, self.k = lo, spread, F, k

    def _block(self, p: int, cols: ir.Idx | ir.Sl, rows: ir.Sl | None = None) -> tuple:
        """The index of a tile (rows given: of an HBM view) with its k rows per partition as a middle axis."""
        first = rows if rows is not None else sl(0, p)
        return (first, cols) if self.k == 1 else (first, sl(0, self.k), cols)

    def _shared(self, made: list[Stmt]) -> list[Stmt]:
        """With k rows per partition, each fp32 tensor_tensor split by columns with GpSimdE
        (lower_tiles.shared_with_gpsimd): a whole row's work per instruction leaves VectorE the bound (rope: 6
        instructions a tile for 3 loads and 2 stores of the same bytes), and GpSimdE streams fp32 at the same 2
        cycles an element."""
        if self.k == 1:
            return made
        target = compiled()
        return [x for b in made for x in (shared_with_gpsimd(b, target, rank=3) if isinstance(b, ir.Binary) else [b])]

    def _tile_shape(self, width: int) -> tuple[int, ...]:
        P = compiled().pmax
        return (P, width) if self.k == 1 else (P, self.k, width)

    def columns(self, r0: ir.Aff, p: int) -> list[Stmt]:
        F, N = self.F, self.h.cols
        whole_tiles, rest = divmod(N, F)
        out: list[Stmt] = []
        if whole_tiles:
            c0 = a(term("ct", F, "TILE_F")) if whole_tiles > 1 else a()
            body = self.tile(r0, p, c0, F)
            out += loop("ct", whole_tiles, body, note="for the columns (TILE_F at a time)", line=self.user.line) \
                if whole_tiles > 1 else body
        if rest:
            out += self.tile(r0, p, a(whole_tiles * F), rest)
        return out

    def tile(self, r0: ir.Aff, p: int, c0: ir.Aff, f: int) -> list[Stmt]:
        h, ln, P = self.h, self.user.line, compiled().pmax
        rows = ir.Sl(r0, p, 1, "TILE_P" if p == P else "")
        named = "TILE_F" if f == self.F else ""
        src = Buf(self.fresh(f"{h.src}_tile"), "sbuf", self.hbm[h.src].dtype, self._tile_shape(self.F + self.spread))
        out: list[Stmt] = [Alloc(src, line=ln),
                           Dma(View(src, self._block(p, sl(0, f + self.spread))),
                               View(self.views[h.src], self._block(p, ir.Sl(c0.plus(self.lo), f + self.spread),
                                                                   rows)), ln)]
        tiles = {t: View(src, self._block(p, sl(c - self.lo, f))) for t, c in h.shifts}
        for name in _plain(self.users, h):
            t = Buf(self.fresh(f"{name}_tile"), "sbuf", self.hbm[name].dtype, self._tile_shape(self.F))
            tiles[name] = View(t, self._block(p, sl(0, f)))
            out += [Alloc(t, line=ln),
                    Dma(tiles[name], View(self.views[name], self._block(p, ir.Sl(c0, f, 1, named), rows)), ln)]
        shape = (p, f) if self.k == 1 else (p, self.k, f)
        for k, user in enumerate(self.users):
            res = Buf(self.fresh(f"{user.out}_tile"), "sbuf", self.hbm[user.out].dtype, self._tile_shape(self.F))
            dst = View(res, self._block(p, sl(0, f)))
            out.append(Alloc(res, line=user.line))
            # a ragged tile's temporaries have its own shape, a sibling's its own expression: a prefix of their own
            # keeps the names apart
            base = "tmp" if k == 0 else self.fresh(f"{user.out}_tmp")
            prefix = base if (p, f) == (P, self.F) else self.fresh(f"{base}_last")
            made = ExprCompiler(tiles, shape, user.line, self.fresh, set(), prefix=prefix).emit(user.expr, dst)
            out += self._shared(made)
            out.append(Dma(View(self.views[user.out], self._block(p, ir.Sl(c0, f, 1, named), rows)), dst, user.line))
        return out
