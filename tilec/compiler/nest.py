"""Level-A IR: the program as loops over buffers, before any instruction is chosen.

Term grammar (small frozen records; `print_nest` prints them the way they are written here):

    Buffer = name, memory in hbm|sbuf|psum, dtype, shape
    Access = buf[Aff, ...] (?? fill)           one element; Aff as in ir.py (sum of coef*var terms + const); a
                                               padded read `?? fill` means np.pad: an index outside buf reads fill
    Expr   = Const(value)                      a number (sizes are already numbers)
           | Index(Aff)                        a loop variable used as a value
           | Load(Access)                      a buffer element
           | Op(name, args)                    + - * / neg, or a function of tilec/lang/functions.py
    Stmt   = Loop(var, extent, kind, body)     kind: serial | parallel | unrolled
           | Assign(dst: Access, expr)         an init or an element-wise store
           | Update(dst: Access, op, expr)     a reduction: += max= min=
           | Alloc(buf, buffers)               a buffer the kernel owns; buffers: copies in flight
    Kernel = name, params: Buffer..., outputs: Buffer..., body: Stmt...

`lower_nest` produces it from a checked program one to one: each `.tl` loop is a Loop, each statement an Assign or
Update with affine indices, each intermediate tensor an Alloc in HBM. `evaluate_nest` gives it a meaning on NumPy,
so a scheduling primitive is tested by evaluating before and after; `verify_nest` checks that every access stays
inside its buffer (a padded read may leave it: that is what its fill is for).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Union

from tilec.compiler.ir import Aff, Term, fmt_aff
from tilec.compiler.lower import affine_index, size_value
from tilec.errors import InternalError, Span, TilecError
from tilec.lang import syntax as sx

UNARY = ("neg",)
BINARY = ("+", "-", "*", "/")


@dataclass(frozen=True)
class Buffer:
    name: str
    memory: str
    dtype: str
    shape: tuple[int, ...]
    view_of: str = ""  # an HBM buffer that is another buffer's storage seen with this shape (primitives.reshape)


@dataclass(frozen=True)
class Access:
    buf: str
    index: tuple[Aff, ...]
    fill: float | None = None  # a padded read `X[i - 1] ?? 0`: where an index falls outside buf, the value is fill


@dataclass(frozen=True)
class Const:
    value: float
    span: Span | None = field(default=None, compare=False, repr=False)  # where the .tl wrote it (errors, lines)


@dataclass(frozen=True)
class Index:
    aff: Aff


@dataclass(frozen=True)
class Load:
    access: Access
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Op:
    name: str
    args: tuple["Expr", ...]
    span: Span | None = field(default=None, compare=False, repr=False)


Expr = Union[Const, Index, Load, Op]


@dataclass(frozen=True)
class Loop:
    var: str
    extent: int
    body: tuple["Stmt", ...]
    kind: str = "serial"
    line: int = 0
    note: str = ""  # the .tl loops it iterates, e.g. "for i, j (tiles of TILE_F)" (a comment in the kernel)


@dataclass(frozen=True)
class Assign:
    dst: Access
    expr: Expr
    line: int = 0


@dataclass(frozen=True)
class Update:
    dst: Access
    op: str  # += max= min=
    expr: Expr
    line: int = 0


@dataclass(frozen=True)
class Alloc:
    buf: Buffer
    line: int = 0
    buffers: int = 1  # copies in flight: iteration k uses copy k mod buffers (loads overlap compute)


Stmt = Union[Loop, Assign, Update, Alloc]


@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    body: tuple[Stmt, ...]

    def buffers(self) -> dict[str, Buffer]:
        found = {b.name: b for b in (*self.params, *self.outputs)}
        found.update({s.buf.name: s.buf for s in walk(self.body) if isinstance(s, Alloc)})
        return found


def loads(e: Expr) -> list[Access]:
    """The accesses an expression reads, left to right."""
    if isinstance(e, Load):
        return [e.access]
    if isinstance(e, Op):
        return [a for x in e.args for a in loads(x)]
    return []


def map_loads(e: Expr, f: Callable[[Access], Access]) -> Expr:
    """The expression with each access it reads replaced by f(access); replace() keeps each node's span."""
    if isinstance(e, Load):
        return replace(e, access=f(e.access))
    if isinstance(e, Op):
        return replace(e, args=tuple(map_loads(x, f) for x in e.args))
    return e


