"""Selection of element-wise statements: same-shape operands, broadcasts of lower-rank operands, and chains of
element-wise statements fused into one pass over tiles (the intermediate tensors never reach HBM).

    Y[i, j] = max(A[i, j] + b[i], 0) * s[j]     b: a (P, 1) column per tile (tensor_scalar); s: a row copied to
                                                every partition on TensorE; A: a full tile (tensor_tensor)
"""
from __future__ import annotations

import math
from dataclasses import replace

from tilec.compiler.exprs import accesses, const_value, fmt_expr
from tilec.compiler.lower import Comp, rename_vars, size_value
from tilec.compiler.ops import EltwiseOp, index_maps, is_permutation, plain, reads, reject
from tilec.errors import TilecError
from tilec.lang import syntax as sx
from tilec.lang.functions import FUNCTIONS


def is_copy(comp: Comp, program) -> bool:
    return isinstance(comp.init, sx.Access) and comp.init.tensor != comp.target and \
        is_permutation(comp, comp.init, program)


def fuse_chain(comps: tuple[Comp, ...], i: int, program, consumed: set[int]) -> Comp:
    """`T[i, j] = A[i, j] + B[i, j]; Y[i, j] = relu(T[i, j]) * 2` -> one statement `Y = relu(A + B) * 2` (one pass
    over tiles, T never stored) when the next statement is element-wise over the same loops, reads T with the same
    indices, and is T's only reader (or overwrites T itself: `Y = relu(Y)`)."""
    comp = comps[i]
    for j in range(i + 1, len(comps)):
        nxt = comps[j]
        readers = [c for c in comps[j:] if any(a.tensor == comp.target for a in reads(c))]
        in_place = nxt.target == comp.target
        if nxt.red_op is not None or nxt.out_index or not readers or readers[0] is not nxt or (len(readers) > 1 and not in_place):
            break
        if not in_place and program.tensors[comp.target].kind != "temp":
            break
        if _partial(nxt, program):  # a part of its output (select_copy): the parts stay copies
            break
        inlined = _inline(comp, nxt, program)
        if inlined is None:
            break
        comp = replace(nxt, init=inlined, line=comp.line, span=comp.span,
                       fused=comp.fused + ((comp.target,) if not in_place else ()))
        consumed.add(j)
    return comp


def _partial(comp: Comp, program) -> bool:
    """Whether a statement writes only part of its output (`Y[i, j]` for j in 0..3 of Y's 4 columns)."""
    shape = [d if isinstance(d, int) else size_value(d, program.sizes) for d in program.tensors[comp.target].shape]
    return [comp.extent(v) for v in comp.out_vars] != shape


def _inline(prev: Comp, nxt: Comp, program) -> sx.Expr | None:
    """nxt's expression with every read of prev's target replaced by prev's expression (renamed to nxt's loops)."""
    if [prev.extent(v) for v in prev.out_vars] != [nxt.extent(v) for v in nxt.out_vars]:
        return None
    assert prev.init is not None and nxt.init is not None  # element-wise Comps: init is their expression
    uses = [a for a in accesses(nxt.init) if a.tensor == prev.target]
    if any([plain(m) for m in index_maps(a, nxt, program)] != list(nxt.out_vars) for a in uses):
        return None
    value = rename_vars(prev.init, dict(zip(prev.out_vars, nxt.out_vars)))
    dtype = program.tensors[prev.target].dtype
    if dtype != "f32":  # the store to prev's target rounds to its dtype: the fused chain must round there too
        value = sx.Call(dtype, (value,), getattr(value, "span", prev.span))
    fused = _substitute(nxt.init, prev.target, value)
    try:  # a reversed read the fused statement could not take (read both ways, turns across a broadcast's run):
        if any(reversed_dims(a, nxt, program) for a in accesses(fused)):  # the statements stay apart
            select_eltwise(replace(nxt, init=fused), program)
    except TilecError:
        return None
    return fused


def _substitute(e: sx.Expr, tensor: str, value: sx.Expr) -> sx.Expr:
    if isinstance(e, sx.Access):
        return value if e.tensor == tensor else e
    if isinstance(e, sx.Neg):
        return sx.Neg(_substitute(e.x, tensor, value), e.span)
    if isinstance(e, sx.BinOp):
        return sx.BinOp(e.op, _substitute(e.lhs, tensor, value), _substitute(e.rhs, tensor, value), e.span)
    if isinstance(e, sx.Call):
        return sx.Call(e.fn, tuple(_substitute(x, tensor, value) for x in e.args), e.span)
    return e


