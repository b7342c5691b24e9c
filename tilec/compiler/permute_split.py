"""Element-wise work on the way through a transpose or permute, `Y[b, j, i] = relu(X[b, i, j])`, `Y[n, h, w, c] =
X[n, c, h, w] + b[c]`: the element-wise rule needs its operands indexed like the output (or broadcast along a run
of its indices) and the transpose rule a plain read, so the statement is taken apart:

    T[n, c, h, w] = X[n, c, h, w] + b[c]   # element-wise, in the order the read is laid out (b: a broadcast)
    Y[n, h, w, c] = T[n, c, h, w]          # a permute (select_transpose)

T has the output's dtype (the store rounds once, as the statement did; the permute copies the rounded values).
The nest that fills T is put before the top-level statement that holds the original, so it is done only when the
expression reads nothing that statement's nest writes, every loop around it starts at 0, the stored indices are
the loop variables (all of them, each once) and the reads' indices are loop variables (a broadcast, or all of them
in another order)."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses
from tilec.compiler.fn_chain import syntax_fused
from tilec.compiler.lower import affine_index, size_value, uses_names
from tilec.compiler.names import unique
from tilec.compiler.rewrite import (from_zero, hoisted, nested, perfect_nest, rechecked, resolved, substituted,
                                    taken_names)
from tilec.errors import TilecError
from tilec.lang import syntax as sx


def _plain(a: sx.Access) -> list[str] | None:
    """The loop variables of an access indexed by distinct plain loop variables, in index order (else None)."""
    names = [ix.id for ix in a.indices if isinstance(ix, sx.Name)]
    return names if len(names) == len(a.indices) and len(set(names)) == len(names) else None


def split_permuted_eltwise(program):
    """The program with each such statement split into an element-wise statement and a permute; the same object
    when there is none."""
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []

    def order(st: sx.Assign, loops: tuple[sx.Loop, ...], top_writes: set[str]) -> list[str] | None:
        """The loop variables in the order of the permuted read, when `st` is to be split."""
        loop_vars = [lp.var for lp in loops]
        out = _plain(st.target)
        if st.op != "=" or isinstance(st.value, sx.Access) or out is None or sorted(out) != sorted(loop_vars):
            return None
        if any(not from_zero(lp) for lp in loops):
            return None
        reads = accesses(st.value)
        if not reads or any(a.fill is not None or a.tensor in top_writes or _plain(a) is None
                            or not set(_plain(a) or ()) <= set(loop_vars) for a in reads):
            return None
        full = [_plain(a) for a in reads if sorted(_plain(a) or ()) == sorted(loop_vars)]
        if not full or any(f != full[0] for f in full) or full[0] == out:
            return None  # no read over all the loops, two orders, or already in the output's order
        first = full[0]
        assert first is not None  # a plain read (the filter above)
        if syntax_fused(st.value, tuple(out), reads) is not None:
            return None  # work a swap of runs does on its eviction: the transpose computes it (fn_chain.py)
        return first

    def stmt(st: sx.Assign, loops: tuple[sx.Loop, ...], top_writes: set[str]) -> tuple[list[sx.Stmt], sx.Stmt]:
        vs = order(st, loops, top_writes)
        if vs is None:
            return [], st
        by_var = {lp.var: lp for lp in loops}
        span = st.value.span
        name = unique(f"{st.target.tensor}_pre", taken)
        dtype = program.tensors[st.target.tensor].dtype
        decls.append(sx.Decl(name, sx.TensorType(dtype, tuple(by_var[v].stop for v in vs), span), span))
        idx = tuple(sx.Name(v, span) for v in vs)
        fill = nested(sx.Assign(sx.Access(name, idx, span), "=", st.value, st.span), [by_var[v] for v in vs])
        return [fill], replace(st, value=sx.Access(name, idx, span))

    return rechecked(program, decls, hoisted(kernel.body, stmt))


def split_shifted_reads(program):
    """Element-wise statements reading a tensor shifted or strided along the output's loops, `Y[i, j] = X[i, j + 1]
    - X[i, j]` (a difference), `Y[i, j] = X[i, 2 * j + 1] * 2` (a strided slice, scaled): the element-wise rule
    reads operands at the output's indices, the copy rule (select_copy.py) moves a shifted or strided read alone. So
    each such read is copied into a temporary first, `X_at[i, j] = X[i, j + 1]`, and the statement reads that; so
    is a nearest upsampling read, `Y[i, j] = P[i / 2, j / 2] + L[i, j]` (an FPN's upsample-and-add: `P_at[i, j] =
    P[i / 2, j / 2]`, a copy the copy rule replicates on chip).
    The temporary has the read's dtype (a copy: the same values); it is filled before the top-level statement that
    holds the original, so only when that statement's nest writes nothing the read reads and every loop starts at 0.
    A read's indices must each be `s*v + c` or `v / k` of one loop variable (s, k >= 1), distinct, in the output's
    loop order; a plain read over part of a dimension (`X[i, j]` for j < N - 1 beside `X[i, j + 1]`) is copied too
    (a crop)."""
    from tilec.errors import TilecError
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []

    def moved_vars(a: sx.Access, loop_vars: list[str], out: list[str], by_var: dict[str, sx.Loop]) -> list[str] | None:
        """The read's loop variables when it is shifted, strided or cropped (a plain read of part of a dimension),
        each index `s*v + c`."""
        vs, plain_read = [], True
        for ix in a.indices:
            if isinstance(ix, sx.BinOp) and ix.op == "/":  # `v / k`: a nearest upsampling read (select_copy)
                from tilec.compiler.select_copy import read_index
                found = read_index(ix, set(loop_vars), program.sizes)
                if found is None:
                    return None
                vs.append(found[0])
                plain_read = False
                continue
            try:
                coefs, const = affine_index(ix, set(loop_vars), program.sizes)
            except TilecError:
                return None
            if len(coefs) != 1 or next(iter(coefs.values())) < 1:
                return None
            v, s = next(iter(coefs.items()))
            vs.append(v)
            plain_read = plain_read and s == 1 and const == 0
        if len(set(vs)) != len(vs) or [v for v in out if v in vs] != vs:
            return None
        if plain_read:  # a plain read over the whole of each dimension is the element-wise rule's; over part, a crop
            from tilec.compiler.lower import size_value
            shape = [d if isinstance(d, int) else size_value(d, program.sizes) for d in program.tensors[a.tensor].shape]
            stops = [size_value(by_var[v].stop, program.sizes) for v in vs]
            return vs if stops != shape else None
        return vs

    def stmt(st: sx.Assign, loops: tuple[sx.Loop, ...], top_writes: set[str]) -> tuple[list[sx.Stmt], sx.Stmt]:
        if st.op != "=" or isinstance(st.value, sx.Access):
            return [], st
        loop_vars = [lp.var for lp in loops]
        out = [ix.id for ix in st.target.indices if isinstance(ix, sx.Name)]
        if len(out) != len(st.target.indices) or sorted(out) != sorted(loop_vars) \
                or any(not from_zero(lp) for lp in loops):
            return [], st
        by_var = {lp.var: lp for lp in loops}
        fills: list[sx.Stmt] = []
        new: dict[int, sx.Expr] = {}
        for a in accesses(st.value):
            vs = None if a.fill is not None or a.tensor in top_writes else moved_vars(a, loop_vars, out, by_var)
            if vs is None:
                continue
            span = a.span
            name = unique(f"{a.tensor}_at", taken)
            dtype = program.tensors[a.tensor].dtype
            decls.append(sx.Decl(name, sx.TensorType(dtype, tuple(by_var[v].stop for v in vs), span), span))
            idx = tuple(sx.Name(v, span) for v in vs)
            fill = nested(sx.Assign(sx.Access(name, idx, span), "=", a, st.span), [by_var[v] for v in vs])
            fills.append(fill)
            new[id(a)] = sx.Access(name, idx, span)
        if not new:
            return [], st
        return fills, replace(st, value=substituted(st.value, new))

    return rechecked(program, decls, hoisted(kernel.body, stmt))



def split_transposed_reads(program):
    """Element-wise statements that read one operand in the output's order and another transposed, `Y[i, j] = 0.5 *
    (X[i, j] + X[j, i])` (a symmetric part), `Y[b, i, j] = A[b, i, j] * B[b, j, i]`, `Y[i, j, k] = X[i, j, k] +
    c[k, j]`: no single order of the loops reads both as the element-wise rule needs (split_permuted_eltwise takes
    statements whose reads share one order), so each read whose loop variables come in another order than the
    output's is permuted into a temporary first, `X_t[i, j] = X[j, i]` (a transpose, select_transpose), and the
    statement reads that. The temporary has the read's dtype (a copy: the same values); it is filled before the
    top-level statement that holds the original, so only when that statement's nest writes nothing the read reads,
    every loop starts at 0, the stored indices are the loop variables (each once) and every read's indices are
    loop variables. The same object when there is none."""
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []

    def stmt(st: sx.Assign, loops: tuple[sx.Loop, ...], top_writes: set[str]) -> tuple[list[sx.Stmt], sx.Stmt]:
        out = _plain(st.target)
        loop_vars = [lp.var for lp in loops]
        if st.op != "=" or isinstance(st.value, sx.Access) or out is None or sorted(out) != sorted(loop_vars) \
                or any(not from_zero(lp) for lp in loops):
            return [], st
        reads = accesses(st.value)
        orders = [_plain(a) for a in reads]
        if any(o is None or a.fill is not None or not set(o) <= set(out) for a, o in zip(reads, orders)) \
                or not any(o == out for o in orders):
            return [], st  # a read that is not plain, or none in the output's order (split_permuted_eltwise's)
        by_var = {lp.var: lp for lp in loops}
        fills: list[sx.Stmt] = []
        new: dict[int, sx.Expr] = {}
        kept = _fused_read(st.value, out, reads, orders, top_writes)
        for a, o in zip(reads, orders):
            assert o is not None
            vs = [v for v in out if v in o]  # the read's variables in the output's order
            if o == vs or a.tensor in top_writes or a == kept:
                continue
            span = a.span
            name = unique(f"{a.tensor}_t", taken)
            dtype = program.tensors[a.tensor].dtype
            decls.append(sx.Decl(name, sx.TensorType(dtype, tuple(by_var[v].stop for v in vs), span), span))
            idx = tuple(sx.Name(v, span) for v in vs)
            fills.append(nested(sx.Assign(sx.Access(name, idx, span), "=", a, st.span), [by_var[v] for v in vs]))
            new[id(a)] = sx.Access(name, idx, span)
        if not new:
            return [], st
        return fills, replace(st, value=substituted(st.value, new))

    return rechecked(program, decls, hoisted(kernel.body, stmt))


def _fused_read(value: sx.Expr, out: list[str], reads, orders, top_writes: set[str]) -> sx.Access | None:
    """The one transposed read over all the loops that the transpose can read as it is, the others in the output's
    order (fn_chain.py: `X[i, j] + X[j, i]` in one pass), when every other transposed read is permuted first (`c[j,
    i]` of `A[b, i, j] * A[b, j, i] + c[j, i]`); else None."""
    moved = [a for a, o in zip(reads, orders) if o is not None and sorted(o) == sorted(out) and o != out]
    if not moved or any(a != moved[0] for a in moved):
        return None
    kept = moved[0]
    turned: dict[int, sx.Expr] = {}  # each other read as if permuted first: its variables in the output's order
    for a, o in zip(reads, orders):
        if a != kept and a.tensor not in top_writes:
            turned[id(a)] = sx.Access(a.tensor, tuple(sx.Name(v, a.span) for v in out if v in (o or ())), a.span)
    after = substituted(value, turned)
    return kept if syntax_fused(after, tuple(out), accesses(after)) is not None else None


MAX_HEADS = 64  # the reshape rewrite copies one part per value of the outer loop: at most this many parts


def split_reshape_copies(program):
    """A copy through a reshape of one dimension into two, `Y[h, s, d] = X[s, h * D + d]` (heads split) or `Y[s, h *
    D + d] = X[h, s, d]` (heads merge), d in 0..D: the index `h * D + d` reads (or writes) the dimension of H * D
    as the view [.., H, D]. No rule maps an index of two loop variables, so the copy is made once per value of h,
    each an ordinary copy of a crop into a part (select_copy, rules_move.copy: one HBM -> HBM DMA per block of
    partitions, rows of D elements):

        Y[0 + z, s, d] = X[s, d]               # h = 0 (z in 0..1 keeps h's dimension in the stored index)
        Y[1 + z, s, d] = X[s, d + D]           # h = 1 ...

    h as a plain index of the read becomes the constant (`X[1, s, d]`). Done when the statement is a plain copy
    alone in a perfect nest from 0 (as a top-level statement), the index is `h * D + d` (any order of the terms,
    plus a constant) with d's loop of exactly D iterations, and h's loop has at most MAX_HEADS iterations. The same
    object when there is none."""

    kernel = program.kernel
    sizes = program.sizes
    out: list[sx.Stmt] = []
    changed = False
    for top in kernel.body:
        loops, st = perfect_nest(top)
        found = None
        if loops and isinstance(st, sx.Assign) and st.op == "=" and isinstance(st.value, sx.Access) \
                and st.value.fill is None:
            ext = {lp.var: size_value(lp.stop, sizes) for lp in loops}
            found = _reshape_index(st, ext, sizes)
        if found is None:
            out.append(top)
            continue
        h, d, coef, const = found
        keep = any(isinstance(ix, sx.Name) and ix.id == h for ix in st.target.indices)
        names = {lp.var for lp in loops} | taken_names(kernel)
        z = unique("z", names)
        for hc in range(ext[h]):
            def index(e: sx.Expr) -> sx.Expr:
                span = e.span
                if uses_names(e, {h}) and uses_names(e, {d}):  # the reshape index: d plus the head's offset
                    off = hc * coef + const
                    return sx.BinOp("+", sx.Name(d, span), sx.Num(off, span), span) if off else sx.Name(d, span)
                if isinstance(e, sx.Name) and e.id == h:
                    if keep:
                        return sx.BinOp("+", sx.Name(z, span), sx.Num(hc, span), span) if hc else sx.Name(z, span)
                    return sx.Num(hc, span)
                return e
            dst = replace(st.target, indices=tuple(index(e) for e in st.target.indices))
            src = replace(st.value, indices=tuple(index(e) for e in st.value.indices))
            part_loops = [sx.Loop(z, sx.Num(0, lp.span), sx.Num(1, lp.span), (), lp.span) if lp.var == h else lp
                          for lp in loops if lp.var != h or keep]
            out.append(nested(replace(st, target=dst, value=src), part_loops))
        changed = True
    return resolved(program, replace(kernel, body=tuple(out))) if changed else program


def _reshape_index(st: sx.Assign, ext: dict[str, int], sizes: dict[str, int]) -> tuple[str, str, int, int] | None:
    """(h, d, D, constant) of the one index `h * D + d + constant` of the copy, each other index one loop variable
    or a constant; None when the copy has no such index or another one the copy rule does not take."""
    assert isinstance(st.value, sx.Access)
    names = set(ext)
    found = None
    for e in st.target.indices + st.value.indices:
        if not uses_names(e, names):
            continue
        if isinstance(e, sx.Name):
            continue
        try:
            coefs, const = affine_index(e, names, sizes)
        except TilecError:
            return None
        if len(coefs) != 2 or found is not None:
            return None
        (a, ca), (b, cb) = sorted(coefs.items(), key=lambda kv: kv[1])
        if ca != 1 or cb != ext[a] or ext[b] > MAX_HEADS or ext[b] < 2:
            return None
        found = (b, a, cb, const)
    return found