def loop_index(i: Aff, extents: dict[str, int]) -> tuple[str, bool] | None:
    """(v, reversed) when the index is a loop variable v of `extents`, plainly or reversed as `n - 1 - v` over its
    whole extent n (a flip); None for any other index."""
    if len(i.terms) != 1 or i.terms[0].var not in extents:
        return None
    t = i.terms[0]
    if t.coef == 1 and not i.const:
        return t.var, False
    if t.coef == -1 and i.const == extents[t.var] - 1:
        return t.var, True
    return None


def walk(body: tuple[Stmt, ...]):
    for s in body:
        yield s
        if isinstance(s, Loop):
            yield from walk(s.body)


# ---- lowering ------------------------------------------------------------------------------------------------------


def lower_nest(program) -> Kernel:
    """A checked program with known sizes -> level A, one to one."""
    sizes, tensors = program.sizes, program.tensors
    buffers = {name: Buffer(name, "hbm", t.dtype, tuple(t.shape)) for name, t in tensors.items()}
    params = tuple(buffers[p.name] for p in program.kernel.params)
    outputs = tuple(buffers[o] for o in program.kernel.outputs)
    allocs = tuple(Alloc(buffers[n], t.span.line) for n, t in tensors.items() if t.kind == "temp")
    body = tuple(_lower_stmt(s, (), sizes) for s in program.kernel.body)
    return Kernel(program.kernel.name, params, outputs, allocs + body)


def lower_stmt(s: sx.Stmt, sizes: dict[str, int]) -> Stmt:
    """One .tl statement (a loop nest) as level A, the way lower_nest lowers it."""
    return _lower_stmt(s, (), sizes)


