"""A contraction whose operands are expressions, `O[i, d] += exp(S[i, t] - m[i]) / z[i] * V[t, d]` (attention's
weighted values written in one statement): no rule maps it (a contraction multiplies two tensors), and computing
the whole product first would fill a temporary over every loop, [S, T, D]. The product falls into two groups of
factors, one indexed by i and t, the other by t and d; each group that is not a plain read is computed first into
an f32 temporary over its own indices, and the contraction multiplies the two:

    O_lhs[i, t] = exp(S[i, t] - m[i]) / z[i]      # the element-wise rule (m and z broadcast along t)
    O[i, d] += O_lhs[i, t] * V[t, d]               # a matmul

Done for a `+=` whose stored indices are plain loop variables, whose loops start at 0, whose factors (the product's
non-constant factors) read only tensors the top-level nest does not write, and whose kept indices fall into two
non-empty disjoint sets, each factor reading kept indices of at most one of them (a factor reading only reduced
indices goes with the first group). The constant factor stays on the contraction. A temporary is f32, as the
reference evaluator computes the expression, and a plain 16-bit operand beside it is copied to f32 too (exact: a
16-bit temporary rounds every term, which the reference does not; the fuzzer's survey seeds 114 and 208, 0.03 and
0.01 off). It is laid out
like a read over all its indices when there is one (`S[i, t]`), else in the loops' order. In a sum from 0, the
factors reading only the output's indices (`/ z[i]`) apply to the total after it (`O = O / z[i]`), and an operand
some earlier nest computes already (softmax's `exp(S[i, t] - m[i])`) is read from there."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses, const_value, fmt_expr, product_factors
from tilec.compiler.names import unique
from tilec.compiler.reduce_split import index_vars, sizes_as_numbers
from tilec.compiler.rewrite import (from_zero, hoisted, leaves, nested, perfect, read_order, rechecked, resolved,
                                    taken_names)
from tilec.lang import syntax as sx


def split_contraction_operands(program):
    """The program with each such contraction's expression operands computed into temporaries first; the same
    object when there is none."""
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    fills = _fills(kernel.body)
    zero_sums = _zero_started_sums(kernel.body)
    after: dict[int, sx.Stmt] = {}  # id of a rewritten contraction -> the nest finishing it (`O = O / z[i]`)

    def operand(base: str, expr: sx.Expr, loops: tuple[sx.Loop, ...], pre: list[sx.Stmt], span) -> sx.Access:
        """The read of a temporary holding `expr` over its own loops (filled by a nest added to `pre`), or of the
        tensor an earlier nest fills with it already (softmax's sum's terms `exp(S - m)`)."""
        own = _vars(expr) & {lp.var for lp in loops}
        by_var = {lp.var: lp for lp in loops if lp.var in own}  # (laid out like a read over all of them: `S[i, t]`)
        order = [by_var[v] for v in read_order(expr, own) or [lp.var for lp in loops if lp.var in own]]
        terms = sizes_as_numbers(expr, own, program.sizes)
        idx = tuple(sx.Name(lp.var, expr.span) for lp in order)
        same = _filled_alike(fills, terms, order)
        if same is not None and program.tensors[same].dtype == "f32":
            return sx.Access(same, idx, expr.span)
        name = unique(base, taken)
        taken.add(name)
        decls.append(sx.Decl(name, sx.TensorType("f32", tuple(lp.stop for lp in order), expr.span), expr.span))
        pre.append(nested(sx.Assign(sx.Access(name, idx, expr.span), "=", terms, span), order))
        return sx.Access(name, idx, expr.span)

    def stmt(st: sx.Assign, loops: tuple[sx.Loop, ...], top_writes: set[str]) -> tuple[list[sx.Stmt], sx.Stmt]:
        groups = contraction_groups(st, loops, top_writes, program)
        if groups is None:
            return [], st
        factors, scale = product_factors(st.value)
        kept = {ix.id for ix in st.target.indices if isinstance(ix, sx.Name)}
        span = st.value.span
        out_factors: list[sx.Expr] = []
        if st.target.tensor in zero_sums:  # a sum from 0: factors constant along the sum apply to the total
            left, moved = _pulled(factors, kept)
            again = _groups_of(left, kept)
            if all(again) and all(_vars(_product([left[k] for k in g], span)) & kept == _vars(
                    _product([factors[k] for k in old], span)) & kept for g, old in zip(again, groups)):
                factors, out_factors, groups = left, moved, again  # (each side still reads its own indices)
        pre: list[sx.Stmt] = []
        exprs = [_product([factors[k] for k in members], span) for members in groups]
        operands = []
        for side, expr in zip(("lhs", "rhs"), exprs):
            exact = _exact(expr, program)
            operands.append(expr if _f32_read(expr, program) else
                            operand(_base(exact, st.target.tensor, side), exact, loops, pre, st.span))
        value: sx.Expr = sx.BinOp("*", operands[0], operands[1], span)
        if scale != 1.0:
            value = sx.BinOp("*", value, sx.Num(scale, span), span)
        new = replace(st, value=value)
        if out_factors:
            after[id(new)] = _finish(st, out_factors, {lp.var: lp for lp in loops})
        return pre, new

    body = hoisted(kernel.body, stmt)
    if not decls and not after:
        return program
    out: list[sx.Stmt] = []
    for top in body:
        out.append(top)
        out += [after[id(st)] for st, _ in leaves(top) if id(st) in after]
    if not decls:
        return resolved(program, replace(kernel, body=tuple(out)))
    return rechecked(program, decls, out)


def _pulled(factors: list[sx.Expr], kept: set[str]) -> tuple[list[sx.Expr], list[sx.Expr]]:
    """(the factors left in the sum, the factors that apply to its total): a factor reading only indices of the
    output (`/ z[i]` inside `exp(S[i, t] - m[i]) / z[i]`) leaves the sum, so the operand left is the plain
    exponential that softmax's sum computed already, and the division is the in-place finish attention's rule
    takes (O_acc, inplace_split). Each factor moved out is a multiplier or, from a division, a divisor
    (`1 / z[i]`)."""
    left: list[sx.Expr] = []
    out: list[sx.Expr] = []
    for f in factors:
        multipliers, divisors = split_factor(f, kept)
        for m in multipliers:
            (out if accesses(m) and _vars(m) <= kept else left).append(m)
        out += [sx.BinOp("/", sx.Num(1, d.span), d, d.span) for d in divisors]
    return left, out


def split_factor(f: sx.Expr, kept: set[str]) -> tuple[list[sx.Expr], list[sx.Expr]]:
    """`a * g[i] / z[i]` -> ([a, g[i]], [z[i]]): its multipliers and the divisors that read only output indices."""
    if isinstance(f, sx.BinOp) and f.op == "*":
        (ma, da), (mb, db) = split_factor(f.lhs, kept), split_factor(f.rhs, kept)
        return ma + mb, da + db
    if isinstance(f, sx.BinOp) and f.op == "/" and accesses(f.rhs) and _vars(f.rhs) <= kept:
        m, d = split_factor(f.lhs, kept)
        return m, d + [f.rhs]
    return [f], []


def _groups_of(factors: list[sx.Expr], kept: set[str]) -> tuple[list[int], list[int]]:
    """The two groups again after `_pulled` (which keeps at least one factor on each side)."""
    first: set[str] = set()
    a: list[int] = []
    b: list[int] = []
    for k, f in enumerate(factors):
        mine = _vars(f) & kept
        if not a or not mine or mine & first:
            first |= mine
            a.append(k)
        else:
            b.append(k)
    return a, b


def _finish(st: sx.Assign, out_factors: list[sx.Expr], loops: dict[str, sx.Loop]) -> sx.Stmt:
    """`O[i, d] = O[i, d] * g[i] / z[i]` over the output's loops: the factors moved out of the sum."""
    span = st.span
    value: sx.Expr = st.target
    for f in out_factors:
        if isinstance(f, sx.BinOp) and f.op == "/" and isinstance(f.lhs, sx.Num):
            value = sx.BinOp("/", value, f.rhs, span)
        else:
            value = sx.BinOp("*", value, f, span)
    order = [loops[ix.id] for ix in st.target.indices if isinstance(ix, sx.Name)]
    return nested(sx.Assign(st.target, "=", value, span), order)


