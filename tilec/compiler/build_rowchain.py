"""Row chains: consecutive row reductions and element-wise statements over the same rows, fused into one pass.

softmax, layernorm and rmsnorm written as several statements are a chain of ops that all put the same rows R on
the partitions (`m[i] max= X[i, j]`, `e[i, j] = exp(X[i, j] - m[i])`, `s[i] += e[i, j]`, `Y[i, j] = e[i, j] / s[i]`).
Built one op at a time, every intermediate row goes to HBM and back. Fused (compute_at of every op at the row-tile
loop of the chain), each row tile of TILE_P rows is loaded once, whole rows stay in SBUF, the reductions leave
(TILE_P, 1) columns, and only what is needed after the chain is stored:

    for pt in range(R / TILE_P):
        load the full-row inputs [TILE_P, F] and the column inputs (TILE_P, 1)
        op by op: a reduction into a column, or the element-wise expression (ScalarE/VectorE) into a tile
        store the chain's outputs

Inside the loop the values are folded before they are computed (`Lin`, `Steps` below):
  * an affine map of one tile per row (`d = X - mu`, `d * r`) is no pass of its own: the activation that reads it
    takes the map as scale and bias, and a sum rides on that activation (`v += d * d / N` is one square of X with
    bias -mu whose row sums are v; layernorm is three ScalarE passes per row tile);
  * a column op (`-mu`, `-mu * r`, `rsqrt(v / N + eps)`) runs on the engine that made its inputs: between two
    ScalarE passes it is a ScalarE instruction, never a VectorE one queued behind the previous row tile's work;
  * VectorE steps against broadcast rows (`u * g + b`) run column chunk by chunk (TILE_F, one PSUM bank): TensorE
    copies the row's chunk to every partition in PSUM and each intermediate stays in PSUM, so every tensor_tensor
    reads one PSUM operand (N cycles instead of 2N, nki-spec 1.10.4).
Rows read whole from SBUF (g[j] * r[i]) are copied to every partition once, before the loop. A chain is fused only
with the default schedule (no directive names its ops) and when its tiles fit the SBUF budget; what the folding does
not cover (conversions, `%`) goes through the element-wise expression compiler (expr_instrs.ExprCompiler).

An f16/bf16 tensor is rounded where the program says so, with as few instructions as that takes: a tile written by
one instruction and only converted is written narrow by that instruction, the last VectorE step of a chunk writes
the narrow output tile the store reads, and a tensor no op of the chain reads is rounded by its store alone.

At long rows (whole-row tiles that do not fit the budget), a 16-bit chain of three phases (layernorm) is chunked and
software-pipelined (chunk_pipe.py); other chains go through fit_long_rows, which lets tiles of disjoint lives share
space (share.py) or chunks the columns (chunk_cols.py): X stays in SBUF, everything else goes chunk by chunk.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import AbstractSet, Union

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh, hbm_view
from tilec.compiler.build_reduce import build_short_rows, short_rows
from tilec.compiler.expr_instrs import ExprCompiler
from tilec.compiler import chunk_pipe, mean_var
from tilec.compiler.chunk_cols import chunk_columns, rotation_need
from tilec.compiler.passes import peak_usage
from tilec.compiler.share import share_tiles
from tilec.compiler.build_util import a, broadcast_row, loop, ones_row, sl, term
from tilec.compiler.exprs import const_value, fmt_expr
from tilec.compiler.ir import (DTYPE_BYTES, Act, Alloc, Binary, Block, Buf, Dma, Reduce, Scalar, Sl, Stmt, View, full,
                               whole)
from tilec.compiler.ops import ColumnReduceOp, EltwiseOp, Op, ReduceOp
from tilec.compiler.select_eltwise import has_reversed_read
from tilec.compiler.schedule import PMAX, best_divisor
from tilec.lang import syntax as sx
from tilec.lang.functions import FUNCTIONS
from tilec.target import invariant, target as get_target

Built = tuple[list[tuple[str, int]], list[Stmt]]
_HALF = ("f16", "bf16")
_IDENTITY = {"add": 0.0, "maximum": float("-inf"), "minimum": float("inf")}


def _fit(op: Op, rows: int) -> tuple[int, int] | None:
    """(rows, free size it works on; 0 for a column) of an op that fits a row chain, else None. A plain element-wise
    op of one column (`r[i] = rsqrt(v[i] + eps)`) fits a chain whose rows are known."""
    if type(op) is ReduceOp:
        return op.dim("R"), op.dim("F")
    if isinstance(op, EltwiseOp) and op.copy:  # a data copy (shifted indices) has no row structure
        return None
    if isinstance(op, EltwiseOp) and has_reversed_read(op.expr, {v for _, v in op.vars}):
        return None  # a reversed read (`A[N - 1 - i, j]`): the element-wise rule reverses its rows, a chain does not
    if isinstance(op, EltwiseOp) and op.layout and op.dim("O") == 1:
        return op.dim("P"), op.dim("F")
    if isinstance(op, EltwiseOp) and not op.layout and rows and op.size == rows:
        return rows, 0
    return None


def row_chains(ops: tuple[Op, ...], scheduled: AbstractSet[str]) -> list[list[int]]:
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


@dataclass(frozen=True)
class Col:
    """`view * coef`: a (TILE_P, 1) column up to a constant factor, which rides on whatever instruction reads it."""
    view: View
    coef: float = 1.0


Val = Union[float, Col]  # a per-partition value: a constant or a column


@dataclass(frozen=True)
class Lin:
    """`base * scale + bias`: a tile (TILE_P, F) or a column (TILE_P, 1) under a per-partition affine map, or, with
    no base, the value `bias` alone. Nothing is computed until a consumer needs it: an activation reading it takes
    the map as its scale and bias (`d = X - mu` is never a pass of its own; the square that sums d * d reads X with
    bias -mu), a sum takes it into the activation that sums."""
    base: View | None
    scale: Val = 1.0
    bias: Val = 0.0


@dataclass(frozen=True)
class Steps:
    """`first op1 x1 op2 x2 ...`: VectorE steps against other tiles (broadcast rows g, b) or columns, still to be
    computed; `left` says the running value is the left operand. Built column chunk by column chunk, every
    intermediate in PSUM, so each step after the first reads one PSUM operand (tensor_tensor at N cycles, not 2N)."""
    first: "View | Lin"  # a tile, or an affine map of one (computed into the output tile, then the steps in place)
    steps: tuple[tuple[str, "View | float", bool], ...]


Value = Union[Lin, Steps]
_ALU = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide"}
PSUM_F32 = invariant("psum_fmax")  # fp32 elements of one PSUM bank: the column chunk of a chain of VectorE steps
# rows at least this long scale by a column on the broadcast of a row (Steps, scale_row): the ScalarE pass it saves
# (F cycles) then outweighs the ~0.5 us the transpose and the row's copy add to each row tile's path (on the model,
# layernorm 256 x 512 f32: 22.5 us with the pass, 23.3 without; 256 x 2048: 41.0 with, 38.7 without)
TURN_MIN_F = 2048
# tiles of at least this many bytes per partition must fit twice when they rotate across row tiles (fit_chain);
# smaller ones (columns, partial sums) are left to the planning margin (schedule.SBUF_PLANNING_MARGIN)
ROTATING_MIN = 1024


class _Unsupported(Exception):
    """An expression the chain's folding does not cover: the op is built by the element-wise expression compiler."""


