"""Row chains: consecutive row reductions and element-wise statements over the same rows, fused into one pass.

softmax, layernorm and rmsnorm written as several statements are a chain of ops that all put the same rows R on
the partitions (`m[i] max= X[i, j]`, `e[i, j] = exp(X[i, j] - m[i])`, `s[i] += e[i, j]`, `Y[i, j] = e[i, j] / s[i]`).
Built one op at a time, every intermediate row goes to HBM and back. Fused (compute_at of every op at the row-tile
loop of the chain), each row tile of TILE_P rows is loaded once, whole rows stay in SBUF, the reductions leave
(TILE_P, 1) columns, and only what is needed after the chain is stored:

    for pt in range(R / TILE_P):
        load the full-row inputs [TILE_P, F] and the column inputs (TILE_P, 1)
        op by op: tensor_reduce into a column, or the element-wise expression (ScalarE/VectorE) into a tile
        store the chain's outputs

Rows broadcast along the free dimension (g[j], b[j]) are copied to every partition once, before the loop. A chain
is fused only with the default schedule (no directive names its ops) and when its tiles fit the SBUF budget.
"""
from __future__ import annotations

import dataclasses
import math

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh, hbm_view
from tilec.compiler.build_simple import ExprCompiler
from tilec.compiler.build_util import a, broadcast_row, loop, ones_row, sl, term
from tilec.compiler.ir import Act, Alloc, Buf, Dma, Reduce, Scalar, Stmt, View, full, whole
from tilec.compiler.ops import ColumnReduceOp, EltwiseOp, Op, ReduceOp
from tilec.compiler.schedule import PMAX, best_divisor

Built = tuple[list[tuple[str, int]], list[Stmt]]
_IDENTITY = {"add": 0.0, "maximum": float("-inf"), "minimum": float("inf")}


def _fit(op: Op, rows: int) -> tuple[int, int] | None:
    """(rows, free size it works on; 0 for a column) of an op that fits a row chain, else None. A plain element-wise
    op of one column (`r[i] = rsqrt(v[i] + eps)`) fits a chain whose rows are known."""
    if type(op) is ReduceOp:
        return op.dim("R"), op.dim("F")
    if isinstance(op, EltwiseOp) and op.layout and op.dim("O") == 1:
        return op.dim("P"), op.dim("F")
    if isinstance(op, EltwiseOp) and not op.layout and rows and op.size == rows:
        return rows, 0
    return None


def row_chains(ops: tuple[Op, ...], scheduled: set[str]) -> list[list[int]]:
    """Runs of >= 2 consecutive ops over the same rows and free size (at least one a row reduction), none named
    by a directive: each is built as one fused row chain."""
    chains: list[list[int]] = []
    run: list[int] = []
    rows = free = 0
    for i, op in enumerate(ops):
        shape = _fit(op, rows) if op.name not in scheduled else None
        if shape is None or (run and (shape[0] != rows or (shape[1] and free and shape[1] != free))):
            _close(chains, run, ops, free)
            run, rows, free = [], 0, 0
            shape = _fit(op, 0) if op.name not in scheduled else None
            if shape is None:
                continue
        run.append(i)
        rows, free = shape[0], free or shape[1]
    _close(chains, run, ops, free)
    return chains


def _close(chains: list[list[int]], run: list[int], ops: tuple[Op, ...], free: int) -> None:
    if len(run) >= 2 and free > 1 and any(type(ops[i]) is ReduceOp for i in run):
        chains.append(list(run))


