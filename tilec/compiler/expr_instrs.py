"""An element-wise expression tree over tiles -> engine instructions: activation (ScalarE), tensor_tensor and
tensor_scalar (VectorE), tensor_copy for conversions. Used by tensorize (an element-wise nest), the reductions'
expressions and the row chains."""
from __future__ import annotations

import dataclasses
import math

from tilec.compiler import affine_fold, ir
from tilec.compiler.engine_time import loads
from tilec.compiler.exprs import const_value, fmt_expr, strip_scale
from tilec.compiler.fused_funcs import fused
from tilec.compiler.ir import Act, Alloc, Binary, Buf, Scalar, Stmt, View, whole
from tilec.compiler.select_eltwise import column_only
from tilec.lang import syntax as sx
from tilec.lang.functions import FUNCTIONS
from tilec.target import Target
from typing import Callable

Fresh = Callable[[str], str]  # a derived name -> a name unique in the kernel (names.NameAllocator, per op)

_BIN = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide"}


class ExprCompiler:
    """Evaluate an element-wise expression tree into tensor_tensor / tensor_scalar / activation instructions."""

    def __init__(self, tiles: dict[str, View], shape: tuple[int, ...], line: int, fresh: Fresh,
                 columns: set[str], fold: bool = False, prefix: str = "tmp", regroup: bool = False,
                 share: "Target | None" = None, once: set[str] | None = None) -> None:
        self.tiles, self.shape, self.line, self.fresh, self.n = tiles, shape, line, fresh, 0
        # share: VectorE's work spread over GpSimdE and ScalarE (shared), by that target's engines and clocks
        self.share = share
        self.once = once or set()  # tiles made on chip once (broadcast rows): no DMA with each tile
        # fold: an activation of `x + col`, `x - col` or `x * c` is one ScalarE instruction FN(x * scale + bias)
        # (the row chains use it: it takes a VectorE pass off the busiest engine)
        self.fold, self.prefix = fold, prefix
        # regroup (with fold): a sum's column terms go with one scaled operand onto ScalarE, FN(x * k + col), and
        # the other full tiles are added on VectorE after (the element-wise rule with whole broadcast rows)
        self.regroup = regroup and fold
        self.cur = shape  # the shape of a temporary: (P, 1) while computing an expression of columns only
        self.columns = columns  # tensors whose tile is a (P, 1) column: tensor_scalar operands
        self.done: dict[str, View] = {}  # subexpression (printed) -> the temporary holding its value
        self.consts: dict[float, View] = {}  # constant -> its (P, 1) bias column (constant_bias)
        self.in_column = False  # computing a value of columns only (value(): one hoistable block for all of it)

    def emit(self, e: sx.Expr, dst: View) -> list[Stmt]:
        e = fused(e)  # GELU's tanh form, log(1 + exp(y)), x * sigmoid(x) written out: one ScalarE function each
        if self.regroup:
            e = self.regrouped(e)
        if not self.fold and self.columns and dst.buf.dtype in _HALF:  # one pass for batch norm's three operators
            e = affine_fold.folded(e, self.is_column) or e
        # broadcast columns alone: the (P, 1) value expanded over the tile (a tile of one column is that value)
        if self.is_column(e) and self.columns and math.prod(self.shape[1:]) > 1:
            return self.expand(e, dst)
        if self.share is not None:
            halves = self.interleaved(e, dst)
            if halves is not None:
                return halves
        stmts = self.whole_tile(e, dst)
        return shared(stmts, self.share, self.dma_ns(dst)) if self.share is not None else stmts

    def dma_ns(self, dst: View) -> float:
        """The tile's HBM time at the core's share of HBM bandwidth (Target.hbm_bw) if every full operand tile is
        loaded and dst stored: no engine needs to be faster than that (in a row chain some tiles are made on
        chip: an overestimate, so fewer functions move)."""
        assert self.share is not None
        full = [v for n, v in self.tiles.items() if n not in self.columns and v.buf.name not in self.once] + [dst]
        return sum(math.prod(v.shape()) * (2 if v.buf.dtype in _HALF else 4) for v in full) / self.share.hbm_bw

    def whole_tile(self, e: sx.Expr, dst: View) -> list[Stmt]:
        stmts, val = self.value(e, dst)
        if val != dst:
            stmts.append(ir.Copy(dst, val, self.line))
        return stmts

    def interleaved(self, e: sx.Expr, dst: View) -> list[Stmt] | None:
        """The tile in two column halves whose instructions alternate, when its instructions pass values between
        ScalarE and the other engines: each engine runs its instructions in program order, so with the whole tile
        VectorE's `x * sigmoid(t)` waits for ScalarE's sigmoid, which waits for VectorE's `t = beta * x`, and the
        next tile's first multiply waits behind them all (audit15's swish: one tile's chain at a time, 3.1 us a
        tile where VectorE + GpSimdE need 1.9). With halves A and B, ScalarE's sigmoid of A runs while VectorE
        computes B's first step. The halves read the tile's operands and write their own columns of dst and their
        own temporaries, so any interleaving of the two instruction lists computes the same values. None when the
        tile is narrower than 2 * SHARE_MIN, any operand is not a plain 2-D SBUF slice of dst's shape (columns
        aside), or the instructions do not go from one side (ScalarE, VectorE/GpSimdE) to the other and back."""
        assert self.share is not None
        cols = dst.shape()[-1]
        full = {n: v for n, v in self.tiles.items() if n not in self.columns}
        if cols < 2 * SHARE_MIN or not all(_sliceable(v, dst.shape()) for v in (dst, *full.values())):
            return None
        tiles, shape, done, n, consts = self.tiles, self.shape, self.done, self.n, dict(self.consts)
        half = cols // 2
        lists = []
        for lo, width in ((0, half), (half, cols - half)):
            self.tiles = {k: _part(v, lo, width) if k in full else v for k, v in tiles.items()}
            self.shape = self.cur = (shape[0], width)
            self.done = {}
            part = _part(dst, lo, width)
            lists.append(shared(self.whole_tile(e, part), self.share, self.dma_ns(part)))
        self.tiles, self.shape, self.cur, self.done = tiles, shape, shape, done
        # an engine waiting for another in the middle of the tile: ScalarE between two VectorE/GpSimdE steps, or
        # the reverse (a chain that only hands over once, `abs(X - c)`, keeps the next tile's work unblocked)
        sides = ["act" if _engine(x) == "act" else "dve" for x in lists[0] if _engine(x)]
        turns = sum(a != b for a, b in zip(sides, sides[1:]))
        functions = any(isinstance(x, Act) and x.func != "copy" for x in lists[0])  # not only ScalarE's copies
        # a tile ScalarE is busiest on gains nothing: its instructions only double, each paying its fixed cost
        # (audit15's funcs_mix, nine functions an element: 2.00x of the floor whole, 2.17x in halves)
        load = loads(lists[0], self.share)
        if not functions or turns < 2 or load["scalar"] >= max(load["vector"], load["gpsimd"]):
            self.n, self.consts = n, consts  # the whole tile is compiled afresh: same names, its own constants
            return None
        return _alternate(*lists)

    def expand(self, e: sx.Expr, dst: View) -> list[Stmt]:
        """`Y[i, j] = 2 * c[i] + 1`: the value computed on the (P, 1) column, then one ScalarE activation writes the
        tile as 1 * zeros + column (a zeroed tile, set once; never the column times 0 over some tile: 0 * inf is
        NaN)."""
        pre, col = self.value(e, None)
        pre, col = self.fp32_column(pre, col)
        # a column read as it is goes through a (P, 1) VectorE copy first: the perf model puts `Y = c[i]` at 62.3 us
        # reading the loaded column directly, 50.2 us with the copy (1024 x 2048 f32; like `2 * c[i] + 1`, whose
        # column is computed on VectorE too; why the direct read is slower there was not examined)
        if isinstance(e, sx.Access):
            self.n += 1
            buf = Buf(self.fresh(f"{self.prefix}{self.n}"), "sbuf", "f32", col.shape())
            pre, col = pre + [Alloc(buf, line=self.line), ir.Copy(whole(buf), col, self.line)], whole(buf)
        name = "zeros" if self.prefix == "tmp" else f"{self.prefix.rstrip('_')}_zeros"  # a ragged nest's own
        zero = Buf(self.fresh(name), "sbuf", "f32", self.shape)
        made = ir.Block("a zeroed tile the broadcast column is added to", (Alloc(zero, zero=True, line=self.line),),
                        self.line, hoist=True)
        return pre + [made, Act(dst, whole(zero), "copy", col, 1.0, self.line)]

    def regrouped(self, e: sx.Expr) -> sx.Expr:
        """`2*X + b - 0.5*c` (c a column) -> `(2*X - 0.5*c) + b`: the column terms join the first scaled operand
        (ScalarE: X * 2 + bias), the rest follow (VectorE). Through a clamp, relu or other one-argument function
        of the sum (`min(max(2*X + b - 0.5*c, -1), 1)`), the sum inside is regrouped. Other expressions are left as
        written."""
        if isinstance(e, sx.Call) and e.args:
            return dataclasses.replace(e, args=(self.regrouped(e.args[0]),) + e.args[1:])
        terms = _signed_terms(e, 1.0)
        cols = [t for t in terms if self.is_column(t[1])]
        full = [t for t in terms if not self.is_column(t[1])]
        head = next((t for t in full if t[0] > 0 and isinstance(strip_scale(t[1])[0], sx.Access)), None)
        if not cols or head is None or len(full) < 2:
            return e
        out = head[1]
        for sign, t in cols + [t for t in full if t is not head]:
            out = sx.BinOp("+" if sign > 0 else "-", out, t, e.span)
        return out

    def temp(self) -> tuple[list[Stmt], View]:
        self.n += 1
        buf = Buf(self.fresh(f"{self.prefix}{self.n}"), "sbuf", "f32", self.cur)
        return [Alloc(buf, line=self.line)], whole(buf)

    def value(self, e: sx.Expr, dst: View | None) -> tuple[list[Stmt], View]:
        if isinstance(e, sx.Access):
            return [], self.tiles[e.tensor]
        shape = self.cur
        here = (self.shape[0], 1) if dst is None and self.is_column(e) else shape
        # a subexpression seen before (an inlined temporary read twice), computed at the same shape: a constant
        # may be needed as a (P, 1) column in one place and as a whole tile in another (`c[i] - 1`, `abs(1) * X`)
        key = f"{fmt_expr(e)} @ {here}"
        if dst is None and key in self.done:
            return [], self.done[key]
        # instructions carry the line of the statement their expression was written in (a fused chain spans several)
        outer, self.line = self.line, getattr(getattr(e, "span", None), "line", 0) or self.line
        self.cur = here
        once = dst is None and here != shape and not self.in_column and self.is_column(e)
        self.in_column |= once
        stmts, view = self.compute(e, dst)
        self.in_column &= not once
        if once and stmts:  # a value of columns only: the hoist pass lifts it out of the loops over the free tiles
            label = fmt_expr(e).replace("[]", "")  # (the tiles' reads print with no index)
            stmts = [ir.Block(f"{label}: a column computed once", tuple(stmts), self.line, hoist=True)]
        self.line, self.cur = outer, shape
        self.done[key] = view
        return stmts, view

    def compute(self, e: sx.Expr, dst: View | None) -> tuple[list[Stmt], View]:
        c = const_value(e)
        if c is not None:  # a constant-only statement (`Y[i] = 2`): a zeroed tile plus the constant (a fill)
            self.n += 1
            zero = Buf(self.fresh(f"{self.prefix}{self.n}"), "sbuf", "f32", self.cur)
            out, d = self.target(dst)
            return [Alloc(zero, zero=True, line=self.line)] + out + [Scalar(d, whole(zero), "add", c, self.line)], d
        if isinstance(e, sx.Neg):
            return self.scalar(e.x, "multiply", -1.0, dst)
        if isinstance(e, sx.Call) and FUNCTIONS[e.fn].instr == "cast":
            return self.convert(e)
        if isinstance(e, sx.Call) and FUNCTIONS[e.fn].instr == "activation":
            return self.activation(e.fn, e.args[0], dst)
        if isinstance(e, sx.Call):  # a two-operand ALU function (max, min)
            op = FUNCTIONS[e.fn].nki
            for x, c in ((e.args[0], const_value(e.args[1])), (e.args[1], const_value(e.args[0]))):
                if c is not None:
                    return self.scalar(x, op, c, dst)
            return self.binary(e.args[0], e.args[1], op, dst)
        assert isinstance(e, sx.BinOp)  # value() takes the reads; check_expr admits only these forms and numbers
        if self.fold and (on_act := self.on_scalar_engine(e, dst)) is not None:
            return on_act
        rc, lc = const_value(e.rhs), const_value(e.lhs)
        if e.op == "/" and rc is not None:  # x * (1/3) is not x / 3 in fp32: multiply only by an exact inverse
            exact = math.frexp(abs(rc))[0] == 0.5  # a power of two
            return self.scalar(e.lhs, "multiply", 1.0 / rc, dst) if exact else self.scalar(e.lhs, "divide", rc, dst)
        if rc is not None:
            return self.scalar(e.lhs, _BIN[e.op], rc if e.op != "-" else -rc, dst, "add" if e.op == "-" else None)
        if lc is not None and e.op in "+*":
            return self.scalar(e.rhs, _BIN[e.op], lc, dst)
        if lc is not None and e.op == "-":  # c - x: one tensor_scalar with the operands reversed
            pre, v = self.value(e.rhs, None)
            out, d = self.target(dst)
            return pre + out + [Scalar(d, v, "subtract", lc, self.line, reverse=True)], d
        if lc is not None and e.op == "/":  # c / x: the reciprocal activation, scaled
            if lc == 1.0:
                return self.activation("reciprocal", e.rhs, dst)
            pre, v = self.activation("reciprocal", e.rhs, None)
            out, d = self.target(dst)
            return pre + out + [Scalar(d, v, "multiply", lc, self.line)], d
        return self.binary(e.lhs, e.rhs, _BIN[e.op], dst)

    def activation(self, fn: str, x: sx.Expr, dst: View | None) -> tuple[list[Stmt], View]:
        folded = self.affine(x) if self.fold else None
        folded = folded or self.constant_bias(fn, x)
        if folded is not None:
            pre, v, scale, bias = folded
            out, d = self.target(dst)
            return pre + out + [Act(d, v, fn, bias, scale, self.line)], d
        pre, v = self.value(x, None)
        out, d = self.target(dst)
        return pre + out + [Act(d, v, fn, None, 1.0, self.line)], d

    def constant_bias(self, fn: str, x: sx.Expr) -> tuple[list[Stmt], View, float, View | None] | None:
        """`f(k * y + c)`, `f(c - y)`, `f(y / k + c)` for a tile y: one activation f(y * k + bias), the constant
        c in a (P, 1) column made once before the loops (the multiply-add is free on ScalarE, nki-spec §1.10.8;
        bias is a vector on trn1, a column on both). Not reciprocal unless the target is known to be trn2:
        `activation(nl.reciprocal)` takes no bias on trn1 (NeuronCore-v2, nki-spec §1.10.8)."""
        no_bias = self.share is None or self.share.name == "trn1"
        if fn == "reciprocal" and no_bias or self.is_column(x) or self.cur[1:] == (1,):
            return None
        terms = [(sign, t, const_value(t)) for sign, t in _signed_terms(x, 1.0)]
        consts = [sign * v for sign, _, v in terms if v is not None]
        rest = [(sign, t) for sign, t, v in terms if v is None]
        if len(consts) != 1 or len(rest) != 1 or not isinstance(x, sx.BinOp):
            return None
        y, k = strip_scale(rest[0][1])
        c = consts[0]
        if self.is_column(y) or not c:
            return None
        pre, v = self.value(y, None)
        return pre + self.constant_column(c), v, rest[0][0] * k, self.consts[c]

    def constant_column(self, c: float) -> list[Stmt]:
        """A (P, 1) fp32 column holding c, made once per kernel (a hoisted block: zeroed, then c added)."""
        if c in self.consts:
            return []
        # named by its value: one name is one value wherever the kernel's expressions ask for it (fresh is stable
        # per name), and a ragged nest's regions (their own prefix) keep their own columns of their own partitions
        value = f"{abs(c):g}".replace(".", "_").replace("+", "").replace("-", "m")
        parts = "" if self.shape[0] == 128 else f"_p{self.shape[0]}"
        name = f"{'' if self.prefix == 'tmp' else self.prefix.rstrip('_') + '_'}bias_{'m' if c < 0 else ''}{value}{parts}"
        buf = Buf(self.fresh(name), "sbuf", "f32", (self.shape[0], 1))
        self.consts[c] = whole(buf)
        made = (Alloc(buf, zero=True, line=self.line), Scalar(whole(buf), whole(buf), "add", c, self.line))
        return [ir.Block(f"the constant {c} as an activation's bias column", made, self.line, hoist=True)]

    def on_scalar_engine(self, e: sx.BinOp, dst: View | None) -> tuple[list[Stmt], View] | None:
        """A full tile plus/minus, times or over a column, as one ScalarE copy FN(x * scale + bias): the VectorE
        passes of a row chain (its reductions) then overlap it."""
        if e.op == "*" and fmt_expr(e.lhs) == fmt_expr(e.rhs) and not self.is_column(e):  # x * x: ScalarE's square
            pre, v = self.value(e.lhs, None)
            out, d = self.target(dst)
            return pre + out + [Act(d, v, "square", None, 1.0, self.line)], d
        if self.is_column(e) or e.op not in "+-*/":
            return None
        col, x = (e.rhs, e.lhs) if self.is_column(e.rhs) else (e.lhs, e.rhs) if e.op in "+*" else (None, None)
        if col is None or x is None or not self.is_column(col) or self.is_column(x):  # (x is None iff col is)
            return None
        if e.op in "+-":
            folded = self.affine(e)
            if folded is None:
                return None
            pre, v, scale, bias = folded
            out, d = self.target(dst)
            return pre + out + [Act(d, v, "copy", bias, scale, self.line)], d
        pre, v = self.value(x, None)
        pc, c = self.value(col, None)
        if e.op == "/":  # x / col = x * (1 / col): the reciprocal of the (P, 1) column, then the scale
            shape, self.cur = self.cur, (self.shape[0], 1)
            more, inv = self.temp()
            self.cur = shape
            pc = pc + more + [Act(inv, c, "reciprocal", None, 1.0, self.line)]
            c = inv
        out, d = self.target(dst)
        return pre + pc + out + [Act(d, v, "copy", None, c, self.line)], d

    def affine(self, e: sx.Expr) -> tuple[list[Stmt], View, float, View | None] | None:
        """`x + col`, `col + x`, `x - col` -> (x, scale 1, bias +-col); `x * c`, `c * x` -> (x, scale c, no bias)."""
        if not isinstance(e, sx.BinOp) or self.is_column(e):
            return None
        if e.op == "*":
            for x, c in ((e.lhs, const_value(e.rhs)), (e.rhs, const_value(e.lhs))):
                if c is not None:
                    pre, v = self.value(x, None)
                    return pre, v, c, None
            return None
        if e.op not in "+-":
            return None
        for x, col, sign in ((e.lhs, e.rhs, 1.0 if e.op == "+" else -1.0), (e.rhs, e.lhs, 1.0)):
            if self.is_column(col) and not self.is_column(x) and not (e.op == "-" and col is e.lhs):
                if self.regroup:
                    return self.scaled_affine(x, col, sign)
                pre, v = self.value(x, None)
                pc, bias = self.value(col, None)
                if sign < 0:  # the bias adds: negate the (P, 1) column first (one tiny instruction)
                    pc, bias = self.scaled_column(pc, bias, -1.0)
                return pre + pc, v, 1.0, bias
        return None

    def scaled_affine(self, x: sx.Expr, col: sx.Expr, sign: float) -> tuple[list[Stmt], View, float, View | None]:
        """`k * y + col`, `k * y - h * col`: ScalarE's scale takes k and its bias the column times its factor (one
        tiny instruction for the column instead of a pass over the tile for k)."""
        y, k = strip_scale(x)
        colx, h = strip_scale(col)
        if self.is_column(y) or not self.is_column(colx):
            y, k, colx, h = x, 1.0, col, 1.0
        pre, v = self.value(y, None)
        pc, c = self.value(colx, None)
        if sign * h != 1.0:  # on ScalarE too: a VectorE step between would make the engines wait on each other
            pc, c = self.scaled_column(pc, c, sign * h, scalar_engine=True)
        return pre + pc, v, k, c

    def scaled_column(self, pc: list[Stmt], c: View, factor: float, scalar_engine: bool = False
                      ) -> tuple[list[Stmt], View]:
        shape, self.cur = self.cur, (self.shape[0], 1)
        more, out = self.temp()
        self.cur = shape
        scaled = Act(out, c, "copy", None, factor, self.line) if scalar_engine else \
            Scalar(out, c, "multiply", factor, self.line)
        return pc + more + [scaled], out

    def convert(self, e: sx.Call) -> tuple[list[Stmt], View]:
        """f16(x), bf16(x): x rounded to that dtype (a tensor_copy into a tile of it; later instructions read it
        back as fp32). f32(x) is x: the engines compute in fp32."""
        pre, x = self.value(e.args[0], None)
        if e.fn == "f32":
            return pre, x
        self.n += 1
        buf = Buf(self.fresh(f"{self.prefix}{self.n}"), "sbuf", e.fn, self.cur)  # (P, 1) when it rounds a column
        rounded = pre + [Alloc(buf, line=self.line), ir.Copy(whole(buf), x, self.line)]
        if self.is_column(e):  # a per-partition operand (an activation's scale or bias, a tensor_scalar operand)
            return self.fp32_column(rounded, whole(buf))  # must be fp32: widened back, exactly
        return rounded, whole(buf)

    def target(self, dst: View | None) -> tuple[list[Stmt], View]:
        return ([], dst) if dst is not None else self.temp()

    def scalar(self, x: sx.Expr, op: str, value: float, dst, override: str | None = None):
        pre, v = self.value(x, None)
        out, d = self.target(dst)
        joined = self.joined(pre, v, [], out, d, override or op, value)  # `min(max(x, lo), hi)`
        return joined or (pre + out + [Scalar(d, v, override or op, value, self.line)], d)

    def joined(self, pre: list[Stmt], v: View, between: list[Stmt], out: list[Stmt], d: View, op: str,
               value: "float | View") -> tuple[list[Stmt], View] | None:
        """`op value` applied to v as the second operator of the tensor_scalar that just computed v, written into d
        (one VectorE pass; v's temporary is gone), when that instruction is this statement's (its `# tl:N` tag stays
        true); `between` (an operand's column) comes before it. None when it cannot join."""
        first = _one_op_scalar_into(pre, v)
        if first is None or first.line != self.line:
            return None
        self.done = {k: w for k, w in self.done.items() if w != v}
        return pre[:-2] + between + out + [dataclasses.replace(first, dst=d, op1=op, value1=value)], d

    def binary(self, x: sx.Expr, y: sx.Expr, op: str, dst):
        p1, v1 = self.value(x, None)
        p2, v2 = self.value(y, None)
        out, d = self.target(dst)
        if self.is_column(x) == self.is_column(y):  # two tiles of one shape (two (P, 1) columns too): tensor_tensor
            return p1 + p2 + out + [Binary(d, v1, v2, op, self.line)], d
        if self.is_column(y):  # a per-partition scalar: tensor_scalar with a (P, 1) operand
            p2, v2 = self.fp32_column(p2, v2)
            joined = self.joined(p1, v1, p2, out, d, op, v2)  # `(X - mu[i]) * g[i]`
            return joined or (p1 + p2 + out + [Scalar(d, v1, op, v2, self.line)], d)
        p1, v1 = self.fp32_column(p1, v1)
        return p1 + p2 + out + [Scalar(d, v2, op, v1, self.line, reverse=op in ("subtract", "divide"))], d

    def fp32_column(self, pre: list[Stmt], col: View) -> tuple[list[Stmt], View]:
        """A tensor_scalar's tile operand must be float32 [tensor_scalar_operand_dtype]: a column rounded to f16/bf16
        (`bf16(min(c[i], 1.5))`) is copied back into an fp32 column first (exact: a widening)."""
        if col.buf.dtype == "f32":
            return pre, col
        self.n += 1
        buf = Buf(self.fresh(f"{self.prefix}{self.n}"), "sbuf", "f32", col.shape())
        return pre + [Alloc(buf, line=self.line), ir.Copy(whole(buf), col, self.line)], whole(buf)

    def is_column(self, e: sx.Expr) -> bool:
        return column_only(e, self.columns)


