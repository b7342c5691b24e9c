"""Data-layout primitives on level-A IR (compiler/nest.py), next to those of primitives.py: each is `Kernel ->
Kernel`, keeps the nest's meaning (tests/compiler/test_layout.py evaluates before and after) and checks its own
legality with one-line checks that raise a TilecError.

    reshape(k, "i", (("p", 128), ("f", 200)))   the iteration space of a perfect injective nest, and every buffer
                                                it accesses, seen with other extents (HBM views `X_v`): z[i] over
                                                25600 -> z_v[p, f] over 128 x 200
    stage_out(k, "Y", "t")                      TVM's cache_write: inside loop t, the region of Y the body writes
                                                goes to an on-chip buffer, copied out after the body
    broadcast(k, "s_row", "t", "p")             a row (one partition) read by every partition p: copied to a tile
                                                with the row on each partition (TensorE: ones[1, P].T @ row)
"""
from __future__ import annotations

import math
from dataclasses import replace

from tilec.compiler.ir import Aff, Term
from tilec.compiler.names import unique
from tilec.compiler.nest import (Access, Alloc, Assign, Buffer, Kernel, Load, Loop, Stmt, Update, loads, loop_index,
                                 map_loads, walk)
from tilec.compiler.primitives import (Region, _check_fits, _fail, _stores, _subst, _with_loop, copy_nest, find_loop,
                                      region, relocate, with_loop_many)
from tilec.errors import Span
from tilec.target import Target, target as get_target


# ---- reshape -------------------------------------------------------------------------------------------------------


def perfect_chain(loop: Loop) -> list[Loop]:
    """`loop` and the loops nested directly in it, outermost first."""
    chain = [loop]
    while len(chain[-1].body) == 1 and isinstance(chain[-1].body[0], Loop):
        chain.append(chain[-1].body[0])
    return chain


def _suffix(extents: list[int]) -> list[int]:
    """Products of the trailing extents: [N*M, M, 1] for [N, M] (the flat stride each loop starts at is the next)."""
    out = [1]
    for n in reversed(extents):
        out.insert(0, out[0] * n)
    return out


def reshape(k: Kernel, at: str, loops: tuple[tuple[str, int], ...], notes: tuple[str, ...] = (),
            lines: tuple[int, ...] = (), views: tuple[tuple[str, str], ...] = (), span: Span | None = None,
            groups: tuple[tuple[str, ...], ...] = (), view_line: int = 0, unit: bool = True,
            units: tuple[str, ...] = ()) -> Kernel:
    """The perfect nest at loop `at` iterated by `loops` (name, extent), outermost first, over the same elements in
    the same order; every buffer it accesses is seen through an HBM view `BUF_v` (golden: layout/reshape.txt):

        for i in serial(64):                           view Y_v: hbm f32[128, 512] = Y   (and X_v)
          for j in serial(1024):                       for p in serial(128):
            Y[i, j] = X[i, j] + 1                        for f in serial(512):
                                                           Y_v[p, f] = X_v[p, f] + 1

    Legal when every statement is an assignment, every access indexes a run of the nest's loops plainly and in
    order over whole dimensions (a broadcast operand reads a run of them), and each run starts and ends on a
    boundary of the new loops. A broadcast operand's view gets a unit dimension on the side the other loops are:
    b[i] of Y[i, j] -> b_v[p, 0] (a column), s[j] -> s_v[0, f] (a row). `notes` and `lines` give the new loops'
    comments and .tl lines (default: the line of the loop each starts in); `views` names the views (buffer, view;
    default BUF_v, or BUF_v2.. when that name is taken). `groups` says which old loops each new loop iterates
    (consecutive, outermost first; loops of extent 1 may be left out, and a new loop of extent 1 may iterate none:
    a unit dimension of every view, `s[i]` -> `s_v[e, 0]`): with loops of extent 1 the extents alone can leave
    that open (`[200, 1, 1]` -> `[200, 1]`: which unit loop remains?). `view_line`: the .tl line of
    the views (default the first statement's). `unit=False`: a broadcast operand's view gets no unit dimension
    (short rows: s[i] of A[i, j] over (p, g, f) is s_v[p, g], the result tile's own shape). `units`: new loops of
    extent 1 (of no old loop, with `groups`) that index a unit dimension of every view, in loop order (a column
    sum's epilogue over its row of sums: s[j] -> s_v[e_u, e_f], the view the reduction writes as s_v[0, f]; golden
    layout/reshape_units.txt)."""
    chain = perfect_chain(find_loop(k, at, span))
    old = [lp.extent for lp in chain]
    new = [n for _, n in loops]
    if math.prod(old) != math.prod(new):
        raise _fail(f"reshape {at}: {' x '.join(map(str, new))} iterations are not the nest's "
                    f"{' x '.join(map(str, old))}", span, "keep the product of the extents")
    body = tuple(s for s in chain[-1].body if isinstance(s, (Assign, Update)))  # an update: a reduction nest
    if len(body) != len(chain[-1].body):
        raise _fail(f"reshape {at}: the nest holds more than assignments", span, "reshape an element-wise nest")
    bufs = k.buffers()
    bounds = _bounds([lp.var for lp in chain], old, new, groups, span) if groups else None
    shapes = _views(body, [lp.var for lp in chain], old, new, bufs, span, bounds, unit, flip=True)
    names = [v for v, _ in loops]
    for u in units:
        if u not in names or new[names.index(u)] != 1 or (bounds is not None and groups[names.index(u)]):
            raise _fail(f"reshape {at}: units names {u}, not a new loop of extent 1 iterating no old loop", span,
                        "name a new loop of extent 1 whose group of old loops is empty")
        j = names.index(u)
        shapes = {b: (shape, lps) if j in lps else _with_unit(shape, lps, j) for b, (shape, lps) in shapes.items()}
    taken, given = set(bufs), dict(views)
    called = {b: given.get(b) or unique(f"{b}_v", taken) for b in shapes}
    chain_vars = [lp.var for lp in chain]

    def flipped(a: Access) -> set[int]:  # the new loops a reversed read indexes reversed (each of its runs')
        back: set[int] = set()
        runs = _runs(a, chain_vars, old, bufs, span, back)
        so, sn = _suffix(old), _suffix(new)
        return {j for x, y in runs if x in back for j in range(_boundary(x, so, sn), _boundary(y, so, sn))}
    new_body: tuple[Stmt, ...] = tuple(_rewrite(s, shapes, called, names, flipped, new) for s in body)
    for j in reversed(range(len(loops))):
        note = notes[j] if j < len(notes) else ""
        line = lines[j] if j < len(lines) else chain[_source(old, new, j)].line
        new_body = (Loop(names[j], new[j], new_body, "serial", line, note),)
    for b, (shape, _) in shapes.items():  # a view named after one that exists is that one (an epilogue's s_v)
        have = bufs.get(called[b])
        if have is not None and (have.view_of != b or have.shape != shape):
            raise _fail(f"reshape {at}: view {called[b]} exists with another shape or base than {b} as "
                        f"{list(shape)}", span, "name the view apart")
    allocs = tuple(Alloc(Buffer(called[b], "hbm", bufs[b].dtype, shape, view_of=b), view_line or body[0].line)
                   for b, (shape, _) in shapes.items() if called[b] not in bufs)
    top = next(i for i, s in enumerate(k.body) if s is chain[0] or any(x is chain[0] for x in walk((s,))))
    k = _with_loop(k, chain[0], lambda _: new_body[0])
    return replace(k, body=k.body[:top] + allocs + k.body[top:])


