"""One DMA for a loop of DMAs over blocks of partitions (the last pass before allocation, small20).

Builders that spread a tensor over 128 partitions in (unit, block) pairs (rules_copy's padded and cropped rows: block
b of R rows of every channel on partitions [b * 64, b * 64 + 64)) move each block with a DMA of its own:

    for rb in range(2):
        dma P_v[:, rb*28 + 1:+28, :] <- P_tile[rb*64:+64, :, :]

Two stores like these write rows of one HBM tensor that interleave (block 0's rows of channel 1 lie between block 1's
rows of channel 0), so whether they may run side by side depends on how the hardware compiler orders DMAs writing one
tensor, which is not documented: the performance model orders them by default (tilec/perf/deps.py, "range"), and the
second store then waits for the first (pad1 batch 1: 3.4 us). One DMA moves the same elements without the question:
the HBM side gets the blocks as a leading axis of its access pattern (ir.View.blocks: NKI 0.6 `.ap()`, 0.1 an
advanced index over an nl.mgrid), the on-chip side the blocks' partitions as one range. It is also one DMA's fixed
cost instead of several (nki-spec §2.5: ~1.3 us semaphore-to-start and ~600 ns issue per DMA, DMABW/ARCH3).

A loop qualifies when its body is one DMA between SBUF and HBM whose on-chip side steps its partition slice by its own
size each iteration (blocks side by side, from a constant start) and whose HBM side uses the loop variable in one
index, once, with a positive step, each iteration's elements starting no later than just past the previous one's
(their ranges join: the merged DMA spans no HBM bytes the loop's DMAs did not span between them); the merged partition
range must start where an access of its size may (nki-spec §1.6: 0 for more than 64 partitions, 0 or 64 for more
than 32, a multiple of 32 else).
"""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.build_util import used_consts
from tilec.compiler.ir import Aff, Block, Dma, Kernel, Loop, Sl, Stmt, View
from tilec.compiler.schedule import PMAX


def merge_block_dmas(k: Kernel) -> Kernel:
    body = _merge(k.body)
    if body == k.body:
        return k
    # a merged loop's constants (its slices' named sizes, e.g. ROWS) may be read nowhere now: the kernel drops them
    return replace(k, body=body, consts=tuple(used_consts(list(body), list(k.consts))))


def _merge(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Loop):
            s = replace(s, body=_merge(s.body))
            out.append(merged(s) or s)
        elif isinstance(s, Block):
            out.append(replace(s, body=_merge(s.body)))
        else:
            out.append(s)
    return tuple(out)


def merged(loop: Loop) -> Dma | None:
    """The one DMA doing what `loop` (a loop over blocks of partitions around one DMA) does, else None."""
    if loop.extent < 2 or len(loop.body) != 1 or not isinstance(loop.body[0], Dma):
        return None
    dma = loop.body[0]
    to_hbm = dma.dst.buf.memory == "hbm"
    chip, hbm = (dma.src, dma.dst) if to_hbm else (dma.dst, dma.src)
    if chip.buf.memory != "sbuf" or hbm.buf.memory != "hbm" or hbm.blocks:
        return None
    parts = _partitions(chip, loop)
    axis = _blocked_axis(hbm, loop.var)
    if parts is None or axis is None or not _touching(hbm, *axis):
        return None
    dim, step = axis
    i = hbm.idx[dim]
    start = i.start if isinstance(i, Sl) else i
    rest = Aff(tuple(t for t in start.terms if t.var != loop.var), start.const)
    idx = hbm.idx[:dim] + ((replace(i, start=rest) if isinstance(i, Sl) else rest),) + hbm.idx[dim + 1:]
    # an access pattern prints its counts as numbers: the slices' named sizes are read nowhere
    idx = tuple(replace(x, name="") if isinstance(x, Sl) else x for x in idx)
    new_hbm = View(hbm.buf, idx, hbm.perm, ((dim, loop.extent, step),))
    new_chip = View(chip.buf, (parts,) + chip.idx[1:])
    return Dma(new_hbm, new_chip, dma.line) if to_hbm else Dma(new_chip, new_hbm, dma.line)


def _partitions(chip: View, loop: Loop) -> Sl | None:
    """The on-chip side's partitions over all iterations, when each iteration's block follows the previous one from
    a constant start, the loop variable appears nowhere else on chip and the range starts where it may."""
    p = chip.idx[0]
    if not isinstance(p, Sl) or p.step != 1 or chip.perm or chip.blocks:
        return None
    if len(p.start.terms) != 1 or p.start.terms[0] != replace(p.start.terms[0], var=loop.var, coef=p.size):
        return None
    if any(loop.var in _vars(i) for i in chip.idx[1:]):
        return None
    first, count = p.start.const, p.size * loop.extent
    allowed = (0,) if count > 64 else (0, 64) if count > 32 else (0, 32, 64, 96)
    if first not in allowed or first + count > PMAX:
        return None
    return Sl(Aff((), first), count)


def _blocked_axis(hbm: View, var: str) -> tuple[int, int] | None:
    """(axis, step): the one index of the HBM side using `var`, as one term of positive coefficient."""
    uses = [d for d, i in enumerate(hbm.idx) if var in _vars(i)]
    if len(uses) != 1:
        return None
    i = hbm.idx[uses[0]]
    start = i.start if isinstance(i, Sl) else i
    terms = [t for t in start.terms if t.var == var]
    if len(terms) != 1 or terms[0].coef <= 0:
        return None
    return uses[0], terms[0].coef


def _touching(hbm: View, dim: int, step: int) -> bool:
    """Whether each iteration's HBM elements start no later than just past the previous iteration's last one, so the
    iterations' byte ranges join into the merged DMA's range. Stores of disjoint ranges with gaps between them (the
    depthwise kernel's (block, channel) stores, whose gaps other stores fill) stay apart: one DMA over their bounding
    range would overlap the others' ranges, which the model orders (tilec/perf/deps.py)."""
    strides = [1] * len(hbm.buf.shape)
    for d in range(len(strides) - 2, -1, -1):
        strides[d] = strides[d + 1] * hbm.buf.shape[d + 1]
    extent = sum((i.size - 1) * i.step * st for i, st in zip(hbm.idx, strides) if isinstance(i, Sl))
    return step * strides[dim] <= extent + 1


def _vars(i: Aff | Sl) -> tuple[str, ...]:
    return (i.start if isinstance(i, Sl) else i).vars()