SHARE_MIN = 256  # columns: a narrower tensor_tensor stays whole on VectorE (a second instruction's fixed cost)
_HALF = ("f16", "bf16")
# A lone tensor_tensor is cut between VectorE and GpSimdE only when VectorE would stream it for more than this share
# of the tile's DMA time (its operands loaded, its result stored); below, it waits on its loads anyway. On the trn2
# model (core22): vector add f32 (0.51 of the DMA time) 289.2 cut vs 290.0 us at 2048 x 4096, 24.2 vs 24.0 us at
# 256000; X * beta[j] f32 (0.76) 386.7 vs 467.6 us at 1024 x 16384. Between the two: a compiler choice, not a fact.
LONE_CUT = 2 / 3


def shared(stmts: list[Stmt], t: Target, dma_ns: float = math.inf) -> list[Stmt]:
    """One tile's instructions with VectorE's work spread when it has more than one instruction there, or one
    tensor_tensor streaming for more than LONE_CUT of the tile's DMA time (below, a lone one waits on its loads
    anyway: vector add of 256000 f32 24.0 -> 24.2 us on the model when cut):
    tensor_tensors cut between GpSimdE and VectorE (shared_binary), then constant tensor_scalars moved to ScalarE
    (balanced)."""
    stmts, moved = offloaded(stmts, t, dma_ns)
    if moved:
        stmts = by_handovers(stmts)
    alone = [x for x in stmts if isinstance(x, (Binary, Scalar)) and not x.engine]
    if len(alone) < 2 and not (alone and _cut(alone[0]) and _cycles(alone[0]) / t.vector_ghz > LONE_CUT * dma_ns):
        return stmts
    cuts = sum(_cycles(x) for x in stmts if _cut(x))
    # VectorE's share of each cut tensor_tensor: both engines finish together, VectorE also running the
    # functions moved off ScalarE (`moved` cycles; 0: the clocks' ratio, as before)
    share = t.vector_part()
    if moved and cuts and t.vector_gpsimd_split:
        share = min(1.0, max(0.0, (cuts / t.gpsimd_ghz - moved / t.vector_ghz) /
                             (cuts / t.vector_ghz + cuts / t.gpsimd_ghz)))
    out: list[Stmt] = []
    for n, x in enumerate(stmts):
        # where the engines are serialised (Target.vector_part), the tile's result, which the loop stores, stays on
        # VectorE: with every instruction on GpSimdE its loads and stores share GpSimdE's DMA trigger stream
        # (tilec/perf/schedule.py, inferred) and the loop runs a tile at a time (softplus, trn1 model: 1.28x vs 1.01x)
        part = share if t.vector_gpsimd_split or n < len(stmts) - 1 else 1.0
        out += shared_binary(x.dst, x.a, x.b, x.op, x.line, t, part) if isinstance(x, Binary) and _cut(x) else [x]
    return balanced(out, t, columns=True)


