"""Operation selection: recognise what each lowered computation is and which engines run it.

    Conv      conv[n,k,y,x] (= bias[k]) += X[n,c,y+r,x+s] * W[k,c,r,s]   -> nc_matmul, shifted, PSUM-accumulated
              (a matmul C[m,n] += A[m,k] * B[k,n] is the same pattern with no batch, one spatial dim, 1x1 taps)
              with fused epilogues: relu (activation), window max/avg pool of the conv output (vector engine)
    Pool      Y[n,k,i,j] max= X[n,k,2i+p,2j+q] (or += ... / 4)           -> tensor_tensor over strided views
    Transpose B[j,i] = A[i,j]                                             -> nc_transpose (or dma_transpose)
    Eltwise   C[i..] = f(A[i..], B[i..], constants)                       -> tensor_tensor / tensor_scalar / activation
              with broadcast reads b[i] of a run of the output's indices (not the last): a (P, 1) column per tile,
              and chains `T = f(..); C = g(T, ..)` of element-wise statements fused into one pass (T never stored)

Anything else is a TilecError that points at the statement. Each op keeps `vars`: role -> the .tl loop variable, so
schedule directives can name loops by the user's names (`conv.y`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from tilec.compiler.exprs import accesses, const_value, fmt_expr, strip_relu, strip_scale
from tilec.compiler.lower import Comp, affine_index, rename_vars
from tilec.errors import Span, TilecError
from tilec.lang import syntax as sx


@dataclass(frozen=True)
class PoolSpec:
    wy: int
    wx: int
    op: str  # maximum | add
    scale: float = 1.0


@dataclass(frozen=True)
class ConvOp:
    name: str  # the .tl tensor the contraction writes (schedule refers to it)
    out: str  # the tensor written to HBM (the pool/relu result when fused)
    x: str
    w: str
    bias: str | None
    dims: tuple[tuple[str, int], ...]  # N C K H W Ho Wo R S
    w_layout: str  # "kc" (out-channel major, needs a transpose) | "ck" (contraction-major)
    vars: tuple[tuple[str, str], ...]  # role -> .tl loop variable
    relu: bool = False
    pool: PoolSpec | None = None
    fused: tuple[str, ...] = ()  # names of the computations folded into this one
    line: int = 0
    lines: tuple[tuple[str, int], ...] = ()  # role -> .tl line of its loop
    texts: tuple[tuple[str, str], ...] = ()  # role -> its .tl loop, e.g. ("c", "for c in 0..C")
    span: Span | None = field(default=None, compare=False)

    def dim(self, d: str) -> int:
        return dict(self.dims)[d]


@dataclass(frozen=True)
class PoolOp:
    name: str
    out: str
    src: str
    dims: tuple[tuple[str, int], ...]  # B (rows = flattened leading dims) H W
    pool: PoolSpec
    vars: tuple[tuple[str, str], ...]
    relu: bool = False
    line: int = 0
    span: Span | None = field(default=None, compare=False)

    loop_lines: tuple[tuple[str, int], ...] = ()  # .tl loop variable -> line of its `for`

    def line_of(self, role: str) -> int:
        """The .tl line of the loop playing `role` (the statement's line if unknown)."""
        return dict(self.loop_lines).get(dict(self.vars).get(role, ""), self.line)

    def dim(self, d: str) -> int:
        return dict(self.dims)[d]


@dataclass(frozen=True)
class TransposeOp:
    name: str
    out: str
    src: str
    dims: tuple[tuple[str, int], ...]  # M N (source shape)
    vars: tuple[tuple[str, str], ...]
    line: int = 0
    span: Span | None = field(default=None, compare=False)

    loop_lines: tuple[tuple[str, int], ...] = ()  # .tl loop variable -> line of its `for`

    def line_of(self, role: str) -> int:
        """The .tl line of the loop playing `role` (the statement's line if unknown)."""
        return dict(self.loop_lines).get(dict(self.vars).get(role, ""), self.line)

    def dim(self, d: str) -> int:
        return dict(self.dims)[d]


@dataclass(frozen=True)
class EltwiseOp:
    name: str
    out: str
    expr: sx.Expr
    inputs: tuple[str, ...]
    size: int  # elements of the output
    vars: tuple[tuple[str, str], ...]
    line: int = 0
    span: Span | None = field(default=None, compare=False)
    columns: tuple[str, ...] = ()  # broadcast operands: one scalar per partition row
    layout: tuple[tuple[str, int], ...] = ()  # with columns: the output as O (outer) x P (partitions) x F (free)
    run: tuple[int, int] = (0, 0)  # with broadcasts: the output indices [a, b) that go on the partitions
    fused: tuple[str, ...] = ()  # temporaries of earlier element-wise statements folded into this one
    loop_lines: tuple[tuple[str, int], ...] = ()  # .tl loop variable -> line of its `for`
    rows: tuple[str, ...] = ()  # broadcast operands indexed by the free (trailing) indices: one row for all partitions

    def line_of(self, role: str) -> int:
        """The .tl line of the loop playing `role` (the statement's line if unknown)."""
        return dict(self.loop_lines).get(dict(self.vars).get(role, ""), self.line)

    def dim(self, d: str) -> int:
        return dict(self.layout)[d]


Op = ConvOp | PoolOp | TransposeOp | EltwiseOp


def reject(comp: Comp, why: str, span: Span | None = None) -> TilecError:
    return TilecError(f"the compiler cannot map `{comp.target}` to Trainium engines: {why}", span or comp.span,
                      "supported: convolution/matmul contractions, window max/avg pools, 2-D transposes, "
                      "element-wise expressions")


def select(comps: tuple[Comp, ...], program) -> tuple[Op, ...]:
    ops: list[Op] = []
    consumed: set[int] = set()
    for i, comp in enumerate(comps):
        if i in consumed:
            continue
        if comp.red_op is None and not _is_copy(comp, program):
            comp = _fuse_chain(comps, i, program, consumed)
        op = _select_one(comp, program)
        if isinstance(op, ConvOp):
            op = _fuse_epilogues(op, comps, i, program, consumed)
        ops.append(op)
    return tuple(ops)


def _select_one(comp: Comp, program) -> Op:
    if comp.red_op == "+=" and isinstance(comp.update, sx.BinOp) and comp.update.op == "*" \
            and len(accesses(comp.update)) == 2:
        return select_conv(comp, program)
    if comp.red_op in ("max=", "+="):
        return select_pool(comp, program)
    if comp.red_op is None and isinstance(comp.init, sx.Access) and comp.init.tensor != comp.target:
        if _is_permutation(comp, comp.init, program):
            return select_transpose(comp, program)
    if comp.red_op is None:
        return select_eltwise(comp, program)
    raise reject(comp, f"a `{comp.red_op}` reduction of this form is not supported")


# ---- element-wise chains ------------------------------------------------------------------------------------------


def _is_copy(comp: Comp, program) -> bool:
    return isinstance(comp.init, sx.Access) and comp.init.tensor != comp.target and \
        _is_permutation(comp, comp.init, program)


def _fuse_chain(comps: tuple[Comp, ...], i: int, program, consumed: set[int]) -> Comp:
    """`T[i, j] = A[i, j] + B[i, j]; Y[i, j] = relu(T[i, j]) * 2` -> one statement `Y = relu(A + B) * 2` (one pass
    over tiles, T never stored) when the next statement is element-wise over the same loops, reads T with the same
    indices, and is T's only reader (or overwrites T itself: `Y = relu(Y)`)."""
    comp = comps[i]
    for j in range(i + 1, len(comps)):
        nxt = comps[j]
        readers = [c for c in comps[j:] if any(a.tensor == comp.target for a in _reads(c))]
        in_place = nxt.target == comp.target
        if nxt.red_op is not None or not readers or readers[0] is not nxt or (len(readers) > 1 and not in_place):
            break
        if not in_place and program.tensors[comp.target].kind != "temp":
            break
        inlined = _inline(comp, nxt, program)
        if inlined is None:
            break
        comp = replace(nxt, init=inlined, line=comp.line, span=comp.span,
                       fused=comp.fused + ((comp.target,) if not in_place else ()))
        consumed.add(j)
    return comp


def _inline(prev: Comp, nxt: Comp, program) -> sx.Expr | None:
    """nxt's expression with every read of prev's target replaced by prev's expression (renamed to nxt's loops)."""
    if [prev.extent(v) for v in prev.out_vars] != [nxt.extent(v) for v in nxt.out_vars]:
        return None
    reads = [a for a in accesses(nxt.init) if a.tensor == prev.target]
    if any([_plain(m) for m in _index_maps(a, nxt, program)] != list(nxt.out_vars) for a in reads):
        return None
    value = rename_vars(prev.init, dict(zip(prev.out_vars, nxt.out_vars)))
    return _substitute(nxt.init, prev.target, value)


def _substitute(e: sx.Expr, tensor: str, value: sx.Expr) -> sx.Expr:
    if isinstance(e, sx.Access):
        return value if e.tensor == tensor else e
    if isinstance(e, sx.Neg):
        return sx.Neg(_substitute(e.x, tensor, value), e.span)
    if isinstance(e, sx.BinOp):
        return sx.BinOp(e.op, _substitute(e.lhs, tensor, value), _substitute(e.rhs, tensor, value), e.span)
    if isinstance(e, sx.Call):
        return sx.Call(e.fn, tuple(_substitute(x, tensor, value) for x in e.args), e.span)
    return e


# ---- contraction ---------------------------------------------------------------------------------------------------


def _index_maps(acc: sx.Access, comp: Comp, program) -> list[tuple[dict[str, int], int]]:
    loop_vars = {v for v, _ in comp.extents}
    return [affine_index(e, loop_vars, program.sizes) for e in acc.indices]


def _plain(m: tuple[dict[str, int], int]) -> str | None:
    coefs, const = m
    if const == 0 and len(coefs) == 1:
        (v, c), = coefs.items()
        return v if c == 1 else None
    return None


def select_conv(comp: Comp, program) -> ConvOp:
    a, b = accesses(comp.update)
    out_vars = list(comp.out_vars)
    candidates = []
    for s_acc, m_acc in ((a, b), (b, a)):
        s_maps = _index_maps(s_acc, comp, program)
        plain = [_plain(m) for m in s_maps]
        outs = [v for v in plain if v in out_vars]
        if None not in plain and len(outs) == 1:
            candidates.append((out_vars.index(outs[0]), outs[0], s_acc, m_acc))
    if not candidates:
        raise reject(comp, "no operand can be the matmul's stationary side (indexed by plain loop variables, "
                           "with exactly one output variable)", comp.update.span)
    _, p, s_acc, m_acc = min(candidates, key=lambda t: t[0])
    s_vars = [_plain(m) for m in _index_maps(s_acc, comp, program)]
    roles: dict[str, str] = {"k": p}
    batch, spatial, taps = [], [], []
    for e, (coefs, const) in zip(m_acc.indices, _index_maps(m_acc, comp, program)):
        outs = [v for v in coefs if v in out_vars]
        reds = [v for v in coefs if v in comp.red_vars]
        if const != 0 or any(c != 1 for c in coefs.values()) or len(outs) > 1 or len(reds) > 1:
            raise reject(comp, f"index `{fmt_expr(e)}` of {m_acc.tensor} is not a shifted window", e.span)
        if reds and not outs:
            if "c" in roles or reds[0] not in s_vars:
                raise reject(comp, "exactly one summed variable must index both operands", e.span)
            roles["c"] = reds[0]
        elif outs and out_vars.index(outs[0]) < out_vars.index(p):
            if reds or batch or "c" in roles:
                raise reject(comp, f"batch index `{fmt_expr(e)}` must come first and not be shifted", e.span)
            batch.append(outs[0])
        elif outs:
            spatial.append(outs[0])
            taps.append(reds[0] if reds else None)
        else:
            raise reject(comp, f"index `{fmt_expr(e)}` of {m_acc.tensor} is constant", e.span)
    if "c" not in roles:
        raise reject(comp, "no summed variable indexes both operands (nothing to contract)", comp.update.span)
    if len(spatial) > 2 or not spatial:
        raise reject(comp, "the moving operand needs one or two spatial dimensions", m_acc.span)
    if out_vars != batch + [p] + spatial:
        raise reject(comp, f"output indices must be ordered (batch, {p}, spatial...) to match the operands",
                     comp.span)
    tap_vars = [t for t in taps if t]
    if s_vars == [p, roles["c"], *tap_vars]:
        w_layout = "kc"
    elif s_vars == [roles["c"], p, *tap_vars]:
        w_layout = "ck"
    else:
        raise reject(comp, f"{s_acc.tensor} must be indexed [{p}, {roles['c']}, taps...] or "
                           f"[{roles['c']}, {p}, taps...]", s_acc.span)
    return _conv_record(comp, program, roles, batch, spatial, taps, s_acc.tensor, m_acc.tensor, w_layout)


def _conv_record(comp, program, roles, batch, spatial, taps, w, x, w_layout) -> ConvOp:
    ext = comp.extent
    if len(spatial) == 1:
        spatial, taps = [None] + spatial, [None] + taps
    names = {"n": batch[0] if batch else None, "y": spatial[0], "x": spatial[1], "r": taps[0], "s": taps[1]}
    roles.update({k: v for k, v in names.items() if v})
    x_shape = program.tensors[x].shape
    hx = x_shape[-2] if spatial[0] else 1
    dims = {"N": ext(batch[0]) if batch else 1, "C": ext(roles["c"]), "K": ext(roles["k"]),
            "H": hx, "W": x_shape[-1],
            "Ho": ext(spatial[0]) if spatial[0] else 1, "Wo": ext(spatial[1]),
            "R": ext(taps[0]) if taps[0] else 1, "S": ext(taps[1]) if taps[1] else 1}
    bias = _bias(comp, roles["k"], program)
    lines = tuple((role, comp.line_of(var)) for role, var in sorted(roles.items())) + \
        (("update", comp.update_line or comp.line),)
    texts = tuple((role, comp.loop_text(var)) for role, var in sorted(roles.items()))
    return ConvOp(comp.target, comp.target, x, w, bias, tuple(dims.items()), w_layout,
                  tuple(sorted(roles.items())), line=comp.line, lines=lines, texts=texts, span=comp.span)


def _bias(comp: Comp, k: str, program) -> str | None:
    if comp.init is None or const_value(comp.init) == 0.0:
        return None
    init = comp.init
    if isinstance(init, sx.Access) and [_plain(m) for m in _index_maps(init, comp, program)] == [k]:
        return init.tensor
    raise reject(comp, "the initial value must be 0 or a per-output-channel bias b[k]", init.span)


# ---- epilogue fusion -----------------------------------------------------------------------------------------------


def _fuse_epilogues(op: ConvOp, comps, i: int, program, consumed: set[int]) -> ConvOp:
    """Fold relu and pooling of a temporary conv output into the conv (it then never goes to HBM)."""
    current = op.out
    for j in range(i + 1, len(comps)):
        nxt = comps[j]
        readers = [c for c in comps[j:] if any(a.tensor == current for a in _reads(c))]
        in_place = nxt.target == current  # `conv[..] = relu(conv[..])`
        if program.tensors[current].kind != "temp" or not readers or readers[0] is not nxt \
                or (len(readers) > 1 and not in_place) or len(_reads(nxt)) != 1:
            break
        fused = _try_relu(op, nxt, current, program) or _try_pool(op, nxt, current, program)
        if fused is None:
            break
        op, current = fused, nxt.target
        consumed.add(j)
    return op


def _reads(c: Comp) -> list[sx.Access]:
    found = accesses(c.init) if c.init is not None else []
    return found + (accesses(c.update) if c.update is not None else [])


def _try_relu(op: ConvOp, c: Comp, src: str, program) -> ConvOp | None:
    if c.red_op is not None or c.init is None or op.pool is not None:
        return None
    inner, relu = strip_relu(c.init)
    if not relu or not isinstance(inner, sx.Access) or inner.tensor != src:
        return None
    if [_plain(m) for m in _index_maps(inner, c, program)] != list(c.out_vars):
        return None
    return replace(op, out=c.target, relu=True, fused=op.fused + (c.target,))


def _try_pool(op: ConvOp, c: Comp, src: str, program) -> ConvOp | None:
    if op.pool is not None:
        return None
    try:
        pool = select_pool(c, program)
    except TilecError:
        return None
    if pool.src != src:
        return None
    pool_vars = tuple((f"pool_{role}", var) for role, var in pool.vars)
    return replace(op, out=c.target, relu=op.relu or pool.relu, pool=pool.pool, fused=op.fused + (c.target,),
                    vars=op.vars + pool_vars, lines=op.lines + (("pool", c.update_line or c.line),))


def replace(op, **changes):
    from dataclasses import replace
    return replace(op, **changes)


# ---- pooling -------------------------------------------------------------------------------------------------------


def select_pool(comp: Comp, program) -> PoolOp:
    inner, scale = strip_scale(comp.update)
    inner, relu = strip_relu(inner)
    if not isinstance(inner, sx.Access):
        raise reject(comp, "a reduction must read one tensor (window pooling) or a product (contraction)",
                     comp.update.span)
    init = const_value(comp.init) if comp.init is not None else None
    if comp.red_op == "max=" and init != float("-inf") and comp.init is not None:
        raise reject(comp, "a max pool must start from -inf", comp.init.span)
    if comp.red_op == "+=" and init not in (0.0, None):
        raise reject(comp, "a sum pool must start from 0", comp.init.span)
    if comp.init is None:
        raise reject(comp, "the pooled tensor needs an initial value (-inf or 0)")
    maps = _index_maps(inner, comp, program)
    windows = []
    for pos, ((coefs, const), v) in enumerate(zip(maps, comp.out_vars)):
        reds = [r for r in coefs if r in comp.red_vars]
        if const or coefs.get(v) is None or len(coefs) != 1 + len(reds) or len(reds) > 1:
            raise reject(comp, f"index {pos} of {inner.tensor} is not a pooling window", inner.indices[pos].span)
        wnd = comp.extent(reds[0]) if reds else 1
        if coefs[v] != wnd or (reds and coefs[reds[0]] != 1):
            raise reject(comp, f"index {pos} of {inner.tensor} must be {wnd}*{v} + window offset",
                         inner.indices[pos].span)
        windows.append(wnd)
    if len(windows) < 2 or any(w != 1 for w in windows[:-2]):
        raise reject(comp, "only the last two dimensions may be pooled", inner.span)
    shape = program.tensors[inner.tensor].shape
    rows = 1
    for d in shape[:-2]:
        rows *= d
    pool = PoolSpec(windows[-2], windows[-1], "maximum" if comp.red_op == "max=" else "add", scale)
    dims = (("B", rows), ("H", shape[-2]), ("W", shape[-1]))
    roles = tuple(zip(("b", "i", "j"), (comp.out_vars[0], comp.out_vars[-2], comp.out_vars[-1])))
    return PoolOp(comp.target, comp.target, inner.tensor, dims, pool, roles, relu, comp.line, comp.span,
                  comp.lines)


# ---- transpose and element-wise ------------------------------------------------------------------------------------


def _is_permutation(comp: Comp, acc: sx.Access, program) -> bool:
    plain = [_plain(m) for m in _index_maps(acc, comp, program)]
    return sorted(map(str, plain)) == sorted(comp.out_vars) and plain != list(comp.out_vars)


def select_transpose(comp: Comp, program) -> TransposeOp:
    acc = comp.init
    plain = [_plain(m) for m in _index_maps(acc, comp, program)]
    if len(plain) != 2 or plain != list(comp.out_vars)[::-1]:
        raise reject(comp, "only 2-D transposes B[j, i] = A[i, j] are supported", acc.span)
    m, n = program.tensors[acc.tensor].shape
    roles = (("i", plain[0]), ("j", plain[1]))
    return TransposeOp(comp.target, comp.target, acc.tensor, (("M", m), ("N", n)), roles, comp.line, comp.span,
                       comp.lines)


def select_eltwise(comp: Comp, program) -> EltwiseOp:
    """Full-rank reads use the output's indices. A lower-rank read indexed by a run of them is a broadcast:
    a run that leaves later indices free (`b[i]` in Y[i, j], `b[k]` in Y[n, k, y, x]) is a per-partition column
    (those indices on the partitions, tensor_scalar with a (P, 1) operand); a trailing run (`s[j]` in Y[i, j]) is a
    row, broadcast across the partitions on TensorE (ones[1, P].T @ s[1, F]) and then used like a full tile."""
    inputs, columns, rows, runs = [], [], [], {"column": None, "row": None}
    for acc in accesses(comp.init):
        plain = [_plain(m) for m in _index_maps(acc, comp, program)]
        if acc.tensor == comp.target:
            raise reject(comp, "an element-wise statement may not read the tensor it writes", acc.span)
        if plain == list(comp.out_vars):
            inputs += [acc.tensor] if acc.tensor not in inputs else []
            continue
        here = _broadcast_run(comp, acc, plain)
        kind = "row" if here[1] == len(comp.out_vars) else "column"
        if runs[kind] is not None and here != runs[kind]:
            raise reject(comp, f"all broadcast {kind}s must be indexed by the same output indices", acc.span)
        runs[kind] = here
        group = rows if kind == "row" else columns
        group += [acc.tensor] if acc.tensor not in group else []
    _check_expr(comp, comp.init)
    if columns:
        _check_columns(comp, comp.init, set(columns))
    run = _partition_run(comp, runs)
    roles = tuple((f"d{i}", v) for i, v in enumerate(comp.out_vars))
    layout = _broadcast_layout(comp, run) if run else ()
    size = math.prod(comp.extent(v) for v in comp.out_vars)
    return EltwiseOp(comp.target, comp.target, comp.init, tuple(inputs), size, roles, comp.line, comp.span,
                     tuple(columns), layout, run or (0, 0), comp.fused, comp.lines, tuple(rows))


def _partition_run(comp: Comp, runs: dict) -> tuple[int, int] | None:
    """The output indices on the partitions: the columns' run; with rows only, everything before the rows."""
    col, row = runs["column"], runs["row"]
    if row and col and row[0] != col[1]:
        raise reject(comp, "a statement with both per-partition and per-row broadcasts needs the row operand "
                           "indexed by exactly the output indices after the column operand's", comp.init.span)
    return col or ((0, row[0]) if row else None)


def _broadcast_run(comp: Comp, acc: sx.Access, plain: list) -> tuple[int, int]:
    """(a, b): the read is indexed by out_vars[a:b], a run of consecutive output indices."""
    out = list(comp.out_vars)
    shown = f"`{fmt_expr(acc)}`"
    if None in plain or any(v not in out for v in plain) or not plain:
        raise reject(comp, f"element-wise reads must use the output's indices [{', '.join(out)}] or a run of "
                           f"them (a broadcast); {shown} does not (shifts and permutations are not supported)",
                     acc.span)
    a = out.index(plain[0])
    if out[a:a + len(plain)] != plain:
        raise reject(comp, f"the broadcast read {shown} must use consecutive output indices in order", acc.span)
    return a, a + len(plain)


def _broadcast_layout(comp: Comp, run: tuple[int, int]) -> tuple[tuple[str, int], ...]:
    """O (outer), P (the broadcast indices, on partitions), F (free): the output viewed as [O, P, F]."""
    ext = [comp.extent(v) for v in comp.out_vars]
    return (("O", math.prod(ext[:run[0]])), ("P", math.prod(ext[run[0]:run[1]])), ("F", math.prod(ext[run[1]:])))


def _check_columns(comp: Comp, e: sx.Expr, columns: set[str]) -> bool:
    """Whether `e` is a full tile; a column may only meet a full tile directly in +, -, *, max or min."""
    if isinstance(e, sx.Access):
        return e.tensor not in columns
    if const_value(e) is not None:
        return False
    args = [e.x] if isinstance(e, sx.Neg) else list(e.args) if isinstance(e, sx.Call) else [e.lhs, e.rhs]
    full = [_check_columns(comp, x, columns) for x in args]
    binary = len(args) == 2 and (isinstance(e, sx.Call) or e.op in "+-*")
    for x, is_full in zip(args, full):
        cols = [a for a in accesses(x) if a.tensor in columns]
        if not is_full and cols and not (binary and any(full) and _is_column(x, columns)):
            col = cols[0]
            raise reject(comp, f"a broadcast operand like `{fmt_expr(col)}` may only be added to, subtracted from, "
                               f"multiplied with, or be the max/min of a full-size operand", col.span)
    return any(full)


def _is_column(e: sx.Expr, columns: set[str]) -> bool:
    return isinstance(e, sx.Access) and e.tensor in columns


def _check_expr(comp: Comp, e: sx.Expr) -> None:
    if isinstance(e, (sx.Access, sx.Num)):
        return
    if isinstance(e, sx.Neg):
        return _check_expr(comp, e.x)
    if isinstance(e, sx.BinOp):
        if e.op == "%" or (e.op == "/" and const_value(e.rhs) is None):
            raise reject(comp, f"operator `{e.op}` between tensors has no engine instruction here", e.span)
        _check_expr(comp, e.lhs)
        _check_expr(comp, e.rhs)
        return
    if isinstance(e, sx.Call) and e.fn in ("max", "min", "relu", "exp"):
        for a in e.args:
            _check_expr(comp, a)
        return
    raise reject(comp, "unsupported expression", getattr(e, "span", None))


def print_ops(ops: tuple[Op, ...]) -> str:
    lines = []
    for op in ops:
        kind = type(op).__name__.removesuffix("Op").lower()
        dims = " ".join(f"{k}={v}" for k, v in getattr(op, "dims", ()))
        lines.append(f"{kind} {op.name} -> {op.out}  # tl:{op.line}  {dims}".rstrip())
        lines.append("  vars " + ", ".join(f"{r}={v}" for r, v in op.vars))
        if isinstance(op, ConvOp):
            lines.append(f"  stationary {op.w} (layout {op.w_layout}), moving {op.x}, bias {op.bias or '-'}")
            epi = [f"relu" if op.relu else ""] + ([f"pool {op.pool.op} {op.pool.wy}x{op.pool.wx} "
                                                   f"scale {op.pool.scale:g}"] if op.pool else [])
            lines.append("  epilogue " + (", ".join(e for e in epi if e) or "-") +
                         (f"  (fused {', '.join(op.fused)})" if op.fused else ""))
        elif isinstance(op, PoolOp):
            lines.append(f"  src {op.src} pool {op.pool.op} {op.pool.wy}x{op.pool.wx} scale {op.pool.scale:g}"
                         + (" relu" if op.relu else ""))
        elif isinstance(op, TransposeOp):
            lines.append(f"  src {op.src}")
        else:
            lines.append(f"  {op.out} = {fmt_expr(op.expr)}  ({op.size} elements)" +
                         (f"  (fused {', '.join(op.fused)})" if op.fused else ""))
            if op.layout:
                layout = " ".join(f"{k}={v}" for k, v in op.layout)
                lines.append(f"  broadcast columns {', '.join(op.columns) or '-'} (one scalar per partition), rows "
                             f"{', '.join(op.rows) or '-'} (one row for all partitions), layout {layout}")
    return "\n".join(lines) + "\n"
