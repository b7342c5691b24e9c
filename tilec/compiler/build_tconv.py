"""A transposed convolution's matmul and its depth-to-space permute built as one part, the result kept on chip
(issue 13; tconv_split.py makes the two ops: `T[n, k, a, b, y, x] = X[n, :, y, x] . Wt[:, k, a, b]`, then
`Y[n, k, y, a, x, b] = T[n, k, a, b, y, x]`).

Built apart, T goes to HBM and back: the matmul's rows are Wt's (k, a, b), and the permute needs each k's taps on
one partition. Here each tap (a, b) is a matmul of its own whose stationary is Wt[:, :, a, b] (K columns), so its
result has k on the partitions; the eviction writes it into the tap's strided place of one SBUF tile laid out as Y
([k, y, a, x, b]), and one contiguous DMA stores the tile. TensorE streams each input pixel once per tap instead of
once for all taps (K columns instead of 4K), which costs where the matmul is TensorE-bound (fp32) and not where the
layer is DMA-bound; on the model it was faster in both dtypes at the U-Net size (docs/notes/tconv24.md).

With K = 32 or 64 output channels a tap uses a quarter or half of the partitions: G = 128 / K groups of rows then
sit side by side on the partitions (group g's matmuls write PSUM partitions [g*K, g*K + K)), so the evictions and
the store use all partitions and DMA engines (a store from 64 partitions has half of them). Group g takes rows
[g*hb, g*hb + hb) of each band of G*hb input rows: one DMA loads the band, one stores it (dma_merge.py merges the
groups' stores into one).

With an even batch the loop takes two images per iteration, each with band tiles of its own and all four of its
evictions on one engine (even images ScalarE, odd VectorE): the taps' strided writes into one band tile wait for
each other on the model (their byte ranges overlap), so whole images alternate engines instead of taps, and each
image's store goes on its own engine's DMA queue. On the model (bf16 U-Net b8, past start-up): one image per
iteration 23.0 us, pairs 17.2 (with the input bands and PSUM tiles declared before the loops, below)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, cast

from tilec.compiler import ir
from tilec.compiler.build_util import a as aff, loop, sl, term
from tilec.compiler.ir import Act, Alloc, Buf, Dma, Matmul, Reshape, Scalar, Sl, Stmt, View, full
from tilec.compiler.ops import ConvOp, EltwiseOp
from tilec.compiler.schedule import PMAX, PSUM_BANKS, PSUM_F32
from tilec.lang import syntax as sx

# PSUM tiles allocated before the loops, one per tap (and channel tile): in a loop each allocation site rotates two
# buffers, and a pair of images' eight sites took every bank, so a matmul waited for the bank's other tile (bf16
# U-Net b8: 21.7 -> 20.3 us past start-up)
HOISTED_TILES = 4
TILE_BYTES = 16 * 1024  # per partition, for the band of X and of Y (two of each per site in flight)


@dataclass(frozen=True)
class Found:
    conv: ConvOp
    copy: EltwiseOp
    batch: bool  # T and Y have a leading batch index
    kc: int  # output channels K (the conv's rows are K * A * B)
    taps: tuple[int, int]  # (A, B)
    bias: str | None  # the bias tensor read: [K, A, B], or [K] when shared by the taps
    shared: bool  # the bias is one column for every tap (the widening op folded in)
    covers: frozenset[int]  # the op indices built
    kernel: tuple[int, int] = (0, 0)  # Wt's taps (R, Q) when not one per phase (build_tconv_pad.py); (0, 0): (A, B)
    # (kr, kq, d, e) per term: phase (a, b) adds tap (a + kr, b + kq) of input pixel (y + d, x + e), when the tap is
    # inside Wt (a padded transposed conv, build_tconv_pad.py); kernel 2: the one term (0, 0, 0, 0)
    terms: tuple[tuple[int, int, int, int], ...] = ((0, 0, 0, 0),)


def find(ops: tuple, i: int, hbm: dict, keep: Callable[[range], set], scheduled) -> Found | None:
    """The transposed conv's ops from op i, when this builder takes them (module docstring), else None: the matmul
    and the permute, after the copy of a per-channel bias over the taps (`b_w[k, a, b] = b[k]`, tconv_split's
    widening) when that is op i: the bias is then loaded as one column for every tap."""
    widen = ops[i] if i + 2 < len(ops) and isinstance(ops[i], EltwiseOp) else None
    if widen is not None:
        j = i + 1
        if not (isinstance(ops[j], ConvOp) and ops[j].bias == widen.out and _widening(widen, hbm)) \
                or widen.name in scheduled or widen.out in keep(range(i, i + 3)):
            return None
    else:
        j = i
    if j + 1 >= len(ops) or not isinstance(ops[j], ConvOp) or not isinstance(ops[j + 1], EltwiseOp):
        return None
    conv, copy = ops[j], ops[j + 1]
    if conv.name in scheduled or copy.name in scheduled or conv.out in keep(range(i, j + 2)) or not plain_1x1(conv):
        return None
    t = hbm[conv.out].shape
    if len(t) not in (5, 6) or not permutes(copy, conv.out, hbm):
        return None
    kc, ta, tb, h, w = t[-5:]
    if conv.dim("K") != kc * ta * tb or not fits(conv, hbm, (kc, ta, tb), (h, w)):
        return None
    if ta * tb * len(_tiles(kc)) > PSUM_BANKS:  # one PSUM tile a tap and channel tile live at once (a 3x3
        return None  # stride-3 kernel's nine: the verifier counted 9 of 8 banks; fuzz seed 480)
    if conv.bias and hbm[conv.bias].shape != (kc, ta, tb):
        return None
    bias = cast(sx.Access, widen.expr).tensor if widen is not None else conv.bias
    return Found(conv, copy, len(t) == 6, kc, (ta, tb), bias, widen is not None, frozenset(range(i, j + 2)))


def _widening(op: EltwiseOp, hbm: dict) -> bool:
    """`b_w[k, a, b] = b[k]`: a vector over the first index copied along the others."""
    e = op.expr
    return not op.copy and isinstance(e, sx.Access) and e.fill is None and len(e.indices) == 1 \
        and e.indices[0] == sx.Name(op.vars[0][1]) and hbm[e.tensor].shape == hbm[op.out].shape[:1]


def permutes(copy: EltwiseOp, src: str, hbm: dict) -> bool:
    """`copy` is `Y[.., k, y, a, x, b] = src[.., k, a, b, y, x]` (the depth-to-space permute into Y)."""
    t = hbm[src].shape
    e = copy.expr
    if not copy.copy or copy.inputs != (src,) or copy.out_index or not isinstance(e, sx.Access) or \
            not all(isinstance(ix, sx.Name) for ix in e.indices):
        return False
    names = [ix.id for ix in e.indices if isinstance(ix, sx.Name)]
    order = [v for _, v in copy.vars]
    lead = order[:len(order) - 5]
    nk, y, ya, x, xb = order[len(order) - 5:]
    kc, ta, tb, h, w = t[-5:]
    return names == lead + [nk, ya, xb, y, x] and hbm[copy.out].shape == t[:-5] + (kc, h, ta, w, tb)


def fits(conv: ConvOp, hbm: dict, w_taps: tuple, hw: tuple[int, int]) -> bool:
    """The conv reads X of the permute's spatial size and Wt [C, K, R, Q] of X's dtype, rows of <= 512 pixels."""
    return (conv.dim("H"), conv.dim("W")) == hw and hw[1] <= PSUM_F32 and \
        hbm[conv.x].dtype == hbm[conv.w].dtype and hbm[conv.w].shape[1:] == w_taps


def plain_1x1(op: ConvOp) -> bool:
    """A 1x1 contraction with nothing applied on its eviction but a per-row bias."""
    return (op.dim("R"), op.dim("S")) == (1, 1) and op.w_layout == "ck" and op.groups == 1 and not op.relu \
        and op.pool is None and not op.w_batch and not op.x_transposed and op.residual is None \
        and op.clamp is None and op.w_relu is None and op.scale == 1.0 and not op.epilogue \
        and op.bias_role == "k" and op.stride == (1, 1) and op.offset == (0, 0) and op.dilation == (1, 1)


@dataclass(frozen=True)
class _Shape:
    N: int
    C: int
    K: int
    A: int
    B: int
    H: int
    W: int
    G: int  # row groups side by side on the partitions
    hb: int  # input rows per group in a band
    rc: int  # input rows per matmul (rc * W fp32 fit a PSUM bank)
    hoist: bool  # the taps' PSUM tiles allocated once before the loops (at most HOISTED_TILES of them)
    R: int  # Wt's taps
    Q: int
    halo: tuple[int, int, int, int]  # zero rows above and below, columns left and right of an input band


def _shape(f: Found, hbm: dict) -> _Shape:
    c = f.conv
    K, (A, B), H, W = f.kc, f.taps, c.dim("H"), c.dim("W")
    G = PMAX // K if K in (32, 64) else 1
    while G > 1 and H % G:
        G //= 2
    size = ir.DTYPE_BYTES[hbm[f.copy.out].dtype]
    xsize = ir.DTYPE_BYTES[hbm[c.x].dtype]
    hg = H // G
    ds, es = [t[2] for t in f.terms], [t[3] for t in f.terms]
    halo = (max(0, -min(ds)), max(0, max(ds)), max(0, -min(es)), max(0, max(es)))
    hb = hg if any(halo) else max(d for d in range(1, hg + 1) if hg % d == 0 and (d == 1 or (
        d * A * W * B * size <= TILE_BYTES and G * d * W * xsize <= TILE_BYTES)))  # a halo: one band an image
    rc = max(d for d in range(1, hb + 1) if hb % d == 0 and d * W <= PSUM_F32)
    hoist = A * B * (len(_tiles(K)) if G == 1 else 1) <= HOISTED_TILES
    R, Q = f.kernel if f.kernel != (0, 0) else f.taps
    return _Shape(c.dim("N"), c.dim("C"), K, A, B, H, W, G, hb, rc, hoist, R, Q, halo)


def _tiles(n: int) -> list[tuple[int, int]]:
    return [(s, min(PMAX, n - s)) for s in range(0, n, PMAX)]


def build(f: Found, hbm: dict, fresh: Callable[[str], str]) -> tuple[list, list]:
    """(constants, statements) of the fused transposed conv."""
    s = _shape(f, hbm)
    c, line = f.conv, f.conv.line
    y_view = hbm[f.copy.out]
    x, w = hbm[c.x], hbm[c.w]
    stmts: list[Stmt] = []
    wv = Buf(fresh(f"{w.name}_v"), "hbm", w.dtype, (s.C, s.K * s.R * s.Q))
    stmts.append(Reshape(wv, w, line))
    taps = []
    for ct, (c0, cs) in enumerate(_tiles(s.C)):
        taps.append(_stationary(wv, c0, cs, s, fresh(f"{w.name}_taps{ct}"), fresh(f"{w.name}_rows{ct}"), line,
                                stmts))
    bias = _bias(f, hbm, s, fresh, line, stmts) if f.bias else None
    if s.hoist:
        for kt, (_, ks) in enumerate(_tiles(s.K) if s.G == 1 else [(0, s.K)]):
            stmts += [Alloc(_acc(f, s, s.G * ks, t, kt, fresh), line=line) for t in range(s.A * s.B)]
    bufs = (x, y_view, taps, bias)
    if not f.batch:
        allocs, body = _bands(f, s, bufs, fresh, line, [])
        return [], stmts + allocs + body
    n = fresh("n")
    if s.N % 2:
        allocs, body = _bands(f, s, bufs, fresh, line, [aff(n)])
    else:  # two images per iteration, each with tiles and an eviction engine of its own (module docstring)
        (ea, even), (oa, odd) = (_bands(f, s, bufs, fresh, line, [aff(term(n, 2), i)], copy)
                                 for i, copy in ((0, "_even"), (1, "_odd")))
        allocs, body = ea + oa, even + odd
    label = f"{f.copy.out}: each tap's matmul evicted into its place in Y's layout, stored once"
    stmts += allocs + loop(n, s.N // 2 if s.N % 2 == 0 else s.N, [ir.Block(label, tuple(body), line)],
                           note=f"for {dict(c.vars)['n']} in 0..N", line=dict(c.lines).get("n", line))
    return [], stmts


def _stationary(wv: Buf, c0: int, cs: int, s: _Shape, name: str, rows: str, line: int, out: list) -> Buf:
    """Wt's contraction rows [c0, c0 + cs) in SBUF as [cs, taps, K]: tap t's stationary is one contiguous run."""
    raw = Buf(rows, "sbuf", wv.dtype, (cs, s.K * s.R * s.Q))
    taps = Buf(name, "sbuf", wv.dtype, (cs, s.R * s.Q, s.K))
    out += [Alloc(raw, line=line), Dma(ir.whole(raw), View(wv, (sl(c0, cs), full(wv.shape[1]))), line),
            Alloc(taps, line=line)]
    for t in range(s.R * s.Q):
        out.append(ir.Copy(View(taps, (full(cs), aff(t), full(s.K))), View(raw, (full(cs), Sl(aff(t), s.K, s.R * s.Q))),
                           line))
    return taps


def _bias(f: Found, hbm: dict, s: _Shape, fresh, line: int, out: list) -> tuple[Buf, int]:
    """(the bias as fp32 columns, columns per tile of output channels): [K, A, B] as a column per tap, [K] as one for
    all of them, on every group's partitions."""
    b = hbm[cast(str, f.bias)]
    per = 1 if f.shared else s.A * s.B
    bv = Buf(fresh(f"{b.name}_v"), "hbm", b.dtype, (s.K, per))
    tiles = _tiles(s.K) if s.G == 1 else [(0, s.K)]
    col = Buf(fresh(f"{b.name}_cols"), "sbuf", "f32", (s.G * min(s.K, PMAX), len(tiles) * per))
    out += [Reshape(bv, b, line), Alloc(col, line=line)]
    for g in range(s.G):
        for kt, (k0, ks) in enumerate(tiles):
            out.append(Dma(View(col, (sl(g * ks, ks), sl(kt * per, per))), View(bv, (sl(k0, ks), full(per))), line))
    return col, per


