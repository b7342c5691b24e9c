"""Lowering a scheduled level-A nest (after a rule's primitives, rules.py) to level B (ir.py), which the passes
(hoist, unroll, legalise, squeeze, allocate, the verifier) and codegen take from there:

    view X_v = X                     -> view X_v: hbm (a reshape of HBM, or X itself when the shapes agree)
    alloc T: sbuf                    -> alloc T
    for v in serial(n)               -> for v in affine(n)   (gone when n = 1: v is 0; its comment is kept)
    for c in partition(P): ...       -> the instructions tensorize.emit chooses for the nest (a DMA for a stage's
                                        copy, ones-matmul for a row broadcast, the expression's instructions)

The rule's `block(loop, label)` groups the statements of a loop under a label (the kernel's phase comments); a row
staged and broadcast inside a loop becomes a hoistable block (the hoist pass lifts it out of loops it does not use).
"""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh, hbm_view
from tilec.compiler.build_util import loop, ones_row
from tilec.compiler.exprs import accesses
from tilec.compiler.ir import Aff, Sl, View
from tilec.compiler.layout import perfect_chain
from tilec.compiler.lower import size_value
from tilec.compiler.nest import (Access, Alloc, Assign, Buffer, Const, Expr, Kernel, Load, Loop, Op, Stmt, Update,
                                 lower_expr, lower_stmt, walk)
from tilec.lang import syntax as sx
from tilec.compiler.ops import ColumnReduceOp, EltwiseOp, ReduceOp, TransposeOp
from tilec.compiler.rules import Prim
from tilec.compiler.tensorize import Emit, emit, emit_update
from tilec.errors import InternalError
from tilec.target import Target

Built = tuple[list[tuple[str, int]], list[ir.Stmt]]


def eltwise_nest(op: EltwiseOp, program) -> Kernel:
    """The level-A nest of one selected element-wise statement (chains already inlined by selection): its loops
    over the output, one assignment."""
    out = program.tensors[op.out]
    names = tuple(v for _, v in op.vars)
    reads = tuple(dict.fromkeys((*op.inputs, *op.columns, *op.rows)))
    ext = {v: size_value(n, program.sizes) if not isinstance(n, int) else n for v, n in zip(names, out.shape)}
    bufs = {n: Buffer(n, "hbm", program.tensors[n].dtype, _read_shape(program, n, op.expr, ext))
            for n in (*reads, op.out)}
    idx = tuple(Aff((ir.Term(v),)) for v in names)
    body: Stmt = Assign(Access(op.out, idx), lower_expr(op.expr, names, program.sizes), op.line)
    for v, n in reversed(list(zip(names, out.shape))):
        body = Loop(v, size_value(n, program.sizes) if not isinstance(n, int) else n, (body,), "serial",
                    dict(op.loop_lines).get(v, op.line))
    return Kernel(op.name, tuple(bufs[n] for n in reads), (bufs[op.out],), (body,))


def _read_shape(program, name: str, expr: sx.Expr, extents: dict[str, int]) -> tuple:
    """A tensor's shape as the statement reads it: without the one-element dimensions whose constant 0 index
    selection left out (`A[i, 0, j]` of an [N, 1, M] tensor read as `A[i, j]`, select.drop_unit_indices)."""
    shape = tuple(program.tensors[name].shape)
    reads = {a.indices for a in accesses(expr) if a.tensor == name}
    if len(reads) != 1 or len(idx := reads.pop()) == len(shape) or \
            not all(isinstance(e, sx.Name) and e.id in extents for e in idx):
        return shape
    want = [extents[e.id] for e in idx if isinstance(e, sx.Name)]
    rest = list(want)
    for d in (d if isinstance(d, int) else size_value(d, program.sizes) for d in shape):
        if rest and d == rest[0]:
            rest.pop(0)
        elif d != 1:
            return shape
    return tuple(want) if not rest else shape


_UPDATE = {"add": "+=", "maximum": "max=", "minimum": "min="}