def _with_unit(shape: tuple[int, ...], loops: tuple["int | None", ...], j: int) -> "View":
    """A view with a unit dimension indexed by new loop j, placed in loop order among the dimensions."""
    at = next((n for n, x in enumerate(loops) if x is not None and x > j), len(loops))
    return shape[:at] + (1,) + shape[at:], loops[:at] + (j,) + loops[at:]


def _source(old: list[int], new: list[int], j: int) -> int:
    """The old loop the new loop j starts in (its line is the new loop's)."""
    so, sn = _suffix(old), _suffix(new)
    return max(m for m in range(len(old)) if so[m] >= sn[j])


View = tuple[tuple[int, ...], tuple["int | None", ...]]  # view shape; per dimension its new loop (None: a unit)


def _bounds(chain: list[str], old: list[int], new: list[int], groups: tuple[tuple[str, ...], ...], span
            ) -> list[int]:
    """Old loop boundary -> new loop boundary, from the old loops each new loop iterates."""
    bounds: list[int | None] = [None] * (len(chain) + 1)
    if len(groups) != len(new):
        raise _fail(f"reshape: {len(groups)} groups of loops for {len(new)} new loops", span)
    for g, group in enumerate(groups):
        if not group and new[g] == 1:  # a new unit loop iterating no old loop (an epilogue's column: s_v[e, 0])
            continue
        pos = [chain.index(v) if v in chain else -1 for v in group]
        if not pos or -1 in pos or pos != list(range(pos[0], pos[0] + len(pos))) or \
                math.prod(old[p] for p in pos) != new[g]:
            raise _fail(f"reshape: new loop {g} does not iterate the consecutive loops {', '.join(group)} of the nest",
                        span)
        bounds[pos[0]], bounds[pos[-1] + 1] = g, g + 1
    covered = {chain.index(v) for group in groups for v in group}
    if any(old[m] != 1 for m in range(len(chain)) if m not in covered) or \
            [b for b in bounds if b is not None] != sorted(b for b in bounds if b is not None):
        raise _fail("reshape: the groups leave out a loop of more than one iteration or are out of order", span)
    out, nxt = [0] * len(bounds), len(new)
    for m in reversed(range(len(bounds))):  # a left-out unit loop maps onto the boundary after it
        b = bounds[m]
        nxt = b if b is not None else nxt
        out[m] = nxt
    return out


