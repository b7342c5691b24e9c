"""Static checks of a parsed kernel: names, declarations, index arity, quasi-affine indices, dtypes, writes to
inputs, reads of tensors never written, loop bounds. Produces the `Facts` later stages use (size symbols, tensors, every
access with its loop nest); bounds and divisibility are `tilec.lang.bounds`'s business.

The dtype rule: arithmetic is done in float32, and a store rounds to the target's dtype, so a statement may write a
tensor of any dtype. But all tensors *read* by one statement must share one dtype, unless converted explicitly with
f32(x), f16(x) or bf16(x). Why: the operands' dtype decides the precision the hardware computes in (a TensorEngine
matmul takes two operands of one dtype); mixing f16 and f32 operands silently would leave that choice to the
compiler. The target of `+=`/`max=`/`min=` is not an operand: `acc: f32` may accumulate f16 products (as PSUM does).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from tilec.errors import Span, TilecError
from tilec.lang import syntax as s
from tilec.lang.functions import FUNCTIONS as TABLE
from tilec.lang.symbolic import Affine, NotAffine, Poly, size_poly, to_affine

FUNCTIONS = {name: f.arity for name, f in TABLE.items()}  # name -> arity (tilec/lang/functions.py)
CONVERSIONS = tuple(name for name, f in TABLE.items() if f.instr == "cast")
REDUCE_OPS = ("+=", "max=", "min=")


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[s.Expr, ...]
    kind: str  # input | output | temp
    span: Span


@dataclass(frozen=True)
class LoopCtx:
    var: str
    start: s.Expr
    stop: s.Expr
    span: Span


@dataclass(frozen=True)
class Site:
    """One tensor access (read or write) with the loops around it and its indices as affine forms."""

    access: s.Access
    loops: tuple[LoopCtx, ...]
    affines: tuple[Affine, ...]
    write: bool


@dataclass(frozen=True)
class Facts:
    kernel: s.Kernel
    symbols: tuple[str, ...]  # size symbols, in order of first use in a parameter shape
    lets: dict[str, s.Let]
    tensors: dict[str, Tensor]
    sites: tuple[Site, ...]


def err(message: str, span: Span, hint: str) -> TilecError:
    return TilecError(message, span, hint)


def _did_you_mean(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"did you mean `{close[0]}`? " if close else ""


def _names_in(expr: s.Expr) -> list[s.Name]:
    if isinstance(expr, s.Name):
        return [expr]
    if isinstance(expr, (s.Num,)):
        return []
    if isinstance(expr, s.Neg):
        return _names_in(expr.x)
    if isinstance(expr, s.BinOp):
        return _names_in(expr.lhs) + _names_in(expr.rhs)
    children = expr.args if isinstance(expr, s.Call) else expr.indices
    return [n for c in children for n in _names_in(c)]


# ---- declarations ---------------------------------------------------------------------------------------------------


class Scope:
    """The kernel-level names: size symbols, lets and tensors, each with where it was introduced."""

    def __init__(self, kernel: s.Kernel) -> None:
        self.kernel = kernel
        self.lets: dict[str, s.Let] = {}
        self.tensors: dict[str, Tensor] = {}
        self.symbols: dict[str, Span] = {}
        self.let_names = {let.name for let in kernel.lets}

    def sizes(self) -> list[str]:
        return list(self.symbols) + list(self.lets)

    def size_of(self, name: s.Name) -> Poly:
        """Resolve a name used as a size (lets expand to their definitions)."""
        if name.id in self.symbols:
            return Poly.sym(name.id)
        if name.id in self.lets:
            return self.let_poly(name.id)
        if name.id in self.tensors:
            raise err(f"tensor `{name.id}` used as a size", name.span,
                      "sizes are integers: parameter dimensions (N, C, ...), `let`s and constants")
        if name.id in self.let_names:
            raise err(f"size `{name.id}` is used before its `let`", name.span, "move the `let` line earlier")
        raise err(f"unknown size `{name.id}`", name.span,
                  _did_you_mean(name.id, self.sizes()) + "a size is a name in a parameter's shape or a `let`")

    def let_poly(self, name: str) -> Poly:
        return _size_poly(self.lets[name].value, self)

    def introduce(self, name: str, span: Span, what: str) -> None:
        previous = self._find(name)
        if previous is not None:
            raise err(f"`{name}` is already {previous[0]} at line {previous[1].line}", span,
                      f"give the {what} another name")

    def _find(self, name: str) -> tuple[str, Span] | None:
        if name in self.tensors:
            t = self.tensors[name]
            return ("a parameter" if t.kind == "input" else "declared"), t.span
        if name in self.lets:
            return "defined by a `let`", self.lets[name].span
        if name in self.symbols:
            return "a size (from a parameter's shape)", self.symbols[name]
        return None


def _size_poly(expr: s.Expr, scope: Scope) -> Poly:
    for name in _names_in(expr):
        scope.size_of(name)  # raise for unknown names before any other complaint
    try:
        return size_poly(expr, scope.size_of)
    except NotAffine as bad:
        raise err(bad.reason, bad.span, bad.hint) from None


def _declare_params(scope: Scope) -> None:
    for p in scope.kernel.params:
        scope.introduce(p.name, p.span, "parameter")
        scope.tensors[p.name] = Tensor(p.name, p.type.dtype, p.type.shape, "input", p.span)
        for name in (n for d in p.type.shape for n in _names_in(d)):
            if name.id not in scope.let_names and name.id not in scope.symbols:
                scope.introduce(name.id, name.span, "size")
                scope.symbols[name.id] = name.span


def _declare_lets(scope: Scope) -> None:
    for let in scope.kernel.lets:
        scope.introduce(let.name, let.span, "size")
        _size_poly(let.value, scope)
        scope.lets[let.name] = let


def _declare_decls(scope: Scope) -> None:
    outputs = scope.kernel.outputs
    for d in scope.kernel.decls:
        scope.introduce(d.name, d.span, "tensor")
        for dim in d.type.shape:
            _size_poly(dim, scope)
        kind = "output" if d.name in outputs else "temp"
        scope.tensors[d.name] = Tensor(d.name, d.type.dtype, d.type.shape, kind, d.span)


def _check_outputs(scope: Scope) -> None:
    k = scope.kernel
    spans = k.output_spans or tuple(k.span for _ in k.outputs)
    seen: set[str] = set()
    for name, span in zip(k.outputs, spans):
        if name in seen:
            raise err(f"output `{name}` is listed twice", span, "name each output once after `->`")
        seen.add(name)
        t = scope.tensors.get(name)
        if t is not None and t.kind == "input":
            raise err(f"output `{name}` is also a parameter", span,
                      "outputs are new tensors: give the output another name and declare it in the body")
        if t is None:
            raise err(f"output `{name}` is not declared", span,
                      f"declare it in the kernel body with its type and shape, e.g. `{name}: f32[N]`")


def _check_defaults(scope: Scope) -> None:
    seen: set[str] = set()
    for d in scope.kernel.defaults:
        if d.name in scope.lets or d.name in scope.let_names:
            raise err(f"`{d.name}` is a `let`, so it cannot have a default", d.span,
                      "give defaults to the sizes named in parameter shapes; lets follow from them")
        if d.name not in scope.symbols:
            raise err(f"`{d.name}` is not a size of this kernel", d.span,
                      _did_you_mean(d.name, list(scope.symbols)) + "defaults are for names in parameter shapes")
        if d.name in seen:
            raise err(f"size `{d.name}` has two defaults", d.span, "give each size one default")
        seen.add(d.name)
        if not isinstance(d.value, s.Num) or not isinstance(d.value.value, int) or d.value.value < 1:
            raise err(f"default of `{d.name}` must be a positive integer", d.value.span, f"write e.g. `{d.name} = 4`")


def _check_assumes(scope: Scope) -> None:
    for a in scope.kernel.assumes:
        for side in (a.cond.lhs, a.cond.rhs):
            for name in _names_in(side):
                scope.size_of(name)
            _no_tensors_or_calls(side)


def _no_tensors_or_calls(expr: s.Expr) -> None:
    if isinstance(expr, (s.Access, s.Call)):
        raise err("an `assume` may only use sizes and constants", expr.span, "assumptions are facts about sizes")
    if isinstance(expr, s.Num) and not isinstance(expr.value, int):  # 1.5, inf: sizes are integers
        raise err(f"an `assume` compares integer sizes; `{expr.value}` is not an integer", expr.span,
                  "use integer constants, e.g. `assume N % 2 == 0`")
    for child in children(expr):
        _no_tensors_or_calls(child)


def children(expr: s.Expr) -> tuple[s.Expr, ...]:
    if isinstance(expr, s.Neg):
        return (expr.x,)
    if isinstance(expr, s.BinOp):
        return (expr.lhs, expr.rhs)
    if isinstance(expr, s.Call):
        return expr.args
    if isinstance(expr, s.Access):
        return expr.indices
    return ()


# ---- statements -----------------------------------------------------------------------------------------------------


class Walker:
    """Walks the statements in program order, checking each and collecting access sites."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.loops: list[LoopCtx] = []
        self.sites: list[Site] = []
        self.written: set[str] = set()

    def stmts(self, body: tuple[s.Stmt, ...]) -> None:
        for st in body:
            self.loop(st) if isinstance(st, s.Loop) else self.assign(st)

    def loop(self, lp: s.Loop) -> None:
        outer = [c.var for c in self.loops]
        if lp.var in outer:
            raise err(f"loop variable `{lp.var}` is already used by an enclosing loop", lp.span,
                      "give each nested loop its own variable")
        self.scope.introduce(lp.var, lp.span, "loop variable")
        for bound in (lp.start, lp.stop):
            self._bound(bound, outer)
        self.loops.append(LoopCtx(lp.var, lp.start, lp.stop, lp.span))
        self.stmts(lp.body)
        self.loops.pop()

    def _bound(self, bound: s.Expr, outer: list[str]) -> None:
        for name in _names_in(bound):
            if name.id in outer:
                raise err(f"loop bound depends on loop variable `{name.id}`", name.span,
                          "loop bounds must be sizes (parameter dimensions, lets, constants)")
        _no_tensors_or_calls_bound(bound)
        _size_poly(bound, self.scope)

    def assign(self, st: s.Assign) -> None:
        target = self.scope.tensors.get(st.target.tensor)
        if target is not None and target.kind == "input":
            raise err(f"cannot write to input `{target.name}`", st.target.span,
                      "parameters are read-only; declare an intermediate (e.g. `tmp: f32[...]`) and write that")
        self.access(st.target, write=True)
        self._value(st.value)
        self._reads_written(st)
        self.written.add(st.target.tensor)

    def access(self, acc: s.Access, write: bool) -> None:
        t = self.scope.tensors.get(acc.tensor)
        name_span = _name_span(acc)
        if t is None:
            raise err(f"unknown tensor `{acc.tensor}`", name_span,
                      _did_you_mean(acc.tensor, list(self.scope.tensors)) + "declare it: `NAME: f32[...]`")
        if len(acc.indices) != len(t.shape):
            raise err(f"`{acc.tensor}` has {len(t.shape)} dimension{'s' * (len(t.shape) != 1)} but is indexed with "
                      f"{len(acc.indices)}", acc.span, f"write one index per dimension: {_template(t)}")
        affines = tuple(self._index(i) for i in acc.indices)
        for index, aff in zip(acc.indices, affines):
            if write and aff.quasi:
                raise err("the index of a stored element must be affine: `/` and `%` of loop variables may only "
                          "appear in the indices a statement reads", index.span,
                          "loop over the stored tensor's elements and divide in the read, e.g. `Y[i] = X[i / 2]`")
        self.sites.append(Site(acc, tuple(self.loops), affines, write))

    def _index(self, index: s.Expr) -> Affine:
        loop_vars = {c.var for c in self.loops}
        for name in _names_in(index):
            if name.id in self.scope.tensors:
                raise err(f"tensor `{name.id}` used as an index", name.span,
                          "indices are affine expressions of loop variables and sizes")
            if name.id not in loop_vars and name.id not in self.scope.sizes():
                known = sorted(loop_vars) + self.scope.sizes()
                raise err(f"unknown name `{name.id}` in an index", name.span,
                          _did_you_mean(name.id, known) + "an index uses loop variables, sizes and constants")
        try:
            return to_affine(index, loop_vars, self.scope.size_of)
        except NotAffine as bad:
            raise err(f"non-affine index: {bad.reason}", bad.span, bad.hint) from None

    def _value(self, expr: s.Expr) -> None:
        if isinstance(expr, s.Access):
            self.access(expr, write=False)
        elif isinstance(expr, s.Name):
            self._value_name(expr)
        elif isinstance(expr, s.Call):
            self._call(expr)
        elif isinstance(expr, s.BinOp) and expr.op == "%":
            raise err("`%` is not defined on tensor values", expr.span,
                      "`%` is the integer modulo of sizes and indices (`X[i % 4]`); on values use + - * / and "
                      "functions such as max, exp, sqrt")
        for child in () if isinstance(expr, s.Access) else children(expr):
            self._value(child)

    def _value_name(self, name: s.Name) -> None:
        if name.id in self.scope.tensors:
            t = self.scope.tensors[name.id]
            raise err(f"tensor `{name.id}` used without indices", name.span,
                      f"read one element at a time: {_template(t)}")
        if name.id not in {c.var for c in self.loops}:
            try:
                self.scope.size_of(name)
            except TilecError:
                known = [c.var for c in self.loops] + self.scope.sizes() + list(self.scope.tensors)
                raise err(f"unknown name `{name.id}`", name.span,
                          _did_you_mean(name.id, known) + "a value is a tensor element, a loop variable, a size "
                          "or a constant") from None

    def _call(self, call: s.Call) -> None:
        if call.fn not in FUNCTIONS:
            raise err(f"unknown function `{call.fn}`", _name_span(call),
                      _did_you_mean(call.fn, list(FUNCTIONS)) + "functions: " + ", ".join(FUNCTIONS))
        want = FUNCTIONS[call.fn]
        if len(call.args) != want:
            raise err(f"`{call.fn}` takes {want} argument{'s' * (want != 1)}, not {len(call.args)}", call.span,
                      f"write {call.fn}({', '.join('ab'[:want])})")

    def _reads_written(self, st: s.Assign) -> None:
        if st.op in REDUCE_OPS and st.target.tensor not in self.written:
            raise err(f"`{st.target.tensor}` is updated with `{st.op}` before anything is written to it",
                      st.span, f"initialise it first, e.g. `{_example(st)} = {_identity(st.op)}` before the loop")
        for acc in _accesses(st.value):
            t = self.scope.tensors[acc.tensor]
            if t.kind != "input" and acc.tensor not in self.written and acc.tensor != st.target.tensor:
                raise err(f"`{acc.tensor}` is read before anything is written to it", _name_span(acc),
                          f"write `{acc.tensor}` in an earlier statement; {t.kind} tensors start undefined")
            if t.kind != "input" and acc.tensor == st.target.tensor and acc.tensor not in self.written:
                raise err(f"`{acc.tensor}` reads itself before anything is written to it", _name_span(acc),
                          f"initialise `{acc.tensor}` in an earlier statement")