def reduce_nest(op: ReduceOp, program) -> Kernel | None:
    """The level-A nest of a row reduction of one tensor over the .tl loops (kept, then reduced): the reduction from
    its identity, `s[i] = 0; s[i] += A[i, j]`, then its epilogue, one nest per step over the kept loops (rules.reduce
    computes them at the row tile): the constant factor (`s[i] = s[i] * 0.5`, a mean) and an initial value other
    than the identity (`s[i] = s[i] + b[i]`, `s[i] = max(s[i], 1)`). The reduction is associative, so starting from
    the initial value or adding it last is the same sum (up to rounding). A reduced expression is the update's value
    (`s[i] += A[i, j] * B[i, j]`), its tensors the nest's parameters. None when the tensors are not indexed by the
    loops plainly."""
    kept = [v for role, v in op.vars if role.startswith("k")]
    red = [v for role, v in op.vars if role.startswith("r")]
    src, out = program.tensors[op.src], program.tensors[op.out]
    if len(src.shape) != len(kept) + len(red) or len(out.shape) != len(kept) or not kept:
        return None
    ext = [size_value(n, program.sizes) if not isinstance(n, int) else n for n in src.shape]
    col = [op.init] if isinstance(op.init, str) else []
    reads = list(op.inputs or (op.src,))
    bufs = {n: Buffer(n, "hbm", program.tensors[n].dtype, tuple(ext if n in reads else ext[:len(kept)]))
            for n in (*reads, *col, op.out)}
    idx = lambda vs: tuple(Aff((ir.Term(v),)) for v in vs)  # noqa: E731
    lines = dict(op.loop_lines)

    def nest(stmt: Stmt, loops: list[str]) -> Stmt:
        for v, n in reversed(list(zip(loops, ext))):
            stmt = Loop(v, n, (stmt,), "serial", lines.get(v, op.line))
        return stmt
    S = Access(op.out, idx(kept))
    init = nest(Assign(S, Const(_IDENTITY[op.op]), op.line), kept)
    value = Load(Access(op.src, idx(kept + red))) if op.expr is None else \
        lower_expr(op.expr, tuple(kept + red), program.sizes)
    update = Update(S, _UPDATE[op.op], value, op.update_line)
    epilogue: list[Stmt] = []
    if op.scale != 1.0:
        epilogue.append(nest(Assign(S, Op("*", (Load(S), Const(op.scale))), op.update_line), kept))
    start = Load(Access(op.init, idx(kept))) if isinstance(op.init, str) else \
        None if op.init == _IDENTITY[op.op] else Const(op.init)
    if start is not None:
        epilogue.append(nest(Assign(S, Op(_COMBINE[op.op], (Load(S), start)), op.line), kept))
    return Kernel(op.name, tuple(bufs[n] for n in (*reads, *col)), (bufs[op.out],),
                  (init, nest(update, kept + red), *epilogue))


def colreduce_nest(op: ColumnReduceOp, program) -> Kernel | None:
    """The level-A nest of a sum over leading or middle dimensions in the data's loop order (o, r, f): the kept
    indices before the reduced run, the reduced ones, the kept ones after (`s[b, n] = 0; s[b, n] += A[b, m, n]`).
    Its epilogue, one nest per step over the kept loops as in reduce_nest: the constant factor (`s[b, n] = s[b, n] *
    0.01`, a mean), then an initial value other than 0 (`s[j] = s[j] + b[j]`, `s[j] = s[j] + 0.5`). A reduced
    expression is the update's value (`s[j] += A[i, j] * A[i, j]`), its tensors the nest's parameters. None for what
    the column rule does not take (max/min)."""
    outer = [v for role, v in op.vars if role.startswith("o")]
    red = [v for role, v in op.vars if role.startswith("r")]
    kept = [v for role, v in op.vars if role.startswith("k")]
    src = program.tensors[op.src]
    if op.op != "add" or len(src.shape) != len(outer + red + kept):
        return None
    ext = dict(zip(outer + red + kept, (size_value(n, program.sizes) if not isinstance(n, int) else n
                                        for n in src.shape)))
    col = [op.init] if isinstance(op.init, str) else []
    reads = list(op.inputs or (op.src,))
    full = lambda n: n in reads and len(program.tensors[n].shape) == len(src.shape)  # noqa: E731 (else a row)
    bufs = {n: Buffer(n, "hbm", program.tensors[n].dtype,
                      tuple(ext[v] for v in (outer + red + kept if full(n) else outer + kept)))
            for n in (*reads, *col, op.out)}
    idx = lambda vs: tuple(Aff((ir.Term(v),)) for v in vs)  # noqa: E731
    lines = dict(op.loop_lines)

    def nest(stmt: Stmt, loops: list[str]) -> Stmt:
        for v in reversed(loops):
            stmt = Loop(v, ext[v], (stmt,), "serial", lines.get(v, op.line))
        return stmt
    S = Access(op.out, idx(outer + kept))
    init = nest(Assign(S, Const(0.0), op.line), outer + kept)
    value = Load(Access(op.src, idx(outer + red + kept))) if op.expr is None else \
        lower_expr(op.expr, tuple(outer + red + kept), program.sizes)
    update = Update(S, "+=", value, op.update_line)
    epilogue: list[Stmt] = []
    if op.scale != 1.0:
        epilogue.append(nest(Assign(S, Op("*", (Load(S), Const(op.scale))), op.update_line), outer + kept))
    start = Load(Access(op.init, idx(outer + kept))) if isinstance(op.init, str) else \
        None if op.init == 0.0 else Const(op.init)
    if start is not None:
        epilogue.append(nest(Assign(S, Op("+", (Load(S), start)), op.line), outer + kept))
    return Kernel(op.name, tuple(bufs[n] for n in (*reads, *col)), (bufs[op.out],),
                  (init, nest(update, outer + red + kept), *epilogue))


