"""Language constructs the reference evaluator defines but the compiler does not compile yet (issue 13): padded
reads (`X[y + r - 1, x + s - 1] ?? 0`) other than a window pool's (rules_pool.py), a contraction operand's
(build_conv.py), a copy's (`Y[i, j] = X[i - 2, j + 1] ?? 0`, rules_copy.py) or an element-wise statement's with
such indices (copied first: pad_split.py, which runs before this check), modulo of loop variables in indices, a
reduction into one element other than reduce_split.split_total_reductions' form, and floor
division except a loop variable divided by a constant in a copy's read (`Y[i, j] = X[i / 2, j / 2]`: nearest
upsampling, select_copy.py).
`compile_program` calls `reject_unsupported` first, so such a program gets a located TilecError saying so and
what to do, never a traceback from a builder that does not know the construct. Delete a rule here when the
compiler learns its construct."""
from __future__ import annotations

from tilec.compiler.exprs import accesses, fmt_expr, product_factors, strip_relu, strip_scale
from tilec.compiler.lower import uses_names
from tilec.compiler.select_conv import strip_activation
from tilec.errors import TilecError
from tilec.lang import syntax as sx

REFERENCE = "run it on the reference evaluator meanwhile: `tilec run PROGRAM.tl --backend ref`"


def reject_unsupported(kernel: sx.Kernel) -> None:
    for st in kernel.body:
        _stmt(st, frozenset())


def _stmt(st: sx.Stmt, loop_vars: frozenset[str]) -> None:
    if isinstance(st, sx.Loop):
        for child in st.body:
            _stmt(child, loop_vars | {st.var})
        return
    if st.op in ("+=", "max=", "min=") and loop_vars and not any(uses_names(i, loop_vars) for i in st.target.indices):
        raise TilecError(f"a reduction of whole tensors into one element of {st.target.tensor} (a dot product, a "
                         "total sum) is compiled only as one perfect nest right after the element's initial value",
                         st.target.span,
                         "write `s[0] = 0` then one nest `for i in 0..M, j in 0..N: s[0] += A[i, j]` (loops from 0, "
                         "one statement inside); or " + REFERENCE)
    for acc in accesses(st.value):
        if acc.fill is not None and not (_pooled(st, acc) or _contraction_padding(st, acc)
                                         or _padded_copy(st, acc, loop_vars)):
            if st.value is acc and st.op == "=":
                raise TilecError("zero padding of this read is not compiled yet: a padded copy's indices are each "
                                 "a loop variable plus a constant (`Y[i, j] = X[i - 2, j + 1] ?? 0`)", acc.span,
                                 "write each index of the read as one loop variable plus or minus a constant, "
                                 "or " + REFERENCE)
            raise TilecError("zero padding (a padded read `... ?? constant`) is not compiled yet inside a reduction, "
                             "or in an expression where an index is not one loop variable plus a constant (a copy, "
                             "an element-wise statement, a window pool and a conv's operand are)", acc.span,
                             "copy the padded read into a tensor of its own first (`P[i, j] = X[i - 1, j] ?? 0`) "
                             "and compute with P, or " + REFERENCE)
        for index in acc.indices:
            div = _loop_division(index, loop_vars)
            if div is not None and not _copy_division(st, div):
                word = "division" if div.op == "/" else "modulo"
                raise TilecError(f"floor {word} of a loop variable in an index (`{div.op}`) is not compiled yet",
                                 div.span, _division_hint(st, acc, div))


def _pooled(st: sx.Assign, acc: sx.Access) -> bool:
    """A window pool's padded read (`Y max= X[..] ?? -inf`, `S += c * (X[..] ?? 0)`): compiled (rules_pool.py)."""
    inner, _ = strip_scale(st.value)
    return st.op in ("max=", "min=", "+=") and strip_relu(inner)[0] is acc \
        and len(acc.indices) == len(st.target.indices)  # a window keeps every dimension; a padded row sum does not


