"""Row chains (build_rowchain.py), part 2: the values of expressions, folded until a consumer needs them.

`_ChainValues.value` turns an expression into a folded value (`Lin`: a tile or column under a per-partition affine
map; `Steps`: VectorE steps against broadcast rows or columns); `view` computes one into a buffer when it must be:
an activation taking the map as its scale and bias (`act`), VectorE steps chunk by chunk through PSUM (`steps_view`,
with a column scaling a broadcast row riding on the broadcast: `scale_row`), column ops on the engine that made
their inputs (`vmul`, `vadd`, `vrecip`, `col_view`). The rules are build_rowchain's docstring's.
"""
from __future__ import annotations

import math

from tilec.compiler import ir
from tilec.compiler.build_util import a, broadcast_row, loop, sl, term
from tilec.compiler.exprs import const_value
from tilec.compiler.ir import Act, Alloc, Binary, Buf, Scalar, Stmt, View, full, whole
from tilec.lang import syntax as sx
from tilec.lang.functions import FUNCTIONS
from tilec.compiler.rowchain_base import Col, Lin, Steps, TURN_MIN_F, Val, Value, _ALU, _ChainBase, _Unsupported, _stem


class _ChainValues(_ChainBase):
    # ---- values of expressions --------------------------------------------------------------------------------------

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
        if isinstance(e, sx.Call) and e.fn == "f32":
            return self.value(e.args[0])  # exact, and the engines compute in fp32 whatever their operands' dtype
        if isinstance(e, sx.Call) and FUNCTIONS[e.fn].instr == "activation":
            x = self.lin(self.value(e.args[0]))
            return Lin(self.act(e.fn, x, f"{self.op.out}_tile" if e is self.top else f"{self.op.out}_tmp"))
        if isinstance(e, sx.Call) and FUNCTIONS[e.fn].instr == "tensor_tensor":
            return self.step(FUNCTIONS[e.fn].nki, self.value(e.args[0]), self.value(e.args[1]))
        if isinstance(e, sx.BinOp) and e.op in _ALU:
            lhs, rhs = self.value(e.lhs), self.value(e.rhs)
            scaled = self.centred_scaled(e.op, lhs, rhs) if e is self.top else None
            return scaled or self.combine(e.op, lhs, rhs)
        raise _Unsupported

    def centred_scaled(self, op: str, x: Value, y: Value) -> Steps | None:
        """An op's whole value `(X - m) * s` or `(X - m) / s` (X a tile, m and s columns or constants: a
        standardisation without gain, `(X[i, j] - mu[i]) / sd[i]`): one VectorE tensor_scalar of two operators,
        the sum then the product (as lin_mul's order, for its error), dividing as a product by the reciprocal
        column (one per row). Folded into ScalarE it is two passes (the centring, then the scaling), ScalarE's
        third and fourth beside the statistics' two. None for any other form."""
        if op not in "*/" or not isinstance(x, Lin) or not isinstance(y, Lin) or not self.scalar(y):
            return None
        if x.base is None or self.scalar(x) or x.scale != 1.0 or x.bias == 0.0:
            return None
        s = self.val(y) if op == "*" else self.vrecip(self.val(y))
        if isinstance(s, float):
            return None  # a constant factor folds into the activation as its scale
        return Steps(x.base, (("add", self.operand(Lin(None, 1.0, x.bias)), True),
                              ("multiply", self.col_view(s), True)))

    def combine(self, op: str, x: Value, y: Value) -> Value:
        x, y = self.settled(x, y), self.settled(y, x)
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
        if not self.scalar(x) and not (isinstance(x.bias, float) and x.bias == 0.0) and not _power_of_two(s):
            # (X*a + c) * s folded as X*(a*s) + c*s cancels after scaling: where X*a ~ -c (layernorm's X - mu on a
            # row of near-equal values) the fp32 error grows with s (rsqrt(var + eps), up to 1/sqrt(eps)); so the
            # sum is computed first and then scaled (fuzz seed 14003150: 13x the reference's error). A constant
            # power of two (a softmax's temperature 1/8) scales exactly: X*(a*s) + c*s rounds as (X*a + c) * s
            self.centred = True
            if self.vector_centring and isinstance(x.scale, float) and x.scale == 1.0 and not isinstance(s, float):
                return Lin(self.steps_view(Steps(x.base, (("add", self.operand(Lin(None, 1.0, x.bias)), True),
                                                          ("multiply", self.col_view(s), True))),
                                           None, f"{self.op.out}_scaled"))
            x = Lin(self.view(x, f"{self.op.out}_centred"))
        return Lin(x.base, self.vmul(x.scale, s, f"{self.op.out}_scale"), self.vmul(x.bias, s, f"{self.op.out}_bias"))

    def lin_scale(self, x: Lin, c: float) -> Lin:
        return self.lin_mul(x, Lin(None, 1.0, c))

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
        x, y = self.settled(x, y), self.settled(y, x)
        if isinstance(y, Steps) and not isinstance(x, Steps):
            return Steps(y.first, y.steps + ((op, self.operand(x), False),))
        if isinstance(x, Steps):
            return Steps(x.first, x.steps + ((op, self.operand(y), True),))
        if isinstance(y, Lin) and self.scalar(x) and not self.scalar(y):
            return Steps(self.start(y), ((op, self.operand(x), False),))
        return Steps(self.start(x), ((op, self.operand(y), True),))

    def settled(self, v: Value, other: Value) -> Value:
        """Steps over a column meeting a tile, computed into their column first: steps take their first operand's
        shape, so `X * max(ss, c)` appended to the column's steps would make a column of the tile's product."""
        if isinstance(v, Steps) and self.is_col(v) and not self.is_col(other):
            return Lin(self.steps_view(v, None, f"{self.op.out}_tmp"))
        return v

    def is_col(self, v: Value) -> bool:
        if isinstance(v, Lin):
            return self.scalar(v)
        first = v.first.base if isinstance(v.first, Lin) else v.first
        return first is not None and first.shape()[1] == 1

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

    # ---- computing values -------------------------------------------------------------------------------------------

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
        if len(x.steps) == 2 and not any(isinstance(o, View) and o.buf.shape[1] > 1 for _, o, _ in x.steps) \
                and all(left for _, _, left in x.steps):
            # two steps against columns or constants: one tensor_scalar of two operators
            (op0, v0, _), (op1, v1, _) = x.steps
            self.body.append(Scalar(out, first, op0, v0, self.cur_line, op1=op1, value1=v1))
        elif (len(x.steps) >= 2 or from_row) and chunk and all(self.whole_tile(v) for v in [first, out]):
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

    # ---- per-partition values (columns) -----------------------------------------------------------------------------

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


def _power_of_two(s: Val) -> bool:
    """A constant factor whose products are exact in fp32 (barring overflow and underflow): +-2^k."""
    return isinstance(s, float) and s != 0.0 and abs(math.frexp(s)[0]) == 0.5
