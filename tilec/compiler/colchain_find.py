"""Which ops make a column chain (build_colchain.py): a run of column statistics of one X (`column_chain`,
`statistics`), the element-wise op reading them after it, the block of columns a chain keeps in SBUF (`_block`), and
with a batch index the sub-blocks of a batch (`batched`)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import AbstractSet

from tilec.compiler.build_rowchain import reads_of
from tilec.compiler.exprs import strip_scale
from tilec.compiler.ir import DTYPE_BYTES, Buf
from tilec.compiler.ops import ColumnReduceOp, EltwiseOp
from tilec.target import compiled

# per partition: one block of X (two in flight when software-pipelined). Wider blocks hold the engines longer on
# one block's chain: column_standardize 4096 x 2048 with 512 columns (64 KiB) 388.3 us, 256 (32 KiB) 339.0 us
RESIDENT_BYTES = 32 * 1024
COPY_BYTES = 48 * 1024  # a 16-bit block with its fp32 working copy (per partition; two in flight when pipelined)
# TILE_F candidates, the first that divides F and fits: 512 fp32 columns fill one PSUM bank (the sum's matmul).
# With fp32 X of 8 or more row tiles, more blocks pipeline better (the first block's load and the last one's store
# are exposed); with fewer row tiles, or 16-bit X (its terms computed per row tile, no in-place part), a block's
# work is short and wider instructions do better. Model, trn2, 512 / 256 columns: softmax over axis 0 f32 2048^2
# 141.9 / 133.1 us, 1024^2 68.5 / 59.4, 512 x 2048 63.7 / 67.7; bf16 2048^2 305.9 / 362.4; column standardisation
# bf16 4096 x 2048 539.1 / 675.0, f32 1024^2 66.4 / 65.3, 512 x 2048 58.6 / 63.7 (f32 4096 x 2048: 512 does not fit)
WHOLE = 512  # a block of every column up to this wide
NARROW_FIRST, WIDE_FIRST = (256, 512, 128), (512, 256, 128)
IDENTITY = {"add": 0.0, "maximum": float("-inf"), "minimum": float("inf")}




@dataclass(frozen=True)
class ColChain:
    at: int
    count: int
    src: str
    R: int
    F: int
    TF: int
    user: bool = True  # the last op is the element-wise user; else statistics only (each stored or read later)
    # the chain as built: its statistics (an element-wise op computing the next one's terms folded into it as its
    # expression) and the user; () = ops[at:at + count] as they are
    members: tuple = ()
    O: int = 1  # batches (the kept indices before the reduced ones): a block is one batch (colbatch.py)
    subs: int = 1  # with O > 1: the sub-blocks of TF columns of a batch (an outer loop; each one PSUM bank at most)

    @property
    def op_range(self) -> range:
        return range(self.at, self.at + self.count)

    @property
    def blocks(self) -> int:
        """The trip count of the loop over blocks."""
        return self.O if self.O > 1 else self.F // self.TF


def column_chain(ops: tuple, i: int, keep: AbstractSet[str], scheduled: AbstractSet[str],
                 hbm: dict[str, Buf]) -> ColChain | None:
    """The chain of the module docstring starting at ops[i], or None."""
    stats, k = statistics(ops, i, keep)
    if not stats:
        return None
    first = stats[0]
    R, F, X, O = first.dim("R"), first.dim("F"), first.src, first.dim("O")
    user = ops[k] if k < len(ops) and _user(ops[k], X, {s.out for s in stats}, O, R, F, hbm if O > 1 else None) \
        else None
    if user is None and len(stats) < 2:  # one statistic alone: build_colreduce
        return None
    names = {o.name for o in ops[i:k + (user is not None)]}
    if names & set(scheduled) or hbm[X].dtype not in ("f32", "bf16"):
        return None
    P = compiled().pmax
    if R % P and not (O > 1 and R < P):  # (a batched chain of fewer rows: one tile of R partitions, P = R)
        return None
    members = tuple(stats) + ((user,) if user is not None else ())
    if O > 1:
        return batched(ColChain(i, k - i + (user is not None), X, R, F, 0, user is not None, members, O),
                       DTYPE_BYTES[hbm[X].dtype])
    TF = _block(R // P, F, DTYPE_BYTES[hbm[X].dtype])
    if hbm[X].dtype != "f32" and TF is not None:  # a 16-bit block and its fp32 working copy (_Builder.in_place)
        TF = _block(R // P, F, DTYPE_BYTES[hbm[X].dtype] + 4, COPY_BYTES)
    if TF is None or (user is None and hbm[X].dtype == "f32" and not _sums_keep_up(R // P, TF)):
        return None
    return ColChain(i, k - i + (user is not None), X, R, F, TF, user is not None, members)


def statistics(ops: tuple, i: int, keep: AbstractSet[str]) -> tuple[list[ColumnReduceOp], int]:
    """The run of column statistics of one X starting at ops[i] and the index after it. With a batch index (O > 1)
    a statistic whose terms read another (`s[a, c] += exp(X[a, b, c] - m[a, c])`) comes as an element-wise op
    writing the terms to HBM and a sum of them (reduce_split): the two are one statistic of X here, its terms
    computed per row tile on chip, when nothing else reads them."""
    stats: list[ColumnReduceOp] = []
    k = i
    while k < len(ops):
        op, step = ops[k], 1
        if stats and k + 1 < len(ops) and _terms(op, ops[k + 1], stats, ops, keep):
            # a constant factor of a sum's terms (`/ C`) scales the sum on its way out of PSUM, as select_reduce
            # strips it from a statistic written whole: one pass over the terms less
            expr, scale = strip_scale(op.expr) if ops[k + 1].op == "add" else (op.expr, 1.0)
            op = dataclasses.replace(ops[k + 1], src=stats[0].src, expr=expr, inputs=(stats[0].src, *op.rows),
                                     scale=ops[k + 1].scale * scale)
            step = 2
        if type(op) is not ColumnReduceOp or not _stat(op, stats[0] if stats else op, {s.out for s in stats}):
            break  # (ops[k] then is not in the chain, whatever it is)
        stats.append(op)
        k += step
    return stats, k


def _terms(op, nxt, stats: list[ColumnReduceOp], ops: tuple, keep: AbstractSet[str]) -> bool:
    """Whether op computes the terms nxt sums (or folds) and only nxt reads them, in X's batched layout."""
    first = stats[0]
    if first.dim("O") == 1 or type(nxt) is not ColumnReduceOp or nxt.src != op.out or nxt.expr is not None:
        return False
    if not _user(op, first.src, {s.out for s in stats}, first.dim("O"), first.dim("R"), first.dim("F")):
        return False
    return op.out not in keep and not any(op.out in reads_of(o) for o in ops if o is not nxt)