def offloaded(stmts: list[Stmt], t: Target, dma_ns: float) -> tuple[list[Stmt], float]:
    """ScalarE's abs and relu moved to VectorE while that lowers the tile's busiest engine, with the VectorE cycles
    moved: abs(x) = max(x * -1, x), one scalar_tensor_tensor (2N cycles, VectorE only [NISA
    scalar_tensor_tensor, tilec/perf/costs.py]), relu(x) = max(x, 0), one tensor_scalar (N cycles, nki-spec
    §1.10.5); both exact, as the activations are. Only plain ones (no scale, bias or sum), and only while the
    busiest engine is slower than the tile's DMA (`sqrt(abs(X)) * tanh(Z) + sigmoid(X)` of 4096^2 f32 is DMA-bound:
    565.6 us as it is, 603.6 with abs moved). audit15's funcs_mix has nine ScalarE functions an element and six
    tensor_tensors shared by VectorE and GpSimdE: ScalarE 97% busy, 548.6 us; 493.6 with one abs moved."""
    moved = 0.0
    out = list(stmts)
    for n, x in enumerate(stmts):
        if not (isinstance(x, Act) and x.func in ("abs", "relu") and x.bias is None and x.scale == 1.0 and
                x.total is None and x.dst.buf.memory == "sbuf" and x.src.buf.memory == "sbuf"):
            continue
        new: Stmt = Binary(x.dst, x.src, x.src, "maximum", x.line, scale0=-1.0) if x.func == "abs" else \
            Scalar(x.dst, x.src, "maximum", 0.0, x.line)
        trial = out[:n] + [new] + out[n + 1:]
        extra = moved + _cycles(new)
        now = _busiest(out, t)
        if now <= dma_ns or _busiest(trial, t) >= now:  # the loads and stores bound the tile: nothing to gain
            break
        out, moved = trial, extra
    return out, moved