class _Chain:
    def __init__(self, ops: list[Op], hbm: dict[str, Buf], fresh_for, keep: set[str], skewed: bool = False,
                 turn: bool = True, long: bool = False) -> None:
        self.ops, self.hbm, self.keep = ops, hbm, keep
        self.fresh_for = fresh_for  # op -> its name allocator: each op's temporaries keep their own names
        self.fresh: Fresh = fresh_for(ops[-1])
        self.R = next(op.dim("R") for op in ops if type(op) is ReduceOp)
        self.F = next(op.dim("F") for op in ops if type(op) is ReduceOp)
        self.TP = best_divisor(self.R, PMAX)
        self.line = ops[0].line
        self.made = {op.out for op in ops}
        self.values: dict[str, Value] = {}  # every tensor of the chain, computed or still folded
        self.body: list[Stmt] = []  # the loop body over row tiles, in order
        self.consts: list[Stmt] = []  # constant columns, made once before the loop
        self.const_cols: dict[float, View] = {}
        self.engine_of: dict[str, str] = {}  # on-chip buffer -> the engine that wrote it (scalar | vector | dma)
        self.memo: dict[object, View] = {}  # a folded value -> the buffer it was computed into
        self.counts: dict[str, int] = {}
        self.readers = {n: sum(n in _reads(o) for o in ops) for n in self.made}
        self.chunked = False  # a chain of VectorE steps built chunk by chunk (TILE_F)
        self.skewed = skewed  # built to be software-pipelined (pair_tiles.skew_row_tiles): work moves off ScalarE
        self.turn = turn  # a column scaling a broadcast row may ride on the broadcast (scale_row)
        # built to be chunked, then skewed (chunk_pipe.py): ScalarE keeps the sums, a row sum of a rounded 16-bit
        # tile reads the value before its rounding, and a tile is made where it is first read
        self.long = long
        self.unrounded: dict[str, Value] = {}  # a rounded 16-bit tile -> its value before the rounding (long)
        self.exact: set[str] = set()  # 16-bit tensors whose value is exactly one of their dtype (no rounding)
        self.exact_in: dict[str, str] = {}  # an fp32 buffer -> the 16-bit dtype all its values are exactly of
        self.narrow_of: dict[str, View] = {}  # a rounded column (fp32) -> the f16/bf16 column it was copied from
        self.discarded: View | None = None
        self.top: sx.Expr | None = None  # the expression whose value is the op's own tile (named `{out}_tile`)

    def kind(self, name: str) -> str:
        """full ([R, F]), column ([R]) or row ([F]) by the tensor's size."""
        size = 1
        for d in self.hbm[name].shape:
            size *= d
        if size == self.R * self.F and self.F > 1:
            return "full"
        return "column" if size == self.R else "row"

    def build(self) -> Built:
        self.row_broadcasts()
        for name in self.inputs():
            st, view = self.load(name)
            self.body += st
            self.values[name] = Lin(view)
            self.engine_of[view.buf.name] = "dma"
        for op in self.ops:
            self.compute(op)
            self.rounded(op)
        for name in sorted(self.keep & self.made, key=lambda n: [o.out for o in self.ops].index(n)):
            self.op = next(o for o in self.ops if o.out == name)
            self.cur_line = self.op.line
            view = self.view(self.values[name], f"{name}_tile")
            self.body += self.store(name, view)
        self.body = _unused_dropped(_narrow_read_as_data(_narrow_writes(self.body)))
        if self.skewed:
            self.body = _offload(self.body, not self.long)
        if self.long:
            self.body = chunk_pipe.sunk(self.body)
        outs = ", ".join(op.out for op in self.ops)
        nest = loop("pt", self.R // self.TP, self.body, note="for the rows (tiles of TILE_P), every op of the chain",
                    line=self.line)
        block = ir.Block(f"{outs}: one pass over row tiles (fused row chain)", tuple(nest), self.line)
        consts = [("TILE_P", self.TP)] + ([("TILE_F", self.chunk())] if self.chunked else [])
        return consts, self.setup() + self.consts + [block]

    def rounded(self, op: Op) -> None:
        """An f16/bf16 tensor's value as its store rounds it: computed, then through a tile of its dtype and back to
        fp32 (the chain reads values as fp32 operands; a (P, 1) column must be one [ISA6 tensor_scalar]). Folding
        stops at a narrow tensor: the program says its value is rounded."""
        dt = self.hbm[op.out].dtype
        if dt == "f32" or not self.readers.get(op.out, 0) or op.out in self.exact:
            return  # read by no op of the chain: the store's cast rounds it
        try:
            tile = self.view(self.values[op.out], f"{op.out}_tile")
        except _Unsupported:  # a constant: the expression compiler's tile (fallback) rounds as it stores
            return
        narrow = Buf(self.fresh(f"{op.out}_{dt}"), "sbuf", dt, tile.buf.shape)
        if tile.buf.shape[1] > 1 and self.long:
            self.unrounded[op.out] = self.values[op.out]
        if tile.buf.shape[1] > 1:  # a tile is read as it is (instructions take f16/bf16 operands), no copy back
            self.body += [Alloc(narrow, line=op.line), ir.Copy(whole(narrow), tile, op.line)]
            self.engine_of[narrow.name] = "vector"
            self.values[op.out] = Lin(whole(narrow))
            return
        # a column's rounding runs on GpSimdE, idle in a row chain: on VectorE it would queue behind the previous
        # row tile's steps, and ScalarE's next pass waits for it (GpSimdE reads the SBUF column; PSUM it cannot)
        # (software-pipelined, GpSimdE runs the steps against rows of the previous tile: ScalarE copies, in its
        # own chain of column ops)
        back = Buf(self.fresh(f"{op.out}_rounded"), "sbuf", "f32", tile.buf.shape)
        self.exact_in[back.name] = dt  # an fp32 column holding values of dt
        self.narrow_of[back.name] = whole(narrow)
        if self.skewed:
            self.body += [Alloc(narrow, line=op.line), Act(whole(narrow), tile, "copy", line=op.line),
                          Alloc(back, line=op.line), Act(whole(back), whole(narrow), "copy", line=op.line)]
            self.engine_of[back.name] = "scalar"
            self.values[op.out] = Lin(whole(back))
            return
        on = "gpsimd" if tile.buf.memory == "sbuf" else ""
        self.body += [Alloc(narrow, line=op.line), ir.Copy(whole(narrow), tile, op.line, on),
                      Alloc(back, line=op.line), ir.Copy(whole(back), whole(narrow), op.line, on)]
        self.engine_of[back.name] = on or "vector"
        self.values[op.out] = Lin(whole(back))

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

    def row_broadcasts(self) -> None:
        """Each row operand [F]: its copy on every partition (ones[1, P].T @ row on TensorE, 512 columns per matmul)
        made once before the loop, for the instructions that read it from SBUF; a chain of VectorE steps instead
        broadcasts the row chunk by chunk into PSUM as it goes (steps_view), from the row loaded whole before the
        loop. Which of the two the loop uses is known once it is built (setup)."""
        self.row_tiles: dict[str, View] = {}
        self.row_of: dict[str, tuple[Buf, Buf, str]] = {}  # broadcast tile -> (its row (1, F), ones (1, P), tensor)
        self.row_setup: dict[str, list[Stmt]] = {}  # buffer -> the statements that make it
        names = [n for op in self.ops for n in getattr(op, "rows", ())]
        ones_of: dict[str, Buf] = {}  # nc_matmul wants both operands fp32 or neither: ones in each row's dtype
        for name in dict.fromkeys(names):
            dt = self.hbm[name].dtype
            if dt not in ones_of:
                ones_of[dt], made = ones_row(self.fresh(f"ones_{dt}"), dt, self.TP, self.line)
                self.row_setup[ones_of[dt].name] = made
            ones = ones_of[dt]
            view, st = self.rows_view(name, (1, self.F), "v")
            self.views = getattr(self, "views", []) + st
            # in the row's dtype: a 16-bit row's broadcast is exact in it, and takes half the space of fp32
            tile = Buf(self.fresh(f"{name}_tile"), "sbuf", dt, (self.TP, self.F))
            row = Buf(self.fresh(f"{name}_row"), "sbuf", dt, (1, self.F))
            self.row_setup[row.name] = [Alloc(row, line=self.line), Dma(whole(row), whole(view), self.line)]
            # the SBUF copy loads the row chunk by chunk: a whole row would take F * 4 bytes of every partition
            chunk = best_divisor(self.F, PSUM_F32)
            acc = Buf(self.fresh(f"{name}_bcast"), "psum", "f32", (self.TP, chunk))
            part = Buf(self.fresh(f"{name}_part"), "sbuf", dt, (1, chunk))
            cols = sl(a(term("c", chunk)), chunk)
            self.row_setup[tile.name] = [Alloc(tile, line=self.line)] + loop("c", self.F // chunk, [
                Alloc(part, line=self.line), Dma(whole(part), View(view, (full(1), cols)), self.line),
                *broadcast_row(acc, ones, whole(part), self.line),
                self.evicted(View(tile, (full(self.TP), cols)), whole(acc))], line=self.line)
            self.row_tiles[name] = whole(tile)
            self.row_of[tile.name] = (row, ones, name)

    def evicted(self, dst: View, acc: View) -> Stmt:
        """The copy of a broadcast row's chunk out of PSUM: by ScalarE in a software-pipelined chain, whose first
        row tile starts on VectorE (the mean), else by VectorE (also in a chain built for chunk_pipe, whose first
        row tile starts on ScalarE: bf16 layernorm over rows of 16384 1.61x -> 1.53x)."""
        if self.skewed and not self.long:
            return Act(dst, acc, "copy", line=self.line)
        return ir.Copy(dst, acc, self.line)

    def setup(self) -> list[Stmt]:
        """The row loads and broadcasts the loop reads, in the order they were planned."""
        used = {v.buf.name for s in ir.walk(tuple(self.body)) for v in ir.views(s)}
        used |= {self.row_of[name][1].name for name in used if name in self.row_of}
        return [s for made, stmts in self.row_setup.items() if made in used for s in stmts]

    # ---- one op of the chain -----------------------------------------------------------------------------------

    def compute(self, op: Op) -> None:
        self.op, self.cur_line, self.top = op, getattr(op, "update_line", 0) or op.line, None
        mark, memo = len(self.body), dict(self.memo)
        try:
            if isinstance(op, ReduceOp):
                self.reduce(op)
            else:
                assert isinstance(op, EltwiseOp)
                self.eltwise(op)
        except _Unsupported:  # undo what the attempt emitted; the expression compiler builds the op from tiles
            del self.body[mark:]
            self.memo = memo
            self.fallback(op)

    def eltwise(self, op: EltwiseOp) -> None:
        """An element-wise op stays folded unless something outside the chain needs it (or, for VectorE steps,
        more than one op of the chain reads it)."""
        self.top = op.expr  # the expression whose value is the op's tile (named `{out}_tile`)
        value = self.value(op.expr)
        folded = op.out not in self.keep and (isinstance(value, Lin) and value.base is not None
                                              or self.readers.get(op.out, 0) <= 1)
        self.values[op.out] = value if folded else Lin(self.view(value, f"{op.out}_tile"))

    def reduce(self, op: ReduceOp) -> None:
        """max/min: a VectorE tensor_reduce. A sum rides on ScalarE: the activation that computed the summed tile
        writes its row sums (reduce_res), or an activation over the tile's source does, the affine map it was
        folded with as scale and bias: sum((x - m) * (x - m)) is one square activation of x with bias -m. The
        constant factor (a mean's 1 / N) goes inside that activation when it adds no instruction, else it stays
        on the column for its readers to fold."""
        expr = op.expr if op.expr is not None else sx.Access(op.src, ())
        col = Buf(self.name(f"{op.out}_col", numbered=False), "sbuf", "f32", (self.TP, 1))
        if op.op != "add":
            src = self.view(self.value(expr), f"{op.out}_terms")
            if src.buf.dtype in _HALF and self.hbm[op.out].dtype == src.buf.dtype and op.init == _IDENTITY[op.op]:
                # the max of f16/bf16 values is one of them: reduced into a column of their dtype it is exact (no
                # rounding copies), and VectorE streams a 16-bit reduce into a 16-bit result at N/2 (nki-spec 2.4)
                col = Buf(self.name(f"{op.out}_{src.buf.dtype}", numbered=False), "sbuf", src.buf.dtype, (self.TP, 1))
                self.exact.add(op.out)
            self.emit(Alloc(col, line=self.cur_line), Reduce(whole(col), src, op.op, self.cur_line), engine="vector")
            result: Lin = Lin(whole(col))
            if op.init != _IDENTITY[op.op]:
                init = self.values[op.init] if isinstance(op.init, str) else Lin(None, 1.0, op.init)
                other = self.operand(init)
                result = Lin(self.steps_view(Steps(whole(col), ((op.op, other, True),)), whole(col)))
            self.values[op.out] = result
            return
        square = isinstance(expr, sx.BinOp) and expr.op == "*" and fmt_expr(expr.lhs) == fmt_expr(expr.rhs)
        values = self.values
        if self.long:  # the sum of a rounded tile's values (squared) from its value before the rounding (long)
            self.values = {**values, **self.unrounded}
        try:
            x = self.lin(self.value(expr.lhs if isinstance(expr, sx.BinOp) and square else expr))
        finally:
            self.values = values
        if x.base is None or x.base.shape()[1] == 1:
            raise _Unsupported  # a sum along the rows of a constant or a column
        factor = op.scale
        if not square and x.scale == 1.0 and x.bias == 0.0 and self.sum_on_act(x.base, col):
            total: Val = Col(whole(col), factor)  # the activation's output is read elsewhere: it keeps its scale
        elif square:
            inside = x.bias == 0.0 and factor > 0.0  # (x * s * sqrt(c))^2 sums to c * sum((x * s)^2)
            scale = self.vmul(x.scale, math.sqrt(factor)) if inside else x.scale
            self.act_into(self.discard(), "square", x.base, scale, x.bias, col)
            total = Col(whole(col), 1.0 if inside else factor)
        elif self.skewed and not self.long and x.scale == 1.0 and x.bias == 0.0 and x.base.buf.dtype in _HALF \
                and self.hbm[op.out].dtype == x.base.buf.dtype and self.F & (self.F - 1) == 0 and factor > 0.0:
            # a 16-bit chain, software-pipelined: the sum of a 16-bit tile on VectorE (N/2 cycles into a 16-bit
            # column, nki-spec 2.4), ScalarE keeps its passes for what only it can fuse. The column rounds the
            # fp32 sum once to the tensor's dtype; times 1/N (a power of two) that is the rounded mean exactly
            narrow = Buf(self.name(f"{op.out}_sum", numbered=False), "sbuf", x.base.buf.dtype, (self.TP, 1))
            self.emit(Alloc(narrow, line=self.cur_line), Reduce(whole(narrow), x.base, "add", self.cur_line),
                      engine="vector")
            total = Col(whole(narrow), factor)
            if op.init == 0.0 and math.frexp(factor)[0] == 0.5:  # rounded already: no copies through the dtype
                self.exact.add(op.out)
        else:
            sign = -1.0 if self.subtracted(op.out) else 1.0  # sum -x / N: the readers' `X - mu` is a bias as it is
            if sign < 0:
                col = Buf(self.name(f"{op.out}_neg", numbered=False), "sbuf", "f32", (self.TP, 1))
            scale, bias = self.vmul(x.scale, sign * factor), self.vmul(x.bias, sign * factor)
            self.act_into(self.discard(), "copy", x.base, scale, bias, col)
            total = Col(whole(col), sign)
        result = self.lin_of(total)
        if isinstance(op.init, str):  # the initial value stays folded too: a bias for the column's readers
            result = Lin(result.base, result.scale, self.val(self.lin(self.values[op.init])))
        elif op.init != 0.0:
            result = Lin(result.base, result.scale, op.init)
        self.values[op.out] = result

    def subtracted(self, name: str) -> bool:
        """Every read of `name` by the chain's element-wise ops is subtracted (`X[i, j] - mu[i]`)."""
        signs = [neg for op in self.ops if isinstance(op, EltwiseOp) for neg in _read_signs(op.expr, name)]
        return bool(signs) and all(signs) and not any(name in _reads(op) for op in self.ops
                                                          if isinstance(op, ReduceOp))

    def discard(self) -> View:
        """The one tile every activation kept only for its row sums writes (mean and variance passes share it)."""
        if self.discarded is None:
            self.discarded = self.temp("discard", False)
            dts = {self.hbm[n].dtype for n in self.hbm if n in self.made or n in self.inputs()}
            if len(dts) == 1 and dts <= set(_HALF):
                # a 16-bit chain (every tensor f16/bf16): the discarded output in that dtype, half the space. Whether
                # ScalarE sums its values before or after the output's rounding is not documented; after, each
                # (positive) term differs by at most one unit of the dtype, relatively, and the sum is rounded to
                # the dtype itself
                narrow = dataclasses.replace(self.discarded.buf, dtype=dts.pop())
                self.body[-1] = Alloc(narrow, line=self.cur_line)
                self.discarded = whole(narrow)
        return self.discarded

    def fallback(self, op: Op) -> None:
        """The op through the element-wise expression compiler (what the folding does not cover: conversions,
        `%`, sums along a column), every tensor it reads computed into a tile first."""
        tiles = {n: self.view(self.values[n], f"{n}_tile") for n in _reads(op) if n in self.values}
        line = self.cur_line
        fresh = self.fresh_for(op)
        if isinstance(op, ReduceOp):
            src = tiles[op.src] if op.expr is None else None
            if src is None:
                assert op.expr is not None
                value = Buf(fresh(f"{op.out}_terms"), "sbuf", "f32", (self.TP, self.F))
                self.body += [Alloc(value, line=line)]
                self.body += ExprCompiler(tiles, (self.TP, self.F), line, fresh, set(), fold=True,
                                          prefix=f"{op.out}_tmp").emit(op.expr, whole(value))
                src = whole(value)
            col = Buf(fresh(f"{op.out}_col"), "sbuf", "f32", (self.TP, 1))
            self.body += [Alloc(col, line=line), Reduce(whole(col), src, op.op, line)]
            result = Lin(whole(col), op.scale if op.op == "add" else 1.0)
            if isinstance(op.init, str) or op.init != _IDENTITY[op.op]:
                init = self.values[op.init] if isinstance(op.init, str) else Lin(None, 1.0, op.init)
                result = Lin(self.steps_view(Steps(self.view(result, f"{op.out}_sum"),
                                                   ((op.op, self.operand(init), True),)), None, f"{op.out}_tile"))
            self.values[op.out] = result
            return
        assert isinstance(op, EltwiseOp)
        free = self.F if self.kind(op.out) == "full" else 1
        out = Buf(fresh(f"{op.out}_tile"), "sbuf", "f32", (self.TP, free))
        every = {**tiles, **self.row_tiles}
        columns = {n for n in every if every[n].buf.shape[1] == 1} if free > 1 else set()
        self.body += [Alloc(out, line=op.line)]
        self.body += ExprCompiler(every, (self.TP, free), op.line, fresh, columns, fold=True,
                                  prefix=f"{op.out}_tmp").emit(op.expr, whole(out))
        self.values[op.out] = Lin(whole(out))

    # ---- values of expressions ---------------------------------------------------------------------------------

    def value(self, e: sx.Expr) -> Value:
        c = const_value(e)
        if c is not None:
            return Lin(None, 1.0, c)
        if isinstance(e, sx.Access):
            if e.tensor in self.values:
                return self.values[e.tensor]
            if e.tensor in self.row_tiles:
                return Lin(self.row_tiles[e.tensor])
            raise _Unsupported
        if isinstance(e, sx.Neg):
            return self.combine("*", self.value(e.x), Lin(None, 1.0, -1.0))
        if isinstance(e, sx.Call) and FUNCTIONS[e.fn].instr == "activation":
            x = self.lin(self.value(e.args[0]))
            return Lin(self.act(e.fn, x, f"{self.op.out}_tile" if e is self.top else f"{self.op.out}_tmp"))
        if isinstance(e, sx.Call) and FUNCTIONS[e.fn].instr == "tensor_tensor":
            return self.step(FUNCTIONS[e.fn].nki, self.value(e.args[0]), self.value(e.args[1]))
        if isinstance(e, sx.BinOp) and e.op in _ALU:
            return self.combine(e.op, self.value(e.lhs), self.value(e.rhs))
        raise _Unsupported

    def combine(self, op: str, x: Value, y: Value) -> Value:
        if isinstance(x, Lin) and isinstance(y, Lin):
            if op in "+-":
                folded = self.lin_add(x, y if op == "+" else self.lin_scale(y, -1.0))
                if folded is not None:
                    return folded
            elif op == "*" and (self.scalar(x) or self.scalar(y)):
                return self.lin_mul(x, y) if self.scalar(y) else self.lin_mul(y, x)
            elif op == "/" and self.scalar(y):
                return self.lin_mul(x, self.lin_of(self.vrecip(self.val(y))))
        return self.step(_ALU[op], x, y)

    def scalar(self, x: Lin) -> bool:
        """One value per partition: a constant or a column."""
        return x.base is None or x.base.shape()[1] == 1

    def lin_add(self, x: Lin, y: Lin) -> Lin | None:
        if self.scalar(x) and not self.scalar(y):
            x, y = y, x
        if x.base is None:  # both scalars without a base: constants and columns
            return Lin(None, 1.0, self.vadd(x.bias, self.val(y)))
        if not self.scalar(y):
            return None
        return Lin(x.base, x.scale, self.vadd(x.bias, self.val(y)))

    def lin_mul(self, x: Lin, y: Lin) -> Lin:
        """x * y with y one value per partition."""
        s = self.val(y)
        if x.base is None:
            return Lin(None, 1.0, self.vmul(x.bias, s))
        if not self.scalar(x) and not (isinstance(x.bias, float) and x.bias == 0.0):
            # (X*a + c) * s folded as X*(a*s) + c*s cancels after scaling: where X*a ~ -c (layernorm's X - mu on a
            # row of near-equal values) the fp32 error grows with s (rsqrt(var + eps), up to 1/sqrt(eps)); so the
            # sum is computed first and then scaled (fuzz seed 14003150: 13x the reference's error)
            x = Lin(self.view(x, f"{self.op.out}_centred"))
        return Lin(x.base, self.vmul(x.scale, s, f"{self.op.out}_scale"), self.vmul(x.bias, s, f"{self.op.out}_bias"))

    def lin_scale(self, x: Lin, c: float) -> Lin:
        return self.lin_mul(x, Lin(None, 1.0, c))

    def lin_of(self, v: Val) -> Lin:
        return Lin(v.view, v.coef) if isinstance(v, Col) else Lin(None, 1.0, v)

    def lin(self, v: Value) -> Lin:
        return v if isinstance(v, Lin) else Lin(self.steps_view(v, None, f"{self.op.out}_tmp"))

    def val(self, x: Lin) -> Val:
        """A per-partition value as a constant or a column (computing the column if its map needs it)."""
        if x.base is None:
            return x.bias
        if x.bias == 0.0:
            return self.vmul(Col(x.base), x.scale)
        return Col(self.act(None, x, f"{self.op.out}_tmp"))

    def step(self, op: str, x: Value, y: Value) -> Steps:
        if isinstance(y, Steps) and not isinstance(x, Steps):
            return Steps(y.first, y.steps + ((op, self.operand(x), False),))
        if isinstance(x, Steps):
            return Steps(x.first, x.steps + ((op, self.operand(y), True),))
        if isinstance(y, Lin) and self.scalar(x) and not self.scalar(y):
            return Steps(self.start(y), ((op, self.operand(x), False),))
        return Steps(self.start(x), ((op, self.operand(y), True),))

    def start(self, x: Value) -> "View | Lin":
        """The first operand of VectorE steps: a tile as it is, or an affine map of one, which the steps' output
        tile receives from its activation before the steps run in place (no tile of its own)."""
        if isinstance(x, Lin) and x.base is not None and not self.scalar(x):
            return x if x.scale != 1.0 or x.bias != 0.0 else x.base
        return self.view(x, f"{self.op.out}_tmp")

    def operand(self, x: Value) -> "View | float":
        """The other operand of a VectorE step: a constant, a column or a tile."""
        if isinstance(x, Lin) and self.scalar(x):
            v = self.val(x)
            return v if isinstance(v, float) else self.col_view(v)
        return self.view(x, f"{self.op.out}_tmp")

    # ---- computing values ----------------------------------------------------------------------------------------

    def view(self, x: Value, name: str) -> View:
        """x computed into a buffer (nothing to do for a tile or column as it is)."""
        if isinstance(x, Steps):
            return self.steps_view(x, None, name)
        if x.base is None:
            raise _Unsupported  # a constant tile
        if x.scale == 1.0 and x.bias == 0.0:
            return x.base
        return self.act("copy" if x.base.shape()[1] > 1 else None, x, name)

    def act(self, func: str | None, x: Lin, name: str) -> View:
        """func(base * scale + bias) into a new buffer shaped like the base; a column with func None: the map
        alone, on the engine that made its inputs."""
        key = (func, x)
        if key in self.memo:
            return self.memo[key]
        if x.base is None:
            raise _Unsupported
        col = x.base.shape()[1] == 1
        dst = self.temp(name, col)
        if func is None and col and self.engine(x.base, x.scale, x.bias) == "vector":
            self.col_on_vector(dst, x)
        else:
            self.act_into(dst, func or "copy", x.base, x.scale, x.bias, None)
        self.memo[key] = dst
        return dst

    def act_into(self, dst: "View | str", func: str, base: View, scale: Val, bias: Val, total: Buf | None) -> View:
        """ScalarE: dst = func(base * scale + bias), with the row sums into `total`."""
        s = scale if isinstance(scale, float) else self.col_view(scale)
        b = None if bias == 0.0 else self.const_col(bias) if isinstance(bias, float) else self.col_view(bias)
        if isinstance(dst, str):
            dst = self.temp(dst, base.shape()[1] == 1)
        if total is not None:
            self.body.append(Alloc(total, line=self.cur_line))
        self.emit(Act(dst, base, func, b, s, self.cur_line, whole(total) if total is not None else None),
                  engine="scalar")
        return dst

    def col_on_vector(self, dst: View, x: Lin) -> None:
        """A column's map as VectorE tensor_scalar steps (its inputs come from VectorE: no wait on ScalarE)."""
        cur = x.base
        assert cur is not None
        if x.scale != 1.0:
            s = x.scale if isinstance(x.scale, float) else self.col_view(x.scale)
            self.emit(Scalar(dst, cur, "multiply", s, self.cur_line), engine="vector")
            cur = dst
        if x.bias != 0.0:
            b = x.bias if isinstance(x.bias, float) else self.col_view(x.bias)
            self.emit(Scalar(dst, cur, "add", b, self.cur_line), engine="vector")

    def steps_view(self, x: Steps, dst: View | None, name: str = "") -> View:
        """The VectorE steps into dst (a new tile if None). Over a full tile, when there are two or more steps or the
        first one reads a broadcast row, column chunk by column chunk (TILE_F, one PSUM bank): the row's chunk is
        broadcast into PSUM by TensorE (idle in a row chain) and every intermediate stays in PSUM, so each step
        reads one PSUM operand: tensor_tensor at N cycles instead of 2N (nki-spec 1.10.4)."""
        key = x
        if dst is None and key in self.memo:
            return self.memo[key]
        first = x.first.base if isinstance(x.first, Lin) else x.first
        assert first is not None
        shape = first.shape()
        out = dst if dst is not None else self.temp(name, shape[1] == 1)
        chunk = self.chunk() if shape[1] == self.F else 0
        row = x.steps[0][1]
        from_row = isinstance(row, View) and row.buf.name in self.row_of
        # (base * column) * row: TensorE broadcasts column x row (an outer product) instead of the row alone, and
        # the scaling by the column is no ScalarE pass of its own (rmsnorm's X * r * g, layernorm's d * r * g)
        stationary = self.scale_row(x, row) if chunk and from_row and self.whole_tile(first) \
            and self.whole_tile(out) else None
        if isinstance(x.first, Lin) and stationary is None:
            first = self.act_into(out, "copy", first, x.first.scale, x.first.bias, None)
        if (len(x.steps) >= 2 or from_row) and chunk and all(self.whole_tile(v) for v in [first, out]):
            self.chunked = True
            body: list[Stmt] = []
            cols = sl(a(term("ct", chunk, "TILE_F")), chunk)
            at = lambda v: v if isinstance(v, float) or v.buf.shape[1] == 1 else View(v.buf, (full(self.TP), cols))
            cur = at(first)
            for i, (op, other, left) in enumerate(x.steps):
                if i == len(x.steps) - 1:
                    d = at(out)
                else:
                    buf = Buf(self.name(f"{self.op.out}_psum"), "psum", "f32", (self.TP, chunk))
                    body.append(Alloc(buf, line=self.cur_line))
                    d = whole(buf)
                operand = at(other)
                if i == 0 and from_row and isinstance(row, View):
                    src, ones, tensor = self.row_of[row.buf.name]
                    what = f"{tensor}_psum" if stationary is None else f"{tensor}_scaled_psum"
                    bcast = Buf(self.name(what, numbered=False), "psum", "f32", (self.TP, chunk))
                    body += broadcast_row(bcast, stationary or ones, View(src, (full(1), cols)), self.cur_line)
                    operand = whole(bcast)
                body.append(self.step_stmt(d, cur, op, operand, left))
                cur = d
            self.body += loop("ct", self.F // chunk, body, note="for the columns (chunks of TILE_F, one PSUM bank)",
                              line=self.cur_line)
        else:
            cur = first
            for i, (op, other, left) in enumerate(x.steps):
                d = out if i == len(x.steps) - 1 or first == out else self.temp(f"{self.op.out}_tmp", shape[1] == 1)
                self.body.append(self.step_stmt(d, cur, op, other, left))
                cur = d
        self.engine_of[out.buf.name] = "vector"
        if dst is None:
            self.memo[key] = out
        return out

    def scale_row(self, x: Steps, row: "View | float") -> Buf | None:
        """For steps `(base * c) * row ...` (c a column, the row broadcast by TensorE): c as a (1, TILE_P) row in the
        row's dtype, the stationary of the broadcast, whose PSUM result is then c[p] * row[f] (one product, exact
        for 16-bit operands). None when the steps do not start so, or c is not exactly a value of a 16-bit row's
        dtype (its row would round it)."""
        first = x.first
        if self.F < TURN_MIN_F or not self.turn or not self.scalar_bound():
            return None
        if not isinstance(first, Lin) or not isinstance(first.scale, Col) or first.bias != 0.0 \
                or x.steps[0][0] != "multiply" or not isinstance(row, View):
            return None
        col = self.known(first.scale)
        dt = self.row_of[row.buf.name][0].dtype
        if dt != "f32" and (col.coef != 1.0 or self.exact_in.get(col.view.buf.name, col.view.buf.dtype) != dt):
            return None
        view = self.col_view(col)
        key = ("row", view, dt)
        if key not in self.memo:
            line = self.cur_line
            # a rounded column is turned from its f16/bf16 copy (a transpose keeps its dtype); a row of that dtype
            # receives it exactly
            view = self.narrow_of.get(view.buf.name, view) if col.coef == 1.0 else view
            turned = Buf(self.name(f"{_stem(view)}_turned", numbered=False), "psum", view.buf.dtype, (1, self.TP))
            out = Buf(self.name(f"{_stem(view)}_row", numbered=False), "sbuf", dt, (1, self.TP))
            # the column turned into a row on TensorE (a transpose through PSUM), copied to SBUF (a matmul reads its
            # stationary from SBUF) by VectorE, whose next instructions are the steps that wait for this row anyway
            # (ScalarE's queue may hold the next row tile's passes by then; GpSimdE cannot read PSUM)
            self.body += [Alloc(turned, line=line), ir.Transpose(whole(turned), view, "pe", line),
                          Alloc(out, line=line), ir.Copy(whole(out), whole(turned), line)]
            self.memo[key] = whole(out)
        return self.memo[key].buf

    def scalar_bound(self) -> bool:
        """Whether ScalarE's whole-row passes so far, plus the scaling pass a turned column would save, take longer
        than the row tile's DMA (its full-row loads and stores at the target's DMA bandwidth): the pass is then
        worth saving. An f32 rmsnorm (2 passes; ScalarE fits 3.3 in an f32 tile's DMA time on trn2) is not
        (rows of 8192: 1.08x the floor with its pass, 1.14x turned); layernorm (4) and every 16-bit chain (1.7
        fit) are."""
        t = get_target()
        full = [n for n in self.inputs() if self.kind(n) == "full"]
        full += [n for n in self.keep & self.made if self.kind(n) == "full"]
        dma_ns = self.TP * sum(DTYPE_BYTES[self.hbm[n].dtype] for n in full) / (t.dma_engines * t.dma_engine_bw)
        passes = sum(1 for s in self.body if isinstance(s, Act) and s.dst.shape()[1:] != (1,)) + 1
        return passes / t.scalar_ghz > dma_ns

    def step_stmt(self, dst: View, cur: View, op: str, other: "View | float", left: bool) -> Stmt:
        if isinstance(other, float) or other.buf.shape[1] == 1:
            return Scalar(dst, cur, op, other, self.cur_line, reverse=not left and op in ("subtract", "divide"))
        return Binary(dst, cur, other, op, self.cur_line) if left else Binary(dst, other, cur, op, self.cur_line)

    def chunk(self) -> int:
        c = best_divisor(self.F, PSUM_F32)
        return c if c == self.F or c >= 128 else 0

    def whole_tile(self, v: View) -> bool:
        return v == whole(v.buf) and v.buf.shape == (self.TP, self.F)

    # ---- per-partition values (columns) ------------------------------------------------------------------------

    def vmul(self, x: Val, y: Val, name: str = "") -> Val:
        if isinstance(x, float) and isinstance(y, float):
            return x * y
        if isinstance(x, float):
            x, y = y, x
        assert isinstance(x, Col)
        if isinstance(y, float):
            return 0.0 if y == 0.0 else Col(x.view, x.coef * y)
        x, y = self.known(x), self.known(y)
        dst = self.temp(name or f"{self.op.out}_tmp", True)
        if self.engine(x.view, y.view) == "vector":
            self.emit(Binary(dst, x.view, y.view, "multiply", self.cur_line), engine="vector")
        else:
            self.emit(Act(dst, x.view, "copy", None, y.view, self.cur_line), engine="scalar")
        return Col(dst, x.coef * y.coef)

    def vadd(self, x: Val, y: Val) -> Val:
        if isinstance(x, float) and isinstance(y, float):
            return x + y
        if isinstance(x, float):
            x, y = y, x
        assert isinstance(x, Col)
        if y == 0.0:
            return x
        return Col(self.act(None, Lin(x.view, x.coef, y), f"{self.op.out}_tmp"))

    def vrecip(self, x: Val) -> Val:
        if isinstance(x, float):
            return 1.0 / x
        x = self.known(x)
        key = ("reciprocal", x.view)
        if key not in self.memo:
            dst = self.temp(f"{_stem(x.view)}_inv", True)
            self.emit(Act(dst, x.view, "reciprocal", None, 1.0, self.cur_line), engine="scalar")
            self.memo[key] = dst
        return Col(self.memo[key], 1.0 / x.coef)

    def known(self, x: Col) -> Col:
        """The column with its factor already applied, if some instruction computed that."""
        done = self.memo.get(("col", x.view, x.coef))
        return Col(done) if done is not None else x

    def col_view(self, x: Col) -> View:
        """The column with its factor applied: a view an instruction can read."""
        x = self.known(x)
        if x.coef == 1.0:
            return x.view
        dst = self.temp(f"{_stem(x.view)}_neg" if x.coef == -1.0 else f"{self.op.out}_tmp", True)
        if self.engine(x.view) == "vector":
            self.emit(Scalar(dst, x.view, "multiply", x.coef, self.cur_line), engine="vector")
        else:
            self.emit(Act(dst, x.view, "copy", None, x.coef, self.cur_line), engine="scalar")
        self.memo[("col", x.view, x.coef)] = dst
        return dst

    def const_col(self, c: float) -> View:
        """A (TILE_P, 1) column of the constant c (an activation bias), made once before the loop."""
        if c not in self.const_cols:
            buf = Buf(self.fresh_for(self.op)(f"{self.op.out}_const"), "sbuf", "f32", (self.TP, 1))
            self.consts += [Alloc(buf, zero=True, line=self.cur_line),
                            Scalar(whole(buf), whole(buf), "add", c, self.cur_line)]
            self.const_cols[c] = whole(buf)
            self.engine_of[buf.name] = "const"
        return self.const_cols[c]

    def engine(self, *xs: object) -> str:
        """VectorE when every column read was made there (the column op then follows its producer in the same
        in-order queue), else ScalarE: a column op between two ScalarE steps never waits behind VectorE's work on
        the previous row tile."""
        made = {self.engine_of.get(x.view.buf.name if isinstance(x, Col) else x.buf.name, "")
                for x in xs if isinstance(x, (Col, View))}
        made -= {"const", ""}
        return "vector" if made == {"vector"} else "scalar"

    # ---- statements --------------------------------------------------------------------------------------------

    def name(self, base: str, numbered: bool = True) -> str:
        """`Y_tmp1`, `Y_tmp2`, ... (numbered), or `Y_bias` the first time and `Y_bias2` after."""
        n = self.counts[base] = self.counts.get(base, 0) + 1
        if not numbered and n == 1:
            return self.fresh_for(self.op)(base)
        return self.fresh_for(self.op)(f"{base}{n}")

    def temp(self, name: str, col: bool) -> View:
        """A new fp32 tile (or column) of the chain; `name` ending in _tmp is numbered (Y_tmp1, Y_tmp2, ...)."""
        numbered = name.endswith("_tmp") or name.endswith("_psum")
        buf = Buf(self.name(name, numbered), "sbuf", "f32", (self.TP, 1 if col else self.F))
        self.body.append(Alloc(buf, line=self.cur_line))
        return whole(buf)

    def emit(self, *stmts: "Alloc | Act | Binary | Scalar | Reduce", engine: str) -> None:
        for s in stmts:
            self.body.append(s)
            if not isinstance(s, Alloc):
                self.engine_of[s.dst.buf.name] = engine

    def sum_on_act(self, src: View, col: Buf) -> bool:
        """Attach the row sum to the activation that wrote `src`, if one did (in place, with the column's
        allocation just before it)."""
        stmts = self.body
        for i in range(len(stmts) - 1, -1, -1):
            s = stmts[i]
            if isinstance(s, ir.Copy) and s.dst == src and s.src == whole(s.src.buf) and s.src.buf.dtype == "f32" \
                    and src.buf.dtype != "f32":
                # the rounding of an activation's result to f16/bf16 (softmax's e): the activation sums its fp32
                # values, one ScalarE pass fewer; the sum differs from the rounded values' by at most one unit of
                # the narrow dtype per term, relatively (2^-9 for bf16), and s is rounded to that dtype itself
                src = s.src
                continue
            if isinstance(s, Act) and s.dst == src and s.total is None:
                stmts[i] = dataclasses.replace(s, total=whole(col))
                stmts.insert(i, Alloc(col, line=self.cur_line))
                return True
            if any(src.buf == v.buf for x in ir.walk((s,)) for v in ir.views(x)):  # touched since: leave it
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


