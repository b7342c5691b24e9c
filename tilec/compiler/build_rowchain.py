"""Row chains: consecutive row reductions and element-wise statements over the same rows, fused into one pass.

softmax, layernorm and rmsnorm written as several statements are a chain of ops that all put the same rows R on
the partitions (`m[i] max= X[i, j]`, `e[i, j] = exp(X[i, j] - m[i])`, `s[i] += e[i, j]`, `Y[i, j] = e[i, j] / s[i]`).
Built one op at a time, every intermediate row goes to HBM and back. Fused (compute_at of every op at the row-tile
loop of the chain), each row tile of TILE_P rows is loaded once, whole rows stay in SBUF, the reductions leave
(TILE_P, 1) columns, and only what is needed after the chain is stored:

    for pt in range(R / TILE_P):
        load the full-row inputs [TILE_P, F] and the column inputs (TILE_P, 1)
        op by op: a reduction into a column, or the element-wise expression (ScalarE/VectorE) into a tile
        store the chain's outputs

Inside the loop the values are folded before they are computed (`Lin`, `Steps`: rowchain_base.py):
  * an affine map of one tile per row (`d = X - mu`, `d * r`) is no pass of its own: the activation that reads it
    takes the map as scale and bias, and a sum rides on that activation (`v += d * d / N` is one square of X with
    bias -mu whose row sums are v; layernorm is three ScalarE passes per row tile);
  * a column op (`-mu`, `-mu * r`, `rsqrt(v / N + eps)`) runs on the engine that made its inputs: between two
    ScalarE passes it is a ScalarE instruction, never a VectorE one queued behind the previous row tile's work;
  * VectorE steps against broadcast rows (`u * g + b`) run column chunk by chunk (TILE_F, one PSUM bank): TensorE
    copies the row's chunk to every partition in PSUM and each intermediate stays in PSUM, so every tensor_tensor
    reads one PSUM operand (N cycles instead of 2N, nki-spec 1.10.4).
Rows read whole from SBUF (g[j] * r[i]) are copied to every partition once, before the loop. A chain is fused only
with the default schedule (no directive names its ops) and when its tiles fit the SBUF budget; what the folding does
not cover (conversions, `%`) goes through the element-wise expression compiler (expr_instrs.ExprCompiler).

An f16/bf16 tensor is rounded where the program says so, with as few instructions as that takes: a tile written by
one instruction and only converted is written narrow by that instruction, the last VectorE step of a chunk writes
the narrow output tile the store reads, and a tensor no op of the chain reads is rounded by its store alone.

At long rows (whole-row tiles that do not fit the budget), a 16-bit chain of three phases (layernorm) is chunked and
software-pipelined (chunk_pipe.py); other chains go through fit_long_rows, which lets tiles of disjoint lives share
space (share.py) or chunks the columns (chunk_cols.py): X stays in SBUF, everything else goes chunk by chunk.

The chain is built in four parts: rowchain_base.py (the folded values, the chain's state and small helpers),
rowchain_values.py (values of expressions, computed when needed), rowchain_chain.py (`_Chain`: op by op, the
roundings, the stores, the row-tile loop), rowchain_rewrites.py (rewrites of the built loop body); this module finds
the chains (`row_chains`) and fits them to the SBUF budget (`fit_chain` and the pipelines it chooses between).
"""
from __future__ import annotations

import dataclasses
from typing import AbstractSet

from tilec.compiler import chunk_pipe, ir, mean_var
from tilec.compiler.build_reduce import build_short_rows, short_rows
from tilec.compiler.build_splitrows import build_split
from tilec.compiler.chunk_cols import chunk_columns, rotation_need
from tilec.compiler.dma_streams import loads_apart
from tilec.compiler.passes import peak_usage
from tilec.compiler.share import share_tiles
from tilec.compiler.build_util import loop
from tilec.compiler.ir import Act, Alloc, Buf, Stmt
from tilec.compiler.ops import ColumnReduceOp, EltwiseOp, Op, ReduceOp
from tilec.compiler.select_eltwise import has_reversed_read
from tilec.lang import syntax as sx
from tilec.target import compiled
from tilec.compiler.rowchain_base import Built, _reads
from tilec.compiler.rowchain_chain import _Chain
from tilec.compiler.engine_time import busiest
from tilec.compiler.rowchain_rewrites import products_on_gpsimd
from tilec.compiler.rowchain_rewrites import _shifted  # (pair_tiles.py imports it from here)


