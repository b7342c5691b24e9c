"""The kernel's last row band at batch 1 as two accumulation groups of unequal rows, each evicted and stored on
its own (issue 13, the batch-1 tail; build_conv._ConvBuilder's out_band and row_bands call it).

At batch 1 TensorE ends its work and then the last group's eviction and the last band's store run alone: fp32
conv3x3same's band of 7 row pairs stores 200 KB in 896 runs of 224 B (1.6 us) after its last matmul (docs/notes/
conv22.md, "Where the target rows' time goes"). Built as two groups, the first group's store runs under the
second group's matmuls and the kernel ends with the second, smaller store. conv22 measured the split on a
hand-edited kernel (conv3x3same f32 batch 1, 38.15 us): 4 + 3 pairs 37.5, 5 + 2 and 3 + 2 + 2 37.9, 3 + 3 + 1 38.2,
5 + 1 + 1 39.1 (with more groups their stores queue one after another); so two groups, the first of ceil(rows / 2).

Row pairs (conv_pairs: partition h*K + k, band row i holds output row 2i + h), plain bands (one matmul per tap and
in-channel tile, the band's rows on the free axis) and folded taps (conv_fold, not mixed) are split; the group's
first row is the builder's `g0` and its PSUM and eviction tiles are named with `tag` (`_head`, `_tail`: their rows
differ from the other bands' groups).
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tilec.compiler import conv_epilogue, conv_pairs
from tilec.compiler.build_util import a, drop_var, sl
from tilec.compiler.ir import DTYPE_BYTES, Act, Alloc, Buf, Dma, Stmt, View, full
from tilec.target import compiled

if TYPE_CHECKING:
    from tilec.compiler.build_conv import _ConvBuilder


def splits(b: _ConvBuilder) -> bool:
    """Whether the band being built is split: the last band of the image, peeled off the band loop (for its halo,
    or by row_bands because splits_tail holds), and not a row-pair band regrouped on TensorE for its store
    (conv_pairs.regroup_band, 16-bit)."""
    var, first = b.yb
    return var is None and first == b.NB - 1 and splits_tail(b) and not conv_pairs.regroup_band(b)


def splits_tail(b: _ConvBuilder) -> bool:
    """splits' conditions but the band's: one image, one accumulation group per band of whole rows and one
    out-channel part (the last band is then the kernel's last work), stored to HBM (no on-chip output, pool, fused
    tiles band), no mixed taps or stacked bands (their groups have their own layouts), and the split pays
    (_tail_hides_store). row_bands peels the last band off the band loop where they hold."""
    if not (b.N == 1 and b.G == 1 and b.XT == 1 and b.NXB == 1 and b.p.rows >= 2 and b.dst_chip is None
            and b.o_tiles is None and b.op.pool is None and b.wy == b.wx == 1):
        return False
    paired = b.pair == 2 and not b.halves and not b.phased
    plain = (b.pair == 1 and not b.mixed and not b.stack and b.KTB == 1 and b.op.groups == 1
             and b.op.w_layout == "kc" and not b.op.x_transposed and b.dup == 1)
    return (paired or plain) and _tail_hides_store(b)


def _tail_hides_store(b: _ConvBuilder) -> bool:
    """The second group's matmuls last at least a DMA's latency, so the first group's store runs under them (the
    performance model's constants: fp32 at its matmul factor). Where they are shorter the split only adds a store
    and an eviction: conv3x3same and resnet_block batch 1, f32 and bf16 at 16x16, 28x28 and 56x56 (`tilec
    profile`, before -> after, us): f32 56 38.1 -> 37.5 and 61.2 -> 60.0, f32 28 24.8 -> 23.9 and 34.6 -> 33.1
    (2.1-2.4 us of tail matmuls) split; f32 16 20.8 -> 21.3 and 26.3 -> 26.4 (0.86 us), bf16 16 17.6 -> 18.7,
    28 19.2 -> 19.7 (0.51 us) do not (bf16 56 regroups its last band: unchanged)."""
    from tilec.compiler.build_matvec import model_constants  # (the model's constants, read late as there)
    prm = model_constants()
    factor = prm["fp32_matmul"] if DTYPE_BYTES[b.hbm[b.op.x].dtype] == 4 else 1.0
    matmuls = len(b.pairs) if b.pair == 2 else len(b.groups) if b.fold > 1 else b.R * b.S * b.CTB
    rows = b.p.rows - -(-b.p.rows // 2)
    pe_ns = matmuls * (rows * b.p.tile_x + 9) * factor / compiled().tensor_ghz
    return pe_ns >= prm["dma_latency_ns"]


def split_groups(b: _ConvBuilder, ob: Buf) -> list[Stmt]:
    """The band's rows as two groups, the first of ceil(rows / 2): each its own PSUM tile, matmuls, eviction into
    its rows of the output band ob and store. The plan's rows stand for the group's while it is built (its
    ROWS constant names the other bands' groups: the group's slices print numbers)."""
    plan, out = b.p, []
    first = -(-int(plan.rows) // 2)  # (plain numbers: a group's rows are not the ROWS constant's)
    for lo, n, tag in ((0, first, "_head"), (first, int(plan.rows) - first, "_tail")):
        out += _group_at(b, lo, n, tag)
        part = View(ob, (b.part(b.ks, plan.tile_k) if b.pair == 1 else full(b.PK), sl(lo, n), full(ob.shape[2])))
        if conv_epilogue.relu_per_band(b):
            out.append(Act(part, part, "relu", None, 1.0, b.L["relu"]))
        out.append(Dma(_store_view(b, plan, lo, n), part, b.line))
    return out


def _group_at(b: _ConvBuilder, lo: int, n: int, tag: str, drop: bool = True) -> list[Stmt]:
    """One accumulation group of band rows (pairs) lo..lo + n: its PSUM tile, matmuls and eviction, the group and
    column-tile loops gone (`drop`; else rows lo.. of group g). The plan's rows stand for the group's while it is
    built."""
    plan, names = b.p, b.cn
    b.p, b.g0, b.tag, b.cn = replace(plan, rows=n), lo, tag, {**names, "rows": ""}
    out = list(b.group())
    b.p, b.g0, b.tag, b.cn = plan, 0, "", names
    return list(drop_var(drop_var(tuple(out), b.var["g"]), b.var["x"])) if drop else out


def splits_half(b: _ConvBuilder) -> bool:
    """Whether a band regrouped on TensorE for its store (conv_pairs.regroup_band) sums each group in two parts,
    cut where the regroup's parts are (conv_pairs.regroup_cut): two groups a band, each a half band, whole width;
    and the regroup's crossing form (a batch's images but the last), whose selection matmuls read half 1 part by
    part. The last image's (and batch 1's) form sums both halves in each selection matmul, so its first waits for
    half 1's second part anyway: there the cut only adds instructions (bf16 conv3x3same and resnet_block batch 1
    and 8 unchanged on trn2; the block on trn1 31.7 -> 31.8 us at batch 1, 78.3 -> 78.4 at batch 8)."""
    return (b.N > 1 and not b.last_image and b.XT == 1 and b.p.rows == b.p.band // 4
            and 0 < conv_pairs.regroup_cut(b) < b.p.rows)


def half_groups(b: _ConvBuilder) -> list[Stmt]:
    """The body of a regrouped band's group loop: the group's pairs summed as two parts of one PSUM tile (a bank, as
    the group's tile), cut where the regroup's PSUM parts are, each part evicted once summed. The regroup moves
    half 1 (the second group) in two selection matmuls, one per part; with the group one sum, the first of them
    waited for the group's whole eviction (ScalarE, 0.41 us at bf16 56 x 56) and TensorE stood idle 0.24 us every
    image (conv3x3same bf16 batch 8: 1.9 us of 55.2). Cut, the first part is evicted while TensorE sums the
    second, and the second part's eviction runs beside the regroup's first three selection matmuls. Both groups
    are cut so the band keeps its loop (one PSUM allocation site: the model rotates a site's tiles through the
    banks, tilec/perf/schedule.psum_banks)."""
    rows, cut = int(b.p.rows), conv_pairs.regroup_cut(b)
    acc = Buf(b.fresh(f"{b.op.name}_acc"), "psum", "f32", (b.PK, rows, b.p.tile_x))
    out: list[Stmt] = [Alloc(acc, zero=True, line=b.line)]
    b.g_step = rows
    for lo, n in ((0, cut), (cut, rows - cut)):
        b.acc_in = (acc, lo)
        out += _group_at(b, lo, n, "", drop=False)
    b.acc_in, b.g_step = None, 0
    return list(drop_var(tuple(out), b.var["x"]))


def _store_view(b: _ConvBuilder, plan, lo: int, n: int) -> View:
    """The HBM rows of band rows lo..lo + n: row pairs in the [N, K, pairs, 2, columns] view (conv_pairs.rows_view),
    a plain band's output rows."""
    if b.pair == 2:
        region = (a(b.var["n"]), full(b.K), sl(b.y_at(plan.band // 2).plus(lo), n), full(2), full(b.Wo))
        return View(b.o5, region, perm=(2, 0, 1, 3))
    return View(b.o4, (a(b.var["n"]), sl(b.k_start(b.kv), b.ks), sl(b.y_at(plan.band).plus(lo), n), full(b.BX)))
