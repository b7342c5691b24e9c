"""The fused builders the pipeline tries at each op, in order: a rule each (recognise the ops from op i on, build
them together, or say "not applicable" with None), so adding one is a function and a row of FUSERS.

Each returns a Fused: its kind (what `tilec explain` calls the part), the tensors it writes to HBM, its (constants,
statements), the output that names its constants, the op indices it covers and the names of the ops it fuses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Callable

from tilec.compiler import (build_attention, build_mbblock, build_mlp, build_psumrow, build_tconv, build_tconv_pad, ir,
                            passes, placement)
from tilec.compiler.build_global_axes import build_global_axes, global_axes_op
from tilec.compiler.build_colchain import build_column_chain, psum_fits, stage_b
from tilec.compiler.build_halo import build_halo, shifted_group
from tilec.compiler.build_rowchain import fit_chain, reads_of
from tilec.compiler.colchain_find import column_chain
from tilec.compiler.names import NameAllocator
from tilec.compiler.ops import ConvOp
from tilec.compiler.pair_tiles import skew_inner_tiles, skew_row_tiles
from tilec.compiler.rules_global import build_global_pool, global_note, global_pool
from tilec.compiler.schedule import sbuf_budget
from tilec.compiler.siblings import with_siblings
from tilec.lang.api import Program
from tilec.target import Target

AHEAD = "pairs of tiles, software-pipelined: the next tile's loads before this tile's work and stores"
AHEAD_TILES = 8  # fewer tiles stay a plain loop: the pipelined code holds four copies of a tile's work


@dataclass(frozen=True)
class Site:
    """What every fuser reads: the program's ops at op i and the pipeline's state for them."""
    program: Program
    ops: tuple
    hbm: dict
    names: NameAllocator
    scheduled: AbstractSet[str]  # ops a directive names: built alone
    budget: int  # SBUF bytes per partition (0: no fusion)
    target: Target
    chains: dict  # row chains by their first op's index (build_rowchain.row_chains)
    fresh_op: Callable  # the per-op name allocator of the pipeline (_fresh)

    @property
    def outputs(self) -> set[str]:
        return set(self.program.kernel.outputs)


@dataclass(frozen=True)
class Chain:
    """A fused part as the compiler's result keeps it: which builder made it and the ops it covers, in order."""
    kind: str  # global pool, attention head, MLP, halo tiles, column chain, row chain, row in PSUM, MobileNet block
    members: tuple[str, ...]


@dataclass(frozen=True)
class Fused:
    kind: str  # the fuser's own name for what it built (Chain.kind)
    written: set[str]
    built: tuple
    out: str
    covers: frozenset[int]
    members: list[str]

    @property
    def chain(self) -> Chain:
        return Chain(self.kind, tuple(self.members))


def _global(s: Site, i: int) -> Fused | None:
    """A global pool: a reduction of each channel's map, then its constant factor (rules_global.py)."""
    pooled = global_pool(s.ops, i, s.hbm, s.outputs, s.scheduled)
    if pooled is None:
        return None
    last = s.ops[i + pooled.ops - 1]
    built = build_global_pool(pooled, s.ops, i, s.hbm, lambda base: s.names.fresh(base, f"global:{last.out}"))
    span = range(i, i + pooled.ops)
    return Fused("global pool", {last.out}, built, last.out, frozenset(span), [s.ops[j].name for j in span])


def _global_axes(s: Site, i: int) -> Fused | None:
    """A sum over a few middle rows with long rows after them (the NHWC global average pool): each row cut into
    pieces on the partitions (build_global_axes.py)."""
    op = global_axes_op(s.ops[i], s.hbm, s.scheduled)
    if op is None:
        return None
    built = build_global_axes(op, s.hbm, lambda base: s.names.fresh(base, f"pieces:{op.out}"))
    return Fused("pieces", {op.out}, built, op.out, frozenset({i}), [op.name])


def _attention(s: Site, i: int) -> Fused | None:
    """scores -> softmax -> values of one attention head kept on chip (build_attention.py)."""
    op = s.ops[i]
    head = build_attention.build_head(s.ops, i, s.hbm, lambda base: s.names.fresh(base, f"head:{op.out}"),
                                      s.scheduled, s.outputs, placement.reads)
    if head is None:
        return None
    span = range(i, i + build_attention.span(s.ops, i))
    last = s.ops[span[-1]]
    return Fused("attention head", {last.out}, head, last.out, frozenset(span), [s.ops[j].name for j in span])