def _bands(f: Found, s: _Shape, bufs: tuple, fresh, line: int, n: list, copy: str = "") -> tuple[list, list]:
    """(the input bands' allocations, to put before the loops; every band of rows of image `n` (none: no batch):
    its input rows loaded once, then each tile of output channels (one when groups of rows share the partitions)).
    `copy` tells the tiles of a second image apart. The input bands are declared once and refilled whole by DMA:
    the allocator then gives each load a fresh copy (tilec/perf/schedule.py `renamed`, as the model takes it from
    a public conv kernel), so a load need not wait for the previous band's matmuls, which a tile allocated in the
    loop (two rotating buffers per site) did: bf16 U-Net b8 20.3 -> 17.2 us past start-up."""
    x, y, taps, bias = bufs
    band = fresh("band" + copy)
    rows0 = aff(term(band, s.G * s.hb))
    body: list[Stmt] = []
    allocs: list[Stmt] = []
    xt = []
    top, bottom, left, right = s.halo  # zeros around the band (a padded conv: one band an image), never loaded
    for ct, (c0, cs) in enumerate(_tiles(s.C)):
        xb = Buf(fresh(f"{x.name}_band{ct}{copy}"), "sbuf", x.dtype,
                 (cs, s.G * s.hb + top + bottom, s.W + left + right))
        allocs.append(Alloc(xb, zero=any(s.halo), line=line))
        inner = View(xb, (full(cs), sl(top, s.G * s.hb), sl(left, s.W)))
        body.append(Dma(inner, View(x, tuple(n) + (sl(c0, cs), Sl(rows0, s.G * s.hb), full(s.W))), line))
        xt.append(xb)
    for kt, (k0, ks) in enumerate(_tiles(s.K) if s.G == 1 else [(0, s.K)]):
        tag = str(kt) if kt else ""
        yb = Buf(fresh(f"{y.name}_band{tag}{copy}"), "sbuf", y.dtype, (s.G * ks, s.hb, s.A, s.W, s.B))
        body.append(Alloc(yb, line=line))
        body += _chunks(f, s, xt, yb, taps, bias, kt, (k0, ks), fresh, line, copy)
        g = fresh("g" + copy)
        lead = tuple(n) + (sl(k0, ks),)
        dst = View(y, lead + (Sl(rows0.plus(aff(term(g, s.hb))), s.hb), full(s.A), full(s.W), full(s.B)))
        body += loop(g, s.G, [Dma(dst, View(yb, (Sl(aff(term(g, ks)), ks), full(s.hb), full(s.A), full(s.W),
                                                 full(s.B))), line)], note="row groups", line=line)
    return allocs, loop(band, s.H // (s.G * s.hb), body, note="bands of rows", line=line)


def _chunks(f: Found, s: _Shape, xt: list, yb: Buf, taps: list, bias: tuple | None, kt: int, k: tuple[int, int],
            fresh, line: int, copy: str) -> list[Stmt]:
    """The band's matmuls, a chunk of rows at a time: per tap, each group's rows into its partitions of one PSUM
    tile (summed over the contraction tiles), evicted into the tap's place in the band."""
    (k0, ks), j = k, fresh("rows" + copy)
    parts = yb.shape[0]
    chunk: list[Stmt] = []
    top, _, left, _ = s.halo
    for t in range(s.A * s.B):
        acc = _acc(f, s, parts, t, kt, fresh)
        chunk += [] if s.hoist else [Alloc(acc, line=line)]
        a, b = divmod(t, s.B)
        terms = [(a + kr, b + kq, d, e) for kr, kq, d, e in f.terms if 0 <= a + kr < s.R and 0 <= b + kq < s.Q]
        for g in range(s.G):
            for n, ((r, q, d, e), (ct, (_, cs))) in enumerate(itertools.product(terms, enumerate(_tiles(s.C)))):
                rows = Sl(aff(term(j, s.rc), g * s.hb + top + d), s.rc)
                moving = View(xt[ct], (full(cs), rows, sl(left + e, s.W)))
                chunk.append(Matmul(View(acc, (sl(g * ks, ks), full(s.rc), full(s.W))),
                                    View(taps[ct], (full(cs), aff(r * s.Q + q), sl(k0, ks))), moving, line,
                                    start=n == 0))
        dst = View(yb, (full(parts), Sl(aff(term(j, s.rc)), s.rc), aff(t // s.B), full(s.W), aff(t % s.B)))
        col = None if bias is None else View(bias[0], (sl(0, parts), sl(kt * bias[1] + t % bias[1], 1)))
        chunk.append(_evict(dst, ir.whole(acc), col, {"": t, "_even": 0}.get(copy, 1), line))
    # hoisted PSUM tiles are rewritten each chunk: the chunks keep their order (legalise exempts matmuls)
    return loop(j, s.hb // s.rc, chunk, "sequential" if s.hoist else "affine", note="matmul rows", line=line)


def _acc(f: Found, s: _Shape, parts: int, t: int, kt: int, fresh) -> Buf:
    return Buf(fresh(f"{f.conv.out}_acc{t}" + (f"_{kt}" if kt else "")), "psum", "f32", (parts, s.rc, s.W))


def _evict(dst: View, acc: View, bias: View | None, t: int, line: int) -> Stmt:
    """PSUM -> the tap's place in the band, the bias added; taps alternate ScalarE and VectorE."""
    if t % 2 == 0 or bias is None:
        return Act(dst, acc, "copy", bias, 1.0, line) if t % 2 == 0 else ir.Copy(dst, acc, line)
    return Scalar(dst, acc, "add", bias, line)
