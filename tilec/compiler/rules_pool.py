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
"""
from __future__ import annotations

from dataclasses import dataclass

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh, hbm_view
from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.ir import Act, Aff, Alloc, Binary, Buf, Copy, Dma, Scalar, Sl, Stmt, View, full, whole
from tilec.compiler.ops import PoolOp
from tilec.compiler.rules import Prim, prim
from tilec.compiler.schedule import PoolPlan

Built = tuple[list[tuple[str, int]], list[Stmt]]


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


def pool(op: PoolOp, plan: PoolPlan) -> list[Prim]:
    """The schedule of a window pool as primitives (printable; `build_window_pool` lowers it)."""
    w = op.window
    assert w is not None
    (sy, sx), (oy, ox) = w.stride, w.offset
    rows = (plan.band - 1) * sy + op.pool.wy
    scale = op.pool.scale / (op.pool.wy * op.pool.wx if w.count == "inside" else 1)
    prims = [prim("partition", "b", plan.tile_b), prim("split", "i", plan.band, name="BAND"),
             prim("stage", op.src, rows=rows, halo=(oy, oy + rows - sy * plan.band))]
    if (op.pool.wx, sx, ox) != (1, 1, 0):
        prims.append(prim("window", "j", taps=op.pool.wx, stride=sx, offset=ox, op=op.pool.op))
    if (op.pool.wy, sy, oy) != (1, 1, 0):
        prims.append(prim("window", "i", taps=op.pool.wy, stride=sy, offset=oy, op=op.pool.op))
    if w.count == "inside":
        prims.append(prim("count", "inside"))
    if scale != 1.0:
        prims.append(prim("scale", float(f"{scale:.6g}")))
    return prims + [prim("stage_out", op.out)]


def build_window_pool(op: PoolOp, plan: PoolPlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    return [("TILE_P", plan.tile_b), ("BAND", plan.band)], _WindowPool(op, plan, hbm, fresh).build()


class _WindowPool:
    def __init__(self, op: PoolOp, plan: PoolPlan, hbm: dict[str, Buf], fresh: Fresh) -> None:
        assert op.window is not None
        self.op, self.plan, self.fresh, self.w = op, plan, fresh, op.window
        self.B, self.H, self.W = op.dim("B"), op.dim("H"), op.dim("W")
        self.Ho, self.Wo = op.window.out
        self.x3, s1 = hbm_view(hbm[op.src], (self.B, self.H, self.W), fresh(f"{op.src}_v"), op.line)
        self.o3, s2 = hbm_view(hbm[op.out], (self.B, self.Ho, self.Wo), fresh(f"{op.out}_v"), op.line)
        self.views = s1 + s2
        self.names: dict[str, str] = {}

    def name(self, base: str, shape: tuple[int, ...]) -> str:  # one kernel name per role and shape
        key = f"{base}{shape}"
        if key not in self.names:
            n = sum(k.startswith(base + "(") for k in self.names)
            self.names[key] = self.fresh(base if not n else f"{base}{n + 1}")
        return self.names[key]

    def build(self) -> list[Stmt]:
        op, OB = self.op, self.plan.band
        sy, oy = self.w.stride[0], self.w.offset[0]
        wy = op.pool.wy
        nb = -(-self.Ho // OB)

        def regular(k: int) -> bool:  # a whole band inside X: the band loop's body
            first = k * OB * sy + oy
            return (k < nb - 1 or self.Ho % OB == 0) and first >= 0 and first + (OB - 1) * sy + wy <= self.H
        regs = [k for k in range(nb) if regular(k)]
        body: list[Stmt] = []
        k0, k1 = (regs[0], regs[-1] + 1) if regs else (nb, nb)
        for k in range(k0):
            body += self.band(k, a(k * OB), OB if k < nb - 1 else self.Ho - k * OB, None)
        if k1 > k0:
            o0 = Aff((term("yb", OB, "BAND"),), k0 * OB)
            lo = Aff((term("yb", OB * sy),), k0 * OB * sy + oy)
            body += loop("yb", k1 - k0, self.band(k0, o0, OB, lo), note=f"for {dict(op.vars)['i']} (bands of BAND "
                         "rows)", line=op.line_of("i"))
        for k in range(k1, nb):
            body += self.band(k, a(k * OB), OB if k < nb - 1 else self.Ho - k * OB, None)
        nest = loop("pb", self.B // self.plan.tile_b, body, note=f"for {dict(op.vars)['b']} (channel rows, tiles "
                    "of TILE_P)", line=op.line_of("b"))
        label = f"{op.out} = {op.pool.op} pool {op.pool.wy}x{op.pool.wx} of {op.src}, stride " \
                f"{self.w.stride[0]}x{self.w.stride[1]}, offset {self.w.offset[0]},{self.w.offset[1]}"
        return self.views + [ir.Block(label, tuple(nest), op.line)]

    def band(self, k: int, o0: Aff, n: int, lo_aff: Aff | None) -> list[Stmt]:
        """Output rows o0..o0+n of every partition tile: the input rows they read (lo_aff: a regular band's first
        row, affine in the band loop; None: a peeled band, clipped to X), the two passes, the store."""
        op, line, P = self.op, self.op.line, self.plan.tile_b
        (sy, sx), (oy, ox) = self.w.stride, self.w.offset
        first = k * self.plan.band * sy + oy
        lo, hi = max(first, 0), min(first + (n - 1) * sy + op.pool.wy, self.H)
        rows = hi - lo
        pb = sl(a(term("pb", P, "TILE_P")), P)
        xb = Buf(self.name(f"{op.src}_band", (rows,)), "sbuf", self.x3.dtype, (P, rows, self.W))
        ob = Buf(self.name(f"{op.out}_band", (n,)), "sbuf", self.o3.dtype, (P, n, self.Wo))
        out: list[Stmt] = [Alloc(xb, line=line),
                           Dma(whole(xb), View(self.x3, (pb, Sl(lo_aff if lo_aff is not None else a(lo), rows),
                                                         full(self.W))), line),
                           Alloc(ob, line=line)]
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
            passes.append((1, segments(n, first, sy, op.pool.wy, self.H)))
        for i, (axis, segs) in enumerate(passes):
            shape = (P, rows, self.Wo) if axis == 2 else (P, n, self.Wo)
            last = i == len(passes) - 1 and scale == 1.0
            dst = ob if last else Buf(self.name(f"{op.out}_{'cols' if axis == 2 else 'rows'}", shape), "sbuf", tmp,
                                      shape)
            out += [] if last else [Alloc(dst, line=line)]
            shift = ox if axis == 2 else first - lo
            stride, window = (sx, op.pool.wx) if axis == 2 else (sy, op.pool.wy)
            for seg in segs:
                out += self.combine(cur, dst, axis, seg, stride, shift, window)
            cur = whole(dst)
        if cur.buf != ob:
            out.append(Act(whole(ob), cur, "copy", None, scale, line) if scale != 1.0 else Copy(whole(ob), cur, line))
        return out + [Dma(View(self.o3, (pb, Sl(o0, n), full(self.Wo))), whole(ob), line)]

    def combine(self, src: View, dst: Buf, axis: int, seg: Segment, stride: int, shift: int,
                window: int) -> list[Stmt]:
        """dst's outputs of one segment = op over its taps' strided views of src (axis 1: rows, 2: columns)."""
        op, line = self.op, self.op.line

        def view(buf_view: View, start: int, step: int) -> View:
            idx = list(buf_view.idx)
            idx[axis] = Sl(a(start), seg.size, step if seg.size > 1 else 1)
            return View(buf_view.buf, tuple(idx))
        target = view(whole(dst), seg.start, 1)
        taps = [view(src, seg.start * stride + t + shift, stride) for t in seg.taps]
        factor = window / len(seg.taps) if self.w.count == "inside" else 1.0
        if len(taps) == 1:
            return [Scalar(target, taps[0], "multiply", factor, line) if factor != 1.0 else Copy(target, taps[0], line)]
        out: list[Stmt] = [Binary(target, taps[0], taps[1], op.pool.op, line)]
        out += [Binary(target, target, t, op.pool.op, line) for t in taps[2:]]
        if factor != 1.0:
            out.append(Scalar(target, target, "multiply", factor, line))
        return out