def _fit(op: Op, rows: int) -> tuple[int, int] | None:
    """(rows, free size it works on; 0 for a column) of an op that fits a row chain, else None. A plain element-wise
    op of one column (`r[i] = rsqrt(v[i] + eps)`) fits a chain whose rows are known."""
    if type(op) is ReduceOp:
        return op.dim("R"), op.dim("F")
    if isinstance(op, EltwiseOp) and op.copy:  # a data copy (shifted indices) has no row structure
        return None
    if isinstance(op, EltwiseOp) and has_reversed_read(op.expr, {v for _, v in op.vars}):
        return None  # a reversed read (`A[N - 1 - i, j]`): the element-wise rule reverses its rows, a chain does not
    if isinstance(op, EltwiseOp) and op.layout and op.dim("O") == 1:
        return op.dim("P"), op.dim("F")
    if isinstance(op, EltwiseOp) and not op.layout and rows and op.size == rows:
        return rows, 0
    return None


def _leading(op: Op, nxt: Op | None) -> tuple[int, int] | None:
    """(rows, free) of a plain element-wise op of full tiles that starts a chain: every tensor it reads indexed as
    its output is (`h[i, j] = X[i, j] + R[i, j]`, a residual before a layernorm), the next op a row reduction of its
    output over the same elements. Its output then stays in SBUF (else it goes to HBM and is read back)."""
    if not isinstance(op, EltwiseOp) or op.layout or op.copy or op.columns or op.rows or op.out_index:
        return None
    if type(nxt) is not ReduceOp or op.out not in ([nxt.src] + list(nxt.inputs)):
        return None
    if nxt.dim("R") * nxt.dim("F") != op.size or not _same_indexed(op.expr, tuple(v for _, v in op.vars)):
        return None
    return nxt.dim("R"), nxt.dim("F")


def _same_indexed(e: sx.Expr, idx: tuple[str, ...]) -> bool:
    """Every tensor read in e is indexed by exactly the loop variables `idx`, in order."""
    if isinstance(e, sx.Access):
        return e.fill is None and tuple(x.id if isinstance(x, sx.Name) else None for x in e.indices) == idx
    if isinstance(e, sx.BinOp):
        return _same_indexed(e.lhs, idx) and _same_indexed(e.rhs, idx)
    if isinstance(e, sx.Neg):
        return _same_indexed(e.x, idx)
    if isinstance(e, sx.Call):
        return all(_same_indexed(x, idx) for x in e.args)
    return isinstance(e, (sx.Num, sx.Name))


def row_chains(ops: tuple[Op, ...], scheduled: AbstractSet[str]) -> list[list[int]]:
    """Runs of >= 2 consecutive ops over the same rows and free size (at least one a row reduction), none named
    by a directive: each is built as one fused row chain."""
    chains: list[list[int]] = []
    run: list[int] = []
    rows = free = 0
    for i, op in enumerate(ops):
        shape = _fit(op, rows) if op.name not in scheduled else None
        if shape is None and not run and op.name not in scheduled:
            shape = _leading(op, ops[i + 1] if i + 1 < len(ops) else None)
        if shape is None or (run and (shape[0] != rows or (shape[1] and free and shape[1] != free))):
            _close(chains, run, ops, free)
            run, rows, free = [], 0, 0
            shape = _fit(op, 0) if op.name not in scheduled else None
            if shape is None:
                continue
        run.append(i)
        rows, free = shape[0], free or shape[1]
    _close(chains, run, ops, free)
    return chains


def _close(chains: list[list[int]], run: list[int], ops: tuple[Op, ...], free: int) -> None:
    if len(run) >= 2 and free > 1 and any(type(ops[i]) is ReduceOp for i in run):
        chains.append(list(run))


# tiles of at least this many bytes per partition must fit twice when they rotate across row tiles (fit_chain);
# smaller ones (columns, partial sums) are left to the planning margin (schedule.SBUF_PLANNING_MARGIN)
ROTATING_MIN = 1024


def build_row_chain(ops: list[Op], hbm: dict[str, Buf], fresh_for, keep: set[str], skewed: bool = False,
                    turn: bool = True) -> Built:
    """fresh_for(op): the name allocator of each op of the chain. Short rows (a reduction and element-wise ops of
    its columns) are grouped several per partition instead (build_reduce.short_rows)."""
    grouped = short_rows(ops)
    if grouped is not None:
        return build_short_rows(ops, hbm, fresh_for, keep, grouped)
    chain = _Chain(ops, hbm, fresh_for, keep, skewed, turn)
    consts, stmts = chain.build()
    return consts, getattr(chain, "views", []) + stmts