def _narrow_writes(body: list[Stmt]) -> list[Stmt]:
    """An fp32 tile written by one instruction and read only by its conversion to f16/bf16 (the rounding of a narrow
    tensor, the cast before a store): the instruction writes the narrow tile itself (its output conversion rounds
    once, as the copy did) and the fp32 tile and the copy are gone."""
    out = list(body)
    # (a software-pipelined chain rounds its columns with ScalarE copies: activations without scale, bias or sums)
    for copy in [s for s in body if isinstance(s, ir.Copy) or isinstance(s, Act) and s.func == "copy"
                 and s.bias is None and s.total is None and isinstance(s.scale, float) and s.scale == 1.0]:
        narrow, tile = copy.dst.buf, copy.src.buf
        if copy.dst != whole(narrow) or copy.src != whole(tile) or tile.memory != "sbuf" or tile.dtype != "f32" \
                or narrow.dtype == "f32":
            continue
        touching = [s for s in out if any(v.buf == tile for x in ir.walk((s,)) for v in ir.views(x))]
        writers = [s for s in touching if s is not copy]
        if writers and isinstance(writers[-1], ir.Loop) and isinstance(copy, ir.Copy):
            out = _narrow_last_step(out, copy, writers[-1])
            continue
        if len(writers) != 1 or not isinstance(writers[0], (Act, Binary, Scalar)) or writers[0].dst != whole(tile):
            continue
        writer = writers[0]
        if sum(v.buf == tile for v in ir.views(writer)) != 1:  # an activation's row sums are of its fp32 values
            continue
        alloc_t = next(i for i, s in enumerate(out) if isinstance(s, Alloc) and s.buf == tile)
        alloc_n = next(s for s in out if isinstance(s, Alloc) and s.buf == narrow)
        out = [s for s in out if s is not copy and s is not alloc_n]
        out[alloc_t] = alloc_n
        out[out.index(writer)] = dataclasses.replace(writer, dst=whole(narrow))
    return out


