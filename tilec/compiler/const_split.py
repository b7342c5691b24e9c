"""Constant output indices, `Y[0, j] = f(X[j])` or `Y[i, 3] = A[i]` (a row or column of the output written on its
own, one statement per part): lowering needs every output index to be a loop variable, or one shifted by a constant
in a copy (`Y[C1 + c] = B[c]`: a part of a concatenation, select_copy). So each constant index becomes a loop of
one iteration shifted by the constant, and an expression that is not a plain copy is computed first into a
temporary of the part's shape, which is then copied into place:

    Y[0, j] = 2 * X[j] + 1          ->    for z in 0..1, j in 0..N:  Y_part[z, j] = 2 * X[j] + 1
                                          for z in 0..1, j in 0..N:  Y[0 + z, j] = Y_part[z, j]
    Y[i, 3] = A[i]                  ->    for i in 0..M, z in 0..1:  Y[i, 3 + z] = A[i]

A read that leaves out a loop of one iteration reads the same element at every iteration (select_eltwise,
rules.injective), so the temporary's nest is an ordinary element-wise nest. Parts must not overlap: two statements
that write one element of a tensor (one of them through a constant index) are a located TilecError naming both,
since the compiler orders the parts' stores freely (the whole-output check, select.check_parts, then says which
elements no part writes)."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import const_value
from tilec.compiler.names import unique
from tilec.compiler.rewrite import leaves, nested, perfect_nest, rechecked, resolved, taken_names
from tilec.errors import TilecError
from tilec.lang import syntax as sx

Region = tuple[tuple[int, int], ...]  # per output dimension, [start, stop)


def split_constant_outputs(program):
    """The program with each top-level statement that stores at constant output indices rewritten as above; the
    same object when there is none."""
    kernel, sizes = program.kernel, program.sizes
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    body: list[sx.Stmt] = []
    changed = False
    parts: dict[str, list[tuple[Region, sx.Assign, bool]]] = {}
    reduced = {st.target.tensor for top in kernel.body for st, _ in leaves(top)
               if isinstance(st, sx.Assign) and st.op != "="}  # `s[0] = 0` starts a reduction (reduce_split)
    nests = []
    for top in kernel.body:
        loops, st = perfect_nest(top)
        region = _region(st, loops, sizes) if isinstance(st, sx.Assign) and st.target.tensor not in reduced \
            else None
        constant = [const_value(ix, sizes) for ix in st.target.indices] if isinstance(st, sx.Assign) else []
        nests.append((top, loops, st, region, [None if c is None else int(c) for c in constant]))
    split = {st.target.tensor for _, _, st, region, constant in nests if region and constant != [None] * len(constant)}
    for top, loops, st, region, constant in nests:
        if region is None or st.target.tensor not in split:
            body.append(top)
            continue
        assert isinstance(st, sx.Assign)
        has_constant = constant != [None] * len(constant)
        _check_apart(parts.setdefault(st.target.tensor, []), region, st, has_constant)
        if not has_constant and isinstance(st.value, sx.Access):
            body.append(top)  # a plain copy is a part already (select_copy)
            continue
        body += _rewritten(st, loops, constant, program, taken, decls)  # the other parts must be copies too
        changed = True
    if not changed:
        return program
    return rechecked(program, decls, body) if decls else resolved(program, replace(kernel, body=tuple(body)))


def _region(st: sx.Assign, loops: list[sx.Loop], sizes: dict[str, int]) -> Region | None:
    """The part of the output an `=` statement stores, when each output index is a loop variable of the nest (over
    its whole range) or an integer constant; None for any other statement (left to lowering)."""
    if st.op != "=":
        return None
    ext = {lp.var: const_value(lp.stop, sizes) for lp in loops}
    out: list[tuple[int, int]] = []
    for ix in st.target.indices:
        if isinstance(ix, sx.Name) and ext.get(ix.id) is not None:
            out.append((0, int(ext[ix.id])))  # type: ignore[arg-type]
            continue
        c = const_value(ix, sizes)
        if c is None or not float(c).is_integer() or isinstance(ix, sx.Name) and ix.id in ext:
            return None
        out.append((int(c), int(c) + 1))
    used = {ix.id for ix in st.target.indices if isinstance(ix, sx.Name) and ix.id in ext}
    return tuple(out) if used == set(ext) else None  # (a loop the output leaves out: lowering reports it)


def _check_apart(seen: list[tuple[Region, sx.Assign, bool]], region: Region, st: sx.Assign, constant: bool) -> None:
    """A part of a tensor overlapping an earlier one: refused at the later statement, when either writes through a
    constant index (whole-tensor rewrites are the other rules' business)."""
    for other, first, was_constant in seen:
        meet = [(max(a, c), min(b, d)) for (a, b), (c, d) in zip(region, other)]
        if (constant or was_constant) and all(a < b for a, b in meet):
            where = ", ".join(f"{a}" if b - a == 1 else f"{a}..{b}" for a, b in meet)
            raise TilecError(f"this statement writes elements of {st.target.tensor} that line {first.span.line} "
                             f"writes too ({st.target.tensor}[{where}]): the compiler stores the parts of a tensor in "
                             "no fixed order", st.target.span, "write each element of the output once (split the "
                             "loops so the parts do not meet), or compute the overlap into a temporary first")
    seen.append((region, st, constant))


def _rewritten(st: sx.Assign, loops: list[sx.Loop], constant: list[int | None], program, taken: set[str],
               decls: list[sx.Decl]) -> list[sx.Stmt]:
    """The nests that store `st`'s part: a unit loop per constant index, in the output's order among the
    statement's loops (after the loops of the indices before it), and a temporary unless `st` is a plain copy."""
    span = st.span
    out_loops: list[sx.Loop] = []  # the part's loops in the output's index order
    index: list[sx.Expr] = []
    by_var = {lp.var: lp for lp in loops}
    for ix, c in zip(st.target.indices, constant):
        if c is None:
            assert isinstance(ix, sx.Name)
            out_loops.append(by_var[ix.id])
            index.append(ix)
            continue
        z = unique("z", taken)
        taken.add(z)
        out_loops.append(sx.Loop(z, sx.Num(0, span), sx.Num(1, span), (), span))
        index.append(sx.BinOp("+", sx.Num(c, ix.span), sx.Name(z, ix.span), ix.span))
    shifted = replace(st.target, indices=tuple(index))
    if isinstance(st.value, sx.Access):  # a copy into part of the output (select_copy)
        return [nested(replace(st, target=shifted), out_loops)]
    name = unique(f"{st.target.tensor}_part", taken)
    taken.add(name)
    dtype = program.tensors[st.target.tensor].dtype
    decls.append(sx.Decl(name, sx.TensorType(dtype, tuple(lp.stop for lp in out_loops), span), span))
    part = sx.Access(name, tuple(sx.Name(lp.var, span) for lp in out_loops), span)
    fill = nested(replace(st, target=part), out_loops)
    return [fill, nested(sx.Assign(shifted, "=", part, span), out_loops)]