_COMBINE = {"add": "+", "maximum": "max", "minimum": "min"}  # an initial value combined with the reduced value
_IDENTITY = {"add": 0.0, "maximum": float("-inf"), "minimum": float("inf")}
_ALU = {v: k for k, v in _UPDATE.items()}


def copy_nest(op: EltwiseOp, program, between: dict[str, Buffer] | None = None) -> Kernel:
    """The level-A nest of a data copy (select_copy.py, or a permute's DMA step with its HBM intermediates
    `between`): its loops, one assignment; a loop read divided by k is split in two the way nest.lower_nest does it
    (`i / 2` -> i_q, and i = 2*i_q + i_r elsewhere)."""
    assert isinstance(op.expr, sx.Access) and op.span is not None
    known = between or {}
    bufs = {n: known.get(n) or Buffer(n, "hbm", program.tensors[n].dtype, tuple(program.tensors[n].shape))
            for n in (*op.inputs, op.out)}
    lines = dict(op.loop_lines)
    dst = sx.Access(op.out, op.out_index or tuple(sx.Name(v) for v, _ in op.loops), op.span)
    stmt: sx.Stmt = sx.Assign(dst, "=", op.expr, op.span)
    for v, n in reversed(op.loops):
        stmt = sx.Loop(v, sx.Num(0), sx.Num(n), (stmt,), replace(op.span, line=lines.get(v, op.line)))
    return Kernel(op.name, tuple(bufs[n] for n in op.inputs), (bufs[op.out],), (lower_stmt(stmt, program.sizes),))


def transpose_nest(op: TransposeOp, program, between: dict[str, Buffer] | None = None) -> Kernel:
    """The level-A nest of one selected transpose or permute: Y[out order] = X[source order] over the .tl loops
    (`between`: the HBM intermediates of a permute of several steps, by name)."""
    known = between or {}
    bufs = {n: known.get(n) or Buffer(n, "hbm", program.tensors[n].dtype, tuple(program.tensors[n].shape))
            for n in (op.src, op.out)}
    lines = dict(op.loop_lines)
    out_vars = tuple(_out_order(op))
    idx = lambda vs: tuple(Aff((ir.Term(v),)) for v in vs)  # noqa: E731
    value: Expr = Load(Access(op.src, idx(op.src_vars)))
    if op.value is not None:  # work on the way (fn_chain.py): the statement's value over the .tl loops
        value = lower_expr(op.value, tuple(v for v, _ in op.loops), program.sizes)
        bufs.update((n, Buffer(n, "hbm", program.tensors[n].dtype, tuple(program.tensors[n].shape))) for n in op.vectors)
    body: Stmt = Assign(Access(op.out, idx(out_vars)), value, op.line)
    for v, n in reversed(op.loops):
        body = Loop(v, n, (body,), "serial", lines.get(v, op.line))
    return Kernel(op.name, (bufs[op.src], *(bufs[n] for n in op.vectors)), (bufs[op.out],), (body,))


