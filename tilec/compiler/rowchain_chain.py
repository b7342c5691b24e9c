"""Row chains (build_rowchain.py), part 3: `_Chain`, the builder of one fused chain.

`build` plans the row operands' broadcasts, loads the chain's inputs per row tile, builds op by op (`reduce`: a sum
riding on an activation or a tensor_reduce; `eltwise`: folded, or computed where something outside the chain needs
it; `fallback`: what the folding does not cover, through the element-wise expression compiler), rounds f16/bf16
tensors where the program says so (`rounded`), stores what is needed after the chain, and wraps the body in the
row-tile loop after its rewrites (rowchain_rewrites.py).
"""
from __future__ import annotations

import dataclasses
import math

from tilec.compiler import chunk_pipe, ir
from tilec.compiler.expr_instrs import ExprCompiler
from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.exprs import const_value, fmt_expr
from tilec.compiler.ir import Act, Alloc, Buf, Dma, Reduce, Stmt, View, full, whole
from tilec.compiler.ops import EltwiseOp, Op, ReduceOp
from tilec.lang import syntax as sx
from tilec.compiler.rowchain_base import Built, Col, Lin, Steps, Val, _HALF, _IDENTITY, _Unsupported, _reads
from tilec.compiler.rowchain_rewrites import _narrow_read_as_data, _narrow_writes, _offload, _unused_dropped
from tilec.compiler.rowchain_values import _ChainValues
from tilec.target import compiled