def by_handovers(stmts: list[Stmt]) -> list[Stmt]:
    """The tile's instructions stably ordered by how many hand-overs between ScalarE and the other engines lead to
    them (a dependency order still: a reader has at least its producer's count). Each engine runs its instructions
    in program order, so a ScalarE function reading a VectorE result first in ScalarE's list holds back every
    function of the next tile until VectorE has finished this tile: with abs moved to VectorE in funcs_mix the
    engines took turns (all three 64% busy, 748.3 us with start-up; before the move 561.6)."""
    made: dict[str, tuple[int, str]] = {}  # buffer -> (hand-overs to its last write, the side that wrote it)
    read: dict[str, int] = {}  # buffer -> the highest count of an instruction reading it (a later write waits)
    keyed = []
    for n, x in enumerate(stmts):
        level = 0
        if not isinstance(x, (Alloc, ir.Block)):  # (an allocation keeps its place; a block holds constants)
            side = "act" if _engine(x) == "act" else "dve"
            written = [x.dst] + ([x.total] if isinstance(x, Act) and x.total is not None else [])  # type: ignore
            for v in ir.views(x):
                got, by = made.get(v.buf.name, (0, side))
                level = max(level, got + (by != side), read.get(v.buf.name, 0) if v in written else 0)
            for v in ir.views(x):
                read[v.buf.name] = max(read.get(v.buf.name, 0), level)
            for v in written:
                made[v.buf.name] = (level, side)
        keyed.append((level, n, x))
    return [x for _, _, x in sorted(keyed, key=lambda k: (k[0], k[1]))]