def select_eltwise(comp: Comp, program) -> EltwiseOp:
    """Full-rank reads use the output's indices. A lower-rank read indexed by a run of them is a broadcast:
    a run that leaves later indices free (`b[i]` in Y[i, j], `b[k]` in Y[n, k, y, x]) is a per-partition column
    (those indices on the partitions, tensor_scalar with a (P, 1) operand); a trailing run (`s[j]` in Y[i, j]) is a
    row, broadcast across the partitions on TensorE (ones[1, P].T @ s[1, F]) and then used like a full tile."""
    assert comp.init is not None  # an element-wise Comp: init is its expression
    inputs: list[str] = []
    columns: list[str] = []
    rows: list[str] = []
    runs: dict[str, tuple[int, int] | None] = {"column": None, "row": None, "outer": None}
    for acc in accesses(comp.init):
        idx = [plain(m) for m in index_maps(acc, comp, program)]
        if acc.tensor == comp.target:
            raise reject(comp, "an element-wise statement may not read the tensor it writes", acc.span)
        wide = [v for v in comp.out_vars if comp.extent(v) > 1 or v in idx]  # (loops of one iteration left out)
        if idx == list(comp.out_vars) or idx == wide or reversed_dims(acc, comp, program) is not None:
            inputs += [acc.tensor] if acc.tensor not in inputs else []
            continue
        split = outer_row(idx, list(comp.out_vars))
        if split is not None:  # `mask[b, k]` in S[b, h, q, k]: a row per b, broadcast over h, q (the partitions)
            if runs["outer"] not in (None, (0, split[0])):
                raise reject(comp, "all rows read per outer index must be indexed by the same output indices",
                             acc.span)
            runs["outer"] = (0, split[0])
        here = split[1] if split is not None else _broadcast_run(comp, acc, idx, program)
        kind = "row" if here[1] == len(comp.out_vars) else "column"
        if runs[kind] is not None and here != runs[kind]:
            raise reject(comp, f"all broadcast {kind}s must be indexed by the same output indices", acc.span)
        runs[kind] = here
        group = rows if kind == "row" else columns
        group += [acc.tensor] if acc.tensor not in group else []
    check_expr(comp, comp.init)
    # an expression of columns and constants (`0.5 * c[i]`) is computed on the (P, 1) columns and meets full tiles in
    # tensor_scalar (one scalar per partition); as the whole result (`Y[i, j] = 2 * c[i] + 1`) the column is expanded
    # over the tile (expr_instrs.ExprCompiler.emit)
    run = _partition_run(comp, runs)
    flips = [f for a in accesses(comp.init) if (f := reversed_dims(a, comp, program))]
    if flips:
        _one_direction(comp, program)
        run = _reversed_run(comp, run, turns(flips, len(comp.out_vars)))
    roles = tuple((f"d{i}", v) for i, v in enumerate(comp.out_vars))
    layout = _broadcast_layout(comp, run) if run else ()
    size = math.prod(comp.extent(v) for v in comp.out_vars)
    return EltwiseOp(comp.target, comp.target, comp.init, tuple(inputs), size, roles, comp.line, comp.span,
                     tuple(columns), layout, run or (0, 0), comp.fused, comp.lines, tuple(rows))


def reversed_dims(acc: sx.Access, comp: Comp, program) -> tuple[int, ...] | None:
    """The dimensions a full-rank read indexes reversed (`A[N - 1 - i, j]` of an [N, M] tensor in Y[i, j]: (0,)),
    when every other index is the output's own; None for any other read. A reversed index must run over the whole
    dimension (`N - 1 - i` for i in 0..N, the dimension N long): the tile loads stay whole rows."""
    out = list(comp.out_vars)
    maps = index_maps(acc, comp, program)
    if len(maps) != len(out):
        return None
    shape = [d if isinstance(d, int) else size_value(d, program.sizes) for d in program.tensors[acc.tensor].shape]
    flipped = []
    for d, ((coefs, const), v) in enumerate(zip(maps, out)):
        if coefs == {v: 1} and const == 0:
            continue
        if coefs == {v: -1} and const == comp.extent(v) - 1 and shape[d] == comp.extent(v):
            flipped.append(d)
            continue
        return None
    return tuple(flipped) if flipped else None