def _views(body, chain: list[str], old: list[int], new: list[int], bufs: dict[str, Buffer], span,
           bounds: list[int] | None = None, unit: bool = True,
           flip: bool = False) -> dict[str, View]:
    """Buffer -> its view, ordered: operands indexed like the whole nest, the written buffers, then broadcast
    operands (columns, then rows). An access is a sequence of runs of the nest's loops (one run: an element-wise
    operand or a broadcast; several: a permute, Y[j, i] = X[i, j]); each run becomes the new loops it spans."""
    so, sn = _suffix(old), _suffix(new)
    found: dict[str, View] = {}
    order: dict[str, int] = {}
    for s in body:
        for acc, written in [(s.dst, True)] + [(a, False) for a in loads(s.expr)]:
            if not written and _constant(acc):  # the same element in every iteration: read as it is
                continue
            back: set[int] = set()
            runs = _runs(acc, chain, old, bufs, span, back, join=isinstance(s, Assign) and not written)
            for a, b in runs:
                if so[a] not in sn or so[b] not in sn:
                    raise _fail(f"reshape: `{acc.buf}` reads loops {', '.join(chain[a:b])}, which do not map onto "
                                f"whole loops of the new nest", span, "choose extents whose products meet at its run")
            full = sum(b - a for a, b in runs) == len(chain)  # every loop (in order, or permuted)
            view = _view(runs, full, so, sn, new, bounds, unit)
            if found.setdefault(acc.buf, view) != view:
                raise _fail(f"reshape: `{acc.buf}` is accessed through different loops", span)
            if back:  # the new loops a reversed run maps onto are each reversed: n-1-(p*F+f) = (P-1-p)*F + (F-1-f)
                if written or bounds is not None or not full:
                    raise _fail(f"reshape: `{acc.buf}` is reversed where only a full read may be", span)
                if not flip:
                    raise _fail(f"reshape: `{acc.buf}` is read reversed", span)
            last = max(b for _, b in runs)
            order.setdefault(acc.buf, 1 if written else 0 if full else 2 if last < len(chain) else 3)
    return {b: found[b] for b in sorted(found, key=lambda b: order[b])}


def _view(runs: list[tuple[int, int]], full: bool, so: list[int], sn: list[int], new: list[int],
          bounds: list[int] | None = None, unit: bool = True) -> View:
    """New loops of extent 1 at a broadcast run's edges stay out of its view (b[i] -> b_v[p, 0], not b_v[o, p, 0]
    with o of extent 1), and it gets a unit dimension on the side the other loops are; an operand indexed by every
    loop keeps them all."""
    spans: list[int] = []
    per_run: list[list[int]] = []
    for a, b in runs:
        if bounds is not None:  # the groups say which new loops each run spans (unit loops included)
            a2, b2 = bounds[a], bounds[b]
        elif full:
            a2, b2 = _boundary(a, so, sn), _boundary(b, so, sn)
        else:
            a2, b2 = len(sn) - 1 - sn[::-1].index(so[a]), sn.index(so[b])
        per_run.append(list(range(a2, b2)))
        spans += per_run[-1]
    if not spans:  # a broadcast run of one element (b[i], i < 1): a (1, 1) column
        return (1, 1), (None, None)
    loops: list[int | None] = list(spans)
    if len(runs) > 1 and not full and unit:  # new loops skipped between runs: a unit dimension there (s[o, f]
        loops = []                            # of A[o, r, f] -> s_v[o, 0, f], a row per o); a run of loops of
        for run in per_run:                   # one iteration spans no new loop: a unit dimension (c[u, j], U = 1)
            last = next((j for j in reversed(loops) if j is not None), None)
            gap = bool(run) and last is not None and run[0] > last + 1
            dims: list[int | None] = [None] if gap else []
            loops += dims + (list(run) if run else [None])
        loops = [j for n, j in enumerate(loops) if j is not None or n == 0 or loops[n - 1] is not None]
    if full and bounds is not None:  # new unit loops after the runs (groups of no old loop): unit dimensions
        loops += [None] * (len(new) - 1 - max(spans))
    if len(runs) == 1 and not full and unit:
        if spans[-1] + 1 < len(new):
            loops.append(None)
        elif spans[0] > 0:
            loops.insert(0, None)
    return tuple(1 if j is None else new[j] for j in loops), tuple(loops)


def _boundary(m: int, so: list[int], sn: list[int]) -> int:
    """The new loop boundary old boundary m maps to, for an operand indexed by every loop. Loops of extent 1 make
    several boundaries share one suffix product; such a group is paired with the new one from its inner end (the
    r-th last old boundary with the r-th last new one), so surplus old unit loops are the outer ones and map to no
    new loop, and surplus new unit loops join the run outside them: the runs of a permuted access still cover every
    new loop once, and a rule that drops an outer unit loop (a batch of 1) keeps its other loops' places."""
    if m == 0:
        return 0
    group = [x for x in range(len(so)) if so[x] == so[m]]
    slots = [x for x in range(len(sn)) if sn[x] == so[m]]
    return slots[max(0, len(slots) - len(group) + group.index(m))]


