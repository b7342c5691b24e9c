"""Language constructs the reference evaluator defines but the compiler does not compile yet (issue 13): padded
reads (`X[y + r - 1, x + s - 1] ?? 0`), modulo of loop variables in indices, and floor division except a loop
variable divided by a constant in a copy's read (`Y[i, j] = X[i / 2, j / 2]`: nearest upsampling, select_copy.py).
`compile_program` calls `reject_unsupported` first, so such a program gets a located TilecError saying so and
what to do, never a traceback from a builder that does not know the construct. Delete a rule here when the
compiler learns its construct."""
from __future__ import annotations

from tilec.compiler.exprs import accesses
from tilec.compiler.lower import uses_names
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
    for acc in accesses(st.value):
        if acc.fill is not None:
            raise TilecError("zero padding (a padded read `... ?? constant`) is not compiled yet", acc.span,
                             "pad the input in a separate tensor (written with a larger shape), or " + REFERENCE)
        for index in acc.indices:
            div = _loop_division(index, loop_vars)
            if div is not None and not _copy_division(st, div):
                word = "division" if div.op == "/" else "modulo"
                raise TilecError(f"floor {word} of a loop variable in an index (`{div.op}`) is not compiled yet",
                                 div.span, REFERENCE[0].upper() + REFERENCE[1:])


def _copy_division(st: sx.Stmt, div: sx.BinOp) -> bool:
    """`v / k` (k a constant) read by a statement that only copies (`Y[..] = X[.., v / k, ..]`): compiled."""
    return isinstance(st, sx.Assign) and st.op == "=" and isinstance(st.value, sx.Access) and div.op == "/" \
        and isinstance(div.lhs, sx.Name) and isinstance(div.rhs, (sx.Num, sx.Name))


def _loop_division(e: sx.Expr, loop_vars: frozenset[str]) -> sx.BinOp | None:
    """The first `/` or `%` in an index whose dividend uses a loop variable."""
    if isinstance(e, sx.BinOp):
        if e.op in "/%" and uses_names(e.lhs, loop_vars):
            return e
        return _loop_division(e.lhs, loop_vars) or _loop_division(e.rhs, loop_vars)
    if isinstance(e, sx.Neg):
        return _loop_division(e.x, loop_vars)
    return None
