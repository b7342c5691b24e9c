"""Source rewrites for forms a new user writes that no rule maps as written (lang15; issue 13's audit13
reproducers). Like pad_split, reduce_split and permute_split, each turns a statement into ordinary statements the
rules map, and the rewritten kernel is checked again as if the user had written it.

- fold_value_sizes: a size read as a value, `Y[n, c] = S[n, c] / (H * W)` (a mean's last step): sizes are known
  at compile time, so the constant subexpression becomes one number, computed as the program computes it (float32
  arithmetic on the size's value; tilec/lang/evaluator.py reads a size in a value as float32)."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses, const_value
from tilec.compiler.lower import uses_names
from tilec.compiler.rewrite import leaves, perfect_nest, resolved
from tilec.lang import syntax as sx


def _contraction(value: sx.Expr) -> bool:
    """A product of two or more tensor reads (and constants), not all the same read (`X[i, j] * X[i, j]` is a
    reduction's square, which keeps its form)."""
    from tilec.compiler.exprs import product_factors
    factors, _ = product_factors(value)
    return len(factors) >= 2 and all(isinstance(f, sx.Access) for f in factors) and len(set(factors)) > 1


def fold_value_sizes(program):
    """The program with each element-wise (`=`) statement's constant subexpressions that read a size folded into a
    number; the same object when no statement reads a size in its value. Reductions keep their form (their rules
    fold `X / (H * W)` themselves), except contractions (`G += F[..] * F[..] / (C * L)`: a constant factor of the
    product is a number to their rules)."""
    sizes = program.sizes
    names = set(sizes)
    changed = False

    def fold(e: sx.Expr) -> sx.Expr:
        if isinstance(e, sx.Access):
            return e  # indices are sizes' own business
        if uses_names(e, names) and not _reads(e):
            v = const_value(e, sizes)
            if v is not None:
                return sx.Num(int(v) if v.is_integer() else v, e.span)
        if isinstance(e, sx.Neg):
            return replace(e, x=fold(e.x))
        if isinstance(e, sx.BinOp):
            return replace(e, lhs=fold(e.lhs), rhs=fold(e.rhs))
        if isinstance(e, sx.Call):
            return replace(e, args=tuple(fold(a) for a in e.args))
        return e

    def stmt(st: sx.Stmt, loop_vars: frozenset[str]) -> sx.Stmt:
        nonlocal changed
        if isinstance(st, sx.Loop):
            inner = loop_vars | {st.var}
            return replace(st, body=tuple(stmt(c, inner) for c in st.body))
        if st.op not in ("=", "+=") or loop_vars & names:
            return st
        value = fold(st.value)
        if value == st.value or st.op == "+=" and not _contraction(value):
            return st
        changed = True
        return replace(st, value=value)

    body = tuple(stmt(st, frozenset()) for st in program.kernel.body)
    return resolved(program, replace(program.kernel, body=body)) if changed else program



def drop_identity_casts(program):
    """The program with every `f32(e)` whose operand reads only f32 tensors (and rounds to no f16/bf16 on the way)
    replaced by `e`: the language computes in float32, so such a conversion changes no value, and the rules that
    fold a statement's arithmetic (a scale, a bias, a square summed on the side) see through no conversion
    (`f32(f32(h[i, j]) * r[i])` of f32 tensors built 1.57x slower than `h[i, j] * r[i]` on the model: a program
    written once for several dtypes). The same object when there is none."""
    f32 = {name for name, t in program.tensors.items() if t.dtype == "f32"}
    changed = False

    def drop(e: sx.Expr) -> sx.Expr:
        nonlocal changed
        if isinstance(e, sx.Call):
            args = tuple(drop(a) for a in e.args)
            if e.fn == "f32" and len(args) == 1 and all(a.tensor in f32 for a in accesses(args[0])) \
                    and not _narrowing(args[0]):
                changed = True
                return args[0]
            return replace(e, args=args)
        if isinstance(e, sx.Neg):
            return replace(e, x=drop(e.x))
        if isinstance(e, sx.BinOp):
            return replace(e, lhs=drop(e.lhs), rhs=drop(e.rhs))
        return e

    def stmt(st: sx.Stmt) -> sx.Stmt:
        if isinstance(st, sx.Loop):
            return replace(st, body=tuple(stmt(c) for c in st.body))
        return replace(st, value=drop(st.value))

    body = tuple(stmt(st) for st in program.kernel.body)
    return resolved(program, replace(program.kernel, body=body)) if changed else program


def _narrowing(e: sx.Expr) -> bool:
    """Whether the expression converts something to f16 or bf16 (its value is then of that dtype)."""
    if isinstance(e, sx.Call):
        return e.fn in ("f16", "bf16") or any(_narrowing(a) for a in e.args)
    if isinstance(e, sx.Neg):
        return _narrowing(e.x)
    if isinstance(e, sx.BinOp):
        return _narrowing(e.lhs) or _narrowing(e.rhs)
    return False


def _reads(e: sx.Expr) -> bool:
    """Whether the expression reads a tensor (it is not a constant of sizes)."""
    if isinstance(e, sx.Access):
        return True
    if isinstance(e, sx.Neg):
        return _reads(e.x)
    if isinstance(e, sx.BinOp):
        return _reads(e.lhs) or _reads(e.rhs)
    if isinstance(e, sx.Call):
        return any(_reads(a) for a in e.args)
    return False


def split_conv_layouts(program):
    """Convolutions whose tensors are stored in another layout than the conv rule reads (select_conv: weights
    [k, c, taps...] or [c, k, taps...], input [batch.., c, rows, cols], output [batch.., k, rows, cols]):
    TensorFlow's HWIO weights `W[r, s, c, k]` and NHWC tensors `X[n, y + r - 1, x + s - 1, c]`, `Y[n, y, x, k]`.
    Each such tensor is permuted once, in its own statement (the permute path, select_permute.py):

        W_kc[k, c, r, s] = W[r, s, c, k]            # weights: before the conv's nest
        X_c[n, c, h, w] = X[n, h, w, c]             # the input: before it
        Y_c[n, k, y, x] = 0 / += ...                # the conv (and the statements of its nest writing Y) into Y_c
        Y[n, y, x, k] = Y_c[n, k, y, x]             # the output: after it

    Done for a `+=` statement whose update is a product of two reads (a sign, a constant factor, a relu of an
    operand and a padded read kept as written), the output indexed by plain loop variables, one read (the weights)
    by plain loop variables with exactly one output variable, the other (the input) reading some summed variable
    inside a window index (the taps: a matmul has none and is left to select_conv). The temporaries have their
    tensor's dtype (a permute moves values). The same object when nothing is rewritten."""
    from tilec.compiler.exprs import accesses, product_factors
    from tilec.compiler.names import unique
    from tilec.compiler.rewrite import nested, rechecked, taken_names
    from tilec.compiler.select_conv import strip_activation
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    body: list[sx.Stmt] = []

    def shape_of(name: str) -> list[int]:
        from tilec.compiler.lower import size_value
        return [d if isinstance(d, int) else size_value(d, program.sizes) for d in program.tensors[name].shape]

    def permute(dst: str, dst_order: list[int], src: str, read: sx.Access, span,
                shape: list[int] | None = None) -> sx.Stmt:
        """`dst[..] = src[..]` over src's whole shape (`shape` for a new temporary), dst's dimension i being src's
        dimension dst_order[i]; the loops are named after `read`'s plain indices (the program's names), else
        SRC0, SRC1, ..."""
        shape = shape or shape_of(src)
        plain = [ix.id if isinstance(ix, sx.Name) else None for ix in read.indices]
        names = [v if v is not None and plain.count(v) == 1 else unique(f"{src.lower()}{i}", taken | set(plain))
                 for i, v in enumerate(plain)]
        loops = [sx.Loop(v, sx.Num(0, span), sx.Num(n, span), (), span) for v, n in zip(names, shape)]
        read = sx.Access(src, tuple(sx.Name(v, span) for v in names), span)
        store = sx.Access(dst, tuple(sx.Name(names[i], span) for i in dst_order), span)
        return nested(sx.Assign(store, "=", read, span), loops)

    def declare(base: str, like: str, order: list[int], span) -> str:
        name = unique(base, taken)
        shape = shape_of(like)
        dtype = program.tensors[like].dtype
        decls.append(sx.Decl(name, sx.TensorType(dtype, tuple(sx.Num(shape[i], span) for i in order), span), span))
        return name

    for top in kernel.body:
        found = _conv_layout(top, strip_activation, accesses, product_factors) or \
            _batch_after_rows(top, strip_activation, accesses, product_factors)
        if found is None:
            body.append(top)
            continue
        st, w, w_order, x, x_order, y_order = found
        before: list[sx.Stmt] = []
        after: list[sx.Stmt] = []
        new: dict[int, sx.Expr] = {}
        if w_order is not None:
            wk = declare(f"{w.tensor}_kc", w.tensor, w_order, w.span)
            before.append(permute(wk, w_order, w.tensor, w, w.span))
            new[id(w)] = replace(w, tensor=wk, indices=tuple(w.indices[i] for i in w_order))
        if x_order is not None:
            xc = declare(f"{x.tensor}_c", x.tensor, x_order, x.span)
            before.append(permute(xc, x_order, x.tensor, x, x.span))
            new[id(x)] = replace(x, tensor=xc, indices=tuple(x.indices[i] for i in x_order))
        target = st.target.tensor
        yc = declare(f"{target}_c", target, y_order, st.target.span) if y_order is not None else None
        if yc is not None:
            back = [y_order.index(i) for i in range(len(y_order))]  # Y's dimension i is Y_c's dimension back[i]
            moved = replace(st.target, indices=tuple(st.target.indices[i] for i in y_order))
            after.append(permute(target, back, yc, moved, st.target.span, [shape_of(target)[i] for i in y_order]))
        body += before + [_rewritten(top, st, new, target, yc, y_order)] + after
    return rechecked(program, decls, body)


def _rewritten(top: sx.Stmt, conv: sx.Assign, new: dict[int, sx.Expr], target: str, yc: str | None,
               y_order: list[int] | None) -> sx.Stmt:
    """The top-level nest with the conv's reads replaced (`new`) and, with `yc`, every store into and read of
    `target` in the nest made on `yc` with its indices in `y_order`."""
    from tilec.compiler.rewrite import substituted

    def moved(a: sx.Access) -> sx.Access:
        if yc is None or a.tensor != target:
            return a
        assert y_order is not None
        return replace(a, tensor=yc, indices=tuple(a.indices[i] for i in y_order))

    def stmt(st: sx.Stmt) -> sx.Stmt:
        if isinstance(st, sx.Loop):
            return replace(st, body=tuple(stmt(c) for c in st.body))
        value = substituted(st.value, new) if st is conv else st.value
        return replace(st, target=moved(st.target), value=sx.map_reads(value, moved))
    return stmt(top)


def _conv_layout(top: sx.Stmt, strip_activation, accesses, product_factors):
    """(the conv statement, its weights' read, the weights' new order or None, the input's read, its new order or
    None, the output's new order or None) when a statement of this top-level nest is a conv with a tensor to
    permute; else None. An order lists, for each new dimension, the old dimension it is."""
    for st, loops in leaves(top):
        if not isinstance(st, sx.Assign) or st.op != "+=":
            continue
        out = [ix.id for ix in st.target.indices if isinstance(ix, sx.Name)]
        if len(out) != len(st.target.indices) or len(set(out)) != len(out):
            continue
        red = [v for v in loops if v not in out]
        factors, _ = product_factors(st.value)
        reads = [strip_activation(f)[0] for f in factors]
        if len(reads) != 2 or not all(isinstance(r, sx.Access) for r in reads) or len(accesses(st.value)) != 2:
            continue
        for w, x in (reads, reads[::-1]):
            assert isinstance(w, sx.Access) and isinstance(x, sx.Access)
            names = [ix.id if isinstance(ix, sx.Name) else None for ix in w.indices]
            if w.fill is not None or None in names or len(set(names)) != len(names):
                continue
            ks = [v for v in names if v in out]
            if len(ks) != 1 or not all(v in red for v in names if v not in ks):
                continue
            k = ks[0]
            x_plain = [ix.id if isinstance(ix, sx.Name) else None for ix in x.indices]
            taps = [v for v in red if any(not isinstance(ix, sx.Name) and _uses(ix, v) for ix in x.indices)]
            if not taps:
                continue  # a matmul: select_conv takes its layouts
            plain_names = [v for v in names if v is not None]
            cs = [v for v in plain_names if v in red and v in x_plain]
            tap_order = sorted((v for v in plain_names if v in taps),
                               key=lambda v: next(i for i, ix in enumerate(x.indices) if _uses(ix, v)))
            if set(names) != {k, *cs, *tap_order}:
                continue
            want_w = [k, *cs, *tap_order]  # the layout the conv builders take best (HWIO -> [c, k, r, s]: 2x slower)
            w_order = None
            if names not in (want_w, [*cs, k, *tap_order]):  # [c, k, taps] is read as it is too
                w_order = [names.index(v) for v in want_w]
            # the input: [batch.., c, window...]; batch = its leading plain output variables
            batch = []
            for v in x_plain:
                if v is None or v not in out or v == k:
                    break
                batch.append(v)
            x_order = None
            ch = cs[0] if len(cs) == 1 else k if not cs else None  # the input's channel (a depthwise one's is k)
            if ch is not None and ch in x_plain:
                ci = x_plain.index(ch)
                want_x = list(range(len(batch))) + [ci] + [i for i in range(len(batch), len(x_plain)) if i != ci]
                if want_x != list(range(len(x_plain))):
                    x_order = want_x
            # the output: [batch.., k, spatial in the input's window order]
            spatial = [v for ix in x.indices for v in out if v not in batch and v != k and _uses(ix, v)]
            want_y = batch + [k] + spatial
            if sorted(want_y) != sorted(out):
                continue
            y_order = [out.index(v) for v in want_y] if want_y != out else None
            if w_order is None and x_order is None and y_order is None:
                return None
            return st, w, w_order, x, x_order, y_order
    return None


def _batch_after_rows(top: sx.Stmt, strip_activation, accesses, product_factors):
    """A batched matmul whose output puts its batch indices after others, `C[i, b, j] += A[b, i, k] * B[b, k, j]`:
    (the statement, None, None, None, None, the output's order with the batch first), as _conv_layout answers, when
    both reads are indexed by plain loop variables and begin with the same batch indices (the output variables
    both read), and the output does not; else None. The matmul then writes C_c[b, i, j] and a permute stores C."""
    for st, loops in leaves(top):
        if not isinstance(st, sx.Assign) or st.op != "+=":
            continue
        out = [ix.id for ix in st.target.indices if isinstance(ix, sx.Name)]
        factors, _ = product_factors(st.value)
        reads = [strip_activation(f)[0] for f in factors]
        if len(out) != len(st.target.indices) or len(reads) != 2 or len(accesses(st.value)) != 2 \
                or not all(isinstance(r, sx.Access) and r.fill is None for r in reads):
            continue
        names = [[ix.id if isinstance(ix, sx.Name) else None for ix in r.indices] for r in reads]
        if any(None in n for n in names):
            continue
        batch = [v for v in names[0] if v in out and v in names[1]]
        if not batch or any(n[:len(batch)] != batch for n in names) or out[:len(batch)] == batch:
            continue
        want = batch + [v for v in out if v not in batch]
        return st, None, None, None, None, [out.index(v) for v in want]
    return None


def _uses(e: sx.Expr, v: str) -> bool:
    return uses_names(e, {v})


MAX_TILES = 64  # a modulo read is copied as one part per repeat of its period: at most this many parts


def split_modulo_reads(program):
    """A read tiled by a floor modulo, `Y[i, j] = X[i % 4, j] + Z[i, j]` (X repeated down Y's rows): no rule maps
    `%`, so the read is copied into a temporary shaped like the output, one ordinary copy of X per repeat (a part
    of a concatenation: select_copy, one HBM -> HBM DMA each), and the statement reads the temporary:

        X_at[0 + z, j] = X[z, j]          # rows 0..4
        X_at[4 + z, j] = X[z, j]          # rows 4..8, ... (H / 4 parts)
        Y[i, j] = X_at[i, j] + Z[i, j]    # element-wise (a plain copy needs no temporary: the parts go to Y)

    Done for an element-wise (`=`) statement in a perfect nest from 0 (a top-level statement) storing at plain loop
    variables, whose read's indices are each a loop variable or `v % m` (m a constant dividing v's trip count, at
    most MAX_TILES repeats), in the output's loop order; the temporary has the read's dtype (a copy). The same object
    when there is none."""
    from tilec.compiler.exprs import accesses
    from tilec.compiler.lower import size_value
    from tilec.compiler.names import unique
    from tilec.compiler.rewrite import nested, rechecked, substituted, taken_names
    kernel = program.kernel
    sizes = program.sizes
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    body: list[sx.Stmt] = []
    for top in kernel.body:
        loops, st = perfect_nest(top)
        out = [ix.id for ix in st.target.indices if isinstance(ix, sx.Name)] if isinstance(st, sx.Assign) else []
        if not isinstance(st, sx.Assign) or st.op != "=" or len(out) != len(st.target.indices) \
                or sorted(out) != sorted(lp.var for lp in loops):
            body.append(top)
            continue
        ext = {lp.var: size_value(lp.stop, sizes) for lp in loops}
        by_var = {lp.var: lp for lp in loops}
        parts: list[sx.Stmt] = []
        new: dict[int, sx.Expr] = {}
        for a in accesses(st.value):
            tiled = _modulo_read(a, out, ext, sizes)
            if tiled is None or a.tensor == st.target.tensor:
                continue
            v, m, vs = tiled
            span = a.span
            copy = st.value is a
            if copy:
                dst, dst_idx = st.target.tensor, list(st.target.indices)
            else:
                dst = unique(f"{a.tensor}_at", taken)
                dtype = program.tensors[a.tensor].dtype
                decls.append(sx.Decl(dst, sx.TensorType(dtype, tuple(by_var[u].stop for u in vs), span), span))
                dst_idx = [sx.Name(u, span) for u in vs]
            z = unique("z", taken | set(ext))
            for q in range(ext[v] // m):
                def at(e: sx.Expr) -> sx.Expr:
                    if isinstance(e, sx.Name) and e.id == v:
                        return sx.BinOp("+", sx.Num(q * m, span), sx.Name(z, span), span) if q else sx.Name(z, span)
                    return e
                read = replace(a, indices=tuple(sx.Name(z, span) if isinstance(ix, sx.BinOp) else ix
                                                for ix in a.indices))
                part_loops = [sx.Loop(z, sx.Num(0, span), sx.Num(m, span), (), span) if u == v else by_var[u]
                              for u in (out if copy else vs)]
                parts.append(nested(sx.Assign(sx.Access(dst, tuple(at(e) for e in dst_idx), span), "=", read, st.span),
                                    part_loops))
            if copy:
                break
            new[id(a)] = sx.Access(dst, tuple(dst_idx), span)
        if not parts:
            body.append(top)
        elif st.value is not None and isinstance(st.value, sx.Access) and not new:
            body += parts  # a plain tiling copy: its parts are the statement
        else:
            body += parts + [nested(replace(st, value=substituted(st.value, new)), loops)]
    if not decls and body == list(kernel.body):
        return program
    if not decls:
        return resolved(program, replace(kernel, body=tuple(body)))
    return rechecked(program, decls, body)


def _modulo_read(a: sx.Access, out: list[str], ext: dict[str, int], sizes: dict[str, int]
                 ) -> tuple[str, int, list[str]] | None:
    """(v, m, the read's loop variables) when the read's one modulo index is `v % m` (m dividing v's trip count, at
    most MAX_TILES repeats) and every other index a loop variable, all in the output's order; else None."""
    from tilec.compiler.lower import size_value
    if a.fill is not None:
        return None
    found = None
    vs: list[str] = []
    for ix in a.indices:
        if isinstance(ix, sx.Name) and ix.id in ext:
            vs.append(ix.id)
            continue
        if not (isinstance(ix, sx.BinOp) and ix.op == "%" and isinstance(ix.lhs, sx.Name) and ix.lhs.id in ext) \
                or uses_names(ix.rhs, set(ext)) or found is not None:
            return None
        m = size_value(ix.rhs, sizes)
        v = ix.lhs.id
        if m < 1 or ext[v] % m or ext[v] // m > MAX_TILES:
            return None
        found = (v, m)
        vs.append(v)
    if found is None or len(set(vs)) != len(vs) or [u for u in out if u in vs] != vs:
        return None
    return found[0], found[1], vs


def split_self_products(program):
    """A contraction of a tensor with itself at other indices, `G[i, j] += A[i, k] * A[j, k]` (a Gram matrix,
    `A A^T`): the contraction's builders name their buffers after the operands, so the second read is made of a copy,
    `A_2[j, k] = A[j, k]` over A's whole shape (one HBM -> HBM DMA), put before the top-level nest. Done for a `+=`
    whose update is a product of two reads of one input or earlier-written tensor, at different indices; the same
    object when there is none."""
    from tilec.compiler.exprs import accesses, product_factors
    from tilec.compiler.names import unique
    from tilec.compiler.rewrite import hoisted, rechecked, substituted, taken_names
    from tilec.compiler.select_conv import strip_activation
    kernel = program.kernel
    taken = taken_names(kernel)
    decls: list[sx.Decl] = []
    copies: dict[str, str] = {}

    def shape_of(name: str) -> list[int]:
        from tilec.compiler.lower import size_value
        return [d if isinstance(d, int) else size_value(d, program.sizes) for d in program.tensors[name].shape]

    def leaf(st: sx.Assign, loops: tuple[sx.Loop, ...], top_writes: set[str]) -> tuple[list[sx.Stmt], sx.Stmt]:
        if st.op != "+=":
            return [], st
        reads = [strip_activation(f)[0] for f in product_factors(st.value)[0]]
        if len(reads) != 2 or len(accesses(st.value)) != 2 or not all(isinstance(r, sx.Access) for r in reads):
            return [], st
        a, b = reads
        assert isinstance(a, sx.Access) and isinstance(b, sx.Access)
        if a.tensor != b.tensor or a.indices == b.indices or a.tensor in top_writes or _gram(st, a, b):
            return [], st
        span = b.span
        fills: list[sx.Stmt] = []
        if a.tensor not in copies:
            copies[a.tensor] = unique(f"{a.tensor}_2", taken)
            shape = shape_of(a.tensor)
            dtype = program.tensors[a.tensor].dtype
            decls.append(sx.Decl(copies[a.tensor], sx.TensorType(dtype, tuple(sx.Num(n, span) for n in shape), span),
                                 span))
            names = [unique(f"{a.tensor.lower()}{i}", set(taken)) for i in range(len(shape))]
            idx = tuple(sx.Name(v, span) for v in names)
            fill: sx.Stmt = sx.Assign(sx.Access(copies[a.tensor], idx, span), "=", sx.Access(a.tensor, idx, span), span)
            for v, n in reversed(list(zip(names, shape))):
                fill = sx.Loop(v, sx.Num(0, span), sx.Num(n, span), (fill,), span)
            fills.append(fill)
        return fills, replace(st, value=substituted(st.value, {id(b): replace(b, tensor=copies[a.tensor])}))

    return rechecked(program, decls, hoisted(kernel.body, leaf))


def _gram(st: sx.Assign, a: sx.Access, b: sx.Access) -> bool:
    """`G[.., i, j] += A[.., i, k] * A[.., j, k]` (or A[k, i] A[k, j]): the two reads differ only in the output's
    last two indices swapped, so the matmul's band of A holds every stationary tile too (build_conv reads it from
    there: conv_batched.shares_band); no copy."""
    out = st.target.indices[-2:]
    if len(out) != 2 or not all(isinstance(ix, sx.Name) for ix in out) or out[0] == out[1]:
        return False
    swap = {out[0]: out[1], out[1]: out[0]}
    return b.indices == tuple(swap.get(ix, ix) for ix in a.indices) and out[0] in a.indices and out[1] in b.indices


def split_mixed_broadcasts(program):
    """Broadcast operands of one element-wise statement over different runs of its indices, `Y[n, k, l] = (X[n, k, l]
    - mu[n, k]) * g[k]` (group norm's per-group scale; audit15) or `0.5 * X[i, j, k] - 2 * a[i] + 3 * b[j]`: the
    rules put one run of the output's indices on the partitions for all column operands (reads that leave the last
    output index free) and broadcast one run along the free axis for all rows (reads that end at it), the row's run
    after the columns'. So the reads are widened first, each into a temporary indexed by its kind's union of indices
    (the union of both when a column's indices overlap a row's: `g[k]` inside `a[k, l]`), one small broadcast copy
    before the statement's nest each:

        g_at[n, k] = g[k]
        Y[n, k, l] = (X[n, k, l] - mu[n, k]) * g_at[n, k]

    Done for reads indexed by plain loop variables of the statement's output, in its order (fewer than it has); a
    temporary has the loops' extents and the read's dtype. A statement whose columns share one run and whose rows
    share one run is left as written (`b[j]` and `c[i]` in Y[i, j]); the same object when every statement is."""
    from tilec.compiler.exprs import accesses
    from tilec.compiler.names import unique
    from tilec.compiler.rewrite import hoisted, nested, rechecked, substituted, taken_names
    taken = taken_names(program.kernel)
    decls: list[sx.Decl] = []

    def leaf(st: sx.Assign, loops: tuple[sx.Loop, ...], top_writes: set[str]) -> tuple[list[sx.Stmt], sx.Stmt]:
        out = [ix.id for ix in st.target.indices if isinstance(ix, sx.Name)]
        by_var = {lp.var: lp for lp in loops}
        if st.op != "=" or len(out) != len(st.target.indices) or not set(out) <= set(by_var):
            return [], st
        runs = {id(a): vs for a in accesses(st.value)
                if a.tensor != st.target.tensor and (vs := _broadcast_vars(a, out)) is not None}
        reads = [a for a in accesses(st.value) if id(a) in runs]
        cols = set().union(*(runs[id(a)] for a in reads if runs[id(a)][-1] != out[-1]))
        rows = set().union(*(runs[id(a)] for a in reads if runs[id(a)][-1] == out[-1]))
        if cols & rows:
            cols = rows = cols | rows
        fills: list[sx.Stmt] = []
        new: dict[int, sx.Expr] = {}
        for a in reads:
            vs = runs[id(a)]
            want = [v for v in out if v in (rows if vs[-1] == out[-1] or cols is rows else cols)]
            if vs == want:
                continue
            span = a.span
            name = unique(f"{a.tensor}_at", taken)
            taken.add(name)
            shape = tuple(by_var[v].stop for v in want)
            decls.append(sx.Decl(name, sx.TensorType(program.tensors[a.tensor].dtype, shape, span), span))
            at = sx.Access(name, tuple(sx.Name(v, span) for v in want), span)
            fills.append(nested(sx.Assign(at, "=", a, st.span), [by_var[v] for v in want]))
            if a.tensor in inputs:
                first.append(fills.pop())
            new[id(a)] = at
        if not new:
            return [], st
        return fills, replace(st, value=substituted(st.value, new))

    # a widened kernel input goes first: its statement reads nothing the kernel writes, and in front of the row
    # chain it would split (group norm's g_at between the statistics and Y: cols17) it leaves the chain whole
    inputs = {t.name for t in program.inputs}
    first: list[sx.Stmt] = []
    body = hoisted(program.kernel.body, leaf)
    return rechecked(program, decls, first + body)


def _broadcast_vars(a: sx.Access, out: list[str]) -> list[str] | None:
    """The loop variables of a read indexed by a strict subset of the output's, each plain, in the output's order."""
    if a.fill is not None or not a.indices or len(a.indices) >= len(out):
        return None
    vs = [ix.id for ix in a.indices if isinstance(ix, sx.Name) and ix.id in out]
    if len(vs) != len(a.indices) or len(set(vs)) != len(vs) or [u for u in out if u in vs] != vs:
        return None
    return vs