def _padded_copy(st: sx.Assign, acc: sx.Access, loop_vars: frozenset[str]) -> bool:
    """A copy of a padded read, `Y[i, j] = X[i - 2, j + 1] ?? 0`, each index one loop variable plus a constant:
    compiled by the copy rule (rules_copy.py: an interior box HBM -> HBM, the fill stored from a constant tile)."""
    return st.op == "=" and st.value is acc and all(_shifted(i, loop_vars) for i in acc.indices)


def _shifted(e: sx.Expr, loop_vars: frozenset[str]) -> bool:
    """`v`, `v + c`, `v - c` or `c + v` with v a loop variable and c free of loop variables."""
    if isinstance(e, sx.Name):
        return e.id in loop_vars
    if isinstance(e, sx.BinOp) and e.op in "+-":
        if _shifted(e.lhs, loop_vars) and not uses_names(e.rhs, loop_vars):
            return True
        return e.op == "+" and _shifted(e.rhs, loop_vars) and not uses_names(e.lhs, loop_vars)
    return False


def _contraction_padding(st: sx.Assign, acc: sx.Access) -> bool:
    """A zero-padded operand of a contraction, `Y[..] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * W[..]` (also under
    relu): compiled with the halo zeroed in SBUF around the input band (build_conv), never a padded copy in HBM."""
    # a sign or a constant factor goes on the eviction (select_conv.split_sign)
    factors = [strip_activation(f)[0] for f in product_factors(st.value)[0]]
    return st.op == "+=" and acc.fill == 0 and len(factors) == 2 and acc in factors \
        and all(isinstance(f, sx.Access) for f in factors) and len(acc.indices) == len(st.target.indices)


def _copy_division(st: sx.Stmt, div: sx.BinOp) -> bool:
    """`v / k` (k a constant) read by a statement that only copies (`Y[..] = X[.., v / k, ..]`): compiled."""
    return isinstance(st, sx.Assign) and st.op == "=" and isinstance(st.value, sx.Access) and div.op == "/" \
        and isinstance(div.lhs, sx.Name) and isinstance(div.rhs, (sx.Num, sx.Name))


def _division_hint(st: sx.Assign, acc: sx.Access, div: sx.BinOp) -> str:
    """A floor division read inside arithmetic (`Y[..] = P[.., i / 2, j / 2] + L[..]`, an FPN's upsample-and-add):
    the same read alone in a copy compiles (nearest upsampling), so say how to split the statement."""
    if div.op == "%":  # lang_split.split_modulo_reads takes `v % m` when m divides v's trip count
        from tilec.compiler.lang_split import MAX_TILES
        return (f"a tiling read compiles when the index is `v % m` of one loop variable v (from 0) whose trip count "
                f"is a multiple of the constant m, at most {MAX_TILES} times m, with the read's other indices plain "
                f"loop variables in the output's order (`Y[i, j] = X[i % 4, j] + Z[i, j]`); or {REFERENCE}")
    copyable = div.op == "/" and isinstance(div.lhs, sx.Name) and isinstance(div.rhs, (sx.Num, sx.Name))
    if not copyable or isinstance(st.value, sx.Access):
        return REFERENCE[0].upper() + REFERENCE[1:]
    target = st.target
    return (f"a copy of the read compiles (nearest upsampling): write it into a tensor of its own first, "
            f"`U[{', '.join(fmt_expr(i) for i in target.indices)}] = {fmt_expr(acc)}` (U shaped like "
            f"{target.tensor}), and compute with U; or {REFERENCE}")


def _loop_division(e: sx.Expr, loop_vars: frozenset[str]) -> sx.BinOp | None:
    """The first `/` or `%` in an index whose dividend uses a loop variable."""
    if isinstance(e, sx.BinOp):
        if e.op in "/%" and uses_names(e.lhs, loop_vars):
            return e
        return _loop_division(e.lhs, loop_vars) or _loop_division(e.rhs, loop_vars)
    if isinstance(e, sx.Neg):
        return _loop_division(e.x, loop_vars)
    return None