def _cut(x: Stmt) -> bool:
    """A tensor_tensor shared_binary may cut between GpSimdE and VectorE (not one with a scaled first operand:
    scalar_tensor_tensor runs on VectorE only)."""
    return isinstance(x, Binary) and not x.engine and x.scale0 == 1.0


def _cycles(x: Stmt) -> float:
    """Streaming cycles of a VectorE instruction: 2 an element for tensor_tensor (fp32), 1 for tensor_scalar."""
    assert isinstance(x, (Binary, Scalar))
    return math.prod(x.dst.shape()[1:]) * (2 if isinstance(x, Binary) else 1)


def _busiest(stmts: list[Stmt], t: Target) -> float:
    """The tile's busiest engine (ns, streaming only): ScalarE's activations, or VectorE and GpSimdE with the cut
    tensor_tensors spread over both and the moved functions on VectorE."""
    act = sum(math.prod(x.dst.shape()[1:]) for x in stmts if isinstance(x, Act)) / t.scalar_ghz
    vector = sum(_cycles(x) for x in stmts if isinstance(x, (Binary, Scalar)) and not x.engine and not _cut(x))
    cuts = sum(_cycles(x) for x in stmts if _cut(x))
    pair = max(vector / t.vector_ghz, (vector + cuts) / (t.vector_ghz + t.gpsimd_ghz)) if t.vector_gpsimd_split \
        else vector / t.vector_ghz + cuts / max(t.vector_ghz, t.gpsimd_ghz)  # (serialised: the times add up)
    return max(act, pair)


