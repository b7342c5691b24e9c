"""How far a kernel's output may be from the reference evaluator's: ONE policy for `tilec run`, the tuner's
verification and the fuzzer (`mismatches`).

Both sides compute in float32 (the language's arithmetic, PSUM's accumulation) from the same rounded inputs, so
they differ only by
  * the order of an accumulation of L terms: at most about L units of float32 roundoff of the largest partial
    sum (a bound, usually far from reached);
  * a final rounding to the output dtype: when the float32 values differ at all, they may round to neighbouring
    values, one output ulp apart (`tolerance`: these two, at the output's largest magnitude, at least 1: the
    inputs are signed, so elements near 0 carry no relative accuracy);
  * an intermediate rounded to f16/bf16 whose float32 value differs at all between the sides (after an
    accumulation, a division, an engine function such as exp, log, rsqrt: approximations on the engines): it may
    be its neighbour, one spacing of its dtype away, and that difference reaches the output with whatever gain
    the program's values give it: a mean's ulp is multiplied by rsqrt(var + eps) in a layernorm of near-equal
    values, a conv's large f16 intermediate is averaged into a smaller output. `error_bounds` computes this gain
    per element by a forward error analysis that the reference evaluator runs on the program's own values.
  * a sum's computed factor beside a 16-bit read, in a sum rounded to that same dtype (`O[i, d] += exp(S[i, t] -
    m[i]) / z[i] * V[t, d]`, O and V bf16): a kernel may carry the factor in that dtype, as TensorE multiplies
    operands of one dtype (the attention head's P in V's bf16, attention_find.weights): one spacing of the
    factor per term (`rounded_operand`), whose sum is of the order of the output's own rounding when the terms do
    not cancel.
A wrong tile, tap or offset gives errors of the order of the values themselves, far above this.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from tilec.lang.checker import children

# unit roundoff (half the spacing of numbers in [1, 2)) per dtype name, both spellings
UNIT = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8}
UNIT.update({"float32": UNIT["f32"], "float16": UNIT["f16"], "bfloat16": UNIT["bf16"]})


EXACT_FUNCTIONS = ("relu", "abs")  # the engine functions whose fp32 result is exact (max(x, 0), |x|)


def unit_roundoff(dtype: object) -> float:
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return UNIT.get(name, UNIT["f32"])


def tolerance(out_dtype: object, acc_len: int = 1, scale: float = 1.0, inter_dtype: object | None = None) -> float:
    """Absolute tolerance for one output: `acc_len` terms accumulated along the longest chain of reductions that
    feeds it, `scale` its largest reference magnitude, `inter_dtype` the narrowest dtype an accumulated
    intermediate is rounded to on the way (None: none narrower than the output)."""
    out_u = unit_roundoff(out_dtype)
    inter_u = unit_roundoff(inter_dtype) if inter_dtype is not None else 0.0
    rel = 2.0 * out_u + (2.0 * inter_u if inter_u > out_u else 0.0) + 2.0 * (max(1, acc_len) + 4) * UNIT["f32"]
    return max(1.0, scale) * rel


def rounded_operand(stmt, dtypes: dict[str, str]) -> str | None:
    """The 16-bit dtype a kernel may round the computed factors of `stmt`'s terms to (see the module's text): a `+=`
    into a tensor of that dtype whose term multiplies a plain read of a tensor of that dtype by a factor that is
    not a plain read; else None."""
    from tilec.lang import syntax as sx

    narrow = dtypes.get(stmt.target.tensor)
    if stmt.op != "+=" or narrow not in ("f16", "bf16"):
        return None
    factors = _factors(stmt.value, sx)
    plain = [f for f in factors if isinstance(f, sx.Access)]
    computed = [f for f in factors if not isinstance(f, (sx.Access, sx.Num, sx.Name))]
    return narrow if computed and any(dtypes.get(f.tensor) == narrow for f in plain) else None


def max_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest |got - want| in float64; inf for a NaN/inf on one side only (or different shapes), 0 where both
    sides hold the same non-finite value."""
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if g.shape != w.shape:
        return math.inf
    if g.size == 0:
        return 0.0
    same = (g == w) | (np.isnan(g) & np.isnan(w))
    diff = np.where(same, 0.0, np.abs(g - w))
    return float(np.nan_to_num(diff, nan=math.inf).max())


