"""Loop-nest builder for a depthwise convolution `Y[n, c, y, x] += X[n, c, sy*y + dy*r + oy, sx*x + dx*s + ox] *
W[c, r, s]` (no channel contraction: every product stays in its channel's partition).

The default kernel fills the partitions with (slot, channel) pairs, a slot being one image, or one block of output
rows of an image when the batch alone cannot fill them (144 channels at batch 1: 2 row blocks of 48 channels; at
batch 8: 8 images of 16 channels), and splits the taps over all four compute engines:

    identity I (once, built on chip: ir.Identity, a memset and a GpSimdE affine_select; build_util.identity)
    W[c, :, :] (and the bias) as one fp32 column per tap on every slot's partitions, for every group of GROUP
    channels; TensorE's taps as diagonal matrices diag(W[:, r, s]) = I scaled per partition (once)
    for each group of GROUP channels, for each tile of IMAGES images:
      band[slot*GROUP + c, rows, cols] = X[n, c, the slot's input rows, columns inside X]    one DMA per slot;
                               halo rows (a padded read's) are copied from a zero tile by DMA, never loaded
      for each chunk of output rows (one fp32 PSUM bank), software-pipelined two chunks deep:
        per tap (r, s), the shifted window of the band times the tap's weight column, by one of
          TensorE  acc += diag(w) @ window (fp32 matmul, accumulating in PSUM)
          ScalarE  activation(copy, scale=column) -> product, added by VectorE into the PSUM sum (one PSUM input:
                   N cycles, spec §1.10.4) or by GpSimdE into an SBUF sum (tensor_tensor: 2N cycles)
          VectorE  tensor_scalar(multiply) -> product, and its add
        a tap whose columns reach a padded read's halo covers only the output columns inside X
        VectorE adds the GpSimdE sum into PSUM; ScalarE evicts (bias, relu; relu6 clamps in PSUM first)
      out band -> Y, one DMA per slot

How many taps take each route comes from the performance model's own instruction costs (spec §2.4, the parameters
of tilec/perf/params.py), so that the engines finish a chunk together; the layout (channels per group, row blocks,
images per tile) from the same costs and from the stores: the row blocks of one image are stores into overlapping
HBM ranges, which run one after another, a DMA latency apart.

The same kernel serves a grouped conv of Cg == Kg channels per group (2..8) as a TensorE + vector-engine hybrid
(`hybrid`), where the model's costs say it beats the grouped builder's block-diagonal matmuls (f32): partition
(m, g) computes output channel g*Kg + m, its band holds the group's input channels rotated by m (band slot j =
input channel (m + j) % Kg, so slot 0 over all partitions is every input channel once); TensorE takes whole window
positions (r, s) of all input channels as block-diagonal matmuls of slot 0 (the matrices: a stacked identity
scaled per partition), the vector engines the other positions channel by channel; one store per output channel.

`depthwise_taps` is the general path under any other schedule (channels on partitions as the plan tiles them, every
tap a ScalarE product and a VectorE add into SBUF), with the plan's bands, pools and residuals.

This module chooses and builds; the kernel's parts: depthwise_layout.py (which convs, the taps' routes, the layout
ranking), depthwise_kernel.py (the builder), depthwise_hybrid.py (the grouped hybrid's parts), depthwise_explain.py.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from tilec.compiler import build_util, ir
from tilec.compiler import depthwise_hybrid as hy
from tilec.compiler.build_util import a, sl
from tilec.compiler.depthwise_explain import explain, plural
from tilec.compiler.depthwise_kernel import DepthwiseBuilder
from tilec.compiler.depthwise_layout import (DEPTH, DIAG_BUDGET, DTYPE, FAN_IN_MAX, HYBRID_SBUF_SHARE, LAYOUT_TRIES,
                                             STORE_CHAIN_NS, layout_estimates, MULTIPLIER_MAX, PRODUCT_TRIES,
                                             PSUM_FP32, SBUF_SHARE, Layout, Routes, _matmul_ns,
                                             choose_layout, choose_routes, fan_in, fast_path, hybrid, hybrid_routes,
                                             multiplier, rank_layouts)
from tilec.compiler.ir import Act, Alloc, Binary, Buf, Scalar, Stmt, View, full
from tilec.compiler.ops import ConvOp
from tilec.compiler.schedule import PMAX, ConvPlan, default_plan
from tilec.target import compiled

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder

# the kernel's parts, by module: depthwise_layout (choices), depthwise_kernel (builder), depthwise_hybrid,
# depthwise_explain; their names used by the MobileNet block and the tests are this module's too
__all__ = ["DEPTH", "FAN_IN_MAX", "MULTIPLIER_MAX", "PSUM_FP32", "DepthwiseBuilder", "Layout", "Routes", "_matmul_ns",
           "build_depthwise", "choose", "choose_hybrid", "choose_layout", "choose_routes", "decide", "dense_ns",
           "depthwise_taps", "describe", "hybrid_faster", "hybrid_routes", "plural", "rank_layouts"]


def choose(op: ConvOp, plan: ConvPlan, hbm: dict[str, Buf]) -> tuple[Layout, bool] | None:
    """(the layout, whether TensorE takes taps) of the default kernel (None: not a case for it, no layout fits, or
    the block-diagonal dense conv is faster on the model's estimate; the general path then follows the plan)."""
    return decide(op, plan, hbm)[0]


def decide(op: ConvOp, plan: ConvPlan, hbm: dict[str, Buf]
           ) -> tuple[tuple[Layout, bool] | None, float | None, float | None]:
    """(`choose`'s answer, the depthwise kernel's estimated ns, the block-diagonal dense conv's): the best-ranked
    layout whose dry build fits the SBUF and PSUM budgets, unless the general path's kernel of a grouped conv (one
    input channel per group: a channel multiplier; or one output channel per group: a fan-in) is estimated faster
    (`dense_ns`; the issue: "whichever the model says is faster")."""
    from tilec.compiler import passes  # late: passes imports the builders' modules
    from tilec.compiler.schedule import sbuf_budget
    t = compiled()
    if hybrid(op):
        lay = choose_hybrid(op, plan, hbm)
        return ((lay, True) if lay else None), None, None
    if not fast_path(op, plan, hbm):
        return None, None, None
    elem = DTYPE[hbm[op.x].dtype]
    # TensorE takes taps as diagonal matmuls when the weights can be its operand in X's dtype
    for pe in dict.fromkeys((hbm[op.w].dtype == hbm[op.x].dtype, False)):
        estimates = {lay: ns for ns, lay in layout_estimates(op, elem, op.clamp is not None, pe)}
        for lay in rank_layouts(op, elem, op.clamp is not None, pe)[:LAYOUT_TRIES]:
            ns = estimates.get(lay, 0.0)
            groups = -(-op.dim("C") // fan_in(op) // lay.cg)
            taps = max(1, multiplier(op)) * fan_in(op) * op.dim("R") * op.dim("S")
            if pe and groups * taps * lay.k * lay.nb * lay.cg * elem > DIAG_BUDGET:
                continue  # every group's diagonal weights stay resident in SBUF
            # more product buffers when they fit (a product waits less for the add of its buffer's last product)
            for products in PRODUCT_TRIES:
                trial = replace(lay, products=products)
                built = DepthwiseBuilder(op, hbm, lambda name: name, trial, pe).build()
                sbuf, psum = passes.peak_usage(tuple(built))
                if sbuf <= sbuf_budget(t) * SBUF_SHARE and psum <= t.psum_banks:
                    dense = dense_ns(op, hbm) if op.groups > 1 else None  # (`dw` weights: no block-diagonal path)
                    ns += first_tap_ns(built) if pe else 0.0
                    return (None if dense is not None and dense < ns else (trial, pe)), ns, dense
    return None, None, None


def hybrid_faster(op: ConvOp, n: int, fp32: bool) -> bool:
    """Whether the hybrid's busiest engine per chunk of n elements per partition beats today's grouped kernel (one
    block-diagonal matmul per tap (r, s), all of TensorE's), on the model's costs."""
    rt = hybrid_routes(op.dim("R") * op.dim("S"), hybrid(op), n, op.clamp is not None, fp32)
    return rt.pe > 0 and rt.ns < op.dim("R") * op.dim("S") * _matmul_ns(n, fp32)


def hybrid_costs(op: ConvOp, plan: ConvPlan, hbm: dict[str, Buf]) -> tuple[int, float, float] | None:
    """(columns per chunk, the hybrid's busiest engine ns per chunk, the grouped kernel's matmuls' ns per chunk) of
    a grouped conv the hybrid could take under the default plan (`choose_hybrid`'s comparison); else None."""
    if not hybrid(op) or op.pool or op.residual or op.w_batch or op.bias_role != "k" \
            or hbm[op.w].dtype != hbm[op.x].dtype:
        return None
    ho, wo = op.dim("Ho"), op.dim("Wo")
    if wo > PSUM_FP32 or ho * wo == 0 or plan != default_plan(op, {k: b.dtype for k, b in hbm.items()}):
        return None
    n, fp32 = min(ho, PSUM_FP32 // wo) * wo, hbm[op.x].dtype == "f32"
    rt = hybrid_routes(op.dim("R") * op.dim("S"), hybrid(op), n, op.clamp is not None, fp32)
    return n, rt.ns, op.dim("R") * op.dim("S") * _matmul_ns(n, fp32)


def choose_hybrid(op: ConvOp, plan: ConvPlan, hbm: dict[str, Buf]) -> Layout | None:
    """The hybrid's layout (whole conv groups per channel group, whole images per tile, chunks of PSUM rows) when
    it is faster than the grouped kernel on the model's costs and fits the SBUF and PSUM budgets; else None."""
    from tilec.compiler import passes
    from tilec.compiler.schedule import sbuf_budget
    kg = hybrid(op)
    if op.pool or op.residual or op.w_batch or op.bias_role != "k" or hbm[op.w].dtype != hbm[op.x].dtype:
        return None
    ho, wo, n_img = op.dim("Ho"), op.dim("Wo"), op.dim("N")
    if wo > PSUM_FP32 or ho * wo == 0 or plan != default_plan(op, {k: b.dtype for k, b in hbm.items()}):
        return None
    rc = min(ho, PSUM_FP32 // wo)
    fp32 = hbm[op.x].dtype == "f32"
    if not hybrid_faster(op, rc * wo, fp32):
        return None
    t, groups = compiled(), op.dim("K") // kg
    for d in sorted((d for d in range(1, groups + 1) if groups % d == 0 and d * kg <= PMAX), reverse=True):
        lay = Layout(d * kg, 1, ho, max(1, min(n_img, PMAX // (d * kg))), rc)
        trial = DepthwiseBuilder(op, hbm, lambda name: name, lay, True)
        if not hy.pe_starts_whole(trial):  # a padded conv whose TensorE taps are all clipped (f32: 6 of 3x3's 9)
            return None
        sbuf, psum = passes.peak_usage(tuple(trial.build()))
        if sbuf <= sbuf_budget(t) * HYBRID_SBUF_SHARE and psum <= t.psum_banks:
            return lay
    return None


def build_depthwise(op: ConvOp, plan: ConvPlan, hbm: dict[str, Buf], fresh: Callable[[str], str]
                    ) -> tuple[list[tuple[str, int]], list[Stmt]] | None:
    """The default kernel of a depthwise conv (None: the general path builds it from the plan, see `choose`)."""
    chosen = choose(op, plan, hbm) if not op.epilogue else None  # (a fused element-wise chain: the general path)
    if chosen is None:
        return None
    b = DepthwiseBuilder(op, hbm, fresh, *chosen)
    stmts = b.build()
    return b.consts(), stmts



def describe(op: ConvOp, plan: ConvPlan, hbm: dict[str, Buf]) -> list[str]:
    """The plan the default kernel uses, for `tilec explain` (no lines: the op takes the general path)."""
    chosen, ns, dense = decide(op, plan, hbm)
    costs = hybrid_costs(op, plan, hbm)
    if costs is not None:  # the grouped hybrid against the block-diagonal conv, per chunk of n columns
        n, hyb, mm = costs
        why = (f"per chunk of {n} columns the hybrid's busiest engine takes {hyb / 1000:.2f} us, the "
               f"{op.dim('R') * op.dim('S')} block-diagonal matmuls {mm / 1000:.2f} us")
        if chosen is None:
            return [f"# {op.name}: the block-diagonal dense conv (build_conv), faster on the model's costs: {why}"]
        lay, pe = chosen
        lines = explain(op, DepthwiseBuilder(op, hbm, lambda name: name, lay, pe), pe)
        return lines[:1] + [f"#   chosen by the model's costs: {why}"] + lines[1:]
    if chosen is None:
        if dense is None or ns is None:
            return []
        versus = f"{dense / 1000:.1f} us against the depthwise kernel's {ns / 1000:.1f} us"
        return [f"# {op.name}: the block-diagonal dense conv (build_conv), faster on the model's estimate: {versus}; "
                f"{plural(dense_folds(op, hbm), 'tap')} per matmul"]
    lay, pe = chosen
    lines = explain(op, DepthwiseBuilder(op, hbm, lambda name: name, lay, pe), pe)
    if dense is not None and ns is not None:
        lines.insert(1, f"#   chosen by the model's estimate: {ns / 1000:.1f} us against the block-diagonal "
                        f"dense conv's {dense / 1000:.1f} us")
    return lines


# ---- the general path (any schedule): channels on partitions as the plan tiles them -------------------------------

def depthwise_taps(cb: "_ConvBuilder") -> list[Stmt]:
    """No contraction: acc[k] = sum over taps of w[k, tap] * band[k, shifted], the products on ScalarE (an
    activation with a per-partition scale column) and the sums on VectorE, in an fp32 SBUF accumulator that the
    epilogue reads as it would read PSUM."""
    p, line, V, op = cb.p, cb.line, cb.var, cb.op
    kp, ci = cb.part(cb.ks, p.tile_k), cb.tile_index(cb.kv, cb.KT)
    acc = Buf(cb.fresh(f"{op.name}_acc"), "sbuf", "f32", (p.tile_k, p.rows, p.tile_x))
    tmps = [Buf(cb.fresh(f"{op.name}_tap{i}"), "sbuf", "f32", acc.shape) for i in range(2)]
    used = lambda buf: View(buf, (kp, full(p.rows), full(p.tile_x)))  # noqa: E731
    wt = cb.wt_buf(p.hoist_w == "k")
    wi = a(0) if p.hoist_w == "k" else ci
    out: list[Stmt] = [Alloc(acc, line=line)]
    out += [Alloc(t, line=line) for t in tmps] if cb.R * cb.S > 1 else []
    for t, (r, s) in enumerate((r, s) for r in range(cb.R) for s in range(cb.S)):
        rows = sl(a(cb.step(V["g"], p.rows, cb.cn["rows"], cb.sy), r * cb.dy), p.rows, cb.sy,
                  cb.cn["rows"] if cb.sy == 1 else "")
        cols = sl(a(cb.step(V["x"], p.tile_x, cb.cn["x"], cb.sx), s * cb.dx), p.tile_x, cb.sx,
                  cb.cn["x"] if cb.sx == 1 else "")
        band = View(cb.x_band_buf(), (kp, ci, rows, cols))
        w = View(wt, (kp, wi, a(r), sl(s, 1)))
        if t == 0:
            out.append(Act(used(acc), band, "copy", None, w, cb.L["update"]))
            continue
        tmp = used(tmps[t % 2])
        out += [Act(tmp, band, "copy", None, w, cb.L["update"]),
                Binary(used(acc), used(acc), tmp, "add", cb.L["update"])]
    return out + cb.epilogue(used(acc))


def dense_ns(op: ConvOp, hbm: dict[str, Buf]) -> float:
    """The model's estimate of the general path's kernel under the default plan (build_conv's block-diagonal
    stationary, with folded taps when the input channels leave room), counted as `layout_estimates` counts the
    depthwise kernel: TensorE's matmuls (plus the stationary's PE transposes and the warm-up throttle's half rate
    over its first window) or the DMA bytes, whichever take longer, plus the first band's load and the last band's
    store."""
    from tilec.compiler.conv_fold import fold_groups
    from tilec.perf.params import target_params
    t = compiled()
    prm = {name: value for name, value, _ in target_params(t.name).table()}
    plan = default_conv_plan(op, hbm)
    n_img, c, k, ho, wo = op.dim("N"), op.dim("C"), op.dim("K"), op.dim("Ho"), op.dim("Wo")
    folded = dense_folds(op, hbm) > 1
    taps = len(fold_groups(op.dim("R"), op.dim("S"), plan.fold)) if folded else op.dim("R") * op.dim("S")
    c_tiles = 1 if c == k else -(-c // plan.tile_c)  # equal in and out channels: tile i reads in-channel tile i
    k_tiles = -(-k // plan.tile_k)
    chunks = n_img * k_tiles * -(-ho // plan.rows) * -(-wo // plan.tile_x)
    fp32 = hbm[op.x].dtype == "f32"
    pe = chunks * c_tiles * taps * _matmul_ns(plan.rows * plan.tile_x, fp32) \
        + k_tiles * c_tiles * taps * _matmul_ns(plan.tile_k, fp32) + prm["throttle_ramp_ns"] / 2
    elem, bw = DTYPE[hbm[op.x].dtype], t.dma_engines * t.dma_engine_bw
    copies = plan.fold if folded else 1  # a folded band holds `fold` shifted copies of X
    in_rows = (plan.band - 1) * op.stride[0] + (op.dim("R") - 1) * op.dilation[0] + 1
    band_in, band_out = copies * c * in_rows * op.dim("W") * elem, k * plan.band * wo * elem
    dma = n_img * (copies * c * op.dim("H") * op.dim("W") + k * ho * wo) * elem / bw
    # before the first matmul: one DMA per group of the stationary's rows (build_conv.weights_grouped: descriptors
    # issued one after another), then the first band (a DMA latency and its bytes)
    prep = k * 2 * prm["dma_desc_ns"] // max(1, k // op.groups) + prm["dma_latency_ns"]
    return prep + max(pe, dma) + (band_in + band_out) / bw + STORE_CHAIN_NS


def identity_ns() -> float:
    """The depthwise kernel's f32 identity, built on chip (build_util.identity_ns)."""
    return build_util.identity_ns(4)


def first_tap_ns(built: list[Stmt]) -> float:
    """What `layout_estimates` leaves out before TensorE's first tap: the weight columns' load (a DMA latency; the
    identity, built on chip meanwhile, when it takes longer), then the first group's diagonal matrices
    (`diagonals`: one scaled copy of the identity per TensorE tap, ScalarE and VectorE by turns; the statements
    counted once, i.e. one iteration of the groups' loop: the later groups' are built while TensorE runs the
    first's taps), at the model's costs (tensor_scalar / activation max(MIN_II, N) plus the engine's static
    cycles). Until the identity was built on chip its HBM round trip (~3 us) stood in for all of this."""
    from tilec.perf.params import target_params
    prm = {name: value for name, value, _ in target_params(compiled().name).table()}
    copies = sum(isinstance(s, (Act, Scalar)) and s.src.buf.name.startswith("ident") for s in ir.walk(tuple(built)))
    n = compiled().pmax
    vector = (max(prm["min_ii_cycles"], n) + prm["vector_static_cycles"]) / prm["vector_ghz"]
    scalar = (max(prm["min_ii_cycles"], n) + prm["scalar_static_cycles"]) / prm["scalar_ghz"]
    return max(prm["dma_latency_ns"], identity_ns()) + -(-copies // 2) * max(vector, scalar)


def default_conv_plan(op: ConvOp, hbm: dict[str, Buf]) -> ConvPlan:
    plan = default_plan(op, {k: b.dtype for k, b in hbm.items()})
    assert isinstance(plan, ConvPlan)
    return plan


def dense_folds(op: ConvOp, hbm: dict[str, Buf]) -> int:
    """Filter taps per matmul of the general path's kernel under the default plan (build_conv: folded into the
    contraction partitions when all input channels are one tile)."""
    plan = default_conv_plan(op, hbm)
    return plan.fold if plan.fold > 1 and op.dim("C") <= plan.tile_c else 1
