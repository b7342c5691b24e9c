"""Lowering: a checked .tl program -> tensor computations (`Comp`), one per tensor a loop nest writes.

    Comp = target[out_vars] = init ; target[out_vars] red_op= update over red_vars

`for n, k, y, x: conv[..] = b[k]; for c, r, s: conv[..] += X[..] * Wt[..]` becomes one Comp whose init is `b[k]`,
red_op `+`, red_vars (c, r, s). An init written in its own loop nest is merged into the reduction that follows it.
Index expressions become affine maps over loop variables with every size symbol replaced by its value.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet

from tilec.compiler.exprs import accesses, fmt_expr
from tilec.errors import Span, TilecError
from tilec.lang import syntax as sx


@dataclass(frozen=True)
class Comp:
    target: str
    out_vars: tuple[str, ...]
    extents: tuple[tuple[str, int], ...]  # every loop variable of the nest and its trip count
    init: sx.Expr | None
    red_op: str | None  # "+=" | "max=" | "min=" | None
    update: sx.Expr | None
    red_vars: tuple[str, ...]
    line: int
    span: Span
    lines: tuple[tuple[str, int], ...] = ()  # .tl line of each loop
    update_line: int = 0  # .tl line of the reduction statement
    stops: tuple[tuple[str, str], ...] = ()  # each loop's bound as written, e.g. ("c", "C")
    fused: tuple[str, ...] = ()  # temporaries of earlier element-wise statements inlined into `init`
    out_index: tuple[sx.Expr, ...] = ()  # the output's indices when one is shifted (`Y[n, C1 + c]`); else ()

    def loop_text(self, var: str) -> str:
        return f"for {var} in 0..{dict(self.stops).get(var, self.extent(var))}"

    def line_of(self, var: str) -> int:
        return dict(self.lines).get(var, self.line)

    def extent(self, var: str) -> int:
        return dict(self.extents)[var]


def size_value(e: sx.Expr, sizes: dict[str, int]) -> int:
    """The integer value of a size expression (`Ho / 2`, `H - R + 1`)."""
    if isinstance(e, sx.Num):
        return int(e.value)
    if isinstance(e, sx.Name):
        if e.id not in sizes:
            raise TilecError(f"size {e.id} is not known at compile time", e.span, "give it with -D NAME=VALUE")
        return sizes[e.id]
    if isinstance(e, sx.Neg):
        return -size_value(e.x, sizes)
    if isinstance(e, sx.BinOp):
        a, b = size_value(e.lhs, sizes), size_value(e.rhs, sizes)
        ops = {"+": a + b, "-": a - b, "*": a * b}
        if e.op in ops:
            return ops[e.op]
        if b == 0:
            raise TilecError("division by zero in a size expression", e.span)
        return a // b if e.op == "/" else a % b
    raise TilecError("expected a size expression", e.span)


def affine_index(e: sx.Expr, loop_vars: set[str], sizes: dict[str, int]) -> tuple[dict[str, int], int]:
    """`2*i + p` -> ({"i": 2, "p": 1}, 0)."""
    if isinstance(e, sx.Name) and e.id in loop_vars:
        return {e.id: 1}, 0
    if isinstance(e, (sx.Num, sx.Name)) or (isinstance(e, sx.Neg) and not uses_names(e, loop_vars)):
        return {}, size_value(e, sizes)
    if isinstance(e, sx.Neg):
        coefs, const = affine_index(e.x, loop_vars, sizes)
        return {v: -c for v, c in coefs.items()}, -const
    if isinstance(e, sx.BinOp) and e.op in "+-":
        (ca, ka), (cb, kb) = affine_index(e.lhs, loop_vars, sizes), affine_index(e.rhs, loop_vars, sizes)
        sign = 1 if e.op == "+" else -1
        out = dict(ca)
        for v, c in cb.items():
            out[v] = out.get(v, 0) + sign * c
        return {v: c for v, c in out.items() if c}, ka + sign * kb
    if isinstance(e, sx.BinOp) and e.op == "*":
        if not uses_names(e.lhs, loop_vars):
            scale, (coefs, const) = size_value(e.lhs, sizes), affine_index(e.rhs, loop_vars, sizes)
        elif not uses_names(e.rhs, loop_vars):
            scale, (coefs, const) = size_value(e.rhs, sizes), affine_index(e.lhs, loop_vars, sizes)
        else:
            raise TilecError("index is not affine in the loop variables", e.span)
        return {v: c * scale for v, c in coefs.items()}, const * scale
    if not uses_names(e, loop_vars):
        return {}, size_value(e, sizes)
    raise TilecError("index is not affine in the loop variables", e.span)


def uses_names(e: sx.Expr, names: AbstractSet[str]) -> bool:
    """Whether the expression reads any of `names` (loop variables, say)."""
    if isinstance(e, sx.Name):
        return e.id in names
    if isinstance(e, sx.Neg):
        return uses_names(e.x, names)
    if isinstance(e, sx.BinOp):
        return uses_names(e.lhs, names) or uses_names(e.rhs, names)
    if isinstance(e, sx.Call):
        return any(uses_names(a, names) for a in e.args)
    if isinstance(e, sx.Access):
        return any(uses_names(a, names) for a in e.indices)
    return False


def lower(kernel: sx.Kernel, sizes: dict[str, int]) -> tuple[Comp, ...]:
    comps: list[Comp] = []
    for stmt in kernel.body:
        for comp in _lower_nest(stmt, (), sizes):
            _append(comps, comp)
    return tuple(comps)


def _append(comps: list[Comp], comp: Comp) -> None:
    """Merge a reduction into the init-only Comp of the same tensor before it: the one just before, or an earlier
    one when the Comps between neither touch the reduced tensor nor write what the reduction reads (reductions
    initialised together whose loop fission.py could not distribute, because a later statement of the body reads
    several of them: each merges with its own init, which is then where the whole reduction runs)."""
    at = _init_of(comps, comp) if comp.red_op and comp.init is None else None
    if at is None:
        earlier = [c for c in comps if c.target == comp.target] if comp.red_op and comp.init is None else []
        if earlier:  # (the selector's "needs an initial value" would send the user to add the one they have)
            raise TilecError(f"this loop keeps accumulating into {comp.target}, which line {earlier[-1].line} "
                             f"computes already: a reduction continuing another is not compiled", comp.span,
                             f"accumulate into a tensor of its own (`t[..] = 0`, then `t[..] {comp.red_op} ..`) and "
                             f"combine the two after both loops")
        comps.append(comp)
        return
    prev = comps[at]
    rename = dict(zip(prev.out_vars, comp.out_vars))
    assert prev.init is not None  # an init-only Comp (red_op None) always has its expression
    comps[at] = Comp(comp.target, comp.out_vars, comp.extents, rename_vars(prev.init, rename), comp.red_op,
                     comp.update, comp.red_vars, prev.line, prev.span, comp.lines, comp.update_line, comp.stops)


def _init_of(comps: list[Comp], comp: Comp) -> int | None:
    """Index of the init-only Comp `comp` (a reduction without an init) merges into, or None."""
    assert comp.update is not None
    needs = _tensors(comp.update) | {comp.target}
    for k in range(len(comps) - 1, -1, -1):
        prev = comps[k]
        if prev.red_op is None and prev.target == comp.target:
            return k if len(prev.out_vars) == len(comp.out_vars) else None
        touched = {prev.target} | (_tensors(prev.init) if prev.init is not None else set()) | \
            (_tensors(prev.update) if prev.update is not None else set())
        if prev.target in needs or comp.target in touched:
            return None
    return None


def _tensors(e: sx.Expr) -> set[str]:
    """The tensors an expression reads."""
    return {a.tensor for a in accesses(e)}


def rename_vars(e: sx.Expr, names: dict[str, str]) -> sx.Expr:
    if isinstance(e, sx.Name):
        return sx.Name(names.get(e.id, e.id), e.span)
    if isinstance(e, sx.Neg):
        return sx.Neg(rename_vars(e.x, names), e.span)
    if isinstance(e, sx.BinOp):
        return sx.BinOp(e.op, rename_vars(e.lhs, names), rename_vars(e.rhs, names), e.span)
    if isinstance(e, sx.Call):
        return sx.Call(e.fn, tuple(rename_vars(a, names) for a in e.args), e.span)
    if isinstance(e, sx.Access):
        return sx.Access(e.tensor, tuple(rename_vars(a, names) for a in e.indices), e.span)
    return e


def _lower_nest(stmt: sx.Stmt, loops: tuple[tuple[str, int], ...], sizes: dict[str, int]) -> list[Comp]:
    if isinstance(stmt, sx.Loop):
        start = size_value(stmt.start, sizes)
        if start != 0:
            raise TilecError("loops must start at 0 for the compiler", stmt.start.span,
                             "shift the index instead: for i in 0..N-1: ... A[i + 1]")
        inner = loops + ((stmt.var, size_value(stmt.stop, sizes), stmt.span.line, fmt_expr(stmt.stop)),)
        return _lower_body(stmt.body, inner, sizes)
    return [_lower_assign(stmt, loops, sizes, None)]


def _lower_body(body: tuple[sx.Stmt, ...], loops, sizes) -> list[Comp]:
    _no_partial_reads(body)
    assigns = [s for s in body if isinstance(s, sx.Assign)]
    nested = [s for s in body if isinstance(s, sx.Loop)]
    if len(assigns) == 1 and len(nested) == 1 and body[0] is assigns[0]:
        init = assigns[0]
        red = _lower_nest(nested[0], loops, sizes)
        if len(red) == 1 and red[0].target == init.target.tensor and red[0].init is None and red[0].red_op:
            return [_lower_assign(init, loops, sizes, red[0])]
    out: list[Comp] = []
    for s in body:
        for comp in (_lower_nest(s, loops, sizes) if isinstance(s, sx.Loop) else
                     [_lower_assign(s, loops, sizes, None)]):
            _append(out, comp)
    return out


def _no_partial_reads(body: tuple[sx.Stmt, ...]) -> None:
    """A statement must not read a tensor that another statement of the same loop body accumulates (`for j: s[i] +=
    A[i, j]; t[i] += s[i] * B[i, j]` reads s's running sum): each tensor is computed as a whole (a Comp), so such a
    read would see the finished sum; refused, with the way to say which one is meant."""
    accumulated = {s.target.tensor: s for s in body if isinstance(s, sx.Assign) and s.op != "="}
    for stmt in body:
        for a in _assigns(stmt):
            for name in sorted(_tensors(a.value) & set(accumulated)):
                if accumulated[name] is not a:
                    raise TilecError(f"`{a.target.tensor}` reads {name} inside the loop that accumulates {name}, "
                                     f"so it would read a running {name}: the compiler computes {name} as a whole",
                                     a.span, f"finish {name} first: move this statement into a loop of its own "
                                             f"after the one that accumulates {name}")


def _assigns(stmt: sx.Stmt) -> list[sx.Assign]:
    if isinstance(stmt, sx.Loop):
        return [a for s in stmt.body for a in _assigns(s)]
    return [stmt]


def _lower_assign(a: sx.Assign, loops, sizes, red: Comp | None) -> Comp:
    out_vars = []
    names = {v for v, *_ in loops}
    for e in a.target.indices:
        if isinstance(e, sx.Name) and e.id in names:
            out_vars.append(e.id)
            continue
        shifted = _shifted_var(e, names, sizes) if a.op == "=" and red is None else \
            _merged_var(e, loops, sizes) if a.op == "+=" or red is not None else None
        if shifted is None:
            raise TilecError(f"the compiler needs each index of {a.target.tensor} to be a plain loop variable "
                             f"(or one shifted by a constant in a copy, `Y[C1 + c] = B[c]`)",
                             e.span, _store_hint(e, names))
        out_vars.append(shifted)
    extents = tuple((v, n) for v, n, *_ in loops)
    lines = tuple((v, line) for v, _, line, _ in loops)
    stops = tuple((v, stop) for v, _, _, stop in loops)
    merged = any(not isinstance(e, sx.Name) for e in a.target.indices)
    if merged and a.op == "=" and red is None:  # a shifted copy (select_copy.py)
        return Comp(a.target.tensor, tuple(out_vars), extents, a.value, None, None, (), a.span.line, a.span, lines,
                    0, stops, out_index=a.target.indices)
    if red:
        return Comp(a.target.tensor, tuple(out_vars), red.extents, a.value, red.red_op, red.update, red.red_vars,
                    a.span.line, a.span, red.lines, red.update_line, red.stops, out_index=red.out_index)
    if a.op == "=":
        return Comp(a.target.tensor, tuple(out_vars), extents, a.value, None, None, (), a.span.line, a.span, lines,
                    0, stops)
    red_vars = tuple(v for v, _ in extents if v not in out_vars)
    return Comp(a.target.tensor, tuple(out_vars), extents, None, a.op, a.value, red_vars, a.span.line, a.span,
                lines, a.span.line, stops, out_index=a.target.indices if merged else ())


def _store_hint(e: sx.Expr, names: set[str]) -> str:
    """What to write instead of a stored index that is no loop variable (user20: a channel or pixel shuffle, a
    flatten, a group's channel `q * Cg + c` write a reshaped view of the tensor)."""
    used = [v for v in sorted(names) if uses_names(e, {v})]
    if len(used) < 2:
        return "write the output as T[i, j] with i, j loop variables"
    return (f"an index of several loop variables ({', '.join(used)}) stores into a reshaped view, which is compiled "
            "only for a grouped convolution's output channel and a copy that merges heads (`Y[s, h * D + d] = "
            "X[h, s, d]`); declare the tensor in the shape you index it with (one dimension per loop variable) "
            "and reshape it outside the kernel, or write one copy per value of the outer variable at a constant "
            "offset (`Y[n, 4 + g, h, w] = X[n, 2 * g + 1, h, w]`)")


def _merged_var(e: sx.Expr, loops, sizes: dict[str, int]) -> str | None:
    """The inner loop variable of a merged output index `g*Kg + k` (k in 0..Kg: a grouped convolution's output
    channel), or None; select_conv.py's `ungroup` maps the statement onto one channel variable."""
    extents = {v: n for v, n, *_ in loops}
    try:
        coefs, const = affine_index(e, set(extents), sizes)
    except TilecError:
        return None
    inner = [v for v, c in coefs.items() if c == 1]
    if const != 0 or len(coefs) != 2 or len(inner) != 1:
        return None
    (outer, coef), = [(v, c) for v, c in coefs.items() if v != inner[0]]
    return inner[0] if coef == extents[inner[0]] else None


def shifted_index(e: sx.Expr, names: set[str], sizes: dict[str, int]) -> tuple[str, int] | None:
    """`v + constant` (one loop variable, coefficient 1) -> (v, constant), or None: an output index of a copy into
    part of a tensor here, a read index of a copy in select_copy.py."""
    if not uses_names(e, names):
        return None
    try:
        coefs, const = affine_index(e, names, sizes)
    except TilecError:
        return None
    if len(coefs) != 1 or next(iter(coefs.values())) != 1:
        return None
    return next(iter(coefs)), const


def _shifted_var(e: sx.Expr, names: set[str], sizes: dict[str, int]) -> str | None:
    """The loop variable of an output index `v + constant` (a copy into part of a tensor), or None."""
    found = shifted_index(e, names, sizes)
    return found[0] if found else None


def print_comps(comps: tuple[Comp, ...]) -> str:
    lines = []
    for c in comps:
        head = f"{c.target}[{', '.join(c.out_vars)}]"
        loops = ", ".join(f"{v}<{n}" for v, n in c.extents)
        lines.append(f"comp {head}  # tl:{c.line}  loops {loops}")
        if c.init is not None:
            lines.append(f"  {head} = {fmt_expr(c.init)}")
        if c.red_op:
            assert c.update is not None  # a reduction always has its update expression
            lines.append(f"  {head} {c.red_op} {fmt_expr(c.update)}  over {', '.join(c.red_vars)}")
    return "\n".join(lines) + "\n"
