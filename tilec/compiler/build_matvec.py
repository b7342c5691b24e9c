"""A matrix-vector product `y[i] = sum_k W[i, k] * v[k]` (W stored row-major, [out, in]) without TensorE transposes.

The contraction path (build_conv) puts the contraction on the partitions: W must be transposed block by block on
TensorE (fp32 at a quarter rate) and every block evicted from PSUM, for matmuls of one moving column each, so the
kernel is bound by TensorE's transposes, not by reading W. Here W's rows stay on the partitions as loaded (one
contiguous DMA per tile of rows) and the contraction runs along the free axis:

    v broadcast to every partition once: a ones row times v on TensorE into PSUM (one matmul per PSUM bank)
    per tile of rows: W_rows * v on VectorE (PSUM input: the 1x rate), summed along the free axis on ScalarE
    (activation copy with its reduce result), the column stored

VectorE and ScalarE then each spend about one cycle per element of W, below the DMA time of reading W once. Long
rows share the multiply with GpSimdE (`gpsimd_columns`: the last columns of every tile, from an SBUF copy of v made
once on ScalarE; GpSimdE cannot read PSUM), and whole tiles of rows go through one buffer declared before the loop
(each tile's DMA refills it whole, so the next loads need not wait for the last tile's readers). matvec f16
(1000 x 2048): 23.82 -> 18.23 us run, 2.14x -> 1.64x of the DMA floor, now ScalarE's sums (1.84 us per tile) set
the pace; f32 30.24 -> 26.84 us, 1.36x -> 1.20x.
Chosen when the performance model's constants say it is faster than the transposes (`estimates`) and v fits in
half of PSUM.
"""
from __future__ import annotations

from typing import Callable

from tilec.compiler import ir
from tilec.compiler.build_util import a, hbm_view, loop, ones_row, sl, term
from tilec.compiler.ir import Alloc, Buf, Dma, Stmt, View, full, whole
from tilec.compiler.ops import ConvOp
from tilec.compiler.schedule import ConvPlan
from tilec.target import target as get_target

Fresh = Callable[[str], str]  # as build_conv.Fresh
MATVEC_SPLIT_STEP = 64  # granularity of the VectorE / GpSimdE split of a tile's columns


def is_matvec(op: ConvOp, hbm: dict[str, Buf]) -> bool:
    """A plain W[i, k] v[k] product: one moving column, no taps, nothing fused on the eviction."""
    d = dict(op.dims)
    plain = (op.w_layout == "kc" and op.groups == 1 and not op.w_batch and not op.x_transposed and op.bias is None
             and op.residual is None and op.pool is None and not op.relu and not op.post_relu and op.clamp is None
             and not op.fused)
    return plain and d["N"] * d["Ho"] * d["Wo"] * d["H"] * d["W"] * d["R"] * d["S"] == 1


