"""Global pools (issue 13): one value per channel row, a reduction over a map's trailing dimensions, then an
optional constant factor (a mean): `S[n, c] += X[n, c, i, j]; Y[n, c] = S[n, c] / 49`.

Rows (n*c) are grouped on the partitions, G per partition; X's rows arrive in chunks that shrink towards the end,
so the last chunk's reduce and the store start soon after the last byte lands (`global_chunks` sizes them with the
model's own costs). A 16-bit sum reduces straight into S's tile; the factor is applied on ScalarE while it copies.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import AbstractSet, Callable

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh, hbm_view
from tilec.compiler.build_util import a, loop, term
from tilec.compiler.ir import DTYPE_BYTES, Act, Aff, Alloc, Buf, Dma, Sl, Stmt, View, full, whole
from tilec.compiler.ops import EltwiseOp, ReduceOp
from tilec.compiler.rules_pool import Built
from tilec.compiler.schedule import PMAX
from tilec.target import compiled

GLOBAL_CHUNK_BYTES = 2048  # per partition, a middle chunk's load: its 128 descriptors (8 per DMA engine) cost under
#                            5 % of its transfer (tilec/perf/costs.py: hypot(descriptors x 14 ns, bytes / 23 B/ns))
GLOBAL_STREAM_BYTES = 16 * 1024  # per partition, a middle chunk's load when X is not resident: each chunk's tile
#                                   rotates through 2 buffers, so a load waits for the reduce 2 chunks before; one
#                                   this large takes longer than that wait's DMA latency
GLOBAL_RATIOS = (1.1, 1.25, 1.5, 2.0)  # growth of the chunks before the last, from the end (the best one is taken)
GLOBAL_RESIDENT = 64 * 1024  # bytes per partition of X kept whole in SBUF (every chunk loads into its own part);
#                               a larger X loads each chunk into a tile of its own
GLOBAL_MIN_PARTS = 64  # rows per partition tile below which the rule declines (R with no divisor near 128)
GLOBAL_MAX_ROW = 16 * 1024  # bytes of a row (H * W elements): longer rows are the row chain's (it splits a row)
GLOBAL_MAX_GROUP = 4096  # rows per partition: the (P, G) tiles of S and Y stay within 16 KiB per partition


@dataclass(frozen=True)
class GlobalPool:
    """`S[n, c] += X[n, c, i, j]` (or max=, min=) over X's trailing dimensions, then optionally `Y[n, c] = S[n, c] /
    k` (or `* k`): R = N * C rows of F = H * W elements, row p * G + g on partition p (a reshape: each partition
    reads G * F contiguous elements of X and writes G contiguous values of Y)."""
    reduce: ReduceOp
    scale: float | None  # the epilogue's factor, or the sum's own (S the output); None: neither
    ops: int  # 1 or 2 ops of the program taken
    P: int
    G: int
    F: int


def global_pool(ops: tuple, i: int, hbm: dict[str, Buf], outputs: AbstractSet[str], scheduled: AbstractSet[str]
                ) -> GlobalPool | None:
    """ops[i] (and ops[i + 1]) as a global pool, or None: a reduction of a plain tensor over its trailing dimensions
    into a temporary or an output, with no directive on either op, taking along (for a temporary) the one op reading
    it when that is an element-wise constant factor with the same indices into an output."""
    from tilec.compiler.schedule import best_divisor
    from tilec.lang import syntax as sx
    op = ops[i]
    if type(op) is not ReduceOp or op.expr is not None or isinstance(op.init, str) or \
            op.init != {"add": 0.0, "maximum": float("-inf"), "minimum": float("inf")}.get(op.op) or \
            op.name in scheduled or op.out in scheduled:
        return None
    R, F = op.dim("R"), op.dim("F")
    x = hbm[op.src]
    if len(x.shape) < 3 or x.shape[-1] * x.shape[-2] > F or not 1 < F <= GLOBAL_MAX_ROW // DTYPE_BYTES[x.dtype] \
            or R * F != _prod(x.shape) or len(dict(op.vars)) != len(x.shape):
        return None  # a global pool reduces (at least) the two trailing dimensions of a 3-D or larger tensor
    P = best_divisor(R, PMAX)
    if P < min(R, GLOBAL_MIN_PARTS) or R // P > GLOBAL_MAX_GROUP:
        return None
    readers = [o for o in ops if op.out in _reads_of(o)]
    if op.scale != 1.0 and op.op != "add":
        return None  # (max of x * s is a min for s < 0)
    alone = GlobalPool(op, None if op.scale == 1.0 else op.scale, 1, P, R // P, F)
    if op.out in outputs:  # (a factor inside the sum, `S[n, c] += X[n, c, i, j] / 49`: scaled once, after it)
        return alone if not readers else None
    nxt = ops[i + 1] if i + 1 < len(ops) else None
    if op.scale != 1.0 or not isinstance(nxt, EltwiseOp) or readers != [nxt] or nxt.inputs != (op.out,) or \
            nxt.layout or nxt.rows or nxt.columns or nxt.copy or nxt.fused or nxt.size != R or \
            nxt.name in scheduled or nxt.out in scheduled or nxt.out not in outputs:
        return alone  # a temporary another op reads (batch norm's per-image sums before their sum over n)
    e = nxt.expr
    kept = [v for k, v in op.vars if k.startswith("k")]
    if not (isinstance(e, sx.BinOp) and e.op in ("/", "*") and isinstance(e.lhs, sx.Access) and e.lhs.fill is None
            and isinstance(e.rhs, sx.Num) and e.rhs.value != 0
            and [getattr(ix, "id", None) for ix in e.lhs.indices] == [v for _, v in nxt.vars]
            and len(kept) == len(nxt.vars)):
        return alone
    k = float(e.rhs.value)
    return GlobalPool(op, 1.0 / k if e.op == "/" else k, 2, P, R // P, F)


def global_note(chain: list[str]) -> str:
    """The schedule's line for a global pool (the kernel header and `tilec explain`)."""
    return f"# global pool {', '.join(chain)}: rows grouped on the partitions, loads in shrinking chunks " \
        "(a directive on one builds it alone)"


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _reads_of(op) -> set[str]:
    from tilec.compiler.build_rowchain import reads_of
    return set(reads_of(op))


def global_chunks(G: int, F: int, itemsize: int, P: int, half: bool | None = None
                  ) -> tuple[int, int, int, list[int]]:
    """(middle chunk rows m, a first chunk's rows (0: none), middle chunks k, the rows of the chunks after them).
    Middle chunks are GLOBAL_CHUNK_BYTES per partition (GLOBAL_STREAM_BYTES when X is not resident). The chunks
    after them shrink so that each one's reduce (VectorE) ends about as the next chunk's load lands: after the last
    load only a small reduce is left. The last chunk's size and the growth before it are the ones whose simulated
    end (loads back to back on the DMA queue, each reduce after its load and the reduce before) is earliest, from
    the model's own cost facts (`_chunk_costs`; half: the reduce streams at half rate, a bf16 add or max; None:
    any 16-bit data)."""
    chunk = GLOBAL_CHUNK_BYTES if G * F * itemsize <= GLOBAL_RESIDENT else GLOBAL_STREAM_BYTES
    m = max(1, min(G, chunk // (F * itemsize)))
    load, red = _chunk_costs(F, itemsize, P, itemsize == 2 if half is None else half)
    best: tuple[float, list[int]] | None = None
    for last in range(1, m + 1):
        for ratio in GLOBAL_RATIOS:
            tail = [min(last, G)]
            while sum(tail) < G and tail[-1] < m:  # the chunk before: `ratio` larger
                tail.append(min(m, G - sum(tail), max(tail[-1] + 1, math.ceil(tail[-1] * ratio))))
            tail.reverse()
            if tail[0] == m:  # the middle chunks take over from the first tail chunk of their size
                tail = tail[1:]
            rest = G - sum(tail)
            sizes = [rest % m] * bool(rest % m) + [m] * (rest // m) + tail
            end = done = 0.0
            for s in sizes:
                end += load(s)
                done = max(done, end) + red(s)
            if best is None or done < best[0] - 1e-9:
                best = (done, sizes)
    assert best is not None
    sizes = best[1]
    first = sizes[0] if sizes[0] != m and len(sizes) > 1 and sizes[1] == m else 0
    sizes = sizes[1:] if first else sizes
    k = next((j for j, s in enumerate(sizes) if s != m), len(sizes))
    return m, first, k, sizes[k:]


def _chunk_costs(F: int, itemsize: int, P: int, half: bool) -> tuple[Callable[[int], float], Callable[[int], float]]:
    """(load ns, reduce ns) of a chunk of s rows per partition, as the model prices them (tilec/perf/costs.py: a DMA
    occupies each of its ceil(P / 8) engines hypot(descriptors x desc_ns, bytes / bw); tensor_reduce streams N_in,
    half of it for a bf16 -> bf16 add or max, plus VectorE's static cycles)."""
    from tilec.perf.costs import Costs
    from tilec.perf.params import target_params
    c = Costs(target_params(compiled().name))
    engines = min(c.n_dma, -(-P // c.ppe))

    def load(s: int) -> float:
        return c.dma_transfer_ns(P, P * s * F * itemsize, engines)

    def red(s: int) -> float:
        return (s * F / (2 if half else 1) + c.static["vector"]) * c.engine_ns["vector"]
    return load, red


def build_global_pool(g: GlobalPool, ops: tuple, i: int, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    """Every chunk of rows: one load into its own part of X's resident tile (or into a tile of its own), one
    tensor_reduce (VectorE) into the (P, G) tile of S in S's dtype (a 16-bit sum streams at N/2 and rounds the fp32
    sum once, as S's store would), the constant factor on ScalarE into Y's tile (it overlaps the next chunk's
    reduce); one store at the end."""
    op = g.reduce
    P, G, F = g.P, g.G, g.F
    x, s = hbm[op.src], hbm[op.out]
    y = hbm[ops[i + 1].out] if g.ops == 2 else s
    ln, yl = op.update_line, (ops[i + 1].line if g.ops == 2 else op.line)
    xv, body = hbm_view(x, (P, G, F), fresh(f"{op.src}_v"), ln)
    resident = G * F * DTYPE_BYTES[x.dtype] <= GLOBAL_RESIDENT
    xt = Buf(fresh(f"{op.src}_all"), "sbuf", x.dtype, (P, G, F)) if resident else None
    inner = g.ops == 1 and g.scale is not None  # the sum's own factor: the sum in fp32, scaled into S's tile
    st = Buf(fresh(f"{op.out}_sum" if inner else f"{op.out}_tile"), "sbuf", "f32" if inner else s.dtype, (P, G))
    body += ([] if xt is None else [Alloc(xt, line=ln)]) + [Alloc(st, line=ln)]
    half = x.dtype == st.dtype == "bf16" and op.op in ("add", "maximum")  # the model's half-rate reduce (costs.py)
    m, first, k, tail = global_chunks(G, F, DTYPE_BYTES[x.dtype], P, half)
    yt = st
    if g.scale is not None:
        yt = Buf(fresh(f"{y.name}_tile"), "sbuf", y.dtype, (P, G))
        body.append(Alloc(yt, line=yl))

    def chunk(start: Aff, size: int, name: str = "") -> list[Stmt]:
        rows = Sl(start, size, 1, name)
        out: list[Stmt] = []
        if xt is not None:  # each chunk into its own part of X's tile: no load waits for a reduce
            xs = View(xt, (full(P), rows, full(F)))
        else:  # a tile per chunk (the chunks in the loop rotate through the allocator's buffers)
            xs = whole(Buf(fresh(f"{op.src}_rows" + (str(size) if size != m else "")), "sbuf", x.dtype, (P, size, F)))
            out.append(Alloc(xs.buf, line=ln))
        out += [Dma(xs, View(xv, (full(P), rows, full(F))), ln), ir.Reduce(View(st, (full(P), rows)), xs, op.op, ln)]
        if g.scale is not None:
            out.append(Act(View(yt, (full(P), rows)), View(st, (full(P), rows)), "copy", scale=g.scale, line=yl))
        return out

    if first:
        body += chunk(a(0), first)
    body += [] if not k else loop("gt", k, chunk(a(term("gt", m, "TILE_G"), first), m, "TILE_G"),
                                  note="for the rows, TILE_G at a time on each partition (the middle chunks)",
                                  line=op.line)
    at = first + k * m
    for size in tail:
        body += chunk(a(at), size)
        at += size
    yv, view = hbm_view(y, (P, G), fresh(f"{y.name}_v"), yl)
    body += view + [Dma(whole(yv), whole(yt), yl)]
    kind = {"maximum": "max", "minimum": "min"}.get(op.op, "average" if g.scale is not None else "sum")
    block = ir.Block(f"{y.name}: global {kind} pool, {G} rows of {F} elements on each of {P} partitions",
                     tuple(body), op.line)
    return [("TILE_G", m)], [block]
