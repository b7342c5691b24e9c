"""Row chains (build_rowchain.py), part 1: the values a chain folds and the chain's state.

`Col`, `Lin` and `Steps` are the folded values (build_rowchain's docstring: an affine map of a tile rides on the
activation that reads it, VectorE steps against broadcast rows are built chunk by chunk). `_ChainBase` holds what
one chain knows while it is built (its ops, the HBM tensors, the values made so far, the statements of the row-tile
loop) and the small helpers every part uses: the row operands' broadcasts planned before the loop, constant columns,
names, temporaries, the engine a column op runs on. rowchain_values.py computes values on top of it,
rowchain_chain.py builds the ops.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Union

from tilec.compiler import ir
from tilec.compiler.build_conv import Fresh, hbm_view
from tilec.compiler.build_util import a, broadcast_row, loop, ones_row, sl, term
from tilec.compiler.ir import Act, Alloc, Binary, Buf, DTYPE_BYTES, Dma, Reduce, Scalar, Stmt, View, full, whole
from tilec.compiler.named import name
from tilec.compiler.ops import EltwiseOp, Op, ReduceOp
from tilec.compiler.schedule import PMAX, best_divisor
from tilec.lang import syntax as sx
from tilec.target import compiled, invariant

Built = tuple[list[tuple[str, int]], list[Stmt]]
_HALF = ("f16", "bf16")
_IDENTITY = {"add": 0.0, "maximum": float("-inf"), "minimum": float("inf")}


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


class _Unsupported(Exception):
    """An expression the chain's folding does not cover: the op is built by the element-wise expression compiler."""


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


