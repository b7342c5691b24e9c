"""Selection of reductions along the trailing dimensions of one tensor (the building block of softmax/layernorm):

    s[i] = 0;        s[i] += A[i, j]            row sums (also `A[i, j] / N`, `A[i, j] * 0.5`: a mean)
    m[b, i] = -inf;  m[b, i] max= A[b, i, j]    row maxima (min= likewise), kept indices flattened onto rows
    s[i] = bias[i];  s[i] += A[i, j]            an initial value indexed like the output
    s[i] = 0;        s[i] += X[i, j] * X[i, j]  an element-wise expression of tensors read at the same element

The output keeps the leading indices of the input in order; the reduced loops index the trailing ones. Anything
else that reduces whole dimensions (leading or middle dimensions) is a TilecError naming this form.
"""
from __future__ import annotations

import math

from tilec.compiler.exprs import accesses, const_value, fmt_expr, strip_scale
from tilec.compiler.lower import Comp
from tilec.compiler.ops import ColumnReduceOp, ReduceOp, index_maps, plain, reject
from tilec.compiler.reduce_split import same_width
from tilec.compiler.select_eltwise import check_expr as _check_expr
from tilec.errors import TilecError
from tilec.lang import syntax as sx
from tilec.lang.functions import ACCUMULATE

_HINT = ("supported: a reduction of a run of indices of tensors into an output indexed by the others in order, "
         "`s[i] += A[i, j]` or a column sum `s[j] += A[i, j]`, with a constant factor `A[i, j] / N` or an "
         "element-wise expression of tensors read at the same element, `(A[i, j] - B[i, j]) * (A[i, j] - B[i, j])`; "
         "max= and min= likewise; starting from a constant or a tensor indexed like the output")


def is_row_reduction(comp: Comp, program) -> bool:
    """A reduction whose one read has more indices than the output: it reduces whole dimensions (not windows)."""
    if comp.red_op not in ACCUMULATE or comp.update is None:
        return False
    reads = accesses(comp.update)
    # a contraction's moving operand (X in conv, B in a matmul) always has the output's rank: when every read has
    # more indices than the output, no matmul/conv mapping exists and the statement is (at most) a row reduction
    rows = column_rows(comp, program)  # (rows read by a column sum: staged and broadcast by its rule)
    full = [a for a in reads if a not in rows]
    return len(full) >= 1 and all(len(a.indices) + len(_unit_rows(comp, a, program)) > len(comp.out_vars)
                                  for a in full)


def _unit_rows(comp: Comp, a: sx.Access, program) -> list[str]:
    """The output's leading loops of one iteration a read does not index (`s[z] += a[i] * b[i]`, z in 0..1, of
    reduce_split's dot product): the read is one row along them. Only where build_longrows lays that row over the
    partitions (few_long_rows: long, a reduced expression, a constant start); [] otherwise."""
    from tilec.compiler.build_longrows import few_long_rows
    names = {plain(m) for m in index_maps(a, comp, program)}
    lead = []
    for v in comp.out_vars:
        if v in names or comp.extent(v) != 1:
            break
        lead.append(v)
    if not lead or comp.update is None or comp.init is None:
        return []
    F = math.prod(comp.extent(v) for v in comp.red_vars)
    tensor_init = isinstance(comp.init, sx.Access)
    taken = few_long_rows(1, F, program.tensors[a.tensor].dtype, isinstance(comp.update, sx.Access), tensor_init)
    return lead if taken is not None else []


def column_rows(comp: Comp, program) -> list[sx.Access]:
    """The rows of a column sum reading them, `s[j] += abs(X[i, j] - c[j])` (reduce_split.column_rows left it
    whole): the f32 reads indexed by the output's indices in order, when every other read is an f32 tensor over all
    the loops with those indices trailing (no kept index before the reduced run); [] otherwise."""
    if comp.red_op != "+=" or comp.update is None or not comp.out_vars:
        return []
    reads = accesses(comp.update)
    names = lambda a: [plain(m) for m in index_maps(a, comp, program)]  # noqa: E731
    out, n = list(comp.out_vars), len(comp.out_vars)
    rows = [a for a in reads if names(a) == out]
    full = [a for a in reads if a not in rows]
    dtypes = {program.tensors[a.tensor].dtype for a in reads}
    if not rows or not full or not same_width(dtypes, program.tensors[comp.target].dtype):
        return []
    if comp.init is not None and {a.tensor for a in rows} & {a.tensor for a in accesses(comp.init)}:
        return []  # (reduce_split.column_rows split it: a row that is also the initial value)
    if any(len(a.indices) != len(comp.extents) or names(a)[-n:] != out or set(names(a)[:-n]) != set(comp.red_vars)
           for a in full):
        return []
    return rows


