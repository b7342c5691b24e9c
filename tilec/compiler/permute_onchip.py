"""A permute that moves its last dimension in short runs (a pixel shuffle `Y[n, c, 2h + i, 2w + j] = X[n, 4c + 2i +
j, h, w]`, seen by view_split as the 6-D permute [n, c, i, j, h, w] -> [n, c, h, i, w, j]), built on level B with
long contiguous DMAs and the interleave done on chip (issue 13). As a chain of HBM steps (select_permute) it moved
the data three or four times, or in 2-element DMA runs (pixel shuffle 13x the floor on the model). Here

    batch        the leading dimensions the two orders share (n, c): per batch element the slice is contiguous in X
                 and in Y; one batch element per partition, in tiles of up to 128 of them
    cut          one other dimension `d` cut into blocks: when the batch fills fewer than 128 partitions, `parts`
                 blocks go to partitions of their own (one load and one store per block, each on its own DMA
                 engines); `chunks` blocks per partition are steps of a loop (an SBUF tile fits STEP_BYTES)
    per step     X's slice loaded into a tile in X's order (runs: d's block and the dimensions after it in X), copied
                 on chip into a tile in Y's order by strided engine copies (the dimensions both orders keep in the
                 same relative order in each copy, one copy per combination of the others, shared by VectorE,
                 GpSimdE and ScalarE), and stored in Y's order (runs likewise)

Used when its estimate (the performance model's DMA cost rule, per step) beats the cheapest chain's
(select_permute.step_us); select.select_transpose then makes the permute one copy op, which
rules_copy.row_blocks builds here."""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations, product

from tilec.compiler import ir
from tilec.compiler.build_util import a, hbm_view, loop, sl, term
from tilec.target import Target

STEP_BYTES = 48 * 1024  # SBUF per partition of one step's two tiles (two steps in flight fit: copy_strided's figure)
MAX_COPIES = 64  # engine copies per step: more means runs too short for an engine instruction's fixed cost
ENGINES = ("vector", "gpsimd", "scalar")

Order = tuple[str, ...]


@dataclass(frozen=True)
class Layout:
    batch: Order  # the shared leading dimensions (extent > 1), one element per partition
    src: Order  # the other dimensions in X's order
    out: Order  # and in Y's
    cut: str  # the dimension cut into blocks ("" when none is: the slices are small and the batch is large)
    parts: int  # blocks of `cut` on partitions of their own
    chunks: int  # blocks of `cut` per partition, one step each
    pb: int  # batch elements per tile
    kept: Order  # the dimensions each engine copy moves whole (the same relative order in src and out)


