"""A sum over a few middle rows with long kept rows after them: the NHWC global average pool
`Y[n, c] = (sum over i, j of X[n, i, j, c]) / 49` (issue 13).

The column-reduce rule puts the R = 49 summed rows on 49 partitions (a third of the DMA engines and TensorE's rows,
nhwc23: 4.7x of the floor at batch 8). Here each kept row of F = C elements is cut into s pieces of L = F / s, and
the R * s pieces go on the partitions: X[n] seen as [R * s, L], one contiguous run of L elements a partition, the
partition stride uniform (L), so one DMA moves a whole image's columns. A ones stationary [R * s, s] whose column b
sums the partitions r * s + b adds the R rows on TensorE into PSUM as [s, L] (row b = Y[n, b*L : (b+1)*L]); the
constant factor is applied as ScalarE evicts, and one store writes s contiguous runs of Y.

    for n: for column chunk ct:      X_tile[R*s, TF] <- X[n] seen [R*s, L][:, ct]
                                     acc[s, TF] = ones.T @ X_tile      (banks of 512 columns)
                                     Y_tile[s, TF] = scale * acc       (ScalarE)
                                     Y[n] seen [s, L][:, ct] <- Y_tile
"""
from __future__ import annotations

from dataclasses import dataclass

from tilec.compiler import ir
from tilec.compiler.build_colreduce import STACK_ALIGN, kept_tile, outer_op
from tilec.compiler.build_conv import Fresh
from tilec.compiler.build_util import a, hbm_view, identity, loop, sl, term
from tilec.compiler.ir import DTYPE_BYTES, Act, Alloc, Scalar, Buf, Dma, Matmul, Stmt, View, full, whole
from tilec.compiler.ops import ColumnReduceOp
from tilec.compiler.pool_axes import prod
from tilec.compiler.schedule import MOVING_FMAX, PMAX

MIN_RUN_BYTES = 512  # a piece's run: below this the DMA descriptors cost more than the bytes (costs.dma_transfer_ns)
MIN_CHUNKS = 4  # column chunks of one image at least, when the row allows: the next chunk's load overlaps the sums
MAX_CHUNK_BYTES = 8 * 1024  # per partition of one chunk's tile
EVICT_PARTS = 32  # the last 32 partitions: an engine instruction's first partition is 0, 32, 64 or 96
RESIDENT_BYTES = 64 * 1024  # per partition: X kept whole in SBUF, each chunk loaded into its own part (no load
#                             waits for the sums of the chunk two before it)
Built = tuple[list[tuple[str, int]], list[Stmt]]


