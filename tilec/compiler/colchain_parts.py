"""Parts of a column chain (build_colchain.py) that read no builder state: the expression helpers that find the
part of a statistic's terms computed in place and the output's row-only parts, and the passes over a built block
(a scaled eviction folded into the activation reading it, the constant columns lifted out, the extremes' chunks)."""
from __future__ import annotations

import dataclasses

from tilec.compiler import ir
from tilec.compiler.exprs import accesses, fmt_expr
from tilec.compiler.ir import Alloc, Stmt, View, whole
from tilec.lang import syntax as sx


def evicted_through(head: list[Stmt], tail: list[Stmt]) -> tuple[list[Stmt], list[Stmt]]:
    """A sum's scaled eviction (`var_b = var_acc * s` on ScalarE) whose one reader is an activation of it (`rsqrt(var_b
    + e)`, a row part of the output) becomes that activation reading the accumulator: f(acc * s + bias) is one
    ScalarE instruction (NISA activation: op(data * scale + bias)), so a block's chain loses a ScalarE pass and a
    step of its latency (channel_layernorm, column standardisation)."""
    stmts = head + tail
    for e in [x for x in head if isinstance(x, ir.Act)]:
        if e.func != "copy" or e.bias is not None or not isinstance(e.scale, float) or e.src.buf.memory != "psum" \
                or e.dst != whole(e.dst.buf) or e.src != whole(e.src.buf) or e.total is not None:
            continue
        readers = [x for x in ir.walk(tuple(stmts)) if any(v.buf == e.dst.buf for v in reads_of(x))]
        if len(readers) != 1 or not isinstance(readers[0], ir.Act) or readers[0] not in tail:
            continue
        c = readers[0]
        if c.src != e.dst or c.scale != 1.0 or c.total is not None:
            continue
        fused = dataclasses.replace(c, src=e.src, scale=e.scale)
        head = [x for x in head if x is not e and not (isinstance(x, Alloc) and x.buf == e.dst.buf)]
        tail = [fused if x is c else x for x in tail]
        stmts = head + tail
    return head, tail


def column_chunks(TF: int, P: int) -> list[tuple[int, int]]:
    """(start, width) of the chunks of TF columns an extreme transposes: the fewest of at most P columns, of one
    width when TF splits so (392 = 4 x 98: one reduce and no narrower chunk's own transpose and reduce), else of P
    and a narrower last one."""
    k = -(-TF // P)
    CB = TF // k if TF % k == 0 else min(TF, P)
    return [(lo, min(CB, TF - lo)) for lo in range(0, TF, CB)]


def constants(stmts: list[Stmt]) -> list[Stmt]:
    """The constant columns the expressions made (hoistable blocks), for the kernel's start: left in a block they
    are made again in every copy of a software-pipelined stage (a memset and an add each, per sub-block)."""
    return [x for x in ir.walk(tuple(stmts)) if isinstance(x, ir.Block) and x.hoist]


def without_constants(stmts: list[Stmt]) -> list[Stmt]:
    return [dataclasses.replace(x, body=tuple(without_constants(list(x.body)))) if isinstance(x, ir.Loop) else x
            for x in stmts if not (isinstance(x, ir.Block) and x.hoist)]


def reads_of(x: Stmt) -> list[View]:
    return [v for f in dataclasses.fields(x) if f.name != "dst" and isinstance(v := getattr(x, f.name), View)]


def subtrees(e: sx.Expr) -> list[sx.Expr]:
    out = [e]
    for f in dataclasses.fields(e):
        v = getattr(e, f.name)
        if f.name == "indices":
            continue
        for x in v if isinstance(v, tuple) else (v,):
            if isinstance(x, (sx.BinOp, sx.Call, sx.Neg, sx.Access, sx.Num)):
                out += subtrees(x)
    return out


def replaced(e: sx.Expr, key: str, new: sx.Expr) -> sx.Expr:
    if fmt_expr(e) == key:
        return new
    if isinstance(e, sx.Neg):
        return dataclasses.replace(e, x=replaced(e.x, key, new))
    if isinstance(e, sx.BinOp):
        return dataclasses.replace(e, lhs=replaced(e.lhs, key, new), rhs=replaced(e.rhs, key, new))
    if isinstance(e, sx.Call):
        return dataclasses.replace(e, args=tuple(replaced(x, key, new) for x in e.args))
    return e


def reads(e: sx.Expr, name: str) -> bool:
    return any(x.tensor == name for x in accesses(e))


def common(terms: sx.Expr, later: list[sx.Expr], X: str) -> sx.Expr | None:
    """The largest subexpression of `terms` that reads X (not X itself), such that every later expression reads X
    only through it."""
    found = [t for t in subtrees(terms) if not isinstance(t, sx.Access) and reads(t, X)]
    found.sort(key=lambda t: -len(subtrees(t)))
    for t in found:
        key = fmt_expr(t)
        if all(not reads(replaced(e, key, sx.Num(0.0)), X) for e in later):
            return t
    return None


def row_parts(e: sx.Expr, rows: set[str]) -> list[sx.Expr]:
    """The largest subexpressions that read only statistics (no X) and are more than one read of one."""
    if isinstance(e, sx.Access) or isinstance(e, sx.Num):
        return []
    names = {x.tensor for x in accesses(e)}
    if names and names <= rows:
        return [e]
    out: list[sx.Expr] = []
    for x in (e.x,) if isinstance(e, sx.Neg) else (e.lhs, e.rhs) if isinstance(e, sx.BinOp) else \
            e.args if isinstance(e, sx.Call) else ():
        out += row_parts(x, rows)
    return out