def _widened(comp: Comp, src: sx.Expr, program) -> sx.Expr:
    """`m[i] max= f32(X[i, j])` of a 16-bit X reduced as `X[i, j]`: widening is exact and keeps the order, so the
    max of the converted values is the converted max, and the reduction reads the tiles as loaded (a tensor_copy per
    tile less on VectorE: rowrange_bf16 4096 x 4096 564.5 -> see docs/notes/cols17.md). Sums keep the conversion
    (they add in the wider type)."""
    if comp.red_op in ("max=", "min=") and isinstance(src, sx.Call) and src.fn == "f32" and len(src.args) == 1:
        x = src.args[0]
        if isinstance(x, sx.Access) and program.tensors[x.tensor].dtype in ("bf16", "f16"):
            return x
    return src


def _reject(comp: Comp, why: str, span=None) -> TilecError:
    return reject(comp, why, span, _HINT)


def select_reduce(comp: Comp, program) -> ReduceOp:
    assert comp.update is not None and comp.red_op is not None  # is_row_reduction(comp) chose this path
    src, scale = strip_scale(comp.update, program.sizes)
    if scale != 1.0 and comp.red_op != "+=":
        src, scale = comp.update, 1.0  # `m[i] max= X[i, j] / T`: the scaled values are the reduced expression
    src = _widened(comp, src, program)
    reads = accesses(src)
    if not reads:
        raise _reject(comp, f"`{fmt_expr(comp.update)}` reads no tensor", comp.update.span)
    if not isinstance(src, sx.Access):
        _check_expr(comp, src)  # an element-wise expression, reduced: computed per tile, then tensor_reduce
    rows = column_rows(comp, program)
    reads = [a for a in reads if a not in rows] + rows  # the first read is over all the loops
    before, reduced, after = _split_indices(comp, reads[0], program)
    for other in reads[1:len(reads) - len(rows)]:
        if _split_indices(comp, other, program) != (before, reduced, after):
            raise _reject(comp, f"`{fmt_expr(other)}` must be indexed like `{fmt_expr(reads[0])}`: every tensor "
                                f"of a reduced expression is read at the same element", other.span)
    init, ext = _init(comp, program), comp.extent
    size = lambda vs: math.prod(ext(v) for v in vs)  # noqa: E731
    inputs = tuple(dict.fromkeys(a.tensor for a in reads))
    expr = None if isinstance(src, sx.Access) else src
    rest = (init, scale, comp.line, comp.span, comp.lines, comp.update_line or comp.line, expr,
            inputs if expr is not None else ())
    if not after:  # the reduced dimensions are the trailing ones: rows on the partitions
        roles = tuple((f"k{i}", v) for i, v in enumerate(before)) + tuple((f"r{i}", v) for i, v in enumerate(reduced))
        return ReduceOp(comp.target, comp.target, reads[0].tensor, (("R", size(before)), ("F", size(reduced))),
                        ACCUMULATE[comp.red_op], roles, *rest)
    roles = (tuple((f"o{i}", v) for i, v in enumerate(before)) + tuple((f"r{i}", v) for i, v in enumerate(reduced))
             + tuple((f"k{i}", v) for i, v in enumerate(after)))
    dims = (("O", size(before)), ("R", size(reduced)), ("F", size(after)))
    return ColumnReduceOp(comp.target, comp.target, reads[0].tensor, dims, ACCUMULATE[comp.red_op], roles, *rest)


def _split_indices(comp: Comp, src: sx.Access, program) -> tuple[list[str], list[str], list[str]]:
    """The read's loop variables as (kept before, reduced, kept after): the output's indices in order around one
    run of reduced loops."""
    out, names = list(comp.out_vars), [plain(m) for m in index_maps(src, comp, program)]
    lead: list[str | None] = list(_unit_rows(comp, src, program))
    names = lead + names  # (a vector read as one row along unit loops)
    if None in names:
        pos = names.index(None)
        raise _reject(comp, f"index `{fmt_expr(src.indices[pos])}` of {src.tensor} is not a plain loop variable",
                      src.indices[pos].span)
    run = [i for i, v in enumerate(names) if v in comp.red_vars]
    first = run[0] if run else len(names)
    before, reduced, after = names[:first], names[first:first + len(run)], names[first + len(run):]
    if before + after != out or len(set(reduced)) != len(reduced) or run != list(range(first, first + len(run))):
        raise _reject(comp, f"`{fmt_expr(src)}` must be indexed by the output's indices [{', '.join(out)}] in order, "
                            f"with the reduced loops as one run of consecutive dimensions", src.span)
    if set(reduced) != set(comp.red_vars):
        raise _reject(comp, "every reduced loop must index the tensor being reduced", src.span)
    return before, reduced, after  # type: ignore[return-value]


def _init(comp: Comp, program) -> float | str:
    if comp.init is None:
        raise _reject(comp, f"the reduction into {comp.target} needs an initial value, e.g. "
                            f"`{comp.target}[{', '.join(comp.out_vars)}] = 0` before the reduced loop")
    value = const_value(comp.init, program.sizes)
    if value is not None:
        return value
    init = comp.init
    if isinstance(init, sx.Access) and init.tensor != comp.target and \
            [plain(m) for m in index_maps(init, comp, program)] == list(comp.out_vars):
        return init.tensor
    raise _reject(comp, f"the initial value `{fmt_expr(init)}` must be a constant or a tensor indexed like the "
                        f"output, [{', '.join(comp.out_vars)}]", init.span)