class _ChainBase:
    """One chain's state while it is built, and the helpers every part of the builder uses (rowchain_values.py,
    rowchain_chain.py)."""
    op: Op  # the op being built (set by _Chain.compute, and by _Chain.build for each store)
    cur_line: int  # the .tl line the instructions emitted for it are tagged with

    def __init__(self, ops: list[Op], hbm: dict[str, Buf], fresh_for, keep: set[str], skewed: bool = False,
                 turn: bool = True, long: bool = False) -> None:
        self.ops, self.hbm, self.keep = ops, hbm, keep
        self.fresh_for = fresh_for  # op -> its name allocator: each op's temporaries keep their own names
        self.fresh: Fresh = fresh_for(ops[-1])
        self.R = next(op.dim("R") for op in ops if type(op) is ReduceOp)
        self.F = next(op.dim("F") for op in ops if type(op) is ReduceOp)
        self.TP = name(best_divisor(self.R, PMAX), "TILE_P")  # printed as TILE_P (named.py)
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
        # a centring then scaling (`(X - mu) * r`) as one VectorE tensor_scalar instead of two ScalarE passes
        # (rowchain_values.lin_mul); `centred` records that the chain had one, so that build_rowchain.pipelined
        # builds it both ways and keeps the one whose busiest engine is less busy
        self.vector_centring = False
        self.centred = False
        self.terms: dict[str, EltwiseOp] = {}  # the terms of a sum, built by the sum (_Chain.compute)
        self.top: sx.Expr | None = None  # the expression whose value is the op's own tile (named `{out}_tile`)

    def kind(self, name: str) -> str:
        """full ([R, F]), column ([R]) or row ([F]) by the tensor's size."""
        size = 1
        for d in self.hbm[name].shape:
            size *= d
        if size == self.R * self.F and self.F > 1:
            return "full"
        return "column" if size == self.R else "row"

    def inputs(self) -> list[str]:
        names: list[str] = []
        for op in self.ops:
            for n in _reads(op):
                if n not in self.made and n not in names and self.kind(n) != "row":
                    names.append(n)
        return names

    def rows_view(self, name: str, shape: tuple[int, int], what: str) -> tuple[Buf, list[Stmt]]:
        return hbm_view(self.hbm[name], shape, self.fresh(f"{name}_{what}"), self.line)

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

    # ---- columns and constants --------------------------------------------------------------------------------------

    def subtracted(self, name: str) -> bool:
        """Every read of `name` by the chain's element-wise ops is subtracted (`X[i, j] - mu[i]`)."""
        signs = [neg for op in self.ops if isinstance(op, EltwiseOp) for neg in _read_signs(op.expr, name)]
        return bool(signs) and all(signs) and not any(name in _reads(op) for op in self.ops
                                                          if isinstance(op, ReduceOp))

    def scalar(self, x: Lin) -> bool:
        """One value per partition: a constant or a column."""
        return x.base is None or x.base.shape()[1] == 1

    def lin_of(self, v: Val) -> Lin:
        return Lin(v.view, v.coef) if isinstance(v, Col) else Lin(None, 1.0, v)

    def known(self, x: Col) -> Col:
        """The column with its factor already applied, if some instruction computed that."""
        done = self.memo.get(("col", x.view, x.coef))
        return Col(done) if done is not None else x

    def const_col(self, c: float) -> View:
        """A (TILE_P, 1) column of the constant c (an activation bias), made once before the loop."""
        if c not in self.const_cols:
            buf = Buf(self.fresh_for(self.op)(f"{self.op.out}_const"), "sbuf", "f32", (self.TP, 1))
            self.consts += [Alloc(buf, zero=True, line=self.cur_line),
                            Scalar(whole(buf), whole(buf), "add", c, self.cur_line)]
            self.const_cols[c] = whole(buf)
            self.engine_of[buf.name] = "const"
        return self.const_cols[c]

    def scalar_bound(self) -> bool:
        """Whether ScalarE's whole-row passes so far, plus the scaling pass a turned column would save, take longer
        than the row tile's DMA (its full-row loads and stores at the target's DMA bandwidth): the pass is then
        worth saving. An f32 rmsnorm (2 passes; ScalarE fits 3.3 in an f32 tile's DMA time on trn2) is not
        (rows of 8192: 1.08x the floor with its pass, 1.14x turned); layernorm (4) and every 16-bit chain (1.7
        fit) are. That count is the trn2 model's: where VectorE and GpSimdE serialise their SBUF accesses
        (NC-v2, trn1) the turned column always is, as the trn1 model finds for every row chain of core.py that the
        count leaves unturned (us before -> after: layernorm f32 4096^2 743 -> 540, rows of 16384 835 -> 761;
        rmsnorm f32 rows of 16384 671 -> 570, bf16 rows of 32768 538 -> 305; none slower): the count misses what
        the turned form also saves, the broadcast row's VectorE evictions (serialised with GpSimdE's work there)
        and the pass's f32 temporary (rmsnorm bf16 rows of 32768: chunks of 1024 instead of 512)."""
        t = compiled()
        if not t.vector_gpsimd_split:
            return True
        full = [n for n in self.inputs() if self.kind(n) == "full"]
        full += [n for n in self.keep & self.made if self.kind(n) == "full"]
        dma_ns = self.TP * sum(DTYPE_BYTES[self.hbm[n].dtype] for n in full) / (t.dma_engines * t.dma_engine_bw)
        passes = sum(1 for s in self.body if isinstance(s, Act) and s.dst.shape()[1:] != (1,)) + 1
        return passes / t.scalar_ghz > dma_ns

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

    # ---- statements -------------------------------------------------------------------------------------------------

    def step_stmt(self, dst: View, cur: View, op: str, other: "View | float", left: bool) -> Stmt:
        if isinstance(other, float) or other.buf.shape[1] == 1:
            return Scalar(dst, cur, op, other, self.cur_line, reverse=not left and op in ("subtract", "divide"))
        return Binary(dst, cur, other, op, self.cur_line) if left else Binary(dst, other, cur, op, self.cur_line)

    def chunk(self) -> int:
        c = best_divisor(self.F, PSUM_F32)
        return c if c == self.F or c >= 128 else 0

    def whole_tile(self, v: View) -> bool:
        return v == whole(v.buf) and v.buf.shape == (self.TP, self.F)

    def engine(self, *xs: object) -> str:
        """VectorE when every column read was made there (the column op then follows its producer in the same
        in-order queue), else ScalarE: a column op between two ScalarE steps never waits behind VectorE's work on
        the previous row tile."""
        made = {self.engine_of.get(x.view.buf.name if isinstance(x, Col) else x.buf.name, "")
                for x in xs if isinstance(x, (Col, View))}
        made -= {"const", ""}
        return "vector" if made == {"vector"} else "scalar"

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