def plan(src: Order, out: Order, ext: dict[str, int], itemsize: int, target: Target) -> Layout | None:
    """The layout for `Y[out] = X[src]` (each order the tensor's dimensions, `ext` their extents), or None when the
    permute keeps its last dimension (a DMA step moves whole rows), or no layout fits."""
    s, t = tuple(v for v in src if ext[v] > 1), tuple(v for v in out if ext[v] > 1)
    if not s or s[-1] == t[-1] or sorted(s) != sorted(t):
        return None
    k = next(i for i, (x, y) in enumerate(zip(s, t)) if x != y)
    batch, rs, ro = s[:k], s[k:], t[k:]
    bt = math.prod(ext[v] for v in batch)
    pb = _divisor(bt, target.pmax)
    if pb < min(bt, target.pmax // 4):
        return None  # (a prime batch would take one partition)
    options = []
    for d in rs:
        for q in (x for x in range(1, ext[d] + 1) if ext[d] % x == 0 and pb * x <= target.pmax and
                  (x == 1 or pb == bt)):
            per = math.prod(ext[v] for v in rs) // q  # elements per partition, all chunks
            fits = [c for c in range(1, ext[d] // q + 1) if ext[d] // q % c == 0 and
                    2 * per // c * itemsize <= STEP_BYTES]
            if fits:
                options.append((d, q, fits[0]))
    if not options:
        return None
    cut, parts, chunks = min(options, key=lambda o: (_dma_ns(rs, ro, ext, bt, pb, *o, itemsize), rs.index(o[0])))
    kept = _kept(rs, ro, {**ext, cut: ext[cut] // (parts * chunks)}, target.ap_free_dims)
    if kept is None:
        return None
    return Layout(batch, rs, ro, cut if parts * chunks > 1 else "", parts, chunks, pb, kept)


def _divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _run(order: Order, ext: dict[str, int], d: str, size: int) -> int:
    """Elements of a contiguous run of a slice of `order` whose dimension d is cut to `size`."""
    return size * math.prod(ext[v] for v in order[order.index(d) + 1:])


def _dma_ns(rs: Order, ro: Order, ext: dict[str, int], bt: int, pb: int, d: str, parts: int, chunks: int,
            itemsize: int) -> float:
    """The model's DMA-engine time of every step's load and store (Costs.dma_transfer_ns per DMA, its engines those
    of its partitions, 8 each; the `parts` DMAs of a step run on disjoint engines, at once), plus each DMA's
    latency."""
    from tilec.compiler.build_matvec import model_costs  # late: perf reads kernels
    costs = model_costs()
    size = ext[d] // (parts * chunks)
    per = math.prod(ext[v] for v in rs) // (parts * chunks)  # elements per partition per DMA
    engines = min(costs.n_dma, -(-pb // costs.ppe))
    steps = bt // pb * chunks
    total = 0.0
    for order in (rs, ro):
        descriptors = pb * per // _run(order, ext, d, size)
        total += steps * (costs.dma_transfer_ns(descriptors, pb * per * itemsize, engines) + costs.dma_latency)
    return total  # (a step's `parts` DMAs overlap, each on its own engines)


def _kept(rs: Order, ro: Order, ext: dict[str, int], free_dims: int) -> Order | None:
    """The dimensions an engine copy moves whole: a subsequence of both orders (at most `free_dims` of them) with
    the most elements; the others are one copy each (None when more than MAX_COPIES)."""
    best: Order | None = None
    for r in range(min(len(rs), free_dims), 0, -1):
        for kept in combinations(rs, r):
            if tuple(v for v in ro if v in kept) == kept and \
                    (best is None or math.prod(ext[v] for v in kept) > math.prod(ext[v] for v in best)):
                best = kept
    if best is None or math.prod(ext[v] for v in rs if v not in best) > MAX_COPIES:
        return None
    return best


def estimate_us(lay: Layout, ext: dict[str, int], itemsize: int, target: Target) -> float:
    """The layout's time on the model: its DMAs (every step's loads and stores on the engines of their partitions,
    the `parts` blocks' on disjoint engines, so a step takes its busiest block's time) or its engine copies (each
    engine streams one element per partition per cycle), whichever is longer."""
    bt = math.prod(ext[v] for v in lay.batch)
    d = lay.cut or lay.src[0]
    dma = _dma_ns(lay.src, lay.out, ext, bt, lay.pb, d, lay.parts, lay.chunks, itemsize) / 1000
    per_partition = math.prod(ext[v] for v in lay.src) * (bt // lay.pb) // lay.parts
    ghz = sum(getattr(target, f"{e}_ghz") for e in ENGINES)
    return max(dma, per_partition / ghz / 1000)


def build(found, hbm: dict, fresh, target: Target) -> tuple[list, list] | None:
    """The level-B statements of the copy nest `found` (rules_transpose._one_copy's: its loops, statement and
    read) when plan() lays it out, else None."""
    chain, stmt, src = found
    if src.fill is not None or any(len(i.terms) != 1 or i.const or i.terms[0].coef != 1
                                   for i in (*src.index, *stmt.dst.index)):
        return None
    ext = {lp.var: lp.extent for lp in chain}
    so, oo = tuple(i.terms[0].var for i in src.index), tuple(i.terms[0].var for i in stmt.dst.index)
    X, Y = hbm[src.buf], hbm[stmt.dst.buf]
    if sorted(so) != sorted(ext) or sorted(oo) != sorted(ext) or math.prod(X.shape) != math.prod(ext.values()) or \
            math.prod(Y.shape) != math.prod(ext.values()):
        return None
    itemsize = ir.DTYPE_BYTES[X.dtype]
    lay = plan(so, oo, ext, itemsize, target)
    if lay is None:
        return None
    return [], _statements(lay, ext, X, Y, stmt.line, fresh, target)


def _statements(lay: Layout, ext: dict[str, int], X: ir.Buf, Y: ir.Buf, line: int, fresh, target: Target) -> list:
    bt = math.prod(ext[v] for v in lay.batch)
    n_parts, n_chunks = lay.parts, lay.chunks
    size = ext[lay.cut] // (n_parts * n_chunks) if lay.cut else 0
    here = {**ext, **({lay.cut: size} if lay.cut else {})}  # a step's extents
    xv, s1 = hbm_view(X, (bt,) + tuple(ext[v] for v in lay.src), fresh(f"{X.name}_r"), line)
    yv, s2 = hbm_view(Y, (bt,) + tuple(ext[v] for v in lay.out), fresh(f"{Y.name}_r"), line)
    P = lay.pb * n_parts
    bv, cv = fresh("bt"), fresh("ct")
    load = ir.Buf(fresh(f"{X.name}_in"), "sbuf", X.dtype, (P,) + tuple(here[v] for v in lay.src))
    tile = ir.Buf(fresh(f"{Y.name}_out"), "sbuf", Y.dtype, (P,) + tuple(here[v] for v in lay.out))

    def hbm_side(view: ir.Buf, order: Order, o: int) -> ir.View:
        idx: list[ir.Idx] = [sl(a(term(bv, lay.pb)), lay.pb)]
        for v in order:  # the cut dimension: block o of the parts, then chunk ct of it
            idx.append(sl(a(term(cv, size), o * n_chunks * size), size) if v == lay.cut else ir.full(ext[v]))
        return ir.View(view, tuple(idx))

    def rows(buf: ir.Buf, o: int) -> ir.View:
        return ir.View(buf, (sl(o * lay.pb, lay.pb),) + tuple(ir.full(n) for n in buf.shape[1:]))

    body: list = [ir.Alloc(load, line=line), ir.Alloc(tile, line=line)]
    body += [ir.Dma(rows(load, o), hbm_side(xv, lay.src, o), line) for o in range(n_parts)]
    body += _copies(lay, here, load, tile, line, target)
    body += [ir.Dma(hbm_side(yv, lay.out, o), rows(tile, o), line) for o in range(n_parts)]
    inner = loop(cv, n_chunks, body, note=f"blocks of {lay.cut}" if lay.cut else "", line=line)
    main = loop(bv, bt // lay.pb, inner, note=f"{lay.pb} of the {bt} slices ({', '.join(lay.batch)}) per tile",
                line=line)
    label = (f"{Y.name} = permute of {X.name} in SBUF: slices loaded in {X.name}'s order"
             + (f" ({lay.cut} in {n_parts} partition blocks)" if n_parts > 1 else "")
             + f", interleaved by engine copies of [{', '.join(lay.kept)}], stored in {Y.name}'s order")
    return s1 + s2 + [ir.Block(label, tuple(main), line)]


def _copies(lay: Layout, here: dict[str, int], load: ir.Buf, tile: ir.Buf, line: int, t: Target) -> list:
    """One engine copy per combination of the dimensions outside `kept`, given to the engine that would finish it
    first (each streams an element per partition per cycle at its clock)."""
    ghz = {e: getattr(t, f"{e}_ghz") for e in ENGINES}
    busy = dict.fromkeys(ENGINES, 0.0)
    looped = [v for v in lay.src if v not in lay.kept]
    n = math.prod(here[v] for v in lay.kept)
    out = []
    for at in product(*(range(here[v]) for v in looped)):
        pos = dict(zip(looped, at))
        view = lambda buf, order: ir.View(buf, (ir.full(buf.shape[0]),) + tuple(  # noqa: E731
            ir.Aff((), pos[v]) if v in pos else ir.full(here[v]) for v in order))
        eng = min(ENGINES, key=lambda e: ((busy[e] + n) / ghz[e], ENGINES.index(e)))
        busy[eng] += n
        dst, src = view(tile, lay.out), view(load, lay.src)
        out.append(ir.Act(dst, src, "copy", line=line) if eng == "scalar" else
                   ir.Copy(dst, src, line, engine="gpsimd" if eng == "gpsimd" else ""))
    return out


def chosen(src: Order, out: Order, ext: dict, itemsize: int, steps: list | None, target: Target) -> bool:
    """Whether the permute is laid out here rather than as the chain `steps` (select_permute.plan's; a single swap
    of runs stays a transpose): when plan() lays it out and its estimate is below the chain's."""
    from tilec.compiler.select_permute import step_us
    if not steps or steps == [("runs", out)]:
        return False
    ext = {v: int(n) for v, n in ext.items()}
    lay = plan(src, out, ext, itemsize, target)
    if lay is None:
        return False
    orders = [src] + [o for _, o in steps]
    chain_us = sum(step_us(kind, x, y, ext, itemsize) for (kind, y), x in zip(steps, orders))
    return estimate_us(lay, ext, itemsize, target) < chain_us