def _sums_keep_up(T: int, TF: int, elem: int = 4) -> bool:
    """Statistics of an fp32 X without a user put every sum on TensorE (_balance): worth X read once only when a
    sum of a block (T fp32 ones matmuls of TF columns, tilec/perf/costs.py) takes no longer than loading the block,
    which each statistic apart costs. Model, column variance 4096 x 2048: with the onezero rate 8.3 us against 11.4
    (chain 176.3 us, apart 220.8); at the full fp32 factor 16.6 us (chain 288.7, q = 16 folded 221.1: apart). A bf16
    X (its first sum at the bf16 rate) was faster as a chain at every size tried: bf16 variance 4096 x 2048 120.4
    against 135.7 us apart, 1024^2 21.0 / 23.9, 256 x 384 4.9 / 8.9."""
    from tilec.perf.costs import Costs
    from tilec.perf.params import target_params
    t = compiled()
    c = Costs(target_params(t.name))
    sum_ns = T * (TF + c.mm_fixed) * c.fp32_onezero / t.tensor_ghz
    return sum_ns <= t.pmax * T * TF * elem / t.hbm_bw


def _user(op, X: str, made: set[str], O: int, R: int, F: int, hbm: dict[str, Buf] | None = None) -> bool:
    """An element-wise op reading X and the statistics as rows, in X's layout; with `hbm` (a batched chain's user)
    also per-row columns of R values (`g[c]` of a channel LayerNorm: one per partition of each row tile)."""
    if type(op) is not EltwiseOp or op.copy or op.fused or (op.columns and hbm is None):
        return False
    if any(math.prod(hbm[c].shape) != R or hbm[c].dtype not in ("f32", "bf16") for c in op.columns if hbm):
        return False
    return set(op.inputs) == {X} and set(op.rows) <= made and dict(op.layout) == {"O": O, "P": R, "F": F}


def _stat(op: ColumnReduceOp, first: ColumnReduceOp, made: set[str]) -> bool:
    return op.src == first.src and op.dims == first.dims and not isinstance(op.init, str) \
        and op.op in IDENTITY and set(op.inputs) <= {op.src} | made


def _block(T: int, F: int, elem: int, budget: int = RESIDENT_BYTES) -> int | None:
    if F <= WHOLE and T * F * elem <= budget:
        return F
    order = NARROW_FIRST if elem == 4 and T >= 8 else WIDE_FIRST
    return next((c for c in order if F % c == 0 and T * c * elem <= budget), None)


def batched(ch: ColChain, elem: int) -> ColChain | None:
    """A chain with a batch index: a block is a sub-block of TF columns of one batch, the batches the inner loop
    (`for sb in range(subs): for ct in range(O)`, software-pipelined like the blocks of columns: pair_tiles.
    skew_inner_tiles), the sub-blocks of one width of at most WHOLE columns (one PSUM bank of fp32 sums). None when a
    sub-block does not fit RESIDENT_BYTES per partition (COPY_BYTES with a 16-bit X's working copy)."""
    T = max(1, ch.R // compiled().pmax)
    budget, per = (RESIDENT_BYTES, elem) if elem == 4 else (COPY_BYTES, elem + 4)
    least = -(-ch.F // WHOLE)
    n = next((k for k in range(least, 2 * least + 1) if ch.F % k == 0), None)
    if n is None or T * (ch.F // n) * per > budget or (not ch.user and elem == 4 and not _sums_keep_up(T, ch.F // n)):
        return None
    return dataclasses.replace(ch, TF=ch.F // n, subs=n)