def has_reversed_read(e: sx.Expr, loop_vars: set[str]) -> bool:
    """Whether an expression reads a tensor backwards along a loop (`A[N - 1 - i, j]`): an index in which a loop
    variable has a negative coefficient (names of sizes count as positive constants). The builders that load
    tiles themselves (row chains) read plainly, so they leave such statements to the element-wise rule."""
    def coefs(x: sx.Expr) -> dict[str, float] | None:
        if isinstance(x, sx.Name):
            return {x.id: 1.0} if x.id in loop_vars else {}
        if isinstance(x, sx.Num):
            return {}
        if isinstance(x, sx.Neg):
            c = coefs(x.x)
            return None if c is None else {v: -k for v, k in c.items()}
        if isinstance(x, sx.BinOp) and x.op in "+-":
            a, b = coefs(x.lhs), coefs(x.rhs)
            if a is None or b is None:
                return None
            sign = 1 if x.op == "+" else -1
            return {v: a.get(v, 0) + sign * b.get(v, 0) for v in {*a, *b}}
        if isinstance(x, sx.BinOp) and x.op == "*":
            a, b = coefs(x.lhs), coefs(x.rhs)
            if a is None or b is None or (a and b):
                return None
            k = const_value(x.rhs if a else x.lhs)
            return {v: c * (k if k is not None else 1) for v, c in (a or b).items()}
        return None
    return any(any(c < 0 for c in (coefs(ix) or {}).values()) for a in accesses(e) for ix in a.indices)


def turns(flips: list[tuple[int, ...]], n: int) -> set[int]:
    """Where reads change direction along the n output indices (0 and n included when a read is reversed there):
    the layout's groups of indices (outer, partitions, free) must meet there, so each is read one way."""
    out: set[int] = set()
    for back in flips:
        out |= {d for d in range(n + 1) if (d in back) != (d - 1 in back)}
    return out


def turn_run(found: set[int], n: int) -> tuple[int, int] | None:
    """The output indices [a, b) to put on the partitions so that the groups meet at the reads' turns: (0, t) for
    one turn inside, (t1, t2) for two; (0, 0) (the data flattened) when every read goes one way over all indices;
    None for more turns than a layout of three groups has boundaries."""
    inside = sorted(found - {0, n})
    if not inside:
        return (0, 0)
    if len(inside) == 1:
        return (0, inside[0])
    return (inside[0], inside[1]) if len(inside) == 2 else None


def _partition_run(comp: Comp, runs: dict[str, tuple[int, int] | None]) -> tuple[int, int] | None:
    """The output indices on the partitions: the columns' run; with rows only, everything before the rows."""
    assert comp.init is not None
    col, row, outer = runs["column"], runs["row"], runs["outer"]
    if row and col and row[0] != col[1]:
        raise reject(comp, "a statement with both per-partition and per-row broadcasts needs the row operand "
                           "indexed by exactly the output indices after the column operand's", comp.init.span)
    if outer and row:
        between = (outer[1], row[0])
        if col and col != between:
            raise reject(comp, "a statement with rows read per outer index (`m[b, k]` in Y[b, i, k]) needs its "
                               "column operands indexed by exactly the output indices between: "
                               f"{', '.join(comp.out_vars[between[0]:between[1]])}", comp.init.span)
        return between
    return col or ((0, row[0]) if row else None)


def _one_direction(comp: Comp, program) -> None:
    """A tensor is read one way in a statement: its tiles are loaded once, forward or reversed."""
    assert comp.init is not None
    mixed = _mixed_read(comp.init, comp, program)
    if mixed is not None:
        a, first = mixed
        raise reject(comp, f"`{fmt_expr(a)}` reads {a.tensor} in another direction than `{fmt_expr(first)}` in the "
                           "same statement; this is not compiled yet", a.span,
                     f"copy {a.tensor} reversed into a temporary first (`R[...] = {fmt_expr(first)}` or the other "
                     "read) and read that")


def _mixed_read(e: sx.Expr, comp: Comp, program) -> tuple[sx.Access, sx.Access] | None:
    """A read of a tensor in another direction than an earlier read of it (`A[i, j]` after `A[N - 1 - i, j]`)."""
    ways: dict[str, tuple[tuple[int, ...], sx.Access]] = {}
    for a in accesses(e):
        way = reversed_dims(a, comp, program) or ()
        first = ways.setdefault(a.tensor, (way, a))
        if first[0] != way:
            return a, first[1]
    return None


def _reversed_run(comp: Comp, run: tuple[int, int] | None, found: set[int]) -> tuple[int, int] | None:
    """The partition run of a statement with reversed reads: the broadcasts' run when it meets every turn, else
    the one the turns ask for (None: flattened)."""
    assert comp.init is not None
    n = len(comp.out_vars)
    if run is not None:
        if found <= {0, *run, n}:
            return run
        raise reject(comp, "a reversed read whose direction changes inside the broadcast operands' indices is not "
                           "compiled yet", comp.init.span, "reverse the broadcast operand's indices alike, or "
                           "pass the operand already reversed")
    want = turn_run(found, n)
    if want is None:
        raise reject(comp, "a read reversed along more than two separate runs of indices is not compiled yet",
                     comp.init.span, "pass the operand already reversed along some of them")
    return want if want != (0, 0) else None