def _mlp(s: Site, i: int) -> Fused | None:
    """Two matmuls with the hidden layer kept on chip, transposed (build_mlp.py)."""
    last = s.ops[i + 1].out if i + 1 < len(s.ops) else ""
    built = build_mlp.build_mlp(s.ops, i, s.hbm, lambda base: s.names.fresh(base, f"mlp:{last}"), s.scheduled,
                                s.outputs, placement.reads, s.budget)
    if built is None:
        return None
    return Fused("MLP", {last}, built, last, frozenset({i, i + 1}), [o.name for o in s.ops[i:i + 2]])


def _halo(s: Site, i: int) -> Fused | None:
    """Shifted reads as slices of one tile loaded with a halo (build_halo.py), with the sibling groups over the same
    source and domain in the same nest (siblings.py) when the nest still fits the SBUF budget, tiles pipelined at
    their loads."""
    shapes = {n: b.shape for n, b in s.hbm.items()}
    alone = shifted_group(s.ops, i, s.outputs, s.scheduled, shapes, s.program.sizes)
    if alone is None:
        return None
    chained = {j for c in s.chains.values() for j in c}  # (ops a row chain builds: never a sibling)
    halo = with_siblings(alone, s.ops, s.outputs, s.scheduled, shapes, s.program.sizes, chained) if s.budget \
        else alone
    user = s.ops[halo.at + halo.count - 1]
    fresh = lambda base: s.names.fresh(base, f"halo:{user.out}")  # noqa: E731
    built = build_halo(halo, s.ops, s.hbm, fresh)
    if halo != alone and passes.peak_usage(tuple(built[1]))[0] > s.budget:
        halo, built = alone, build_halo(alone, s.ops, s.hbm, fresh)
    built = skew_row_tiles(built, s.budget, fresh, var="t", tile_const="TILE_P", note=AHEAD,
                           min_tiles=AHEAD_TILES) or built
    return Fused("halo tiles", {u.out for u in halo.users(s.ops)}, built, user.out, frozenset(halo.op_range),
                 [s.ops[j].name for j in halo.op_range])


def _keep(s: Site, span) -> set[str]:
    """The members' outputs still read after the fused part: the kernel's outputs and what other ops read."""
    outside = [o for j, o in enumerate(s.ops) if j not in span]
    return s.outputs | {n for o in outside for n in reads_of(o)}


def _column_chain(s: Site, i: int) -> Fused | None:
    """Column statistics and their user over blocks of columns kept in SBUF (build_colchain.py)."""
    colchain = column_chain(s.ops, i, s.outputs, s.scheduled, s.hbm) if s.budget else None
    if colchain is None:
        return None
    members = [s.ops[j] for j in colchain.op_range]
    keep = _keep(s, colchain.op_range)
    user = members[-1]
    fresh = lambda base, u=user.out: s.names.fresh(base, f"cols:{u}")  # noqa: E731
    built = build_column_chain(colchain, s.ops, s.hbm, keep, fresh)
    # the next block's load issued before this block's work and stores (pair_tiles.py)
    skewed = skew_row_tiles(built, s.budget, fresh, var="ct", tile_const="TILE_F", note=AHEAD, min_tiles=4,
                            split_at=stage_b(colchain, s.ops))
    if skewed is None and colchain.O > 1:  # the batches inside the loop over a batch's sub-blocks
        skewed = skew_inner_tiles(built, s.budget, fresh, var="ct", tile_const="TILE_F", note=AHEAD, min_tiles=4,
                                  split_at=stage_b(colchain, s.ops))
    fit = next((b for b in (skewed, built) if b is not None and psum_fits(colchain, b)), None)
    if fit is None:
        return None
    built = fit
    return Fused("column chain", {m.out for m in members} & keep, built, user.out, frozenset(colchain.op_range),
                 [m.name for m in members])


def _row_chain(s: Site, i: int) -> Fused | None:
    """A row chain whole and software-pipelined (pair_tiles.py), or at long rows chunked columns or shared tiles,
    when the built chain fits the SBUF budget."""
    if i not in s.chains:
        return None
    members = [s.ops[j] for j in s.chains[i]]
    keep = _keep(s, s.chains[i])
    built = fit_chain(members, s.hbm, s.fresh_op, keep, s.budget)
    if passes.peak_usage(tuple(built[1]))[0] > s.budget:
        return None
    return Fused("row chain", {m.out for m in members} & keep, built, members[-1].out, frozenset(s.chains[i]),
                 [m.name for m in members])