def _narrow_read_as_data(body: list[Stmt]) -> list[Stmt]:
    """A rounded column copied back to fp32 (f16/bf16 -> fp32, exact) and read only as the data of activations
    (`rsqrt(v + eps)` reading the rounded variance): they read the narrow column itself (an activation's data may be
    f16/bf16; only its scale and bias columns must be fp32), and the copy is gone."""
    out = list(body)
    for copy in [s for s in body if isinstance(s, (ir.Copy, Act))]:
        back, narrow = copy.dst.buf, copy.src.buf
        if isinstance(copy, Act) and (copy.func != "copy" or copy.bias is not None or copy.total is not None
                                      or not isinstance(copy.scale, float) or copy.scale != 1.0):
            continue
        if back.dtype != "f32" or narrow.dtype not in _HALF or back.shape[1:] != (1,) or copy.dst != whole(back) \
                or copy.src != whole(narrow):
            continue
        readers = [s for s in out if s is not copy and any(v.buf == back for x in ir.walk((s,)) for v in ir.views(x))]
        if not readers or not all(isinstance(r, Act) and r.src == whole(back)
                                  and sum(v.buf == back for v in ir.views(r)) == 1 for r in readers):
            continue
        out = [_read_from(r, whole(narrow)) if any(r is x for x in readers) else r for r in out if r is not copy]
    return out


