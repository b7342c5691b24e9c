"""Helpers the loop-nest builders share: loops that vanish at extent 1, index terms, the constants a nest uses,
pooling epilogues, the partition broadcast of a row."""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Sequence

from tilec.compiler import ir
from tilec.compiler.ir import Aff, Alloc, Binary, Buf, Loop, Matmul, Reshape, Scalar, Sl, Stmt, Term, View, full, whole
from tilec.compiler.named import Named, named_ints, words as text_words


def term(var: str, coef: int = 1, name: str = "") -> Term:
    return Term(var, coef, name)


def a(*parts) -> Aff:
    return ir.aff(*parts)


def sl(start: Aff | int, size: int, step: int = 1, name: str = "") -> Sl:
    return Sl(start if isinstance(start, Aff) else Aff((), start), size, step, name)


def map_aff(node, fn, sl_fn=None):
    """Rebuild an IR node with every Aff replaced by fn(aff) (and every slice by sl_fn(slice), if given)."""
    if isinstance(node, Aff):
        return fn(node)
    if isinstance(node, tuple):
        return tuple(map_aff(x, fn, sl_fn) for x in node)
    if dataclasses.is_dataclass(node) and not isinstance(node, (Buf, Term)):
        changes = {f.name: map_aff(getattr(node, f.name), fn, sl_fn) for f in dataclasses.fields(node)}
        node = dataclasses.replace(node, **changes)
        return sl_fn(node) if sl_fn is not None and isinstance(node, Sl) else node
    return node