def _psum_row(s: Site, i: int) -> Fused | None:
    """`X * f(beta[j] * X)` with beta's broadcast kept in PSUM (build_psumrow.py)."""
    op = s.ops[i]
    built = build_psumrow.build_psum_row(op, s.hbm, s.fresh_op(op)) if s.budget and op.name not in s.scheduled \
        else None
    if built is None or passes.peak_usage(tuple(built[1]))[0] > s.budget:
        return None
    return Fused("row in PSUM", {op.out}, built, op.out, frozenset({i}), [op.name])


def _mobilenet_block(s: Site, i: int) -> Fused | None:
    """expand 1x1 -> depthwise -> project 1x1 kept on chip (build_mbblock.py)."""
    if not isinstance(s.ops[i], ConvOp):
        return None
    last = s.ops[i + 2].out if i + 2 < len(s.ops) else ""
    block = build_mbblock.build_block(s.ops, i, s.hbm, lambda base: s.names.fresh(base, f"block:{last}"),
                                      s.target, s.scheduled, s.outputs, placement.reads)
    if block is None:
        return None
    return Fused("MobileNet block", {last}, block, last, frozenset({i, i + 1, i + 2}), [o.name for o in s.ops[i:i + 3]])


def _tconv(s: Site, i: int) -> Fused | None:
    """A transposed conv's matmul and permute with the result kept on chip (build_tconv.py)."""
    keep = lambda span: _keep(s, span)  # noqa: E731
    found = (build_tconv.find(s.ops, i, s.hbm, keep, s.scheduled) or
             build_tconv_pad.find_padded(s.ops, i, s.hbm, keep, s.scheduled)) if s.budget else None
    if found is None:
        return None
    out = found.copy.out
    built = build_tconv.build(found, s.hbm, s.fresh_op(found.copy))
    if passes.peak_usage(tuple(built[1]))[0] > s.budget:
        return None
    return Fused("transposed conv", {out}, built, out, found.covers, [s.ops[j].name for j in sorted(found.covers)])


def chain_note(part: Chain, ops: tuple, program, target: Target) -> str:
    """The schedule's line for a fused part (`tilec explain`), by the kind its fuser gave it."""
    kind, chain = part.kind, list(part.members)
    if kind == "MobileNet block":
        hbm = {name: ir.Buf(name, "hbm", t.dtype, t.shape) for name, t in program.tensors.items()}
        return build_mbblock.note(ops, chain, hbm, target)
    if kind == "attention head":
        hbm = {name: ir.Buf(name, "hbm", t.dtype, t.shape) for name, t in program.tensors.items()}
        return build_attention.note(ops, chain, hbm)
    if kind == "MLP":
        hbm = {name: ir.Buf(name, "hbm", t.dtype, t.shape) for name, t in program.tensors.items()}
        return build_mlp.note(ops, chain, hbm, sbuf_budget(target))
    if kind == "global pool":
        return global_note(chain)
    if kind == "pieces":
        return f"# {chain[0]}: a sum over middle rows, each kept row cut into pieces on the partitions " \
            "(build_global_axes.py; a directive on it builds it as a column sum)"
    if kind == "column chain":
        return f"# fused column chain {', '.join(chain)}: blocks of columns of every row kept in SBUF, the source " \
            "read once (build_colchain.py; a directive on one builds them apart)"
    if kind == "transposed conv":
        return f"# fused transposed conv {', '.join(chain)}: a matmul per tap evicted into Y's layout in SBUF, " \
            "stored once (build_tconv.py; a directive on one builds them apart)"
    if kind == "row in PSUM":
        return f"# {chain[0]}: its broadcast row kept in PSUM, read there by VectorE's products (build_psumrow.py)"
    if kind == "halo tiles":
        users = [o.name for o in ops if o.name in chain and not o.copy]
        siblings = f"; {' and '.join(users)} computed in the one nest (siblings.py)" if len(users) > 1 else ""
        return f"# fused {', '.join(chain)}: each tile of the source loaded once with a halo, the shifted reads " \
            f"slices of it (build_halo.py{siblings}; a directive on one builds them apart)"
    return f"# fused row chain {', '.join(chain)}: one pass over row tiles (a directive on one builds it alone)"


FUSERS: tuple[Callable[[Site, int], Fused | None], ...] = (
    _global, _attention, _mlp, _halo, _column_chain, _row_chain, _psum_row, _mobilenet_block, _tconv, _global_axes)


def fuse(s: Site, i: int) -> Fused | None:
    """The first fuser that applies at op i, in FUSERS' order."""
    for fuser in FUSERS:
        fused = fuser(s, i)
        if fused is not None:
            return fused
    return None