def scale_of(want: np.ndarray) -> float:
    w = np.asarray(want, np.float64)
    finite = w[np.isfinite(w)]
    return float(np.abs(finite).max()) if finite.size else 1.0


def program_budget(program) -> dict[str, tuple[int, str | None]]:
    """Per output of a loaded program: (acc_len, inter_dtype) for `tolerance`, read from its statements. acc_len
    of a statement = product of the extents of its enclosing loops that do not index its target (when it
    accumulates), plus the largest acc_len among the tensors it reads; inter_dtype = the narrowest dtype of a
    tensor on the way whose value derives from an accumulation (the two sides may sum in another order) or from an
    engine function other than relu/abs."""
    from tilec.lang import syntax as sx
    from tilec.lang.functions import function

    acc: dict[str, int] = {}
    narrow: dict[str, str | None] = {}
    derived: set[str] = set()  # tensors computed from an accumulation (+=, max=, min=), directly or not
    dtypes = {name: t.dtype for name, t in program.tensors.items()}

    def reads(e) -> set[str]:
        if isinstance(e, sx.Access):
            return {e.tensor}.union(*(reads(i) for i in e.indices))
        return set().union(*(reads(k) for k in children(e)))

    def conversions(e) -> set[str]:
        own = {e.fn} if isinstance(e, sx.Call) and e.fn in UNIT else set()
        return own.union(*(conversions(k) for k in children(e)))

    def approximate(e) -> bool:
        """An engine function other than relu/abs (exp, log, rsqrt, ...): an approximation on the engines, so the two
        sides' fp32 values may differ by an ulp and a narrow store of them round to neighbouring values."""
        fn = function(e.fn) if isinstance(e, sx.Call) else None
        if fn is not None and fn.instr == "activation" and fn.name not in EXACT_FUNCTIONS:
            return True
        return any(approximate(k) for k in children(e))

    def narrower(a: str | None, b: str | None) -> str | None:
        if a is None or b is None:
            return a or b
        return a if unit_roundoff(a) > unit_roundoff(b) else b

    def visit(stmt, loops: list[tuple[str, int]]) -> None:
        if isinstance(stmt, sx.Loop):
            extent = _extent(stmt, program.sizes)
            for s in stmt.body:
                visit(s, loops + [(stmt.var, extent)])
            return
        target = stmt.target.tensor
        srcs = reads(stmt.value) | ({target} if stmt.op != "=" else set())
        own = 1
        if stmt.op != "=":
            indexed = set().union(*(_names(i) for i in stmt.target.indices)) if stmt.target.indices else set()
            own = math.prod(n for v, n in loops if v not in indexed)
        before = max((acc.get(r, 1) for r in srcs if r != target), default=1)
        acc[target] = max(acc.get(target, 1), own + before - 1 if own > 1 else before)
        inter = None
        for r in srcs:
            inter = narrower(inter, narrow.get(r))
        if stmt.op != "=" or derived & srcs or approximate(stmt.value):  # such values may round to a neighbour
            derived.add(target)
            inter = narrower(inter, dtypes.get(target))
            for dtype in conversions(stmt.value):  # so may its f16(..)/bf16(..) conversions
                inter = narrower(inter, dtype)
        inter = narrower(inter, rounded_operand(stmt, dtypes))
        narrow[target] = narrower(narrow.get(target), inter)

    for stmt in program.kernel.body:
        visit(stmt, [])
    return {o: (acc.get(o, 1), narrow.get(o)) for o in program.kernel.outputs}


def _extent(loop, sizes: dict[str, int]) -> int:
    try:
        return max(1, _size(loop.stop, sizes) - _size(loop.start, sizes))
    except (KeyError, ZeroDivisionError, TypeError):  # unknown here: counting it as 1 only tightens nothing else
        return 1


