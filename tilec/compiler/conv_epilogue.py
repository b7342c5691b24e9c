"""A convolution's fused epilogue, for build_conv._ConvBuilder: the eviction's bias and relu, the roundings of the
narrow intermediates a fusion skips, a residual add (from its own band or the producer's band copies) and the ResNet
block's final relu (per band on ScalarE, or per group on VectorE), and a conv chain's on-chip image: its rows and
its store. Functions of the builder `b`, as conv_pairs.py and conv_weights.py.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tilec.compiler import conv_pairs, conv_weights, eviction_fusion, ir
from tilec.compiler.build_util import a, pool_epilogue, sl, term
from tilec.compiler.ir import DTYPE_BYTES, Act, Aff, Alloc, Binary, Buf, Dma, Scalar, Stmt, View, full, whole

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder


def relu_per_band(b: _ConvBuilder) -> bool:
    """A residual block's final relu (`Y = relu(conv + S)`) run once over the whole row-pair band before its
    store, instead of in place after each group's add: ScalarE, in order, then waited for VectorE's add of
    every group before it could evict the next group's accumulator, which left TensorE idle (bf16 ResNet block
    batch 8: 79.03 -> 77.67 us). The store is on ScalarE's trigger stream either way (its producer)."""
    return bool(b.op.residual and b.op.post_relu and b.pair > 1 and not b.phased and not b.op.epilogue
                and not b.halves and b.dst_chip is None and b.o_tiles is None
                and not relu_on_vector(b))


def relu_on_vector(b: _ConvBuilder) -> bool:
    """A row-pair residual block's final relu as max(x, 0) on VectorE right after each group's add, not once
    per band on ScalarE (relu_per_band): the band's store then follows VectorE's last pass of 0.21 us instead
    of ScalarE's 0.74 us over the band, and is triggered from VectorE's stream, which carries no other DMA
    since the residual is read from the first conv's band copies (conv_chain.skip_from_bands; conv17 measured
    this relu worse while the residual's loads were on that stream). bf16 ResNet block: batch 1 18.76 ->
    16.5 us, batch 8 74.57 -> 72.3 (with the prologue's changes). 16-bit outputs only: an fp32 max has no
    VectorE performance mode (generated/resnet_block.py, f32 16x16: 26.27 -> 26.32 us with it)."""
    return bool(b.op.residual and b.op.post_relu and b.pair > 1 and not b.phased and not b.op.epilogue
                and DTYPE_BYTES[b.hbm[b.op.out].dtype] == 2
                and not b.halves and b.dst_chip is None and b.o_tiles is None
                and b.skip_bands is not None)


def band_relu(b: _ConvBuilder, ob: Buf) -> list[Stmt]:
    return [Act(whole(ob), whole(ob), "relu", None, 1.0, b.L["relu"])] if relu_per_band(b) else []


def chip_rows(b: _ConvBuilder, first: "ir.Aff", size: int) -> tuple:
    """The on-chip image's region (this out-channel part; output rows first.. and every column) of dst_chip."""
    chip = b.dst_chip
    assert chip is not None and b.pair == 1 and b.wy == b.wx == 1
    if len(chip.buf.shape) == 3:  # a pool's input (pool_chain.py): channel tile t's rows from row t * height on
        tile = a(term(b.kv, chip.height)) if b.kv else a(b.KT * chip.height)
        return (b.part(b.ks, b.p.tile_k), sl(first.plus(tile).plus(-chip.row0), size))
    return (b.part(b.ks, b.p.tile_k), b.tile_index(b.kv, b.KT), sl(first.plus(-chip.row0), size))