def used_consts(stmts: list[Stmt], consts: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The constants the statements name (in an index, a slice size, a named trip count or dimension, or a loop's
    comment): a loop of extent 1 drops
    its tile's constant, and the kernel should not define names nobody reads."""
    named: set[str] = set()

    def fn(x: Aff) -> Aff:
        named.update(t.name for t in x.terms if t.name)
        return x

    def sl_fn(x: Sl) -> Sl:
        named.add(x.name)
        return x
    map_aff(tuple(stmts), fn, sl_fn)
    named |= {w for x in printed_sizes(stmts) for w in text_words(x.text)}
    words = set(re.findall(r"\w+", " ".join(_comments(stmts))))
    return [(name, value) for name, value in consts if name in named or name in words]


def printed_sizes(stmts: Sequence[Stmt]) -> list[Named]:
    """The named sizes codegen prints: loops' trip counts, allocations' and reshapes' dimensions (not the shapes of
    buffers a view reads: a kernel parameter's is printed in numbers by its shape check)."""
    out: list[Named] = []
    for s in ir.walk(tuple(stmts)):
        if isinstance(s, Loop):
            out += named_ints(s.extent)
        elif isinstance(s, (Alloc, Reshape)):
            out += named_ints(s.buf.shape)
    return out


def _comments(stmts) -> list[str]:
    out: list[str] = []
    for s in stmts:
        if isinstance(s, (Loop, ir.Block)):
            out += [s.note if isinstance(s, Loop) else s.label] + _comments(s.body)
    return out


def drop_var(node, var: str):
    """Substitute 0 for `var` (a loop of extent 1 disappears)."""
    def fn(x: Aff) -> Aff:
        return Aff(tuple(t for t in x.terms if t.var != var), x.const)

    def sl_fn(x: Sl) -> Sl:  # a slice left with a constant start prints literal bounds: its size needs no name
        return x if x.start.terms else dataclasses.replace(x, name="")
    return map_aff(node, fn, sl_fn)


def loop(var: str, extent: int, body: Sequence[Stmt], kind: str = "affine", name: str = "",
         note: str = "", line: int = 0) -> list[Stmt]:
    if extent == 1:
        return list(drop_var(tuple(body), var))
    return [Loop(var, extent, tuple(body), kind, name, line, note)]


def pool_epilogue(src: View, dst: View, wy: int, wx: int, op: str, scale: float, tmp: Callable[[str], str],
                  line: int) -> list[Stmt]:
    """Combine wy x wx windows of src [P, rows, cols] into dst [P, rows/wy, cols/wx] on the vector engine;
    `tmp("rows")` names the fp32 temporary of the first combine."""
    p, rows, cols = src.shape()
    out: list[Stmt] = []
    cur = src
    steps = [(axis, w) for axis, w in ((1, wy), (2, wx)) if w > 1]
    for n, (axis, w) in enumerate(steps):
        last = n == len(steps) - 1 and scale == 1.0
        shape = (p, rows // wy, cols // wx if axis == 2 else cols)
        target = dst
        if not last:  # the final combine writes straight into dst; earlier ones into an fp32 temporary
            buf = Buf(tmp("rows" if axis == 1 else "cols"), "sbuf", "f32", shape)
            out.append(ir.Alloc(buf, line=line))
            target = ir.whole(buf)
        out += _combine(cur, target, axis, w, op, line)
        cur = target
    if scale != 1.0:
        out.append(Scalar(dst, cur, "multiply", scale, line))
    elif not steps:
        out.append(ir.Copy(dst, cur, line))
    return out


def _combine(src: View, dst: View, axis: int, w: int, op: str, line: int) -> list[Stmt]:
    """dst = op over the w strided slices of src along free axis `axis` (1 = rows, 2 = columns)."""
    def part(off: int) -> View:
        idx = list(src.idx)
        s = idx[axis]
        assert isinstance(s, Sl)  # the pooled free axes are slices
        idx[axis] = Sl(s.start.plus(off * s.step), s.size // w, s.step * w)
        return View(src.buf, tuple(idx))
    out: list[Stmt] = [Binary(dst, part(0), part(1), op, line)]
    for off in range(2, w):
        out.append(Binary(dst, dst, part(off), op, line))
    return out


def ones_row(name: str, dtype: str, parts: int, line: int) -> tuple[Buf, list[Stmt]]:
    """A (1, parts) row of ones in SBUF: the stationary side of a partition broadcast. nc_matmul wants both operands
    fp32 or neither, so it takes the dtype of the row it broadcasts."""
    ones = Buf(name, "sbuf", dtype, (1, parts))
    return ones, [Alloc(ones, zero=True, line=line), Scalar(whole(ones), whole(ones), "add", 1.0, line)]


def broadcast_row(acc: Buf, ones: Buf, row: View, line: int) -> list[Stmt]:
    """acc[p, f] = row[0, f] for every partition p: ones[1, P].T @ row[1, F] on TensorE, a contraction of 1 into
    PSUM (acc is (P, F) fp32); the caller copies acc out to SBUF."""
    return [Alloc(acc, zero=True, line=line), Matmul(whole(acc), View(ones, (full(1), full(acc.shape[0]))), row, line)]


def prep_notes(stmts: list[Stmt], what: str) -> list[Stmt]:
    """Loops that prepare an operand carry the line of the statement using it; the note says they only prepare it."""
    return [dataclasses.replace(s, note=f"{what}: {s.note}", body=tuple(prep_notes(list(s.body), what)))
            if isinstance(s, ir.Loop) else s for s in stmts]


def hbm_view(base: Buf, shape: tuple[int, ...], name: str, line: int) -> tuple[Buf, list[Stmt]]:
    """`base` seen with `shape` (a free reshape of contiguous HBM), or base itself if the shapes agree."""
    if base.shape == shape:
        return base, []
    view = Buf(name, "hbm", base.dtype, shape)
    return view, [Reshape(view, base, line)]


def identity(name: str, dtype: str, line: int) -> tuple[Buf, list[Stmt]]:
    """The P x P identity matrix (P = the target's partitions) that TensorE's copies and taps multiply by, built on
    chip by one `ir.Identity` (a memset and an affine_select; no HBM round trip). Every builder calls this."""
    from tilec.target import compiled
    n = compiled().pmax
    ident = Buf(name, "sbuf", dtype, (n, n))
    return ident, [Alloc(ident, line=line), ir.Identity(whole(ident), line)]


def identity_ns(itemsize: int) -> float:
    """The model's time for `ir.Identity` of a P x P tile before TensorE's first use of it: the memset to one on
    VectorE, then the affine_select on GpSimdE, each with its engine's static overhead, from the model's own cost
    facts (tilec/perf/costs.py: memset max(MIN_II, N), its half rate being for a 16-bit zero only; affine_select
    150 + N GpSimdE cycles). Neither depends on the dtype (itemsize) at this size."""
    from tilec.perf.costs import Costs
    from tilec.perf.params import target_params
    from tilec.target import compiled
    del itemsize
    t = compiled()
    c = Costs(target_params(t.name))
    n = t.pmax
    memset = (max(c.min_ii, n) + c.static["vector"]) * c.engine_ns["vector"]
    select = (c.iota + n + c.static["gpsimd"]) * c.engine_ns["gpsimd"]
    return memset + select
