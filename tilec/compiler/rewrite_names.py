"""Directives and the source rewrites (rewrites.py) together: the rewrites run whatever the schedule says, and a
directive names the nests of the rewritten program (what `tilec explain` prints, so its schedule pastes back). A
directive naming a tensor or loop of the program as written that a rewrite removed or renamed is an error at its
line, naming the rewrite and the loops the tensor's statements run over now:

    for i in 0..M, c in 0..C:  Y[i, c] = X[i, c] * g[c]      (packed_rows: Y[i_o, i_r, c] = X[..] * g_rep[i_r, c])
    schedule:
      tile Y.i, 64      -> error: `Y.i` names loop i of Y as written; the short-rows rewrite runs Y's statements
                           over loops i_o, i_r, c; write the directive over those loops

A name that did not resolve before the rewrites either is left to the directive's own checks (a typo is reported
there, with the computations the schedule can name)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from tilec.compiler.exprs import accesses
from tilec.errors import TilecError
from tilec.lang import syntax as sx

PLACES = {"root", "sbuf", "hbm"}  # arguments that name no tensor or loop


def loops_of(body: tuple[sx.Stmt, ...], around: tuple[str, ...] = ()) -> dict[str, dict[str, None]]:
    """Tensor -> the loop variables around the statements writing it, outermost first."""
    out: dict[str, dict[str, None]] = {}
    for st in body:
        if isinstance(st, sx.Loop):
            for name, loops in loops_of(st.body, around + (st.var,)).items():
                out.setdefault(name, {}).update(loops)
        elif isinstance(st, sx.Assign):
            out.setdefault(st.target.tensor, {}).update(dict.fromkeys(around))
    return out


def names_of(program) -> tuple[set[str], dict[str, dict[str, None]]]:
    """(the tensors, the loops of each written tensor) a directive can name in `program`."""
    return set(program.tensors), loops_of(program.kernel.body)


def refs(d: sx.Directive) -> list[tuple[sx.Ref, str, str]]:
    """(ref, tensor, loop or "") of each argument naming a tensor (`Y`) or a loop (`Y.i`; `reorder Y, j, i`: loops of
    the first argument's tensor)."""
    args = [a.value if isinstance(a, sx.KeyArg) else a for a in d.args]
    out: list[tuple[sx.Ref, str, str]] = []
    first = args[0] if args and isinstance(args[0], sx.Ref) else None
    for k, a in enumerate(args):
        if not isinstance(a, sx.Ref) or a.parts[0] in PLACES:
            continue
        if len(a.parts) == 2:
            out.append((a, a.parts[0], a.parts[1]))
        elif k == 0:
            out.append((a, a.parts[0], ""))
        elif d.name == "reorder" and first is not None and len(first.parts) == 1:
            out.append((a, first.parts[0], a.parts[0]))
    return out


def resolves(names: tuple[set[str], dict[str, dict[str, None]]], tensor: str, loop: str) -> bool:
    tensors, loops = names
    return tensor in tensors and (not loop or loop in loops.get(tensor, {}))


def check(before, after, directives: tuple[sx.Directive, ...], rewrite: str) -> None:
    """Raise at the first directive naming what resolved in `before` and does not in `after` (the program after the
    rewrite `rewrite`, a phrase: "the short-rows rewrite (packed_rows.py)")."""
    if not directives or before is after:
        return
    old, new = names_of(before), names_of(after)
    for d in directives:
        for ref, tensor, loop in refs(d):
            if not resolves(old, tensor, loop) or resolves(new, tensor, loop):
                continue
            raise TilecError(_message(ref, tensor, loop, new, rewrite), ref.span, _hint(tensor, new))


def _message(ref: sx.Ref, tensor: str, loop: str, new, rewrite: str) -> str:
    tensors, loops = new
    named = ".".join(ref.parts)
    if tensor not in tensors:
        return f"`{named}` names {tensor}, which {rewrite} removed (its statements compute through temporaries now)"
    now = ", ".join(loops.get(tensor, {})) or "no loops"
    return f"`{named}` names loop {loop} of {tensor} as written; {rewrite} runs {tensor}'s statements over loops {now}"


def _hint(tensor: str, new) -> str:
    tensors, loops = new
    if tensor in loops:
        return f"write the directive over {tensor}'s loops now ({', '.join(loops[tensor])}); `tilec explain` " \
               "prints the schedule of the rewritten program"
    return "`tilec explain` prints the computations of the rewritten program and their schedule"


# Directives over a statement's own loops. A tensor whose accumulation a rewrite moved into a temporary the last
# statement reads (`O += P * V` -> `O_acc += ..; O = O_acc / z`, inplace_split / operand_split) keeps its loops,
# so `tile O.d, 64` resolves before and after; the user wrote it about the sum, so it goes to the sum (and to the
# finish too where the finish has the loops it names, so its tiles follow the sum's).
LOOPED = ("tile", "split", "partition", "unroll", "reorder")


def _assigns(body: tuple[sx.Stmt, ...]):
    for st in body:
        if isinstance(st, sx.Loop):
            yield from _assigns(st.body)
        elif isinstance(st, sx.Assign):
            yield st


def moved_sums(before, after) -> dict[str, str]:
    """Tensor -> the new temporary its accumulation moved into: in `after` the tensor no longer accumulates and its
    statements read exactly one new tensor that does, indexed as the tensor is (`O = O_acc / z`). A temporary read
    permuted (`Y[n, y, x, c] = Y_c[n, c, y, x]`: an NHWC conv computed channels-first) is another op's result: a
    directive on the tensor's loops means that permute's."""
    def accumulating(program) -> set[str]:
        return {st.target.tensor for st in _assigns(program.kernel.body) if st.op != "="}

    old, now = accumulating(before), accumulating(after)
    fresh = now - set(before.tensors)
    out: dict[str, str] = {}
    for st in _assigns(after.kernel.body):
        name = st.target.tensor
        read = [a for a in accesses(st.value) if a.tensor in fresh]
        if name in old - now and len({a.tensor for a in read}) == 1 and \
                all(a.indices == st.target.indices for a in read):
            out[name] = read[0].tensor
    return out


def _looped(d: sx.Directive) -> bool:
    """A directive over a statement's loops: `tile Y.i, 64`, `reorder Y, j, i` (not `split Wt, conv.c`)."""
    first = d.args[0] if d.args else None
    return (d.name in LOOPED and isinstance(first, sx.Ref)
            and len(first.parts) == (1 if d.name == "reorder" else 2))


def _tensor(d: sx.Directive) -> str:
    first = d.args[0]
    assert isinstance(first, sx.Ref)
    return first.parts[0]


def _loops_named(d: sx.Directive) -> list[str]:
    first = d.args[0]
    assert isinstance(first, sx.Ref)
    if d.name == "reorder":
        return [a.parts[0] for a in d.args[1:] if isinstance(a, sx.Ref)]
    return [first.parts[1]]


@dataclass(frozen=True)
class Followed(sx.Directive):
    """A directive applied to the temporary a sum moved into, and the one the user wrote (what messages about
    the two together quote)."""
    written: sx.Directive | None = None


def _retargeted(d: sx.Directive, tensor: str) -> sx.Directive:
    first = d.args[0]
    assert isinstance(first, sx.Ref)
    args = (replace(first, parts=(tensor,) + first.parts[1:]),) + d.args[1:]
    return Followed(d.name, args, d.span, written=getattr(d, "written", None) or d)


def follow(directives: tuple[sx.Directive, ...], moved: dict[str, str], after) -> tuple[sx.Directive, ...]:
    """`directives` with each directive over a moved sum's loops (see LOOPED) applied to the sum; one the user
    wrote about the temporary itself wins over the one that follows (so explain's schedule, which prints both,
    pastes back)."""
    if not moved:
        return directives
    finish = loops_of(after.kernel.body)
    written = {(d.name, _tensor(d), tuple(_loops_named(d))) for d in directives if _looped(d)}
    out: list[sx.Directive] = []
    for d in directives:
        if not _looped(d) or _tensor(d) not in moved:
            out.append(d)
            continue
        loops, acc = _loops_named(d), moved[_tensor(d)]
        if (d.name, acc, tuple(loops)) not in written:
            out.append(_retargeted(d, acc))
        if all(v in finish.get(_tensor(d), {}) for v in loops):
            out.append(d)
    return tuple(out)
