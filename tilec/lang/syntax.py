"""The syntax tree of a .tl program: small frozen records, each with the Span it was parsed from.

Term grammar (the grammar file `tilec/grammar/tilec.lark` is the surface syntax; this is the tree it builds):

    Expr     = Num(value) | Name(id) | Neg(x) | BinOp(op, lhs, rhs) | Call(fn, args) | Access(tensor, indices, fill)
               op in + - * / %        fn: a name of tilec/lang/functions.py   Num(-inf) is written `-inf`
               fill: None, or the constant of a padded read `X[i - 1] ?? 0` (read where an index is outside X)
               In indices and sizes / and % are floor division and floor modulo by a positive integer constant.
    Cond     = Compare(op, lhs, rhs)                                   op in == != < <= > >=
    TensorType = dtype, shape: Expr...                                 dtype in f32 f16 bf16
    Param    = name : TensorType                                       kernel inputs (HBM)
    Decl     = name : TensorType                                       outputs and intermediates
    Let      = name = Expr                                             derived sizes
    Assume   = Cond                                                    facts later passes may rely on
    Loop     = for var in start..stop: body                            `for a in .., b in ..:` nests Loops
    Assign   = Access op= Expr                                         op in  =  +=  max=  min=
    Directive= name arg, ...                                           arg = Ref | int | key=Ref|int
    Ref      = dotted name (`conv`, `conv.y`)
    Kernel   = name, params, outputs, lets, assumes, decls, body: Loop|Assign..., schedule: Directive...,
               defaults: Let...  (`default N = 4`; sizes used when not given by -D or input arrays)
    Call fns also include the conversions f32(x) f16(x) bf16(x) (round to that dtype).

Every node has `span`; equality ignores spans (compare=False) so parse -> fmt -> parse gives an equal tree.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Union

from tilec.errors import Span

NOSPAN = Span("<none>", 0, 0, 0, 0)


def _span() -> Span:
    return field(default=NOSPAN, compare=False, repr=False)


@dataclass(frozen=True)
class Num:
    value: int | float
    span: Span = _span()


@dataclass(frozen=True)
class Name:
    id: str
    span: Span = _span()


@dataclass(frozen=True)
class Neg:
    x: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class BinOp:
    op: str  # + - * / %
    lhs: "Expr"
    rhs: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class Call:
    fn: str  # a name of tilec.lang.functions.FUNCTIONS
    args: tuple["Expr", ...]
    span: Span = _span()


@dataclass(frozen=True)
class Access:
    tensor: str
    indices: tuple["Expr", ...]
    span: Span = _span()
    fill: float | None = None  # a padded read `X[i - 1] ?? 0`: the value where an index falls outside X


Expr = Union[Num, Name, Neg, BinOp, Call, Access]


def map_reads(e: Expr, fn: Callable[[Access], Expr]) -> Expr:
    """e with each tensor read replaced by fn(read), through operators, calls and negation (indices untouched)."""
    if isinstance(e, Access):
        return fn(e)
    if isinstance(e, BinOp):
        return replace(e, lhs=map_reads(e.lhs, fn), rhs=map_reads(e.rhs, fn))
    if isinstance(e, Call):
        return replace(e, args=tuple(map_reads(x, fn) for x in e.args))
    if isinstance(e, Neg):
        return replace(e, x=map_reads(e.x, fn))
    return e


@dataclass(frozen=True)
class Compare:
    op: str  # == != < <= > >=
    lhs: Expr
    rhs: Expr
    span: Span = _span()


@dataclass(frozen=True)
class TensorType:
    dtype: str  # f32 f16 bf16
    shape: tuple[Expr, ...]
    span: Span = _span()


@dataclass(frozen=True)
class Param:
    name: str
    type: TensorType
    span: Span = _span()


@dataclass(frozen=True)
class Decl:
    name: str
    type: TensorType
    span: Span = _span()


@dataclass(frozen=True)
class Let:
    name: str
    value: Expr
    span: Span = _span()


@dataclass(frozen=True)
class Assume:
    cond: Compare
    span: Span = _span()


@dataclass(frozen=True)
class Assign:
    target: Access
    op: str  # = += max= min=
    value: Expr
    span: Span = _span()


@dataclass(frozen=True)
class Loop:
    var: str
    start: Expr
    stop: Expr
    body: tuple["Stmt", ...]
    span: Span = _span()


Stmt = Union[Loop, Assign]


@dataclass(frozen=True)
class Ref:
    parts: tuple[str, ...]  # ("conv", "y") for conv.y
    span: Span = _span()


@dataclass(frozen=True)
class KeyArg:
    key: str
    value: "Ref | int"
    span: Span = _span()


@dataclass(frozen=True)
class Directive:
    name: str
    args: tuple["Ref | int | KeyArg", ...]
    span: Span = _span()


@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple[Param, ...]
    outputs: tuple[str, ...]
    lets: tuple[Let, ...]
    assumes: tuple[Assume, ...]
    decls: tuple[Decl, ...]
    body: tuple[Stmt, ...]
    schedule: tuple[Directive, ...] = ()
    comments: tuple[str, ...] = field(default=(), compare=False)  # leading comment lines, kept by fmt
    span: Span = _span()
    # added by LANG: `default N = 4, C = 256` sizes used when neither -D nor input arrays give them
    defaults: tuple[Let, ...] = ()
    # added by LANG: where each name after `->` was written, for errors about outputs
    output_spans: tuple[Span, ...] = field(default=(), compare=False, repr=False)