def fit_chain(ops: list[Op], hbm: dict[str, Buf], fresh_for, keep: set[str], budget: int) -> Built:
    """The row chain as it fits `budget` best (the caller checks it fits): whole and software-pipelined when that
    fits (pipelined), else chunked or shared (fit_long_rows). A chunked chain that broadcasts a row again chunk by
    chunk in fp32 (layernorm's b over rows of 32768 fp32) keeps the scaling by r on ScalarE: its TensorE is busy
    with fp32 broadcasts, and the transpose that turns r into a row only adds to each row tile's path (on the model
    2.14x the floor turned, 2.13x not).

    The tiles allocated inside the row-tile loop rotate through two buffers (this tile's and the next's) only where
    both fit (the model's "fit" rule, tilec/perf/params.py). A chain that is not software-pipelined (whose pipeline
    does not hold the two buffers itself) and whose loop tiles of at least ROTATING_MIN bytes do not fit twice in
    `budget` (chunk_cols.rotation_need) is chunked with X allocated once before the loop instead (chunk_cols
    `rotating`): the next row tile's chunks stream into X as this tile's last phase releases them (on the model
    under "fit": softmax over rows of 32768 fp32 1.82x -> 1.44x, rmsnorm over rows of 8192 / 16384 / 32768 fp32
    1.66 / 1.54 / 1.90x -> 1.40 / 1.26 / 1.22x, layernorm 8192 / 16384 fp32 1.86 / 2.28x -> 1.62 / 1.61x).
    A loop whose loads and stores would share VectorE's DMA trigger stream has the loads' first reader moved to
    GpSimdE (dma_streams.loads_apart)."""
    consts, stmts = _fitted(ops, hbm, fresh_for, keep, budget)
    return consts, loads_apart(stmts)


def _fitted(ops: list[Op], hbm: dict[str, Buf], fresh_for, keep: set[str], budget: int) -> Built:
    built = build_row_chain(ops, hbm, fresh_for, keep)
    chosen, skewed = _fit_chain(ops, hbm, fresh_for, keep, budget, built)
    if skewed:
        return chosen
    if rotation_need(chosen[1], least=ROTATING_MIN) > budget:
        free = next(op.dim("F") for op in ops if type(op) is ReduceOp)
        rotating = chunk_columns(built[0], built[1], free, budget, fresh_for(ops[-1]), rotating=True)
        chosen = chosen if rotating is None else rotating
    return stats_pipelined(ops, built, chosen, budget, fresh_for(ops[-1])) or chosen