def chip_store(b: _ConvBuilder) -> list[Stmt]:
    """The band of T also stored to HBM from the on-chip image (T is an output or read by another op)."""
    chip = b.dst_chip
    assert chip is not None
    if not chip.store:
        return []
    if chip.paired:  # each row phase from its copy of the image to every other row of the output
        out: list[Stmt] = []
        for half in range(2):
            h = half ^ b.swap
            at = b.y_at(b.p.band // 2).plus((h - chip.row0 - half) // 2)
            src = View(chip.buf, (sl(half * b.K, b.K), a(0), sl(at, b.p.band // 2),
                                  sl(-chip.col0, b.Wo)))
            out.append(Dma(View(b.o4, out_region(b, h)), src, b.line))
        return out
    if b.dup > 1:  # copy 0 holds T unshifted
        first = b.y_at(b.p.band).plus(-chip.row0)
        return [Dma(View(b.o4, out_region(b)), View(chip.buf, (sl(0, b.K), a(0), sl(first, b.p.band),
                                                                      sl(-chip.col0, b.Wo))), b.line)]
    band = chip_rows(b, b.y_at(b.p.band), b.p.band) + (sl(-chip.col0, b.Wo),)
    return [Dma(View(b.o4, out_region(b)), View(chip.buf, band), b.line)]


def out_region(b: _ConvBuilder, phase: int = 0) -> tuple:
    """The output band's region of an [N, K, rows, columns] HBM tensor (with row pairs: the rows of one phase)."""
    p, V = b.p, b.var
    rows = sl(b.y_at(p.band // b.wy), p.band // b.wy) if b.pair == 1 else \
        sl(b.y_at(p.band).plus(phase), p.band // 2, 2)
    return (a(V["n"]), sl(b.k_start(b.kv), b.ks), rows,
            sl(a(term(V["xb"], b.BX // b.wx)), b.BX // b.wx))


RESIDUAL_ALL_BYTES = 32 * 1024  # the batch's residual in one buffer takes at most this much of a partition


def batch_residual(b: _ConvBuilder) -> bool:
    """Whether the residual of every image goes into one buffer allocated before the loops, image n's band loaded
    into its own slice: each load then writes memory nothing touched before, so it depends on nothing and leads its
    DMA stream. A band buffer per image reuses an earlier image's memory, so its load waited for that image's adds,
    and on VectorE's stream (the adds read it first, params' dma_streams) behind the previous image's store: at the
    kernel's end the last image's adds waited for their residual (bf16 conv_residual b8: the last image's first add
    1.2 us after its eviction). One image per band and one out-channel part, images outermost, plain rows (no row
    pairs or band halves), within RESIDUAL_ALL_BYTES per partition (fp32 conv_residual b8: 25 KiB)."""
    op, p = b.op, b.p
    rows, cols = p.band // b.wy, b.BX // b.wx
    return bool(op.residual and b.skip_bands is None and not op.residual_shared and b.N > 1 and b.NB == 1
                and b.NXB == 1 and b.KTB == 1 and b.pair == 1 and not b.halves and p.order[0] == "n"
                and b.dst_chip is None and b.src_chip is None and b.o_tiles is None
                and b.N * rows * cols * DTYPE_BYTES[b.hbm[op.residual].dtype] <= RESIDUAL_ALL_BYTES)


def residual_all(b: _ConvBuilder) -> Buf:
    """The batch's residual buffer (batch_residual): [out-channel partitions, image, band rows, columns]."""
    assert b.op.residual is not None
    b.r_all = Buf(b.fresh(f"{b.op.residual}_skip"), "sbuf", b.hbm[b.op.residual].dtype,
                  (b.PK, b.N, b.p.band // b.wy, b.BX // b.wx))
    return b.r_all


def residual_band(b: _ConvBuilder) -> list[Stmt]:
    op, p = b.op, b.p
    assert op.residual is not None
    line = b.L["residual"]
    if b.r_all is not None:  # image n's slice of the batch's buffer (batch_residual)
        b.r_band = b.r_all
        return [Dma(View(b.r_all, (b.part(b.ks, p.tile_k), a(b.var["n"]), full(b.r_all.shape[2]),
                                   full(b.r_all.shape[3]))), View(b.s4, out_region(b)), line)]
    rb = Buf(b.fresh(f"{op.residual}_skip"), "sbuf", b.hbm[op.residual].dtype, b.o_band.shape)
    b.r_band = rb
    if b.halves:
        return [Alloc(rb, line=line), Dma(whole(rb), View(b.s6, conv_pairs.halves_region(b)), line)]
    if b.pair > 1:
        return [Alloc(rb, line=line), Dma(whole(rb), conv_pairs.rows_view(b, b.s5), line)]
    region = out_region(b)
    if op.residual_shared:  # a residual shared by the batch (select_conv._init_residual): its one image
        region = (Aff(),) + region[1:]
    return [Alloc(rb, line=line),
            Dma(View(rb, (b.part(b.ks, p.tile_k), full(rb.shape[1]), full(rb.shape[2]))),
                View(b.s4, region), line)]


def epilogue_to(b: _ConvBuilder, dst: View, acc: View, kp) -> list[Stmt]:
    """acc's partitions kp evicted (bias, relu, narrow roundings, pool or residual) into dst, then the fused
    element-wise chain of consumer statements (eviction_fusion), if any."""
    op = b.op
    if not op.epilogue:
        return evicted_to(b, dst, acc, kp)
    b.epi_allocs = []
    narrow = narrow_intermediates(b)
    if narrow and not op.residual and not op.pool:  # the chain starts from the last rounded tile
        func = "relu" if op.relu else "copy"
        bias = View(b.bias_col, (kp, sl(b.tile_index(b.kv, b.KT), 1))) if op.bias and op.bias_role == "k" else None
        body, src = evict_rounded(b, acc, func, bias, narrow)
        tail = chain(b, src, dst, kp, acc)
        return body + list(b.epi_allocs) + tail
    if not (op.relu or op.bias or op.residual or op.pool or narrow or op.scale != 1.0):
        # nothing before the chain: its first instruction is the eviction (`conv * g[k] + b[k]`: one activation)
        tail = chain(b, acc, dst, kp, acc)
        return list(b.epi_allocs) + tail
    if row_first(b):  # the row added from PSUM, then the activation's factor and bias column (row_first)
        step = op.epilogue[0]
        assert isinstance(step.operand, tuple)
        summed = View(work_tile(b, acc, "f32"), acc.idx)
        rest = op.epilogue[1:]
        pre = dst if dst.buf.dtype == "f32" or not rest else View(work_tile(b, acc, "f32"), acc.idx)
        body = [Binary(summed, acc, b.row_tile(b.epi_rows[step.operand[1]], kp), "add", b.L["epilogue"])] + \
            b.evict(pre, summed, "copy", _bias_col(b, kp))
        return list(b.epi_allocs) + body + (chain(b, pre, dst, kp, acc, rest) if rest else [])
    pre = dst if dst.buf.dtype == "f32" else View(work_tile(b, acc, "f32"), acc.idx)
    body = evicted_to(b, pre, acc, kp, res_at=dst) + chain(b, pre, dst, kp, acc)
    return list(b.epi_allocs) + body


def evict_chain(b: _ConvBuilder, dst: View, acc: View, func: str, bias: View | None, kp) -> list[Stmt]:
    """b.evict into dst followed by the fused element-wise chain (a folded image's copies: conv_fold)."""
    if not b.op.epilogue:
        return b.evict(dst, acc, func, bias)
    b.epi_allocs = []
    pre = dst if dst.buf.dtype == "f32" else View(work_tile(b, acc, "f32"), acc.idx)
    body = b.evict(pre, acc, func, bias) + chain(b, pre, dst, kp, acc)
    return list(b.epi_allocs) + body


def work_tile(b: _ConvBuilder, acc: View, dtype: str) -> Buf:
    """A fresh tile of one eviction's chain (numbered: the same names again at every eviction of the nest)."""
    tile = Buf(b.fresh(f"{b.op.out}_epi{len(b.epi_allocs)}_{dtype}{b.tag}"), "sbuf", dtype, acc.buf.shape)
    b.epi_allocs.append(Alloc(tile, line=b.line))
    return tile


def _bias_col(b: _ConvBuilder, kp) -> View | None:
    op = b.op
    return View(b.bias_col, (kp, sl(b.tile_index(b.kv, b.KT), 1))) if op.bias and op.bias_role == "k" else None


def row_first(b: _ConvBuilder) -> bool:
    """Whether the chain's first step, a row added or subtracted after the activation's factor and bias column
    (`-2 * acc + aa[i] + bb[j]`: sqdist), runs first, a VectorE tensor_tensor reading PSUM (N cycles; two SBUF
    inputs take 2N [NISA, nki-spec §3: `tensor_tensor` max(64, N) with one PSUM input]), with the row replicated
    already divided by the factor: s * (acc + r / s) + b. Only where that is exact (the factor a power of two, 1
    included) and the activation is a copy (no relu, clamp, residual, pool or rounding before the row), the row
    read by no other step, and something before it (else the row's step is the eviction already). sqdist 4096 x 4096 x 128: VectorE-bound at 86 % with the add from SBUF."""
    op = b.op
    s = op.epilogue[0] if op.epilogue else None
    if s is None or s.kind != "alu" or s.op not in ("add", "subtract") or s.reverse \
            or not isinstance(s.operand, tuple) or s.operand[0] != "row":
        return False
    mantissa = math.frexp(op.scale)[0] if op.scale else 0.0
    return (abs(mantissa) == 0.5 and (op.bias is not None or op.scale != 1.0) and not op.relu and op.clamp is None and not op.residual and not op.pool
            and not narrow_intermediates(b) and not (op.bias and op.bias_role == "x")
            and sum(1 for t in op.epilogue if t.operand == s.operand) == 1)


def row_factor(b: _ConvBuilder, name: str) -> float:
    """What the replicated row `name` is multiplied by once, after its broadcast (row_first: 1 / the factor, its
    sign turned for a subtraction), else 1."""
    if not row_first(b) or b.op.epilogue[0].operand != ("row", name):
        return 1.0
    return (-1.0 if b.op.epilogue[0].op == "subtract" else 1.0) / b.op.scale


def chain(b: _ConvBuilder, src: View, dst: View, kp, acc: View, steps: tuple | None = None) -> list[Stmt]:
    """The epilogue's steps (all, or `steps`) from src (the evicted tile) into dst, reading each vector's column
    at partitions kp (its work tiles' allocations collected in b.epi_allocs)."""
    line = b.L["epilogue"]
    return eviction_fusion.chain_stmts(
        b.op.epilogue if steps is None else steps, src, dst, lambda name: View(b.epi_cols[name], (kp, sl(b.tile_index(b.kv, b.KT), 1))),
        lambda dtype: View(work_tile(b, acc, dtype), acc.idx), line, lambda name: b.row_tile(b.epi_rows[name], kp))


def epilogue_columns(b: _ConvBuilder) -> list[Stmt]:
    """Every vector the fused chain reads, loaded as columns once before the nest (as the bias), and every row
    along a matmul's columns replicated on every partition once (conv_weights.row_broadcast: the tile's columns
    of it are then a tensor_tensor's operand on the eviction)."""
    out: list[Stmt] = []
    b.epi_cols, b.epi_rows = {}, {}
    for name in eviction_fusion.columns_of(b.op):
        stmts, b.epi_cols[name] = conv_weights.column(b, name)
        out += stmts
    for name in eviction_fusion.columns_of(b.op, "row"):
        dt = b.hbm[name].dtype
        stmts, b.epi_rows[name] = conv_weights.row_broadcast(b, name, b.fresh(f"ones_{dt}_{name}"))
        factor = row_factor(b, name)
        if factor != 1.0:  # (row_first: exact, a power of two)
            stmts.append(Scalar(whole(b.epi_rows[name]), whole(b.epi_rows[name]), "multiply", factor, b.line))
        out.append(ir.Block(f"{name}: a row along {dict(b.op.vars)['x']}, copied to every partition once",
                            tuple(stmts), b.L["epilogue"]))
    return out


def evicted_to(b: _ConvBuilder, dst: View, acc: View, kp, res_at: View | None = None) -> list[Stmt]:
    p, line, op = b.p, b.line, b.op
    func = "relu" if op.relu else "copy"
    bias = View(b.bias_col, (kp, sl(b.tile_index(b.kv, b.KT), 1))) \
        if op.bias and op.bias_role == "k" else None
    narrow = narrow_intermediates(b)
    if op.residual:
        return add_residual(b, dst, acc, func, bias, narrow, res_at)
    if not op.pool and not narrow:
        return b.evict(dst, acc, func, bias)
    assert acc.idx == (kp, full(p.rows), full(p.tile_x)) and acc.buf.shape == (b.PK, p.rows, p.tile_x)
    out, src = evict_rounded(b, acc, func, bias, narrow)  # (relu commutes with the roundings)
    if not op.pool:
        return out + [ir.Copy(dst, src, line)]
    return out + pool_epilogue(src, dst, b.wy, b.wx, op.pool.op, op.pool.scale,
                               lambda axis: b.fresh(f"{op.out}_pool_{axis}" + ("" if b.kv else "_rest")),
                               b.L["pool"])


def add_residual(b: _ConvBuilder, dst: View, acc: View, func: str, bias: View | None,
                 narrow: list[tuple[str, str]], res_at: View | None = None) -> list[Stmt]:
    """dst = [relu](evicted acc + S): the add reads PSUM directly (VectorE) when nothing comes before it, else
    the evicted (and rounded) tile; a final relu runs in place on ScalarE. S is read at res_at's element (the
    output band's region, when dst is a work tile of a fused chain)."""
    line = b.L["residual"]
    res = residual_view(b, res_at or dst)
    out: list[Stmt] = []
    if func == "copy" and bias is None and not narrow and b.op.scale == 1.0:
        src = acc
    else:
        out, src = evict_rounded(b, acc, func, bias, narrow)
    out.append(Binary(dst, src, res, "add", line))
    if relu_on_vector(b):
        # max(x, 0) on VectorE after its add, per group (relu_on_vector)
        return out + [Scalar(dst, dst, "maximum", 0.0, b.L["relu"])]
    relu = b.op.post_relu and not relu_per_band(b)  # (else once over the band: band_relu)
    return out + ([Act(dst, dst, "relu", None, 1.0, b.L["relu"])] if relu else [])


def residual_view(b: _ConvBuilder, dst: View) -> View:
    """The residual's elements added into dst: its band (residual_band), or the producer's band copies of X
    (conv_chain.skip_from_bands): output pair i of phase h is band row 2i - oy of copy h (copy 1 one row
    further), the same partitions (h*K + k) and columns."""
    if b.r_all is not None:  # the batch's buffer, image n (batch_residual)
        return View(b.r_all, (dst.idx[0], a(b.var["n"])) + tuple(dst.idx[1:]))
    if b.skip_bands is None:
        return View(b.r_band, dst.idx)
    kp, rows, cols = dst.idx
    assert isinstance(rows, ir.Sl) and rows.step == 1
    start = ir.Aff(tuple(ir.Term(t.var, 2 * t.coef) for t in rows.start.terms), 2 * rows.start.const - b.skip_oy)
    return View(b.skip_bands[b.yb[1]], (kp, a(0), sl(start, rows.size, 2), cols))


def evict_rounded(b: _ConvBuilder, acc: View, func: str, bias: View | None, narrow: list[tuple[str, str]]
                  ) -> tuple[list[Stmt], View]:
    """acc evicted (func, bias) into an SBUF tile and rounded to each skipped store's dtype in turn; the first
    rounding is the eviction's own output conversion (the activation computes in fp32 and rounds once as it
    writes: the same value as an fp32 tile copied to that dtype; bf16 ResNet block: one VectorE pass fewer per
    group), except where the eviction goes on in place (a clamp, a row bias), which keeps an fp32 tile."""
    shape = acc.buf.shape
    direct = narrow and b.op.clamp is None and not (b.op.bias and b.op.bias_role == "x")
    name, dtype = narrow[0] if direct else (f"{b.op.name}_act", "f32")
    ev = Buf(b.fresh((f"{name}_{dtype}" if direct else name) + b.tag), "sbuf", dtype, shape)
    src = View(ev, acc.idx)
    out: list[Stmt] = [Alloc(ev, line=b.line)] + b.evict(src, acc, func, bias)
    for name, dtype in narrow[1:] if direct else narrow:  # the stores the fusion skips round to their dtypes
        tile = Buf(b.fresh(f"{name}_{dtype}{b.tag}"), "sbuf", dtype, shape)
        out += [Alloc(tile, line=b.line), ir.Copy(View(tile, acc.idx), src, b.line)]
        src = View(tile, acc.idx)
    return out, src


def narrow_intermediates(b: _ConvBuilder) -> list[tuple[str, str]]:
    """(name, dtype) of the f16/bf16 tensors this fused op computes but never stores (the conv's own tensor,
    a relu's), in program order: each store rounds to its dtype in the program's meaning."""
    op = b.op
    later = {s.operand for s in op.epilogue if s.kind == "round"}  # rounded in the fused chain, in its order
    chain = [n for n in (op.name,) + tuple(op.fused) if n != op.out and n not in later]
    return [(n, b.hbm[n].dtype) for n in dict.fromkeys(chain) if n in b.hbm and b.hbm[n].dtype != "f32"]
