"""A contraction over several reduced loops that every operand indexes as one run of trailing-in-order dimensions,

    G[n, c, d] += F[n, c, h, w] * F[n, d, h, w] / (C * H * W)        # style loss's Gram matrix of channels

is one contraction over their product (h, w as l in 0..H * W), which the batched-matmul rules map (they take one
reduced dimension per operand, the convolution's windows aside). A contiguous input reshapes freely: each operand
is declared with the run merged and the kernel views the input so (`F_v = F.reshape(..)`, pipeline.build_kernel;
`Program.views` keeps the signature's shape, as view_split's). Done when every operand reading a reduced variable is
an input read at plain loop variables, with the reduced ones as a run in the loops' order over whole dimensions,
and every other access of that input in the program is such a run of the same dimensions; the same object when
there is none."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.lower import size_value
from tilec.compiler.names import unique
from tilec.compiler.reduce_split import index_vars
from tilec.compiler.rewrite import perfect_nest, resolved, taken_names
from tilec.compiler.scale_split import _factors
from tilec.lang import syntax as sx

Run = tuple[int, int]  # the first merged dimension and the number merged


def merge_reduced_runs(program):
    kernel = program.kernel
    inputs = {p.name for p in kernel.params}
    found: dict[int, tuple[list[sx.Loop], dict[str, Run]]] = {}
    for n, top in enumerate(kernel.body):
        got = _contraction_runs(top, inputs, program)
        if got is not None:
            found[n] = got
    runs: dict[str, Run] = {}
    for _, tensors in found.values():
        for name, run in tensors.items():
            if runs.setdefault(name, run) != run:
                return program
    if not runs or any(_read_elsewhere(kernel.body[n], runs) for n in range(len(kernel.body)) if n not in found):
        return program
    taken = taken_names(kernel)
    body = list(kernel.body)
    for n, (reduced, _) in found.items():
        var = unique("".join(lp.var for lp in reduced), taken)
        taken.add(var)
        body[n] = _merged_nest(body[n], reduced, var, runs)
    params = tuple(replace(p, type=replace(p.type, shape=_merged_shape(p.type.shape, runs[p.name])))
                   if p.name in runs else p for p in kernel.params)
    out = resolved(program, replace(kernel, params=params, body=tuple(body)))
    return replace(out, views={**program.views, **{name: program.tensors[name].shape for name in runs}})


def _contraction_runs(top: sx.Stmt, inputs: set[str], program):
    """(the reduced loops, {input: its run}) of a top-level `for ..: T = init; for r1, r2..: T += e` with two or more
    reduced loops from 0 that every read of e indexing them reads as a run, or None."""
    outer, last = perfect_nest(top)
    if not outer or not isinstance(last, sx.Loop) or len(last.body) != 2:
        return None
    init, k_nest = last.body
    reduced, update = perfect_nest(k_nest)
    if len(reduced) < 2 or not isinstance(update, sx.Assign) or update.op != "+=" \
            or not isinstance(init, sx.Assign) or init.target != update.target:
        return None
    factors = [f for _, f in _factors(update.value, "*") if accesses(f)]
    if len(factors) != 2 or not all(isinstance(f, sx.Access) for f in factors):
        return None  # (a sum of one tensor over a run, a pool: the reduction rules take the run as it is)
    if any(a.tensor in inputs for a in accesses(init.value)):
        return None  # (the start keeps its reads whole: an input it reads is left unmerged)
    names = [lp.var for lp in reduced]
    stops = [size_value(lp.stop, program.sizes) for lp in reduced]
    runs: dict[str, Run] = {}
    for acc in accesses(update.value):
        if not set(names) & index_vars(acc):
            continue
        ids = [ix.id if isinstance(ix, sx.Name) else None for ix in acc.indices]
        run = _run(acc, ids, names, stops, program)
        if run is None or acc.tensor not in inputs or runs.setdefault(acc.tensor, run) != run:
            return None
    return (reduced, runs) if runs else None


def _run(acc: sx.Access, ids: list[str | None], names: list[str], stops: list[int], program) -> Run | None:
    """Where acc reads the reduced variables as consecutive whole dimensions in the loops' order."""
    if acc.fill is not None or None in ids or names[0] not in ids:
        return None
    first = ids.index(names[0])
    shape = [d if isinstance(d, int) else size_value(d, program.sizes) for d in program.tensors[acc.tensor].shape]
    if ids[first:first + len(names)] != names or list(shape[first:first + len(names)]) != stops:
        return None
    return first, len(names)


def _read_elsewhere(top: sx.Stmt, runs: dict[str, Run]) -> bool:
    """Some statement outside the merged contractions accesses a merged input."""
    if isinstance(top, sx.Loop):
        return any(_read_elsewhere(c, runs) for c in top.body)
    assert isinstance(top, sx.Assign)
    return any(a.tensor in runs for a in accesses(top.value)) or top.target.tensor in runs


def _merged_nest(top: sx.Stmt, reduced: list[sx.Loop], var: str, runs: dict[str, Run]) -> sx.Stmt:
    if top is reduced[0]:
        _, update = perfect_nest(top)
        assert isinstance(update, sx.Assign)
        stop: sx.Expr = reduced[0].stop
        for lp in reduced[1:]:
            stop = sx.BinOp("*", stop, lp.stop, lp.span)
        value = _merged_expr(update.value, var, runs)
        return sx.Loop(var, sx.Num(0), stop, (replace(update, value=value),), reduced[0].span)
    if not isinstance(top, sx.Loop):
        return top  # (the start)
    return replace(top, body=tuple(_merged_nest(c, reduced, var, runs) for c in top.body))


def _merged_expr(e: sx.Expr, var: str, runs: dict[str, Run]) -> sx.Expr:
    def read(a: sx.Access) -> sx.Expr:
        if a.tensor not in runs:
            return a
        first, n = runs[a.tensor]
        return replace(a, indices=a.indices[:first] + (sx.Name(var, a.span),) + a.indices[first + n:])
    return sx.map_reads(e, read)


def _merged_shape(shape: tuple[sx.Expr, ...], run: Run) -> tuple[sx.Expr, ...]:
    first, n = run
    merged = shape[first]
    for d in shape[first + 1:first + n]:
        merged = sx.BinOp("*", merged, d, d.span)
    return shape[:first] + (merged,) + shape[first + n:]