def _read_from(s: Stmt, src: View) -> Stmt:
    assert isinstance(s, Act)
    return dataclasses.replace(s, src=src)


def _unused_dropped(body: list[Stmt]) -> list[Stmt]:
    """The body without the instructions whose on-chip result nothing reads (a rounded column whose readers read
    its f16/bf16 copy instead) and the allocations of tiles no instruction touches (a steps' output tile whose last
    step writes the narrow tile the store reads instead)."""
    while True:
        read = {v.buf.name for s in ir.walk(tuple(body)) for v in _views_read(s)}
        dead = [s for s in body if isinstance(s, (Act, ir.Copy, Scalar, Binary)) and s.dst.buf.memory != "hbm"
                and s.dst.buf.name not in read and not (isinstance(s, Act) and s.total is not None)]
        if not dead:
            break
        body = [s for s in body if not any(s is d for d in dead)]
    return mean_var.unused_allocs_dropped(body)


def _views_read(s: Stmt) -> list[View]:
    """The views an instruction reads (its destination counts when a view of the same buffer is also read)."""
    if isinstance(s, (ir.Loop, Block, Alloc, ir.Reshape)):
        return []
    if isinstance(s, ir.Matmul):
        return [s.stationary, s.moving]
    written = {id(getattr(s, f, None)) for f in ("dst", "total")}
    return [getattr(s, f.name) for f in dataclasses.fields(s)
            if isinstance(getattr(s, f.name), View) and id(getattr(s, f.name)) not in written]


