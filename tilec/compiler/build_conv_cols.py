"""A plain convolution's band of X's own columns: a padded read without folded taps or row pairs (one matmul per tap,
C > 64 channels: conv_odd's 67) loads its band without the zero halo columns, as row pairs and folded taps already do
(build_conv: col0 = 0). A band row with halo columns beside it is its own DMA descriptor in SBUF, so the band took
one descriptor per channel and row (bf16 conv_odd: 1,876 descriptors of 56 B per band, 2.97 us of DMA queue per
band, as long as the band's 18 matmuls); without them a channel's band rows are one run in HBM and in SBUF alike
(67 descriptors). A tap column reaching past X's edge then computes only the output columns it reaches
(conv_pairs.tap_columns), after a tap reaching all of them has started the sum: columns past a row's end hold the
next row's elements, not zeros, so no matmul may read them for an output column.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from tilec.compiler.build_util import loop
from tilec.compiler.ir import Stmt

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder

# a tap column and the output columns it reaches (first, count)
TapColumns = tuple[int, tuple[int, int]]


def applies(b: _ConvBuilder) -> bool:
    """Whether the band holds X's own columns: a padded read (columns left of X) of whole rows in one column band
    and one column tile, one matmul per tap (no folded taps, row pairs or mixed taps, whose bands choose their own
    layout), loaded from HBM (not a chain's on-chip image), dense weights of one matrix, and some tap column
    reaching every output column (the sum's first matmul writes all of them)."""
    from tilec.compiler.conv_pairs import tap_columns
    op = b.op
    return (b.fold == 1 and b.pair == 1 and not b.mixed and b.src_chip is None and b.NXB == 1
            and b.BX == b.p.tile_x and b.ox < 0 and op.w_layout in ("kc", "ck") and op.groups == 1
            and not op.w_batch and not op.x_transposed and not op.pool and b.S > 1
            and any(tap_columns(b, s) == (0, b.Wo) for s in range(b.S)))


def order(b: _ConvBuilder) -> list[TapColumns]:
    """The tap columns in the order their matmuls run: those reaching every output column first (the first one
    starts the accumulation), then the clipped ones; a tap column reaching no output column has no matmul."""
    from tilec.compiler.conv_pairs import tap_columns
    reach = {s: tap_columns(b, s) for s in range(b.S)}
    return [(s, reach[s]) for s in sorted(range(b.S), key=lambda s: reach[s] != (0, b.Wo)) if reach[s][1]]


def taps(b: _ConvBuilder, matmul: Callable[[str | None, int, TapColumns], list[Stmt]]) -> list[Stmt]:
    """Per tap column (static: its output columns differ), the in-channel tiles and the tap rows; `matmul(cv, cs,
    tap)` builds one matmul of in-channel part (cv, cs) at tap column tap[0] over its output columns tap[1]."""
    V = b.var
    out: list[Stmt] = []
    for tap in order(b):
        def rows(cv: str | None, cs: int, tap: TapColumns = tap) -> list[Stmt]:
            return loop(V["r"], b.R, matmul(cv, cs, tap), "affine", note=b.T["r"], line=b.L["r"])
        out += b.over_c(V["c"], rows, b.L["c"])
    return out