def _zero_started_sums(body: tuple[sx.Stmt, ...]) -> set[str]:
    """The tensors every statement of which is `T[..] = 0` or one `T[..] += ...` (the sum), and that nothing else
    reads: their total may be scaled after the sum."""
    stores: dict[str, list[sx.Assign]] = {}
    read: set[str] = set()
    for top in body:
        for st, _ in leaves(top):
            if isinstance(st, sx.Assign):
                stores.setdefault(st.target.tensor, []).append(st)
                read |= {a.tensor for a in accesses(st.value)}
    out = set()
    for name, sts in stores.items():
        sums = [st for st in sts if st.op == "+="]
        inits = [st for st in sts if st.op == "="]
        if len(sums) == 1 and len(inits) == len(sts) - 1 and name not in read \
                and all(const_value(st.value) == 0.0 for st in inits):
            out.add(name)
    return out


def _fills(body: tuple[sx.Stmt, ...]) -> list[tuple[sx.Assign, tuple[sx.Loop, ...]]]:
    """Every perfect top-level nest storing a whole tensor once (`t[i, j] = f(..)` over loops from 0)."""
    out = []
    for top in body:
        loops, st = perfect(top)
        if isinstance(st, sx.Assign) and st.op == "=" and loops:
            out.append((st, tuple(loops)))
    return out