class _Chain(_ChainValues):
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

    def load(self, name: str) -> tuple[list[Stmt], View]:
        free = self.F if self.kind(name) == "full" else 1
        view, st = self.rows_view(name, (self.R, free), "v")
        # a (P, 1) column is a tensor_scalar / activation operand, which is fp32 [ISA6 tensor_scalar]: the DMA converts
        dt = self.hbm[name].dtype if free > 1 else "f32"
        tile = Buf(self.fresh(f"{name}_tile"), "sbuf", dt, (self.TP, free))
        rows = sl(a(term("pt", self.TP, "TILE_P")), self.TP)
        self.views = getattr(self, "views", []) + st
        return [Alloc(tile, line=self.line), Dma(whole(tile), View(view, (rows, full(free))), self.line)], whole(tile)

    # ---- one op of the chain ----------------------------------------------------------------------------------------

    def compute(self, op: Op) -> None:
        """One op. The terms of a sum written as an op of their own (`v += (X[i, j] - mu[i]) ** 2 / N` in one
        statement lowers to an element-wise op of the terms, then a sum of them: the terms read a column, which a
        reduction's expression may not) are built by the sum, as if it had been written `v += d * d / N` over a
        folded d: one square activation summing its rows, no tile of terms. If the sum cannot take them, the terms
        are built as an op of their own first."""
        if self.summed_only(op):
            assert isinstance(op, EltwiseOp)
            self.terms[op.out] = op
            return
        terms = self.terms.pop(op.src, None) if type(op) is ReduceOp and op.expr is None else None
        if terms is not None:
            assert isinstance(op, ReduceOp)
            if self.attempt(dataclasses.replace(op, expr=terms.expr, inputs=tuple(_reads(terms))), False):
                return
            self.attempt(terms)
        self.attempt(op)

    def summed_only(self, op: Op) -> bool:
        """An f32 element-wise op of full tiles whose only reader is a plain sum of it (its terms), not kept."""
        return isinstance(op, EltwiseOp) and op.out not in self.keep and self.readers.get(op.out, 0) == 1 \
            and self.hbm[op.out].dtype == "f32" and self.kind(op.out) == "full" \
            and any(type(o) is ReduceOp and o.op == "add" and o.expr is None and o.src == op.out for o in self.ops)

    def attempt(self, op: Op, fallback: bool = True) -> bool:
        """Build one op folded; on what the folding does not cover, undo what the attempt emitted and (fallback)
        build the op through the expression compiler from tiles. Whether the folded build succeeded."""
        self.op, self.cur_line, self.top = op, getattr(op, "update_line", 0) or op.line, None
        mark, memo = len(self.body), dict(self.memo)
        try:
            if isinstance(op, ReduceOp):
                self.reduce(op)
            else:
                assert isinstance(op, EltwiseOp)
                self.eltwise(op)
            return True
        except _Unsupported:
            del self.body[mark:]
            self.memo = memo
            if fallback:
                self.fallback(op)
            return False

    def eltwise(self, op: EltwiseOp) -> None:
        """An element-wise op stays folded unless something outside the chain needs it (or, for VectorE steps,
        more than one op of the chain reads it)."""
        self.top = self.scales_grouped(op.expr)  # the expression whose value is the op's tile (`{out}_tile`)
        value = self.value(self.top)
        if self.kind(op.out) == "full" and isinstance(value, Lin) and value.base is not None \
                and value.base.shape()[1] == 1:
            raise _Unsupported  # a row's statistic broadcast along it (`y[m, s] = z[m]`): built by fallback as a tile
        folded = op.out not in self.keep and (isinstance(value, Lin) and value.base is not None
                                              or self.readers.get(op.out, 0) <= 1)
        self.values[op.out] = value if folded else Lin(self.view(value, f"{op.out}_tile"))

    def scales_grouped(self, e: sx.Expr) -> sx.Expr:
        """`(A * c1) * c2` with c1 and c2 columns of the chain read as `A * (c1 * c2)`: group norm's `(X - mu) * r *
        g[k]`, so that the whole value is centred_scaled's one VectorE tensor_scalar (add, multiply) instead of
        ScalarE's centring and scaling passes (ScalarE 70 % busy, VectorE idle: audit15 groupnorm 1.56x). The
        chain computed c1 * c2 as one column before too (lin_mul), so the rounding is the one it had."""
        def column(x: sx.Expr) -> bool:
            v = self.values.get(x.tensor) if isinstance(x, sx.Access) else None
            return isinstance(v, Lin) and self.scalar(v)
        if isinstance(e, sx.BinOp) and e.op == "*" and isinstance(e.lhs, sx.BinOp) and e.lhs.op == "*" and \
                column(e.lhs.rhs) and column(e.rhs):
            return sx.BinOp("*", e.lhs.lhs, sx.BinOp("*", e.lhs.rhs, e.rhs, e.span), e.span)
        return e

    def _halved(self, op: ReduceOp, src: View, col: Buf) -> tuple[View, bool]:
        """A 16-bit min into a 16-bit column (exact) reduces a tile GpSimdE folded in half first (min of the two
        halves, exact): VectorE streams a 16-bit min at N cycles, not N/2 as a max (nki-spec 2.4), so it reduced
        half the work of a tile's range (rowrange_bf16, cols17); GpSimdE was idle. With no start value ScalarE
        then negates the half (an activation copy, scale -1, into the same dtype: exact) and VectorE takes its max
        at N/2, the column holding -min (the second result True): rowrange_bf16's VectorE time per row tile 4.8 ->
        3.7 us, ScalarE was idle. Other reductions unchanged."""
        last = src.idx[-1]
        cols = src.shape()[-1]
        if op.op != "minimum" or col.dtype not in _HALF or len(src.shape()) != 2 or cols % 2 or cols < 512 or \
                not isinstance(last, ir.Sl) or last.step != 1:
            return src, False
        h = cols // 2
        part = lambda lo: View(src.buf, (*src.idx[:-1], ir.Sl(last.start.plus(lo), h)))  # noqa: E731
        fold = Buf(self.name(f"{op.out}_half", numbered=False), "sbuf", src.buf.dtype, (src.shape()[0], h))
        # (on VectorE where it would take all of the fold, Target.vector_part: NC-v2, whose VectorE and GpSimdE
        # run one after the other on SBUF)
        on = "gpsimd" if compiled().vector_part(1, 2) < 1 else ""
        self.emit(Alloc(fold, line=self.cur_line),
                  ir.Binary(whole(fold), part(0), part(h), "minimum", self.cur_line, engine=on), engine=on or "vector")
        if op.init != _IDENTITY[op.op] or col.dtype != "bf16":  # (the N/2 max is bf16 -> bf16 only)
            return whole(fold), False
        neg = Buf(self.name(f"{op.out}_negated", numbered=False), "sbuf", src.buf.dtype, (src.shape()[0], h))
        self.emit(Alloc(neg, line=self.cur_line), Act(whole(neg), whole(fold), "copy", None, -1.0, self.cur_line),
                  engine="scalar")
        return whole(neg), True

    def reduce(self, op: ReduceOp) -> None:
        """max/min: a VectorE tensor_reduce. A sum rides on ScalarE: the activation that computed the summed tile
        writes its row sums (reduce_res), or an activation over the tile's source does, the affine map it was
        folded with as scale and bias: sum((x - m) * (x - m)) is one square activation of x with bias -m. The
        constant factor (a mean's 1 / N) goes inside that activation when it adds no instruction, else it stays
        on the column for its readers to fold."""
        expr = op.expr if op.expr is not None else sx.Access(op.src, ())
        col = Buf(self.name(f"{op.out}_col", numbered=False), "sbuf", "f32", (self.TP, 1))
        if op.op != "add":
            v = self.value(expr)
            # the extremum of `x * s + b` (s > 0, b a constant or a column) is s * max(x) + b, and exactly: the
            # rounding is monotone (a temperature softmax's `max= X[i, j] / T` reduces X; its readers take the map)
            mapped = isinstance(v, Lin) and v.base is not None and isinstance(v.scale, float) and v.scale > 0.0 \
                and (v.scale, v.bias) != (1.0, 0.0) and op.init == _IDENTITY[op.op] and v.base.shape()[1] > 1
            src = v.base if mapped and isinstance(v, Lin) and v.base is not None else \
                self.view(v, f"{op.out}_terms")
            if src.buf.dtype in _HALF and self.hbm[op.out].dtype in (src.buf.dtype, "f32") and not mapped and \
                    op.init == _IDENTITY[op.op]:  # (an fp32 result: widening the 16-bit max is exact, cols17)
                # the max of f16/bf16 values is one of them: reduced into a column of their dtype it is exact (no
                # rounding copies), and VectorE streams a 16-bit reduce into a 16-bit result at N/2 (nki-spec 2.4)
                col = Buf(self.name(f"{op.out}_{src.buf.dtype}", numbered=False), "sbuf", src.buf.dtype, (self.TP, 1))
                self.exact.add(op.out)
            src, negated = self._halved(op, src, col)
            self.emit(Alloc(col, line=self.cur_line),
                      Reduce(whole(col), src, "maximum" if negated else op.op, self.cur_line), engine="vector")
            result: Lin = Lin(whole(col))
            if negated:  # -min, widened (exactly) to fp32: a tensor_scalar operand must be fp32 (nki-spec 1.10.5);
                # on ScalarE, which has only the negation to do (VectorE and GpSimdE are the row tile's bound)
                wide = Buf(self.name(f"{op.out}_negmin", numbered=False), "sbuf", "f32", (self.TP, 1))
                self.emit(Alloc(wide, line=self.cur_line), Act(whole(wide), whole(col), "copy", None, 1.0,
                                                               self.cur_line), engine="scalar")
                result = Lin(whole(wide), -1.0)
            if mapped and isinstance(v, Lin):
                result = Lin(result.base, self.vmul(result.scale, v.scale), v.bias)
            if op.init != _IDENTITY[op.op]:
                init = self.values[op.init] if isinstance(op.init, str) else Lin(None, 1.0, op.init)
                other = self.operand(init)
                result = Lin(self.steps_view(Steps(whole(col), ((op.op, other, True),)), whole(col)))
            self.values[op.out] = result
            return
        squared = _squared(expr)
        square = squared is not None
        values = self.values
        if self.long:  # the sum of a rounded tile's values (squared) from its value before the rounding (long)
            self.values = {**values, **self.unrounded}
        try:
            x = self.lin(self.value(squared[0] if squared is not None else expr))
        finally:
            self.values = values
        if x.base is None or x.base.shape()[1] == 1:
            raise _Unsupported  # a sum along the rows of a constant or a column
        factor = op.scale * (squared[1] if squared is not None else 1.0)
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
        elif self.skewed and not self.long and x.scale == 1.0 and x.bias == 0.0 and x.base.buf.dtype == "f32" \
                and not any(self.kind(n) == "full" for n in self.keep & self.made):
            # a chain that only stores statistics (a mean and a variance), software-pipelined: VectorE has no other
            # work, so the plain sum is its tensor_reduce and ScalarE keeps the square (on the model 2048 x 2048:
            # ScalarE 63 us for both passes, the kernel ScalarE-bound)
            self.emit(Alloc(col, line=self.cur_line), Reduce(whole(col), x.base, "add", self.cur_line),
                      engine="vector")
            total = Col(whole(col), factor)
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

    # ---- stores -----------------------------------------------------------------------------------------------------

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


def _squared(e: sx.Expr) -> tuple[sx.Expr, float] | None:
    """(a, c) for a square with a constant factor, `a * a` (c = 1), `a * a / k` (c = 1 / k), `a * a * k`,
    `k * (a * a)`; else None. The factor rides on the sum's column (or inside its square), as a mean's 1 / N does."""
    if not isinstance(e, sx.BinOp):
        return None
    if e.op == "*" and fmt_expr(e.lhs) == fmt_expr(e.rhs):
        return e.lhs, 1.0
    if e.op == "/":
        k, inner = const_value(e.rhs), _squared(e.lhs)
        return None if not k or inner is None else (inner[0], inner[1] / k)
    if e.op == "*":
        for const, other in ((e.rhs, e.lhs), (e.lhs, e.rhs)):
            k, inner = const_value(const), _squared(other)
            if k is not None and inner is not None:
                return inner[0], inner[1] * k
    return None
