"""Window pools of any window, stride and padding (issue 13): the rule and its lowering to level B.

    Y[n, c, i, j] max= X[n, c, 2*i + p - 1, 2*j + q - 1] ?? -inf       (3x3, stride 2, padding 1)
    pool(Y, TilecPlan(tile_b=64, band=14)):
        partition(b, 64)                      rows of n*c on the partitions (tiles of TILE_P)
        split(i, 14, name=BAND)               bands of output rows; the first and last band are peeled (static)
        stage(X, rows=29, halo=(-1, 0))       the band's input rows in SBUF, one DMA; rows outside X not loaded
        window(j, taps=3, stride=2, offset=-1)   along x: each tap a strided view, combined on VectorE
        window(i, taps=3, stride=2, offset=-1)   then along y over the x results (R + S taps, not R * S)
        scale(0.111)                          an average's 1 / count on ScalarE while it casts to Y's dtype
        stage_out(Y)                          the band's result, one DMA

Padding is never materialised: a padded read reads the reduction's identity (-inf for max, 0 for a sum), so a
window that reaches outside X simply has fewer taps. Each pass splits its outputs into segments with the same set
of valid taps (the border columns, the interior), one instruction per tap and segment. An average that excludes the
padding (count_include_pad=False) multiplies each border segment by window / taps inside, then scales by
1 / (wy * wx) like the others.

With few channel rows (n*c <= 64, batch 1), blocks of output rows fill the other partitions. When X's and Y's rows
split evenly into the blocks, the blocks are interleaved with the channel rows (`Interleave`: partition b * G + g
holds block g of row b, a plain reshape of X and Y): a band is then one DMA over all 128 partitions each way, and
the model's stores to Y, which it orders one DMA latency apart (their HBM byte ranges interleave), are one per band
rather than one per block per band; the few output rows whose window crosses a block edge are computed apart.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from tilec.compiler import build_util, ir, passes
from tilec.compiler.build_conv import Fresh, hbm_view
from tilec.compiler.build_util import a, loop, map_aff, sl, term
from tilec.compiler.ir import (DTYPE_BYTES, Act, Aff, Alloc, Binary, Buf, Copy, Dma, Matmul, Scalar, Sl,
                              Stmt, View, full, whole)
from tilec.compiler.ops import PoolOp
from tilec.compiler.rules import Prim, prim
from tilec.compiler.schedule import PMAX, PoolPlan, sbuf_budget
from tilec.target import target as get_target

Built = tuple[list[tuple[str, int]], list[Stmt]]
HALF = ("f16", "bf16")
SHARE_MIN = 100  # elements per partition below which one engine does a whole combine
MIN_INTERLEAVED = 4  # block-local output rows an Interleave computes interleaved (fewer: the seams dominate)
PSUM = "auto"  # the pass along x from PSUM: "auto" (the model's costs decide), "on" where possible, "off" (tests)
TAPS = "auto"  # through PSUM, TensorE sums the taps of 16-bit sums: "auto" (the costs), "on", "off" (tests)
FULL_ROWS: int | None = None  # output rows per band TensorE sums whole with the taps (None: the costs decide)
WHOLE_SLACK = 0.02  # the fewest such rows whose estimate is within this part of the best (measured: avgpool 3x3 s1
#                     bf16 batch 8, 28 x 28: 3 rows 43.65 us, 4 rows 44.77; the estimate 1505 / 1491 ns per band)
YS = 0.36
UNROLL = 2  # (experiment)
PEEL_TILES = 3  # partition tiles from which a pool through PSUM peels its first and last (`_WindowPool.build`; >= 3)
WHOLE_PEELED = True  # with a peeled first tile, the whole rows from a kernel-long estimate (peeled_whole; False: tests)
ALIGN_CUTS = True  # a pass along y's combines change engines at one row (combine_shared; False: tests, measures)
SHARE_BANK = True  # the whole rows' PSUM sums in the last chunk's bank when they fit (tensor_x_pass; False: tests)
PEEL_SBUF_PART = 2  # the peeled bodies' buffers may take at most this part of SBUF
BLOCK_STORES = True  # blocks of rows stored once per block when the model's costs say so (False: per band; tests)
BLOCK_STORES_SBUF_PART = 8  # ...when the tile-wide output buffer takes at most this part of SBUF
INTERLEAVED_BANDS = 4  # bands of an Interleave: its loads, the two engines and its stores overlap (the stores to Y
#                        are ordered, each one DMA latency after the last, so few and large)


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


def pool(op: PoolOp, plan: PoolPlan, dtypes: tuple[str, str] | None = None) -> list[Prim]:
    """The schedule of a window pool as primitives (printable; `build_window_pool` lowers it); dtypes: X's and Y's,
    to say whether the pass along x reads X through PSUM."""
    w = op.window
    assert w is not None
    (sy, sx), (oy, ox) = w.stride, w.offset
    split = interleaved(op, plan)
    band = plan.band if split is None else interleaved_band(plan, split)
    rows = (band - 1) * sy + op.pool.wy
    scale = op.pool.scale / (op.pool.wy * op.pool.wx if w.count == "inside" else 1)
    prims = [prim("partition", "b", plan.tile_b), prim("split", "i", band, name="BAND"),
             prim("stage", op.src, rows=rows, halo=(oy, oy + rows - sy * band))]
    if split is not None:
        prims.insert(1, prim("interleave", "i", split.blocks, rows=(split.first, split.end), seams=len(split.seams)))
    G = plan.blocks if plan.tile_b == op.dim("B") and w.count == "window" else 1
    choice = None
    if dtypes is not None and split is None and G == 1:
        ob = min(band, w.out[0])
        choice = psum_choice(op, ob, op.dim("B") // plan.tile_b * -(-w.out[0] // ob), *dtypes,
                             tiles=op.dim("B") // plan.tile_b)
    if choice is not None:
        prims.append(prim("psum", op.src, rows=choice.rows, copy="TensorE identity matmul" + (", one per tap" if
                                                                                              choice.taps else ""),
                          **({"whole_rows": choice.whole} if choice.whole else {})))
    engine = {} if choice is None else {"engine": "TensorE into PSUM, ScalarE evicts" if choice.taps else
                                        "VectorE from PSUM"}
    if (op.pool.wx, sx, ox) != (1, 1, 0):
        prims.append(prim("window", "j", taps=op.pool.wx, stride=sx, offset=ox, op=op.pool.op, **engine))
    if (op.pool.wy, sy, oy) != (1, 1, 0):
        prims.append(prim("window", "i", taps=op.pool.wy, stride=sy, offset=oy, op=op.pool.op))
    if w.count == "inside":
        prims.append(prim("count", "inside"))
    if scale != 1.0:
        prims.append(prim("scale", float(f"{scale:.6g}"), **({"on": "ScalarE's evictions"} if choice is not None and
                                                              choice.taps else {})))
    return prims + [prim("stage_out", op.out)]


def build_pool(op: PoolOp, plan: PoolPlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    """Every standalone pool (overlapping, strided, padded, or window == stride: `windowed` makes that explicit)."""
    return build_window_pool(op.windowed(), plan, hbm, fresh)


def build_window_pool(op: PoolOp, plan: PoolPlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    split = interleaved(op, plan)
    if split is not None:
        return build_interleaved(op, plan, hbm, fresh, split)
    pool = _WindowPool(op, plan, hbm, fresh)
    return [("TILE_P", plan.tile_b), ("BAND", pool.OB)], pool.build()


@dataclass(frozen=True)
class Interleave:
    """Blocks of rows interleaved with the channel rows: partition b * G + g holds rows g*H/G.. of channel row b,
    a plain reshape of X (and of Y), so each band is one DMA in and one out over all partitions (16 DMA engines)
    instead of one per block. Output rows whose window leaves their block (the seams: at the blocks' edges,
    including the padding) are computed apart, on the channel rows alone."""
    blocks: int
    first: int  # block-local output rows first..end have their windows inside the block
    end: int
    seams: tuple[tuple[int, int], ...]  # runs of output rows [start, stop) computed apart


def interleaved(op: PoolOp, plan: PoolPlan) -> Interleave | None:
    """The interleaved form of a pool planned in row blocks (few channel rows), when X's and Y's rows split evenly
    into the blocks (G * H/G input rows, H/G = Ho/G * stride)."""
    w, G = op.window, plan.blocks
    assert w is not None
    B, H = op.dim("B"), op.dim("H")
    (sy, _), (oy, _) = w.stride, w.offset
    Ho, wy = w.out[0], op.pool.wy
    if G < 2 or plan.tile_b != B or B * G > PMAX or H % G or Ho % G or H // G != Ho // G * sy:
        return None
    first = -(oy // sy) if oy < 0 else 0
    end = min(Ho // G, (H // G - wy - oy) // sy + 1)
    if end - first < MIN_INTERLEAVED:
        return None
    rows = [g * (Ho // G) + r for g in range(G) for r in range(Ho // G) if not first <= r < end]
    seams: list[tuple[int, int]] = []
    for r in rows:
        seams = seams[:-1] + [(seams[-1][0], r + 1)] if seams and seams[-1][1] == r else seams + [(r, r + 1)]
    return Interleave(G, first, end, tuple(seams))


def interleaved_band(plan: PoolPlan, split: Interleave) -> int:
    """Output rows per band of an Interleave: INTERLEAVED_BANDS bands, or a `split` directive's band if smaller."""
    return min(plan.band, max(1, -(-(split.end - split.first) // INTERLEAVED_BANDS)))


def build_interleaved(op: PoolOp, plan: PoolPlan, hbm: dict[str, Buf], fresh: Fresh, split: Interleave) -> Built:
    """The seams first (small: their stores join the ordered chain of stores to Y early), then the interleaved
    bands."""
    w = op.window
    assert w is not None
    G, B, H = split.blocks, op.dim("B"), op.dim("H")
    (sy, sx), (oy, ox) = w.stride, w.offset
    Ho, Wo = w.out
    out: list[Stmt] = []
    shared = _Shared()
    lengths = {stop - start for start, stop in split.seams}
    if len(lengths) == 1 and w.count == "window" and B * len(split.seams) <= PMAX:
        # seams of one length side by side as blocks: one load each on its own DMA engines, one set of instructions
        pool = _WindowPool(op, PoolPlan(B, lengths.pop()), hbm, fresh, None, shared,
                           tuple(start for start, _ in split.seams))
        pool.note = " (the seams between blocks)"
        out += pool.build()
    for start, stop in split.seams if not out else ():
        seam = replace(op, window=replace(w, offset=(oy + start * sy, ox), out=(stop - start, Wo)))
        pool = _WindowPool(seam, PoolPlan(B, stop - start), hbm, fresh, (Ho, start), shared)
        pool.note = f"; output rows {start}..{stop} (a seam between blocks)"
        out += pool.build()
    rows = split.end - split.first
    main = replace(op, dims=(("B", B * G), ("H", H // G), ("W", op.dim("W"))),
                   window=replace(w, offset=(oy + split.first * sy, ox), out=(rows, Wo)))
    pool = _WindowPool(main, PoolPlan(B * G, interleaved_band(plan, split)), hbm, fresh, (Ho // G, split.first),
                       shared)
    pool.split_loads = True
    pool.note = f"; rows {split.first}..{split.end} of {G} blocks of {Ho // G} output rows, block g of row b on " \
        f"partition b * {G} + g"
    return [("TILE_P", B * G), ("BAND", pool.OB)], out + pool.build()


@dataclass
class _Shared:
    names: dict[str, str] = field(default_factory=dict)  # role and shape -> kernel name
    small: int = 0  # combines too small to share, so far
    ident: Buf | None = None  # the identity matrix of TensorE's copies into PSUM, once made


class _WindowPool:
    def __init__(self, op: PoolOp, plan: PoolPlan, hbm: dict[str, Buf], fresh: Fresh,
                 out_rows: tuple[int, int] | None = None, shared: "_Shared | None" = None,
                 starts: tuple[int, ...] = ()) -> None:
        """out_rows: (rows of Y per channel row, the first of them this pool writes) when the pool computes only
        some of Y's rows (a seam or the interleaved part of an Interleave); shared: what the pools of one
        Interleave share (the kernel names given so far, the turn of small combines); starts: the first output
        row of each block of plan.band rows, when the blocks are given (an Interleave's seams)."""
        assert op.window is not None
        self.op, self.plan, self.fresh, self.w = op, plan, fresh, op.window
        self.shared = _Shared() if shared is None else shared
        self.names = self.shared.names
        self.B, self.H, self.W = op.dim("B"), op.dim("H"), op.dim("W")
        self.Ho, self.Wo = op.window.out
        self.G = len(starts) or (plan.blocks if plan.tile_b == self.B and op.window.count == "window" else 1)
        y_rows, self.row0 = out_rows or (self.Ho, 0)
        xs, ys = (self.B, self.H, self.W), (self.B, y_rows, self.Wo)
        self.x3, s1 = hbm_view(hbm[op.src], xs, self.name(f"{op.src}_v", xs), op.line)
        self.o3, s2 = hbm_view(hbm[op.out], ys, self.name(f"{op.out}_v", ys), op.line)
        self.views = s1 + s2
        self.Rb = plan.band if starts else -(-self.Ho // self.G)  # output rows per block
        # block g's first output row; the last block ends with the output (it may redo a few rows of the one before)
        self.starts = list(starts) or [min(g * self.Rb, self.Ho - self.Rb) for g in range(self.G)]
        self.overlap = self.starts[-2] + self.Rb - self.starts[-1] if self.G > 1 else 0  # rows it must not store
        self.OB = min(plan.band, self.Rb)
        self.note = ""  # more of the block's label
        self.split_loads = False  # a band's input rows in two loads (load_parts)
        self.psum: int | None = None  # input rows per PSUM copy when the pass along x reads X through PSUM
        self.y_share: float | None = None  # VectorE's part of the pass along y then (the rest on GpSimdE)
        self.last_tile = False  # building the peeled last tile of a pool through PSUM (edge copies on VectorE)
        self.first_tile = False  # building the peeled first tile before TensorE's taps (border counts on VectorE)
        self.shared_bank: tuple[Buf, int] | None = None  # (PSUM tile, row): room left for full_rows (tensor_x_pass)
        self.taps = False  # TensorE sums the pass along x's taps into PSUM (16-bit sums; PsumChoice.taps)
        self.full_rows_n = 0  # output rows per band TensorE sums whole (with the taps; `full_block`)
        self.y_cut: int | None = None  # where the last split combine along y changed engines (combine_shared)
        # blocks of output rows (few channel rows, not interleaved): each band writes its rows of one tile-wide output
        # buffer, stored once per block after the bands (`block_stores`)
        self.tile_out: Buf | None = None

    def name(self, base: str, shape: tuple[int, ...]) -> str:  # one kernel name per role and shape
        key = f"{base}{shape}p{self.plan.tile_b * self.G}"  # buffers of one shape on as many partitions
        if key not in self.names:
            n = sum(k.startswith(base + "(") for k in self.names)
            self.names[key] = self.fresh(base if not n else f"{base}{n + 1}")
        return self.names[key]

    def build(self) -> list[Stmt]:
        op, G = self.op, self.G
        self.choose_psum()
        ident = self.identity() if self.psum is not None else []
        tiles = self.B // self.plan.tile_b
        note, line = f"for {dict(op.vars)['b']} (channel rows, tiles of TILE_P)", op.line_of("b")
        nest = loop("pb", tiles, self.tile_body(), note=note, line=line)
        if self.psum is not None and tiles >= PEEL_TILES:
            # the first tile from SBUF while the identity is made, the last with its pass along y shared: kept when
            # the three bodies' buffers fit (the capacity check counts a straight-line block's buffers as all live)
            nest = self.peeled(tiles, note, line) or nest
        label = f"{op.out} = {op.pool.op} pool {op.pool.wy}x{op.pool.wx} of {op.src}, stride " \
                f"{self.w.stride[0]}x{self.w.stride[1]}, offset {self.w.offset[0]},{self.w.offset[1]}"
        if G > 1:
            label += f"; {G} blocks of {self.Rb} output rows, each on {self.B} partitions"
        label += self.note
        return self.views + ident + [ir.Block(label, tuple(nest), op.line)]

    def peeled(self, tiles: int, note: str, line: int) -> list[Stmt]:
        """The partition-tile loop of a pool through PSUM with its first tile from SBUF (both passes shared between
        VectorE and GpSimdE: they start as soon as its rows arrive, while TensorE's identity is built and its first
        chunk is copied) and its last tile's pass along y shared (GpSimdE alone takes it in the other tiles, and VectorE
        would idle at the end); [] when the three bodies' buffers take more than 1 / PEEL_SBUF_PART of SBUF (the rest
        is left to the kernel's other operations)."""
        chosen = self.psum, self.y_share, self.taps
        self.psum, self.y_share, self.taps = None, None, False
        self.first_tile = chosen[2]  # (before TensorE's taps: ScalarE's evictions of the next tile are next)
        first = at_value(self.tile_body(), "pb", 0)
        self.first_tile = False
        self.psum, self.y_share, self.taps = chosen
        half = (tiles - 2) // 2
        if self.full_rows_n and self.taps and half >= 2:
            # the middle tiles in two halves, a tile of each per step: each body's allocations are their own sites,
            # so Y's band rotates through four buffers, and a tile's band does not wait for the store of the tile
            # two before to be acknowledged (with TensorE's whole windows the pass along y no longer sets the pace)
            body = shifted(self.tile_body(), "pb", 1) + shifted(self.tile_body(), "pb", 1 + half)
            middle = loop("pb", half, body, line=line,
                          note=note + f", from the second: tiles 1 + pb and 1 + pb + {half} per step")
            middle += at_value(self.tile_body(), "pb", tiles - 2) if (tiles - 2) % 2 else []
        else:
            middle = loop("pb", tiles - 2, shifted(self.tile_body(), "pb", 1), note=note + ", from the second",
                          line=line)
        self.y_share, self.last_tile = None, True
        last = at_value(self.tile_body(), "pb", tiles - 1)
        self.y_share, self.last_tile = chosen[1], False
        nest = [ir.Block("the first channel-row tile from SBUF (TensorE's identity is not ready yet)", tuple(first),
                         line), *middle,
                ir.Block("the last channel-row tile, its pass along y on VectorE and GpSimdE (both free by then)",
                         tuple(last), line)]
        return nest if passes.peak_usage(tuple(nest))[0] <= sbuf_budget(get_target()) // PEEL_SBUF_PART else []

    def tile_body(self) -> list[Stmt]:
        """Every band of one partition tile (loop variable pb), in the form self.psum / self.y_share say."""
        op, OB = self.op, self.OB
        sy, oy = self.w.stride[0], self.w.offset[0]
        wy = op.pool.wy
        nb = -(-self.Rb // OB)

        def regular(k: int) -> bool:  # a whole band inside X in every block: the band loop's body
            first, last = k * OB * sy + oy, self.starts[-1] * sy + k * OB * sy + oy
            return (k < nb - 1 or self.Rb % OB == 0) and first >= 0 and last + (OB - 1) * sy + wy <= self.H \
                and k * OB >= self.overlap
        regs = [k for k in range(nb) if regular(k)]
        body: list[Stmt] = []
        self.tile_out = None
        if self.G > 1 and nb > 1 and not self.row0 and BLOCK_STORES and self.block_stores(nb):
            self.tile_out = Buf(self.name(f"{op.out}_tile", (self.Rb,)), "sbuf", self.o3.dtype,
                                (self.plan.tile_b * self.G, self.Rb, self.Wo))
            body.append(Alloc(self.tile_out, line=op.line))
        k0, k1 = (regs[0], regs[-1] + 1) if regs else (nb, nb)
        for k in range(k0):
            body += self.band(k, a(k * OB), OB if k < nb - 1 else self.Rb - k * OB, None)
        if k1 > k0:
            o0 = Aff((term("yb", OB, "BAND"),), k0 * OB)
            lo = Aff((term("yb", OB * sy),), k0 * OB * sy + oy)
            body += loop("yb", k1 - k0, self.band(k0, o0, OB, lo), note=f"for {dict(op.vars)['i']} (bands of BAND "
                         "rows)", line=op.line_of("i"))
        for k in range(k1, nb):
            body += self.band(k, a(k * OB), OB if k < nb - 1 else self.Rb - k * OB, None)
        if self.tile_out is not None:  # one store per block (the last block without the rows it redoes)
            P, G = self.plan.tile_b, self.G
            pb = sl(a(term("pb", P, "TILE_P")), P)
            skip = [0] * (G - 1) + [self.overlap]
            body += [Dma(View(self.o3, (pb, Sl(a(self.starts[g] + skip[g]), self.Rb - skip[g]), full(self.Wo))),
                         View(self.tile_out, (sl(g * P, P), sl(skip[g], self.Rb - skip[g]), full(self.Wo))), op.line)
                     for g in range(G) if skip[g] < self.Rb]
        return body

    def block_stores(self, bands: int) -> bool:
        """Whether the blocks' rows are stored once per block after every band rather than per band. The model
        orders stores to one tensor whose HBM byte ranges interleave (tilec/perf/deps.py): each starts a DMA latency
        after the one before has moved its bytes, so per band the G blocks' stores cost bands * G latencies where
        once per block they cost G, after the last band's compute (the first band's stores would start after its
        compute instead). Once per block when the latencies it saves exceed the compute it waits for: the passes'
        combines of the bands after the first on VectorE and GpSimdE (tensor_tensor: 2 cycles per element, 1 on
        VectorE with every operand 16-bit; tilec/perf/costs.py)."""
        from tilec.perf.params import target_params
        prm = {name: value for name, value, _ in target_params(get_target().name).table()}
        (sy, sx), Wo = self.w.stride, self.Wo
        per_row = ((self.op.pool.wx - 1) * sy + self.op.pool.wy - 1) * Wo  # combined elements per output row
        half = self.x3.dtype in HALF and self.o3.dtype in HALF and self.op.pool.op != "add"  # (sums: fp32 partials)
        rate = prm["vector_ghz"] / (1 if half else 2) + prm["gpsimd_ghz"] / 2  # elements per ns, both engines
        later = (self.Rb - self.OB) * per_row / rate
        fits = self.Rb * Wo * DTYPE_BYTES[self.o3.dtype] <= sbuf_budget(get_target()) // BLOCK_STORES_SBUF_PART
        return fits and (bands - 1) * self.G * prm["dma_latency_ns"] > later

    def band(self, k: int, o0: Aff, n: int, lo_aff: Aff | None) -> list[Stmt]:
        """Output rows o0..o0+n of every partition tile (of every block): the input rows they read (lo_aff: a
        regular band's first row, affine in the band loop; None: a peeled band, clipped to X), the two passes, the
        store."""
        op, line, P, G, B = self.op, self.op.line, self.plan.tile_b, self.G, self.plan.tile_b
        (sy, sx), (oy, ox) = self.w.stride, self.w.offset
        first = k * self.OB * sy + oy
        if G == 1:
            lo, hi = max(first, 0), min(first + (n - 1) * sy + op.pool.wy, self.H)
        else:  # every block reads its whole window rows; rows outside X hold the identity (filled below)
            lo, hi = first, first + (n - 1) * sy + op.pool.wy
        rows = hi - lo
        pb = sl(a(term("pb", P, "TILE_P")), P)
        xb = Buf(self.name(f"{op.src}_band", (rows,)), "sbuf", self.x3.dtype, (P * G, rows, self.W))
        ob = Buf(self.name(f"{op.out}_band", (n,)), "sbuf", self.o3.dtype, (P * G, n, self.Wo))
        obv = whole(ob)  # the band's output rows
        if self.tile_out is not None:
            ob = self.tile_out
            obv = View(ob, (full(P * G), Sl(o0, n), full(self.Wo)))
        out: list[Stmt] = []
        if G == 1:
            out += [Alloc(xb, line=line)]
            start = lo_aff if lo_aff is not None else a(lo)
            for r0, r1 in self.load_parts(rows):  # VectorE's rows of the pass along x first: it starts sooner
                out.append(Dma(View(xb, (full(P), sl(r0, r1 - r0), full(self.W))) if (r0, r1) != (0, rows) else
                               whole(xb), View(self.x3, (pb, Sl(start.plus(r0), r1 - r0), full(self.W))), line))
        else:
            out += self.block_loads(xb, first, rows, lo_aff)
        out += [Alloc(ob, line=line)] if self.tile_out is None else []
        cur = whole(xb)
        if op.relu:
            rb = Buf(self.name(f"{op.src}_relu", xb.shape), "sbuf", "f32", xb.shape)
            out += [Alloc(rb, line=line), Act(whole(rb), cur, "relu", None, 1.0, line)]
            cur = whole(rb)
        tmp = "f32" if op.pool.op == "add" else cur.buf.dtype
        scale = op.pool.scale / (op.pool.wy * op.pool.wx if self.w.count == "inside" else 1)
        passes = []  # along x first (over every input row of the band), then along y over the x results
        if (op.pool.wx, sx, ox, self.Wo) != (1, 1, 0, self.W):
            passes.append((2, segments(self.Wo, ox, sx, op.pool.wx, self.W)))
        if (op.pool.wy, sy, first - lo, n) != (1, 1, 0, rows):
            passes.append((1, segments(n, first, sy, op.pool.wy, self.H) if G == 1 else
                           [Segment(0, n, tuple(range(op.pool.wy)))]))
        folded = 1.0  # the scale TensorE's evictions apply (then none after the passes)
        counted = self.w.count == "inside" and self.psum is not None and self.taps
        if self.psum is not None and self.taps:
            folded, scale = scale, 1.0
        for i, (axis, segs) in enumerate(passes):
            shape = (P * G, rows, self.Wo) if axis == 2 else (P * G, n, self.Wo)
            last = i == len(passes) - 1 and scale == 1.0 and (self.w.count != "inside" or counted)
            shift = ox if axis == 2 else first - lo
            stride, window = (sx, op.pool.wx) if axis == 2 else (sy, op.pool.wy)
            taps = axis == 2 and self.psum is not None and self.taps
            # a sum into 16-bit Y: the pass's partial sums stay fp32, only its last combine rounds (into Y's band);
            # count_include_pad=False through TensorE's taps: the outputs with fewer taps are scaled on the way there
            final = obv if last and op.pool.op == "add" and not taps and \
                ((ob.dtype in HALF and window > 2) or counted) else None
            dst = ob if last and final is None else \
                Buf(self.name(f"{op.out}_{'cols' if axis == 2 else 'rows'}", shape), "sbuf", tmp, shape)
            out += [] if dst == ob else [Alloc(dst, line=line)]
            dview = obv if dst == ob else whole(dst)
            block = self.full_block(segs, n) if axis == 1 and self.psum is not None and self.taps else None
            if taps:  # TensorE sums the taps, ScalarE evicts
                ahead = self.full_block(passes[1][1], n) if i + 1 < len(passes) and passes[1][0] == 1 else None
                out += self.tensor_x_pass(xb, dst, segs, stride, shift, window, folded, counted,
                                          ahead[1] if ahead is not None else 0)
            elif block is not None:  # TensorE sums whole windows for a block of rows, the pass along y the others
                m0, k = block
                out += self.full_rows(xb, ob, m0, k, shift, passes[0][1], folded, counted, self.shared_bank)
                for part in (clip(segs, 0, m0), clip(segs, m0 + k, n)):
                    if part:
                        out += self.window_pass(cur, dview, axis, part, stride, shift, window, final=final,
                                                counted=counted)
            elif axis == 2 and self.psum is not None:  # X through PSUM: VectorE reads it at 1 cycle per element
                out += self.psum_x_pass(xb, cur, dst, segs, stride, shift, window, final)
            else:
                out += self.window_pass(cur, dview, axis, segs, stride, shift, window, final=final,
                                        counted=counted)
            cur = final or dview
        if cur.buf != ob and self.w.count == "inside":  # each region of the tile by its own count (ScalarE)
            out += self.count_regions(cur, ob, [g for axis, g in passes if axis == 1], [g for axis, g in passes
                                                                                       if axis == 2], scale)
        elif cur.buf != ob:
            out.append(Act(obv, cur, "copy", None, scale, line) if scale != 1.0 else Copy(obv, cur, line))
        if G == 1:
            return out + [Dma(View(self.o3, (pb, Sl(o0.plus(self.row0), n), full(self.Wo))), whole(ob), line)]
        if self.tile_out is not None:  # stored once per block after the bands (tile_body)
            return out
        skip = [0] * (G - 1) + [max(0, self.overlap - k * self.OB) if lo_aff is None else 0]
        return out + [Dma(View(self.o3, (pb, Sl(o0.plus(self.starts[g] + skip[g]), n - skip[g]), full(self.Wo))),
                          View(ob, (sl(g * B, B), sl(skip[g], n - skip[g]), full(self.Wo))), line)
                      for g in range(G) if skip[g] < n]

    def choose_psum(self) -> None:
        """Whether the pass along x reads X through PSUM (psum_choice)."""
        if self.G == 1:
            choice = psum_choice(self.op, self.OB, self.B // self.plan.tile_b * -(-self.Rb // self.OB), self.x3.dtype,
                                 self.o3.dtype, self.B // self.plan.tile_b)
            if choice is not None:
                self.psum, self.y_share, self.taps = choice.rows, choice.y_share, choice.taps
                self.full_rows_n = choice.whole

    def identity(self) -> list[Stmt]:
        """The identity matrix of TensorE's copies (X's dtype), once per kernel, built on chip (build_util.identity)."""
        if self.shared.ident is not None:
            return []
        self.shared.ident, body = build_util.identity(self.fresh("ident"), self.x3.dtype, self.op.line)
        return [ir.Block("identity matrix (TensorE copies X's rows into PSUM with it)", tuple(body), self.op.line)]

    def psum_x_pass(self, xb: Buf, src: View, dst: Buf, segs: list[Segment], stride: int, shift: int,
                    window: int, final: View | None = None) -> list[Stmt]:
        """The pass along x with X read through PSUM: per chunk of the band's input rows (one PSUM bank), an
        identity matmul copies them (exact: each output is one input times 1), then the pass combines them on
        VectorE at 1 cycle per element into the same rows of dst."""
        line, P, rows = self.op.line, xb.shape[0], xb.shape[1]
        ident = self.shared.ident
        assert self.psum is not None and ident is not None and src.buf == xb
        out: list[Stmt] = []
        for r0 in range(0, rows, self.psum):
            cr = min(self.psum, rows - r0)
            ps = Buf(self.name(f"{self.op.src}_psum", (cr,)), "psum", "f32", (P, cr, self.W))
            out += [Alloc(ps, zero=True, line=line),
                    Matmul(whole(ps), View(ident, (sl(0, P), sl(0, P))), View(xb, (full(P), sl(r0, cr), full(self.W))),
                           line)]
            rows_of = (full(P), sl(r0, cr), full(self.Wo))
            out += self.window_pass(whole(ps), View(dst, rows_of), 2, segs, stride, shift, window,
                                    View(xb, (full(P), sl(r0, cr), full(self.W))),
                                    View(final.buf, rows_of) if final is not None else None)
        return out

    def tensor_x_pass(self, xb: Buf, dst: Buf, segs: list[Segment], stride: int, shift: int, window: int,
                      scale: float, counted: bool = False, whole_rows: int = 0) -> list[Stmt]:
        """The pass along x of a sum on TensorE: per chunk of the band's input rows (one PSUM bank), one identity
        matmul per tap accumulates the tap's strided view of the rows into the outputs it reaches (the tap every
        output has first, over all of them: it starts the accumulation), exact in fp32 PSUM; ScalarE evicts the
        chunk into the same rows of dst times `scale` (the average's 1 / count, when it is folded here); counted
        (count_include_pad=False): each run of columns with as many taps inside X times window / its taps.
        whole_rows: the rows `full_rows` sums next; when they fit in the last chunk's bank beside its rows, that
        chunk's PSUM tile takes them too (self.shared_bank), so a tile's sums take one bank fewer: with two tiles
        per step (`peeled`) the body's PSUM tiles then fit the 8 banks two buffers each, and no tile waits for the
        eviction of another site's tile (tilec/perf/schedule.py place_psum)."""
        line, P, rows, n = self.op.line, xb.shape[0], xb.shape[1], sum(g.size for g in segs)
        ident = self.shared.ident
        assert self.psum is not None and ident is not None
        every = [t for t in range(window) if all(t in g.taps for g in segs)]
        first = every[len(every) // 2]
        reach = {t: [g for g in segs if t in g.taps] for t in range(window) if t != first}
        spans = [(first, 0, n)] + [(t, gs[0].start, sum(g.size for g in gs)) for t, gs in reach.items() if gs]
        out: list[Stmt] = []
        self.shared_bank = None
        for r0 in range(0, rows, self.psum):
            cr = min(self.psum, rows - r0)
            extra = whole_rows if SHARE_BANK and r0 + cr == rows and \
                (cr + whole_rows) * n * 4 <= get_target().psum_bank_bytes else 0
            ps = Buf(self.name(f"{self.op.src}_taps", (cr + extra,)), "psum", "f32", (P, cr + extra, n))
            self.shared_bank = (ps, cr) if extra else None
            mine = full(cr) if not extra else sl(0, cr)  # the chunk's rows of ps
            out.append(Alloc(ps, zero=True, line=line))
            for t, o0, size in spans:
                step = stride if size > 1 else 1
                moving = View(xb, (full(P), sl(r0, cr), Sl(a(o0 * stride + t + shift), size, step)))
                out.append(Matmul(View(ps, (full(P), mine, sl(o0, size))), View(ident, (sl(0, P), sl(0, P))),
                                  moving, line))
            for cols, factor in eviction_runs(segs, window, counted):
                cols = cols if cols.size < n else full(n)
                out.append(Act(View(dst, (full(P), sl(r0, cr), cols)), View(ps, (full(P), mine, cols)), "copy",
                               None, scale * factor, line))
        return out

    def full_block(self, segs: list[Segment], n: int) -> tuple[int, int] | None:
        """(first output row, rows) of the band's outputs whose whole window TensorE sums (`full_rows`): the last
        FULL_ROWS of the run of rows with every tap inside X, as many as one PSUM bank and one matmul's moving
        columns hold; None without a pass along x through TensorE's taps."""
        inner = [g for g in segs if len(g.taps) == self.op.pool.wy]
        if not inner or self.G != 1 or self.w.out[1] * self.op.pool.wy == 0:
            return None
        t = get_target()
        k = min(self.full_rows_n, inner[0].size, min(t.psum_bank_bytes // 4, t.moving_fmax) // self.Wo)
        return (inner[0].start + inner[0].size - k, k) if k > 0 else None

    def full_rows(self, xb: Buf, ob: Buf, m0: int, k: int, shift_y: int, xsegs: list[Segment], scale: float,
                  counted: bool, bank: tuple[Buf, int] | None = None) -> list[Stmt]:
        """Output rows m0..m0+k (every window row inside X) summed whole on TensorE: one accumulating identity
        matmul per window row and column tap (the tap every output has first, over all of them: it starts the
        accumulation), the moving data a (row, column) strided view of the band; ScalarE evicts them into Y's band
        with the scale (and the columns' counts) folded in. TensorE, faster than the vector engines at 16-bit
        data, so takes rows off the pass along y. bank: (the PSUM tile, first row) where the pass along x's last
        chunk left room for them (tensor_x_pass), else a tile of their own."""
        (sy, sx), ox = self.w.stride, self.w.offset[1]
        line, P, n, wx = self.op.line, xb.shape[0], self.Wo, self.op.pool.wx
        ident = self.shared.ident
        assert ident is not None
        every = [t for t in range(wx) if all(t in g.taps for g in xsegs)]
        lead = every[len(every) // 2]
        reach = {t: [g for g in xsegs if t in g.taps] for t in range(wx) if t != lead}
        spans = [(lead, 0, n)] + [(t, gs[0].start, sum(g.size for g in gs)) for t, gs in reach.items() if gs]
        if bank is not None and bank[0].shape[1] - bank[1] == k:
            ps, mine = bank[0], sl(bank[1], k)
            out: list[Stmt] = []
        else:
            ps, mine = Buf(self.name(f"{self.op.src}_full", (k,)), "psum", "f32", (P, k, n)), full(k)
            out = [Alloc(ps, zero=True, line=line)]
        for p in range(self.op.pool.wy):
            for t, o0, size in spans:
                rows = Sl(a(m0 * sy + p + shift_y), k, sy if k > 1 else 1)
                moving = View(xb, (full(P), rows, Sl(a(o0 * sx + t + ox), size, sx if size > 1 else 1)))
                out.append(Matmul(View(ps, (full(P), mine, sl(o0, size))), View(ident, (sl(0, P), sl(0, P))),
                                  moving, line))
        for cols, factor in eviction_runs(xsegs, wx, counted):
            cols = cols if cols.size < n else full(n)
            out.append(Act(View(ob, (full(P), sl(m0, k), cols)), View(ps, (full(P), mine, cols)), "copy", None,
                           scale * factor, line))
        return out

    def load_parts(self, rows: int) -> list[tuple[int, int]]:
        """A band's input rows in two loads, cut where the pass along x splits them between VectorE and GpSimdE
        (combine_shared), so each engine waits only for its own rows: in an Interleave (few channel rows, so
        one partition tile, whose first band's load the engines otherwise wait for whole); one load when that pass
        is not shared."""
        op = self.op
        if self.psum is not None:  # each PSUM copy waits only for its own rows
            return [(r0, min(r0 + self.psum, rows)) for r0 in range(0, rows, self.psum)]
        if (op.pool.wx, self.w.stride[1], self.w.offset[1], self.Wo) == (1, 1, 0, self.W) or \
                rows * self.Wo < SHARE_MIN or op.relu or not self.split_loads:
            return [(0, rows)]
        tmp = "f32" if op.pool.op == "add" else self.x3.dtype
        cut = round(rows * _vector_share(self.x3.dtype, tmp))
        return [(0, cut), (cut, rows)] if 0 < cut < rows else [(0, rows)]

    def block_loads(self, xb: Buf, first: int, rows: int, lo_aff: Aff | None) -> list[Stmt]:
        """Block g's band rows onto partitions g*B..: one DMA each; a row outside X (only in a peeled band) holds
        the identity: 0 for a sum (the band zeroed first), the nearest row of X for a max or min (a row the window
        reads anyway, so it never changes the result)."""
        B, line, pad = self.plan.tile_b, self.op.line, []
        pb = sl(a(term("pb", B, "TILE_P")), B)
        out: list[Stmt] = []
        for g in range(self.G):
            start = first + self.starts[g] * self.w.stride[0]
            lo, hi = max(start, 0), min(start + rows, self.H)
            src = lo_aff.plus(self.starts[g] * self.w.stride[0]) if lo_aff is not None else a(lo)
            part = sl(g * B, B)
            out.append(Dma(View(xb, (part, sl(lo - start, hi - lo), full(self.W))),
                           View(self.x3, (pb, Sl(src, hi - lo), full(self.W))), line))
            pad += [(part, r, 0 if r + start < 0 else self.H - 1) for r in range(rows) if not lo <= r + start < hi]
        if pad and self.op.pool.op == "add":
            return [Alloc(xb, zero=True, line=line)] + out
        return [Alloc(xb, line=line)] + out + [Dma(View(xb, (part, sl(r, 1), full(self.W))),
                                                   View(self.x3, (pb, sl(src_row, 1), full(self.W))),
                                                   line) for part, r, src_row in pad]

    def window_pass(self, src: View, dst: View, axis: int, segs: list[Segment], stride: int, shift: int,
                    window: int, alone: View | None = None, final: View | None = None,
                    counted: bool = False) -> list[Stmt]:
        """dst = op over the window taps of src along `axis` (1: rows, 2: columns). With a tap t0 inside the input
        for every output: dst = op(t0, t1) where t1 reaches, t0 alone elsewhere (the border), then each other tap
        combined into the outputs it reaches; the large instructions are cut in row ranges between VectorE and
        GpSimdE so both finish together. Without such a tap (a 2-wide window padded on both sides), each segment
        is combined on its own. alone: src is in PSUM, which GpSimdE cannot read, and alone the same rows in SBUF:
        every combine on VectorE, the first one's second tap read from SBUF (at most one PSUM operand). final: the
        pass's result goes there (a 16-bit tile) and dst holds the partial sums (fp32): only the last combine, and
        copies of the outputs it does not reach, write final, so each output is rounded once. counted
        (count_include_pad=False, final given): see `counted_pass`. segs: consecutive, from any output on."""
        line, n, begin = self.op.line, sum(g.size for g in segs), segs[0].start
        every = [t for t in range(window) if all(t in g.taps for g in segs)]
        if counted and final is not None and len(every) < window:
            return self.counted_pass(src, dst, final, axis, segs, stride, shift, window, alone)
        out: list[Stmt] = []
        if every:
            t0 = every[len(every) // 2]
            reach = {t: [g for g in segs if t in g.taps] for t in range(window) if t != t0}
            ranges = {t: Segment(gs[0].start, sum(g.size for g in gs), (t,)) for t, gs in reach.items() if gs}
            order = sorted(ranges, key=lambda t: -ranges[t].size)
            if order:
                first = ranges[order[0]]
                into = final if final is not None and len(order) == 1 else dst
                out += self.combine_shared(into, axis, first, self._tap(src, axis, t0, shift, stride),
                                           self._tap(src if alone is None else alone, axis, order[0], shift, stride),
                                           alone is not None, src.buf.dtype)
                cut = self.y_cut if axis == 1 and ALIGN_CUTS else None  # the later combines change engines there too
                for lo, hi in ((begin, first.start), (first.start + first.size, begin + n)):  # t0 alone at the borders
                    if hi > lo:
                        edge = Segment(lo, hi - lo, (t0,))
                        out.append(self.edge_copy(self._view(into, axis, edge, 0, 1),
                                                  self._view(src, axis, edge, t0 + shift, stride)))
                for t in order[1:]:
                    if final is not None and t == order[-1]:  # the last combine: partial sums + tap t into final
                        partial = self._tap(dst, axis, 0, 0, 1)
                        out += self.combine_shared(final, axis, ranges[t], partial,
                                                   self._tap(src, axis, t, shift, stride), alone is not None,
                                                   src.buf.dtype, cut)
                        r = ranges[t]
                        for lo, hi in ((begin, r.start), (r.start + r.size, begin + n)):  # outputs tap t misses
                            if hi > lo:
                                edge = Segment(lo, hi - lo, ())
                                out.append(self.edge_copy(self._view(final, axis, edge, 0, 1),
                                                          self._view(dst, axis, edge, 0, 1)))
                    else:
                        out += self.combine_shared(dst, axis, ranges[t], None, self._tap(src, axis, t, shift, stride),
                                                   alone is not None, src.buf.dtype, cut)
            else:
                out.append(Copy(self._view(final or dst, axis, Segment(begin, n, (t0,)), 0, 1),
                                self._view(src, axis, Segment(begin, n, (t0,)), t0 + shift, stride), line))
        else:
            for seg in segs:
                out += self.combine(src if alone is None else alone, dst, axis, seg, stride, shift)
            if final is not None:
                out += [Copy(self._view(final, axis, g, 0, 1), self._view(dst, axis, g, 0, 1), line) for g in segs]
        return out

    def counted_pass(self, src: View, dst: View, final: View, axis: int, segs: list[Segment], stride: int,
                     shift: int, window: int, alone: View | None) -> list[Stmt]:
        """A pass of an average excluding the padding (count_include_pad=False) whose other pass's counts are
        already folded in (TensorE's taps: the columns' in the evictions): the outputs with every tap inside X
        (one run, the interior) as `window_pass` makes them, their last combine writing final; each border segment
        summed apart first (on GpSimdE: small; the two ends of a padding of one as one instruction, into a tile of
        their own so that their stepped view does not order them with the interior's) and written to final times
        window / its taps last (VectorE)."""
        line, engine = self.op.line, "gpsimd" if alone is None else ""
        inner = [g for g in segs if len(g.taps) == window]
        borders = [g for g in segs if not inner or g.start != inner[0].start]
        pair = len(borders) == 2 and all(g.size == 1 for g in borders) and \
            len(borders[0].taps) == len(borders[1].taps) and all(
                borders[1].start * stride + t1 > borders[0].start * stride + t0
                for t0, t1 in zip(borders[0].taps, borders[1].taps))
        sums: list[Stmt] = []
        scaled: list[Stmt] = []
        for g in [None] if pair else borders:
            if g is None:
                first, last = borders
                target = self._pair(final, axis, first.start, last.start)
                factor = window / len(first.taps)
                taps = [self._pair(src if alone is None else alone, axis, first.start * stride + t0 + shift,
                                   last.start * stride + t1 + shift) for t0, t1 in zip(first.taps, last.taps)]
                shape = tuple(2 if i == axis else n for i, n in enumerate(dst.shape()))
                ends = Buf(self.name(f"{self.op.out}_ends", shape), "sbuf", dst.buf.dtype, shape)
                sums.append(Alloc(ends, line=line))
                acc = whole(ends)
            else:
                target, factor = self._view(final, axis, g, 0, 1), window / len(g.taps)
                taps = [self._view(src if alone is None else alone, axis, g, t + shift, stride) for t in g.taps]
                acc = self._view(dst, axis, g, 0, 1)
            if len(taps) > 1:
                sums.append(Binary(acc, taps[0], taps[1], self.op.pool.op, line, engine))
                sums += [Binary(acc, acc, t, self.op.pool.op, line, engine) for t in taps[2:]]
                taps = [acc]
            scaled.append(Scalar(target, taps[0], "multiply", factor, line) if factor != 1.0 else
                          Copy(target, taps[0], line))
        inside = self.window_pass(src, dst, axis, inner[:1], stride, shift, window, alone, final) if inner else []
        return sums + inside + scaled

    @staticmethod
    def _pair(v: View, axis: int, p0: int, p1: int) -> View:
        """Elements p0 and p1 (> p0) of v along `axis` as one view (a step of p1 - p0)."""
        idx = list(v.idx)
        idx[axis] = Sl(a(p0), 2, p1 - p0)
        return View(v.buf, tuple(idx))

    def edge_copy(self, dst: View, src: View) -> Stmt:
        """A border's lone tap: on ScalarE, which has room (it only scales each tile once) unless the per-region
        counts of count_include_pad=False keep it busy, or the tap is in PSUM (the pass along x from PSUM: ScalarE,
        in order, would hold the next band's pass behind this band's scale) or the tile is the last of a peeled
        pool (its pass along y would wait behind the tile before's scale); else VectorE."""
        if self.w.count == "inside" or src.buf.memory == "psum" or self.last_tile:
            return Copy(dst, src, self.op.line)
        return Act(dst, src, "copy", None, 1.0, self.op.line)

    def _tap(self, src: View, axis: int, t: int, shift: int,
             stride: int) -> Callable[[Segment, tuple[int, int] | None], View]:
        return lambda seg, part: self._view(src, axis, seg, t + shift, stride, part)

    def combine_shared(self, dst: View, axis: int, seg: Segment, a_tap: Callable | None, b_tap: Callable,
                       alone: bool = False, src: str = "", cut_at: int | None = None) -> list[Stmt]:
        """dst[seg] = op(a_tap or dst, b_tap) over seg, in row ranges: VectorE the first, GpSimdE the rest (rows are
        the other free axis of a pass along x, the pass's own axis along y: either way each engine writes whole
        rows, which the dependence tracking sees as disjoint); src: the taps' dtype (VectorE's rate doubles when it
        and dst's are 16-bit). cut_at (a pass along y): the output row where the pass's first combine changed
        engines, so that this one changes there too and each engine reads back only the rows it wrote (a cut of
        its own, from its own segment's size, can give VectorE a row GpSimdE wrote: a wait across the engines
        every band; measured, bf16 avgpool 3x3 s1 batch 8, 4 whole rows: 44.54 -> 42.62 us). The cut of a pass
        along y that splits is left in `self.y_cut` for the pass's later combines."""
        share = _vector_share(src or dst.buf.dtype, dst.buf.dtype)
        if axis == 1 and self.y_share is not None:  # VectorE also runs the pass along x (psum_x_pass)
            share = self.y_share

        engine = ""
        if alone:
            share = 1.0
        elif seg.size * dst.shape()[3 - axis] < SHARE_MIN:  # small: a second instruction's fixed cost outweighs it
            share, engine = 1.0, self.small_engine()
        jobs: list[tuple[Segment, tuple[int, int] | None, str]] = []
        if axis == 2:
            rows = dst.shape()[1]
            cut = round(rows * share)
            jobs = [(seg, (0, cut), ""), (seg, (cut, rows - cut), "gpsimd")] if 0 < cut < rows else \
                [(seg, None, engine)]
        else:
            cut = round(seg.size * share)
            if cut_at is not None and not engine and share != 1.0 and cut > cut_at - seg.start:
                cut = min(max(cut_at - seg.start, 0), seg.size)
            self.y_cut = seg.start + cut if 0 < cut < seg.size else None
            jobs = [(Segment(seg.start, cut, seg.taps), None, ""),
                    (Segment(seg.start + cut, seg.size - cut, seg.taps), None, "gpsimd")] \
                if 0 < cut < seg.size else [(seg, None, "gpsimd" if cut == 0 and share == 0 else engine)]
        out: list[Stmt] = []
        for part_seg, part, eng in jobs:
            target = self._view(dst, axis, part_seg, 0, 1, part)
            first = a_tap(part_seg, part) if a_tap is not None else target
            out.append(Binary(target, first, b_tap(part_seg, part), self.op.pool.op, self.op.line, eng))
        return out

    def small_engine(self) -> str:
        """The engine of a combine too small to share: VectorE and GpSimdE in turn (within an Interleave's pools
        too), so neither collects them all."""
        self.shared.small += 1
        return "gpsimd" if self.shared.small % 2 == 0 else ""

    def count_regions(self, src: View, ob: Buf, ysegs: list[list[Segment]], xsegs: list[list[Segment]],
                      scale: float) -> list[Stmt]:
        """count_include_pad=False: the result scaled on ScalarE region by region, each (row segment, column
        segment) by scale * (wy / its row taps) * (wx / its column taps): one instruction for the interior, small
        ones for the borders, none on the vector engines; in the peeled first tile before TensorE's taps the borders'
        on VectorE (idle until the next tile's evictions, which ScalarE, in order, would hold behind them)."""
        ys = ysegs[0] if ysegs else [Segment(0, ob.shape[1], (0,))]
        xs = xsegs[0] if xsegs else [Segment(0, ob.shape[2], (0,))]
        wy, wx = (self.op.pool.wy, self.op.pool.wx)
        out: list[Stmt] = []
        for y in ys:
            for x in xs:
                idx = (full(ob.shape[0]), Sl(a(y.start), y.size), Sl(a(x.start), x.size))
                factor = scale * (wy / len(y.taps) if ysegs else 1) * (wx / len(x.taps) if xsegs else 1)
                border = len(y.taps) < wy or len(x.taps) < wx
                out.append(Scalar(View(ob, idx), View(src.buf, idx), "multiply", factor, self.op.line)
                           if self.first_tile and border else
                           Act(View(ob, idx), View(src.buf, idx), "copy", None, factor, self.op.line))
        return out

    def _view(self, v: View, axis: int, seg: Segment, offset: int, step: int,
              part: tuple[int, int] | None = None) -> View:
        """Outputs seg of a pass as a view of v: along `axis` from seg.start * step + offset by step; along the
        other free axis `part` (start, size), else all of it. Positions count from v's own slices (a band's rows of
        a tile-wide output, `tile_out`)."""
        idx = list(v.idx)
        idx[axis] = _within(idx[axis], seg.start * step + offset, seg.size, step)
        if part is not None:
            idx[3 - axis] = _within(idx[3 - axis], part[0], part[1], 1)
        return View(v.buf, tuple(idx))

    def combine(self, src: View, dst: View, axis: int, seg: Segment, stride: int, shift: int) -> list[Stmt]:
        """dst's outputs of one segment = op over its taps (VectorE)."""
        op, line = self.op, self.op.line
        target = self._view(dst, axis, seg, 0, 1)
        taps = [self._view(src, axis, seg, t + shift, stride) for t in seg.taps]
        if len(taps) == 1:
            return [Copy(target, taps[0], line)]
        out: list[Stmt] = [Binary(target, taps[0], taps[1], op.pool.op, line)]
        return out + [Binary(target, target, t, op.pool.op, line) for t in taps[2:]]


def _within(s: ir.Idx, start: int, size: int, step: int) -> Sl:
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


@dataclass(frozen=True)
class PsumChoice:
    rows: int  # input rows per PSUM chunk (one bank)
    y_share: float | None  # VectorE's part of the pass along y (None: the SBUF form's share)
    taps: bool  # TensorE sums the pass along x's taps (16-bit sums) rather than copying X for VectorE
    whole: int = 0  # with the taps: output rows per band TensorE sums whole (`full_rows`), off the pass along y


def psum_choice(op: PoolOp, band: int, bands: int, x: str, out: str, tiles: int = PEEL_TILES) -> PsumChoice | None:
    """How the pass along x of a pool computed in `bands` bands of `band` output rows uses PSUM, or None. TensorE,
    idle in a pool, either copies each chunk of a band's input rows there with an identity matmul (VectorE's
    tensor_tensor then streams 1 cycle per element instead of 2, but GpSimdE, which cannot read PSUM, leaves that
    pass to VectorE and takes more of the pass along y), or, for a sum of 16-bit data, sums the taps there itself
    (one accumulating identity matmul per tap: 16-bit matmuls stream 2.4 columns per ns, faster than any other
    engine) for ScalarE to evict, leaving VectorE and GpSimdE only the pass along y: chosen when the model's costs
    (psum_costs, taps_costs) make the bands' busiest engine faster that way by more than the identity matrix's
    set-up (identity_ns). `tiles`: partition tiles; with fewer than PEEL_TILES (no peeled first tile beside
    TensorE's warm-up throttle) the taps' whole rows are picked with the throttle's hold counted (`throttled`)."""
    w = op.window
    assert w is not None
    W, Wo = op.dim("W"), w.out[1]
    if op.relu or (op.pool.wx, w.stride[1], w.offset[1], Wo) == (1, 1, 0, W) or PSUM == "off":
        return None
    chunk = min(get_target().psum_bank_bytes // 4, get_target().moving_fmax) // W
    if chunk < 1:
        return None
    rows = (band - 1) * w.stride[0] + op.pool.wy
    tmp = "f32" if op.pool.op == "add" else x
    y_pass = (op.pool.wy, w.stride[0], w.offset[0]) != (1, 1, 0)
    edges = border_copies(segments(Wo, w.offset[1], w.stride[1], op.pool.wx, W), op.pool.wx)
    sbuf, psum, share = psum_costs(x, tmp, out, rows, band, Wo, W, op.pool.wx, op.pool.wy if y_pass else 1, chunk,
                                   edges)
    setup = identity_ns(2 if x in ("f16", "bf16") else 4)  # the identity's on-chip build, paid once
    segs = segments(Wo, w.offset[1], w.stride[1], op.pool.wx, W)
    reach = [sum(g.size for g in segs if t in g.taps) for t in range(op.pool.wx)]
    taps = None
    if x in ("f16", "bf16") and op.pool.op == "add" and any(r == Wo for r in reach) and TAPS != "off":
        # (count_include_pad=False: the columns' counts in the evictions, the rows' on VectorE in the pass along y)
        chunk_t = min(get_target().psum_bank_bytes // 4, get_target().moving_fmax) // Wo
        runs = len(eviction_runs(segs, op.pool.wx, w.count == "inside"))
        ysegs = segments(w.out[0], w.offset[0], w.stride[0], op.pool.wy, op.dim("H")) if y_pass else []
        counts = sum(len(g.taps) < op.pool.wy for g in ysegs) if w.count == "inside" else 0  # (at most, per band)
        if chunk_t >= 1:
            wy, taken = op.pool.wy if y_pass else 1, [r for r in reach if r]
            costs = [taps_costs(rows, band, Wo, taken, wy, chunk_t, runs, counts, k)
                     for k in range(min(band, chunk_t) + 1 if wy > 1 and FULL_ROWS is None else 1)]
            # the fewest whole rows within WHOLE_SLACK of the best (each row of them adds wy matmuls per tap)
            whole = next(k for k, c in enumerate(costs) if c <= min(costs) * (1 + WHOLE_SLACK))
            fewest = whole  # (the taps against the SBUF form below: with the band's estimate of `whole` rows)
            if tiles >= PEEL_TILES and len(costs) > 1 and WHOLE_PEELED:
                fewest = peeled_whole(op, rows, band, bands // tiles, bands, Wo, taken, wy, chunk_t, runs, counts,
                                      sbuf, len(costs))
            if tiles < PEEL_TILES:  # nothing peeled runs beside TensorE's warm-up throttle: with few bands its
                # hold can end the kernel (measured, bf16 avgpool 3x3 s1 batch 1: whole rows 3 -> 0, 8.52 -> 8.15 us)
                totals = [max(bands * c, throttled(bands * taps_costs(rows, band, Wo, taken, wy, chunk_t, runs,
                                                                       counts, k, "tensor")))
                          for k, c in enumerate(costs)]
                fewest = next(k for k, c in enumerate(totals) if c <= min(totals) * (1 + WHOLE_SLACK))
            taps = chunk_t, costs[whole], fewest if FULL_ROWS is None else FULL_ROWS  # (chosen or not with the
            # costs of `whole` rows)
    # (the set-up counted twice for the taps: they leave the pass along x to TensorE, so until the identity is
    # there, no engine starts a band; the copies' pass along x waits for it too, but VectorE starts the rest.
    # Both forms also expose one band's time: their engines work in a chain, TensorE -> VectorE -> GpSimdE, which
    # fills at the first band and drains at the last, where the SBUF form splits each pass between two engines)
    if taps is not None and (taps[1] < psum or TAPS == "on") and (
            bands * (sbuf - taps[1]) > 2 * setup + taps[1] or PSUM == "on"):
        return PsumChoice(taps[0], None, True, taps[2])
    return PsumChoice(chunk, share, False) if bands * (sbuf - psum) > setup + psum or PSUM == "on" else None


def peeled_whole(op: PoolOp, rows: int, band: int, per: int, bands: int, wo: int, reach: list[int], wy: int,
                 chunk: int, runs: int, counts: int, sbuf: float, most: int) -> int:
    """The whole rows per band (`full_rows`) of a pool whose first partition tile is peeled (PEEL_TILES): that tile's
    `per` bands run in the SBUF form on VectorE and GpSimdE (`sbuf` ns each, psum_costs) while TensorE starts the
    others' taps, so the vector engines' pass along y of the other bands comes after them; TensorE's taps, ahead of
    the chain, leave the last band's pass along y after them; ScalarE evicts. The fewest rows whose kernel-long
    busiest engine is within WHOLE_SLACK of the best. A band's estimate alone (taps_costs) balances TensorE against
    the vector engines and misses the peeled tile's head start (measured, bf16 avgpool 3x3 s1 batch 8, 28 x 28:
    3 whole rows 43.44 us, 4 42.67, 5 41.98, 6 43.39). The taps' input rows: those inside X (the padding is not
    loaded), averaged over a tile's bands."""
    w = op.window
    assert w is not None
    H, sy, oy = op.dim("H"), w.stride[0], w.offset[0]
    inside = sum(max(0, min(H, b * band * sy + oy + rows) - max(0, b * band * sy + oy)) for b in range(per))
    loaded = max(1, round(inside / per))
    rest = bands - per  # the bands through TensorE's taps
    totals = []
    for k in range(most):
        tensor = taps_costs(loaded, band, wo, reach, wy, chunk, runs, counts, k, "tensor")
        scalar = taps_costs(loaded, band, wo, reach, wy, chunk, runs, counts, k, "scalar")
        vector = taps_costs(loaded, band, wo, reach, wy, chunk, runs, counts, k, "vector")
        totals.append(max(rest * tensor + vector, rest * scalar, per * sbuf + rest * vector))
    return next(k for k, c in enumerate(totals) if c <= min(totals) * (1 + WHOLE_SLACK))


def throttled(busy: float) -> float:
    """When TensorE finishes `busy` ns of back-to-back work under Trn2's warm-up throttle as the model applies it
    (tilec/perf/throttle.py: at most start_fraction of the first ramp_ns busy, then full speed)."""
    from tilec.perf.params import target_params
    prm = {name: value for name, value, _ in target_params(get_target().name).table()}
    f0, ramp = prm["throttle_start_fraction"], prm["throttle_ramp_ns"]
    if f0 >= 1.0 or ramp <= 0.0 or busy <= f0 * ramp:
        return busy
    return ramp + busy - f0 * ramp


def taps_costs(rows: int, n: int, wo: int, reach: list[int], wy: int, chunk: int, runs: int = 1,
               counts: int = 0, whole: int = 0, engine: str = "") -> float:
    """A band's busiest engine (ns) when TensorE sums the pass along x's taps (16-bit moving data; reach: the
    outputs each tap reaches) over chunks of `chunk` input rows, ScalarE evicts each chunk in `runs` runs of columns
    (count_include_pad=False: one per column count; and copies the pass along y's two border rows), VectorE and
    GpSimdE share the pass along y's wy - 1 combines of n x wo elements from SBUF (fp32: 2 cycles per element on
    both) and VectorE scales `counts` runs of border rows (count_include_pad=False), from the model's costs
    (tilec/perf/costs.py, params.py); whole: output rows TensorE sums whole instead (`full_rows`: wy matmuls per
    tap, one more eviction per run, those rows off the pass along y)."""
    from tilec.perf.params import target_params
    prm = {name: value for name, value, _ in target_params(get_target().name).table()}
    mn, sv, ss = prm["min_ii_cycles"], prm["vector_static_cycles"], prm["scalar_static_cycles"]
    chunks = [min(chunk, rows - r0) for r0 in range(0, rows, chunk)]
    tensor = sum(max(prm["mm_min_cycles"], c * r) + prm["mm_fixed_cycles"] for c in chunks for r in reach)
    tensor += wy * sum(max(prm["mm_min_cycles"], whole * r) + prm["mm_fixed_cycles"] for r in reach) if whole else 0
    scalar = sum(max(mn, c * wo) + ss + (runs - 1) * (max(mn, c) + ss) for c in chunks) + \
        (2 * (max(mn, wo) + ss) if wy > 1 and not counts else 0) + \
        (max(mn, whole * wo) + ss + (runs - 1) * (max(mn, whole) + ss) if whole else 0)
    vghz, gghz = prm["vector_ghz"], prm["gpsimd_ghz"]
    vector = (wy - 1) * ((n - whole) * wo / (vghz / 2 + gghz / 2) + sv / vghz) + \
        counts * (max(mn, wo) + sv) / vghz
    times = {"tensor": tensor / prm["tensor_ghz"], "scalar": scalar / prm["scalar_ghz"], "vector": vector}
    return times[engine] if engine else max(times.values())


def _vector_share(src: str, dst: str) -> float:
    """The part of a pass VectorE takes so that it and GpSimdE finish together: tensor_tensor streams 2 cycles per
    element on both, 1 on VectorE when every operand is 16-bit (the model's costs, tilec/perf/costs.py)."""
    t = get_target()
    vector = t.vector_ghz * (2 if src in ("f16", "bf16") and dst in ("f16", "bf16") else 1)
    return vector / (vector + t.gpsimd_ghz)


def identity_ns(itemsize: int) -> float:
    """The set-up of the identity matrix in the model (build_util.identity_ns: built on chip)."""
    return build_util.identity_ns(itemsize)


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


def psum_costs(x: str, tmp: str, out: str, rows: int, n: int, wo: int, w: int, wx: int, wy: int,
               chunk: int, edges: int = 2) -> tuple[float, float, float]:
    """A band's two passes (wx - 1 combines of rows x wo elements along x, wy - 1 of n x wo along y, and a border
    copy at each end of each pass) as the busiest engine's time (ns) in both forms, from the model's costs
    (tilec/perf/costs.py, params.py): (both passes shared between VectorE and GpSimdE from SBUF; the pass along x
    on VectorE from PSUM after TensorE's copies, per chunk of rows; VectorE's part of the pass along y in that form,
    the rest on GpSimdE; edges: the pass along x's border copies per chunk, on VectorE from PSUM, those of the pass
    along y on ScalarE). tensor_tensor streams 2 cycles per element on both engines, 1 on VectorE with a PSUM
    input or all 16-bit data, each instruction pays its engine's static cycles; a fp32 matmul costs mm_fp32_factor
    times its columns."""
    from tilec.perf.params import target_params  # the performance model's own constants, late: perf reads kernels
    prm = {name: value for name, value, _ in target_params(get_target().name).table()}
    half = ("f16", "bf16")
    vghz, gghz, mn = prm["vector_ghz"], prm["gpsimd_ghz"], prm["min_ii_cycles"]
    sv, sg = prm["vector_static_cycles"], prm["gpsimd_static_cycles"]
    cx = 1 if x in half and tmp in half else 2  # VectorE cycles per element of a pass from SBUF
    cy = 1 if tmp in half and out in half else 2
    work_x, work_y = (wx - 1) * rows * wo, (wy - 1) * n * wo
    rate_x, rate_y = vghz / cx + gghz / 2, vghz / cy + gghz / 2
    sbuf = work_x / rate_x + work_y / rate_y + ((wx - 1) + (wy - 1)) * sv / vghz  # (border copies on ScalarE)
    chunks = [min(chunk, rows - r0) for r0 in range(0, rows, chunk)]
    vec_x = sum((wx - 1) * (c * wo + sv) + edges * (max(mn, c) + sv) for c in chunks) / vghz
    best = (float("inf"), 0)
    for rv in range(n + 1):  # output rows of the pass along y on VectorE
        vec = vec_x + ((wy - 1) * (cy * rv * wo + sv) / vghz if rv else 0)
        gps = (wy - 1) * (2 * (n - rv) * wo + sg) / gghz if rv < n and wy > 1 else 0
        best = min(best, (max(vec, gps), rv))
    factor = prm["mm_fp32_factor"] if x == "f32" else 1.0
    mm = sum(max(prm["mm_min_cycles"], c * w) + prm["mm_fixed_cycles"] for c in chunks) * factor / prm["tensor_ghz"]
    return sbuf, max(best[0], mm), best[1] / n