def outer_row(idx: list, out: list[str]) -> tuple[int, tuple[int, int]] | None:
    """(m, (r, n)) when a read is indexed by the output's leading indices out[:m] and its trailing run out[r:n],
    with indices between left out (0 < m < r < n): a row per outer index, broadcast over those between."""
    n = len(out)
    for m in range(1, len(idx)):
        r = n - (len(idx) - m)
        if m < r < n and idx == out[:m] + out[r:]:
            return m, (r, n)
    return None


def _broadcast_run(comp: Comp, acc: sx.Access, idx: list, program) -> tuple[int, int]:
    """(a, b): the read is indexed by out_vars[a:b], a run of consecutive output indices."""
    out = list(comp.out_vars)
    shown = f"`{fmt_expr(acc)}`"
    maps = index_maps(acc, comp, program)
    if any(c < 0 for coefs, _ in maps for c in coefs.values()):
        e = next(e for e, (coefs, _) in zip(acc.indices, maps) if any(c < 0 for c in coefs.values()))
        raise reject(comp, f"the reversed index `{fmt_expr(e)}` of {shown} is not compiled yet (a reversed index "
                           "compiles when it runs over a whole dimension, `n - 1 - v` for v in 0..n of a dimension "
                           "of n, each other index a plain loop variable)", e.span,
                     "pass the operand already reversed, or run the program on the reference evaluator meanwhile: "
                     "`tilec run PROGRAM.tl --backend ref`")
    if None in idx or any(v not in out for v in idx) or not idx:
        raise reject(comp, f"element-wise reads must use the output's indices [{', '.join(out)}] or a run of "
                           f"them (a broadcast); {shown} does not (shifts and permutations are not supported)",
                     acc.span, "the compiler moves whole tensors tile by tile: read the operand with the output's "
                               "loop variables (pass it already shifted or reversed), or permute it with a "
                               "transpose statement first")
    a = out.index(idx[0])
    if out[a:a + len(idx)] != idx:
        raise reject(comp, f"the broadcast read {shown} must use consecutive output indices in order", acc.span)
    return a, a + len(idx)


def _broadcast_layout(comp: Comp, run: tuple[int, int]) -> tuple[tuple[str, int], ...]:
    """O (outer), P (the broadcast indices, on partitions), F (free): the output viewed as [O, P, F]."""
    ext = [comp.extent(v) for v in comp.out_vars]
    return (("O", math.prod(ext[:run[0]])), ("P", math.prod(ext[run[0]:run[1]])), ("F", math.prod(ext[run[1]:])))


def column_only(e: sx.Expr, columns: set[str]) -> bool:
    """An expression that reads only per-partition columns (and constants): its value is a (P, 1) column."""
    reads = accesses(e)
    return bool(reads) and all(a.tensor in columns for a in reads)


def check_expr(comp: Comp, e: sx.Expr) -> None:
    """An expression the element-wise builder can compute (else a TilecError at the offending part)."""
    if isinstance(e, (sx.Access, sx.Num)):
        return
    if isinstance(e, sx.Neg):
        return check_expr(comp, e.x)
    if isinstance(e, sx.BinOp):
        if e.op == "%":
            raise reject(comp, f"operator `{e.op}` between tensors has no engine instruction here", e.span)
        if e.op == "/" and const_value(e.rhs) == 0:
            raise reject(comp, "division by the constant 0 (every element would be inf or NaN)", e.rhs.span,
                         "divide by a non-zero constant")
        check_expr(comp, e.lhs)
        check_expr(comp, e.rhs)
        return
    if isinstance(e, sx.Call) and FUNCTIONS[e.fn].instr in ("activation", "tensor_tensor", "cast"):
        for a in e.args:
            check_expr(comp, a)
        return
    if isinstance(e, sx.Name) and e.id in {v for v, _ in comp.extents}:
        raise reject(comp, f"the loop variable `{e.id}` is used as a value (no instruction makes index values "
                           "here yet)", e.span,
                     "pass the values as a tensor read at the loop's indices (ALiBi's `j - i` as `pos[j] - pos[i]` "
                     "with pos an input holding 0, 1, ..), or run the program on the reference evaluator "
                     "meanwhile: `tilec run PROGRAM.tl --backend ref`")
    raise reject(comp, "unsupported expression", getattr(e, "span", None))