def _size(e, sizes: dict[str, int]) -> int:
    from tilec.lang import syntax as sx

    if isinstance(e, sx.Num):
        return int(e.value)
    if isinstance(e, sx.Name):
        return int(sizes[e.id])
    if isinstance(e, sx.Neg):
        return -_size(e.x, sizes)
    a, b = _size(e.lhs, sizes), _size(e.rhs, sizes)
    return {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else a // b, "%": a % b}[e.op]


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """An output beyond its tolerance: |kernel - reference| and the tolerance at its worst element."""
    name: str
    error: float
    tolerance: float

    def __str__(self) -> str:
        return f"{self.name}: max |kernel - reference| {self.error:.3g} > tolerance {self.tolerance:.3g}"


def mismatches(program, got: dict, want: dict, inputs: dict | None = None,
               bounds: dict[str, np.ndarray] | None = None) -> list[Mismatch]:
    """The outputs of `got` that differ from the reference `want` beyond the tolerance. The tolerance of an element
    is `tolerance` (its output's rounding and summation order) plus, given the inputs (or their `error_bounds`),
    how far the roundings of the program's narrow intermediates may legitimately carry it; without them, one ulp
    of the narrowest such intermediate at the output's scale (a cruder rule)."""
    budget = program_budget(program)
    if bounds is None and inputs is not None:
        bounds = error_bounds(program, inputs)
    bad = []
    for name, ref in want.items():
        acc_len, inter = budget.get(name, (1, None))
        base = tolerance(np.asarray(ref).dtype, acc_len, scale_of(ref), inter if bounds is None else None)
        allowed = base + bounds[name] if bounds is not None and name in bounds else np.float64(base)
        err, tol = worst(got[name], ref, allowed) if name in got else (math.inf, base)
        if not err <= tol:
            bad.append(Mismatch(name, err, tol))
    return bad


def check_outputs(program, got: dict, want: dict, inputs: dict | None = None,
                  bounds: dict[str, np.ndarray] | None = None) -> list[str]:
    """`mismatches`, one message each."""
    return [str(m) for m in mismatches(program, got, want, inputs, bounds)]


def worst(got: np.ndarray, want: np.ndarray, allowed) -> tuple[float, float]:
    """(|got - want|, its tolerance) at the element furthest beyond its tolerance (`allowed`: a number or one per
    element); a NaN/inf on one side only is an infinite error, whatever the tolerance."""
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if g.shape != w.shape:
        return math.inf, float(np.max(allowed))
    if g.size == 0:
        return 0.0, float(np.max(allowed)) if np.size(allowed) else 0.0
    same = (g == w) | (np.isnan(g) & np.isnan(w))
    diff = np.nan_to_num(np.where(same, 0.0, np.abs(g - w)), nan=math.inf)
    tol = np.broadcast_to(np.asarray(allowed, np.float64), diff.shape)
    if np.isinf(diff).any():
        k = int(np.argmax(np.isinf(diff).reshape(-1)))
    else:
        with np.errstate(invalid="ignore"):
            k = int(np.argmax(np.nan_to_num(diff - tol, nan=-math.inf).reshape(-1)))
    return float(diff.reshape(-1)[k]), float(tol.reshape(-1)[k])


# ---- the gain of each intermediate's rounding: forward error analysis on the reference's own values ---------------

ERR = "\x00err"  # suffix of the name of a tensor's error bound (no identifier of the language contains NUL)
ON = 1e30  # e * ON is huge wherever e > 0: min(spacing, e * ON) = "the spacing where the value may differ at all"


def error_bounds(program, inputs: dict, against: str = "kernel") -> dict[str, np.ndarray]:
    """Per element of every output: a first-order bound on how far a correct computation of the program may differ
    from the reference evaluator's, beyond the output's own rounding and summation order (`tolerance`). It is
    the forward error analysis of the program, run by the reference evaluator itself on the same inputs: every
    statement `T[..] op= e` gets a companion `T_err[..] op= D(e)` that bounds the error of its value from the
    errors of what it reads, with the gains of the actual values (|b| * Da + |a| * Db for a * b, Da / |b| + ...
    for a / b, the function's own change |f(a +- Da) - f(a)| for f(a), the sum of the terms' errors for `+=`, the
    largest for max=/min=). A rounding is an error source where the two sides may round differently: a read of an
    f16/bf16 tensor (or an f16()/bf16() conversion) whose value carries an error of its own may be its neighbour,
    one spacing of that dtype away, and its gain downstream is whatever the values make it (a mean amplified by
    rsqrt(var + eps) under cancellation, a conv's large intermediate averaged into a small output).
    against="kernel": the fp32 operations two correct implementations may do differently (the order of a sum, a
    division done as a multiplication by the reciprocal, an engine's approximation of exp, log, rsqrt, ...);
    against="formula": a float64 formula, which differs from the float32 reference at every operation."""
    import warnings

    from tilec.lang import api
    from tilec.lang import evaluator

    bound = api.bind_inputs(program, inputs)
    if not _narrow(bound) and not _amplifies(bound):  # float32 without gains: `tolerance` alone (the order of sums
        return {o: np.zeros(bound.tensors[o].shape) for o in bound.kernel.outputs}  # at the output's scale) bounds it
    analysis = _Analysis(bound, against)
    for stmt in bound.kernel.body:  # counts the error terms of every statement, then builds them
        analysis.statements(stmt, [])
    body = tuple(s for stmt in bound.kernel.body for s in analysis.statements(stmt, []))
    parts = {o: [_part(o, k) for k in range(analysis.parts.get(o, 1))] for o in bound.kernel.outputs}
    kernel = dataclasses.replace(bound.kernel, body=body, outputs=tuple(p for o in parts for p in parts[o]))
    tensors = {n: (t.dtype, t.shape, t.kind) for n, t in bound.tensors.items()}
    tensors.update({_part(n, k): ("f32", t.shape, "temp") for n, t in bound.tensors.items() if t.kind != "input"
                    for k in range(analysis.parts.get(n, 1))})
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        out = evaluator.run(kernel, bound.sizes, tensors, inputs)
        total = {o: sum(np.asarray(out[p], np.float64) for p in parts[o]) for o in parts}
    # NaN: a value within its own error of a function's singularity (log, rsqrt of ~0): no bound there
    return {o: np.nan_to_num(t, nan=math.inf, posinf=math.inf) for o, t in total.items()}


def _narrow(program) -> bool:
    """Whether any computed tensor, or a conversion in a statement, is f16/bf16."""
    from tilec.lang import syntax as sx

    def calls(e) -> bool:
        if isinstance(e, sx.Call) and e.fn in ("f16", "bf16"):
            return True
        return any(calls(k) for k in children(e))

    return (any(t.dtype != "f32" for t in program.tensors.values() if t.kind != "input")
            or any(calls(v) for v in _values(program.kernel.body)))


def _values(body):
    """The value expression of every statement under `body`, in program order."""
    from tilec.lang import syntax as sx

    for st in body:
        if isinstance(st, sx.Loop):
            yield from _values(st.body)
        else:
            yield st.value


def _amplifies(program) -> bool:
    """Whether a computed value's error may grow on its way to an output: a computed tensor read inside a function
    other than relu/abs (rsqrt of a variance), as a divisor, or in a product with another computed tensor (a
    layernorm's `d * r`: the mean's roundoff in d times rsqrt(var + eps), large under cancellation)."""
    from tilec.lang import syntax as sx

    computed = {n for n, t in program.tensors.items() if t.kind != "input"}

    def reads(e) -> bool:
        if isinstance(e, sx.Access):
            return e.tensor in computed
        return any(reads(k) for k in children(e))

    def gains(e) -> bool:
        if isinstance(e, sx.Call) and e.fn not in EXACT_FUNCTIONS and e.fn not in ("max", "min", "f32") \
                and any(reads(a) for a in e.args):
            return True
        if isinstance(e, sx.BinOp) and e.op == "/" and reads(e.rhs):
            return True
        if isinstance(e, sx.BinOp) and e.op == "*" and sum(reads(f) for f in _factors(e, sx)) > 1:
            return True
        return any(gains(k) for k in children(e))

    return any(gains(v) for v in _values(program.kernel.body))


def _part(tensor: str, k: int) -> str:
    """The k-th part of a tensor's error bound: one per error term of its `+=` statements, each accumulated on
    its own (the evaluator opens a loop only when two statements under it do not accumulate into one tensor)."""
    return f"{tensor}{ERR}{k}"


class _Analysis:
    """Builds the error statements (syntax trees the reference evaluator runs)."""

    def __init__(self, program, against: str) -> None:
        from tilec.lang import syntax as sx

        self.sx, self.program, self.formula = sx, program, against == "formula"
        self.dtypes = {n: t.dtype for n, t in program.tensors.items()}
        self.inputs = {n for n, t in program.tensors.items() if t.kind == "input"}
        self.parts: dict[str, int] = {}  # tensor -> how many error parts (the most terms of one of its statements)
        self.accumulated: set[str] = set()  # tensors some +=, max=, min= stores into (rounded after the reduction)

    # expression helpers
    def num(self, v: float):
        return self.sx.Num(float(v))

    def call(self, fn: str, *args):
        return self.sx.Call(fn, tuple(args))

    def add(self, *terms):
        terms = [t for t in terms if t is not None]
        if not terms:
            return None
        out = terms[0]
        for t in terms[1:]:
            out = self.sx.BinOp("+", out, t)
        return out

    def mul(self, *factors):
        if any(f is None for f in factors):
            return None
        out = factors[0]
        for f in factors[1:]:
            out = self.sx.BinOp("*", out, f)
        return out

    def absolute(self, e):
        return self.call("abs", e)

    def source(self, value, ulps: float):
        """An fp32 operation the two sides may compute differently: `ulps` float32 units of its result."""
        return self.mul(self.num(ulps * UNIT["f32"]), self.absolute(value))

    def flip(self, value, err, dtype: str):
        """The rounding of `value` to `dtype`: its neighbour, one spacing (2u|v|) away, wherever it has an error."""
        if dtype == "f32" or (err is None and not self.formula):
            return None
        spacing = self.mul(self.num(2.0 * UNIT[dtype]), self.absolute(value))
        if self.formula or err is None:  # a float64 formula rounds its own way everywhere
            return spacing
        return self.call("min", spacing, self.mul(err, self.num(ON)))

    # D(e): an expression bounding the error of e's value (None: exact on both sides)
    def d(self, e):
        sx = self.sx
        if isinstance(e, (sx.Num, sx.Name)):
            return None
        if isinstance(e, sx.Access):
            if e.tensor in self.inputs:
                return None
            fill = 0.0 if e.fill is not None else None
            err = self.add(*(sx.Access(_part(e.tensor, k), e.indices, e.span, fill)
                             for k in range(self.parts.get(e.tensor, 1))))
            if e.tensor not in self.accumulated:  # its `=` stores counted their rounding already
                return err
            return self.add(err, self.flip(e, err, self.dtypes[e.tensor]))
        if isinstance(e, sx.Neg):
            return self.d(e.x)
        if isinstance(e, sx.BinOp):
            return self.binop(e)
        return self.function(e)

    def binop(self, e):
        da, db = self.d(e.lhs), self.d(e.rhs)
        own = self.source(e, 2.0) if self.formula or e.op == "/" else None
        if e.op in "+-%":
            return self.add(da, db, own)
        if e.op == "*":
            a, b = self.absolute(e.lhs), self.absolute(e.rhs)
            return self.add(self.mul(a, db), self.mul(da, b), self.mul(da, db), own)
        # a / b: (Da + |a / b| Db) / |b|
        scaled = self.add(da, self.mul(self.absolute(e), db))
        return self.add(self.sx.BinOp("/", scaled, self.absolute(e.rhs)) if scaled is not None else None, own)

    def function(self, e):
        from tilec.lang.functions import function

        fn = function(e.fn)
        das = [self.d(a) for a in e.args]
        if fn is None or fn.instr == "tensor_tensor":  # max, min: |max(a', b') - max(a, b)| <= max(Da, Db)
            known = [x for x in das if x is not None]
            return known[0] if len(known) == 1 else self.call("max", *known) if known else None
        da = das[0]
        if fn.instr == "cast":
            return self.add(da, self.flip(e, da, e.fn))
        if fn.name in EXACT_FUNCTIONS:  # relu, abs: Lipschitz 1, exact in fp32
            return da
        own = self.source(e, 2.0 if self.formula else 4.0)  # the engines' approximations: a few fp32 ulps
        if da is None:
            return own
        arg = e.args[0]
        up = self.call(e.fn, self.sx.BinOp("+", arg, da))
        down = self.call(e.fn, self.sx.BinOp("-", arg, da))
        change = self.call("max", self.absolute(self.sx.BinOp("-", up, e)), self.absolute(self.sx.BinOp("-", down, e)))
        return self.add(change, own)

    # statements: each original statement, preceded by its error statement(s) (which read the values before it)
    def statements(self, stmt, loops: list):
        sx = self.sx
        if isinstance(stmt, sx.Loop):
            extent = _extent(stmt, self.program.sizes)
            body = tuple(s for child in stmt.body for s in self.statements(child, loops + [(stmt.var, extent)]))
            return [dataclasses.replace(stmt, body=body)]
        name, indices = stmt.target.tensor, stmt.target.indices
        if stmt.op != "=":
            self.accumulated.add(name)
        if stmt.op == "+=":
            indexed = set().union(*(_names(i) for i in indices)) if indices else set()
            terms = self.sum_terms(stmt.value, math.prod(n for v, n in loops if v not in indexed)) or [self.num(0)]
            narrow = rounded_operand(stmt, self.dtypes)
            if narrow is not None:  # its computed factors carried in `narrow`: one spacing of them per term
                terms.append(self.mul(self.num(2.0 * UNIT[narrow]), *map(self.absolute, _factors(stmt.value, sx))))
            op = "+="
        elif stmt.op == "=":  # the error of the value, and of its rounding to the target's dtype
            err = self.d(stmt.value)
            # the initial value of an accumulation (a bias): a kernel may add it to the sum in fp32 (PSUM) and
            # round once, where the evaluator rounds it first: one spacing of it either way
            flip = self.flip(stmt.value, self.num(1) if name in self.accumulated else err, self.dtypes[name])
            terms, op = [self.add(err, flip) or self.num(0)], "="
        else:  # max=, min=: the largest error of the terms
            terms, op = [self.d(stmt.value) or self.num(0)], "max="
        self.parts[name] = max(self.parts.get(name, 1), len(terms))
        out = [sx.Assign(sx.Access(_part(name, k), indices, stmt.target.span), op, t, stmt.span)
               for k, t in enumerate(terms)]
        if stmt.op == "=":  # the other parts start again from 0
            out += [sx.Assign(sx.Access(_part(name, k), indices, stmt.target.span), "=", self.num(0), stmt.span)
                    for k in range(len(terms), self.parts[name])]
        return out + [stmt]

    def sum_terms(self, value, length: int) -> list:
        """The error terms of `T += value`, each a product where `value` is one (so the evaluator contracts it as it
        contracts the statement itself, without the im2col-sized array a sum of products would need): the first-
        order term of each factor, their pairwise products, and the order of the summation (~sqrt(L) fp32 units
        of the sum of |terms|, both sides)."""
        factors = _factors(value, self.sx)
        if len(factors) == 1:
            return [t for t in (self.d(value), self.source(value, 2.0 * math.sqrt(length))) if t is not None]
        errs = [self.d(f) for f in factors]
        absf = [self.absolute(f) for f in factors]
        terms = [self.mul(self.num(2.0 * math.sqrt(length) * UNIT["f32"]), *absf)]
        for i, di in enumerate(errs):
            if di is not None:
                terms.append(self.mul(*absf[:i], di, *absf[i + 1:]))
                for j in range(i + 1, len(factors)):
                    if errs[j] is not None:
                        terms.append(self.mul(*[x for k, x in enumerate(absf) if k not in (i, j)], di, errs[j]))
        return terms


def _factors(e, sx) -> list:
    """A product's factors; a quotient's are the dividend's and the divisor's reciprocal, a computed factor
    (`X[b, s, d] * m[b, s] / cnt[b]`: X beside the computed m / cnt, as masked mean pooling carries it); a widened
    read is the read."""
    if isinstance(e, sx.BinOp) and e.op == "*":
        return _factors(e.lhs, sx) + _factors(e.rhs, sx)
    if isinstance(e, sx.BinOp) and e.op == "/":
        return _factors(e.lhs, sx) + [sx.BinOp("/", sx.Num(1.0, e.span), e.rhs, e.span)]
    if isinstance(e, sx.Call) and e.fn == "f32" and len(e.args) == 1 and isinstance(e.args[0], sx.Access):
        return [e.args[0]]  # (a 16-bit read widened, lang/widen.py: exact, the read itself)
    return [e]


def _names(e) -> set[str]:
    from tilec.lang import syntax as sx

    if isinstance(e, sx.Name):
        return {e.id}
    return set().union(*(_names(k) for k in children(e)))