def _no_tensors_or_calls_bound(expr: s.Expr) -> None:
    if isinstance(expr, (s.Access, s.Call)):
        raise err("a loop bound may only use sizes and constants", expr.span, "loop bounds are sizes")
    for child in children(expr):
        _no_tensors_or_calls_bound(child)


def _source_text(node: s.Access | s.Call) -> str:
    sp = node.span
    if sp.line == sp.end_line and sp.line > 0:
        return sp.line_text()[sp.col - 1:sp.end_col - 1]
    return node.tensor if isinstance(node, s.Access) else node.fn + "(...)"


def _accesses(expr: s.Expr) -> list[s.Access]:
    if isinstance(expr, s.Access):
        return [expr]
    return [a for c in children(expr) for a in _accesses(c)]


def _name_span(node: s.Access | s.Call) -> Span:
    sp = node.span
    name = node.tensor if isinstance(node, s.Access) else node.fn
    return Span(sp.file, sp.line, sp.col, sp.line, sp.col + len(name), sp.source)


def _template(t: Tensor) -> str:
    return f"{t.name}[{', '.join('ijklmnpq'[d] for d in range(len(t.shape)))}]"


def _example(st: s.Assign) -> str:
    line = st.span.line_text()
    return line[st.target.span.col - 1:st.target.span.end_col - 1] if st.target.span.line == st.span.line else \
        st.target.tensor + "[...]"


def _identity(op: str) -> str:
    return {"+=": "0", "max=": "-inf", "min=": "inf"}[op]


# ---- entry point ----------------------------------------------------------------------------------------------------


def check(kernel: s.Kernel) -> Facts:
    """All checks that need no concrete sizes; raises TilecError for the first mistake found."""
    scope = Scope(kernel)
    _declare_params(scope)
    _declare_lets(scope)
    for p in kernel.params:
        for dim in p.type.shape:
            _size_poly(dim, scope)
    _declare_decls(scope)
    _check_outputs(scope)
    _check_defaults(scope)
    _check_assumes(scope)
    walker = Walker(scope)
    walker.stmts(kernel.body)
    for name in kernel.outputs:
        if name not in walker.written:
            span = dict(zip(kernel.outputs, kernel.output_spans or [kernel.span] * len(kernel.outputs)))[name]
            raise err(f"output `{name}` is never written", span, f"assign to `{name}` in the kernel body")
    return Facts(kernel, tuple(scope.symbols), dict(scope.lets), dict(scope.tensors), tuple(walker.sites))
