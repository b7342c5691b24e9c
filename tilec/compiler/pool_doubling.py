"""A window pass by doubling (pool_passes.window_pass): for windows of 4 taps or more, pairs of neighbouring
inputs first (D2[p] = op(x[p], x[p + 1])), then pairs of pairs (D4[p] = op(D2[p], D2[p + 2])), and so on; each
output then combines the pieces of its window (its taps inside the input, a run of L) by L's binary digits, which
never overlap, so sums are exact as well as maxima: a 5-tap window is D4[a] op x[a + 4]. A 5-wide pass costs 3
combines per output instead of 4, a 7-wide one 4 instead of 6 (the tap-by-tap form: one combine per tap but the
first). Each level is computed only at the positions the outputs need (every `stride`-th input when the pieces'
offsets allow), so a stride-2 pass stays at about 3 combines per output too."""

from __future__ import annotations

from math import gcd
from typing import TYPE_CHECKING

from tilec.compiler import pool_knobs as knobs
from tilec.compiler.ir import Alloc, Buf, Stmt, View, whole
from tilec.compiler.pool_segments import Segment, border_pairs, merged, within

if TYPE_CHECKING:
    from tilec.compiler.pool_passes import WindowPasses

Level = tuple[int, int, int]  # (first position, positions, step): where a level's element q sits in the input


def pieces(length: int) -> list[tuple[int, int]]:
    """A run of `length` taps as (level, offset) pieces, largest first: 5 -> [(4, 0), (1, 4)]."""
    out, off, k = [], 0, 1 << (length.bit_length() - 1)
    while k:
        if length - off >= k:
            out.append((k, off))
            off += k
        k //= 2
    return out


def combines(window: int) -> int:
    """Combines per output of a pass of `window` taps from SBUF (the choices' costs, pool_costs.py): by doubling
    (levels, then the pieces after the first) from 4 taps on, else one per tap but the first."""
    if window < 4 or not knobs.DOUBLING:
        return max(window - 1, 0)
    return min(window - 1, window.bit_length() - 1 + len(pieces(window)) - 1)