def estimates(M: int, K: int, fp32: bool) -> tuple[float, float]:
    """(ns on TensorE/VectorE of the transpose path, ns of the busiest engine of this one), from the model's
    constants: per 128 x 128 block a PE transpose, its eviction and a one-column matmul, versus per element of W
    one VectorE and one ScalarE cycle (plus their static overheads per tile)."""
    from tilec.perf.params import target_params  # the performance model's own constants, late: perf reads kernels
    t = get_target()
    prm = {name: value for name, value, _ in target_params(t.name).table()}
    P, mn = t.pmax, prm["min_ii_cycles"]
    f = prm["mm_fp32_factor"] if fp32 else 1.0
    blocks = -(-M // P) * -(-K // P)
    pe = blocks * ((P + prm["mm_fixed_cycles"]) * f + (mn + prm["mm_fixed_cycles"]) * f) / prm["tensor_ghz"]
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
    from tilec.perf.params import target_params  # the performance model's own constants (as estimates)
    prm = {name: value for name, value, _ in target_params(get_target().name).table()}
    mn = prm["min_ii_cycles"]

    def cost(g: int) -> float:
        split = K - g
        banks = sum(1 for c0, n in chunks if c0 < split)
        vec = (max(mn, split) + banks * prm["vector_static_cycles"]) / prm["vector_ghz"] if split else 0.0
        gps = (max(mn, 2 * g) + prm["gpsimd_static_cycles"]) / prm["gpsimd_ghz"] if g else 0.0
        return max(vec, gps)
    step = MATVEC_SPLIT_STEP
    return min(range(0, K - K % step if K > step else 0, step), key=lambda g: (cost(g), g), default=0)


def build_matvec(op: ConvOp, plan: ConvPlan, hbm: dict[str, Buf], fresh: Fresh
                 ) -> tuple[list[tuple[str, int]], list[Stmt]] | None:
    if not is_matvec(op, hbm):
        return None
    t = get_target()
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
    v_sb = Buf(fresh(f"{op.x}_sbuf"), "sbuf", "f32", (P, max(g, 1)))
    if g:
        prep.append(Alloc(v_sb, line=line))
        for (c0, n), acc in zip(chunks, v_all):
            lo, hi = max(c0, split), c0 + n
            if lo < hi:
                prep.append(ir.Act(View(v_sb, (full(P), sl(lo - split, hi - lo))),  # on ScalarE: idle until the
                                   View(acc, (full(P), sl(lo - c0, hi - lo))), "copy", line=line))  # first sum
    # whole tiles of rows go through one buffer declared here, refilled whole by each tile's DMA: a new value the
    # allocator places in a fresh copy, so tile t + 2's load does not wait (one DMA latency) for tile t's readers
    w_once = Buf(fresh(f"{op.w}_tile_rows"), "sbuf", wdt, (tile, K))
    prep.append(Alloc(w_once, line=line))

    def rows(start, n: int) -> list[Stmt]:
        w_rows = w_once if n == tile else Buf(fresh(f"{op.w}_rows"), "sbuf", wdt, (tile, K))
        prod = Buf(fresh(f"{op.out}_prod"), "sbuf", "f32", (tile, K))
        # the sum written in the output dtype by ScalarE itself: its store then issues on ScalarE's DMA stream, so
        # the next tile's load (on VectorE's, the engine reading it first) does not queue behind it
        col = Buf(fresh(f"{op.out}_col"), "sbuf", odt, (tile, 1))
        part = sl(0, n) if n < tile else full(tile)
        body: list[Stmt] = [
            *([] if w_rows is w_once else [Alloc(w_rows, line=line)]),
            Dma(View(w_rows, (part, full(K))), View(w2, (sl(start, n), full(K))), line),
            Alloc(prod, line=line), Alloc(col, line=line),
            *[ir.Binary(View(prod, (part, sl(c0, m))), View(w_rows, (part, sl(c0, m))),
                        View(acc, (part, sl(0, m))), "multiply", line)
              for (c0, n_c), acc in zip(chunks, v_all) if c0 < split for m in (min(n_c, split - c0),)],
            *([ir.Binary(View(prod, (part, sl(split, g))), View(w_rows, (part, sl(split, g))),
                         View(v_sb, (part, full(g))), "multiply", line, engine="gpsimd")] if g else []),
            ir.Act(View(prod, (part, full(K))), View(prod, (part, full(K))), "copy", line=line,
                   total=View(col, (part, full(1))))]
        body.append(Dma(View(o2, (sl(start, n), full(1))), View(col, (part, full(1))), line))
        return body

    whole_tiles, rest = divmod(M, tile)
    tv = fresh(f"{iv}_t")
    nest = loop(tv, whole_tiles, rows(a(term(tv, tile, tile_name)), tile),
                note=f"for {iv} in 0..{M} (tiles of {tile_name})", line=line)
    if rest:
        nest += rows(whole_tiles * tile, rest)
    label = f"main: {op.name} by tiles of rows of {op.w}, summed along the free axis (no transposes)"
    return [(tile_name, tile)], s1 + s2 + s3 + [ir.Block(f"{op.x} on every partition", tuple(prep), line),
                                              ir.Block(label, tuple(nest), line)]
