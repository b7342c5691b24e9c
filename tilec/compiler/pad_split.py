"""Padded reads inside an element-wise expression (`Y[i, j] = (X[i - 1, j] ?? 0) + Z[i, j]`, a 3-tap stencil
`(X[i - 1] ?? 0) + X[i] + (X[i + 1] ?? 0)`): each such read becomes a padded copy into a tensor of its own,

    for i, j:  X_pad[i, j] = X[i - 1, j] ?? 0       (the copy rule: interior box HBM -> HBM, fill boxes, rules_copy)
    for i, j:  Y[i, j] = X_pad[i, j] + Z[i, j]      (the element-wise rule)

the rewrite the rejection's hint asked users to write themselves (issue 10). Meaning is kept exactly: the copy
stores the fill rounded to X's dtype, as the reference does, and the temporary has X's dtype. Cost: one HBM round
trip of the read's region per padded read; cutting the element-wise nest into boxes (the copy rule's way) would
avoid it (docs/notes/core9.md). A read is split only when each of its indices is one loop variable plus or minus a
constant, each loop variable at most once, over loops that start at 0; other padded reads stay rejected
(unsupported.py).

Reversed reads the rules do not load themselves are rewritten here too (gaps14): a reduction reading a loop it keeps
backwards computes forward into a temporary and copies the result reversed (`reversed_result`); otherwise such an
operand, a reversed broadcast, and a tensor read both ways in one statement are copied reversed first
(`reversed_operands`). The element-wise rule compiles the reversed copies (docs/notes/gaps14.md)."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses, const_value, fmt_expr
from tilec.compiler.lower import affine_index, size_value, uses_names
from tilec.compiler.names import unique
from tilec.compiler.rewrite import nested, rechecked, substituted, taken_names
from tilec.errors import TilecError
from tilec.lang import syntax as sx


def split_padded_reads(program):
    """The program with every splittable padded read of an element-wise statement copied first; the same object
    when there is none."""
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    dtypes = {name: t.dtype for name, t in program.tensors.items()}

    def declare(base: str, dtype: str, type_: sx.TensorType, span) -> str:
        """A new temporary tensor named after `base`, declared with `type_`."""
        name = unique(base, taken)
        dtypes[name] = dtype
        decls.append(sx.Decl(name, type_, span))
        return name

    def temporary(base: str, dtype: str, value: sx.Expr, vs: list[str], by_var: dict[str, sx.Loop],
                  span) -> tuple[sx.Stmt, sx.Access]:
        """A new tensor `base`[vs...] (declared, of the loops' extents) filled with `value` by a nest over vs, and
        the read of it that replaces `value`."""
        name = declare(base, dtype, sx.TensorType(dtype, tuple(by_var[v].stop for v in vs), value.span), value.span)
        idx = tuple(sx.Name(v, value.span) for v in vs)
        fill = nested(sx.Assign(sx.Access(name, idx, value.span), "=", value, span), [by_var[v] for v in vs])
        return fill, sx.Access(name, idx, value.span)

    def stmt(st: sx.Stmt, loops: tuple[sx.Loop, ...]) -> list[sx.Stmt]:
        if isinstance(st, sx.Loop):
            before: list[sx.Stmt] = []
            body: list[sx.Stmt] = []
            for child in st.body:
                out = stmt(child, loops + (st,))
                body.append(out[-1])
                before += out[:-1]
            return before + [replace(st, body=tuple(body))]
        if isinstance(st, sx.Assign) and st.op in ("+=", "max=", "min="):
            first = reversed_operands(st, {lp.var: lp for lp in loops})
            return first  # (a function of a contraction's operand: operand_split.py)
        if not isinstance(st, sx.Assign) or st.op != "=":
            return [st]
        by_var = {lp.var: lp for lp in loops}
        both = reversed_operands(st, by_var, mixed=True)  # A[N - 1 - i, j] - A[i, j]: the reversed read copied
        if len(both) > 1:
            return both[:-1] + stmt(both[-1], loops)
        if isinstance(st.value, sx.Access):
            return [st]
        new: dict[int, sx.Expr] = {}
        copies: list[sx.Stmt] = []
        for acc in accesses(st.value):
            if acc.fill is None:
                continue
            used = [_var(i, frozenset(by_var)) for i in acc.indices]
            if any(v is None for v in used) or len(set(used)) != len(used) or \
                    any(not _zero(by_var[v].start) for v in used if v is not None):
                continue
            vs = [v for v in used if v is not None]
            copy, new[id(acc)] = temporary(f"{acc.tensor}_pad", dtypes[acc.tensor], acc, vs, by_var, st.span)
            copies.append(copy)
        if not new:
            return [st]
        return copies + [replace(st, value=substituted(st.value, new))]

    def reversed_operands(st: sx.Assign, by_var: dict[str, sx.Loop], mixed: bool = False) -> list[sx.Stmt]:
        """`s[i] += A[N - 1 - i, j]`: a reduction (or contraction) operand read backwards along a loop the output
        keeps is copied reversed first, `A_rev[i, j] = A[N - 1 - i, j]` (the element-wise rule: the DMA reverses
        the rows), and the reduction reads `A_rev[i, j]`. Exact (a copy in A's dtype); cost: one HBM round trip
        of A. A loop the reduction sums over is turned around instead (select.forward_reduced: no copy), unless
        another read takes it forward (`A[i, M - 1 - j] * B[i, j]`): then the reversed read is copied too.
        `mixed` (an element-wise statement): only a tensor read in several directions (`A[N - 1 - i, j] - A[i,
        j]`: its tiles are loaded one way), a reversed broadcast operand (`c[N - 1 - i]` of Y[i, j]: the rule
        stages columns and rows forward; a small copy), a reversed read in another order than the output's (a
        transpose, `A[M - 1 - j, i]`), and reversed reads the layout cannot meet (`_turns_clash`) are copied."""
        kept = set(by_var) if mixed else {i.id for i in st.target.indices if isinstance(i, sx.Name)}
        loop_vars = frozenset(by_var)
        ways: dict[int, tuple[list[str], tuple[int, ...]] | None] = {}
        for acc in accesses(st.value):
            ways[id(acc)] = None if acc.fill is not None else _way(acc, by_var, loop_vars)
        seen: dict[str, set] = {}
        for acc in accesses(st.value):
            w = ways[id(acc)]
            seen.setdefault(acc.tensor, set()).add(None if w is None else w[1])
        forward = {v for w in ways.values() if w is not None for d, v in enumerate(w[0]) if d not in w[1]}
        kept |= {v for w in ways.values() if w is not None for d in w[1] if (v := w[0][d]) in forward}
        clash = mixed and _turns_clash(st, ways)
        order = [i.id if isinstance(i, sx.Name) else None for i in st.target.indices]
        new: dict[int, sx.Expr] = {}
        copies: list[sx.Stmt] = []
        done: dict[str, sx.Access] = {}
        for acc in accesses(st.value):
            w = ways[id(acc)]
            if w is None or not any(w[0][d] in kept for d in w[1]) or \
                    (mixed and not clash and len(seen[acc.tensor]) < 2 and w[0] == order):
                continue  # (a read in the output's order that the element-wise rule reverses itself)
            key = fmt_expr(acc)
            if key not in done:
                copy, done[key] = temporary(f"{acc.tensor}_rev", dtypes[acc.tensor], acc, w[0], by_var, st.span)
                copies.append(copy)
            new[id(acc)] = done[key]
        return copies + [replace(st, value=substituted(st.value, new))] if new else [st]

    def _turns_clash(st: sx.Assign, ways: dict) -> bool:
        """Whether the element-wise rule's layout cannot meet both the broadcast operands' run of indices (the
        partitions: a column's indices, or those before a row's) and the places where full reads turn direction
        (select_eltwise.turns): `A[b, N - 1 - i, j] * c[b]` puts b on the partitions and i, j together on the free
        axis, which one direction cannot read. Then the reversed reads are copied."""
        out = [i.id if isinstance(i, sx.Name) else None for i in st.target.indices]
        n = len(out)
        flips, runs = [], []
        for w in ways.values():
            if w is None or any(v not in out for v in w[0]):
                continue
            pos = [out.index(v) for v in w[0]]
            if len(pos) == n and pos == list(range(n)):
                flips.append(w[1])
            elif pos and pos == list(range(pos[0], pos[0] + len(pos))):
                runs.append((pos[0], pos[-1] + 1))
        found = {d for back in flips for d in range(n + 1) if (d in back) != (d - 1 in back)}
        if not found or not runs:
            return False
        col = next((r for r in runs if r[1] < n), None)
        run = col or (0, next(r for r in runs)[0])
        return not found <= {0, *run, n}

    def _way(acc: sx.Access, by_var: dict[str, sx.Loop], loop_vars: frozenset[str]
             ) -> tuple[list[str], tuple[int, ...]] | None:
        """(the loop variable of each index, the indices read reversed) of a read indexed by distinct loop
        variables from 0, each plainly or as `n - 1 - v` over its whole dimension; None for any other read."""
        if acc.tensor not in program.tensors:  # a temporary made here: read plainly
            return None
        vs: list[str] = []
        back: list[int] = []
        for d, (ix, dim) in enumerate(zip(acc.indices, program.tensors[acc.tensor].shape)):
            coefs, const = _affine(ix, loop_vars, program.sizes)
            v = next(iter(coefs)) if coefs is not None and len(coefs) == 1 else None
            if v is None or v in vs or not _zero(by_var[v].start):
                return None
            n = size_value(by_var[v].stop, program.sizes)
            size = dim if isinstance(dim, int) else size_value(dim, program.sizes)
            if coefs == {v: -1} and const == n - 1 and size == n:
                back.append(d)
            elif coefs != {v: 1} or const != 0:
                return None
            vs.append(v)
        return vs, tuple(back)

    def reversed_result(top: sx.Stmt) -> list[sx.Stmt]:
        """`s[i] = 0; s[i] += A[N - 1 - i, j]` (a reduction reading a loop it keeps backwards, in every read that
        uses it): computed forward into a temporary, `T[i] = 0; T[i] += A[i, j]`, then copied reversed after the
        nest, `s[i] = T[N - 1 - i]` (the element-wise rule): a copy of the result, not of the operand. Only when
        the nest writes s in those two statements (the first a constant) and reads it nowhere."""
        if not isinstance(top, sx.Loop):
            return [top]
        found: list[tuple[sx.Assign, tuple[sx.Loop, ...]]] = []

        def walk(st: sx.Stmt, loops: tuple[sx.Loop, ...]) -> None:
            if isinstance(st, sx.Loop):
                for child in st.body:
                    walk(child, loops + (st,))
            elif isinstance(st, sx.Assign):
                found.append((st, loops))
        walk(top, ())
        for upd, loops in found:
            if upd.op not in ("+=", "max=", "min=") or upd.target.tensor not in program.tensors:
                continue
            out = upd.target.tensor
            names = [i.id if isinstance(i, sx.Name) else None for i in upd.target.indices]
            by_var = {lp.var: lp for lp in loops}
            ways = [_way(a, by_var, frozenset(by_var)) for a in accesses(upd.value)]
            if None in names or not ways or None in ways:
                continue
            flip = {w[0][d] for w in ways if w is not None for d in w[1]} & set(names)
            if not flip or any(v in flip for w in ways if w is not None for d, v in enumerate(w[0]) if d not in w[1]):
                continue  # none, or a kept loop also read forward
            writes = [st for st, _ in found if st.target.tensor == out]
            inits = [st for st in writes if st is not upd]
            if len(inits) != 1 or inits[0].op != "=" or const_value(inits[0].value, program.sizes) is None or \
                    inits[0].target.indices != upd.target.indices or \
                    any(a.tensor == out for st, _ in found for a in accesses(st.value)):
                continue
            decl = next((d for d in kernel.decls if d.name == out), None)
            if decl is None:
                continue
            name = declare(f"{out}_fwd", dtypes[out], decl.type, decl.span)

            def forward(e: sx.Access) -> sx.Expr:
                w = _way(e, by_var, frozenset(by_var))
                if w is None:
                    return e
                return replace(e, indices=tuple(sx.Name(v, ix.span) if d in w[1] and v in flip else ix
                                                for d, (ix, v) in enumerate(zip(e.indices, w[0]))))

            def rewrite(st: sx.Stmt) -> sx.Stmt:
                if isinstance(st, sx.Loop):
                    return replace(st, body=tuple(rewrite(x) for x in st.body))
                if isinstance(st, sx.Assign) and st.target.tensor == out:
                    value = sx.map_reads(st.value, forward) if st is upd else st.value
                    return replace(st, target=replace(st.target, tensor=name), value=value)
                return st
            span = upd.target.span
            idx = tuple(sx.BinOp("-", sx.BinOp("-", by_var[v].stop, sx.Num(1, span), span), sx.Name(v, span), span)
                        if v in flip else sx.Name(v, span) for v in names if v is not None)
            kept = [v for v in names if v is not None]  # (every index is a loop variable: checked above)
            copy = sx.Assign(upd.target, "=", sx.Access(name, idx, span), upd.span)
            return [rewrite(top), nested(copy, [by_var[v] for v in kept])]
        return [top]

    body: list[sx.Stmt] = []
    for top in kernel.body:
        for st in reversed_result(top):
            body += stmt(st, ())
    return rechecked(program, decls, body)


def _affine(e: sx.Expr, loop_vars: frozenset[str], sizes: dict[str, int]) -> tuple[dict[str, int] | None, int]:
    """lower.affine_index of an index, (None, 0) when it is not affine in the loop variables."""
    try:
        return affine_index(e, set(loop_vars), sizes)
    except (TilecError, KeyError):  # not affine, or a name that is no size: not a reversed index
        return None, 0


def _zero(e: sx.Expr) -> bool:
    return isinstance(e, sx.Num) and e.value == 0


def _var(e: sx.Expr, loop_vars: frozenset[str]) -> str | None:
    """v for `v`, `v + c`, `v - c`, `c + v` (v a loop variable, c free of loop variables), else None."""
    if isinstance(e, sx.Name):
        return e.id if e.id in loop_vars else None
    if isinstance(e, sx.BinOp) and e.op in "+-":
        if not uses_names(e.rhs, loop_vars):
            return _var(e.lhs, loop_vars)
        if e.op == "+" and not uses_names(e.lhs, loop_vars):
            return _var(e.rhs, loop_vars)
    return None