def _offload(body: list[Stmt], halves: bool = True) -> list[Stmt]:
    """Work of a software-pipelined 16-bit chain moved off ScalarE (halves=False for chunk_pipe's chains: the
    centring always moves, the stores are per chunk already):
    * a 16-bit tile's copy plus a per-partition bias into a 16-bit tile (bf16 layernorm's d = X - mu) is one
      VectorE tensor_scalar (16-bit performance mode: 4 elements a cycle, nki-spec 2.3), unless the scaling by a
      column rides on a row's broadcast (a column turned into a row: ScalarE then has room for it and VectorE none:
      on the model bf16 layernorm over rows of 4096 is 1.48x the floor with the centring on ScalarE, 1.69x on
      VectorE);
    * in a loop of VectorE steps over column chunks, a last step adding a broadcast row held in SBUF (b) runs on
      GpSimdE (idle), the step before it writing SBUF instead of PSUM (GpSimdE cannot read PSUM);
    * the row tile is stored in two halves, each after the steps over its columns (_halved_stores: on the model
      bf16 layernorm over rows of 8192 1.51x -> 1.50x, the last tile's store no longer all after its last step)."""
    out: list[Stmt] = []
    turned = halves and any(isinstance(s, ir.Transpose) for s in body)  # the scaling by r rides on g's broadcast
    for s in body:
        if not turned and isinstance(s, Act) and s.func == "copy" and s.total is None and s.scale == 1.0 \
                and s.bias is not None and s.dst.buf.dtype in _HALF and s.src.buf.dtype in _HALF \
                and s.dst.shape()[1:] != (1,):
            s = Scalar(s.dst, s.src, "add", s.bias, s.line)
        elif isinstance(s, ir.Loop) and s.var == "ct":
            out += _last_step_on_gpsimd(s)
            continue
        out.append(s)
    return _halved_stores(out) if halves else out


def _halved_stores(body: list[Stmt]) -> list[Stmt]:
    """A loop of steps over column chunks followed by the store of the tile it writes: two loops over the two
    halves of the columns, each followed by the store of its half (the first half leaves while the second is
    computed)."""
    out: list[Stmt] = []
    i = 0
    while i < len(body):
        s = body[i]
        nxt = body[i + 1] if i + 1 < len(body) else None
        if isinstance(s, ir.Loop) and s.var == "ct" and s.extent % 2 == 0 and isinstance(nxt, Dma) \
                and nxt.src == whole(nxt.src.buf) and any(_writes_buf(x, nxt.src.buf) for x in ir.walk(s.body)):
            half, width = s.extent // 2, nxt.src.buf.shape[1] // 2
            first = dataclasses.replace(s, extent=half)
            second = dataclasses.replace(s, extent=half, body=tuple(_shifted(x, "ct", half) for x in s.body))
            for k, loop_ in enumerate((first, second)):
                cols = Sl(ir.Aff((), k * width), width)
                dst = View(nxt.dst.buf, nxt.dst.idx[:-1] + (cols,))
                out += [loop_, Dma(dst, View(nxt.src.buf, (nxt.src.idx[0], cols)), nxt.line)]
            i += 2
            continue
        out.append(s)
        i += 1
    return out