def pieces(op: ColumnReduceOp, itemsize: int) -> int:
    """s: the most pieces of a kept row whose R * s fit the partitions with runs of at least MIN_RUN_BYTES (0: the
    layout does not apply: a single piece, R over half the partitions, or short rows)."""
    R, F = op.dim("R"), op.dim("F")
    best = 0
    for s in range(2, min(PMAX // R, EVICT_PARTS) + 1):
        if F % s == 0 and F // s * itemsize >= MIN_RUN_BYTES:
            best = s
    return best


def global_axes_op(op, hbm: dict[str, Buf], scheduled) -> ColumnReduceOp | None:
    """op when it is a plain sum of one tensor over middle dimensions (a constant factor allowed) that this layout
    spreads over more partitions than the column-reduce rule's R, with no directive naming it; else None."""
    if type(op) is not ColumnReduceOp or op.op != "add" or op.expr is not None or op.init != 0.0 \
            or op.name in scheduled or op.out in scheduled:
        return None
    x = hbm[op.src]
    O, R, F = op.dim("O"), op.dim("R"), op.dim("F")
    if O * R * F != prod(x.shape) or pieces(op, DTYPE_BYTES[x.dtype]) == 0:
        return None
    if R % STACK_ALIGN == 0 or outer_op(op, x.dtype) or kept_tile(O, R, F, x.dtype, True, False) is not None:
        return None  # build_colreduce's own layouts: o's stacked or rows paired (R a multiple of 32, where engine
        #              instructions may start), few rows with long kept rows, an outer sum
    return op


def chunk_columns(O: int, L: int, itemsize: int) -> int:
    """TF: the columns of a chunk, a divisor of L: at most MAX_CHUNK_BYTES a partition, and small enough that one
    image makes MIN_CHUNKS chunks when there are fewer than MIN_CHUNKS images (batch 1: loads overlap the sums)."""
    want = max(1, MIN_CHUNKS // O)
    best = 1
    for tf in range(1, L + 1):
        if L % tf == 0 and tf * itemsize <= MAX_CHUNK_BYTES and (L // tf >= want or tf * itemsize < MIN_RUN_BYTES):
            best = tf
    return best


@dataclass(frozen=True)
class _Layout:
    op: ColumnReduceOp
    s: int  # pieces of a kept row
    L: int  # elements of a piece
    TF: int  # columns of a chunk
    xt: Buf  # X's tile: resident (R * s, O, L), or a chunk's (R * s, TF)
    res: Buf  # the sums: (PMAX, O, L) kept (`once`), or an image's (PMAX, 1, L)
    ones: Buf
    xv: Buf  # X seen as (O, R * s, L)
    yv: Buf  # Y seen as (O, s, L)
    resident: bool
    once: bool
    fresh: Fresh

    def image(self, o, h: int) -> list[Stmt]:
        """Image o's chunks (loads, matmuls, evictions) and its store; h = 1 swaps the evictions' engines, so that
        its store follows a different engine's stream than image h = 0's (a store waits in the stream of the engine
        that made its data: tilec/perf/schedule.py)."""
        op, s, L, TF, xt, res = self.op, self.s, self.L, self.TF, self.xt, self.res
        ln, rows = op.update_line, full(xt.shape[0])
        cols = sl(a(term("ct", TF, "TILE_F")), TF)
        r_o = o if self.once else a()
        body: list[Stmt] = [] if self.resident else [Alloc(xt, line=ln)]
        body.append(Dma(View(xt, (rows, o, cols)) if self.resident else whole(xt), View(self.xv, (o, rows, cols)),
                        ln))
        bank = min(TF, MOVING_FMAX)
        low = PMAX - EVICT_PARTS
        for k in range(TF // bank):
            acc = Buf(self.fresh(f"{op.out}_acc"), "psum", "f32", (PMAX, bank))
            at = sl(a(term("ct", TF, "TILE_F"), k * bank), bank)
            moving = View(xt, (rows, o, at)) if self.resident else View(xt, (rows, sl(k * bank, bank)))
            # (an engine instruction starts at partition 0, 32, 64 or 96: the last 32 partitions are evicted, at
            # the cost of the free size, not of the partitions)
            dst, src = View(res, (sl(low, EVICT_PARTS), r_o, at)), View(acc, (sl(low, EVICT_PARTS), full(bank)))
            body += [Alloc(acc, zero=True, line=ln), Matmul(whole(acc), whole(self.ones), moving, ln, ones=True),
                     evict(dst, src, op.scale, k + h, ln)]
        kept = ", ".join(v for role, v in op.vars if role.startswith("k"))
        nest = ([] if self.once else [Alloc(res, line=ln)]) + \
            loop("ct", L // TF, body, note=f"for {kept} (chunks of TILE_F columns of each of {s} pieces)",
                 line=op.line_of("k0"))
        return nest + [Dma(View(self.yv, (o, full(s), full(L))), View(res, (sl(PMAX - s, s), r_o, full(L))), ln)]


def evict(dst: View, src: View, scale: float, k: int, line: int) -> Stmt:
    """PSUM -> SBUF with the factor: ScalarE, and every other bank on VectorE (ScalarE alone paces 16-bit sums:
    TensorE streams their columns faster than one engine evicts them; bf16 b8 11.17 -> 9.20 us; fp32 alone 14.46 ->
    14.59, the same 14.46 with the images in pairs)."""
    if k % 2:
        return Scalar(dst, src, "multiply", scale, line)
    return Act(dst, src, "copy", scale=scale, line=line)


def build_global_axes(op: ColumnReduceOp, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    x, y = hbm[op.src], hbm[op.out]
    itemsize = DTYPE_BYTES[x.dtype]
    O, R, F = op.dim("O"), op.dim("R"), op.dim("F")
    s = pieces(op, itemsize)
    L = F // s
    TF = chunk_columns(O, L, itemsize)
    line, ln = op.line, op.update_line
    xv, stmts = hbm_view(x, (O, R * s, L), fresh(f"{op.src}_v"), line)
    yv, st = hbm_view(y, (O, s, L), fresh(f"{op.out}_v"), line)
    stmts += st
    # the sums land on the last s partitions (stationary columns P - s ..), whose DMA engine the loads of R * s
    # partitions do not use: each chunk's store runs beside the next loads instead of queueing among them
    top = PMAX - s
    ones = Buf(fresh(f"ones_{x.dtype}"), "sbuf", x.dtype, (R * s, PMAX))  # (nc_matmul: both fp32 or neither)
    ident, st = identity(fresh(f"ident_{x.dtype}"), x.dtype, line)
    stmts += st + [Alloc(ones, zero=True, line=line)]
    # column top + b sums partitions r * s + b: the identity's columns b, b + s, ... added along the free axis (an
    # engine's access covers a contiguous range of partitions, so the ones cannot be set by a strided view)
    stmts += [ir.Reduce(View(ones, (full(R * s), sl(top + b, 1))), View(ident, (sl(0, R * s), sl(b, R, s))), "add",
                        line) for b in range(s)]
    resident = O * L * itemsize <= RESIDENT_BYTES
    xt = Buf(fresh(f"{op.src}_all" if resident else f"{op.src}_tile"), "sbuf", x.dtype,
             (R * s, O, L) if resident else (R * s, TF))
    # every image's sums kept where they fit (no eviction waits for a store to free its buffer: b8 f32 17.1 ->
    # 14.5 us), one store an image (a store has a fixed cost on the model's DMA queue, ~0.8 us: one a chunk held
    # the evictions back; groups of 2 to 8 images a store were slower: 14.8 - 17.0 us)
    once = O * L * DTYPE_BYTES[y.dtype] <= RESIDENT_BYTES
    res = Buf(fresh(f"{op.out}_rows"), "sbuf", y.dtype, (PMAX, O, L) if once else (PMAX, 1, L))
    stmts += ([Alloc(xt, line=ln)] if resident else []) + ([Alloc(res, line=ln)] if once else [])
    lay = _Layout(op, s, L, TF, xt, res, ones, xv, yv, resident, once, fresh)
    outer = ", ".join(v for role, v in op.vars if role.startswith("o"))
    at_o = op.line_of("o0") if outer else line
    if O % 2 == 0:  # two images a step, the second's evictions in the other order (bf16 b8 9.20 -> 8.99 us)
        pair = lay.image(a(term("op", 2)), 0) + lay.image(a(term("op", 2), 1), 1)
        nest = loop("op", O // 2, pair, note=f"for {outer} (two at a time)" if outer else "", line=at_o)
    else:
        nest = loop("o", O, lay.image(a("o"), 0), note=f"for {outer}" if outer else "", line=at_o)
    red = ", ".join(v for role, v in op.vars if role.startswith("r"))
    what = f"{op.out} = sum over {red} of {op.src}" + (f" * {op.scale:g}" if op.scale != 1.0 else "") + \
        f" (ones matmul; each row of {F} in {s} pieces, {R * s} partitions)"
    return [("TILE_F", TF)], stmts + [ir.Block(what, tuple(nest), line)]

