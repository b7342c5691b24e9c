"""Loop-nest builder for a depthwise convolution `Y[n, c, y, x] += X[n, c, sy*y + dy*r + oy, sx*x + dx*s + ox] *
W[c, r, s]` (no channel contraction: every product stays in its channel's partition).

The default kernel fills the partitions with (slot, channel) pairs, a slot being one image, or one block of output
rows of an image when the batch alone cannot fill them (144 channels at batch 1: 2 row blocks of 48 channels; at
batch 8: 8 images of 16 channels), and splits the taps over all four compute engines:

    identity I (once; no iota at level B: a [128, 129] tile with a column of ones, through HBM and back)
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
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from tilec.compiler import ir
from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.ir import Act, Alloc, Binary, Buf, Dma, Matmul, Reshape, Scalar, Stmt, View, full
from tilec.compiler.ops import ConvOp
from tilec.compiler.schedule import PMAX, ConvPlan, default_plan
from tilec.target import target as get_target

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder

PSUM_FP32 = 512  # fp32 elements per partition in one 2 KiB PSUM bank: a chunk's accumulator
STORE_CHAIN_NS = 2000.0  # the last stores after the last taps: a DMA latency (~1.15 us) + transfer
SBUF_BUDGET = 96 * 1024  # bytes per partition for the band and the output band (two of each in flight)
DIAG_BUDGET = 48 * 1024  # bytes per partition for TensorE's diagonal weights (all taps of all groups, at most)
LAYOUT_TRIES = 8  # candidate layouts (best estimate first) tried against the SBUF and PSUM budgets
SBUF_SHARE = 0.5  # of the kernel's SBUF budget: the peak of a kernel adds its ops' top-level buffers
HYBRID_SBUF_SHARE = 0.6  # the hybrid's band holds Kg channels per partition: a 56x56 f32 band of 4 is 53 KiB
STORE_SPLIT = 3  # the hybrid stores the rows evicted before its last STORE_SPLIT chunks' taps, then the rest
DEPTH = 2  # chunks whose taps are issued before a chunk's final add and eviction
PRODUCTS = 4  # product buffers per chunk
DTYPE = {"f32": 4, "f16": 2, "bf16": 2}


@dataclass(frozen=True)
class Layout:
    cg: int  # channels per group (the partitions of one slot)
    nb: int  # row blocks per image
    rb: int  # output rows per block
    k: int  # images per tile
    rc: int  # output rows per chunk (one PSUM accumulator)


@dataclass(frozen=True)
class Routes:
    """How the taps are computed, in issue order: pe taps as matmuls of a diagonal weight matrix on TensorE
    (accumulating into the PSUM sum and starting it), else `first` starts the PSUM sum ("s": ScalarE product, "v":
    VectorE product); then v taps (VectorE product and add), sv taps (ScalarE product, VectorE add), g taps (ScalarE
    product, GpSimdE add; the first one starts the GpSimdE sum)."""
    pe: int
    first: str
    sv: int
    v: int
    g: int
    ns: float  # busiest engine's time per chunk (model estimate)


MULTIPLIER_MAX = 4  # a channel multiplier up to this many outputs per input channel takes the depthwise kernel


def multiplier(op: ConvOp) -> int:
    """Output channels per input channel: 1 for a depthwise conv (`dw` weights), M for a grouped conv of one input
    channel per group (`Y[n, c*M + m] += X[n, c] * W[c*M + m]`: depthwise with a channel multiplier), 0 otherwise
    (one group is a dense contraction: a matmul or a conv of one input channel keeps the general path)."""
    if op.w_layout == "dw":
        return 1
    c, k = op.dim("C"), op.dim("K")
    if op.w_layout == "kc" and op.groups == c > 1 and k % c == 0 and k // c <= MULTIPLIER_MAX \
            and not op.x_transposed:
        return k // c
    return 0


FAN_IN_MAX = 8  # a grouped conv of one output channel per group and up to this many inputs takes the depthwise kernel


def fan_in(op: ConvOp) -> int:
    """Input channels summed per output channel inside its partition: Cg for a grouped conv whose groups have one
    output channel (`Y[n, g] += X[n, g*Cg + c] * W[g, c]`: the taps run over (c, r, s)), 1 for a depthwise conv and
    for one group (a dense contraction with one output, e.g. a matrix-vector product, keeps the general path)."""
    c, k = op.dim("C"), op.dim("K")
    if op.w_layout == "kc" and op.groups == k > 1 and c % k == 0 and 1 < c // k <= FAN_IN_MAX \
            and not op.x_transposed:
        return c // k
    return 1


HYBRID_SIZES = (2, 8)  # channels per group (in and out, equal) of a grouped conv the TensorE + vector hybrid takes


def hybrid(op: ConvOp) -> int:
    """Kg for a grouped conv of several groups of Cg == Kg channels (in and out, 2..8): the hybrid kernel, where
    TensorE takes some taps (r, s) of all of a group's input channels as block-diagonal matmuls and the vector
    engines the other taps of each input channel; 0 otherwise."""
    if op.w_layout != "kc" or op.groups <= 1 or op.x_transposed or multiplier(op) or fan_in(op) > 1:
        return 0
    c, k, g = op.dim("C"), op.dim("K"), op.groups
    if c % g or k % g or c // g != k // g:
        return 0
    return k // g if HYBRID_SIZES[0] <= k // g <= HYBRID_SIZES[1] else 0


@functools.lru_cache(maxsize=None)
def hybrid_routes(positions: int, kg: int, n: int, clamp: bool, fp32: bool) -> Routes:
    """The hybrid's split of a chunk of n elements per partition: pe of the window's positions (r, s) on TensorE
    (one block-diagonal matmul each, all kg input channels of a group at once), the kg channel-taps of every other
    position on the vector engines (`choose_routes`, without TensorE); the smallest busiest-engine time."""
    best: Routes | None = None
    for pe in range(positions):  # all positions on TensorE is the grouped builder's matmul kernel
        if pe == 0:
            rt = choose_routes(kg * positions, n, clamp)
        else:  # the matmuls start the PSUM sum: the vector taps' split counts one product more (a bound)
            vt = choose_routes(kg * (positions - pe) + 1, n, clamp)
            rt = Routes(pe, "", vt.sv, vt.v, vt.g, max(vt.ns, pe * _matmul_ns(n, fp32)))
        if best is None or rt.ns < best.ns:
            best = rt
    assert best is not None
    return best


def fast_path(op: ConvOp, plan: ConvPlan, hbm: dict[str, Buf]) -> bool:
    """The slot layout serves the default schedule of a plain depthwise conv (with bias, relu, relu6), with a
    channel multiplier too; a user's schedule, a fused pool or residual keep the general path that follows the
    plan."""
    if not (multiplier(op) or fan_in(op) > 1) or op.pool or op.residual or op.w_batch or op.bias_role != "k":
        return False
    if op.dim("Wo") > PSUM_FP32 or op.dim("Ho") * op.dim("Wo") == 0:
        return False
    dtypes = {name: buf.dtype for name, buf in hbm.items()}
    return plan == default_plan(op, dtypes)


@functools.lru_cache(maxsize=None)
def choose_routes(taps: int, n: int, clamp: bool, pe: bool = False, fp32: bool = True,
                  extra: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> Routes:
    """The split of the taps over the engines with the smallest busiest-engine time per chunk of n elements per
    partition (the model's costs, spec §2.4); `pe`: TensorE may take taps (diagonal matmuls; fp32 at the model's
    fp32 factor); `extra`: ns per chunk TensorE, ScalarE and VectorE spend on other work (a fused block's 1x1
    convs and their evictions)."""
    from tilec.perf.params import target_params  # the performance model's own constants, late: perf reads kernels
    t = get_target()
    prm = {name: value for name, value, _ in target_params(t.name).table()}
    mn = prm["min_ii_cycles"]
    act = (max(mn, n) + prm["scalar_static_cycles"]) / prm["scalar_ghz"]
    vec = (max(mn, n) + prm["vector_static_cycles"]) / prm["vector_ghz"]
    gps = (max(mn, 2 * n) + prm["gpsimd_static_cycles"]) / prm["gpsimd_ghz"]
    mm = (max(prm["mm_min_cycles"], n) + prm["mm_fixed_cycles"]) * (prm["mm_fp32_factor"] if fp32 else 1) \
        / prm["tensor_ghz"]
    best: tuple[float, int, Routes] | None = None
    step = max(1, taps // 12)  # big windows (11x11) search a coarser grid: the search is cubic in the taps
    for k in range(0, taps + 1 if pe else 1, step):
        for first in ("s", "v") if k == 0 else ("",):
            rest = taps - k - (k == 0)  # the taps after the one that starts the PSUM sum
            for g in range(0, rest + 1, step):
                for v in range(0, rest - g + 1, step):
                    sv = rest - g - v
                    scalar = act * (1 + sv + g + (first == "s")) + extra[1]  # + the eviction
                    vector = vec * (sv + 2 * v + (first == "v") + (g > 0) + clamp) + extra[2]
                    gpsimd = gps * max(0, g - 1)
                    busiest = max(scalar, vector, gpsimd, mm * k + extra[0])
                    instrs = 2 * taps - k - (first == "s") - (g > 0)
                    key = (busiest, instrs, Routes(k, first, sv, v, g, busiest))
                    if best is None or key[:2] < best[:2]:
                        best = key
    assert best is not None
    return best[2]


def choose_layout(op: ConvOp, elem: int, clamp: bool = False, pe: bool = False) -> Layout | None:
    ranked = rank_layouts(op, elem, clamp, pe)
    return ranked[0] if ranked else None


def _matmul_ns(n: int, fp32: bool) -> float:
    """The model's time of one matmul streaming n columns (spec §2.4, tilec/perf/params.py)."""
    from tilec.perf.params import target_params
    prm = {name: value for name, value, _ in target_params(get_target().name).table()}
    return (max(prm["mm_min_cycles"], n) + prm["mm_fixed_cycles"]) * (prm["mm_fp32_factor"] if fp32 else 1) \
        / prm["tensor_ghz"]