def _runs(acc: Access, chain: list[str], old: list[int], bufs: dict[str, Buffer], span,
          flipped: set[int] | None = None, join: bool = False) -> list[tuple[int, int]]:
    """The access as runs [(a, b), ..] of chain[a:b], one plain loop per dimension, over the whole buffer. A loop
    read reversed (`n - 1 - v`, v of extent n: a flip) goes in `flipped` (positions in the chain), and a run holds
    loops of one direction only."""
    names, back = [], set()
    extents = dict(zip(chain, old))
    for i in acc.index:
        way = loop_index(i, extents)
        if way is None:
            raise _fail(f"reshape: `{acc.buf}` is not indexed by plain loops of the nest", span,
                        "reshape a nest whose accesses use its loops as indices")
        names.append(way[0])
        if way[1]:
            back.add(chain.index(way[0]))
    pos = [chain.index(v) for v in names]
    if len(set(pos)) != len(pos) or list(bufs[acc.buf].shape) != [old[p] for p in pos]:
        raise _fail(f"reshape: `{acc.buf}` is not indexed by runs of the nest's loops over its whole shape", span)
    if back and pos != sorted(pos):
        raise _fail(f"reshape: `{acc.buf}` is read reversed and permuted", span)
    runs: list[tuple[int, int]] = []
    for p in pos:
        # with `join`, loops of one iteration the access does not index, between two it reads, do not split a run
        # (c[i, j] in a nest over [M, 1, N] reads the same elements as c[i, 0, j]); not for a reduction's target,
        # whose skipped loops are the reduced ones
        gap = range(runs[-1][1], p) if runs else range(0)
        joins = all(join and old[q] == 1 and q not in pos for q in gap)
        if runs and runs[-1][1] <= p and joins and ((runs[-1][1] - 1) in back) == (p in back):
            runs[-1] = (runs[-1][0], p + 1)
        else:
            runs.append((p, p + 1))
    if flipped is not None:
        flipped |= back
    return runs or [(0, 0)]


def _constant(acc: Access) -> bool:
    """A read of one element (no loop variable in its index: `c_v[0, 0]`, a one-element column laid out away)."""
    return bool(acc.index) and all(not i.terms for i in acc.index)


def _rewrite(s: Assign | Update, views: dict[str, View], called: dict[str, str], names: list[str],
             flipped=None, new: list[int] | None = None) -> Assign | Update:
    """`flipped(access)`: the new loops a read indexes reversed (a reshape of a nest with reversed reads)."""
    def index(j: int | None, back: set[int]) -> Aff:
        if j is None:
            return Aff()
        if new is not None and j in back:
            return Aff((Term(names[j], -1),), new[j] - 1)
        return Aff((Term(names[j]),))

    def access(a: Access) -> Access:
        if a.buf not in views and _constant(a):
            return a
        _, loops = views[a.buf]
        back = flipped(a) if flipped is not None and any(t.coef < 0 for i in a.index for t in i.terms) else set()
        return Access(called[a.buf], tuple(index(j, back) for j in loops))
    return replace(s, dst=access(s.dst), expr=map_loads(s.expr, access))


