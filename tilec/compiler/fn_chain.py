"""A chain of one-argument activations around a single read, `relu(X[b, i, j])`, `tanh(abs(X[i, j]))`: what a
transpose can apply on its PSUM -> SBUF eviction (an activation instead of the copy), so a permute with such a
function on the way is one pass over the data, not an element-wise pass through an HBM temporary and a permute.
Both levels read it: the program (permute_split keeps the statement whole, select builds the TransposeOp with the
functions) and the level-A nest (rules_transpose finds the read, tensorize emits the transpose and then the
activations)."""
from __future__ import annotations

from tilec.compiler.nest import Expr, Load, Op
from tilec.lang import syntax as sx
from tilec.lang.functions import FUNCTIONS


def _activation(name: str) -> bool:
    f = FUNCTIONS.get(name)
    return f is not None and f.instr == "activation" and f.arity == 1


def syntax_chain(e: sx.Expr) -> tuple[tuple[str, ...], sx.Access] | None:
    """(the functions, innermost first, and the read) when e is one or more activations around one plain read."""
    fns: list[str] = []
    while isinstance(e, sx.Call) and len(e.args) == 1 and _activation(e.fn):
        fns.append(e.fn)
        e = e.args[0]
    if not fns or not isinstance(e, sx.Access) or e.fill is not None:
        return None
    return tuple(reversed(fns)), e


def nest_chain(e: Expr) -> tuple[tuple[str, ...], Load] | None:
    """The same of a level-A expression: (functions innermost first, the Load)."""
    fns: list[str] = []
    while isinstance(e, Op) and len(e.args) == 1 and _activation(e.name):
        fns.append(e.name)
        e = e.args[0]
    if not isinstance(e, Load):
        return None
    return tuple(reversed(fns)), e


def wrap(fns: tuple[str, ...], load: Expr) -> Expr:
    """The level-A expression applying `fns` (innermost first) to `load`."""
    for fn in fns:
        load = Op(fn, (load,))
    return load
