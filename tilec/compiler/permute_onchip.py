"""A permute that moves its last dimension in short runs (a pixel shuffle `Y[n, c, 2h + i, 2w + j] = X[n, 4c + 2i +
j, h, w]`, seen by view_split as the 6-D permute [n, c, i, j, h, w] -> [n, c, h, i, w, j]), built on level B with
long contiguous DMAs and the interleave done on chip (issue 13). As a chain of HBM steps (select_permute) it moved
the data three or four times, or in 2-element DMA runs (pixel shuffle 13x the floor on the model). Here

    batch        the leading dimensions the two orders share (n, c): per batch element the slice is contiguous in X
                 and in Y
    partitions   one per (batch element, block of a dimension `cut`): the slices cut into `parts` blocks so that a
                 step's tiles fit STEP_BYTES and its DMAs use many partitions; a step holds `pb` batch elements, so
                 its load and store cover one contiguous range of X and of Y (the model orders DMAs writing
                 overlapping HBM ranges: steps cut inside the slices would serialise the stores)
    per step     X's slices loaded by one DMA into a tile in X's order (runs: the cut's block and the dimensions
                 after it in X), copied on chip into a tile in Y's order by strided engine copies (the dimensions
                 both orders keep in the same relative order in each copy, one copy per combination of the others,
                 shared by VectorE, GpSimdE and ScalarE), and stored in Y's order by one DMA (runs likewise)

Used when its estimate (the performance model's DMA cost rule, per step) beats the cheapest chain's
(select_permute.step_us); select.select_transpose then makes the permute one copy op, which
rules_copy.row_blocks builds here."""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations, product

from tilec.compiler import ir
from tilec.compiler.build_util import a, hbm_view, loop, sl, term
from tilec.compiler.permute_rows import wide_rows
from tilec.compiler.select_permute import one_step
from tilec.target import Target

STEP_BYTES = 48 * 1024  # SBUF per partition of one step's two tiles (copy_strided's figure; the unrolled pair of
# steps allocates twice that; the model grants their rotation buffers only where they fit, params.SBUF_ROTATION)
UNROLL = 2  # steps per loop iteration, each with its own tiles: a step's load does not wait for the copies of the
# step two before (two rotation buffers per allocation site, perf/params.py buffer_rotation)
MAX_COPIES = 64  # engine copies per step: more means runs too short for an engine instruction's fixed cost
ENGINES = ("gpsimd", "scalar", "vector")  # the copies in this order: loads and stores on two DMA streams

Order = tuple[str, ...]


@dataclass(frozen=True)
class Layout:
    batch: Order  # the shared leading dimensions (extent > 1)
    src: Order  # the other dimensions in X's order
    out: Order  # and in Y's
    cut: str  # the dimension cut into `parts` blocks ("" when none is)
    parts: int  # blocks of `cut`: partition b * parts + o holds block o of batch element b
    pb: int  # batch elements per step (pb * parts partitions)
    kept: Order  # the dimensions each engine copy moves whole (the same relative order in src and out)