# the tensor_scalar operator pairs ScalarE runs on trn2, by constants or (P, 1) columns [ISA6 tensor_scalar]: a
# per-channel scale and shift (`X_c * g[c] + b[c]`) moves as a whole
_ON_SCALAR = (("multiply", ""), ("add", ""), ("multiply", "add"))


def balanced(stmts: list[Stmt], t: Target, columns: bool = False) -> list[Stmt]:
    """The instructions of one tile with VectorE's constant multiplies and adds (tensor_scalar) moved to ScalarE
    (tensor_scalar accepts engine=scalar for multiply and add on trn2 [ISA6 tensor_scalar]; on trn1 a multiply
    becomes an activation copy with that scale) while that lowers the busier
    of the two: each streams one element per cycle on either engine (tilec/perf/costs.py), ScalarE at its own
    clock plus its activations' elements. audit15's GELU (tanh form) has four constant tensor_scalars per element
    next to one tanh. `columns` (an element-wise nest's tile, whose instructions are all the loop does): also a
    multiply, add or multiply-add by columns, on trn2 (batch norm's `* g[c] + b[c]`); not in a column chain, whose
    ScalarE has the statistics' passes this count does not see (channel_layernorm 31.4 -> 44.1 us when moved)."""
    per = lambda v: math.prod(v.shape()[1:])  # noqa: E731 (elements per partition)
    vec = sum(per(x.dst) * (2 if isinstance(x, Binary) else 1) for x in stmts
              if isinstance(x, (Binary, Scalar)) and not x.engine) / t.vector_ghz
    sca = sum(per(x.dst) for x in stmts if isinstance(x, Act)) / t.scalar_ghz
    # (trn1's tensor_scalar runs on VectorE and GpSimdE only: a multiply goes over as an activation's scale)
    on_scalar = "scalar" in t.instr("tensor_scalar").engines
    out: list[Stmt] = []
    for x in stmts:
        if isinstance(x, Scalar) and not x.engine and (x.op, x.op1) in _ON_SCALAR and \
                (isinstance(x.value, float) and not x.op1 or on_scalar and columns) and \
                x.dst.buf.memory == "sbuf" and x.src.buf.memory == "sbuf":
            n = per(x.dst)
            moved = dataclasses.replace(x, engine="scalar") if on_scalar else \
                Act(x.dst, x.src, "copy", None, x.value, x.line) if x.op == "multiply" else None
            if moved is not None and sca + n / t.scalar_ghz < vec - n / t.vector_ghz:
                vec, sca, x = vec - n / t.vector_ghz, sca + n / t.scalar_ghz, moved
        out.append(x)
    return out