class _Chain:
    def __init__(self, ops: list[Op], hbm: dict[str, Buf], fresh_for, keep: set[str]) -> None:
        self.ops, self.hbm, self.keep = ops, hbm, keep
        self.fresh_for = fresh_for  # op -> its name allocator: each op's temporaries keep their own names
        self.fresh: Fresh = fresh_for(ops[-1])
        self.R = next(op.dim("R") for op in ops if type(op) is ReduceOp)
        self.F = next(op.dim("F") for op in ops if type(op) is ReduceOp)
        self.TP = best_divisor(self.R, PMAX)
        self.line = ops[0].line
        self.made = {op.out for op in ops}

    def kind(self, name: str) -> str:
        """full ([R, F]), column ([R]) or row ([F]) by the tensor's size."""
        size = 1
        for d in self.hbm[name].shape:
            size *= d
        if size == self.R * self.F and self.F > 1:
            return "full"
        return "column" if size == self.R else "row"

    def build(self) -> Built:
        pre, _ = self.row_broadcasts()
        body: list[Stmt] = []
        tiles: dict[str, View] = {}
        for name in self.inputs():
            st, tiles[name] = self.load(name)
            body += st
        for op in self.ops:
            body += self.compute(op, tiles, body)
            body += self.rounded(op.out, tiles)
        for name in sorted(self.keep & self.made, key=lambda n: [o.out for o in self.ops].index(n)):
            body += self.store(name, tiles[name])
        outs = ", ".join(op.out for op in self.ops)
        nest = loop("pt", self.R // self.TP, body, note="for the rows (tiles of TILE_P), every op of the chain",
                    line=self.line)
        block = ir.Block(f"{outs}: one pass over row tiles (fused row chain)", tuple(nest), self.line)
        return [("TILE_P", self.TP)], pre + [block]

    def rounded(self, name: str, tiles: dict[str, View]) -> list[Stmt]:
        """An f16/bf16 tensor's value as its store rounds it: through a tile of its dtype and back to fp32 (the chain
        reads its values as fp32 operands; a (P, 1) column must be one [ISA6 tensor_scalar])."""
        dt = self.hbm[name].dtype
        if dt == "f32":
            return []
        tile = tiles[name]
        narrow = Buf(self.fresh(f"{name}_{dt}"), "sbuf", dt, tile.buf.shape)
        back = Buf(self.fresh(f"{name}_rounded"), "sbuf", "f32", tile.buf.shape)
        tiles[name] = whole(back)
        return [Alloc(narrow, line=self.line), ir.Copy(whole(narrow), tile, self.line),
                Alloc(back, line=self.line), ir.Copy(whole(back), whole(narrow), self.line)]

    def inputs(self) -> list[str]:
        names: list[str] = []
        for op in self.ops:
            for n in _reads(op):
                if n not in self.made and n not in names and self.kind(n) != "row":
                    names.append(n)
        return names

    def rows_view(self, name: str, shape: tuple[int, int], what: str) -> tuple[Buf, list[Stmt]]:
        return hbm_view(self.hbm[name], shape, self.fresh(f"{name}_{what}"), self.line)

    def load(self, name: str) -> tuple[list[Stmt], View]:
        free = self.F if self.kind(name) == "full" else 1
        view, st = self.rows_view(name, (self.R, free), "v")
        # a (P, 1) column is a tensor_scalar / activation operand, which is fp32 [ISA6 tensor_scalar]: the DMA converts
        dt = self.hbm[name].dtype if free > 1 else "f32"
        tile = Buf(self.fresh(f"{name}_tile"), "sbuf", dt, (self.TP, free))
        rows = sl(a(term("pt", self.TP, "TILE_P")), self.TP)
        self.views = getattr(self, "views", []) + st
        return [Alloc(tile, line=self.line), Dma(whole(tile), View(view, (rows, full(free))), self.line)], whole(tile)

    def row_broadcasts(self) -> tuple[list[Stmt], bool]:
        """Each row operand [F] copied to every partition once: ones[1, P].T @ row, 512 columns per matmul."""
        out: list[Stmt] = []
        self.row_tiles: dict[str, View] = {}
        names = [n for op in self.ops for n in getattr(op, "rows", ())]
        ones_of: dict[str, Buf] = {}  # nc_matmul wants both operands fp32 or neither: ones in each row's dtype
        for name in dict.fromkeys(names):
            dt = self.hbm[name].dtype
            if dt not in ones_of:
                ones_of[dt], made = ones_row(self.fresh(f"ones_{dt}"), dt, self.TP, self.line)
                out += made
            ones = ones_of[dt]
            view, st = self.rows_view(name, (1, self.F), "v")
            tile = Buf(self.fresh(f"{name}_tile"), "sbuf", "f32", (self.TP, self.F))
            row = Buf(self.fresh(f"{name}_row"), "sbuf", dt, (1, self.F))
            out += st + [Alloc(row, line=self.line), Dma(whole(row), whole(view), self.line),
                                Alloc(tile, line=self.line)]
            chunk = best_divisor(self.F, 512)
            acc = Buf(self.fresh(f"{name}_bcast"), "psum", "f32", (self.TP, chunk))
            cols = sl(a(term("c", chunk)), chunk)
            out += loop("c", self.F // chunk,
                        broadcast_row(acc, ones, View(row, (full(1), cols)), self.line)
                        + [ir.Copy(View(tile, (full(self.TP), cols)), whole(acc), self.line)], line=self.line)
            self.row_tiles[name] = whole(tile)
        return out, bool(names)

    def compute(self, op: Op, tiles: dict[str, View], done: list[Stmt]) -> list[Stmt]:
        line = getattr(op, "update_line", 0) or op.line
        if type(op) is ReduceOp:
            return self.reduce(op, tiles, line, done)
        assert isinstance(op, EltwiseOp)
        free = self.F if self.kind(op.out) == "full" else 1
        fresh = self.fresh_for(op)
        out = Buf(fresh(f"{op.out}_tile"), "sbuf", "f32", (self.TP, free))
        every = {**tiles, **self.row_tiles}
        columns = {n for n in every if every[n].buf.shape[1] == 1} if free > 1 else set()
        stmts = [Alloc(out, line=op.line)]
        stmts += ExprCompiler(every, (self.TP, free), op.line, fresh, columns, fold=True,
                              prefix=f"{op.out}_tmp").emit(op.expr, whole(out))
        tiles[op.out] = whole(out)
        return stmts

    def reduce(self, op: ReduceOp, tiles: dict[str, View], line: int, done: list[Stmt]) -> list[Stmt]:
        """A max/min is a VectorE tensor_reduce. A sum rides on ScalarE: the activation that computed the summed
        tile also writes its row sums (reduce_res), or a copy activation of a loaded tile does; VectorE, which
        carries the chain's other reductions and tensor_tensor work, is then free of it."""
        stmts: list[Stmt] = []
        fresh = self.fresh_for(op)
        if op.expr is None:
            src = tiles[op.src]
        else:
            value = Buf(fresh(f"{op.out}_terms"), "sbuf", "f32", (self.TP, self.F))
            stmts += [Alloc(value, line=line)]
            stmts += ExprCompiler(tiles, (self.TP, self.F), line, fresh, set(), fold=True,
                                  prefix=f"{op.out}_tmp").emit(op.expr, whole(value))
            src = whole(value)
        col = Buf(fresh(f"{op.out}_col"), "sbuf", "f32", (self.TP, 1))
        scaled = False  # the constant factor already applied inside the activation that sums
        if op.op != "add":
            stmts += [Alloc(col, line=line), Reduce(whole(col), src, op.op, line)]
        elif op.expr is not None and self.sum_on_act(stmts, src, col, line):
            scaled = self.fold_scale(stmts, src, op.scale)
        elif not self.sum_on_act(done, src, col, line):
            junk = Buf(fresh(f"{op.out}_copy"), "sbuf", "f32", (self.TP, self.F))
            stmts += [Alloc(col, line=line), Alloc(junk, line=line),
                      Act(whole(junk), src, "copy", None, op.scale, line, whole(col))]  # sum(x * scale)
            scaled = True
        if op.scale != 1.0 and not scaled:
            stmts.append(Scalar(whole(col), whole(col), "multiply", op.scale, line))
        if isinstance(op.init, str):
            stmts.append(ir.Binary(whole(col), whole(col), tiles[op.init], op.op, op.line))
        elif op.init != _IDENTITY[op.op]:
            stmts.append(Scalar(whole(col), whole(col), op.op, op.init, op.line))
        tiles[op.out] = whole(col)
        return stmts

    @staticmethod
    def fold_scale(stmts: list[Stmt], terms: View, factor: float) -> bool:
        """sum(square(x)) * c = sum(square(x * sqrt(c))): the factor moves into the activation that computes this
        reduction's own terms (a square or a copy), saving one instruction per row tile."""
        for i, s in enumerate(stmts):
            if isinstance(s, Act) and s.dst == terms and s.bias is None and s.scale == 1.0 and factor > 0:
                if s.func in ("square", "copy"):
                    scale = math.sqrt(factor) if s.func == "square" else factor
                    stmts[i] = dataclasses.replace(s, scale=scale)
                    return True
        return factor == 1.0

    @staticmethod
    def sum_on_act(stmts: list[Stmt], src: View, col: Buf, line: int) -> bool:
        """Attach the row sum to the activation that wrote `src`, if one did (in place, in `stmts`, with the
        column's allocation just before it)."""
        for i in range(len(stmts) - 1, -1, -1):
            s = stmts[i]
            if isinstance(s, Act) and s.dst == src and s.total is None:
                stmts[i] = dataclasses.replace(s, total=whole(col))
                stmts.insert(i, Alloc(col, line=line))
                return True
            if src in ir.views(s):  # read or written by something else after the activation: leave it
                return False
        return False

    def store(self, name: str, tile: View) -> list[Stmt]:
        free = tile.buf.shape[1]
        view, st = self.rows_view(name, (self.R, free), "out")
        self.views = getattr(self, "views", []) + st
        out: list[Stmt] = []
        if self.hbm[name].dtype != tile.buf.dtype:
            cast = Buf(self.fresh(f"{name}_cast"), "sbuf", self.hbm[name].dtype, tile.buf.shape)
            out += [Alloc(cast, line=self.line), ir.Copy(whole(cast), tile, self.line)]
            tile = whole(cast)
        rows = sl(a(term("pt", self.TP, "TILE_P")), self.TP)
        return out + [Dma(View(view, (rows, full(free))), tile, self.line)]


def _reads(op: Op) -> list[str]:
    names = list(getattr(op, "inputs", ()) or ())
    if isinstance(op, ReduceOp):
        names = list(op.inputs or (op.src,)) + ([op.init] if isinstance(op.init, str) else [])
    if isinstance(op, EltwiseOp):
        names += list(op.columns)
    return names


def build_row_chain(ops: list[Op], hbm: dict[str, Buf], fresh_for, keep: set[str]) -> Built:
    """fresh_for(op): the name allocator of each op of the chain."""
    chain = _Chain(ops, hbm, fresh_for, keep)
    consts, stmts = chain.build()
    return consts, getattr(chain, "views", []) + stmts


def reads_of(op: Op) -> list[str]:
    """Every tensor an op reads (for deciding what a chain must store)."""
    names = _reads(op) + list(getattr(op, "rows", ()))
    for attr in ("src", "x", "w", "bias"):
        value = getattr(op, attr, None)
        if isinstance(value, str):
            names.append(value)
    return names


__all__ = ["row_chains", "build_row_chain", "reads_of", "ColumnReduceOp"]
