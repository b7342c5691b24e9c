"""A matrix-vector product `y[i] = sum_k W[i, k] * v[k]` (W stored row-major, [out, in]) without TensorE transposes.

The contraction path (build_conv) puts the contraction on the partitions: W must be transposed block by block on
TensorE (fp32 at transpose mode's rate: 2.35x the 16-bit one on trn2) and every block evicted from PSUM, for
matmuls of one moving column each, so the kernel is bound by TensorE's transposes, not by reading W. Here W's rows stay on the partitions as loaded (one
contiguous DMA per tile of rows) and the contraction runs along the free axis:

    v broadcast to every partition once: a ones row times v on TensorE into PSUM (one matmul per PSUM bank)
    per tile of rows: W_rows * v on VectorE (PSUM input: the 1x rate), summed along the free axis on ScalarE
    (activation copy with its reduce result), the column stored

VectorE and ScalarE then each spend about one cycle per element of W, below the DMA time of reading W once. Long
rows share the multiply with GpSimdE (`gpsimd_columns`: the last columns of every tile, from an SBUF copy of v made
once on ScalarE; GpSimdE cannot read PSUM), and whole tiles of rows go through one buffer declared before the loop
(each tile's DMA refills it whole, so the next loads need not wait for the last tile's readers). matvec f16
(1000 x 2048): 23.82 -> 18.23 us run, 2.14x -> 1.64x of the DMA floor, now ScalarE's sums (1.84 us per tile) set
the pace; f32 30.24 -> 26.84 us, 1.36x -> 1.20x. The last tile goes in column pieces (`last_pieces`): loaded, multiplied
and summed piece by piece (the later half of the sums on VectorE's reduction, ScalarE still summing the tile
before), the partial sums added by one reduction, so only one piece's work follows the last byte (matvec f32
1000 x 2048: 28.64 -> 27.0 us run, 1.28x -> 1.21x).
Chosen when the performance model's constants say it is faster than the transposes (`estimates`) and v fits in
half of PSUM.

16-bit W whose K is whole 128-column blocks goes back to TensorE when the model says so (`grouped_is_faster`,
`transposed_rows`): at the 16-bit rate a block's transpose is 57 ns, and what made the contraction path slow was
one VectorE copy per block out of PSUM. Here a tile's blocks are transposed MATVEC_TP_GROUP to a PSUM tile, each
group evicted by two copies (VectorE, ScalarE), then one matmul per block accumulates the tile's outputs (v's
blocks as columns, made once by one-row matmuls). matvec f16 1000 x 2048: 18.23 -> 16.37 us run, 1.64x -> 1.47x.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from tilec.compiler import eviction_fusion, ir
from tilec.compiler.build_util import a, hbm_view, loop, ones_row, sl, term
from tilec.compiler.ir import DTYPE_BYTES, Alloc, Buf, Dma, Stmt, View, full, whole
from tilec.compiler.ops import ConvOp
from tilec.compiler.schedule import ConvPlan
from tilec.target import compiled

if TYPE_CHECKING:
    from tilec.perf.costs import Costs

Fresh = Callable[[str], str]  # as build_conv.Fresh
MATVEC_SPLIT_STEP = 64  # granularity of the VectorE / GpSimdE split of a tile's columns
# the last tile of rows in column pieces (last_pieces): matvec f32 1000 x 2048, model total 41.6 us unsplit; 2
# pieces 40.3, 4 pieces 40.0, 6 40.3, 8 40.9 (each piece pays its instructions' static overheads)
MATVEC_LAST_PIECES = 4
MATVEC_PIECE_MIN = 512  # columns per piece at least: each pays its instructions' static overheads and a reduction
# (f32 512 x 512 in two pieces of 256: 20.7 -> 20.8 us, 1 x 512: 17.5 -> 17.7)
# blocks per PSUM tile of the 16-bit transposed path (a bank holds 8 of 125 rows): smaller groups let the first
# matmuls start while later groups are still evicted; matvec f16 1000 x 2048: 2 -> 1.68x, 4 -> 1.47x, 8 -> 1.50x
MATVEC_TP_GROUP = 4


def is_matvec(op: ConvOp, hbm: dict[str, Buf]) -> bool:
    """A plain W[i, k] v[k] product: one moving column, no taps; on its eviction a bias b[i], relu, a relu6
    clamp and a fused element-wise chain of vectors b[i] and constants (eviction_fusion) (a constant factor,
    op.scale, scales the sum's activation)."""
    d = dict(op.dims)
    # an initial value or added tensor read at the output's element (op.residual, `y[i] = b[i]` then `+=`) is one
    # value per row here: a bias column, added by the activation before its relu (post_relu), the intermediates'
    # roundings after it (so not with a 16-bit contraction result, which rounds before the add)
    residual_ok = op.residual is None or (not op.relu and op.bias is None and not _narrow(op, hbm))
    plain = (op.w_layout == "kc" and op.groups == 1 and not op.w_batch and not op.x_transposed
             and op.bias_role == "k" and residual_ok and op.pool is None and op.w_relu is None
             and not any(isinstance(s.operand, tuple) and s.operand[0] == "row" for s in op.epilogue))
    # (a row along the one output column, J = 1: the general builder's replicated row, evict24)
    return plain and d["N"] * d["Ho"] * d["Wo"] * d["H"] * d["W"] * d["R"] * d["S"] == 1


def _narrow(op: ConvOp, hbm: dict[str, Buf]) -> list[str]:
    """The dtypes of the 16-bit tensors the fusion computes but does not store, in program order, each rounding
    the value once, except those the fused chain rounds itself (its round steps)."""
    later = {s.operand for s in op.epilogue if s.kind == "round"}
    return [hbm[m].dtype for m in dict.fromkeys((op.name,) + op.fused)
            if m != op.out and m not in later and m in hbm and hbm[m].dtype != "f32"]


def _finished(op: ConvOp, hbm: dict[str, Buf], fresh: Fresh, acc: View, dst: View, rows: tuple, part,
              scale: float) -> list[Stmt]:
    """dst (a tile's output column) = the epilogue of acc (its sums, PSUM or SBUF): scale, bias b[i] and relu on
    one activation, the relu6 clamp, then the fused chain (eviction_fusion) with each vector's rows of this tile
    loaded as a column (`rows`: the tile's region of an [M, 1] view). Just the activation when there is none."""
    line = op.line
    bias = op.bias or op.residual  # (is_matvec: one of them)
    if bias is None and not op.relu and op.clamp is None and not op.epilogue and not _narrow(op, hbm):
        return [ir.Act(dst, acc, "copy", scale=scale, line=line)]
    n = acc.buf.shape[0]
    out: list[Stmt] = []
    cols: dict[str, View] = {}
    for name in ([bias] if bias else []) + eviction_fusion.columns_of(op):
        if name in cols:
            continue
        v2, st = hbm_view(hbm[name], (dict(op.dims)["K"], 1), fresh(f"{name}_v"), line)
        col = Buf(fresh(f"{name}_col"), "sbuf", "f32", (n, 1))
        out += st + [Alloc(col, line=line), Dma(View(col, (part, full(1))), View(v2, rows), line)]
        cols[name] = View(col, (part, full(1)))
    def work(dtype: str) -> View:
        tile = Buf(fresh(f"{op.out}_epi{sum(isinstance(x, Alloc) for x in out)}_{dtype}"), "sbuf", dtype, (n, 1))
        out.append(Alloc(tile, line=line))
        return View(tile, dst.idx)
    # the 16-bit tensors the fusion does not store, in program order: each rounds the value once, after the
    # activation (and clamp) that computes it, before the chain's steps (which round their own, in order)
    narrow = _narrow(op, hbm)
    after = bool(op.epilogue or narrow)
    pre = dst if dst.buf.dtype == "f32" or not (after or op.clamp is not None) else work("f32")
    func = "relu" if op.relu or op.post_relu else "copy"
    out.append(ir.Act(pre, acc, func, cols[bias] if bias else None, scale, line))
    if op.clamp is not None:
        out.append(ir.Scalar(pre if after else dst, pre, "minimum", op.clamp, line))
    for dtype in narrow:
        rounded = work(dtype)
        out.append(ir.Copy(rounded, pre, line))
        pre = rounded
    if op.epilogue:
        out += eviction_fusion.chain_stmts(op.epilogue, pre, dst, lambda name: cols[name], work, line)
    elif narrow:
        out.append(ir.Copy(dst, pre, line))
    return out


def model_constants() -> dict[str, float]:
    """The performance model's constants for the current target, with the TensorE factors it applies to fp32:
    `fp32_matmul` (a matmul) and `fp32_transpose` (a PE transpose, in transpose mode where the target has it),
    read from the model's own cost table (one fact, one place)."""
    from tilec.perf.params import target_params  # the performance model's own constants, late: perf reads kernels
    prm = {name: value for name, value, _ in target_params(compiled().name).table()}
    costs = model_costs()
    prm["fp32_matmul"], prm["fp32_transpose"] = costs.fp32, costs.fp32_transpose
    return prm


def model_costs() -> Costs:
    """The performance model's cost rules for the current target (its DMA formula: Costs.dma_transfer_ns)."""
    from tilec.perf.costs import Costs  # late: perf reads kernels
    from tilec.perf.params import target_params
    return Costs(target_params(compiled().name))


def estimates(M: int, K: int, fp32: bool) -> tuple[float, float]:
    """(ns on TensorE/VectorE of the transpose path, ns of the busiest engine of this one), from the model's
    constants: per 128 x 128 block a PE transpose (fp32: transpose mode's rate), its eviction and a one-column
    matmul, versus per element of W one VectorE and one ScalarE cycle (plus their static overheads per tile)."""
    t = compiled()
    prm = model_constants()
    P, mn = t.pmax, prm["min_ii_cycles"]
    f, ft = (prm["fp32_matmul"], prm["fp32_transpose"]) if fp32 else (1.0, 1.0)
    blocks = -(-M // P) * -(-K // P)
    pe = blocks * ((P + prm["mm_fixed_cycles"]) * ft + (mn + prm["mm_fixed_cycles"]) * f) / prm["tensor_ghz"]
    evict = blocks * (max(mn, P) + prm["vector_static_cycles"]) / prm["vector_ghz"]
    tiles = -(-M // P)
    vec = tiles * (K + prm["vector_static_cycles"]) / prm["vector_ghz"]
    act = tiles * (K + mn + prm["scalar_static_cycles"]) / prm["scalar_ghz"]
    return max(pe, evict), max(vec, act)


def gpsimd_columns(K: int, chunks: list[tuple[int, int]]) -> int:
    """Columns of each tile's multiply given to GpSimdE (the last ones), balancing it against VectorE with the
    model's constants: VectorE streams one element per cycle with v read from PSUM (one instruction per bank it
    touches), GpSimdE two cycles per element from an SBUF copy of v (one instruction); each pays its static
    overhead per instruction. 0 when VectorE alone is as fast (short rows)."""
    prm = model_constants()
    mn = prm["min_ii_cycles"]

    def cost(g: int) -> float:
        split = K - g
        banks = sum(1 for c0, n in chunks if c0 < split)
        vec = (max(mn, split) + banks * prm["vector_static_cycles"]) / prm["vector_ghz"] if split else 0.0
        gps = (max(mn, 2 * g) + prm["gpsimd_static_cycles"]) / prm["gpsimd_ghz"] if g else 0.0
        return max(vec, gps)
    step = MATVEC_SPLIT_STEP
    return min(range(0, K - K % step if K > step else 0, step), key=lambda g: (cost(g), g), default=0)


def last_pieces(K: int) -> int:
    """Column pieces of the last tile of rows (1: not split). Every other tile's multiply and sum overlap the next
    tile's load; the last one's run after the last byte (matvec f32 1000 x 2048: 1.6 us of multiply, 1.8 us of
    ScalarE sum). In pieces of at least MATVEC_PIECE_MIN columns, each piece's work overlaps the next piece's load."""
    return max(1, min(MATVEC_LAST_PIECES, K // MATVEC_PIECE_MIN))


def piece_ranges(K: int, g: int, pieces: int) -> list[tuple[int, int, int]]:
    """The last tile's column pieces (lo, mid, hi): [lo, mid) multiplied on VectorE, [mid, hi) on GpSimdE, in the
    proportion g / K of the other tiles, boundaries on MATVEC_SPLIT_STEP columns where the piece allows."""
    step = MATVEC_SPLIT_STEP
    bounds = [K * j // pieces // step * step if j < pieces else K for j in range(pieces + 1)]
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        gp = (hi - lo) * g // K // step * step if g else 0
        out.append((lo, hi - gp, hi))
    return out


def build_matvec(op: ConvOp, plan: ConvPlan, hbm: dict[str, Buf], fresh: Fresh
                 ) -> tuple[list[tuple[str, int]], list[Stmt]] | None:
    if not is_matvec(op, hbm):
        return None
    t = compiled()
    d = dict(op.dims)
    M, K, line, P = d["K"], d["C"], op.line, t.pmax
    wdt, xdt, odt = hbm[op.w].dtype, hbm[op.x].dtype, hbm[op.out].dtype
    if 4 * K > t.psum_bytes // 2 or wdt != xdt:
        return None
    pe, ve = estimates(M, K, wdt == "f32")
    if ve >= pe:
        return None
    w2, s1 = hbm_view(hbm[op.w], (M, K), fresh(f"{op.w}_v"), line)
    x2, s2 = hbm_view(hbm[op.x], (1, K), fresh(f"{op.x}_v"), line)
    o2, s3 = hbm_view(hbm[op.out], (M, 1), fresh(f"{op.out}_v"), line)
    from tilec.compiler.build_conv import const_names  # late: build_conv dispatches here
    iv = dict(op.vars).get("k", "i")
    tile_name = const_names(op, fresh)["k"]
    tile = min(plan.tile_k, P, M)  # the rows per tile: the plan's out-channel tile (`tile y.i, N`)
    if grouped_is_faster(M, K, tile, wdt):
        nest, prep = transposed_rows(op, hbm, fresh, w2, x2, o2, tile, tile_name)
        label = f"main: {op.name} by tiles of rows of {op.w}, transposed on TensorE in groups of blocks"
        blocks = [ir.Block(f"{op.x} as contraction columns", tuple(prep), line), ir.Block(label, tuple(nest), line)]
        return [(tile_name, tile), (const_names(op, fresh)["c"], P)], s1 + s2 + s3 + blocks

    # v on every partition: ones[1, P].T @ v[1, K] into PSUM, one bank of columns per matmul
    ones, prep = ones_row(fresh("ones_row"), xdt, P, line)
    v_row = Buf(fresh(f"{op.x}_row"), "sbuf", xdt, (1, K))
    step = min(t.moving_fmax, t.psum_bank_bytes // 4)  # v's columns per PSUM tile (one bank each)
    chunks = [(c0, min(step, K - c0)) for c0 in range(0, K, step)]
    v_all = [Buf(fresh(f"{op.x}_bcast{j}"), "psum", "f32", (P, n)) for j, (_, n) in enumerate(chunks)]
    prep += [Alloc(v_row, line=line), Dma(whole(v_row), whole(x2), line)]
    for (c0, n), acc in zip(chunks, v_all):
        prep += [Alloc(acc, zero=True, line=line),
                 ir.Matmul(whole(acc), View(ones, (full(1), full(P))), View(v_row, (full(1), sl(c0, n))), line)]
    # the last g columns of every tile are multiplied on GpSimdE, which reads SBUF only: v's copy there, once
    g = gpsimd_columns(K, chunks)
    split = K - g
    whole_tiles, rest = divmod(M, tile)
    pieces = last_pieces(K)
    # the last tile's pieces each share their multiply between VectorE and GpSimdE: GpSimdE then needs all of v
    v_off = 0 if pieces > 1 else split
    v_sb = Buf(fresh(f"{op.x}_sbuf"), "sbuf", "f32", (P, max(K - v_off, 1) if g else 1))
    if g:
        prep.append(Alloc(v_sb, line=line))
        for (c0, n), acc in zip(chunks, v_all):
            lo, hi = max(c0, v_off), c0 + n
            if lo < hi:
                prep.append(ir.Act(View(v_sb, (full(P), sl(lo - v_off, hi - lo))),  # on ScalarE: idle until the
                                   View(acc, (full(P), sl(lo - c0, hi - lo))), "copy", line=line))  # first sum
    # whole tiles of rows go through one buffer declared here, refilled whole by each tile's DMA: a new value the
    # allocator places in a fresh copy, so tile t + 2's load does not wait (one DMA latency) for tile t's readers
    w_once = Buf(fresh(f"{op.w}_tile_rows"), "sbuf", wdt, (tile, K))
    prep.append(Alloc(w_once, line=line))

    def in_pieces(start, n: int, part, w_rows: Buf, prod: Buf, total: Buf) -> list[Stmt]:
        """The last tile loaded, multiplied and summed in `pieces` column ranges, the partial sums added at the
        end: each piece's multiply (VectorE and GpSimdE, in the proportion of the other tiles) and sum (ScalarE)
        run while the next piece loads, so after the last byte only one piece's work is left."""
        part_sums = Buf(fresh(f"{op.out}_parts"), "sbuf", "f32", (tile, pieces))
        out: list[Stmt] = [Alloc(part_sums, line=line)]
        for j, (lo, mid, hi) in enumerate(piece_ranges(K, g, pieces)):
            out.append(Dma(View(w_rows, (part, sl(lo, hi - lo))), View(w2, (sl(start, n), sl(lo, hi - lo))), line))
            for (c0, n_c), acc in zip(chunks, v_all):
                s0, e0 = max(lo, c0), min(mid, c0 + n_c)
                if s0 < e0:
                    out.append(ir.Binary(View(prod, (part, sl(s0, e0 - s0))), View(w_rows, (part, sl(s0, e0 - s0))),
                                         View(acc, (part, sl(s0 - c0, e0 - s0))), "multiply", line))
            if mid < hi:
                out.append(ir.Binary(View(prod, (part, sl(mid, hi - mid))), View(w_rows, (part, sl(mid, hi - mid))),
                                     View(v_sb, (part, sl(mid, hi - mid))), "multiply", line, engine="gpsimd"))
            piece, sums = View(prod, (part, sl(lo, hi - lo))), View(part_sums, (part, sl(j, 1)))
            if j < pieces - pieces // 2 or op.scale != 1.0:
                out.append(ir.Act(piece, piece, "copy", scale=op.scale, line=line, total=sums))
            else:  # VectorE, idle once the last products are made, sums the later half of the pieces
                out.append(ir.Reduce(sums, piece, "add", line))
        out.append(ir.Reduce(View(total, (part, full(1))), View(part_sums, (part, full(pieces))), "add", line))
        return out

    def rows(start, n: int, split_last: bool = False) -> list[Stmt]:
        # the split tile loads its pieces into a buffer of its own: a piece does not refill w_once whole, so it
        # would wait for the previous tile's readers
        w_rows = w_once if n == tile and not split_last else Buf(fresh(f"{op.w}_rows"), "sbuf", wdt, (tile, K))
        prod = Buf(fresh(f"{op.out}_prod"), "sbuf", "f32", (tile, K))
        # the sum written in the output dtype by ScalarE itself: its store then issues on ScalarE's DMA stream, so
        # the next tile's load (on VectorE's, the engine reading it first) does not queue behind it
        col = Buf(fresh(f"{op.out}_col"), "sbuf", odt, (tile, 1))
        part = sl(0, n) if n < tile else full(tile)
        plain = op.bias is None and op.residual is None and not op.relu and op.clamp is None and not op.epilogue \
            and not _narrow(op, hbm)
        total = col if plain else Buf(fresh(f"{op.out}_sum"), "sbuf", "f32", (tile, 1))
        body: list[Stmt] = [
            *([] if w_rows is w_once else [Alloc(w_rows, line=line)]),
            *([] if split_last else [Dma(View(w_rows, (part, full(K))), View(w2, (sl(start, n), full(K))), line)]),
            Alloc(prod, line=line), Alloc(col, line=line), *([] if plain else [Alloc(total, line=line)])]
        if split_last:
            body += in_pieces(start, n, part, w_rows, prod, total)
        else:
            body += [
            *[ir.Binary(View(prod, (part, sl(c0, m))), View(w_rows, (part, sl(c0, m))),
                        View(acc, (part, sl(0, m))), "multiply", line)
              for (c0, n_c), acc in zip(chunks, v_all) if c0 < split for m in (min(n_c, split - c0),)],
            *([ir.Binary(View(prod, (part, sl(split, g))), View(w_rows, (part, sl(split, g))),
                         View(v_sb, (part, sl(split - v_off, g) if v_off != split else full(g))), "multiply",
                         line, engine="gpsimd")] if g else []),
            ir.Act(View(prod, (part, full(K))), View(prod, (part, full(K))), "copy", scale=op.scale, line=line,
                   total=View(total, (part, full(1))))]
        if not plain:  # the bias, relu and fused chain on the tile's sums
            body += _finished(op, hbm, fresh, View(total, (part, full(1))), View(col, (part, full(1))),
                              (sl(start, n), full(1)), part, 1.0)
        body.append(Dma(View(o2, (sl(start, n), full(1))), View(col, (part, full(1))), line))
        return body

    tv = fresh(f"{iv}_t")
    looped = whole_tiles - (pieces > 1 and not rest)  # the last whole tile peeled when it is the one split
    nest = loop(tv, looped, rows(a(term(tv, tile, tile_name)), tile),
                note=f"for {iv} in 0..{M} (tiles of {tile_name})", line=line) if looped else []
    if rest or looped < whole_tiles:
        nest += rows(looped * tile, rest or tile, split_last=pieces > 1)
    label = f"main: {op.name} by tiles of rows of {op.w}, summed along the free axis (no transposes)"
    return [(tile_name, tile)], s1 + s2 + s3 + [ir.Block(f"{op.x} on every partition", tuple(prep), line),
                                              ir.Block(label, tuple(nest), line)]


def tp_group(K: int, tile: int, dtype: str) -> int:
    """128-column blocks of one tile of rows transposed into one PSUM tile (within a bank) and evicted together."""
    t = compiled()
    kt = K // t.pmax
    fit = min(MATVEC_TP_GROUP, t.psum_bank_bytes // (tile * DTYPE_BYTES[dtype]))
    return max(g for g in range(1, kt + 1) if kt % g == 0 and g <= fit)


def grouped_is_faster(M: int, K: int, tile: int, dtype: str) -> bool:
    """W with whole 128-column blocks: whether the transposes (evicted a PSUM bank at a time, half of each group's
    copy on VectorE and half on ScalarE) beat the rows path's busiest engine, by the model's constants: TensorE's
    rate for the dtype (fp32: transpose mode's for the transposes, the matmul factor for the one-column matmuls),
    VectorE's 16-bit mode out of PSUM for 16-bit copies."""
    t = compiled()
    if K % t.pmax or K // t.pmax < 2:
        return False
    prm = model_constants()
    fp32 = dtype == "f32"
    f, ft = (prm["fp32_matmul"], prm["fp32_transpose"]) if fp32 else (1.0, 1.0)
    P, mn, fixed = t.pmax, prm["min_ii_cycles"], prm["mm_fixed_cycles"]
    tiles, kt = -(-M // tile), K // P
    g = tp_group(K, tile, dtype)
    pe = tiles * kt * ((P + fixed) * ft + (mn + fixed) * f) / prm["tensor_ghz"]
    n = g * tile // 2  # columns of each half of a group's copy
    rate = 1.0 if fp32 else prm["perf_mode_half"]
    vec = tiles * kt // g * (max(mn, n / rate) + prm["vector_static_cycles"]) / prm["vector_ghz"]
    act = tiles * kt // g * (max(mn, n) + prm["scalar_static_cycles"]) / prm["scalar_ghz"]
    rows_act = tiles * (K + mn + prm["scalar_static_cycles"]) / prm["scalar_ghz"]  # the rows path's sums
    return max(pe, vec, act) < rows_act


def transposed_rows(op: ConvOp, hbm: dict[str, Buf], fresh: Fresh, w2: Buf, x2: Buf, o2: Buf, tile: int,
                    tile_name: str) -> tuple[list[Stmt], list[Stmt]]:
    """16-bit W: per tile of rows, its 128-column blocks transposed on TensorE g at a time into one PSUM tile,
    each group evicted by two copies (VectorE, ScalarE) into the contraction-major W_T, then one matmul per block
    (W_T block stationary, v's column of that block moving) accumulating the tile's outputs in PSUM. v's columns
    come from one-row matmuls (v_row[0, 128 block].T @ 1), so no element-wise DMA. (nest, v preparation)"""
    t = compiled()
    P, line = t.pmax, op.line
    d = dict(op.dims)
    M, K = d["K"], d["C"]
    kt_n = K // P
    wdt, xdt, odt = hbm[op.w].dtype, hbm[op.x].dtype, hbm[op.out].dtype
    g = tp_group(K, tile, wdt)
    h = (g + 1) // 2
    from tilec.compiler.build_conv import const_names  # late: build_conv dispatches here
    blk = const_names(op, fresh)["c"]  # TILE_<contraction loop>: the 128 columns of a block
    ones, prep = ones_row(fresh("ones_row"), xdt, P, line)
    v_row = Buf(fresh(f"{op.x}_row"), "sbuf", xdt, (1, K))
    v_ps = Buf(fresh(f"{op.x}_cols_acc"), "psum", "f32", (P, kt_n))
    v_col = Buf(fresh(f"{op.x}_cols"), "sbuf", xdt, (P, kt_n))
    kv = fresh("k_t")
    prep += [Alloc(v_row, line=line), Dma(whole(v_row), whole(x2), line), Alloc(v_ps, zero=True, line=line)]
    block = View(v_row, (full(1), sl(a(term(kv, P, blk)), P, 1, blk)))
    prep += loop(kv, kt_n, [ir.Matmul(View(v_ps, (full(P), sl(a(kv), 1))), block, View(ones, (full(1), sl(0, 1))),
                                      line)], note="v's blocks as columns", line=line)
    prep += [Alloc(v_col, line=line), ir.Copy(whole(v_col), whole(v_ps), line)]
    w_once = Buf(fresh(f"{op.w}_tile_rows"), "sbuf", wdt, (tile, K))
    prep.append(Alloc(w_once, line=line))

    def rows(start, n: int) -> list[Stmt]:
        w_rows = w_once if n == tile else Buf(fresh(f"{op.w}_rows"), "sbuf", wdt, (tile, K))
        part = sl(0, n) if n < tile else full(tile)
        w_t = Buf(fresh(f"{op.w}_T"), "sbuf", wdt, (P, kt_n, tile))
        # the group's first h blocks on VectorE, the rest on ScalarE, each half in a PSUM tile (a bank) of its own:
        # VectorE and ScalarE reading one PSUM bank at once collide (ARCH3; tilec/target.py Exclusion)
        tps = [Buf(fresh(f"{op.w}_tp{side}"), "psum", wdt, (P, m, tile))
               for m, side in ((h, ""), (g - h, "_act")) if m]
        acc = Buf(fresh(f"{op.out}_acc"), "psum", "f32", (tile, 1))
        col = Buf(fresh(f"{op.out}_col"), "sbuf", odt, (tile, 1))
        gv, jv, mv = fresh("k_grp"), fresh("k_in"), fresh("k_t")

        def slot(buf: Buf, lo, m: int) -> View:
            return View(buf, (full(P), sl(lo, m), part))
        blocks = Buf(fresh(f"{op.w}_blocks"), "sbuf", wdt, (tile, kt_n, P))  # w_rows by 128-column blocks
        group: list[Stmt] = [Alloc(tp, line=line) for tp in tps]
        for j0, tp in zip((0, h), tps):
            src = View(blocks, (part, a(term(gv, g), term(jv), j0), full(P)))
            group += loop(jv, tp.shape[1], [ir.Transpose(View(tp, (full(P), a(jv), part)), src, "pe", line)],
                          note="blocks of the group" if j0 == 0 else "the group's other blocks", line=line)
        group += [ir.Copy(slot(w_t, a(term(gv, g)), h), slot(tps[0], a(0), h), line)]
        if g > h:
            group.append(ir.Act(slot(w_t, a(term(gv, g), h), g - h), slot(tps[1], a(0), g - h), "copy", line=line))
        body: list[Stmt] = [] if w_rows is w_once else [Alloc(w_rows, line=line)]
        body += [Dma(View(w_rows, (part, full(K))), View(w2, (sl(start, n), full(K))), line), Alloc(w_t, line=line),
                 ir.Reshape(blocks, w_rows, line)]
        body += loop(gv, kt_n // g, group, note=f"transpose {op.w}: groups of {g} blocks", line=line)
        body += [Alloc(acc, zero=True, line=line)]
        body += loop(mv, kt_n, [ir.Matmul(View(acc, (part, full(1))), View(w_t, (full(P), a(mv), part)),
                                          View(v_col, (full(P), sl(a(mv), 1))), line)],
                     note="for k in blocks of 128", line=line)
        body += [Alloc(col, line=line)]
        body += _finished(op, hbm, fresh, View(acc, (part, full(1))), View(col, (part, full(1))),
                          (sl(start, n), full(1)), part, op.scale)
        body += [Dma(View(o2, (sl(start, n), full(1))), View(col, (part, full(1))), line)]
        return body

    whole_tiles, rest = divmod(M, tile)
    iv = dict(op.vars).get("k", "i")
    tv = fresh(f"{iv}_t")
    nest = loop(tv, whole_tiles, rows(a(term(tv, tile, tile_name)), tile),
                note=f"for {iv} in 0..{M} (tiles of {tile_name})", line=line)
    if rest:
        nest += rows(whole_tiles * tile, rest)
    return nest, prep