def permute_between(op: TransposeOp, program) -> dict[str, Buffer]:
    """The HBM intermediates of a permute of several steps: each step's output but the last, in the source's dtype
    (a permute moves values: no rounding on the way), shaped by its order of the loops."""
    ext = dict(op.loops)
    dtype = program.tensors[op.src].dtype
    return {s.out: Buffer(s.out, "hbm", dtype, tuple(ext[v] for v in _step_order(s))) for s in op.steps[:-1]}


def _step_order(step: TransposeOp | EltwiseOp) -> list[str]:
    return [v for v, _ in step.loops] if isinstance(step, EltwiseOp) else _out_order(step)


def _out_order(op: TransposeOp) -> list[str]:
    """The output's index order: batch, then the second run, then the first (select_transpose's swap)."""
    if op.out_vars:
        return list(op.out_vars)
    names = list(op.src_vars)
    i, j = names.index(dict(op.vars)["i"]), names.index(dict(op.vars)["j"])
    return names[:i] + names[j:] + names[i:j]


def lower_tiles(k: Kernel, prims: list[Prim], hbm: dict[str, ir.Buf], fresh: Fresh, target: Target) -> Built:
    """The scheduled nest `k` as level-B statements, and the named constants its splits introduced."""
    low = _Lowering(k, prims, hbm, fresh, target)
    out: list[ir.Stmt] = []
    views = 0
    for s in k.body:
        made = low.stmts((s,), top=True)
        out += low.pending + made  # a ones row goes just before the first statement that needs it
        low.pending = []
        views += len(made) if isinstance(s, Alloc) and s.buf.view_of else 0
    out = out[:views] + low.single_allocs + out[views:]  # `buffers X, 1`: X's tile allocated once, before the loops
    views += len(low.single_allocs)
    if "" in low.blocks:  # `block("", label)`: everything after the views
        first = next((s.line for s in k.body if isinstance(s, Loop)), 0)
        out = out[:views] + [ir.Block(low.blocks[""], tuple(out[views:]), _line(k.body[-1]) or first)]
    consts = [(str(dict(p.kw)["name"]), int(p.args[1])) for p in prims if p.name == "split" and dict(p.kw).get("name")]
    return list(dict.fromkeys(consts)), out