def _writes_buf(s: Stmt, buf: Buf) -> bool:
    dst = getattr(s, "acc", None) if isinstance(s, ir.Matmul) else getattr(s, "dst", None)
    return isinstance(dst, View) and dst.buf == buf


def _shifted(s: Stmt, var: str, by: int) -> Stmt:
    """`s` with loop variable `var` replaced by `var + by`."""
    if isinstance(s, (ir.Loop, Block)):
        return dataclasses.replace(s, body=tuple(_shifted(x, var, by) for x in s.body))

    def aff(x: ir.Aff) -> ir.Aff:
        return ir.Aff(x.terms, x.const + by * sum(t.coef for t in x.terms if t.var == var))

    changes: dict[str, object] = {}
    for f in dataclasses.fields(s):
        v = getattr(s, f.name)
        if isinstance(v, View):
            changes[f.name] = View(v.buf, tuple(dataclasses.replace(i, start=aff(i.start)) if isinstance(i, Sl)
                                                else aff(i) for i in v.idx))
    return dataclasses.replace(s, **changes)  # type: ignore[arg-type]


def _last_step_on_gpsimd(chunks: ir.Loop) -> list[Stmt]:
    """The chunk loop with its last step on GpSimdE; the step before it writes a whole-row SBUF tile (allocated
    before the loop, so VectorE runs ahead of GpSimdE instead of waiting for a chunk buffer to come free)."""
    body = list(chunks.body)
    last = body[-1] if body else None
    if not isinstance(last, Binary) or last.engine or any(v.buf.memory == "psum" for v in (last.dst, last.b)):
        return [chunks]
    prev = last.a.buf
    if prev.memory != "psum" or not any(isinstance(s, Alloc) and s.buf == prev for s in body) \
            or last.a != whole(prev):
        return [chunks]
    name = prev.name.replace("_psum", "_prod")  # no longer in PSUM: named for what it holds (the products)
    if any(v.buf.name == name for x in ir.walk((chunks,)) for v in ir.views(x)):
        name = prev.name
    moved = Buf(name, "sbuf", prev.dtype, last.dst.buf.shape)

    def swap(v: View) -> View:
        return View(moved, last.dst.idx) if v.buf == prev else v
    new: list[Stmt] = []
    for s in body:
        if isinstance(s, Alloc) and s.buf == prev:
            continue
        if isinstance(s, (Binary, Scalar)) and prev in (v.buf for v in ir.views(s)):
            fields = {f.name: swap(getattr(s, f.name)) for f in dataclasses.fields(s)
                      if isinstance(getattr(s, f.name), View)}
            s = dataclasses.replace(s, **fields)  # type: ignore[arg-type]
        new.append(s)
    new[-1] = dataclasses.replace(last, a=swap(last.a), engine="gpsimd")
    return [Alloc(moved, line=chunks.line), dataclasses.replace(chunks, body=tuple(new))]


def _narrow_last_step(out: list[Stmt], copy: ir.Copy, chunks: ir.Loop) -> list[Stmt]:
    """The conversion of a tile whose last writer is a loop of VectorE steps over its column chunks, each chunk read
    and written at one slice: the chunk's last step writes the narrow tile at that slice (one rounding, no copy)."""
    tile, narrow = copy.src.buf, copy.dst.buf
    body = list(chunks.body)
    at = [i for i, s in enumerate(body) if any(v.buf == tile for v in ir.views(s))]
    if not at or any(isinstance(s, (ir.Loop, Block)) for s in body):
        return out
    last = body[at[-1]]
    if not isinstance(last, (Binary, Scalar)) or last.dst.buf != tile:
        return out
    if any(v != last.dst for i in at for v in ir.views(body[i]) if v.buf == tile):
        return out  # a chunk reads another chunk's columns
    body[at[-1]] = dataclasses.replace(last, dst=View(narrow, last.dst.idx))
    alloc_n = next(s for s in out if isinstance(s, Alloc) and s.buf == narrow)
    out = [s for s in out if s is not copy and s is not alloc_n]
    i = out.index(chunks)
    return out[:i] + [alloc_n, dataclasses.replace(chunks, body=tuple(body))] + out[i + 1:]


def _read_signs(e: sx.Expr, name: str, neg: bool = False) -> list[bool]:
    """Per read of `name` in e: whether it is the right operand of a subtraction."""
    if isinstance(e, sx.Access):
        return [neg] if e.tensor == name else []
    if isinstance(e, sx.BinOp):
        return _read_signs(e.lhs, name) + _read_signs(e.rhs, name, e.op == "-")
    if isinstance(e, sx.Neg):
        return _read_signs(e.x, name)
    if isinstance(e, sx.Call):
        return [r for arg in e.args for r in _read_signs(arg, name)]
    return []


def _stem(v: View) -> str:
    """`m` for the column `m_col` (or tile `m_tile`): the base of the names of values derived from it."""
    return v.buf.name.removesuffix("_col").removesuffix("_tile")


def _reads(op: Op) -> list[str]:
    names = list(getattr(op, "inputs", ()) or ())
    if isinstance(op, ReduceOp):
        names = list(op.inputs or (op.src,)) + ([op.init] if isinstance(op.init, str) else [])
    if isinstance(op, EltwiseOp):
        names += list(op.columns)
    return names


def build_row_chain(ops: list[Op], hbm: dict[str, Buf], fresh_for, keep: set[str], skewed: bool = False,
                    turn: bool = True) -> Built:
    """fresh_for(op): the name allocator of each op of the chain. Short rows (a reduction and element-wise ops of
    its columns) are grouped several per partition instead (build_reduce.short_rows)."""
    grouped = short_rows(ops)
    if grouped is not None:
        return build_short_rows(ops, hbm, fresh_for, keep, grouped)
    chain = _Chain(ops, hbm, fresh_for, keep, skewed, turn)
    consts, stmts = chain.build()
    return consts, getattr(chain, "views", []) + stmts


def fit_chain(ops: list[Op], hbm: dict[str, Buf], fresh_for, keep: set[str], budget: int) -> Built:
    """The row chain as it fits `budget` best (the caller checks it fits): whole and software-pipelined when that
    fits (pipelined), else chunked or shared (fit_long_rows). A chunked chain that broadcasts a row again chunk by
    chunk in fp32 (layernorm's b over rows of 32768 fp32) keeps the scaling by r on ScalarE: its TensorE is busy
    with fp32 broadcasts, and the transpose that turns r into a row only adds to each row tile's path (on the model
    2.14x the floor turned, 2.13x not).

    The tiles allocated inside the row-tile loop rotate through two buffers (this tile's and the next's) only where
    both fit (the model's "fit" rule, tilec/perf/params.py). A chain that is not software-pipelined (whose pipeline
    does not hold the two buffers itself) and whose loop tiles of at least ROTATING_MIN bytes do not fit twice in
    `budget` (chunk_cols.rotation_need) is chunked with X allocated once before the loop instead (chunk_cols
    `rotating`): the next row tile's chunks stream into X as this tile's last phase releases them (on the model
    under "fit": softmax over rows of 32768 fp32 1.82x -> 1.44x, rmsnorm over rows of 8192 / 16384 / 32768 fp32
    1.66 / 1.54 / 1.90x -> 1.40 / 1.26 / 1.22x, layernorm 8192 / 16384 fp32 1.86 / 2.28x -> 1.62 / 1.61x)."""
    built = build_row_chain(ops, hbm, fresh_for, keep)
    chosen, skewed = _fit_chain(ops, hbm, fresh_for, keep, budget, built)
    if skewed:
        return chosen
    if rotation_need(chosen[1], least=ROTATING_MIN) > budget:
        free = next(op.dim("F") for op in ops if type(op) is ReduceOp)
        rotating = chunk_columns(built[0], built[1], free, budget, fresh_for(ops[-1]), rotating=True)
        chosen = chosen if rotating is None else rotating
    return stats_pipelined(ops, built, chosen, budget, fresh_for(ops[-1])) or chosen


