"""Short rows broadcast over many (rows21): a per-channel scale and shift in NHWC, a linear layer's bias,

    for i in 0..M, c in 0..C:                      M = 25088, C = 128 (f32: 512 bytes a row)
      Y[i, c] = X[i, c] * g[c] + b[c]

The element-wise rule puts i on the partitions and c on the free axis, so every tile is 128 rows of C elements: at
C = 128 fp32, 196 loads and 196 stores of 64 KiB each, every one paying the DMA's fixed cost in turn (3.1x the
DMA floor on the model). Several rows per partition make each DMA k times larger: the output and the operands
read like it are viewed [M / k, k, C] (a contiguous tensor reshapes freely; the signature keeps its shape,
pipeline.build_kernel's views), and each row is first replicated k times into a small temporary, which the rule
then broadcasts as one row of k * C:

    for r in 0..k, c in 0..C:  g_rep[r, c] = g[c]            (and b_rep)
    for o in 0..M / k, r in 0..k, c in 0..C:
      Y[o, r, c] = X[o, r, c] * g_rep[r, c] + b_rep[r, c]

Done for a top-level perfect nest from 0 around one `=` statement storing a kernel output at its loop variables in
order, whose reads are either inputs indexed like the output (read nowhere else) or rows indexed by trailing loop
variables in order (at least one), nothing else; when the rows are at most half a tile (schedule.ELTWISE_FREE) and
some k leaves an even number of whole partition tiles (`_rows_per_partition`). Directives name the packed loops
(rewrite_names.py refuses the ones naming the loops as written)."""
from __future__ import annotations

import math
from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.lower import size_value, uses_names
from tilec.compiler.names import unique
from tilec.compiler.rewrite import nested, perfect_nest, resolved, taken_names
from tilec.compiler.schedule import ELTWISE_FREE
from tilec.lang import syntax as sx

PARTS = 128  # partitions of a tile


def split_short_rows(program):
    return views_rewritten(program, _one)


def _one(program, top: sx.Stmt, taken: set[str]):
    """(fills, the nest, declarations, {tensor: its view's shape}) for a nest to rewrite, else None."""
    found = _candidate(program, top)
    if found is None:
        return None
    loops, st, s, k = found
    fills, nest, decls, full = _rewritten(program, loops, st, s, k, taken)
    shape = (_outer(loops[:len(loops) - s], k), sx.Num(k)) + tuple(lp.stop for lp in loops[len(loops) - s:])
    return fills, nest, decls, {name: shape for name in full}


def views_rewritten(program, one):
    """Each top-level nest `one(program, top, taken)` rewrites -> (fills, nest, declarations, {tensor: shape}):
    the fills and the nest in its place, the tensors viewed with those shapes (`viewed`); the same object when
    `one` rewrites none (None for every nest). This rewrite's and channel_pack.py's."""
    kernel = program.kernel
    taken = taken_names(kernel) | _loop_vars(kernel.body)
    decls: list[sx.Decl] = []
    body: list[sx.Stmt] = []
    shapes: dict[str, tuple[sx.Expr, ...]] = {}
    for top in kernel.body:
        found = one(program, top, taken)
        if found is None:
            body.append(top)
            continue
        fills, nest, new_decls, viewed_as = found
        decls += new_decls
        body += fills + [nest]
        shapes.update(viewed_as)
    return viewed(program, decls, body, shapes) if shapes else program


def viewed(program, decls: list[sx.Decl], body: list[sx.Stmt], shapes: dict[str, tuple[sx.Expr, ...]]):
    """The program with `body` and the new declarations, each tensor of `shapes` declared with that shape: a view
    of its memory as it is (its signature keeps the shape: pipeline.build_kernel's views). Also channel_pack.py's."""
    kernel = program.kernel
    params = tuple(replace(p, type=replace(p.type, shape=shapes[p.name])) if p.name in shapes else p
                   for p in kernel.params)
    kept = tuple(replace(d, type=replace(d.type, shape=shapes[d.name])) if d.name in shapes else d
                 for d in kernel.decls)
    out = resolved(program, replace(kernel, params=params, decls=kept + tuple(decls), body=tuple(body)))
    views = {name: program.tensors[name].shape for name in shapes}
    return replace(out, views={**program.views, **views})


def _loop_vars(body: tuple[sx.Stmt, ...]) -> set[str]:
    return {st.var for st in body if isinstance(st, sx.Loop)} | \
        set().union(*(_loop_vars(st.body) for st in body if isinstance(st, sx.Loop)))


def output_nest(program, top: sx.Stmt, least: int) -> tuple[list[sx.Loop], sx.Assign] | None:
    """(loops, statement) of a top-level perfect nest of at least `least` loops from 0 around one `=` statement
    storing a kernel output (not already viewed) at its loop variables in order, reading no loop variable or size
    as a value; else None. The nests this rewrite and channel_pack.py view anew."""
    loops, st = perfect_nest(top)
    if len(loops) < least or not isinstance(st, sx.Assign) or st.op != "=" or \
            any(lp.start != sx.Num(0) for lp in loops):
        return None
    names = [lp.var for lp in loops]
    symbols = set(names) | set(program.sizes) | {lt.name for lt in program.kernel.lets}
    if uses_names(sx.map_reads(st.value, lambda a: sx.Num(0, a.span)), symbols):
        return None  # a loop variable or size read as a value (outside the indices): left as written
    out = st.target
    if out.tensor not in program.kernel.outputs or out.tensor in program.views or \
            [ix.id if isinstance(ix, sx.Name) else None for ix in out.indices] != names:
        return None
    return loops, st