class _Lowering:
    def __init__(self, k: Kernel, prims: list[Prim], hbm: dict[str, ir.Buf], fresh: Fresh, target: Target) -> None:
        self.fresh, self.target = fresh, target
        self.nest = k.buffers()
        self.bufs: dict[str, ir.Buf] = {b.name: hbm[b.name] for b in (*k.params, *k.outputs)}
        self.blocks = {p.args[0]: p.args[1] for p in prims if p.name == "block"}
        # the partition tile of a named split (`split(r_g, 128, inner=p, name=TILE_P)`, `partition(p)`): an HBM
        # slice over a partition loop of that extent prints the name (a staged copy's loop is not `p` itself)
        parted = {str(p.args[0]) for p in prims if p.name == "partition"}
        self.part_names = {int(p.args[1]): str(dict(p.kw)["name"]) for p in prims if p.name == "split"
                           and dict(p.kw).get("name") and dict(p.kw).get("inner") in parted}
        self.part = ""
        self.tensorize = {p.args[0]: dict(p.kw) for p in prims if p.name == "tensorize"}
        self.single = {p.args[0] for p in prims if p.name == "single"}  # buffers allocated once, before the loops
        self.single_allocs: list[ir.Stmt] = []
        self.accumulators = {u.dst.buf: u.op for lp in walk(k.body) if isinstance(lp, Loop)
                             and self.tensorize.get(lp.var, {}).get("accumulate")
                             for u in walk(lp.body) if isinstance(u, Update)}  # buffer -> its update
        self.ones: dict[str, ir.Buf] = {}
        self.pending: list[ir.Stmt] = []
        # the squares `T = x * x` a rule named (`tensorize(.., square=..)`): instruction -> "sum" or "scalar"
        self.squares: dict[ir.Binary, str] = {}

    def stmts(self, body: tuple[Stmt, ...], top: bool = False) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        i = 0
        while i < len(body):
            if not top and self._row_block(body[i:i + 4]):
                group = self.stmts(body[i:i + 4], top=True)
                label = f"row {self._row_name(body[i + 1])}: copied to every partition"
                out.append(ir.Block(label, tuple(group), _line(body[i + 3]), hoist=True))
                i += 4
                continue
            scaled = self._evicted_scale(body[i + 1]) if i + 1 < len(body) else None
            if scaled is not None:  # the next step multiplies what this copy evicts: one ScalarE activation
                made = self.stmt(body[i])
                if len(made) != 1 or not isinstance(made[0], ir.Copy) or made[0].src.buf.memory != "psum" or \
                        made[0].dst.buf != self.bufs[scaled[1]]:
                    raise InternalError(f"lower_tiles: tensorize(evict=True) follows no eviction of {scaled[1]} "
                                        f"from PSUM: {made}")
                out += [ir.Act(made[0].dst, made[0].src, "copy", scale=scaled[0], line=made[0].line)]
                i += 2
                continue
            out += self.stmt(body[i])
            i += 1
        return scalar_squares(square_sums(out, self.target, self.squares), self.target, self.squares)

    def _evicted_scale(self, s: Stmt) -> tuple[float, str] | None:
        """(c, X), when `s` is a nest `X[..] = X[..] * c` tensorized with `evict=True` (the rule folds it into the PSUM
        eviction just before it); None for any other statement."""
        while isinstance(s, Loop) and s.kind != "partition" and s.extent == 1 and len(s.body) == 1:
            s = s.body[0]
        if not isinstance(s, Loop) or not self.tensorize.get(s.var, {}).get("evict"):
            return None
        body = perfect_chain(s)[-1].body
        x = body[0] if len(body) == 1 else None
        if not isinstance(x, Assign) or not isinstance(x.expr, Op) or x.expr.name != "*" or \
                x.expr.args[0] != Load(x.dst) or not isinstance(x.expr.args[1], Const):
            raise InternalError(f"lower_tiles: tensorize({s.var}, evict=True) is not `X = X * c`")
        return float(x.expr.args[1].value), x.dst.buf

    def stmt(self, s: Stmt) -> list[ir.Stmt]:
        if isinstance(s, Alloc) and s.buf.view_of:
            view, made = hbm_view(self.bufs[s.buf.view_of], s.buf.shape, self.fresh(s.buf.name), s.line)
            self.bufs[s.buf.name] = view
            return list(made)
        if isinstance(s, Alloc):
            b = self.bufs[s.buf.name] = ir.Buf(self.fresh(s.buf.name), s.buf.memory, s.buf.dtype, s.buf.shape)
            if s.buf.memory == "psum":  # a matmul's accumulator: its first matmul writes, the rest add
                return [ir.Alloc(b, zero=True, line=s.line)]
            if s.buf.name in self.single:  # (legalise then makes the loops writing it sequential)
                self.single_allocs.append(ir.Alloc(b, line=s.line))
                return []
            if s.buf.name not in self.accumulators:
                return [ir.Alloc(b, line=s.line)]
            start = _IDENTITY[_ALU[self.accumulators[s.buf.name]]]  # an accumulator starts at its identity
            zeroed: list[ir.Stmt] = [ir.Alloc(b, zero=True, line=s.line)]
            return zeroed + ([ir.Scalar(ir.whole(b), ir.whole(b), "add", start, s.line)] if start else [])
        assert isinstance(s, Loop), f"a statement outside any tensorized nest: {s}"
        if s.kind == "partition":
            return self.instructions(s)
        kind = "static" if s.kind == "unrolled" else "affine"  # (`unroll`: a static range, traced per iteration)
        made = loop(shown(s.var), s.extent, self.stmts(s.body), kind, note=s.note, line=s.line)
        if s.var in self.blocks:
            return [ir.Block(self.blocks[s.var], tuple(made), _line(s))]
        return made

    def instructions(self, s: Loop) -> list[ir.Stmt]:
        chain = perfect_chain(s)
        body = chain[-1].body
        assert len(body) == 1 and isinstance(body[0], (Assign, Update)), \
            f"tensorize: not one assignment or update under {s.var}"
        nest = {lp.var: lp.extent for lp in chain}
        self.part = s.var
        line = int(self.tensorize.get(s.var, {}).get("line", s.line))
        e = Emit(lambda a: self.view(a, nest), self.fresh, self.ones_row, lambda b: self.nest[b].memory,
                 lambda b, parts: self.ones_col(self.nest[b].dtype, parts, line),
                 lambda b, blocks, rows: self.ones_block(self.nest[b].dtype, blocks, rows, line))
        if isinstance(body[0], Update):
            return emit_update(body[0], nest, self.target, e, bool(self.tensorize.get(s.var, {}).get("accumulate")))
        how = self.tensorize.get(s.var, {})
        made = emit(body[0], nest, self.target, e, fold=bool(how.get("fold")), regroup=bool(how.get("regroup")),
                    psum=str(how.get("psum", "")), engine=str(how.get("engine", "")),
                    temps=str(how.get("temps", "tmp")), once=tuple(how.get("once", ())))
        if how.get("square"):
            self.squares[the_square(made, s.var)] = str(how["square"])
        if how.get("gpsimd"):  # an fp32 element-wise instruction split by columns with GpSimdE (the same values)
            made = [x for b in made for x in (shared_with_gpsimd(b, self.target) if isinstance(b, ir.Binary) else [b])]
        return made

    def view(self, a: Access, nest: dict[str, int]) -> View:
        """An access inside a tensorized nest as a view: a dimension indexed by a nest loop is a slice over it; one
        indexed by outer loops only is that one element (a constant index of a unit dimension on chip is a slice of
        one, keeping a column 2-D)."""
        buf = self.bufs[a.buf]
        idx: list[ir.Idx] = []
        for i, n in zip(a.index, buf.shape):
            inner = [t for t in i.terms if t.var in nest]
            if sum(nest[t.var] > 1 for t in inner) > 1:  # a view slices one loop per dimension: reshape first
                raise InternalError(f"lower_tiles: {a.buf}'s index {i} uses several loops of one tensorized nest "
                                    f"({', '.join(t.var for t in inner)}); a view of it would drop all but one")
            start = Aff(tuple(replace(t, var=shown(t.var)) for t in i.terms if t.var not in nest), i.const)
            if inner:
                n = nest[inner[0].var]
                name = self.part_names.get(n, "") if inner[0].var == self.part and buf.memory == "hbm" else ""
                idx.append(Sl(start, n, inner[0].coef, name))
            elif buf.memory != "hbm" and n == 1 and not i.terms:  # a column's [p, 0]: stays a (P, 1) tile
                idx.append(Sl(start, 1))
            else:
                idx.append(start)
        return View(buf, tuple(idx))

    def ones_row(self, dtype: str, parts: int, line: int) -> ir.Buf:
        if dtype not in self.ones:
            self.ones[dtype], made = ones_row(self._ones_name(dtype, "row"), dtype, parts, line)
            self.pending += made
        return self.ones[dtype]

    def _ones_name(self, dtype: str, kind: str) -> str:
        """`ones_<dtype>`, or `ones_<dtype>_<kind>` when another ones buffer of this op has that name (fresh names
        are stable per base: a broadcast row's ones and a column sum's in one op would share it)."""
        name = self.fresh(f"ones_{dtype}")
        return self.fresh(f"ones_{dtype}_{kind}") if any(b.name == name for b in self.ones.values()) else name

    def ones_col(self, dtype: str, parts: int, line: int) -> ir.Buf:
        """A (parts, 1) column of ones in SBUF, the stationary side of a column sum (made before the statement)."""
        key = f"col:{dtype}"
        if key not in self.ones:
            ones = ir.Buf(self._ones_name(dtype, "col"), "sbuf", dtype, (parts, 1))
            self.ones[key] = ones
            self.pending += [ir.Alloc(ones, zero=True, line=line),
                             ir.Scalar(ir.whole(ones), ir.whole(ones), "add", 1.0, line)]
        return self.ones[key]

    def ones_block(self, dtype: str, blocks: int, rows: int, line: int) -> ir.Buf:
        """A (blocks * rows, blocks) block-diagonal ones matrix in SBUF (column k is 1 on partitions k*rows ..
        (k+1)*rows): the stationary side of a sum of o's stacked on the partitions, each o's rows into its row."""
        key = f"block:{dtype}:{blocks}:{rows}"
        if key not in self.ones:
            ones = ir.Buf(self._ones_name(dtype, "block"), "sbuf", dtype, (blocks * rows, blocks))
            self.ones[key] = ones
            self.pending += [ir.Alloc(ones, zero=True, line=line)]
            self.pending += [ir.Scalar(v, v, "add", 1.0, line)
                             for v in (View(ones, (Sl(Aff((), b * rows), rows), Sl(Aff((), b), 1)))
                                       for b in range(blocks))]
        return self.ones[key]

    def _row_block(self, stmts: tuple[Stmt, ...]) -> bool:
        """alloc ROW; copy into ROW; alloc TILE; broadcast ROW into TILE: a row made ready inside a loop."""
        if len(stmts) < 4 or not all(isinstance(x, Alloc) for x in stmts[0::2]):
            return False
        copy, fill = stmts[1], stmts[3]
        if not (isinstance(copy, Loop) and isinstance(fill, Loop)) or \
                not all(isinstance(x, Assign) for x in walk((copy, fill)) if isinstance(x, (Assign, Update))):
            return False  # (an update: a reduction, not a broadcast)
        c, f = _assign(copy), _assign(fill)
        row = stmts[0].buf.name  # type: ignore[union-attr]
        broadcast = fill.kind == "partition" and isinstance(f.expr, Load) and \
            not any(t.var == fill.var for i in f.expr.access.index for t in i.terms)  # every partition, one row
        return broadcast and c.dst.buf == row and isinstance(f.expr, Load) and f.expr.access.buf == row

    def _row_name(self, copy: Stmt) -> str:
        src = _assign(copy).expr
        assert isinstance(src, Load)
        return self.nest[src.access.buf].view_of or src.access.buf