def _lower_stmt(s: sx.Stmt, loops: tuple[str, ...], sizes: dict[str, int]) -> Stmt:
    if isinstance(s, sx.Loop):
        if size_value(s.start, sizes) != 0:
            raise TilecError("loops must start at 0 for the compiler", s.start.span,
                             "shift the index instead: for i in 0..N-1: ... A[i + 1]")
        extent, k = size_value(s.stop, sizes), divisor(s.body, s.var, sizes)
        if k > 1:  # `i / k` read in the body: i = k*i_q + i_r, so i / k = i_q (quasi-affine -> affine)
            if extent % k:
                raise TilecError(f"`{s.var} / {k}` in an index needs a loop whose trip count is a multiple of {k} "
                                 f"(here {extent})", s.stop.span, f"make the loop's extent a multiple of {k}")
            body = tuple(split_division(b, s.var, k) for b in s.body)
            q, r = f"{s.var}_q", f"{s.var}_r"
            inner = tuple(_lower_stmt(b, loops + (q, r), sizes) for b in body)
            return Loop(q, extent // k, (Loop(r, k, inner, line=s.span.line),), line=s.span.line)
        inner_loops = loops + (s.var,)
        return Loop(s.var, extent, tuple(_lower_stmt(b, inner_loops, sizes) for b in s.body), line=s.span.line)
    dst = _access(s.target, loops, sizes)
    expr = _expr(s.value, loops, sizes)
    if s.op == "=":
        return Assign(dst, expr, s.span.line)
    return Update(dst, s.op, expr, s.span.line)


def divisor(body: tuple[sx.Stmt, ...], var: str, sizes: dict[str, int]) -> int:
    """k when the statements read `var / k` (one constant k > 1), else 1."""
    found: set[int] = set()

    def visit(e: object, index: bool) -> None:  # `/` in a value is a true division: only indices count
        if index and isinstance(e, sx.BinOp) and e.op == "/" and isinstance(e.lhs, sx.Name) and e.lhs.id == var \
                and isinstance(e.rhs, (sx.Num, sx.Name)) and not (isinstance(e.rhs, sx.Name) and e.rhs.id == var):
            found.add(size_value(e.rhs, sizes))
        for child in _children(e):
            visit(child, index or isinstance(e, sx.Access))
    for st in body:
        visit(st, False)
    found.discard(1)
    if len(found) > 1:
        raise TilecError(f"`{var}` is divided by different constants ({', '.join(map(str, sorted(found)))}) in "
                         "indices; the compiler splits a loop by one of them", None)
    return found.pop() if found else 1


def _children(e: object) -> tuple:
    if isinstance(e, sx.Loop):
        return tuple(e.body)
    if isinstance(e, sx.Assign):
        return (e.target, e.value)
    if isinstance(e, sx.Access):
        return tuple(e.indices)
    if isinstance(e, sx.BinOp):
        return (e.lhs, e.rhs)
    if isinstance(e, sx.Neg):
        return (e.x,)
    if isinstance(e, sx.Call):
        return tuple(e.args)
    return ()


def split_division(e, var: str, k: int):
    """`e` with `var / k` -> var_q and any other `var` -> k*var_q + var_r (a statement, an access or an expression;
    spans kept)."""
    q, r = f"{var}_q", f"{var}_r"
    if isinstance(e, sx.Access):
        return replace(e, indices=tuple(_split_index(i, var, k) for i in e.indices))
    if isinstance(e, sx.Name) and e.id == var:
        return sx.BinOp("+", sx.BinOp("*", sx.Num(k, e.span), sx.Name(q, e.span), e.span), sx.Name(r, e.span), e.span)
    if isinstance(e, sx.Loop):
        return replace(e, body=tuple(split_division(b, var, k) for b in e.body))
    if isinstance(e, sx.Assign):
        return replace(e, target=split_division(e.target, var, k), value=split_division(e.value, var, k))
    if isinstance(e, sx.BinOp):
        return replace(e, lhs=split_division(e.lhs, var, k), rhs=split_division(e.rhs, var, k))
    if isinstance(e, sx.Neg):
        return replace(e, x=split_division(e.x, var, k))
    if isinstance(e, sx.Call):
        return replace(e, args=tuple(split_division(a, var, k) for a in e.args))
    return e


def _split_index(e: sx.Expr, var: str, k: int) -> sx.Expr:
    if isinstance(e, sx.BinOp) and e.op == "/" and isinstance(e.lhs, sx.Name) and e.lhs.id == var:
        return sx.Name(f"{var}_q", e.span)
    if isinstance(e, sx.BinOp):
        return replace(e, lhs=_split_index(e.lhs, var, k), rhs=_split_index(e.rhs, var, k))
    return split_division(e, var, k)


def _aff(e: sx.Expr, loops: tuple[str, ...], sizes: dict[str, int]) -> Aff:
    coefs, const = affine_index(e, set(loops), sizes)
    return Aff(tuple(Term(v, coefs[v]) for v in loops if v in coefs), const)


def _access(a: sx.Access, loops: tuple[str, ...], sizes: dict[str, int]) -> Access:
    return Access(a.tensor, tuple(_aff(i, loops, sizes) for i in a.indices), a.fill)


def lower_expr(e: sx.Expr, loops: tuple[str, ...], sizes: dict[str, int]) -> Expr:
    """A .tl expression over loop variables `loops` as a level-A expression (each node keeps its span)."""
    if isinstance(e, sx.Num):
        return Const(float(e.value), e.span)
    if isinstance(e, sx.Name):
        return Index(_aff(e, loops, sizes)) if e.id in loops else Const(float(size_value(e, sizes)), e.span)
    if isinstance(e, sx.Access):
        return Load(_access(e, loops, sizes), e.span)
    if isinstance(e, sx.Neg):
        inner = lower_expr(e.x, loops, sizes)
        return Const(-inner.value, e.span) if isinstance(inner, Const) else Op("neg", (inner,), e.span)
    if isinstance(e, sx.BinOp):
        return Op(e.op, (lower_expr(e.lhs, loops, sizes), lower_expr(e.rhs, loops, sizes)), e.span)
    return Op(e.fn, tuple(lower_expr(x, loops, sizes) for x in e.args), e.span)


_expr = lower_expr


# ---- printer -------------------------------------------------------------------------------------------------------


def fmt_access(a: Access) -> str:
    return f"{a.buf}[{', '.join(fmt_aff(i) for i in a.index)}]"


_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def fmt_expr(e: Expr, prec: int = 0) -> str:
    """Parentheses only where precedence needs them (`a - (b - c)`, `(a + b) * c`)."""
    if isinstance(e, Const):
        return _num(e.value)
    if isinstance(e, Index):
        return fmt_aff(e.aff)
    if isinstance(e, Load) and e.access.fill is not None:  # a padded read is a whole expression (the grammar's rule)
        text = f"{fmt_access(e.access)} ?? {_num(e.access.fill)}"
        return f"({text})" if prec else text
    if isinstance(e, Load):
        return fmt_access(e.access)
    if e.name == "neg":
        return f"-{fmt_expr(e.args[0], 3)}"
    if e.name in BINARY:
        p = _PREC[e.name]
        text = f"{fmt_expr(e.args[0], p)} {e.name} {fmt_expr(e.args[1], p + 1)}"
        return f"({text})" if p < prec else text
    return f"{e.name}({', '.join(fmt_expr(a) for a in e.args)})"


def _num(value: float) -> str:
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(int(value)) if float(value).is_integer() else repr(value)


def fmt_buffer(b: Buffer) -> str:
    return f"{b.name}: {b.memory} {b.dtype}[{', '.join(map(str, b.shape))}]"


def _tag(line: int) -> str:
    return f"  # tl:{line}" if line else ""


Note = Callable[[Stmt], str]  # a statement -> a remark printed after it (e.g. the instruction it matches)


def _print(body: tuple[Stmt, ...], depth: int, out: list[str], note: Note | None) -> None:
    pad = "  " * depth
    for s in body:
        if isinstance(s, Loop):
            out.append(f"{pad}for {s.var} in {s.kind}({s.extent}):{_tag(s.line)}")
            _print(s.body, depth + 1, out, note)
            continue
        if isinstance(s, Alloc) and s.buf.view_of:
            text = f"{pad}view {fmt_buffer(s.buf)} = {s.buf.view_of}{_tag(s.line)}"
        elif isinstance(s, Alloc):
            copies = f" x{s.buffers}" if s.buffers > 1 else ""
            text = f"{pad}alloc {fmt_buffer(s.buf)}{copies}{_tag(s.line)}"
        elif isinstance(s, Assign):
            text = f"{pad}{fmt_access(s.dst)} = {fmt_expr(s.expr)}{_tag(s.line)}"
        else:
            text = f"{pad}{fmt_access(s.dst)} {s.op} {fmt_expr(s.expr)}{_tag(s.line)}"
        remark = note(s) if note and not isinstance(s, Alloc) else ""
        out.append(f"{text}  -> {remark}" if remark else text)


def print_nest(k: Kernel, note: Note | None = None) -> str:
    params = ", ".join(fmt_buffer(b) for b in k.params)
    outs = ", ".join(b.name for b in k.outputs)
    out = [f"kernel {k.name}({params}) -> {outs}"]
    out += [f"  out {fmt_buffer(b)}" for b in k.outputs]
    _print(k.body, 1, out, note)
    return "\n".join(out) + "\n"


# ---- verifier ------------------------------------------------------------------------------------------------------


def verify_nest(k: Kernel, stage: str = "nest") -> None:
    """Every index variable is bound by an enclosing loop and every access stays inside its buffer over the loops'
    whole ranges, except a padded read's (outside its buffer it reads its fill). A failure is a compiler bug."""
    shapes = {name: b.shape for name, b in k.buffers().items()}

    def check(a: Access, loops: dict[str, int], line: int) -> None:
        if a.buf not in shapes or len(a.index) != len(shapes[a.buf]):
            raise InternalError(f"level-A verifier after `{stage}`: {fmt_access(a)} (tl:{line}) names no buffer of "
                                f"rank {len(a.index)}")
        for d, (i, n) in enumerate(zip(a.index, shapes[a.buf])):
            free = [t.var for t in i.terms if t.var not in loops]
            if free:
                raise InternalError(f"level-A verifier after `{stage}`: {fmt_access(a)} (tl:{line}) uses "
                                    f"{free[0]} outside its loop")
            lo = i.const + sum(min(0, t.coef * (loops[t.var] - 1)) for t in i.terms)
            hi = i.const + sum(max(0, t.coef * (loops[t.var] - 1)) for t in i.terms)
            if a.fill is None and (lo < 0 or hi >= n):
                raise InternalError(f"level-A verifier after `{stage}`: {fmt_access(a)} (tl:{line}) reaches "
                                    f"{lo}..{hi} in dimension {d} of {a.buf}, whose extent is {n}")

    def visit(body: tuple[Stmt, ...], loops: dict[str, int]) -> None:
        for s in body:
            if isinstance(s, Loop):
                visit(s.body, {**loops, s.var: s.extent})
            elif isinstance(s, (Assign, Update)):
                if s.dst.fill is not None:
                    raise InternalError(f"level-A verifier after `{stage}`: a store through a padded access "
                                        f"{fmt_access(s.dst)} (tl:{s.line})")
                for a in (s.dst, *loads(s.expr)):
                    check(a, loops, s.line)
    visit(k.body, {})
