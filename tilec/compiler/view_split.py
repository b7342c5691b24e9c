"""Merged indices read as the tensor's reshaped view (user20). A channel shuffle, a pixel shuffle and a group norm
index one dimension of a tensor with several loop variables,

    Y[n, c * G + g, h, w] = X[n, g * Cg + c, h, w]                      # ShuffleNet, G groups of Cg channels
    Y[n, c, 2 * h + i, 2 * w + j] = X[n, 4 * c + 2 * i + j, h, w]       # depth to space
    mu[n, q] += X[n, q * Cg + c, h, w] / (Cg * H * W)                   # group norm's statistics

which no rule maps (a store index must be a loop variable). Each such index is a position in a row-major view of
that dimension split in parts, one per loop variable (`c * G + g` with c in 0..Cg, g in 0..G: the dimension as
[Cg, G]), and a contiguous tensor reshapes freely. When every access of a tensor splits a dimension the same way,
the tensor is declared with that dimension split and indexed by the variables,

    Y[n, c, g, h, w] = X[n, g, c, h, w]                                 # a permute the rules map

and an input or output keeps its shape in the kernel's signature: the kernel views it split (`X_v =
X.reshape(...)`, pipeline.build_kernel; `Program.views` holds the shapes the signature keeps).

A split index is a sum `v1 * s1 + ... + vk * sk` (k >= 2, no constant) of loop variables from 0 whose coefficients
are the strides of their extents (sk = 1, s(i) = s(i+1) * extent(i+1), s1 * extent(1) = the dimension). A
tensor with a padded read, or with any access whose index there is something else (a plain variable, an offset),
keeps its shape. The same object when nothing is split."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses, product_factors
from tilec.compiler.lower import affine_index, size_value
from tilec.compiler.rewrite import resolved
from tilec.errors import TilecError
from tilec.lang import syntax as sx

Split = tuple[tuple[str, sx.Expr], ...]  # (loop variable, its extent's expression), outermost part first


def split_merged_dims(program):
    kernel = program.kernel
    splits = _splits(program)
    if not splits:
        return program
    types = {p.name: p.type for p in kernel.params} | {d.name: d.type for d in kernel.decls}
    new_types = {name: replace(types[name], shape=_shape(types[name].shape, dims)) for name, dims in splits.items()}
    params = tuple(replace(p, type=new_types.get(p.name, p.type)) for p in kernel.params)
    decls = tuple(replace(d, type=new_types.get(d.name, d.type)) for d in kernel.decls)
    body = tuple(_stmt(st, splits, program.sizes) for st in kernel.body)
    out = resolved(program, replace(kernel, params=params, decls=decls, body=body))
    kept = {name: program.tensors[name].shape for name in splits if program.tensors[name].kind != "temp"}
    return replace(out, views={**program.views, **kept})


def _splits(program) -> dict[str, dict[int, Split]]:
    """tensor -> {dimension: its split} for the tensors whose every access splits those dimensions alike; none
    unless some such tensor is stored at a split index (what no rule maps: a read of a window `2 * i + p` is a
    pool's, left as written)."""
    seen: dict[str, dict[int, Split | None]] = {}
    blocked: set[str] = set()
    stored: set[str] = set()
    for acc, loops, st in _accesses(program.kernel.body, {}):
        # (a grouped convolution's merged channels: select.ungroup; a contraction of plain reads may store at a
        # split index: a transposed conv's `Y[n, k, 2 * y + a, 2 * x + b]`, tconv_split.py)
        if acc.fill is not None or _contraction(st) and not (acc is st.target and _plain_reads(st)):
            blocked.add(acc.tensor)
            continue
        dims = seen.setdefault(acc.tensor, {})
        found = {d: _split(ix, loops, program.sizes, program.tensors[acc.tensor].shape[d])
                 for d, ix in enumerate(acc.indices)}
        for d, split in found.items():
            dims[d] = split if d not in dims else dims[d] if _same(dims[d], split, program) else None
        if st.op != "=" and not _reduced_run(acc, found, st):
            blocked.add(acc.tensor)
        if acc is st.target and any(found.values()):
            stored.add(acc.tensor)
    out = {}
    for name, dims in seen.items():
        good = {d: sp for d, sp in dims.items() if sp is not None}
        if good and name not in blocked:
            out[name] = good
    return out if set(out) & stored else {}


def _contraction(st: sx.Assign) -> bool:
    """A sum of products of two tensors (a matmul, a convolution): left to the contraction rules as written."""
    if st.op != "+=":
        return False
    factors, _ = product_factors(st.value)
    single = [{a.tensor for a in accesses(f)} for f in factors]
    return sum(len(t) == 1 for t in single) >= 2


def _plain_reads(st: sx.Assign) -> bool:
    return all(isinstance(ix, sx.Name) for a in accesses(st.value) for ix in a.indices)


def _reduced_run(acc: sx.Access, found: dict[int, Split | None], st: sx.Assign) -> bool:
    """Whether, split, the access of a reduction reads its reduced loops (those not indexing the target) as one run
    of consecutive dimensions, which the reduction rules need (group norm's `X[n, q * Cg + c, h, w]`: c, h, w)."""
    kept = {ix.id for ix in st.target.indices if isinstance(ix, sx.Name)}
    names: list[set[str]] = []
    for d, ix in enumerate(acc.indices):
        split = found.get(d)
        names += [{v} for v, _ in split] if split else [_names(ix)]
    reduced = [i for i, vs in enumerate(names) if vs - kept]
    return not reduced or reduced == list(range(reduced[0], reduced[-1] + 1))


def _same(a: Split | None, b: Split | None, program) -> bool:
    """Whether two accesses split a dimension into the same parts (their variables may differ), or both not."""
    if a is None or b is None:
        return a is b
    return [size_value(stop, program.sizes) for _, stop in a] == [size_value(stop, program.sizes) for _, stop in b]


def _accesses(body: tuple[sx.Stmt, ...], loops: dict[str, sx.Loop]):
    """Every access (the store, then the reads) below `body`, with the loops around it by variable and its
    statement."""
    for st in body:
        if isinstance(st, sx.Loop):
            yield from _accesses(st.body, {**loops, st.var: st})
        elif isinstance(st, sx.Assign):
            for acc in [st.target, *accesses(st.value)]:
                yield acc, loops, st


def _split(ix: sx.Expr, loops: dict[str, sx.Loop], sizes: dict[str, int], extent: int) -> Split | None:
    """The split a merged index reads its dimension (of `extent`) as, or None (a plain or offset index)."""
    try:
        coefs, const = affine_index(ix, set(loops), sizes)
        starts = {v: size_value(loops[v].start, sizes) for v in coefs}
        stops = {v: size_value(loops[v].stop, sizes) for v in coefs}
    except TilecError:
        return None
    if const != 0 or len(coefs) < 2 or any(starts.values()):
        return None
    order = sorted(coefs, key=lambda v: -coefs[v])
    stride = 1
    for v in reversed(order):
        if coefs[v] != stride:
            return None
        stride *= stops[v]
    if stride != extent:
        return None
    return tuple((v, loops[v].stop) for v in order)


def _shape(shape: tuple[sx.Expr, ...], dims: dict[int, Split]) -> tuple[sx.Expr, ...]:
    out: list[sx.Expr] = []
    for d, e in enumerate(shape):
        out += [stop for _, stop in dims[d]] if d in dims else [e]
    return tuple(out)


Splits = dict[str, dict[int, Split]]


def _stmt(st: sx.Stmt, splits: Splits, sizes: dict[str, int]) -> sx.Stmt:
    if isinstance(st, sx.Loop):
        return replace(st, body=tuple(_stmt(c, splits, sizes) for c in st.body))
    if isinstance(st, sx.Assign):
        return replace(st, target=_access(st.target, splits, sizes), value=_expr(st.value, splits, sizes))
    return st


def _expr(e: sx.Expr, splits: Splits, sizes: dict[str, int]) -> sx.Expr:
    if isinstance(e, sx.Access):
        return _access(e, splits, sizes)
    if isinstance(e, sx.Neg):
        return replace(e, x=_expr(e.x, splits, sizes))
    if isinstance(e, sx.BinOp):
        return replace(e, lhs=_expr(e.lhs, splits, sizes), rhs=_expr(e.rhs, splits, sizes))
    if isinstance(e, sx.Call):
        return replace(e, args=tuple(_expr(a, splits, sizes) for a in e.args))
    return e


def _access(a: sx.Access, splits: Splits, sizes: dict[str, int]) -> sx.Access:
    """The access with each split dimension's index as its variables, outermost part first."""
    dims = splits.get(a.tensor)
    if not dims:
        return a
    out: list[sx.Expr] = []
    for d, ix in enumerate(a.indices):
        if d not in dims:
            out.append(ix)
            continue
        coefs, _ = affine_index(ix, _names(ix) - set(sizes), sizes)
        out += [sx.Name(v, ix.span) for v in sorted(coefs, key=lambda v: -coefs[v])]
    return replace(a, indices=tuple(out))


def _names(e: sx.Expr) -> set[str]:
    if isinstance(e, sx.Name):
        return {e.id}
    if isinstance(e, sx.Neg):
        return _names(e.x)
    if isinstance(e, sx.BinOp):
        return _names(e.lhs) | _names(e.rhs)
    return set()