def the_square(made: list[ir.Stmt], var: str) -> ir.Binary:
    """The instruction `T = x * x` writing the whole tile T that a nest tensorized with `square=` computes last."""
    sq = made[-1] if made else None
    if not isinstance(sq, ir.Binary) or sq.op != "multiply" or sq.a != sq.b or sq.engine or \
            sq.dst != ir.whole(sq.dst.buf) or sq.dst.buf.memory != "sbuf" or sq.a.buf.memory != "sbuf":
        raise InternalError(f"lower_tiles: tensorize({var}, square=..) computes no square of a tile: {made}")
    return sq


def square_sums(out: list[ir.Stmt], target: Target, squares: dict[ir.Binary, str]) -> list[ir.Stmt]:
    """`tensorize(p_x, square="sum")` (rules.reduce): the square `T = x * x` and the row sum of T the next nest
    computes (`acc = sum(T)` along T's free axis, T read by nothing else) as one ScalarE activation: T = square(x)
    with acc its sum (reduce_res). VectorE computed both (a multiply and a tensor_reduce), ScalarE sat idle. Model,
    4096 x 4096 `s[i] += (A - B) * (A - B)` without start-up: f32 1085.8 -> 375.7 us (DMA floor 364.8), bf16 914.7
    -> 195.4 us (floor 182.4), with shared_with_gpsimd and the cast on ScalarE.
    The sum is of the fp32 squares (T's rounding to its dtype is not summed), as precise as the two steps or more."""
    for i, sq in enumerate(out):
        if not isinstance(sq, ir.Binary) or squares.get(sq) != "sum":
            continue
        users = [j for j, s in enumerate(out) if j != i and not isinstance(s, ir.Alloc)
                 and any(v.buf == sq.dst.buf for v in ir.views(s))]
        red = out[users[0]] if len(users) == 1 else None
        j = users[0] if users else i
        if not isinstance(red, ir.Reduce) or red.op != "add" or red.src != sq.dst or len(red.src.shape()) != 2 or \
                red.dst.shape() != (red.src.shape()[0], 1) or j < i or \
                not all(isinstance(s, ir.Alloc) for s in out[i + 1:j]):
            raise InternalError(f"lower_tiles: the square {sq} named square=sum is not summed along its rows alone "
                                f"by the next instruction: {out[i + 1:]}")
        act = ir.Act(sq.dst, sq.a, "square", line=sq.line, total=red.dst)  # after the allocations between them
        # the sum's conversion to the result's dtype (a (P, 1) copy) on ScalarE too, where the target's ScalarE
        # runs tensor_copy (NeuronCore-v3): the store that follows then issues from ScalarE's DMA stream, not
        # VectorE's, where the next tiles' loads would queue behind it
        on_scalar = "scalar" in target.instr("tensor_copy").engines
        rest = [replace(s, engine="scalar") if on_scalar and isinstance(s, ir.Copy) and s.src == red.dst
                and not s.engine else s for s in out[j + 1:]]
        made = out[:i] + out[i + 1:j] + [act] + rest
        return square_sums(_producer_shared(made, sq, i - 1, target), target, squares)
    return out