def shared_binary(d: View, x: View, y: View, op: str, line: int, t: Target, share: float | None = None
                  ) -> list[Stmt]:
    """d = x op y with its columns cut between GpSimdE (first in program order) and VectorE so both finish
    together: tensor_tensor streams 2 cycles per element on either engine from SBUF (tilec/perf/costs.py, nki-spec
    §1.10.4), at the clocks of tilec/target.py, so the pair runs ~2.2x faster than VectorE alone (audit15's swish
    and GELU chains: two or more tensor_tensors per element on VectorE, its busiest engine). Kept whole: a tile
    under SHARE_MIN columns, an operand in PSUM (GpSimdE cannot read it) or of more than two axes, all-16-bit
    operands (VectorE's 1-cycle mode then borrows GpSimdE's SBUF bus, ARCH3), and a square x * x (the rules find
    it whole to move it to ScalarE: lower_tiles.the_square)."""
    views = (d, x, y)
    whole_one: list[Stmt] = [Binary(d, x, y, op, line)]
    if any(v.buf.memory != "sbuf" or v.perm or len(v.idx) != 2 or not isinstance(v.idx[-1], ir.Sl) or
           v.idx[-1].step != 1 for v in views):
        return whole_one
    cols = d.shape()[-1]
    if cols < SHARE_MIN or x == y or any(v.shape() != d.shape() for v in views) or \
            all(v.buf.dtype in _HALF for v in views):
        return whole_one
    cut = round(cols * t.vector_part()) if share is None else round(cols * share)
    if not 0 < cut < cols:
        return [Binary(d, x, y, op, line, engine="" if cut else "gpsimd")]
    part = lambda v, lo, n: View(v.buf, (v.idx[0], ir.Sl(v.idx[-1].start.plus(lo), n)))  # noqa: E731
    shared: list[Stmt] = [Binary(part(d, cut, cols - cut), part(x, cut, cols - cut), part(y, cut, cols - cut), op, line,
                   engine="gpsimd"),
            Binary(part(d, 0, cut), part(x, 0, cut), part(y, 0, cut), op, line)]
    return shared


