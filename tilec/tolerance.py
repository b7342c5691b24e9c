"""How far a kernel's output may be from the reference evaluator's: ONE policy for `tilec run`, the tuner's
verification and the fuzzer.

Both sides compute in float32 (the language's arithmetic, PSUM's accumulation) from the same rounded inputs, so
they differ only by
  * the order of an accumulation of L terms: at most about L units of float32 roundoff of the largest partial
    sum (a bound, usually far from reached);
  * a final rounding to the output dtype: when the float32 values differ at all, they may round to neighbouring
    values, one output ulp apart;
  * an intermediate tensor rounded to a narrower dtype after an accumulation or an engine function (exp, log,
    rsqrt, ...: approximations on the engines, an ulp apart from the correctly rounded reference): the same, one
    ulp of that dtype, carried to the output (its gain is at most the output's magnitude for the element-wise ops
    of the language).
The scale is the output's largest magnitude (at least 1): the inputs are signed, so elements near 0 carry no
relative accuracy. A wrong tile, tap or offset gives errors of the order of the values themselves, far above this.
"""
from __future__ import annotations

import math

import numpy as np

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
        kids = [getattr(e, a) for a in ("x", "lhs", "rhs") if hasattr(e, a)] + list(getattr(e, "args", ()))
        return set().union(*(reads(k) for k in kids)) if kids else set()

    def names(e) -> set[str]:
        if isinstance(e, sx.Name):
            return {e.id}
        kids = [getattr(e, a) for a in ("x", "lhs", "rhs") if hasattr(e, a)] + list(getattr(e, "args", ()))
        kids += list(getattr(e, "indices", ()))
        return set().union(*(names(k) for k in kids)) if kids else set()

    def conversions(e) -> set[str]:
        own = {e.fn} if isinstance(e, sx.Call) and e.fn in UNIT else set()
        kids = [getattr(e, a) for a in ("x", "lhs", "rhs") if hasattr(e, a)] + list(getattr(e, "args", ()))
        return own.union(*(conversions(k) for k in kids)) if kids else own

    def approximate(e) -> bool:
        """An engine function other than relu/abs (exp, log, rsqrt, ...): an approximation on the engines, so the two
        sides' fp32 values may differ by an ulp and a narrow store of them round to neighbouring values."""
        fn = function(e.fn) if isinstance(e, sx.Call) else None
        if fn is not None and fn.instr == "activation" and fn.name not in EXACT_FUNCTIONS:
            return True
        kids = [getattr(e, a) for a in ("x", "lhs", "rhs") if hasattr(e, a)] + list(getattr(e, "args", ()))
        return any(approximate(k) for k in kids)

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
            indexed = set().union(*(names(i) for i in stmt.target.indices)) if stmt.target.indices else set()
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


def check_outputs(program, got: dict, want: dict) -> list[str]:
    """The outputs of `got` that differ from the reference `want` beyond `tolerance`: one message each."""
    budget = program_budget(program)
    bad = []
    for name, ref in want.items():
        acc_len, inter = budget.get(name, (1, None))
        tol = tolerance(np.asarray(ref).dtype, acc_len, scale_of(ref), inter)
        err = max_error(got[name], ref) if name in got else math.inf
        if not err <= tol:
            bad.append(f"{name}: max |kernel - reference| {err:.3g} > tolerance {tol:.3g}")
    return bad