def stats_pipelined(ops: list[Op], built: Built, chosen: Built, budget: int, fresh) -> Built | None:
    """A chunked chain (its columns in chunk loops) whose mean and variance are two ScalarE passes over X
    (layernorm): the two made by VectorE's bn_stats / bn_aggr in one pass (mean_var.py), so that X is read in two
    phases only (statistics; output), the output's `+ b` moved to GpSimdE (VectorE now has the statistics), and
    the chain software-pipelined by one row tile with the two phases' chunk loops fused (pair_tiles `fuse`):
    VectorE interleaves the next tile's bn_stats with this tile's products, chunk by chunk, while TensorE makes
    the products' r x g broadcasts. On the model under "fit", fp32 layernorm over rows of 8192 / 16384 / 32768
    1.37 / 1.61 / 2.14x -> 1.18 / 1.32 / 1.54x the floor. A chain that broadcasts a row again for every chunk
    (b at rows of 32768 fp32: TensorE's fp32 matmuls bound it) keeps it whole for as many first chunks as fit
    (chunk_pipe.partly_whole; 1.62x -> 1.54x). None when the chain is not of that form, has too few row tiles, or
    the pipelined chain does not fit `budget`."""
    from tilec.compiler.chunk_cols import chunked_at
    from tilec.compiler.pair_tiles import skew_row_tiles

    if not any(isinstance(s, ir.Loop) and s.var == "cc" for s in ir.walk(tuple(chosen[1]))):
        return None
    free = next(op.dim("F") for op in ops if type(op) is ReduceOp)
    fmax = get_target().instr("bn_stats").limit("f")

    def piped(chunked: Built) -> Built | None:
        one = mean_var.one_pass_stats(chunked[1], free, fresh, fmax)
        if one is None:
            return None
        body = chunk_pipe.merged_gpsimd_steps(mean_var.last_add_on_gpsimd(one))
        consts = chunked[0] + [("TILE_BN", min(fmax, dict(chunked[0])["TILE_C"]))]
        return skew_row_tiles((consts, _setup_evicted_on_scalar(body)), budget, fresh, fuse=True)

    if _rebroadcast(chosen[1]):
        size = dict(chosen[0])["TILE_C"]
        whole_b = chunked_at(built[0], built[1], free, size, fresh, hoist=True)
        for head in range(free // size - 1, 0, -1) if whole_b is not None else ():
            assert whole_b is not None
            partly = chunk_pipe.partly_whole(whole_b, head, fresh)
            out = piped(partly) if partly is not None else None
            if out is not None:
                return out
    return piped(chosen)


def _setup_evicted_on_scalar(stmts: list[Stmt]) -> list[Stmt]:
    """The copies out of PSUM of a row broadcast before the chain's loop (b_tile, chunk by chunk) by ScalarE: in
    the chain of `stats_pipelined` the first row tile's statistics are VectorE's (bn_stats), and ScalarE has no work
    before its first centring. On the model fp32 layernorm over rows of 32768 (b whole for 10 of 32 chunks):
    575.7 -> 559.3 us (1.54x -> 1.495x the floor); moving the copies of the chunks broadcast again inside the loop
    too is worse (569.0 us; those alone 585.4 us: ScalarE's centring waits for them)."""
    def moved(s: Stmt) -> Stmt:
        if isinstance(s, ir.Loop):
            return dataclasses.replace(s, body=tuple(moved(x) for x in s.body))
        if isinstance(s, ir.Copy) and not s.engine and s.src.buf.memory == "psum" and s.dst.buf.memory == "sbuf":
            return Act(s.dst, s.src, "copy", line=s.line)
        return s
    return [moved(s) if isinstance(s, ir.Loop) else s for s in stmts]


def _fit_chain(ops: list[Op], hbm: dict[str, Buf], fresh_for, keep: set[str], budget: int, built: Built
               ) -> tuple[Built, bool]:
    """The chain as fit_chain chose it before rotation was counted, and whether it is software-pipelined (its row
    tiles in two buffers by parity, made by the pipeline itself)."""
    if peak_usage(tuple(built[1]))[0] <= budget:
        return pipelined(ops, hbm, fresh_for, keep, built, budget)
    from tilec.compiler.chunk_pipe import pipelined_chunks

    piped = pipelined_chunks(ops, hbm, fresh_for, keep, budget)
    if piped is not None:
        return piped, True
    fitted = fit_long_rows(ops, built, budget, fresh_for)
    if _turned(fitted[1]) and _rebroadcast(fitted[1]):
        return fit_long_rows(ops, build_row_chain(ops, hbm, fresh_for, keep, turn=False), budget, fresh_for), False
    return fitted, False


def _phases(stmts: list[Stmt]) -> int:
    """The chunk loops (chunk_cols' phases) of a chunked chain's row-tile loop."""
    return sum(isinstance(s, ir.Loop) and s.var == "cc" for s in ir.walk(tuple(stmts)))


def _turned(stmts: list[Stmt]) -> bool:
    return any(isinstance(s, ir.Transpose) for s in ir.walk(tuple(stmts)))


def _rebroadcast(stmts: list[Stmt]) -> bool:
    """An fp32 row broadcast to every partition again inside the chunk loop (chunk_cols' `rebuild`): fp32 matmuls,
    four times the cost of 16-bit ones."""
    def again(loop: ir.Loop) -> bool:
        return any(isinstance(x, ir.Matmul) and x.stationary.buf.name.startswith("ones_f32")
                   for x in ir.walk(loop.body))
    return any(isinstance(s, ir.Loop) and s.var == "cc" and again(s) for s in ir.walk(tuple(stmts)))


def fit_long_rows(ops: list[Op], built: Built, budget: int, fresh_for) -> Built:
    """A chain whose whole-row tiles do not fit `budget`: its columns chunked (chunk_cols.py: the rows read in
    several phases stay in SBUF, the rest goes chunk by chunk), or its tiles of disjoint lives sharing space
    (share.py). Chunked unless the chunked kernel must keep a row broadcast to every partition whole (layernorm's b)
    and the shared one fits: it then has no more room than the shared one for the next row tile's load, and its
    phases cost (on the model: layernorm over rows of 8192 is 1.35x the floor shared, 1.60x chunked; softmax over
    rows of 16384 1.29x shared, 1.05x chunked; bf16 rmsnorm over rows of 16384 1.74x shared, 1.47x chunked). The
    caller checks the result fits."""
    free = next(op.dim("F") for op in ops if type(op) is ReduceOp)
    chunked = chunk_columns(built[0], built[1], free, budget, fresh_for(ops[-1]))
    if chunked is not None and not _whole_broadcast(chunked[1], free):
        return chunked
    shared: Built = (built[0], list(share_tiles(tuple(built[1]), budget)))
    if chunked is None or peak_usage(tuple(shared[1]))[0] <= budget:
        return shared
    return chunked


def _whole_broadcast(stmts: list[Stmt], free: int) -> bool:
    """A whole-row tile on every partition made before the chain's loop (a row broadcast, b_tile)."""
    return any(isinstance(s, Alloc) and s.buf.memory == "sbuf" and len(s.buf.shape) == 2 and s.buf.shape[0] > 1
               and s.buf.shape[1] == free for s in stmts)


def reads_of(op: Op) -> list[str]:
    """Every tensor an op reads (for deciding what a chain must store)."""
    names = _reads(op) + list(getattr(op, "rows", ()))
    for attr in ("src", "x", "w", "bias"):
        value = getattr(op, attr, None)
        if isinstance(value, str):
            names.append(value)
    return names


__all__ = ["row_chains", "build_row_chain", "fit_chain", "fit_long_rows", "reads_of", "ColumnReduceOp"]


def pipelined(ops: list[Op], hbm: dict[str, Buf], fresh_for, keep: set[str], built: Built, budget: int
              ) -> tuple[Built, bool]:
    """A chain that fits whole, built again for software pipelining (pair_tiles.skew_row_tiles: a row tile's
    VectorE steps after the next tile's ScalarE passes, and in a 16-bit chain work moved off ScalarE), when that
    applies and fits; else, for a chain of steps too big to fit twice, its columns chunked; else `built`. Every
    chain with a loop of steps is pipelined when it fits (rows10 pipelined only those with ScalarE passes to move:
    now the scaling by r rides on g's broadcast, rmsnorm bf16 over rows of 4096 is 1.04x pipelined, 1.71x not)."""
    from tilec.compiler.pair_tiles import skew_row_tiles

    if short_rows(ops) is not None:
        return built, False
    chain = _Chain(ops, hbm, fresh_for, keep, skewed=True)
    consts, stmts = chain.build()
    skewed = skew_row_tiles((consts, getattr(chain, "views", []) + stmts), budget, fresh_for(ops[-1]))
    if skewed is not None:
        return (skewed[0], chunk_pipe.last_banks_shared(skewed[1], fresh_for(ops[-1]), get_target())), True
    if 2 * peak_usage(tuple(built[1]))[0] <= budget or not _turned(built[1]):
        return built, False
    # a chain whose column rides on a row's broadcast (its row tile is then read until the tile's last step) that
    # fits once but not twice: its columns chunked as at long rows, so that the next row tile's load and this tile's
    # store go chunk by chunk beside the work (on the model: bf16 rmsnorm over rows of 16384 1.61x -> 1.22x; chains
    # without a turned column gain or lose a little: softmax over rows of 8192 f32 1.15x -> 1.06x, of 16384 bf16
    # 1.45x -> 1.46x, f32 rmsnorm over rows of 8192 1.08x -> 1.10x)
    free = next(op.dim("F") for op in ops if type(op) is ReduceOp)
    chunked = chunk_columns(built[0], built[1], free, budget, fresh_for(ops[-1]))
    if chunked is not None and not _whole_broadcast(chunked[1], free):
        return chunked, False
    return built, False