def scalar_squares(out: list[ir.Stmt], target: Target, squares: dict[ir.Binary, str]) -> list[ir.Stmt]:
    """`tensorize(.., square="scalar")` (rules.colreduce, rules._Squares): the square `T = x * x` as a ScalarE
    activation T = square(x), x's fp32 producer shared by GpSimdE and VectorE (shared_with_gpsimd)."""
    for i, sq in enumerate(out):
        if isinstance(sq, ir.Binary) and squares.get(sq) == "scalar":
            made = out[:i] + [ir.Act(sq.dst, sq.a, "square", line=sq.line)] + out[i + 1:]
            return scalar_squares(_producer_shared(made, sq, i - 1, target), target, squares)
    return out


def _producer_shared(made: list[ir.Stmt], sq: ir.Binary, last: int, target: Target) -> list[ir.Stmt]:
    """The statements with the element-wise instruction computing the square's operand, if it is among them before
    index `last` + 1, split by columns (shared_with_gpsimd: the same values)."""
    x = next((n for n in range(last, -1, -1) if isinstance(made[n], ir.Binary)
              and made[n].dst == sq.a), None)  # type: ignore[union-attr]
    if x is not None:
        producer = made[x]
        assert isinstance(producer, ir.Binary)
        made[x:x + 1] = shared_with_gpsimd(producer, target)
    return made