def stats_pipelined(ops: list[Op], built: Built, chosen: Built, budget: int, fresh) -> Built | None:
    """A chunked chain (its columns in chunk loops) whose mean and variance are two ScalarE passes over X
    (layernorm): the two made by VectorE's bn_stats / bn_aggr in one pass (mean_var.py), so that X is read in two
    phases only (statistics; output), the output's `+ b` moved to GpSimdE (VectorE now has the statistics), and
    the chain software-pipelined by one row tile with the two phases' chunk loops fused (pair_tiles `fuse`):
    VectorE interleaves the next tile's bn_stats with this tile's products, chunk by chunk, while TensorE makes
    the products' r x g broadcasts. On the model under "fit", fp32 layernorm over rows of 8192 / 16384 / 32768
    1.37 / 1.61 / 2.14x -> 1.18 / 1.32 / 1.54x the floor. A chain that broadcasts a row again for every chunk
    (b at rows of 32768 fp32: TensorE's fp32 matmuls bound it) keeps it whole for as many first chunks as fit
    (chunk_pipe.partly_whole; 1.62x -> 1.54x). None when the chain is not of that form, has too few row tiles, or
    the pipelined chain does not fit `budget`."""
    from tilec.compiler.chunk_cols import chunked_at
    from tilec.compiler.pair_tiles import skew_row_tiles

    if not any(isinstance(s, ir.Loop) and s.var == "cc" for s in ir.walk(tuple(chosen[1]))):
        return None
    free = next(op.dim("F") for op in ops if type(op) is ReduceOp)
    fmax = compiled().instr("bn_stats").limit("f")

    def piped(chunked: Built) -> Built | None:
        one = mean_var.one_pass_stats(chunked[1], free, fresh, fmax)
        if one is None:
            return None
        body = chunk_pipe.merged_gpsimd_steps(mean_var.last_add_on_gpsimd(one))
        consts = chunked[0] + [("TILE_BN", min(fmax, dict(chunked[0])["TILE_C"]))]
        return skew_row_tiles((consts, _setup_evicted_on_scalar(body)), budget, fresh, fuse=True)

    if _rebroadcast(chosen[1]):
        size = dict(chosen[0])["TILE_C"]
        whole_b = chunked_at(built[0], built[1], free, size, fresh, hoist=True)
        for head in range(free // size - 1, 0, -1) if whole_b is not None else ():
            assert whole_b is not None
            partly = chunk_pipe.partly_whole(whole_b, head, fresh)
            out = piped(partly) if partly is not None else None
            if out is not None:
                return out
    return piped(chosen)


def _setup_evicted_on_scalar(stmts: list[Stmt]) -> list[Stmt]:
    """The copies out of PSUM of a row broadcast before the chain's loop (b_tile, chunk by chunk) by ScalarE: in
    the chain of `stats_pipelined` the first row tile's statistics are VectorE's (bn_stats), and ScalarE has no work
    before its first centring. On the model fp32 layernorm over rows of 32768 (b whole for 10 of 32 chunks):
    575.7 -> 559.3 us (1.54x -> 1.495x the floor); moving the copies of the chunks broadcast again inside the loop
    too is worse (569.0 us; those alone 585.4 us: ScalarE's centring waits for them)."""
    def moved(s: Stmt) -> Stmt:
        if isinstance(s, ir.Loop):
            return dataclasses.replace(s, body=tuple(moved(x) for x in s.body))
        if isinstance(s, ir.Copy) and not s.engine and s.src.buf.memory == "psum" and s.dst.buf.memory == "sbuf":
            return Act(s.dst, s.src, "copy", line=s.line)
        return s
    return [moved(s) if isinstance(s, ir.Loop) else s for s in stmts]


def _fit_chain(ops: list[Op], hbm: dict[str, Buf], fresh_for, keep: set[str], budget: int, built: Built
               ) -> tuple[Built, bool]:
    """The chain as fit_chain chose it before rotation was counted, and whether it is software-pipelined (its row
    tiles in two buffers by parity, made by the pipeline itself)."""
    split = build_split(ops, hbm, fresh_for(ops[-1]), keep, budget)  # layernorm, each row on two partitions
    if split is not None and peak_usage(tuple(split[1]))[0] <= budget:
        return split, True
    if peak_usage(tuple(built[1]))[0] <= budget:
        return pipelined(ops, hbm, fresh_for, keep, built, budget)
    from tilec.compiler.chunk_pipe import pipelined_chunks

    split = build_split(ops, hbm, fresh_for(ops[-1]), keep, budget)  # layernorm, each row on two partitions
    if split is not None and peak_usage(tuple(split[1]))[0] <= budget:
        return split, True
    piped = pipelined_chunks(ops, hbm, fresh_for, keep, budget)
    if piped is not None:
        return piped, True
    fitted = fit_long_rows(ops, built, budget, fresh_for)
    if _turned(fitted[1]) and _rebroadcast(fitted[1]):
        return fit_long_rows(ops, build_row_chain(ops, hbm, fresh_for, keep, turn=False), budget, fresh_for), False
    return fitted, False


def _phases(stmts: list[Stmt]) -> int:
    """The chunk loops (chunk_cols' phases) of a chunked chain's row-tile loop."""
    return sum(isinstance(s, ir.Loop) and s.var == "cc" for s in ir.walk(tuple(stmts)))


def _turned(stmts: list[Stmt]) -> bool:
    return any(isinstance(s, ir.Transpose) for s in ir.walk(tuple(stmts)))


def _rebroadcast(stmts: list[Stmt]) -> bool:
    """An fp32 row broadcast to every partition again inside the chunk loop (chunk_cols' `rebuild`): fp32 matmuls,
    four times the cost of 16-bit ones."""
    def again(loop: ir.Loop) -> bool:
        return any(isinstance(x, ir.Matmul) and x.stationary.buf.name.startswith("ones_f32")
                   for x in ir.walk(loop.body))
    return any(isinstance(s, ir.Loop) and s.var == "cc" and again(s) for s in ir.walk(tuple(stmts)))


def fit_long_rows(ops: list[Op], built: Built, budget: int, fresh_for) -> Built:
    """A chain whose whole-row tiles do not fit `budget`: its columns chunked (chunk_cols.py: the rows read in
    several phases stay in SBUF, the rest goes chunk by chunk), or its tiles of disjoint lives sharing space
    (share.py). Chunked unless the chunked kernel must keep a row broadcast to every partition whole (layernorm's b)
    and the shared one fits: it then has no more room than the shared one for the next row tile's load, and its
    phases cost (on the model: layernorm over rows of 8192 is 1.35x the floor shared, 1.60x chunked; softmax over
    rows of 16384 1.29x shared, 1.05x chunked; bf16 rmsnorm over rows of 16384 1.74x shared, 1.47x chunked). The
    caller checks the result fits."""
    free = next(op.dim("F") for op in ops if type(op) is ReduceOp)
    chunked = chunk_columns(built[0], built[1], free, budget, fresh_for(ops[-1]))
    if chunked is not None and not _whole_broadcast(chunked[1], free):
        return chunked
    shared: Built = (built[0], list(share_tiles(tuple(built[1]), budget)))
    if chunked is None or peak_usage(tuple(shared[1]))[0] <= budget:
        return shared
    return chunked


def _whole_broadcast(stmts: list[Stmt], free: int) -> bool:
    """A whole-row tile on every partition made before the chain's loop (a row broadcast, b_tile)."""
    return any(isinstance(s, Alloc) and s.buf.memory == "sbuf" and len(s.buf.shape) == 2 and s.buf.shape[0] > 1
               and s.buf.shape[1] == free for s in stmts)


def reads_of(op: Op) -> list[str]:
    """Every tensor an op reads (for deciding what a chain must store)."""
    names = _reads(op) + list(getattr(op, "rows", ()))
    for attr in ("src", "x", "w", "bias", "residual"):
        value = getattr(op, attr, None)
        if isinstance(value, str):
            names.append(value)
    # a contraction's fused epilogue reads its vectors and tensors too (eviction_fusion)
    return names + [s.operand[1] for s in getattr(op, "epilogue", ()) if isinstance(s.operand, tuple)]


__all__ = ["row_chains", "build_row_chain", "fit_chain", "fit_long_rows", "reads_of", "ColumnReduceOp"]


def _skewed(ops: list[Op], hbm: dict[str, Buf], fresh_for, keep: set[str], budget: int, vector_centring: bool
            ) -> tuple[list[tuple[str, int]], list[Stmt], bool] | None:
    """The chain built for software pipelining and skewed (None when that does not fit), and whether it had a
    centring and scaling to place (`_Chain.centred`)."""
    from tilec.compiler.pair_tiles import skew_row_tiles

    chain = _Chain(ops, hbm, fresh_for, keep, skewed=True)
    chain.vector_centring = vector_centring
    consts, stmts = chain.build()
    skewed = skew_row_tiles((consts, getattr(chain, "views", []) + stmts), budget, fresh_for(ops[-1]))
    if skewed is None:
        return None
    shared = chunk_pipe.last_banks_shared(skewed[1], fresh_for(ops[-1]), compiled())
    return skewed[0], products_on_gpsimd(shared, compiled()), chain.centred


def pipelined(ops: list[Op], hbm: dict[str, Buf], fresh_for, keep: set[str], built: Built, budget: int
              ) -> tuple[Built, bool]:
    """A chain that fits whole, built again for software pipelining (pair_tiles.skew_row_tiles: a row tile's
    VectorE steps after the next tile's ScalarE passes, and in a 16-bit chain work moved off ScalarE), when that
    applies and fits; else, for a chain of steps too big to fit twice, its columns chunked; else `built`. Every
    chain with a loop of steps is pipelined when it fits (rows10 pipelined only those with ScalarE passes to move:
    now the scaling by r rides on g's broadcast, rmsnorm bf16 over rows of 4096 is 1.04x pipelined, 1.71x not)."""
    if short_rows(ops) is not None:
        return built, False
    skewed = _skewed(ops, hbm, fresh_for, keep, budget, False)
    if skewed is not None and skewed[2]:  # a standardisation: its centring and scaling on VectorE, if less busy
        other = _skewed(ops, hbm, fresh_for, keep, budget, True)
        t = compiled()
        if other is not None and busiest(other[1], t, nested=True) < busiest(skewed[1], t, nested=True):
            skewed = other
    if skewed is not None:
        return (skewed[0], skewed[1]), True
    if 2 * peak_usage(tuple(built[1]))[0] <= budget or not _turned(built[1]):
        return built, False
    # a chain whose column rides on a row's broadcast (its row tile is then read until the tile's last step) that
    # fits once but not twice: its columns chunked as at long rows, so that the next row tile's load and this tile's
    # store go chunk by chunk beside the work (on the model: bf16 rmsnorm over rows of 16384 1.61x -> 1.22x; chains
    # without a turned column gain or lose a little: softmax over rows of 8192 f32 1.15x -> 1.06x, of 16384 bf16
    # 1.45x -> 1.46x, f32 rmsnorm over rows of 8192 1.08x -> 1.10x)
    free = next(op.dim("F") for op in ops if type(op) is ReduceOp)
    chunked = chunk_columns(built[0], built[1], free, budget, fresh_for(ops[-1]))
    if chunked is not None and not _whole_broadcast(chunked[1], free):
        return chunked, False
    return built, False