def rank_layouts(op: ConvOp, elem: int, clamp: bool = False, pe: bool = False) -> list[Layout]:
    """The layout with the smallest estimated time: per tile, its chunks' busiest engine plus one chunk of pipeline
    fill, or its DMA time, whichever is longer, plus the first band's load and the last tile's stores; None when not
    even one output row per partition fits SBUF (best first)."""
    n_img, c, ho, wo = op.dim("N"), op.dim("C") // fan_in(op), op.dim("Ho"), op.dim("Wo")
    sy, dy, sx, dx = op.stride[0], op.dilation[0], op.stride[1], op.dilation[1]
    taps = op.dim("R") * op.dim("S") * fan_in(op)
    ic = (wo - 1) * sx + (op.dim("S") - 1) * dx + 1
    rc_max = PSUM_FP32 // wo
    t = get_target()
    found: list[tuple[float, int, Layout]] = []
    for nb in range(1, min(ho, PMAX) + 1):
        rb = -(-ho // nb)
        if -(-ho // rb) != nb:
            continue  # the same blocks as a smaller nb
        ir_rows = (rb - 1) * sy + (op.dim("R") - 1) * dy + 1
        if 2 * (ir_rows * ic * elem * fan_in(op) + max(1, multiplier(op)) * rb * wo * 4) > SBUF_BUDGET:
            continue
        # a tile: its PSUM-sized chunks after one chunk of filling the engines' pipeline, or its loads and stores
        # (the bytes of a DMA engine's 8 partitions at its bandwidth), whichever is longer; the last tile's stores
        # (one DMA latency and transfer) come after everything
        ppe = PMAX // t.dma_engines
        load_ns = ppe * ir_rows * ic * fan_in(op) * elem / t.dma_engine_bw  # a band: 8 partitions per DMA engine
        store_ns = ppe * rb * wo * elem / t.dma_engine_bw  # one output channel of each partition
        dma_ns = load_ns + max(1, multiplier(op)) * store_ns
        # a fan-in's TensorE taps come before a chunk's other taps (they lead by one chunk): the first chunk's
        # matmuls fill the pipeline (once: later tiles overlap), smaller chunks fill it sooner
        least = -(-rb // rc_max)  # chunks per block, at the least (balanced sizes for a fan-in: no 1-row chunk)
        for rc in sorted({min(rb, rc_max)} | ({-(-rb // m) for m in (least, least + 1, 2 * least)}
                                               if fan_in(op) > 1 else set())):
            rows = [rc] * (rb // rc) + ([rb % rc] if rb % rc else [])
            routes = [choose_routes(taps, r * wo, clamp, pe, elem == 4) for r in rows]
            times = [rt.ns for rt in routes]
            fill = routes[0].pe * _matmul_ns(rows[0] * wo, elem == 4) if fan_in(op) > 1 else 0.0
            for cg in range(1, min(c, PMAX // nb) + 1):
                k = max(1, min(n_img, PMAX // (nb * cg)))
                tiles = -(-c // cg) * -(-n_img // k)
                # row blocks of a group not a multiple of 8 channels: one store after another on one DMA engine
                serial = nb * cg * max(1, multiplier(op)) * rb * wo * elem / t.dma_engine_bw \
                    if nb > 1 and cg % (PMAX // t.dma_engines) else 0.0
                tile_ns = max(max(1, multiplier(op)) * sum(times) + max(times), dma_ns, serial)
                # before the first taps: the first band's load; after the last: the last tile's stores
                edges = load_ns + store_ns + STORE_CHAIN_NS
                found.append((tiles * tile_ns + fill + edges, nb, Layout(cg, nb, rb, k, rc)))
    found.sort(key=lambda f: f[:2])
    return [f[2] for f in found]


class DepthwiseBuilder:
    def __init__(self, op: ConvOp, hbm: dict[str, Buf], fresh: Callable[[str], str], lay: Layout, pe: bool,
                 extra: Callable[[int], tuple[float, float, float]] | None = None) -> None:
        self.extra = extra  # rows of a chunk -> the engines' other work per chunk (choose_routes)
        from tilec.compiler.build_conv import conv_loop_vars
        self.op, self.hbm, self.fresh, self.line = op, hbm, fresh, op.line
        d = dict(op.dims)
        self.N, self.C, self.H, self.W = d["N"], d["C"], d["H"], d["W"]
        self.Ho, self.Wo, self.R, self.S = d["Ho"], d["Wo"], d["R"], d["S"]
        self.sy, self.sx = op.stride
        self.dy, self.dx = op.dilation
        self.oy, self.ox = op.offset
        self.pe, self.fp32, self.lay = pe, hbm[op.x].dtype == "f32", lay
        self.M = max(1, multiplier(op))  # outputs per input channel (each partition computes M output channels)
        self.CI = fan_in(op)  # inputs per output channel (each partition sums CI input channels' taps)
        self.C = self.C // self.CI  # the channels on the partitions
        # the hybrid (grouped conv, Cg == Kg): partitions hold output channels in (m, group) order per slot, the band
        # holds each one's group's input channels rotated, band[(m, g), j] = X[g*Kg + (m + j) % Kg], so that band
        # slot 0 over all partitions is every input channel once (TensorE's operand)
        self.HY = hybrid(op)
        if self.HY:
            self.CI, self.C = self.HY, d["K"]
            self.NG = lay.cg // self.HY  # conv groups per channel group
        self.m = 0  # the output channel of its input channel being built (M > 1)
        self.G, self.CR = self.C // lay.cg, self.C % lay.cg
        self.NT, self.NR = self.N // lay.k, self.N % lay.k  # whole tiles of images, images left over
        chunk_rows = {min(lay.rc, lay.rb - y0) for y0 in range(0, lay.rb, lay.rc)}
        self.pe_taps = max(self.routes(rows).pe for rows in chunk_rows)
        self.IR = (lay.rb - 1) * self.sy + (self.R - 1) * self.dy + 1  # input rows behind a row block
        self.IC = (self.Wo - 1) * self.sx + (self.S - 1) * self.dx + 1  # input columns behind a row
        # a padded read's column halo: skipped by the taps when two taps (the two sums' first) read no halo column
        self.clip = False
        if any(self.cols_halo()):
            self.clip = True
            full_taps = sum(1 for s in range(self.S) if self.tap_cols(s)[1] == self.Wo) * self.R
            self.clip = full_taps >= 2
        self.BC = min(self.W, self.ox + self.IC) - max(0, self.ox) if self.clip else self.IC
        self.var = conv_loop_vars(op, fresh)
        v = dict(op.vars)
        k = v.get("c" if multiplier(op) > 1 else "k", "c")  # the channel on the partitions
        self.names = {"k": k, "n": v.get("n", "n"), "y": v.get("y", "y")}
        self.gv, self.nv = fresh(f"{self.names['k']}_g"), fresh(f"{self.names['n']}_t")
        lines = dict(op.lines)
        self.L = {role: lines.get(role, op.line) for role in ("n", "k", "y", "update", "relu")}
        self.cn = {"cg": fresh("GROUP"), "k": fresh("IMAGES")}
        if self.HY:
            self.cn["ng"] = fresh("CONV_GROUPS")

    def routes(self, rows: int) -> Routes:
        if self.HY:
            return hybrid_routes(self.R * self.S, self.HY, rows * self.Wo, self.op.clamp is not None, self.fp32)
        return choose_routes(self.R * self.S * self.CI, rows * self.Wo, self.op.clamp is not None, self.pe,
                             self.fp32, self.extra(rows) if self.extra else (0.0, 0.0, 0.0))

    def consts(self) -> list[tuple[str, int]]:
        ng = [(self.cn["ng"], self.NG)] if self.HY else []
        return [(self.cn["cg"], self.lay.cg), (self.cn["k"], self.lay.k)] + ng

    def build(self) -> list[Stmt]:
        from tilec.compiler.build_conv import hbm_view
        op, fresh, line, lay = self.op, self.fresh, self.line, self.lay
        mult = (self.M,) if self.M > 1 else ()  # output channel c*M + m seen as [c, m]
        if self.HY:  # channel g*Kg + j of X, W (output channel) and Y seen as [g, j]
            G, kg = self.C // self.HY, self.HY
            self.x4, s1 = hbm_view(self.hbm[op.x], (self.N, G, kg, self.H, self.W), fresh(f"{op.x}_v"), line)
            self.w4, s2 = hbm_view(self.hbm[op.w], (G, kg, kg, self.R, self.S), fresh(f"{op.w}_v"), line)
            self.o4, s3 = hbm_view(self.hbm[op.out], (self.N, G, kg, self.Ho, self.Wo), fresh(f"{op.out}_v"), line)
        else:
            self.x4, s1 = hbm_view(self.hbm[op.x], (self.N, self.C, self.H, self.W), fresh(f"{op.x}_v"), line)
            fan = (self.CI,) if self.CI > 1 else ()  # input channel k*CI + c of output channel k seen as [k, c]
            self.x4, s1 = hbm_view(self.hbm[op.x], (self.N, self.C) + fan + (self.H, self.W), fresh(f"{op.x}_v"),
                                   line)
            self.w4, s2 = hbm_view(self.hbm[op.w], (self.C,) + mult + fan + (self.R, self.S), fresh(f"{op.w}_v"),
                                   line)
            self.o4, s3 = hbm_view(self.hbm[op.out], (self.N, self.C) + mult + (self.Ho, self.Wo),
                                   fresh(f"{op.out}_v"), line)
        stmts: list[Stmt] = s1 + s2 + s3
        if op.bias and self.HY:
            self.b2, s4 = hbm_view(self.hbm[op.bias], (self.C // self.HY, self.HY), fresh(f"{op.bias}_v"), line)
            stmts += s4
        elif op.bias:
            self.b2, s4 = hbm_view(self.hbm[op.bias], (self.C, self.M if mult else 1), fresh(f"{op.bias}_v"), line)
            stmts += s4
        if self.has_halo():  # zeros for the bands' halos, copied in by DMA (zero_halo)
            fan = (self.CI,) if self.CI > 1 else ()
            self.zeros = Buf(self.fresh(f"{op.x}_zeros"), "sbuf", self.hbm[op.x].dtype,
                             self.band_idx(PMAX, fan, self.IR, self.BC))
            stmts.append(Alloc(self.zeros, zero=True, line=line))
        if self.pe_taps:
            stmts.append(ir.Block("identity matrix (the diagonal weights of TensorE's taps are scaled copies of it)",
                                  tuple(self.identity()), line))
        k = self.names["k"]
        tensors = op.w + (f" and {op.bias}" if op.bias else "")
        stmts.append(ir.Block(f"{tensors}: each {k}'s weights as fp32 columns (one per tap) on every "
                              f"{self.slot_word()}'s partitions", tuple(self.weights()), line))
        diags = self.diagonals(scalar=None)  # VectorE and ScalarE by turns: the first taps wait for half
        if diags and self.HY:
            stmts.append(ir.Block(f"{op.w}[g*{self.HY} + m, m', r, s] at row m'*{self.NG} + g, column m*{self.NG} + g "
                                  "(TensorE's positions): identity blocks summed, scaled", tuple(diags), line))
        elif diags:
            stmts.append(ir.Block(f"diag({op.w}[{k}, r, s]) for the taps TensorE runs: the identity scaled per "
                                  "partition", tuple(diags), line))
        blocks = f", {lay.nb} blocks of {lay.rb} rows per image" if lay.nb > 1 else ""
        note = f"for {k} (groups of {self.cn['cg']} channels{blocks})"
        c0 = a(term(self.gv, self.NG, self.cn["ng"])) if self.HY else a(term(self.gv, lay.cg, self.cn["cg"]))
        body = loop(self.gv, self.G, self.group(c0, lay.cg, "", a(self.gv)),
                    note=note,
                    line=self.L["k"])
        if self.CR:
            body += self.group(a(self.G * lay.cg), self.CR, "_rest", a(self.G))
        label = f"main: depthwise {op.name} (no sum over {k}), partitions hold ({self.slot_word()}, {k}) pairs"
        return stmts + [ir.Block(label, tuple(body), line)]

    def slot_word(self) -> str:
        """What one slot of partitions holds: an image, or a block of output rows of one."""
        return "row block" if self.lay.nb > 1 else "image"

    def identity(self) -> list[Stmt]:
        """I[p, q] = (p == q) without iota: a [128, 129] tile whose column 0 is one, stored to HBM and read back as
        [129, 128] rows (element p*129 of the flat copy is row p, column p); once per kernel."""
        line = self.line
        ones = Buf(self.fresh("ident_rows"), "sbuf", "f32", (PMAX, PMAX + 1))
        flat = Buf(self.fresh("ident_hbm"), "hbm", "f32", (PMAX, PMAX + 1))
        rows = Buf(self.fresh("ident_hbm_rows"), "hbm", "f32", (PMAX + 1, PMAX))
        self.ident = Buf(self.fresh("ident"), "sbuf", "f32", (PMAX, PMAX))
        col = View(ones, (full(PMAX), sl(0, 1)))
        return [Alloc(ones, zero=True, line=line), Scalar(col, col, "add", 1.0, line), Alloc(flat, line=line),
                Dma(ir.whole(flat), ir.whole(ones), line), Reshape(rows, flat, line), Alloc(self.ident, line=line),
                Dma(ir.whole(self.ident), View(rows, (sl(0, PMAX), full(PMAX))), line)]

    def weights(self) -> list[Stmt]:
        """w_all[slot*CG + c, group, r, s] = W[group*CG + c, r, s] (the remainder group: its own slot width), all
        loaded before the main loop: small DMAs that lead their queues instead of waiting behind stores."""
        op, line, lay = self.op, self.line, self.lay
        images = min(lay.k, self.N)
        groups = self.G + (1 if self.CR else 0)
        mult = (self.M,) if self.M > 1 else ()  # a channel multiplier: every output channel of the input channel
        axis = mult or ((self.CI,) if self.CI > 1 else ())  # ... or every input channel of the output channel
        self.w_all = Buf(self.fresh(f"{op.w}_cols"), "sbuf", "f32",
                         (images * lay.nb * lay.cg, groups) + axis + (self.R, self.S))
        out: list[Stmt] = [Alloc(self.w_all, line=line)]
        if op.bias:
            self.b_all = Buf(self.fresh(f"{op.bias}_cols"), "sbuf", "f32", (images * lay.nb * lay.cg, groups) + mult)
            out.append(Alloc(self.b_all, line=line))
        gw = self.gw = self.fresh(f"{self.names['k']}_w")
        if self.HY and self.pe_taps:
            self.w_pe = Buf(self.fresh(f"{op.w}_pe_cols"), "sbuf", "f32",
                            (images * lay.nb * lay.cg, groups, self.HY, self.R, self.S))
            out.append(Alloc(self.w_pe, line=line))
        if self.HY:
            return out + loop(gw, self.G, self.hybrid_weights(a(gw), a(term(gw, self.NG, self.cn["ng"]))),
                              note=f"for {self.names['k']} (groups of {self.cn['cg']} channels)", line=line)

        def part(gi: ir.Aff, c0: ir.Aff, cg: int) -> list[Stmt]:
            body: list[Stmt] = []
            for j in range(images * lay.nb):  # every slot's partitions hold the group's weights
                ms = (full(axis[0]),) if axis else ()
                body.append(Dma(View(self.w_all, (sl(j * cg, cg), gi) + ms + (full(self.R), full(self.S))),
                                View(self.w4, (sl(c0, cg),) + ms + (full(self.R), full(self.S))), line))
                if op.bias:
                    body.append(Dma(View(self.b_all, (sl(j * cg, cg), gi, full(self.M)) if mult else
                                         (sl(j * cg, cg), sl(gi, 1))), View(self.b2, (sl(c0, cg), full(self.M))),
                                    line))
            return body
        out += loop(gw, self.G, part(a(gw), a(term(gw, lay.cg, self.cn["cg"])), lay.cg),
                    note=f"for {self.names['k']} (groups of {self.cn['cg']} channels)", line=line)
        if self.CR:
            out += part(a(self.G), a(self.G * lay.cg), self.CR)
        if op.w_relu is not None:  # `X * relu(Wd[c, r, s])`: the weight columns rectified once, after their loads
            wv = ir.whole(self.w_all)
            out.append(Act(wv, wv, "relu", line=line))
            out += [Scalar(wv, wv, "minimum", op.w_relu, line)] if op.w_relu != float("inf") else []
        return out

    def diagonals(self, scalar: bool | None = False) -> list[Stmt]:
        """d_all[:, group, i, :] = diag(w[:, tap i]) for TensorE's taps: the identity scaled per partition by the
        weight column, every group's before the main loop; `scalar`: on ScalarE (True), VectorE (False), or the two
        by turns (None: the first taps wait for half of them on each engine)."""
        taps = self.pe_taps_list()
        if not taps:
            return []
        op, line, lay, gw = self.op, self.line, self.lay, self.gw
        groups = self.G + (1 if self.CR else 0)
        parts = min(lay.k, self.N) * lay.nb * lay.cg
        self.d_all = Buf(self.fresh(f"{op.w}_diags"), "sbuf", self.hbm[op.x].dtype,
                         (parts, groups, self.M * len(taps), parts))
        if self.HY:
            return self.hybrid_diagonals(taps, parts, scalar)

        def part(gi: ir.Aff, p: int) -> list[Stmt]:
            def diag(dst: View, ident: View, w: View, on_scalar: bool) -> Stmt:  # ScalarE: a copy scaled per partition
                return Act(dst, ident, "copy", None, w, line) if on_scalar else Scalar(dst, ident, "multiply", w, line)
            out = []
            for m in range(self.M):  # (a channel multiplier: each output channel's taps, m-major)
                self.m = m
                out += [diag(View(self.d_all, (sl(0, p), gi, a(m * len(taps) + i), sl(0, p))),
                             View(self.ident, (sl(0, p), sl(0, p))), self.w_col(p, r, s, gi, c),
                             i % 2 == 1 if scalar is None else scalar)
                        for i, (c, r, s) in enumerate(taps)]
            return out
        out: list[Stmt] = [Alloc(self.d_all, line=line)]
        out += loop(gw, self.G, part(a(gw), parts), note=f"for {self.names['k']} (groups of {self.cn['cg']} channels)",
                    line=line)
        if self.CR:
            out += part(a(self.G), min(lay.k, self.N) * lay.nb * self.CR)
        return out

    def tap_order(self, routes: list[str]) -> list[tuple[int, int, int]]:
        """The tap each route computes: the PSUM sum's first (route 0) and the GpSimdE sum's first write every
        output column (taps reading no halo column); the others in a fixed order, so that TensorE's taps are the
        same prefix in every chunk (their diagonal matrices are built once per group)."""
        taps = [(c, r, s) for c in range(self.CI) for r in range(self.R) for s in range(self.S)]  # c: fan_in
        if self.HY:  # TensorE's positions first (all input channels at once: c = -1), then the vector taps
            pe = routes.count("pe")
            head, taps = self.hybrid_taps(pe)
            routes = routes[pe:]
            if not routes:
                return head
        else:
            head = []
        whole = [t for t in taps if self.tap_cols(t[2])[1] == self.Wo][:2]
        rest = iter([t for t in taps if t not in whole] + whole[1:])
        g = routes.index("g") if "g" in routes and len(whole) > 1 else -1
        order = [whole[0] if i == 0 else whole[1] if i == g else next(rest) for i in range(len(routes))]
        return head + order

    def pe_taps_list(self) -> list[tuple[int, int, int]]:
        if self.HY:
            return self.hybrid_taps(self.pe_taps)[0]
        taps = self.R * self.S * self.CI
        return self.tap_order(["pe"] * self.pe_taps + ["sv"] * (taps - self.pe_taps))[:self.pe_taps]

    # ---- the grouped hybrid (Cg == Kg): partition (slot, m, g) computes output channel g*Kg + m -------------------

    def hybrid_taps(self, pe: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
        """(TensorE's positions as (-1, r, s), the vector engines' taps (j, r, s) of the other positions, j the band
        slot): TensorE takes the positions whose taps skip halo columns first, so the vector sums' first taps can
        write every output column."""
        pos = [(r, s) for r in range(self.R) for s in range(self.S)]
        pos = sorted(pos, key=lambda p: self.tap_cols(p[1])[1] == self.Wo)  # stable: clipped positions first
        # TensorE's first matmul starts the PSUM sum (accumulate=False writes only its own columns): a whole one first
        head = sorted(pos[:pe], key=lambda p: self.tap_cols(p[1])[1] != self.Wo)
        return [(-1, r, s) for r, s in head], [(j, r, s) for r, s in pos[pe:] for j in range(self.HY)]

    def pe_starts_whole(self) -> bool:
        """Whether TensorE's first tap writes every output column of the PSUM sum (else the hybrid cannot start
        it: a clipped first matmul would leave columns that later matmuls accumulate onto uninitialised)."""
        head = self.hybrid_taps(self.pe_taps)[0]
        return not head or self.tap_cols(head[0][2])[1] == self.Wo

    def rotated(self, m: int) -> list[tuple[int, int, int]]:
        """(first band slot, first input channel of the group, count): band slot j of output m holds input channel
        (m + j) % Kg, two runs of consecutive channels."""
        kg = self.HY
        return [(0, m, kg - m)] + ([(kg - m, 0, m)] if m else [])

    def hybrid_stores(self, ob: Buf, c0: ir.Aff, n0: ir.Aff, images: int, y0: int, y1: int) -> list[Stmt]:
        """One store per output channel (partition (slot, m, g) -> Y[n, g*Kg + m]): each a contiguous range of Y
        disjoint from the others (a store of the ng channels of one m would span the other m's channels, and such
        stores run one after another); consecutive stores on different DMA engines (8 partitions each): channel
        e*8 + q of each m, for e, then the next q. Output rows y0..y1."""
        line, lay, ng, kg = self.L["update"], self.lay, self.NG, self.HY
        ppe = PMAX // get_target().dma_engines
        k = self.names["k"]
        qv, ev = self.fresh(f"{k}_q"), self.fresh(f"{k}_e")
        stride, inner, q = (ppe, ng // ppe, a(qv)) if ng % ppe == 0 else (1, ng, a())
        g = a(term(ev, stride)).plus(q)
        body: list[Stmt] = []
        for j, (i, _) in enumerate(self.slots(images)):
            for m in range(kg):
                rows = full(self.Ho) if (y0, y1) == (0, self.Ho) else sl(y0, y1 - y0)
                body.append(Dma(View(self.o4, (n0.plus(i), sl(c0.plus(g), 1), a(m), rows, full(self.Wo))),
                                View(ob, (sl(g.plus(j * lay.cg + m * ng), 1), rows, full(self.Wo))), line))
        out = loop(ev, inner, body, note=f"output channel ({k}_e*{stride} + {k}_q)*{kg} + m of every m", line=line)
        return loop(qv, ppe, out, note="consecutive stores on different DMA engines", line=line) if stride > 1 else out

    def hybrid_weights(self, gi: ir.Aff, g0: ir.Aff) -> list[Stmt]:
        """w_all[(slot, m, g), group, j, r, s] = W[g*Kg + m, (m + j) % Kg, r, s] (the vector taps' columns), the bias
        b_all[(slot, m, g), group] = B[g*Kg + m], and for TensorE's taps w_pe[(slot, m', g), group, m, r, s] =
        W[g*Kg + m, m', r, s] (the block-diagonal matrices' scale columns)."""
        op, line, lay, ng, kg = self.op, self.line, self.lay, self.NG, self.HY
        slots = min(lay.k, self.N) * lay.nb
        rs = (full(self.R), full(self.S))
        out: list[Stmt] = []
        for j in range(slots):
            for m in range(kg):
                p = sl(j * lay.cg + m * ng, ng)
                for j0, ch0, cnt in self.rotated(m):
                    out.append(Dma(View(self.w_all, (p, gi, sl(j0, cnt)) + rs),
                                   View(self.w4, (sl(g0, ng), a(m), sl(ch0, cnt)) + rs), line))
                if op.bias:
                    out.append(Dma(View(self.b_all, (p, sl(gi, 1))), View(self.b2, (sl(g0, ng), sl(m, 1))), line))
                if self.pe_taps:
                    out.append(Dma(View(self.w_pe, (p, gi, full(kg)) + rs),
                                   View(self.w4, (sl(g0, ng), full(kg), a(m)) + rs), line))
        return out

    def hybrid_diagonals(self, taps: list[tuple[int, int, int]], parts: int, scalar: bool | None) -> list[Stmt]:
        """d_all[(slot, m', g), group, i, (slot, m, g)] = W[g*Kg + m, m', tap i]: a block of ng columns per (slot, m)
        is the slot's stacked identity (ones at rows (slot, m', g) of column g, every m') scaled per partition."""
        line, lay, ng, kg = self.line, self.lay, self.NG, self.HY
        slots = parts // lay.cg
        stack = Buf(self.fresh("ident_stack"), "sbuf", "f32", (parts, slots, ng))
        out: list[Stmt] = [Alloc(stack, line=line)]
        for j in range(slots):
            dst = View(stack, (full(parts), a(j), full(ng)))
            out.append(ir.Copy(dst, View(self.ident, (sl(0, parts), sl(j * lay.cg, ng))), line))
            for m in range(1, kg):
                out.append(Binary(dst, dst, View(self.ident, (sl(0, parts), sl(j * lay.cg + m * ng, ng))), "add",
                                  line))
        body: list[Stmt] = []
        gi = a(self.gw)
        k = 0
        for i, (_, r, s) in enumerate(taps):
            for j in range(slots):
                for m in range(kg):
                    dst = View(self.d_all, (sl(0, parts), gi, a(i), sl(j * lay.cg + m * ng, ng)))
                    src = View(stack, (full(parts), a(j), full(ng)))
                    w = View(self.w_pe, (sl(0, parts), gi, a(m), a(r), sl(s, 1)))
                    on_scalar = k % 2 == 1 if scalar is None else scalar
                    body.append(Act(dst, src, "copy", None, w, line) if on_scalar else
                                Scalar(dst, src, "multiply", w, line))
                    k += 1
        out.append(Alloc(self.d_all, line=line))
        return out + loop(self.gw, self.G, body, note=f"for {self.names['k']} (groups of {self.cn['cg']} channels)",
                          line=line)

    def w_col(self, parts: int, r: int, s: int, gi: ir.Aff | None = None, c: int = 0) -> View:
        """The current group's weight column of tap (r, s) (of output channel m of each input channel, for a
        multiplier; of input channel c, for a fan-in): the per-partition scale of a product."""
        wall, g = self.wsel if gi is None else (self.w_all, gi)
        axis = (a(self.m),) if self.M > 1 else (a(c),) if self.CI > 1 else ()
        return View(wall, (sl(0, parts), g) + axis + (a(r), sl(s, 1)))

    # ---- one channel group: its weights, then the images ------------------------------------------------------------

    def slots(self, images: int) -> list[tuple[int, int]]:
        """(image in the tile, row block) of each slot, in partition order."""
        return [(i, b) for i in range(images) for b in range(self.lay.nb)]

    def group(self, c0: ir.Aff, cg: int, tag: str, gi: ir.Aff) -> list[Stmt]:
        """`tag` names the buffers of a part whose shapes differ (the remainder group, images, chunk)."""
        op, lay = self.op, self.lay
        images = min(lay.k, self.N)
        parts = images * lay.nb * cg
        self.wsel = (self.w_all, gi)
        out: list[Stmt] = []
        bias = View(self.b_all, (sl(0, parts), sl(gi, 1))) if op.bias else None
        self.diags = {t: View(self.d_all, (sl(0, parts), gi, a(i), sl(0, parts)))
                      for i, t in enumerate(self.pe_taps_list())}
        note = f"for {self.names['n']} (tiles of {self.cn['k']} images)"
        n0 = a(term(self.nv, lay.k, self.cn["k"]))
        out += loop(self.nv, self.NT, self.tile(c0, cg, n0, lay.k, bias, tag), note=note, line=self.L["n"])
        if self.NR:
            out += self.tile(c0, cg, a(self.NT * lay.k), self.NR, bias, tag + "_last")
        return out

    def block_rows(self, b: int) -> tuple[int, int, int]:
        """(first input row, halo rows before, halo rows after) of row block b."""
        start = b * self.lay.rb * self.sy + self.oy
        return start, max(0, -start), max(0, start + self.IR - self.H)

    def cols_halo(self) -> tuple[int, int]:
        return max(0, -self.ox), max(0, self.ox + self.IC - self.W)

    def has_halo(self) -> bool:
        cols = any(self.cols_halo()) and not self.clip
        return cols or any(self.block_rows(b)[1:] != (0, 0) for b in range(self.lay.nb))

    def tap_cols(self, s: int) -> tuple[int, int, int]:
        """(first output column, output columns, first band column) tap column s reaches inside X: a padded read's
        taps skip the output columns whose input column is outside X (`clip`), instead of reading a zeroed halo."""
        col0 = s * self.dx + self.ox  # input column of output column 0
        if not self.clip:
            return 0, self.Wo, s * self.dx
        xa = max(0, -(col0 // self.sx)) if col0 < 0 else 0
        while xa < self.Wo and xa * self.sx + col0 < 0:
            xa += 1
        xb = self.Wo
        while xb > xa and (xb - 1) * self.sx + col0 > self.W - 1:
            xb -= 1
        return xa, xb - xa, xa * self.sx + col0 - max(0, self.ox)

    def zero_halo(self, band: Buf, cg: int, images: int) -> list[Stmt]:
        """The band's halo (rows and columns outside X) copied from the zero tile by DMA: a memset would wait in
        VectorE's or GpSimdE's in-order stream behind the previous tile's taps, and the loads behind it."""
        if not self.has_halo():
            return []
        line, parts, z = self.L["update"], band.shape[0], self.zeros
        regions: list[tuple] = []
        left, right = self.cols_halo() if not self.clip else (0, 0)
        for start, size in ((0, left), (self.IC - right, right)):
            if size:
                regions.append((sl(0, parts), full(self.IR), sl(start, size)))
        for j, (_, b) in enumerate(self.slots(images)):
            _, top, bottom = self.block_rows(b)
            for start, size in ((0, min(top, self.IR)), (self.IR - min(bottom, self.IR), min(bottom, self.IR))):
                if size:
                    regions.append((sl(j * cg, cg), sl(start, size), full(self.BC)))
        fan = (full(self.CI),) if self.CI > 1 else ()  # (every input channel of a fan-in)
        return [Dma(View(band, self.band_idx(idx[0], fan, *idx[1:])), View(z, self.band_idx(idx[0], fan, *idx[1:])),
                    line) for idx in regions]

    def band_idx(self, p, c: tuple, rows, cols) -> tuple:
        """A band's index (or shape) in its axis order: [partition, c (a fan-in's input channels), rows, cols]."""
        return (p,) + c + (rows, cols)

    def tile(self, c0: ir.Aff, cg: int, n0: ir.Aff, images: int, bias: View | None, tag: str
             ) -> list[Stmt]:
        op, line, lay = self.op, self.L["update"], self.lay
        parts = images * lay.nb * cg
        fan = (self.CI,) if self.CI > 1 else ()  # a fan-in: the input channels of each output channel
        band = Buf(self.fresh(f"{op.x}_band{tag}"), "sbuf", self.hbm[op.x].dtype,
                   self.band_idx(parts, fan, self.IR, self.BC))
        fs = tuple(full(f) for f in fan)
        left, right = self.cols_halo()
        out: list[Stmt] = [Alloc(band, line=line)] + self.zero_halo(band, cg, images)
        cols_src = sl(self.ox + left, self.IC - left - right)
        cols_dst = full(self.BC) if not (left or right) or self.clip else sl(left, self.IC - left - right)
        # the band's rows in pieces, one per chunk of output rows (the rows it reads first): a chunk's taps wait for
        # its own rows only, so the first chunk starts before the whole band is in (not a fan-in's band: a piece of
        # rows of every input channel spans the others' bytes of the partition, so the pieces would wait on each
        # other)
        ends = sorted({min(self.IR, (y0 + min(lay.rc, lay.rb - y0) - 1) * self.sy + (self.R - 1) * self.dy + 1)
                       for y0 in range(0, lay.rb, lay.rc)} if self.CI == 1 or self.HY else {self.IR})
        pieces = list(zip([0] + ends[:-1], ends))
        self.late: list[list[Stmt]] = []  # the hybrid's pieces after the first two, issued one per chunk (below)
        for k, (lo, hi) in enumerate(pieces):
            if self.HY and k >= 2:
                out, self.late = [], self.late + [out]
            for j, (i, b) in enumerate(self.slots(images)):
                start, top, bottom = self.block_rows(b)
                lo2, hi2 = max(lo, top), min(hi, self.IR - bottom)  # the piece's rows inside X
                if hi2 <= lo2:
                    continue
                whole = (lo2, hi2) == (0, self.IR)
                if self.HY:  # band[(m, g), j] = X[g*Kg + (m + j) % Kg]: a DMA per (m, j), so that a piece of rows
                    rows = full(self.IR) if whole else sl(lo2, hi2 - lo2)  # is one range of each partition's bytes
                    for m in range(self.HY):
                        for jj in range(self.HY):
                            out.append(Dma(View(band, (sl(j * cg + m * self.NG, self.NG), a(jj), rows, cols_dst)),
                                           View(self.x4, (n0.plus(i), sl(c0, self.NG), a((m + jj) % self.HY),
                                                          sl(start + lo2, hi2 - lo2), cols_src)), line))
                    continue
                out.append(Dma(View(band, (sl(j * cg, cg),) + fs + (full(self.IR) if whole else sl(lo2, hi2 - lo2),
                                                                     cols_dst)),
                               View(self.x4, (n0.plus(i), sl(c0, cg)) + fs + (sl(start + lo2, hi2 - lo2), cols_src)),
                               line))
        if self.late:  # the hybrid: its 16 DMAs a piece are issued just ahead of the chunk reading them
            out, self.late = self.late[0], self.late[1:] + [out]
        self.allocated: set[Buf] = set()
        for m in range(self.M):  # a channel multiplier: the band's M output channels, one after another
            self.m = m
            if self.M > 1:
                gi = self.wsel[1]
                bias = View(self.b_all, (sl(0, parts), gi, sl(m, 1))) if op.bias else None
                taps = self.pe_taps_list()
                self.diags = {t: View(self.d_all, (sl(0, parts), gi, a(m * len(taps) + i), sl(0, parts)))
                              for i, t in enumerate(taps)}
            out += self.outputs(band, c0, cg, n0, images, bias, tag + (f"_m{m}" if self.M > 1 else ""))
        return out

    def outputs(self, band: Buf, c0: ir.Aff, cg: int, n0: ir.Aff, images: int, bias: View | None, tag: str
                ) -> list[Stmt]:
        """The band's output channel (of each input channel: self.m) computed chunk by chunk and stored."""
        op, line, lay = self.op, self.L["update"], self.lay
        parts = images * lay.nb * cg
        ob = Buf(self.fresh(f"{op.out}_band{tag}"), "sbuf", self.hbm[op.out].dtype, (parts, lay.rb, self.Wo))
        out: list[Stmt] = [Alloc(ob, line=line)]
        # chunks of output rows, software-pipelined: chunk i's taps are issued before chunk i-DEPTH's final add and
        # eviction, so no engine's in-order stream waits on the end of a chunk's GpSimdE sum
        starts = list(range(0, lay.rb, lay.rc))
        pending: list[list[Stmt]] = []
        name = op.name + (f" (output {self.m} of each {self.names['k']})" if self.M > 1 else "")
        # a fan-in's many TensorE taps lead by one chunk: chunk i+1's matmuls are issued before chunk i's other
        # taps (a matmul cannot accumulate onto a sum VectorE wrote, so within a chunk they come first)
        lead = self.CI > 1
        chunks = []
        for i, y0 in enumerate(starts):
            rows = min(lay.rc, lay.rb - y0)
            ctag = f"{tag}_{'abcde'[i % (DEPTH + 1 + lead)]}" + ("" if rows == lay.rc else "_end")
            taps, finish = self.chunk(band, parts, y0, rows, ctag)
            head = 1 + next((k for k, st in enumerate(taps[1:]) if not isinstance(st, Matmul)), len(taps) - 1)
            chunks.append((y0, rows, ctag, taps[:head] if lead else [], taps[head:] if lead else taps, finish,
                           self.acc_view))
        for i, (y0, rows, ctag, head_taps, taps, finish, accv) in enumerate(chunks):
            dst = View(ob, (full(parts), sl(y0, rows), full(self.Wo)))
            span = f"{name} rows {y0}..{y0 + rows}"
            if i and self.late:  # the hybrid's band: chunk i+1's first rows, before its TensorE taps
                out.append(ir.Block(f"{op.x}: the band's rows for chunk {i + 1}", tuple(self.late.pop(0)), line))
            for k in ((0, 1) if i == 0 else (i + 1,)) if lead else ():
                if k < len(chunks):
                    y, r = chunks[k][:2]
                    out.append(ir.Block(f"{name} rows {y}..{y + r}: TensorE's taps", tuple(chunks[k][3]), line))
            out += [ir.Block(f"{span}, {self.R * self.S * self.CI} taps: {self.taps_note(rows)}", tuple(taps), line)]
            out += pending.pop(0) if len(pending) == DEPTH else []
            if self.HY and i == len(chunks) - STORE_SPLIT and i >= DEPTH:  # the rows evicted so far are stored
                out += self.hybrid_stores(ob, c0, n0, images, 0, chunks[i - DEPTH + 1][0])  # while the last run
            done = "the GpSimdE sum added into PSUM, " if finish else ""
            epilogue = f" ({self.epilogue_note()})" if self.epilogue_note() else ""
            pending.append([ir.Block(f"{span}: {done}evicted{epilogue}", tuple(
                finish + self.evict(dst, accv, bias, ctag)), line)])
        out += [s for p in pending for s in p]
        ms = (a(self.m),) if self.M > 1 else ()
        # one row block's store of several channels spans the other blocks' rows of those channels in HBM (a DMA
        # writes the range its pattern spans, and such ranges are written one after another): with row blocks,
        # each (row block, channel) pair is its own store, a contiguous range of Y disjoint from every other; the
        # stores issue in order, so consecutive ones go to different DMA engines (8 partitions each): channel
        # e*8 + q of every block for e, then the next q
        if self.HY:
            first = len(chunks) - STORE_SPLIT - DEPTH + 1  # the first chunk stored at the end
            split = chunks[first][0] if len(chunks) - STORE_SPLIT >= DEPTH else 0
            return out + self.hybrid_stores(ob, c0, n0, images, split, lay.rb)
        if lay.nb == 1:
            for j, (i, b) in enumerate(self.slots(images)):
                valid = min(lay.rb, self.Ho - b * lay.rb)
                out.append(Dma(View(self.o4, (n0.plus(i), sl(c0, cg)) + ms + (sl(b * lay.rb, valid), full(self.Wo))),
                               View(ob, (sl(j * cg, cg), full(lay.rb) if valid == lay.rb else sl(0, valid),
                                         full(self.Wo))), line))
            return out
        ppe = PMAX // get_target().dma_engines
        qv, ev = self.fresh(f"{self.names['k']}_q"), self.fresh(f"{self.names['k']}_e")
        engines, q = (cg // ppe, a(qv)) if cg % ppe == 0 else (cg, a())
        body: list[Stmt] = []
        for j, (i, b) in enumerate(self.slots(images)):
            valid = min(lay.rb, self.Ho - b * lay.rb)
            c = a(term(ev, ppe)).plus(q) if cg % ppe == 0 else a(ev)
            store = Dma(View(self.o4, (n0.plus(i), sl(c0.plus(c), 1)) + ms + (sl(b * lay.rb, valid), full(self.Wo))),
                        View(ob, (sl(c.plus(j * cg), 1), full(lay.rb) if valid == lay.rb else sl(0, valid),
                                  full(self.Wo))), line)
            body += loop(ev, engines, [store], note=f"one store per channel of row block {b}", line=line)
        if cg % ppe == 0:
            body = loop(qv, ppe, body, note=f"channel {self.names['k']}_e*{ppe} + {qv}: consecutive stores on "
                        "different DMA engines", line=line)
        out += body
        return out

    # ---- one chunk of output rows: the taps, then the final add ----------------------------------------------------

    def chunk(self, band: Buf, parts: int, y0: int, rows: int, tag: str, psum: tuple[str, int] | None = None
              ) -> tuple[list[Stmt], list[Stmt]]:
        """(the taps into the PSUM accumulator self.acc_view, the add of the GpSimdE sum into it); `psum`: (tag,
        partitions) of a PSUM accumulator shared with chunks of more partitions (a group of fewer channels uses its
        first `parts` partitions)."""
        op, line = self.op, self.L["update"]
        rt = self.routes(rows)
        # the band's first reader picks the DMA queue its loads go on, the output's last writer the stores' queue:
        # keep them apart (a load waits behind the stores issued before it on its queue)
        first = "v" if self.evicts_on_scalar() else "s"
        shape = (parts, rows, self.Wo)
        whole = (full(parts), full(rows), full(self.Wo))
        ptag, pparts = psum if psum is not None else (tag, parts)
        acc = Buf(self.fresh(f"{op.name}_acc{ptag}"), "psum", "f32", (pparts, rows, self.Wo))
        accv = self.acc_view = View(acc, whole if pparts == parts else (sl(0, parts),) + whole[1:])
        # issue order (each engine runs its stream in order): VectorE's own taps first, then ScalarE's products
        # alternating between the GpSimdE and the VectorE sums, so that both adders are fed from the start
        g, sv = ["g"] * rt.g, ["sv"] * rt.sv
        mixed = [route for pair in zip(g, sv) for route in pair] + g[len(sv):] + sv[len(g):]
        routes = ["pe"] * rt.pe + ([first] if not rt.pe else []) + ["vv"] * rt.v + mixed
        # the two sums' first taps must write every output column: they take taps that read no halo column
        order = self.tap_order(routes)
        out: list[Stmt] = [Alloc(acc, zero=rt.pe > 0, line=line)]
        gacc: View | None = None
        products = 0
        for (c, r, s), route in zip(order, routes):
            xa, nx, bc = self.tap_cols(s)
            if nx == 0:  # a tap whose every input column is in the halo adds nothing (a 3x3 tap beside W = 1)
                continue
            part = (full(parts), full(rows), full(self.Wo) if nx == self.Wo else sl(xa, nx))
            window = View(band, self.band_idx(full(parts), (a(max(c, 0)),) if self.CI > 1 else (),
                                              sl(y0 * self.sy + r * self.dy, rows, self.sy), sl(bc, nx, self.sx)))
            w = self.w_col(parts, r, s, None, c)
            accp = View(acc, part if pparts == parts else (sl(0, parts),) + part[1:])
            if route == "pe":  # acc[p] += diag(w)[p, p] * window[p]
                out.append(Matmul(accp, self.diags[(c, r, s)], window, line))
                continue
            if route in ("s", "v"):  # the first tap starts the PSUM sum
                out.append(Act(accv, window, "copy", None, w, line) if route == "s" else
                           Scalar(accv, window, "multiply", w, line))
                continue
            if route == "g" and gacc is None:  # the first GpSimdE tap starts its SBUF sum
                gbuf = Buf(self.fresh(f"{op.name}_gacc{tag}"), "sbuf", "f32", shape)
                gacc = View(gbuf, whole)
                out += self.alloc_once(gbuf) + [Act(gacc, window, "copy", None, w, line)]
                continue
            # products rotate through PRODUCTS buffers, shared by the tile's chunks of one tag (each product is
            # added before its buffer is written again)
            prod = Buf(self.fresh(f"{op.name}_prod{products % PRODUCTS}{tag}"), "sbuf", "f32", shape)
            out += self.alloc_once(prod)
            products += 1
            pv = View(prod, part)
            out.append(Scalar(pv, window, "multiply", w, line) if route == "vv" else
                       Act(pv, window, "copy", None, w, line))
            if route == "g":
                assert gacc is not None
                gp = View(gacc.buf, part)
                out.append(Binary(gp, gp, pv, "add", line, engine="gpsimd"))
            else:
                out.append(Binary(accp, accp, pv, "add", line))
        finish: list[Stmt] = [Binary(accv, accv, gacc, "add", line)] if gacc is not None else []
        return out, finish

    def taps_note(self, rows: int) -> str:
        """Which engine computes how many of the chunk's taps (a comment for the kernel's reader): a sum's first tap
        writes it, every other product is added (VectorE into the PSUM sum, GpSimdE into its SBUF sum)."""
        rt = self.routes(rows)
        first = ("v" if self.evicts_on_scalar() else "s") if not rt.pe else ""
        scalar, vector = rt.sv + rt.g + (first == "s"), rt.v + (first == "v")
        engines = [f"TensorE {rt.pe}"] if rt.pe else []
        products = [f"ScalarE {scalar}"] if scalar else []
        products += [f"VectorE {vector}"] if vector else []
        adds = [f"VectorE {rt.sv + rt.v}"] if rt.sv + rt.v else []
        adds += [f"GpSimdE {rt.g - 1}"] if rt.g > 1 else []
        return ", ".join(engines + [f"products {' + '.join(products)}"] * bool(products) +
                         [f"adds {' + '.join(adds)}"] * bool(adds))

    def epilogue_note(self) -> str:
        """What the eviction applies to the sum, in the program's terms ("" for a plain copy)."""
        op = self.op
        words = ([f"+ {op.bias}"] if op.bias else []) + (["relu"] if op.relu else []) + \
            ([f"min(., {op.clamp:g})"] if op.clamp is not None else [])
        return ", ".join(words)

    def evicts_on_scalar(self) -> bool:
        """Whether ScalarE writes the output band last (its stores then go on ScalarE's DMA queue)."""
        # (a clamp in PSUM before the eviction: not before a negated product's sign)
        return not self.narrow() and (self.op.clamp is None or (self.op.bias is None and self.op.scale == 1.0))

    def alloc_once(self, buf: Buf) -> list[Stmt]:
        """The tile's SBUF temporaries are allocated at their first use in the tile and reused by its later chunks
        of the same tag (the SBUF budget counts every allocation statement)."""
        if buf in self.allocated:
            return []
        self.allocated.add(buf)
        return [Alloc(buf, line=self.L["update"])]

    def narrow(self) -> list[tuple[str, str]]:
        """(name, dtype) of the f16/bf16 tensors this fused op computes but never stores, in program order."""
        op = self.op
        chain = [nm for nm in (op.name,) + tuple(op.fused) if nm != op.out]
        return [(nm, self.hbm[nm].dtype) for nm in dict.fromkeys(chain)
                if nm in self.hbm and self.hbm[nm].dtype != "f32"]

    def evict(self, dst: View, acc: View, bias: View | None, tag: str) -> list[Stmt]:
        """PSUM -> the output band: bias and relu on ScalarE, relu6's upper clamp on VectorE; f16/bf16 tensors the
        fusion never stores still round to their dtype in between (the program's meaning)."""
        op, line = self.op, self.line
        func = "relu" if op.relu else "copy"
        narrow = self.narrow()
        if self.evicts_on_scalar():  # relu6 without a bias: min(relu(z), 6) = relu(min(z, 6)), clamped in PSUM
            clamp: list[Stmt] = [Scalar(acc, acc, "minimum", op.clamp, line)] if op.clamp is not None else []
            return clamp + [Act(dst, acc, func, bias, op.scale, line)]
        if not narrow:  # relu6 with a bias: the clamp after the eviction (VectorE)
            assert op.clamp is not None  # evicts_on_scalar() covers every op without a clamp
            return [Act(dst, acc, func, bias, op.scale, line), Scalar(dst, dst, "minimum", op.clamp, line)]
        ev = Buf(self.fresh(f"{op.name}_act{tag}"), "sbuf", "f32", acc.buf.shape)
        src = View(ev, acc.idx)
        out: list[Stmt] = self.alloc_once(ev) + [Act(src, acc, func, bias, op.scale, line)]
        if op.clamp is not None:
            out.append(Scalar(src, src, "minimum", op.clamp, line))
        for name, dtype in narrow:
            tile = Buf(self.fresh(f"{name}_{dtype}{tag}"), "sbuf", dtype, ev.shape)
            out += self.alloc_once(tile) + [ir.Copy(View(tile, acc.idx), src, line)]
            src = View(tile, acc.idx)
        return out + [ir.Copy(dst, src, line)]


def choose(op: ConvOp, plan: ConvPlan, hbm: dict[str, Buf]) -> tuple[Layout, bool] | None:
    """(the layout, whether TensorE takes taps) of the default kernel: the best-ranked layout whose dry build fits
    the SBUF and PSUM budgets (None: not a case for it, or no layout fits; the general path then follows the plan)."""
    from tilec.compiler import passes  # late: passes imports the builders' modules
    from tilec.compiler.schedule import sbuf_budget
    t = get_target()
    if hybrid(op):
        lay = choose_hybrid(op, plan, hbm)
        return (lay, True) if lay else None
    if not fast_path(op, plan, hbm):
        return None
    elem = DTYPE[hbm[op.x].dtype]
    # TensorE takes taps as diagonal matmuls when the weights can be its operand in X's dtype
    for pe in dict.fromkeys((hbm[op.w].dtype == hbm[op.x].dtype, False)):
        for lay in rank_layouts(op, elem, op.clamp is not None, pe)[:LAYOUT_TRIES]:
            groups = -(-op.dim("C") // fan_in(op) // lay.cg)
            taps = max(1, multiplier(op)) * fan_in(op) * op.dim("R") * op.dim("S")
            if pe and groups * taps * lay.k * lay.nb * lay.cg * elem > DIAG_BUDGET:
                continue  # every group's diagonal weights stay resident in SBUF
            sbuf, psum = passes.peak_usage(tuple(DepthwiseBuilder(op, hbm, lambda name: name, lay, pe).build()))
            if sbuf <= sbuf_budget(t) * SBUF_SHARE and psum <= t.psum_banks:
                return lay, pe
    return None


def hybrid_faster(op: ConvOp, n: int, fp32: bool) -> bool:
    """Whether the hybrid's busiest engine per chunk of n elements per partition beats today's grouped kernel (one
    block-diagonal matmul per tap (r, s), all of TensorE's), on the model's costs."""
    rt = hybrid_routes(op.dim("R") * op.dim("S"), hybrid(op), n, op.clamp is not None, fp32)
    return rt.pe > 0 and rt.ns < op.dim("R") * op.dim("S") * _matmul_ns(n, fp32)


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
    t, groups = get_target(), op.dim("K") // kg
    for d in sorted((d for d in range(1, groups + 1) if groups % d == 0 and d * kg <= PMAX), reverse=True):
        lay = Layout(d * kg, 1, ho, max(1, min(n_img, PMAX // (d * kg))), rc)
        trial = DepthwiseBuilder(op, hbm, lambda name: name, lay, True)
        if not trial.pe_starts_whole():  # a padded conv whose TensorE taps are all clipped (f32: 6 of 3x3's 9)
            return None
        sbuf, psum = passes.peak_usage(tuple(trial.build()))
        if sbuf <= sbuf_budget(t) * HYBRID_SBUF_SHARE and psum <= t.psum_banks:
            return lay
    return None


def build_depthwise(op: ConvOp, plan: ConvPlan, hbm: dict[str, Buf], fresh: Callable[[str], str]
                    ) -> tuple[list[tuple[str, int]], list[Stmt]] | None:
    """The default kernel of a depthwise conv (None: the general path builds it from the plan, see `choose`)."""
    chosen = choose(op, plan, hbm)
    if chosen is None:
        return None
    b = DepthwiseBuilder(op, hbm, fresh, *chosen)
    stmts = b.build()
    return b.consts(), stmts


def describe(op: ConvOp, plan: ConvPlan, hbm: dict[str, Buf]) -> list[str]:
    """The plan the default kernel uses, for `tilec explain` (no lines: the op takes the general path)."""
    chosen = choose(op, plan, hbm)
    if chosen is None:
        return []
    lay, pe = chosen
    b = DepthwiseBuilder(op, hbm, lambda name: name, lay, pe)
    k = b.names["k"]
    images = min(lay.k, b.N)
    parts = images * lay.nb * lay.cg
    rest = f" + a last group of {b.CR}" if b.CR else ""
    last = f" + a last tile of {plural(b.NR, 'image')}" if b.NR else ""
    blocks = f" x {lay.nb} row blocks of {lay.rb} output rows" if lay.nb > 1 else ""
    chunks = sorted({min(lay.rc, lay.rb - y0) for y0 in range(0, lay.rb, lay.rc)}, reverse=True)
    out = [f"# {op.name}: the depthwise kernel (build_depthwise), its plan:",
           f"#   partitions: ({'image' if lay.nb == 1 else 'row block'}, {k}) pairs, {parts} of {PMAX}: "
           f"{lay.cg} {k} channels per group x {plural(images, 'image')} per tile{blocks}",
           f"#   loops: {plural(b.G, 'group')}{rest} x {plural(b.NT, 'tile')} of {plural(lay.k, 'image')}{last}; "
           + ("a load DMA per (m, band slot) and piece of rows, a store per output channel" if b.HY else
            "one load and one store DMA per slot")
           + ("; halo rows copied from a zero tile" if b.has_halo() else "")
           + ("; taps skip the column halo" if b.clip else ""),
           f"#   PSUM chunks of {lay.rc} output rows ({lay.rc * b.Wo} fp32 per partition), pipelined {DEPTH} deep"]
    if b.M > 1:
        out.append(f"#   channel multiplier {b.M}: each partition computes its {k} channel's {b.M} output channels, "
                   "one after another, from one band")
    if b.HY:
        out.append(f"#   grouped conv, {b.HY} -> {b.HY} channels per group: partition (m, group) computes output "
                   f"channel group*{b.HY} + m from its group's {b.HY} input channels, rotated by m in the band; "
                   "TensorE takes whole positions (r, s) as block-diagonal matmuls of band slot 0 (every input channel "
                   "once)")
    elif b.CI > 1:
        out.append(f"#   fan-in {b.CI}: each partition sums its group's {b.CI} input channels (taps over (c, r, s))")
    for rows in chunks:
        out.append(f"#   taps of a {rows}-row chunk ({b.R * b.S * b.CI}): {b.taps_note(rows)}")
    if pe and b.HY:
        out.append("#   TensorE's taps: block-diagonal matrices (a stacked identity scaled per partition) built once "
                   "per group before the main loop")
    elif pe:
        out.append(f"#   TensorE's taps: diag({op.w}[{k}, r, s]) matrices built once per group before the main loop")
    out.append(f"#   eviction from PSUM: {b.epilogue_note() or 'a copy'}, into the output band")
    out.append(f"#   the directives below are the general path's: a schedule that changes {op.name}'s plan takes that "
               "path")
    return out


def plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


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