def shared_with_gpsimd(b: ir.Binary, target: Target, rank: int = 2) -> list[ir.Stmt]:
    """The fp32 tile `b` computes (`d = A - B` before a square_sums activation) split by columns: GpSimdE computes
    the last ones, VectorE the first, in proportion to their speeds (both 2 cycles an element with an fp32 result).
    VectorE alone was the bound of 4096 x 4096 bf16 `s[i] += (A - B) * (A - B)` (VectorE 276 us, DMA floor 182 us).
    GpSimdE's part comes first in program order: it is the first reader of the loaded tiles, so their loads issue
    on its DMA stream (tilec/perf/schedule.py, DMA trigger streams; build_colreduce._fold does the same).
    `rank`: the views' dimensions (3: build_halo's tiles of k rows per partition, split by their last axis)."""
    views = (b.dst, b.a, b.b)
    plain = all(v.buf.memory == "sbuf" and len(v.shape()) == rank and not v.perm and v.shape() == b.dst.shape()
                and isinstance(v.idx[-1], ir.Sl) and v.idx[-1].step == 1 for v in views)
    if b.engine or b.scale0 != 1.0 or b.dst.buf.dtype != "f32" or not plain:
        return [b]
    cols = b.dst.shape()[-1]
    cut = round(cols * target.vector_part())  # (NC-v2: all on the faster engine, Target.vector_part)
    if not 0 < cut < cols:
        return [b] if cut else [replace(b, engine="gpsimd")]

    def part(v: View, lo: int, n: int) -> View:
        last = v.idx[-1]
        assert isinstance(last, ir.Sl)
        return replace(v, idx=v.idx[:-1] + (ir.Sl(last.start.plus(lo), n),))
    rest = cols - cut
    return [replace(b, dst=part(b.dst, cut, rest), a=part(b.a, cut, rest), b=part(b.b, cut, rest), engine="gpsimd"),
            replace(b, dst=part(b.dst, 0, cut), a=part(b.a, 0, cut), b=part(b.b, 0, cut))]


def shown(var: str) -> str:
    """A loop's name in the kernel: a region's copy `bi@ab` (names are unique in level A) is `bi` inside its block."""
    return var.split("@")[0]


def _assign(s: Stmt) -> Assign:
    stores = [x for x in walk((s,)) if isinstance(x, Assign)]
    return stores[0]


def _line(s: Stmt) -> int:
    return next((x.line for x in walk((s,)) if isinstance(x, Assign)), getattr(s, "line", 0))