def plan_levels(segs: list[Segment], stride: int, shift: int) -> dict[int, Level] | None:
    """Each level's positions (k > 1): those the segments' pieces read, and below them those each level reads
    (D2k[p] reads Dk[p] and Dk[p + k]), covered by one stepped range; None when a level would need a step that
    does not divide the stride (the outputs could not read it with one view)."""
    need: dict[int, set[int]] = {}
    for g in segs:
        for k, off in pieces(len(g.taps)):
            if k > 1:
                first = g.start * stride + g.taps[0] + shift + off
                need.setdefault(k, set()).update(first + o * stride for o in range(g.size))
    levels: dict[int, Level] = {}
    top = max(need, default=1)
    for k in (top >> i for i in range(top.bit_length() - 1)):  # top level down to 2: each adds what it reads below
        pos = sorted(need.get(k, ()))
        if not pos:
            continue
        step = 0
        for p in pos[1:]:
            step = gcd(step, p - pos[0])
        step = step or stride
        if stride % step:
            return None
        levels[k] = (pos[0], (pos[-1] - pos[0]) // step + 1, step)
        if k > 2:
            below = need.setdefault(k // 2, set())
            below.update(p for q in range(levels[k][1]) for p in (pos[0] + q * step, pos[0] + q * step + k // 2))
    return levels


def elements(levels: dict[int, Level], segs: list[Segment]) -> int:
    """Elements per row the doubling form writes (levels, then every piece after a segment's first)."""
    return sum(n for _, n, _ in levels.values()) + sum(g.size * max(1, len(pieces(len(g.taps))) - 1) for g in segs)


def tap_elements(segs: list[Segment]) -> int:
    """Elements per row the tap-by-tap form writes (one per tap of each output, its first tap's a copy or the
    first combine's other operand)."""
    return sum(g.size * max(1, len(g.taps) - 1) for g in segs)


def doubling_pass(wp: "WindowPasses", src: View, dst: View, axis: int, segs: list[Segment], stride: int,
                  shift: int, final: View | None) -> list[Stmt] | None:
    """dst (or final: the last combine of each output) = the pass by doubling, or None when the tap-by-tap form
    writes as few elements (windows of 3 or less) or the levels cannot be read with one view each."""
    if max(len(g.taps) for g in segs) < 4 or any(list(g.taps) != list(range(g.taps[0], g.taps[-1] + 1))
                                                 for g in segs):
        return None
    levels = plan_levels(segs, stride, shift)
    if levels is None or elements(levels, segs) >= tap_elements(segs):
        return None
    line = wp.op.line
    out: list[Stmt] = []
    views: dict[int, tuple[View, Level]] = {1: (src, (0, 0, 1))}
    for k in sorted(levels):
        first, n, step = levels[k]
        shape = tuple(n if i == axis else d for i, d in enumerate(dst.shape()))
        buf = Buf(wp.name(f"{wp.op.out}_d{k}{'x' if axis == 2 else 'y'}", shape), "sbuf", dst.buf.dtype, shape)
        out.append(Alloc(buf, line=line))
        lower, half = views[k // 2], k // 2
        out += wp.combine_shared(whole(buf), axis, Segment(0, n, (0,)), _reader(wp, views, axis, first, step, k // 2),
                                 _reader(wp, views, axis, first + half, step, k // 2), src=lower[0].buf.dtype)
        views[k] = (whole(buf), levels[k])
    # mirrored borders along x: one instruction per piece for both (each instruction pays its engine's static
    # cycles), after the interior (measured, model: avgpool 5x5 s1 f32 batch 8 57.50 us, 58.88 before it). Not
    # along y: there the two rows lie in both engines' parts of the levels (combine_shared cuts them by rows), so
    # the one engine that takes the pair waits for the other's (measured: maxpool 5x5 s1 f32 batch 8 63.87 us with
    # them, 62.56 without; avgpool bf16 batch 1 10.91 against 10.27)
    pairs = border_pairs(segs, reduced=False) if axis == 2 else []
    for g, h in [(g, None) for g in segs[len(pairs):len(segs) - len(pairs)]] + pairs:
        readers = [_reader(wp, views, axis, shift + off, stride, k) for k, off in pieces(len(g.taps))]
        if len(readers) == 1:  # a run of 1, 2, 4.. taps: one level's elements as they are
            into = final if final is not None else dst
            to, of = wp._view(into, axis, g, 0, 1), readers[0](g, None)
            if h is not None:
                to, of = merged(to, wp._view(into, axis, h, 0, 1), axis), merged(of, readers[0](h, None), axis)
            out.append(wp.edge_copy(to, of))
            continue
        acc = readers[0]
        for i, reader in enumerate(readers[1:]):
            into = final if final is not None and i == len(readers) - 2 else dst
            out += wp.combine_shared(into, axis, g, acc, reader, src=dst.buf.dtype, pair=h)
            acc = _written(wp, into, axis)
    return out


def _reader(wp: "WindowPasses", views: dict[int, tuple[View, Level]], axis: int, position: int, stride: int,
            k: int):
    """A tap callable (seg, part) -> level k's elements at the input positions of outputs seg (output o at its
    first tap + position + o * stride), along the other free axis `part` (combine_shared's engine split) or all
    of it. (Each segment's own first tap: a pair of mirrored borders reads from two.)"""
    view, (first, _, step) = views[k]

    def read(seg: Segment, part: tuple[int, int] | None) -> View:
        p = seg.taps[0] + position + seg.start * stride - first
        assert p % step == 0 and stride % step == 0, (p, step, stride)
        idx = list(view.idx)
        idx[axis] = within(idx[axis], p // step, seg.size, stride // step)
        if part is not None:
            idx[3 - axis] = within(idx[3 - axis], part[0], part[1], 1)
        return View(view.buf, tuple(idx))
    return read


def _written(wp: "WindowPasses", into: View, axis: int):
    """A reader of the outputs a combine just wrote (the accumulator of a segment's later pieces)."""
    return lambda seg, part: wp._view(into, axis, seg, 0, 1, part)