def _filled_alike(fills, value: sx.Expr, order: list[sx.Loop]) -> str | None:
    """A tensor some fill stores with `value` at the indices `order` (the same loops' extents, names aside)."""
    want = [sx.Name(lp.var, lp.span) for lp in order]
    for st, loops in fills:
        by_var = {lp.var: lp for lp in loops}
        if len(st.target.indices) != len(order) or not all(
                isinstance(ix, sx.Name) and ix.id in by_var and fmt_expr(by_var[ix.id].stop) == fmt_expr(lp.stop)
                for ix, lp in zip(st.target.indices, order)):
            continue
        names = {ix.id: w.id for ix, w in zip(st.target.indices, want) if isinstance(ix, sx.Name)}
        if fmt_expr(_renamed(st.value, names)) == fmt_expr(value):
            return st.target.tensor
    return None


def _renamed(e: sx.Expr, names: dict[str, str]) -> sx.Expr:
    if isinstance(e, sx.Name):
        return replace(e, id=names.get(e.id, e.id))
    if isinstance(e, sx.Access):
        return replace(e, indices=tuple(_renamed(ix, names) for ix in e.indices))
    if isinstance(e, sx.BinOp):
        return replace(e, lhs=_renamed(e.lhs, names), rhs=_renamed(e.rhs, names))
    if isinstance(e, sx.Neg):
        return replace(e, x=_renamed(e.x, names))
    if isinstance(e, sx.Call):
        return replace(e, args=tuple(_renamed(a, names) for a in e.args))
    return e


