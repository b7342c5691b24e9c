"""A window pool's segments: runs of outputs of one pass with the same taps inside the input (the borders, the
interior), and the helpers over them and over a band's statements (rules_pool.py)."""

from __future__ import annotations

from dataclasses import dataclass

from tilec.compiler import ir
from tilec.compiler.build_util import a, map_aff
from tilec.compiler.ir import Aff, Sl, Stmt


@dataclass(frozen=True)
class Segment:
    start: int  # first output of the pass (band-local)
    size: int
    taps: tuple[int, ...]  # the window taps inside the input for every output of the segment


def segments(n_out: int, first: int, stride: int, window: int, extent: int) -> list[Segment]:
    """Outputs 0..n_out whose tap t reads input first + o * stride + t, grouped by their taps inside [0, extent)."""
    out: list[Segment] = []
    for o in range(n_out):
        taps = tuple(t for t in range(window) if 0 <= first + o * stride + t < extent)
        if out and out[-1].taps == taps:
            out[-1] = Segment(out[-1].start, out[-1].size + 1, taps)
        else:
            out.append(Segment(o, 1, taps))
    return out


def within(s: ir.Idx, start: int, size: int, step: int) -> Sl:
    """Elements start, start + step, ... (size of them) of the slice s."""
    assert isinstance(s, Sl)
    return Sl(s.start.plus(start * s.step), size, step * s.step if size > 1 else 1)


def clip(segs: list[Segment], lo: int, hi: int) -> list[Segment]:
    """The segments' outputs lo..hi."""
    out = []
    for g in segs:
        start, stop = max(g.start, lo), min(g.start + g.size, hi)
        if stop > start:
            out.append(Segment(start, stop - start, g.taps))
    return out


def eviction_runs(segs: list[Segment], window: int, counted: bool) -> list[tuple[Sl, float]]:
    """The evictions of the pass along x's sums: the columns (a slice) and factor per run of columns with one factor
    (window / the taps inside X when counted, count_include_pad=False; else one run of factor 1); the two ends of a
    padding of one, of one factor, one stepped run."""
    n = sum(g.size for g in segs)
    if not counted:
        return [(Sl(a(0), n), 1.0)]
    runs: list[tuple[int, int, float]] = []
    for g in segs:
        factor = window / len(g.taps)
        if runs and runs[-1][2] == factor and runs[-1][0] + runs[-1][1] == g.start:
            runs[-1] = (runs[-1][0], runs[-1][1] + g.size, factor)
        else:
            runs.append((g.start, g.size, factor))
    if len(runs) == 3 and runs[0][1] == runs[2][1] == 1 and runs[0][2] == runs[2][2]:
        return [(Sl(a(runs[0][0]), 2, runs[2][0] - runs[0][0]), runs[0][2]),
                (Sl(a(runs[1][0]), runs[1][1]), runs[1][2])]
    return [(Sl(a(c0), size), factor) for c0, size, factor in runs]


def at_value(stmts: list[Stmt], var: str, value: int) -> list[Stmt]:
    """stmts with the loop variable var replaced by the constant value (a peeled iteration)."""
    def fn(x: Aff) -> Aff:
        return Aff(tuple(t for t in x.terms if t.var != var), x.const + sum(t.coef for t in x.terms if t.var == var)
                   * value)
    return list(map_aff(tuple(stmts), fn))


def shifted(stmts: list[Stmt], var: str, offset: int) -> list[Stmt]:
    """stmts with the loop variable var replaced by var + offset (a loop that starts after peeled iterations)."""
    def fn(x: Aff) -> Aff:
        return x.plus(sum(t.coef for t in x.terms if t.var == var) * offset)
    return list(map_aff(tuple(stmts), fn))


def border_copies(segs: list[Segment], window: int) -> int:
    """The lone-tap copies `window_pass` makes at the borders of a pass over these segments."""
    n = sum(g.size for g in segs)
    every = [t for t in range(window) if all(t in g.taps for g in segs)]
    if not every:
        return 0
    t0 = every[len(every) // 2]
    ranges = [(gs[0].start, sum(g.size for g in gs)) for gs in
              ([g for g in segs if t in g.taps] for t in range(window) if t != t0) if gs]
    if not ranges:
        return 0
    start, size = max(ranges, key=lambda r: r[1])
    return (start > 0) + (start + size < n)


def border_pairs(segs: list[Segment], reduced: bool = True) -> list[tuple[Segment, Segment]]:
    """The mirrored border outputs of a pass, outermost first ((segs[0], segs[-1]), (segs[1], segs[-2]), ..) while
    both are single outputs with as many taps: one instruction computes each pair (its views step from one output
    to the other), not two, and every instruction pays its engine's static cycles (a 5-wide window padded by 2 has
    two pairs per pass). reduced (a window reduction per pair, reduce_pass): two taps or more each, and the segments
    between them all have more."""
    out: list[tuple[Segment, Segment]] = []
    for i in range((len(segs) - 1) // 2):
        first, last = segs[i], segs[-1 - i]
        if not (first.size == last.size == 1 and len(first.taps) == len(last.taps)):
            break
        if reduced and not (len(first.taps) >= 2 and all(len(g.taps) > len(first.taps) for g in segs[i + 1:-1 - i])):
            break
        out.append((first, last))
    return out


def merged(a: ir.View, b: ir.View, axis: int) -> ir.View:
    """Two views of one element each along `axis` (the same elsewhere) as one view of both, a step apart."""
    ia, ib = a.idx[axis], b.idx[axis]
    assert isinstance(ia, Sl) and isinstance(ib, Sl) and a.buf == b.buf and ia.size == ib.size == 1
    assert ia.start.terms == ib.start.terms and ib.start.const > ia.start.const, (ia, ib)
    assert all(x == y for i, (x, y) in enumerate(zip(a.idx, b.idx)) if i != axis), (a, b)
    idx = list(a.idx)
    idx[axis] = Sl(ia.start, 2, ib.start.const - ia.start.const)
    return ir.View(a.buf, tuple(idx))


def pad_runs(start: int, rows: int, height: int, window: int, stride: int, first: int, outputs: int) \
        -> list[tuple[int, int, int]]:
    """A max or min pool's band rows start..start+rows outside X (0..height) as runs (row of the band, count, first
    row of X to copy there): the run above X from X's first rows in order, the one below from its last, when every
    window (output o reads rows first + o * stride ..+ window) that reads a row outside X also reads the row copied
    there, so the copy never changes a maximum (one DMA per run); else each row from X's nearest row (one DMA per
    row). Shifted, not mirrored: a DMA copies rows in order."""
    wins = [(first + o * stride, first + o * stride + window) for o in range(outputs)]

    def keeps(p: int, q: int) -> bool:
        return all(lo <= q < hi for lo, hi in wins if lo <= p < hi)
    out: list[tuple[int, int, int]] = []
    above, below = max(0, min(rows, -start)), max(0, min(rows, start + rows - height))
    for r0, n, q0 in ((0, above, 0), (rows - below, below, height - below)):
        ps = range(start + r0, start + r0 + n)
        if n and n <= height and all(keeps(p, q0 + i) for i, p in enumerate(ps)):
            out.append((r0, n, q0))
        else:
            out += [(r0 + i, 1, 0 if p < 0 else height - 1) for i, p in enumerate(ps)]
    return out