def _sliceable(v: View, shape: tuple[int, ...]) -> bool:
    return v.buf.memory == "sbuf" and not v.perm and len(v.idx) == 2 and isinstance(v.idx[-1], ir.Sl) and \
        v.idx[-1].step == 1 and v.shape() == shape


def _part(v: View, lo: int, n: int) -> View:
    """Columns [lo, lo + n) of a 2-D view whose last index is a unit-step slice."""
    last = v.idx[-1]
    assert isinstance(last, ir.Sl)
    return View(v.buf, (v.idx[0], ir.Sl(last.start.plus(lo), n)))


def _engine(x: Stmt) -> str:
    """The engine a compute instruction runs on ("act" for ScalarE; "" for an allocation or a block)."""
    if isinstance(x, Act):
        return "act"
    if isinstance(x, (Binary, Scalar, ir.Copy)):
        return "act" if x.engine == "scalar" else x.engine or "vector"
    return ""


def _alternate(a: list[Stmt], b: list[Stmt]) -> list[Stmt]:
    """Two independent instruction lists merged step by step (a step: its allocations and blocks, then one
    instruction), each list's own order kept; blocks (hoisted constants) first."""
    def steps(xs: list[Stmt]) -> list[list[Stmt]]:
        out: list[list[Stmt]] = [[]]
        for x in xs:
            out[-1].append(x)
            if _engine(x):
                out.append([])
        return [s for s in out if s]
    first = [x for x in a + b if isinstance(x, ir.Block)]
    sa, sb = steps([x for x in a if not isinstance(x, ir.Block)]), steps([x for x in b if not isinstance(x, ir.Block)])
    merged = [x for i in range(max(len(sa), len(sb))) for s in (sa[i:i + 1] + sb[i:i + 1]) for x in s]
    return first + merged


def _signed_terms(e: sx.Expr, sign: float) -> list[tuple[float, sx.Expr]]:
    """`a + b - (c - d)` -> [(+1, a), (+1, b), (-1, c), (+1, d)]."""
    if isinstance(e, sx.BinOp) and e.op in "+-":
        return _signed_terms(e.lhs, sign) + _signed_terms(e.rhs, sign if e.op == "+" else -sign)
    return [(sign, e)]


def _one_op_scalar_into(pre: list[Stmt], v: View) -> Scalar | None:
    """The tensor_scalar that just computed the temporary `v` (its allocation and it end `pre`) with one operator
    (a constant or a column operand), on the default engine: a following operator with a constant or a column joins
    it as its op1 (the fp32 intermediate is the temporary's own dtype, so the result is the same)."""
    if len(pre) < 2 or not isinstance(pre[-1], Scalar) or not isinstance(pre[-2], Alloc):
        return None
    s = pre[-1]
    if s.dst != v or pre[-2].buf != v.buf or v.buf.dtype != "f32" or s.op1 or s.engine or s.reverse:
        return None
    return s