def plan(src: Order, out: Order, ext: dict[str, int], itemsize: int, target: Target) -> Layout | None:
    """The layout for `Y[out] = X[src]` (each order the tensor's dimensions, `ext` their extents), or None when the
    permute keeps its last dimension (a DMA step moves whole rows), or no layout fits. Of the layouts whose two
    tiles fit STEP_BYTES, the one with the least estimated time (_step_ns), then the most partitions."""
    s, t = tuple(v for v in src if ext[v] > 1), tuple(v for v in out if ext[v] > 1)
    if not s or s[-1] == t[-1] or sorted(s) != sorted(t):
        return None
    k = next(i for i, (x, y) in enumerate(zip(s, t)) if x != y)
    batch, rs, ro = s[:k], s[k:], t[k:]
    bt, slice_n = math.prod(ext[v] for v in batch), math.prod(ext[v] for v in rs)
    from tilec.compiler.build_matvec import model_costs  # late: perf reads kernels
    costs, options = model_costs(), []
    for d in rs:
        for parts in (q for q in range(1, min(ext[d], target.pmax) + 1) if ext[d] % q == 0):
            if 2 * slice_n // parts * itemsize > STEP_BYTES:
                continue
            kept = _kept(rs, ro, {**ext, d: ext[d] // parts}, target.ap_free_dims)
            if kept is None:
                continue
            for pb in (b for b in range(1, target.pmax // parts + 1) if bt % b == 0):
                lay = Layout(batch, rs, ro, d if parts > 1 else "", parts, pb, kept)
                options.append((estimate_ns(lay, ext, itemsize, target, costs), -pb * parts, rs.index(d), lay))
    return min(options, key=lambda o: o[:3])[3] if options else None


def _run(order: Order, ext: dict[str, int], d: str, size: int) -> int:
    """Elements of a contiguous run of a slice of `order` whose dimension d is cut to `size`."""
    return size * math.prod(ext[v] for v in order[order.index(d) + 1:])


def estimate_ns(lay: Layout, ext: dict[str, int], itemsize: int, target: Target, costs=None) -> float:
    """The layout's time on the model: per step a load and a store on the DMA engines of its partitions
    (Costs.dma_transfer_ns, 8 partitions an engine) and the engine copies (each engine streams one element per
    partition per cycle at its clock, three engines, plus a fixed cost per copy); steps overlap, so the busier of the two, times the steps,
    plus one step's latency (its load's, its copies', its store's)."""
    if costs is None:
        from tilec.compiler.build_matvec import model_costs  # late: perf reads kernels
        costs = model_costs()
    d = lay.cut or lay.src[0]
    size = ext[d] // lay.parts
    P = lay.pb * lay.parts
    per = math.prod(ext[v] for v in lay.src) // lay.parts  # elements per partition
    engines = min(costs.n_dma, -(-P // costs.ppe))
    runs = [_run(order, ext, d, size) if lay.cut else per for order in (lay.src, lay.out)]  # (uncut: one run)
    dma = [costs.dma_transfer_ns(P * per // run, P * per * itemsize, engines) for run in runs]
    here = {**ext, d: size}
    copies = math.prod(here[v] for v in lay.src if v not in lay.kept)  # each with its engine's fixed cost
    n = math.prod(here[v] for v in lay.kept)
    copy = copies * (max(costs.min_ii, n) + costs.static["vector"]) / sum(getattr(target, f"{e}_ghz") for e in ENGINES)
    steps = math.prod(ext[v] for v in lay.batch) // lay.pb
    return steps * max(sum(dma), copy) + 2 * costs.dma_latency + copy


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


def build(found, hbm: dict, fresh, target: Target) -> tuple[list, list] | None:
    """The level-B statements of the copy nest `found` (rules_transpose._one_copy's: its loops, statement and
    read) when plan() lays it out, or permute_rows.wide_rows does, else None."""
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
    if lay is None:  # (a permute keeping its last dimension: HBM -> HBM rows on every DMA engine)
        rows = wide_rows(so, oo, ext, X, Y, stmt.line, fresh, target)
        return ([], rows) if rows is not None else None
    return [], _statements(lay, ext, X, Y, stmt.line, fresh, target)


def _statements(lay: Layout, ext: dict[str, int], X: ir.Buf, Y: ir.Buf, line: int, fresh, target: Target) -> list:
    bt = math.prod(ext[v] for v in lay.batch)
    size = ext[lay.cut] // lay.parts if lay.cut else 0
    here = {**ext, **({lay.cut: size} if lay.cut else {})}  # a partition's extents
    P, bv, steps = lay.pb * lay.parts, fresh("bt"), bt // lay.pb
    unroll = UNROLL if steps % UNROLL == 0 and steps > UNROLL else 1
    xv, s1 = _hbm_view(X, lay, lay.src, ext, fresh(f"{X.name}_r"), line)
    yv, s2 = _hbm_view(Y, lay, lay.out, ext, fresh(f"{Y.name}_r"), line)
    body: list = []
    for u in range(unroll):  # each step of the unrolled body its own tiles (allocation sites)
        load = ir.Buf(fresh(f"{X.name}_in"), "sbuf", X.dtype, (P,) + tuple(here[v] for v in lay.src))
        tile = ir.Buf(fresh(f"{Y.name}_out"), "sbuf", Y.dtype, (P,) + tuple(here[v] for v in lay.out))
        first = a(term(bv, lay.pb * unroll), u * lay.pb)
        body += [ir.Alloc(load, line=line), ir.Alloc(tile, line=line),
                 ir.Dma(ir.whole(load), _step_view(xv, lay, first), line)]
        body += _copies(lay, here, load, tile, line, target)
        body.append(ir.Dma(_step_view(yv, lay, first), ir.whole(tile), line))
    main = loop(bv, steps // unroll, body, line=line,
                note=f"{lay.pb * unroll} of the {bt} slices ({', '.join(lay.batch)}) per iteration")
    label = (f"{Y.name} = permute of {X.name} in SBUF: slices loaded in {X.name}'s order"
             + (f" ({lay.cut} in {lay.parts} blocks, one a partition)" if lay.cut else "")
             + f", interleaved by engine copies of [{', '.join(lay.kept)}], stored in {Y.name}'s order")
    return s1 + s2 + [ir.Block(label, tuple(main), line)]


def _hbm_view(T: ir.Buf, lay: Layout, order: Order, ext: dict[str, int], name: str, line: int
              ) -> tuple[ir.Buf, list]:
    """T seen as [batch, before, parts, rest]: the dimensions of `order` before the cut merged, the cut's blocks,
    a block of the cut with the dimensions after it merged (each merged part is contiguous in T, so a step's DMA
    walks at most four dimensions of T); [batch, slice] when nothing is cut."""
    bt = math.prod(ext[v] for v in lay.batch)
    if not lay.cut:
        return hbm_view(T, (bt, math.prod(ext[v] for v in order)), name, line)
    at = order.index(lay.cut)
    rest = ext[lay.cut] // lay.parts * math.prod(ext[v] for v in order[at + 1:])
    before = (math.prod(ext[v] for v in order[:at]),) if at else ()
    return hbm_view(T, (bt, *before, lay.parts, rest), name, line)


def _step_view(view: ir.Buf, lay: Layout, first: ir.Aff) -> ir.View:
    """A step's part of _hbm_view's view: batch elements first.., each block of the cut first (partition b * parts
    + o), then the rest (a permuted view when dimensions come before the cut: the HBM side of a DMA may be)."""
    idx = (sl(first, lay.pb),) + tuple(ir.full(n) for n in view.shape[1:])
    return ir.View(view, idx, (0, 2, 1, 3) if len(idx) == 4 else ())


def _copies(lay: Layout, here: dict[str, int], load: ir.Buf, tile: ir.Buf, line: int, t: Target) -> list:
    """One engine copy per combination of the dimensions outside `kept`, given to the engine that would finish it
    first (each streams an element per partition per cycle at its clock), in ENGINES' order."""
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
        out.append((ENGINES.index(eng), ir.Act(dst, src, "copy", line=line) if eng == "scalar" else
                    ir.Copy(dst, src, line, engine="gpsimd" if eng == "gpsimd" else "")))
    # grouped by engine: the loads issue on the stream of the first copy's engine, the stores on the last's
    # (perf/schedule.py "DMA trigger streams"), so the next step's loads do not wait behind this step's stores
    return [c for _, c in sorted(out, key=lambda x: x[0])]


ONE_STEP_MARGIN = 8  # a transpose step stays unless the estimate here is this many times below it (the estimates
# are rough: at 4 x 64 x 8 x 16 the transposes the tests expect are within it; NHWC's shuffle is 32x below)


def chosen(src: Order, out: Order, ext: dict, itemsize: int, target: Target, copy_only: bool = True) -> bool:
    """Whether the permute is laid out here rather than as select_permute's chain of steps through HBM
    intermediates, or its one step (a swap of runs, a pair swap) when that is ONE_STEP_MARGIN times slower:
    when plan()'s estimate is below theirs. `copy_only`: the statement is the copy alone (work on the way rides on a
    one-step transpose, permute_split). The chain search (seconds at rank 6) runs only when the estimate is not
    already below what any chain of two or more steps costs (select_permute.chain_floor_us)."""
    from tilec.compiler.select_permute import chain_floor_us, plan as chain_plan, step_us
    single = one_step(src, out)
    if single and not copy_only:
        return False
    ext = {v: int(n) for v, n in ext.items()}
    lay = plan(src, out, ext, itemsize, target)
    if lay is None:
        return False
    mine = estimate_ns(lay, ext, itemsize, target) / 1000
    if single:  # a swap of short runs after many batch elements (NHWC's channel shuffle, 6272 transposes of 4 x
        return mine * ONE_STEP_MARGIN < step_us(single, src, out, ext, itemsize)  # 64: 190x the floor as such)
    if mine < chain_floor_us(ext, itemsize):
        return True
    steps = chain_plan(src, out, ext, itemsize)
    if not steps:
        return True
    orders = [src] + [o for _, o in steps]
    return mine < sum(step_us(kind, x, y, ext, itemsize) for (kind, y), x in zip(steps, orders))