def _candidate(program, top: sx.Stmt):
    """(loops, statement, rows' suffix length s, rows per partition k) when `top` is a nest to rewrite, else None."""
    found = output_nest(program, top, 2)
    if found is None:
        return None
    loops, st = found
    names, out = [lp.var for lp in loops], st.target
    suffix = 0
    for a in accesses(st.value):
        idx = [ix.id if isinstance(ix, sx.Name) else None for ix in a.indices]
        if a.fill is not None or a.tensor == out.tensor:
            return None
        if idx == names:
            if program.tensors[a.tensor].kind != "input" or a.tensor in program.views:
                return None
        elif 0 < len(idx) < len(names) and idx == names[len(names) - len(idx):]:
            suffix = max(suffix, len(idx))
        else:
            return None
    if not suffix:
        return None
    full = {out.tensor} | {a.tensor for a in accesses(st.value) if len(a.indices) == len(names)}
    if _used_elsewhere(program.kernel.body, top, full):
        return None
    ext = [size_value(lp.stop, program.sizes) for lp in loops]
    k = _rows_per_partition(math.prod(ext[:len(ext) - suffix]), math.prod(ext[len(ext) - suffix:]))
    return None if k is None else (loops, st, suffix, k)


def _rows_per_partition(M: int, R: int) -> int | None:
    """The most rows of R elements per partition (k of M) whose tiles, k * R elements, fit ELTWISE_FREE and that
    leave an even number (>= 4) of whole partition tiles: pair_tiles pipelines only those, and an unpipelined
    loop of larger tiles is slower than the pipelined short ones (model, 12544 x 256 fp32: k = 2 gives 49 tiles,
    86.97 us against 75.01 as written). None when there is no such k or the rows are long."""
    if 2 * R > ELTWISE_FREE:
        return None
    ks = [k for k in range(2, ELTWISE_FREE // R + 1) if M % k == 0 and (M // k) % (2 * PARTS) == 0
          and M // k >= 4 * PARTS]
    return max(ks, default=None)


def _used_elsewhere(body: tuple[sx.Stmt, ...], top: sx.Stmt, names: set[str]) -> bool:
    """Whether a statement other than `top` accesses one of `names` (their shapes change)."""
    def touched(st: sx.Stmt) -> set[str]:
        if isinstance(st, sx.Loop):
            return set().union(*(touched(c) for c in st.body)) if st.body else set()
        if isinstance(st, sx.Assign):
            return {st.target.tensor} | {a.tensor for a in accesses(st.value)}
        return set()
    return any(touched(st) & names for st in body if st is not top)


def _rewritten(program, loops: list[sx.Loop], st: sx.Assign, s: int, k: int, taken: set[str]):
    """(the rows' fill nests, the nest over [M / k, k, rows], the temporaries' declarations, the tensors viewed)."""
    span = st.span
    rows = loops[len(loops) - s:]
    o, r = unique(f"{loops[0].var}_o", taken), unique(f"{loops[0].var}_r", taken)
    taken |= {o, r}
    outer = [sx.Loop(o, sx.Num(0), _outer(loops[:len(loops) - s], k), (), span),
             sx.Loop(r, sx.Num(0), sx.Num(k), (), span)]
    at = tuple(sx.Name(v, span) for v in (o, r)) + tuple(sx.Name(lp.var, span) for lp in rows)
    fills: list[sx.Stmt] = []
    decls: list[sx.Decl] = []
    reps: dict[tuple, sx.Access] = {}

    def read(a: sx.Access) -> sx.Expr:
        if len(a.indices) == len(loops):
            return replace(a, indices=at)
        key = (a.tensor, a.indices)
        if key not in reps:
            name = unique(f"{a.tensor}_rep", taken)
            taken.add(name)
            shape = (sx.Num(k),) + tuple(lp.stop for lp in rows)  # (a shorter row widened to all of them)
            decls.append(sx.Decl(name, sx.TensorType(program.tensors[a.tensor].dtype, shape, span), span))
            rep = sx.Access(name, at[1:], span)
            fills.append(nested(sx.Assign(rep, "=", a, span), [outer[1], *rows]))
            reps[key] = rep
        return reps[key]
    value = sx.map_reads(st.value, read)
    nest = nested(sx.Assign(replace(st.target, indices=at), "=", value, span), [*outer, *rows])
    full = [st.target.tensor] + sorted({a.tensor for a in accesses(st.value) if len(a.indices) == len(loops)})
    return fills, nest, decls, full



def _outer(lead: list[sx.Loop], k: int) -> sx.Expr:
    """The extent of the outer loop, `(N * H * W) / k`, in the program's sizes (they stay the kernel's sizes)."""
    size = lead[0].stop
    for lp in lead[1:]:
        size = sx.BinOp("*", size, lp.stop, lp.span)
    return sx.BinOp("/", size, sx.Num(k), lead[0].span)