def merge_dims(k: Kernel, view: str, dim: int, span: Span | None = None) -> Kernel:
    """Dimensions `dim` and `dim + 1` of the HBM view `view` seen as one (row-major: the same bytes), every access
    `V[.., x, y, ..]` becoming `V[.., x*n + y, ..]` with n the second one's extent (golden: layout/merge_dims.txt):
    the view of o's stacked on the partitions, A_v[o, k, r, f] -> A_v[o, R*k + r, f], which a stage loads as one
    (K*R, TILE_F) tile (rules.colreduce). Legal for an HBM view (not its base: the kernel's signature keeps that)
    with at least two dimensions from `dim` on."""
    bufs = k.buffers()
    buf = bufs.get(view)
    if buf is None or buf.memory != "hbm" or not buf.view_of:
        raise _fail(f"merge_dims {view}: not an HBM view (reshape makes them)", span, "merge the dims of a view")
    if not 0 <= dim < len(buf.shape) - 1:
        raise _fail(f"merge_dims {view}, {dim}: {view} has {len(buf.shape)} dimensions; dimension {dim} has none "
                    f"after it", span, f"name a dimension below {len(buf.shape) - 1}")
    n = buf.shape[dim + 1]
    merged = replace(buf, shape=buf.shape[:dim] + (buf.shape[dim] * n,) + buf.shape[dim + 2:])

    def access(a: Access) -> Access:
        if a.buf != view:
            return a
        x, y = a.index[dim], a.index[dim + 1]
        one = Aff(tuple(replace(t, coef=t.coef * n, name="") for t in x.terms) + y.terms, x.const * n + y.const)
        return replace(a, index=a.index[:dim] + (one,) + a.index[dim + 2:])

    def visit(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        out: list[Stmt] = []
        for s in body:
            if isinstance(s, Loop):
                out.append(replace(s, body=visit(s.body)))
            elif isinstance(s, (Assign, Update)):
                out.append(replace(s, dst=access(s.dst), expr=map_loads(s.expr, access)))
            elif isinstance(s, Alloc) and s.buf.name == view:
                out.append(replace(s, buf=merged))
            else:
                out.append(s)
        return tuple(out)
    return replace(k, body=visit(k.body))


# ---- stage_out -----------------------------------------------------------------------------------------------------


def stage_out(k: Kernel, buf: str, at: str, memory: str = "sbuf", target: Target | str | None = None,
              span: Span | None = None, name: str = "", line: int = 0, dtype: str = "", cast: str = "",
              of: str = "") -> Kernel:
    """TVM's cache_write: inside loop `at`, the statements write the region of `buf` they cover into a new on-chip
    buffer, and one copy after them stores it (golden: layout/stage_out.txt). Legal when the loop reads `buf` only
    after a statement that writes it (an epilogue reading the finished value; reads before would see the old
    values; a read inside the statement of the first write comes after it in order: a column sum's factor on each
    PSUM bank's eviction), inside the region, and the region fits the target. `line`: the .tl line of the store
    (default the first write's; a reduction's store is tagged with its initial value's statement). `dtype`: the on-chip
    buffer's (default `buf`'s: an fp32 accumulator of a narrower output); `cast`: the name of a tile of `buf`'s
    dtype the value is copied into on chip before the store (the rounding on VectorE, not on the DMA; in SBUF: from
    PSUM, `memory="psum"`, it is the eviction). The on-chip buffer is allocated just before the first statement
    that writes it.

    `of`: only the nest at loop `of` (a statement of loop `at`'s body) is staged, its copy back right after it; the
    statements after it read `buf` itself (TVM's cache_write of one block). A column sum in PSUM copied into the
    SBUF row its epilogue works on (golden: layout/stage_out_of_nest.txt); `buf`'s own alloc, when it is the
    statement just before the nest, moves after it (it is first written by the copy back). `of="rt@a+rt@b"`: the
    consecutive nests of a cut loop, staged together (rules_colragged)."""
    if of:
        return _stage_out_of(k, buf, at, of, memory, target, span, name, line, dtype)
    t = get_target(target)
    loop = find_loop(k, at, span) if at else Loop("", 1, k.body)  # "": the whole kernel (stored at its end)
    writes = [s.dst for s in _stores(loop.body) if s.dst.buf == buf]
    if not writes:
        raise _fail(f"stage_out {buf} at {at}: loop {at} does not write {buf}", span)
    first_write = next(n for n, s in enumerate(loop.body) if any(x.dst.buf == buf for x in _stores((s,))))
    reads = [a for n, s in enumerate(loop.body) for x in _stores((s,)) for a in loads(x.expr) if a.buf == buf]
    inside = _stores(loop.body[first_write:first_write + 1])  # (a statement holding the first write: its reads
    upto = next(n for n, x in enumerate(inside) if x.dst.buf == buf)  # after that write, in order, are not early)
    early = [a for s in loop.body[:first_write] for x in _stores((s,)) for a in loads(x.expr) if a.buf == buf] + \
        [a for x in inside[:upto + 1] for a in loads(x.expr) if a.buf == buf]
    if early:
        raise _fail(f"stage_out {buf} at {at}: loop {at} reads {buf} before it writes it", span,
                    "stage it where it is only written, or read only after the statement writing it")
    inner = {s.var: s.extent for s in walk(loop.body) if isinstance(s, Loop)}
    box = region(writes, inner, f"stage_out {buf} at {at}", span, unit_loops=bool(reads))
    if reads and region(writes + reads, inner, f"stage_out {buf} at {at}", span, unit_loops=True) != box:
        raise _fail(f"stage_out {buf} at {at}: loop {at} reads {buf} outside the region it writes", span)
    source = k.buffers()[buf]
    _check_fits(box.shape, dtype or source.dtype, t, f"stage_out {buf} at {at}", span)
    staged = Buffer(name or f"{buf}_{memory}", memory, dtype or source.dtype, box.shape)
    first = next(s.line for s in _stores(loop.body) if s.dst.buf == buf)
    back: tuple[Stmt, ...] = (copy_nest(staged.name, buf, box, line or first, into=False),)
    if cast:  # staged -> a tile of buf's dtype (one copy), stored from there
        tile = Buffer(cast, "sbuf", source.dtype, box.shape)  # (out of PSUM: the eviction)
        whole = Region(tuple(Aff() for _ in box.shape), box.shape, tuple(range(len(box.shape))))
        back = (Alloc(tile, first), copy_nest(cast, staged.name, whole, first, into=True, prefix=cast),
                copy_nest(cast, buf, box, line or first, into=False))
    body = relocate(loop.body, buf, staged.name, box, reads=bool(reads), writes=True)
    body = body[:first_write] + (Alloc(staged, first),) + body[first_write:]  # allocated just before it is written
    if not at:
        return replace(k, body=body + back)
    return _with_loop(k, loop, lambda s: replace(s, body=body + back))


def _stage_out_of(k: Kernel, buf: str, at: str, of: str, memory: str, target: Target | str | None, span: Span | None,
                  name: str, line: int, dtype: str) -> Kernel:
    """stage_out(.., of=nest): see stage_out."""
    t = get_target(target)
    loop = find_loop(k, at, span)
    vars_ = of.split("+")
    pos = next((n for n, s in enumerate(loop.body) if isinstance(s, Loop) and s.var == vars_[0]), None)
    nests = loop.body[pos:pos + len(vars_)] if pos is not None else ()
    if pos is None or [getattr(s, "var", None) for s in nests] != vars_:
        what = "a loop" if len(vars_) == 1 else "a run of loops"
        raise _fail(f"stage_out {buf} at {at}, of {of}: {of} is not {what} directly in the body of {at}", span,
                    f"name a nest inside loop {at}")
    writes = [s.dst for s in _stores(nests) if s.dst.buf == buf]
    if not writes:
        raise _fail(f"stage_out {buf} at {at}, of {of}: the nest at {of} does not write {buf}", span)
    if any(a.buf == buf for s in _stores(nests) for a in loads(s.expr)):
        raise _fail(f"stage_out {buf} at {at}, of {of}: the nest at {of} reads {buf} (other than accumulating into "
                    f"it)", span, "stage a nest that only writes or accumulates into it")
    inner = {s.var: s.extent for s in walk(nests) if isinstance(s, Loop)}
    box = region(writes, inner, f"stage_out {buf} at {at}", span)
    source = k.buffers()[buf]
    _check_fits(box.shape, dtype or source.dtype, t, f"stage_out {buf} at {at}", span)
    staged = Buffer(name or f"{buf}_{memory}", memory, dtype or source.dtype, box.shape)
    first = next(s.line for s in _stores(nests) if s.dst.buf == buf)
    back = copy_nest(staged.name, buf, box, line or first, into=False)
    moved = relocate(nests, buf, staged.name, box, reads=False, writes=True)
    before = list(loop.body[:pos])
    own = before[-1:] if before and isinstance(before[-1], Alloc) and before[-1].buf.name == buf else []
    body = tuple(before[:len(before) - len(own)]) + (Alloc(staged, first),) + moved + tuple(own) + (back,) + \
        loop.body[pos + len(vars_):]
    return _with_loop(k, loop, lambda s: replace(s, body=body))


# ---- broadcast -----------------------------------------------------------------------------------------------------


def broadcast(k: Kernel, buf: str, at: str, part: str, target: Target | str | None = None,
              span: Span | None = None, name: str = "", dtype: str = "f32", others: tuple[str, ...] = ()
              ) -> Kernel:
    """A row `buf` (an on-chip buffer of one partition, read at [0, ..]) read in every iteration of the partition
    loop `part`: inside loop `at` ("" for the whole kernel), a tile holds the row on each partition and the body
    reads that instead (golden: layout/broadcast.txt). The fill is inserted after the copy that loads `buf`.
    Legal when `buf` has one partition and the region fits the target. `others`: partition loops of no more
    partitions (the last part of a cut) that read the same tile at their own partitions."""
    t = get_target(target)
    loop = find_loop(k, at, span) if at else Loop("", 1, k.body)
    p = find_loop(k, part, span)
    reads = [a for s in _stores(loop.body) for a in loads(s.expr) if a.buf == buf]
    if not reads or k.buffers()[buf].shape[0] != 1 or any(a.index[0] != Aff() for a in reads):
        raise _fail(f"broadcast {buf}: it must be a row (one partition) read inside {at or 'the kernel'}", span)
    inner = {s.var: s.extent for s in walk(loop.body) if isinstance(s, Loop)}
    box = region(reads, inner, f"broadcast {buf}", span)
    row = Region(box.offsets, box.extents, box.kept[1:])  # the tile's free dimensions: the row's, past its partition
    shape = (p.extent,) + row.shape
    _check_fits(shape, dtype, t, f"broadcast {buf}", span)
    tile = Buffer(name or f"{buf}_bcast", "sbuf", dtype, shape)
    line = next(s.line for s in _stores(loop.body) if any(a.buf == buf for a in loads(s.expr)))
    fill = _fill(tile, buf, row, p.extent, line)
    body = relocate(loop.body, buf, tile.name, row, lead=(Aff((Term(p.var),)),))
    for q in others:
        if find_loop(k, q, span).extent > p.extent:
            raise _fail(f"broadcast {buf}: loop {q} has more partitions than {part}", span)
        body = _reindexed(body, q, p.var)
    written = next((i for i, s in enumerate(body) if any(st.dst.buf == buf for st in _stores((s,)))), -1)
    body = body[:written + 1] + (Alloc(tile, line), fill) + body[written + 1:]
    if not at:
        return replace(k, body=body)
    return _with_loop(k, loop, lambda s: replace(s, body=body))


def _reindexed(body: tuple[Stmt, ...], q: str, var: str) -> tuple[Stmt, ...]:
    """The body with `var` read as loop q's variable inside loop q."""
    def visit(s: Stmt) -> Stmt:
        if not isinstance(s, Loop):
            return s
        if s.var == q:
            return replace(s, body=_subst(s.body, var, Aff((Term(q),))))
        return replace(s, body=tuple(visit(x) for x in s.body))
    return tuple(visit(s) for s in body)


def _fill(tile: Buffer, row: str, box: Region, parts: int, line: int) -> Stmt:
    """for c0 in partition(P): for c1..: tile[c0, c1..] = row[0, o1 + c1, ..] (every partition gets the row)."""
    names = [f"{tile.name}_c{n + 1}" for n in range(len(box.kept))]
    dst = Access(tile.name, (Aff((Term(f"{tile.name}_c0"),)),) + tuple(Aff((Term(v),)) for v in names))
    src = Access(row, tuple(box.offsets[d].plus(Aff((Term(names[box.kept.index(d)]),))) if d in box.kept
                            else box.offsets[d] for d in range(len(box.offsets))))
    fill: Stmt = Assign(dst, Load(src), line)
    for v, n in reversed(list(zip(names, box.shape))):
        fill = Loop(v, n, (fill,), "serial", line)
    return Loop(f"{tile.name}_c0", parts, (fill,), "partition", line)


# ---- staging with a chosen layout ----------------------------------------------------------------------------------


def stage_grouped(k: Kernel, buf: str, at: str, groups: tuple[tuple[str, ...], ...], into: bool = True,
                  target: Target | str | None = None, span: Span | None = None, name: str = "",
                  dtype: str = "", memory: str = "sbuf", like: str = "", unlike: str = "") -> Kernel:
    """Like stage (into=True: what the body reads of `buf`) or stage_out (into=False: what it writes), but the copy's
    dimensions are `groups` of the loops inside `at`, each group's loops flattened in order (golden:
    layout/stage_grouped.txt). A transpose strip `X[bi*256 + ai*128 + i_i, j]` staged with groups (i_i), (ai), (j)
    is X_strip[128, 2, N]: the rows of each 128-block on the partitions. A group whose rows share a dimension of
    `buf` with another group becomes a loop around the copy (one DMA per block row). Legal when the body accesses
    `buf` one way only and each group's loops step through that dimension contiguously (`ai*128 + i_i`). With
    `like` (a buffer the loop writes), only the read of `buf` at the indices of that write is staged (`X[i, j]` of
    `X[i, j] + X[j, i]`, like the output's); with `unlike`, only the others (`X[j, i]`)."""
    t = get_target(target)
    loop = find_loop(k, at, span)
    stores = _stores(loop.body)
    found = [s.dst for s in stores if s.dst.buf == buf] if not into else \
        [a for s in stores for a in loads(s.expr) if a.buf == buf]
    if like or unlike:
        same = lambda a: any(s.dst.buf == (like or unlike) and s.dst.index == a.index for s in stores)  # noqa: E731
        found = [a for a in found if same(a) == bool(like)]
    what = f"stage {buf} at {at}"
    if not found or any(a != found[0] for a in found):
        raise _fail(f"{what}: loop {at} must access {buf}, one way only", span)
    if (not into and any(a.buf == buf for s in stores for a in loads(s.expr))) or \
            (into and any(s.dst.buf == buf for s in stores)):
        raise _fail(f"{what}: loop {at} both reads and writes {buf}", span)
    inner = {s.var: s for s in walk(loop.body) if isinstance(s, Loop)}
    acc = found[0]
    dims = [_group_dim(acc, g, inner, what, span) for g in groups]
    shape = tuple(math.prod(inner[v].extent for v in g) for g in groups)
    source = k.buffers()[buf]
    _check_fits(shape, dtype or source.dtype, t, what, span)
    staged = Buffer(name or f"{buf}_{memory}", memory, dtype or source.dtype, shape)
    local = Access(staged.name, tuple(_group_index(acc, g, inner) for g in groups))
    line = next(s.line for s in stores if s.dst == acc or acc in loads(s.expr))
    copy = _grouped_copy(acc, local, groups, dims, inner, into, line)
    body = _replace_access(loop.body, acc, local)
    new_body = (Alloc(staged, line), copy) + body if into else (Alloc(staged, line),) + body + (copy,)
    return _with_loop(k, loop, lambda s: replace(s, body=new_body))


def _group_dim(acc: Access, group: tuple[str, ...], inner: dict[str, Loop], what: str, span) -> int:
    """The one dimension of `acc` the group's loops index, checking they step through it contiguously."""
    where = {d for d, i in enumerate(acc.index) for t in i.terms if t.var in group}
    if len(where) != 1:
        raise _fail(f"{what}: loops {', '.join(group)} must index one dimension of {acc.buf}", span)
    d = where.pop()
    coef = {t.var: t.coef for t in acc.index[d].terms}
    step = coef.get(group[-1], 0)
    for v, nxt in zip(group, group[1:]):
        if coef.get(v) != coef.get(nxt, 0) * inner[nxt].extent or not step:
            raise _fail(f"{what}: loops {', '.join(group)} do not step through {acc.buf} contiguously", span)
    return d


def _group_index(acc: Access, group: tuple[str, ...], inner: dict[str, Loop]) -> Aff:
    """The group's position in the staged copy: its loops flattened (their terms over the innermost's step)."""
    d = next(d for d, i in enumerate(acc.index) if any(t.var in group for t in i.terms))
    terms = [next(t for t in acc.index[d].terms if t.var == v) for v in group]
    step = terms[-1].coef
    return Aff(tuple(Term(t.var, t.coef // step, t.name if step == 1 else "") for t in terms))


def _grouped_copy(acc: Access, local: Access, groups, dims: list[int], inner: dict[str, Loop], into: bool,
                  line: int) -> Stmt:
    """The copy between `acc`'s region and the staged buffer: one copy variable per group (a single loop's group
    keeps that loop's name, comment and line). Groups that share a dimension of the buffer with an earlier group
    are loops around the copy; the first group is the partitions."""
    around = [n for n in range(1, len(groups)) if dims.count(dims[n]) > 1]
    inside = [n for n in range(len(groups)) if n not in around]
    names = [groups[n][0] if n in around else f"{local.buf}_c{n}" for n in range(len(groups))]
    extents = [math.prod(inner[v].extent for v in g) for g in groups]
    by = {}
    for n, g in enumerate(groups):
        last = next(t for t in acc.index[dims[n]].terms if t.var == g[-1])
        first = next(t for t in acc.index[dims[n]].terms if t.var == g[0])
        by[n] = Term(names[n], last.coef, first.name if len(g) == 1 else "")
    index = []
    for d, i in enumerate(acc.index):
        keep = tuple(t for t in i.terms if t.var not in inner)
        index.append(Aff(keep + tuple(by[n] for n in range(len(groups)) if dims[n] == d), i.const))
    whole = Access(acc.buf, tuple(index))
    mine = Access(local.buf, tuple(Aff((Term(v),)) for v in names))
    copy: Stmt = Assign(mine, Load(whole), line) if into else Assign(whole, Load(mine), line)
    for n in reversed(inside):
        copy = Loop(names[n], extents[n], (copy,), "partition" if n == 0 else "serial", line)
    for n in reversed(around):
        src = inner[groups[n][0]]
        copy = Loop(names[n], extents[n], (copy,), "serial", src.line, src.note)
    return copy


def _replace_access(body: tuple[Stmt, ...], old: Access, new: Access) -> tuple[Stmt, ...]:
    def swap(a: Access) -> Access:
        return new if a == old else a

    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Loop):
            out.append(replace(s, body=_replace_access(s.body, old, new)))
        elif isinstance(s, (Assign, Update)):  # (an update's value: a column sum's matmul reads the staged tile)
            out.append(replace(s, dst=swap(s.dst), expr=map_loads(s.expr, swap)))
        else:
            out.append(s)
    return tuple(out)


# ---- cut (index-set splitting) -------------------------------------------------------------------------------------


def cut(k: Kernel, var: str, at: int, root: str = "", span: Span | None = None) -> Kernel:
    """Index-set splitting with distribution: the perfect nest from loop `root` (default: `var` itself) down to
    `var` becomes two nests, the first over var < at, the second over the rest (var = at + var'); every loop of the
    first is renamed NAME@a, of the second NAME@b (golden: layout/cut.txt). A transpose of 521 rows is 512 rows in
    blocks of 128 and one block of 9. Legal when 0 < at < the extent and either `var` is the root (the iterations
    keep their order: a reduction's loop may be cut) or every store indexes each loop from the root down to `var`
    (each iteration of those loops writes its own elements, so their two parts may run apart; the loops inside
    `var` keep their order: a column sum's kept columns may be cut outside its reduced rows)."""
    loop = find_loop(k, var, span)
    top = find_loop(k, root, span) if root else loop
    chain = perfect_chain(top)
    if not any(lp is loop for lp in chain):
        raise _fail(f"cut {var}: loop {var} is not in the perfect nest under {root}", span)
    if not 0 < at < loop.extent:
        raise _fail(f"cut {var}, {at}: cut inside the loop's extent 1..{loop.extent - 1}", span)
    # cutting the root loop itself keeps the order of every iteration (index-set splitting): always legal, a
    # reduction's too; cutting a loop inside it distributes the loops above it, legal for an injective nest
    above = {lp.var for lp in chain[:next(n for n, lp in enumerate(chain) if lp is loop) + 1] if lp.extent > 1}
    for s in _stores((top,)) if top is not loop else []:
        used = {t.var for i in s.dst.index for t in i.terms}
        if not above <= used:
            raise _fail(f"cut {var}: `{s.dst.buf}` is not written once per iteration of the nest", span,
                        "cut an injective (element-wise or copy) nest")
    names = [s.var for s in walk((top,)) if isinstance(s, Loop)]
    part = lambda tag: {v: v + ("" if "@" in v else "@") + tag for v in names}  # noqa: E731
    first = _renamed(top, part("a"), {loop.var: (at, 0)})
    second = _renamed(top, part("b"), {loop.var: (loop.extent - at, at)})
    return with_loop_many(k, top, (first, second))


def _renamed(top: Loop, names: dict[str, str], extents: dict[str, tuple[int, int]]) -> Loop:
    """The nest with its loops renamed; a loop in `extents` gets (extent, offset): var = offset + var'."""
    def visit(s: Stmt) -> Stmt:
        if not isinstance(s, Loop):
            return s
        body = tuple(visit(x) for x in s.body)
        extent, offset = extents.get(s.var, (s.extent, 0))
        body = _subst(body, s.var, Aff((Term(names[s.var]),), offset))
        return replace(s, var=names[s.var], extent=extent, body=body)
    out = visit(top)
    assert isinstance(out, Loop)
    return out