def contraction_groups(st: sx.Assign, loops: tuple[sx.Loop, ...], top_writes: set[str],
                       program) -> tuple[list[int], list[int]] | None:
    """The factors' positions in two groups (see the module's text), or None when the statement is not such a
    contraction or both groups are plain reads already."""
    if st.op != "+=" or not all(isinstance(ix, sx.Name) for ix in st.target.indices):
        return None
    if any(not from_zero(lp) for lp in loops):
        return None
    loop_vars = {lp.var for lp in loops}
    kept = {ix.id for ix in st.target.indices if isinstance(ix, sx.Name)}
    if not kept <= loop_vars or not loop_vars - kept:
        return None
    factors, _ = product_factors(st.value)
    reads = accesses(st.value)
    if len(factors) < 2 or any(a.fill is not None or a.tensor in top_writes or a.tensor == st.target.tensor
                               for a in reads):
        return None
    sides: list[set[str]] = []  # the kept indices of each group
    members: list[list[int]] = []
    loose: list[int] = []  # factors reading only reduced indices
    for k, f in enumerate(factors):
        mine = _vars(f) & kept
        if not mine:
            loose.append(k)
            continue
        hit = [g for g, s in enumerate(sides) if s & mine]
        if len(hit) > 1:
            return None
        if hit:
            sides[hit[0]] |= mine
            members[hit[0]].append(k)
        else:
            sides.append(set(mine))
            members.append([k])
    if len(members) != 2 or sides[0] | sides[1] != kept:
        return None
    members[0] = sorted(members[0] + loose)
    operands = [_product([factors[k] for k in m], st.value.span) for m in members]
    if all(_plain(e, program) for e in operands) and len({_dtype(e, program) for e in operands}) == 1:
        return None  # already a product of two reads of one dtype: the contraction rule's own form
    if not all(_plain(e, program) or _at_loop_variables(e) for e in operands):
        return None
    return members[0], members[1]


def _product(factors: list[sx.Expr], span) -> sx.Expr:
    out = factors[0]
    for f in factors[1:]:
        out = sx.BinOp("*", out, f, span)
    return out


def _base(expr: sx.Expr, target: str, side: str) -> str:
    """A temporary's name: after its one read and function (`A_exp` for `exp(A[k, i])`, `B_f` for `B[k, j] + 1`),
    else after the contraction's side (`O_lhs`)."""
    reads = accesses(expr)
    if len(reads) != 1:
        return f"{target}_{side}"
    return f"{reads[0].tensor}_{expr.fn}" if isinstance(expr, sx.Call) else f"{reads[0].tensor}_f"


def _read(e: sx.Expr, program) -> sx.Access | None:
    """The read of an operand the contraction rule takes as it is: a read (`V[t, d]`, a window `X[n, c, y + r, x +
    s]`), under relu, relu6 or an exact conversion (select_conv.operand_read); else None."""
    from tilec.compiler.select_conv import operand_read  # (late: selection imports the rewrites)
    return operand_read(e, program)


def _plain(e: sx.Expr, program) -> bool:
    return _read(e, program) is not None


def _dtype(e: sx.Expr, program) -> str:
    """The dtype of a plain operand's tensor (`f32(A[i, k])` of a bf16 A: bf16, copied to f32 when the other
    operand is f32: `C += A * B` of a bf16 A and an f32 B, lang/widen.py)."""
    read = _read(e, program)
    assert read is not None
    return program.tensors[read.tensor].dtype


def _f32_read(e: sx.Expr, program) -> bool:
    """An operand taken as it is: a plain read of an f32 tensor (beside an f32 temporary)."""
    read = _read(e, program)
    return read is not None and program.tensors[read.tensor].dtype == "f32"


def _exact(e: sx.Expr, program) -> sx.Expr:
    """`f32(B[k, j])` for a plain 16-bit operand copied beside an f32 temporary (exact; as the user wrote it when it
    is that conversion already), else e."""
    if isinstance(e, sx.Call) and e.fn == "f32":
        return e
    return sx.Call("f32", (e,), e.span) if _plain(e, program) else e


def _at_loop_variables(e: sx.Expr) -> bool:
    """Every read of e is at plain, distinct loop variables: its terms fill a temporary over those loops (a window's
    terms would be an im2col over every tap)."""
    for a in accesses(e):
        names = [ix.id for ix in a.indices if isinstance(ix, sx.Name)]
        if not len(names) == len(a.indices) == len(set(names)):
            return False
    return True


def _vars(e: sx.Expr) -> set[str]:
    """The names in the indices of every read of e."""
    return set().union(*(index_vars(a) for a in accesses(e)))
