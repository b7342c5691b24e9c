"""Random valid .tl programs, each with an independent NumPy formula of its outputs.

    generate(seed) -> Case(family, text, formula)

A Case is a whole program (kernel header, defaults, lets, declarations, statements) drawn from one of the families
the compiler has operations for: element-wise chains with broadcasts and constants (every function of the language,
`/` by constants and by tensors), row reductions (sum, max, min, followed by a broadcast use), row chains written as
the examples write them (softmax, log-sum-exp, layernorm, rmsnorm: several statements through row vectors),
reductions over leading and middle dimensions, matmuls in every operand layout (C = A B, A^T B, A B^T, with bias
and relu: linear layers), 1-D and 2-D convolutions (random channels, filters, strides, bias, relu) with an optional
fused pool, pools, transposes (alone and through an intermediate) and 3-D permutes, in f32, f16 and bf16, with
comments and assumes of every comparison. tests/fuzz/test_coverage.py checks that the cases cover the grammar, the
function table, the directives and the examples' operations. Names are drawn partly from a pool of
hostile identifiers (Python keywords and builtins, the names the generated kernel and the API use). The formula
computes the outputs with NumPy from the rounded inputs in float64, written from the family's meaning rather
than from the program text, so it checks the reference evaluator itself.

Same seed, same case: the fuzzer's workers regenerate a case from its seed instead of shipping it.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

import math

import ml_dtypes
import numpy as np

DTYPES = ("f32", "f16", "bf16")
NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}

# identifiers that collide with something: Python keywords and builtins, the generated kernel's own names (nl, nki,
# np, nisa), the API's parameter names (self, name, numerics), dunder names; all valid tilec NAMEs
HOSTILE = ("self", "name", "numerics", "nl", "nki", "np", "nisa", "__import__", "__class__", "__name__", "while",
           "import", "lambda", "pass", "exec", "eval", "global", "async", "await", "del", "class", "def", "return",
           "None", "True", "print", "range", "len", "sum", "tile", "sbuf", "psum", "hbm", "tilec", "math", "kernel_",
           "result", "acc", "x_t", "inputs", "outputs", "traced", "arrays", "named", "source", "program", "_", "__",
           "i", "j", "k", "exp", "relu", "max", "min", "f32", "bf16", "float", "int", "object", "type", "dtype",
           "Ä", "ﬁ", "fi", "ядро", "x²", "x2", "a½", "Ŷ", "ι", "名前")  # Unicode: NFKC folds ﬁ to fi, x² to x2

Formula = Callable[[dict], dict]  # rounded float64 inputs by name -> outputs by name (float64, before rounding)


@dataclass
class Case:
    family: str
    text: str
    formula: Formula = field(repr=False)
    seed: int = 0
    forms: tuple[str, ...] = ()  # the variants of its family it uses (padded, dilated, depthwise, shift, ...)


class Names:
    """Fresh identifiers for one program: plain ones (A, N, i...) or, a third of the time, hostile ones."""

    def __init__(self, rng: random.Random, hostile: float = 0.3) -> None:
        self.rng, self.hostile, self.used = rng, hostile, set()

    def __call__(self, plain: str) -> str:
        for _ in range(50):
            if self.rng.random() < self.hostile:
                cand = self.rng.choice(HOSTILE)
            elif self.rng.random() < 0.5:
                cand = plain
            else:
                cand = f"{plain}{self.rng.randrange(10)}"
            if cand not in self.used:
                self.used.add(cand)
                return cand
        cand = f"{plain}_{len(self.used)}"
        self.used.add(cand)
        return cand


def size(rng: random.Random, hi: int = 600) -> int:
    """Small, awkward and round sizes: 1, primes, 2^k, 2^k +- 1, 96, random up to hi."""
    pool = [1, 2, 3, 4, 5, 7, 8, 16, 23, 32, 64, 96, 127, 128, 129, 130, 200, 256, 257, 344, 512, 521]
    v = rng.choice(pool) if rng.random() < 0.6 else rng.randint(1, hi)
    return max(1, min(v, hi))


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    return np.asarray(x, np.float64).astype(NP[dtype]).astype(np.float64)


# ---- element-wise expressions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    tensor: str | None  # None: a constant
    dims: tuple[int, ...] = ()  # which loop dims index it (a broadcast reads fewer)
    const: float = 0.0
    convert: str | None = None  # read as f32(A[i]), f16(..), bf16(..): inputs of different dtypes may then meet
    reverse: tuple[int, ...] = ()  # the axes read backwards: (0,) is A[N - 1 - i, ...], (1,) A[i, M - 1 - j]


@dataclass(frozen=True)
class Node:
    op: str  # + - * /c (by a constant) / (by a tensor) neg max min, or a function of UNARY
    args: tuple


_erf = np.vectorize(math.erf, otypes=[np.float64])
# the language's one-argument functions, with their meaning written here (float64, rounded once to float32) rather
# than taken from tilec/lang/functions.py, so the formula checks the reference; tests/fuzz/test_coverage.py fails
# when the language gains a function this table lacks
UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda x: np.maximum(x, 0.0),
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "reciprocal": lambda x: 1.0 / x,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "abs": np.abs,
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "softplus": lambda x: np.log1p(np.exp(x)),
    "mish": lambda x: x * np.tanh(np.log1p(np.exp(x))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x))),
}
POSITIVE = ("log", "sqrt", "rsqrt", "reciprocal")  # their argument is made positive: f(abs(x) + 0.5)


def _const(rng: random.Random) -> float:
    return rng.choice([0.5, 2, 3, -1, 0.25, 1.5, 4, 0.3333333333333333, -2.0, 1])


def gen_expr(rng: random.Random, leaves: list[Leaf], depth: int) -> object:
    if depth <= 0 or rng.random() < 0.3:
        return rng.choice(leaves)
    op = rng.choice(["+", "-", "*", "/c", "/", "neg", "relu", "exp", "max", "min", "+", "*", "fn", "fn"])
    if op == "fn":
        op = rng.choice([f for f in UNARY if f != "exp"])
    if op == "exp":  # keep exp's argument bounded: exp of a leaf times a small constant
        return Node("exp", (Node("*", (rng.choice([lf for lf in leaves if lf.tensor] or leaves),
                                       Leaf(None, const=rng.choice([0.5, 1, -1, 0.25])))),))
    if op in POSITIVE:
        arg = Node("+", (Node("abs", (gen_expr(rng, leaves, depth - 1),)), Leaf(None, const=0.5)))
        return Node(op, (arg,))
    if op in UNARY or op == "neg":
        return Node(op, (gen_expr(rng, leaves, depth - 1),))
    if op == "/c":
        return Node("/c", (gen_expr(rng, leaves, depth - 1), Leaf(None, const=rng.choice([2, 4, 3, 0.5, 82]))))
    if op == "/":  # a tensor denominator kept away from 0 (most of the time) so the quotient stays well-scaled
        den = gen_expr(rng, leaves, depth - 1)
        if rng.random() < 0.8:
            den = Node("+", (Node("abs", (den,)), Leaf(None, const=1)))
        return Node("/", (gen_expr(rng, leaves, depth - 1), den))
    return Node(op, (gen_expr(rng, leaves, depth - 1), gen_expr(rng, leaves, depth - 1)))


def _num(c: float) -> str:
    if float(c).is_integer():
        return str(int(c)) if c >= 0 else f"({int(c)})"
    return repr(float(c)) if c >= 0 else f"({float(c)!r})"


RANGES: dict[str, str] = {}  # loop variable -> its size symbol, for reversed reads (set before `render`)


def render(e, idx: list[str]) -> str:
    if isinstance(e, Leaf):
        if e.tensor is None:
            return _num(e.const)
        ix = [idx[d] for d in e.dims]
        for a in e.reverse:
            ix[a] = f"{RANGES[ix[a]]} - 1 - {ix[a]}"
        text = f"{e.tensor}[{', '.join(ix)}]"
        return f"{e.convert}({text})" if e.convert else text
    a = [render(x, idx) for x in e.args]
    if e.op in ("+", "-", "*"):
        return f"({a[0]} {e.op} {a[1]})"
    if e.op in ("/c", "/"):
        return f"({a[0]} / {a[1]})"
    if e.op == "neg":
        return f"(-{a[0]})"
    return f"{e.op}({', '.join(a)})"


def evaluate(e, env: dict, rank: int) -> np.ndarray:
    """float32 arithmetic, as the language defines it; a leaf is broadcast to the loop dims it is indexed by."""
    if isinstance(e, Leaf):
        if e.tensor is None:
            return np.float32(e.const)
        arr = np.asarray(env[e.tensor], np.float32)
        if e.reverse:
            arr = np.flip(arr, e.reverse)
        if e.convert:
            arr = rounded(arr, e.convert).astype(np.float32)
        shape = [1] * rank
        for axis, d in enumerate(e.dims):
            shape[d] = arr.shape[axis]
        return arr.reshape(shape)
    a = [evaluate(x, env, rank) for x in e.args]
    with np.errstate(all="ignore"):
        if e.op in UNARY:
            return np.asarray(UNARY[e.op](np.asarray(a[0], np.float64)), np.float32)
        return {"+": lambda: a[0] + a[1], "-": lambda: a[0] - a[1], "*": lambda: a[0] * a[1],
                "/c": lambda: a[0] / a[1], "/": lambda: a[0] / a[1], "neg": lambda: -a[0], "relu": lambda: np.maximum(a[0], np.float32(0)),
                "exp": lambda: np.exp(a[0]), "max": lambda: np.maximum(a[0], a[1]),
                "min": lambda: np.minimum(a[0], a[1])}[e.op]()


# ---- program text ---------------------------------------------------------------------------------------------


class Builder:
    """Collects a kernel's parts and prints it in the canonical layout."""

    def __init__(self, name: str) -> None:
        self.name, self.params, self.outs, self.defaults = name, [], [], []
        self.lets, self.decls, self.body, self.assumes = [], [], [], []

    def param(self, name: str, dtype: str, dims: list[str]) -> None:
        self.params.append(f"{name}: {dtype}[{', '.join(dims)}]")

    def decl(self, name: str, dtype: str, dims: list[str], out: bool = False) -> None:
        self.decls.append(f"  {name}: {dtype}[{', '.join(dims)}]")
        if out:
            self.outs.append(name)

    def loops(self, pairs: list[tuple[str, str]], lines: list[str], indent: int = 1) -> None:
        pad = "  " * indent
        head = ", ".join(f"{v} in 0..{e}" for v, e in pairs)
        self.body.append(f"{pad}for {head}:")
        self.body += [f"{pad}  {line}" for line in lines]

    def text(self) -> str:
        out = [f"kernel {self.name}({', '.join(self.params)}) -> {', '.join(self.outs)}"]
        out.append("  default " + ", ".join(f"{k} = {v}" for k, v in self.defaults))
        if self.assumes:
            out.append("  assume " + ", ".join(self.assumes))
        if self.lets:
            out.append("  let " + ", ".join(f"{k} = {v}" for k, v in self.lets))
        return "\n".join(out + self.decls + self.body) + "\n"


# ---- families -------------------------------------------------------------------------------------------------


def eltwise(rng: random.Random, nm: Names, chain: bool = False) -> Case:
    rank = rng.choice([1, 1, 2, 2, 2, 3])
    cap = {1: 4096, 2: 600, 3: 64}[rank]
    ext = [size(rng, cap) for _ in range(rank)]
    while np.prod(ext) > 40000:
        ext[rng.randrange(rank)] //= 2
        ext = [max(1, e) for e in ext]
    syms = [nm("N" if d == 0 else "DMP"[d % 3]) for d in range(rank)]
    b = Builder(nm("k"))
    b.defaults = list(zip(syms, ext))
    in_dtype = rng.choice(DTYPES)
    mixed = rng.random() < 0.2  # inputs of several dtypes, each read through a conversion to one dtype
    dtypes_of: dict[str, str] = {}
    cvt = rng.choice(DTYPES) if mixed else None
    leaves, shapes = [], {}
    for _ in range(rng.randint(1, 3)):
        n = nm("A")
        flip = rng.random() < 0.05  # a flipped read (torch.flip): the first axis, the last, or both
        axes = (rng.choice([(0,), (0,), (rank - 1,), (0, rank - 1)]) if rank > 1 else (0,)) if flip else ()
        leaves.append(Leaf(n, tuple(range(rank)), convert=cvt, reverse=axes))
        shapes[n] = tuple(range(rank))
        dtypes_of[n] = rng.choice(DTYPES) if mixed else in_dtype
    if rank > 1 and rng.random() < 0.6:  # a broadcast operand: one value per row, or per column
        # in 3-D, now and then a second one over another run of the indices (group norm's mu[n, k] and g[k])
        for _ in range(2 if rank == 3 and rng.random() < 0.4 else 1):
            dims = tuple(sorted(rng.sample(range(rank), rng.randint(1, rank - 1))))
            n = nm("c")
            leaves.append(Leaf(n, dims, convert=cvt))
            shapes[n] = dims
    elif rank == 1 and rng.random() < 0.3:
        n = nm("c")
        leaves.append(Leaf(n, (0,), convert=cvt))
        shapes[n] = (0,)
    for n, dims in shapes.items():
        b.param(n, dtypes_of.get(n, rng.choice(DTYPES) if mixed else in_dtype), [syms[d] for d in dims])
    if rng.random() < 0.3:  # facts about the sizes (true ones): the checker verifies them, the compiler may use them
        d = rng.randrange(rank)
        b.assumes.append(rng.choice([f"{syms[d]} >= 1", f"{syms[d]} % {ext[d]} == 0", f"{syms[d]} <= {ext[d]}",
                                     f"{syms[d]} != {ext[d] + 1}", f"{syms[d]} < {ext[d] + 1}",
                                     f"{syms[d]} > 0"]))
    consts = [Leaf(None, const=_const(rng)) for _ in range(2)]
    expr = gen_expr(rng, leaves + consts, rng.randint(0, 3))
    if isinstance(expr, Leaf) and expr.tensor is None:
        expr = Node("+", (leaves[0], expr))
    out_dtype = rng.choice(DTYPES)
    if chain:
        t_name, t_dtype = nm("T"), rng.choice(DTYPES)
        y_name = nm("Y")
        b.decl(t_name, t_dtype, syms)
        b.decl(y_name, out_dtype, syms, out=True)
        idx1 = [nm("i") for _ in range(rank)]
        RANGES.update(zip(idx1, syms))
        b.loops(list(zip(idx1, syms)), [f"{t_name}[{', '.join(idx1)}] = {render(expr, idx1)}"])
        t_leaf = Leaf(t_name, tuple(range(rank)))
        expr2 = rng.choice([t_leaf, Node("relu", (t_leaf,)), Node("*", (t_leaf, Leaf(None, const=-1))),
                            Node("+", (t_leaf, t_leaf))])
        idx2 = [nm("j") for _ in range(rank)]
        b.loops(list(zip(idx2, syms)), [f"{y_name}[{', '.join(idx2)}] = {render(expr2, idx2)}"])

        def formula(env: dict) -> dict:
            t = rounded(np.broadcast_to(evaluate(expr, env, rank), tuple(ext)), t_dtype)
            return {y_name: np.broadcast_to(np.asarray(evaluate(expr2, {**env, t_name: t}, rank), np.float64),
                                            tuple(ext))}
    else:
        y_name = nm("Y")
        b.decl(y_name, out_dtype, syms, out=True)
        idx = [nm("i") for _ in range(rank)]
        RANGES.update(zip(idx, syms))
        b.loops(list(zip(idx, syms)), [f"{y_name}[{', '.join(idx)}] = {render(expr, idx)}"])

        def formula(env: dict) -> dict:
            return {y_name: np.broadcast_to(np.asarray(evaluate(expr, env, rank), np.float64), tuple(ext))}
    return Case("chain" if chain else "eltwise", b.text(), formula)


def reduce_rows(rng: random.Random, nm: Names) -> Case:
    m, n = size(rng, 400), size(rng, 600)
    kind = rng.choice(["sum", "max", "min", "mean", "softmaxish", "normish"])
    sm, sn = nm("M"), nm("N")
    b = Builder(nm("k"))
    b.defaults = [(sm, m), (sn, n)]
    a, dt = nm("A"), rng.choice(DTYPES)
    b.param(a, dt, [sm, sn])
    s_name, s_dt = nm("s"), rng.choice(DTYPES)
    op, init = {"sum": ("+=", "0"), "mean": ("+=", "0"), "max": ("max=", "-inf"), "min": ("min=", "inf"),
                "softmaxish": ("max=", "-inf"), "normish": ("+=", "0")}[kind]
    scale = 1.0 / n if kind in ("mean", "normish") else 1.0
    i, j = nm("i"), nm("j")
    term = f"{a}[{i}, {j}]" if scale == 1.0 else f"{a}[{i}, {j}] / {n}"
    tail = kind in ("softmaxish", "normish") or rng.random() < 0.3
    b.decl(s_name, s_dt, [sm], out=not tail or rng.random() < 0.5)
    b.body.append(f"  for {i} in 0..{sm}:")
    b.body.append(f"    {s_name}[{i}] = {init}")
    b.body.append(f"    for {j} in 0..{sn}:")
    b.body.append(f"      {s_name}[{i}] {op} {term}")
    y_name = None
    if tail:
        y_name, y_dt = nm("Y"), rng.choice(DTYPES)
        b.decl(y_name, y_dt, [sm, sn], out=True)
        p, q = nm("p"), nm("q")
        conv = (lambda x: x) if s_dt == dt else (lambda x: f"{dt}({x})")
        use = f"exp({a}[{p}, {q}] - {conv(f'{s_name}[{p}]')})" if kind == "softmaxish" else \
            f"{a}[{p}, {q}] - {conv(f'{s_name}[{p}]')}"
        b.loops([(p, sm), (q, sn)], [f"{y_name}[{p}, {q}] = {use}"])

    def formula(env: dict) -> dict:
        x = env[a]
        red = {"+=": lambda: (x * scale if scale != 1.0 else x).sum(1), "max=": lambda: x.max(1),
               "min=": lambda: x.min(1)}[op]()
        out = {s_name: red}
        if y_name:
            sv = rounded(red, s_dt)[:, None]
            if s_dt != dt:
                sv = rounded(sv, dt)
            out[y_name] = np.exp(x - sv) if kind == "softmaxish" else x - sv
        return out
    return Case("reduce", b.text(), formula)


def matmul(rng: random.Random, nm: Names) -> Case:
    m, k, n = size(rng, 300), size(rng, 300), size(rng, 600)
    while m * k * n > 3_000_000:
        m, k, n = max(1, m // 2), max(1, k // 2), n
    sm, sk, sn = nm("M"), nm("K"), nm("N")
    b = Builder(nm("mm"))
    b.defaults = [(sm, m), (sk, k), (sn, n)]
    a, bb = nm("A"), nm("B")
    dt = rng.choice(DTYPES)
    a_t, b_t = rng.random() < 0.3, rng.random() < 0.35  # A stored [K, M]; B stored [N, K] (PyTorch's linear)
    b.param(a, dt, [sk, sm] if a_t else [sm, sk])
    b.param(bb, dt, [sn, sk] if b_t else [sk, sn])
    bias = rng.choice([None, None, "col", "row"])
    bias_name = nm("b") if bias else None
    if bias_name:
        b.param(bias_name, rng.choice(DTYPES), [sn] if bias == "col" else [sm])
    relu = rng.choice([None, None, "nest", "stmt"])
    c_name, c_dt = nm("C"), rng.choice(DTYPES)
    i, j, r = nm("i"), nm("j"), nm("k")
    init = "0" if not bias else f"{bias_name}[{j if bias == 'col' else i}]"
    lhs = f"{a}[{r}, {i}]" if a_t else f"{a}[{i}, {r}]"
    rhs = f"{bb}[{j}, {r}]" if b_t else f"{bb}[{r}, {j}]"
    # now and then a factor that is not a plain read (a scale, a function, a negation, a conversion): computed
    # before the product (the compiler must not drop it)
    wrap = rng.choice(["scale", "relu", "exp", "neg", "f32", dt]) if rng.random() < 0.15 else None
    lhs_v = {None: lhs, "scale": f"0.5 * {lhs}", "neg": f"-{lhs}"}.get(wrap, f"{wrap}({lhs})")
    rhs_v = f"f32({rhs})" if wrap == "f32" else rhs  # both converted: the checker wants one dtype
    prod = f"{lhs_v} * {rhs_v}" if rng.random() < 0.7 else f"{rhs_v} * ({lhs_v})"
    lines = [f"{c_name}[{i}, {j}] = {init}", f"for {r} in 0..{sk}:", f"  {c_name}[{i}, {j}] += {prod}"]
    if relu == "nest":
        lines.append(f"{c_name}[{i}, {j}] = relu({c_name}[{i}, {j}])")
    b.decl(c_name, c_dt, [sm, sn], out=relu != "stmt")
    y_name = None
    if relu == "stmt":
        y_name = nm("Y")
        b.decl(y_name, rng.choice(DTYPES), [sm, sn], out=True)
    b.loops([(i, sm), (j, sn)], lines)
    if y_name:
        p, q = nm("i"), nm("j")
        b.loops([(p, sm), (q, sn)], [f"{y_name}[{p}, {q}] = relu({c_name}[{p}, {q}])"])

    def formula(env: dict) -> dict:
        am = env[a].T if a_t else env[a]
        bm = env[bb].T if b_t else env[bb]
        if wrap in ("scale", "neg", "relu", "exp"):
            am = {"scale": lambda x: 0.5 * x, "neg": lambda x: -x, "relu": lambda x: np.maximum(x, 0),
                  "exp": np.exp}[wrap](am)
        elif wrap in ("f16", "bf16"):
            am = rounded(am, wrap)
        c = am @ bm
        if bias == "col":
            c = c + env[bias_name][None, :]
        elif bias == "row":
            c = c + env[bias_name][:, None]
        if relu == "nest":
            c = np.maximum(c, 0)
        if y_name:
            return {y_name: np.maximum(rounded(c, c_dt), 0)}
        return {c_name: c}
    return Case("matmul" if not bias else "linear", b.text(), formula)


def conv(rng: random.Random, nm: Names) -> Case:
    """Convs: 1-D/2-D, strides, dilated taps (`X[y + 2*r]`), zero padding (`X[y + r - 1] ?? 0`, a "same" conv at
    stride 1), depthwise (weights [C, R, S], one channel per output channel), bias, relu, fused pools."""
    two_d = rng.random() < 0.6
    n, c, kk = rng.choice([1, 1, 2]), size(rng, 260), size(rng, 260)
    r = rng.choice([1, 2, 3]) if two_d else 1
    s = rng.choice([1, 2, 3])
    sy = rng.choice([1, 1, 2]) if two_d else 1
    sx = rng.choice([1, 1, 1, 2])
    dil = rng.choice([1, 1, 1, 2])
    padded = rng.random() < 0.25
    depthwise = rng.random() < 0.15
    pad_y, pad_x = (dil * (r - 1) // 2, dil * (s - 1) // 2) if padded else (0, 0)
    h = dil * (r - 1) + 1 - 2 * pad_y + sy * (rng.randint(1, 18) - 1) if two_d else 1
    w = dil * (s - 1) + 1 - 2 * pad_x + sx * (rng.randint(1, 40) - 1)
    while w < pad_x:  # a padded read may reach at most the input's extent beyond either end
        w += sx
    while two_d and h < pad_y:
        h += sy
    while n * c * kk * h * w * r * s > 6_000_000:
        c, kk = max(1, c // 2), max(1, kk // 2)
    if depthwise:
        c = kk
    dt = rng.choice(DTYPES)
    names = {v: nm(v) for v in ("N", "C", "K", "H", "W", "R", "S")}
    b = Builder(nm("con"))
    b.defaults = [(names["N"], n)] + ([] if depthwise else [(names["C"], c)]) + [(names["K"], kk)]
    b.defaults += [(names["H"], h)] if two_d else []
    b.defaults += [(names["W"], w)] + ([(names["R"], r)] if two_d else []) + [(names["S"], s)]
    x_name, w_name = nm("X"), nm("Wt")
    w_ck = rng.random() < 0.2 and not depthwise  # weights stored [C, K, ...]

    def out_size(size_name: str, tap_name: str, stride: int, pad: int) -> str:
        span = f"{size_name} - {tap_name}" if dil == 1 else f"{size_name} - {dil}*({tap_name} - 1) - 1"
        span += f" + {2 * pad}" if pad else ""
        return f"({span}) / {stride} + 1" if stride > 1 else f"{span} + 1"
    ho_e, wo_e = out_size(names["H"], names["R"], sy, pad_y), out_size(names["W"], names["S"], sx, pad_x)
    ho_n, wo_n = nm("Ho"), nm("Wo")
    b.lets = ([(ho_n, ho_e)] if two_d else []) + [(wo_n, wo_e)]
    sp = [names["H"], names["W"]] if two_d else [names["W"]]
    b.param(x_name, dt, [names["N"], names["K"] if depthwise else names["C"]] + sp)
    ch = [names["K"]] if depthwise else [names["C"], names["K"]] if w_ck else [names["K"], names["C"]]
    b.param(w_name, dt, ch + ([names["R"], names["S"]] if two_d else [names["S"]]))
    bias = rng.random() < 0.6
    b_name = nm("b") if bias else None
    if b_name:
        b.param(b_name, rng.choice(["f32", dt]), [names["K"]])
    relu = rng.choice([None, "nest", "stmt"])
    pool = rng.choice([None, None, "max", "sum", "avg", "min"])
    out_sp = [ho_n, wo_n] if two_d else [wo_n]
    conv_name, conv_dt = nm("conv"), rng.choice(DTYPES)
    v = {k: nm(k.lower()) for k in ("n", "k", "y", "x", "c", "r", "s")}
    oy = [v["y"], v["x"]] if two_d else [v["x"]]
    cidx = ", ".join([v["n"], v["k"]] + oy)

    def tap(out_var: str, stride: int, tap_var: str, pad: int) -> str:
        return (f"{stride}*{out_var}" if stride > 1 else out_var) + (f" + {dil}*{tap_var}" if dil > 1 else
                                                                     f" + {tap_var}") + (f" - {pad}" if pad else "")
    xin = [tap(v["y"], sy, v["r"], pad_y)] if two_d else []
    xin += [tap(v["x"], sx, v["s"], pad_x)]
    widx = [v["k"]] if depthwise else [v["c"], v["k"]] if w_ck else [v["k"], v["c"]]
    widx += [v["r"], v["s"]] if two_d else [v["s"]]
    taps = ([] if depthwise else [(v["c"], names["C"])]) + ([(v["r"], names["R"])] if two_d else [])
    taps += [(v["s"], names["S"])]
    init_v = f"{b_name}[{v['k']}]" if bias else "0"
    read = f"{x_name}[{', '.join([v['n'], v['k'] if depthwise else v['c']] + xin)}]"
    read = f"({read} ?? 0)" if padded else read
    lines = [f"{conv_name}[{cidx}] = {init_v}",
             f"for {', '.join(f'{a} in 0..{e}' for a, e in taps)}:",
             f"  {conv_name}[{cidx}] += {read} * {w_name}[{', '.join(widx)}]"]
    if relu == "nest":
        lines.append(f"{conv_name}[{cidx}] = relu({conv_name}[{cidx}])")
    last_is_conv = relu != "stmt" and not pool
    b.decl(conv_name, conv_dt, [names["N"], names["K"]] + out_sp, out=last_is_conv)
    b.loops([(v["n"], names["N"]), (v["k"], names["K"])] + list(zip(oy, out_sp)), lines)
    ho = (h + 2 * pad_y - dil * (r - 1) - 1) // sy + 1
    wo = (w + 2 * pad_x - dil * (s - 1) - 1) // sx + 1
    stage_name, stage_dt = conv_name, conv_dt
    if relu == "stmt":
        rl, rl_dt = nm("Y"), rng.choice(DTYPES)
        b.decl(rl, rl_dt, [names["N"], names["K"]] + out_sp, out=not pool)
        iv = [nm("n"), nm("k")] + [nm("y") for _ in out_sp]
        b.loops(list(zip(iv, [names["N"], names["K"]] + out_sp)),
                [f"{rl}[{', '.join(iv)}] = relu({conv_name}[{', '.join(iv)}])"])
        stage_name, stage_dt = rl, rl_dt
    py = rng.choice([d for d in (1, 2, 3) if ho % d == 0]) if two_d else 1  # sizes must divide exactly
    px = rng.choice([d for d in (1, 2, 3) if wo % d == 0])
    y_name = None
    if pool:
        y_name = nm("Y")
        psp = ([f"{ho_n} / {py}"] if two_d else []) + [f"{wo_n} / {px}"]
        b.decl(y_name, rng.choice(DTYPES), [names["N"], names["K"]] + psp, out=True)
        iv = [nm("n"), nm("k")] + [nm("i") for _ in psp]
        wv = ([nm("p")] if two_d else []) + [nm("q")]
        init = {"max": "-inf", "min": "inf", "sum": "0", "avg": "0"}[pool]
        op = {"max": "max=", "min": "min="}.get(pool, "+=")
        src = [iv[0], iv[1]]
        if two_d:
            src.append(f"{py}*{iv[2]} + {wv[0]}" if py > 1 else f"{iv[2]} + {wv[0]}")
        src.append(f"{px}*{iv[-1]} + {wv[-1]}" if px > 1 else f"{iv[-1]} + {wv[-1]}")
        term = f"{stage_name}[{', '.join(src)}]"
        if pool == "avg":
            term = f"{_num(1.0 / (py * px))} * {term}" if rng.random() < 0.5 else f"{term} / {py * px}"
        win = ", ".join(f"{a} in 0..{e}" for a, e in zip(wv, ([py] if two_d else []) + [px]))
        b.loops(list(zip(iv, [names["N"], names["K"]] + psp)),
                [f"{y_name}[{', '.join(iv)}] = {init}", f"for {win}:", f"  {y_name}[{', '.join(iv)}] {op} {term}"])

    def formula(env: dict) -> dict:
        x, wt = env[x_name], env[w_name]
        if w_ck:
            wt = np.swapaxes(wt, 0, 1)
        if not two_d:
            x, wt = x[:, :, None, :], wt[..., None, :]
        x = np.pad(x, ((0, 0), (0, 0), (pad_y, pad_y), (pad_x, pad_x)))
        out = np.zeros((n, kk, ho, wo))
        for dy in range(r):
            for dx in range(s):
                y0, x0 = dil * dy, dil * dx
                patch = x[:, :, y0:y0 + sy * (ho - 1) + 1:sy, x0:x0 + sx * (wo - 1) + 1:sx]
                if depthwise:  # wt: [K, R, S], channel k reads channel k
                    out += patch * wt[None, :, dy, dx, None, None]
                else:
                    out += np.einsum("nchw,kc->nkhw", patch, wt[:, :, dy, dx])
        if bias:
            out += env[b_name][None, :, None, None]
        if relu == "nest":
            out = np.maximum(out, 0)
        res = {conv_name: out}
        cur = rounded(out, conv_dt)
        if relu == "stmt":
            res[stage_name] = np.maximum(cur, 0)
            cur = rounded(res[stage_name], stage_dt)
        if pool:
            hp, wp = (ho // py if two_d else 1), wo // px
            win = cur[:, :, :hp * (py if two_d else 1), :wp * px].reshape(n, kk, hp, py if two_d else 1, wp, px)
            res[y_name] = win.max((3, 5)) if pool == "max" else win.min((3, 5)) if pool == "min" else \
                win.sum((3, 5)) / (py * px if pool == "avg" else 1)
        if not two_d:
            res = {key: val[:, :, 0, :] for key, val in res.items()}
        return res
    forms = tuple(f for f, on in (("padded", padded), ("dilated", dil > 1), ("depthwise", depthwise)) if on)
    return Case("conv_pool" if pool else "conv", b.text(), formula, forms=forms)


def pool(rng: random.Random, nm: Names) -> Case:
    if rng.random() < 0.25:
        return padded_pool(rng, nm)
    n, c = rng.choice([1, 2]), size(rng, 300)
    p = rng.choice([1, 2, 3, 4])
    h, w = p * rng.randint(1, 12), p * rng.randint(1, 24)
    kind = rng.choice(["max", "sum", "avg", "min"])
    syms = [nm(s) for s in ("N", "C", "H", "W")]
    b = Builder(nm("pool"))
    b.defaults = list(zip(syms, [n, c, h, w]))
    x_name, dt = nm("X"), rng.choice(DTYPES)
    b.param(x_name, dt, syms)
    y_name = nm("Y")
    b.decl(y_name, rng.choice(DTYPES), syms[:2] + [f"{syms[2]} / {p}", f"{syms[3]} / {p}"], out=True)
    iv = [nm(s) for s in ("n", "c", "i", "j")]
    pv, qv = nm("p"), nm("q")
    op, init = {"max": ("max=", "-inf"), "min": ("min=", "inf"), "sum": ("+=", "0"), "avg": ("+=", "0")}[kind]
    term = f"{x_name}[{iv[0]}, {iv[1]}, {p}*{iv[2]} + {pv}, {p}*{iv[3]} + {qv}]"
    if kind == "avg":
        term = f"{_num(1.0 / (p * p))} * {term}"
    b.loops(list(zip(iv, syms[:2] + [f"{syms[2]} / {p}", f"{syms[3]} / {p}"])),
            [f"{y_name}[{', '.join(iv)}] = {init}", f"for {pv} in 0..{p}, {qv} in 0..{p}:",
             f"  {y_name}[{', '.join(iv)}] {op} {term}"])

    def formula(env: dict) -> dict:
        win = env[x_name].reshape(n, c, h // p, p, w // p, p)
        red = {"max": lambda: win.max((3, 5)), "min": lambda: win.min((3, 5)), "sum": lambda: win.sum((3, 5)),
               "avg": lambda: (win * float(np.float32(1.0 / (p * p)))).sum((3, 5))}[kind]()
        return {y_name: red}
    return Case("pool", b.text(), formula)


def padded_pool(rng: random.Random, nm: Names) -> Case:
    """A k x k window sliding with stride 1 over the input padded with the reduction's identity (-inf, inf, 0):
    the output has the input's size (a "same" pool; avg counts the padding, as torch's count_include_pad)."""
    n, c, k = rng.choice([1, 2]), size(rng, 300), rng.choice([2, 3])
    h, w, lo = rng.randint(k, 24), rng.randint(k, 40), (k - 1) // 2
    kind = rng.choice(["max", "sum", "avg", "min"])
    syms = [nm(s) for s in ("N", "C", "H", "W")]
    b = Builder(nm("pool"))
    b.defaults = list(zip(syms, [n, c, h, w]))
    x_name, y_name = nm("X"), nm("Y")
    b.param(x_name, rng.choice(DTYPES), syms)
    b.decl(y_name, rng.choice(DTYPES), syms, out=True)
    iv = [nm(s) for s in ("n", "c", "i", "j")]
    pv, qv = nm("p"), nm("q")
    op, init, fill = {"max": ("max=", "-inf", "-inf"), "min": ("min=", "inf", "inf"), "sum": ("+=", "0", "0"),
                      "avg": ("+=", "0", "0")}[kind]
    term = f"{x_name}[{iv[0]}, {iv[1]}, {iv[2]} + {pv} - {lo}, {iv[3]} + {qv} - {lo}] ?? {fill}"
    if kind == "avg":
        term = f"{_num(1.0 / (k * k))} * ({term})"
    b.loops(list(zip(iv, syms)), [f"{y_name}[{', '.join(iv)}] = {init}", f"for {pv} in 0..{k}, {qv} in 0..{k}:",
                                   f"  {y_name}[{', '.join(iv)}] {op} {term}"])

    def formula(env: dict) -> dict:
        pad = {"max": -np.inf, "min": np.inf, "sum": 0.0, "avg": 0.0}[kind]
        xp = np.pad(env[x_name], ((0, 0), (0, 0), (lo, k - 1 - lo), (lo, k - 1 - lo)), constant_values=pad)
        wins = np.stack([xp[:, :, p:p + h, q:q + w] for p in range(k) for q in range(k)])
        red = {"max": lambda: wins.max(0), "min": lambda: wins.min(0), "sum": lambda: wins.sum(0),
               "avg": lambda: (wins * float(np.float32(1.0 / (k * k)))).sum(0)}[kind]()
        return {y_name: red}
    return Case("pool", b.text(), formula, forms=("padded",))


def transpose(rng: random.Random, nm: Names) -> Case:
    m, n = size(rng, 520), size(rng, 520)
    sm, sn = nm("M"), nm("N")
    b = Builder(nm("tr"))
    b.defaults = [(sm, m), (sn, n)]
    x_name, dt = nm("X"), rng.choice(DTYPES)
    b.param(x_name, dt, [sm, sn])
    y_name, y_dt = nm("Y"), rng.choice(DTYPES)
    then = rng.choice([None, None, "copy", "rowsum", "relu"])
    b.decl(y_name, y_dt, [sn, sm], out=then is None or rng.random() < 0.4)
    i, j = nm("i"), nm("j")
    b.loops([(i, sn), (j, sm)], [f"{y_name}[{i}, {j}] = {x_name}[{j}, {i}]"])
    z_name = None
    if then:
        z_name, z_dt = nm("Z"), rng.choice(DTYPES)
        p, q = nm("i"), nm("j")
        if then == "rowsum":
            b.decl(z_name, z_dt, [sn], out=True)
            b.loops([(p, sn)], [f"{z_name}[{p}] = 0", f"for {q} in 0..{sm}:", f"  {z_name}[{p}] += {y_name}[{p}, {q}]"])
        else:
            b.decl(z_name, z_dt, [sn, sm], out=True)
            use = f"relu({y_name}[{p}, {q}])" if then == "relu" else f"{y_name}[{p}, {q}]"
            b.loops([(p, sn), (q, sm)], [f"{z_name}[{p}, {q}] = {use}"])

    def formula(env: dict) -> dict:
        y = env[x_name].T
        out = {y_name: y}
        if z_name:
            yr = rounded(y, y_dt)
            out[z_name] = yr.sum(1) if then == "rowsum" else (np.maximum(yr, 0) if then == "relu" else yr)
        return out
    return Case("transpose", b.text(), formula)


def row_chain(rng: random.Random, nm: Names) -> Case:
    """softmax, layernorm and rmsnorm written as the examples write them: several statements through row vectors
    (a max or sum per row, a broadcast use, a reduction of that, rsqrt of a row vector, a scale by columns)."""
    kind = rng.choice(["softmax", "layernorm", "rmsnorm", "logsumexp"])
    m, n = size(rng, 300), size(rng, 600)
    if rng.random() < 0.08:  # long rows: a chain that fits SBUF only with tiles sharing space (compiler/share.py)
        m, n = size(rng, 160), rng.choice([6000, 8192, 8193, 12289, 16384])
    sm, sn = nm("M"), nm("N")
    b = Builder(nm(kind))
    b.defaults = [(sm, m), (sn, n)]
    dt = rng.choice(["f32", "f32", "bf16", "f16"])
    inner = rng.choice(["f32", "f32", dt])  # the row vectors and temporaries
    x = nm("X")
    b.param(x, dt, [sm, sn])
    g = nm("g") if kind in ("layernorm", "rmsnorm") else None
    beta = nm("b") if kind == "layernorm" and rng.random() < 0.7 else None
    for t in (g, beta):
        if t:
            b.param(t, dt, [sn])
    eps = rng.choice([1e-05, 1e-06, 0.001])
    y = nm("Y")
    idx = lambda: (nm("i"), nm("j"))  # noqa: E731
    cv = (lambda e: e) if inner == dt else (lambda e: f"{dt}({e})")

    def vec(name: str, init: str, op: str, term: str, i: str, j: str) -> None:
        b.decl(name, inner, [sm])
        b.body += [f"  for {i} in 0..{sm}:", f"    {name}[{i}] = {init}", f"    for {j} in 0..{sn}:",
                   f"      {name}[{i}] {op} {term}"]
    if kind in ("softmax", "logsumexp"):
        mx, e, sv = nm("m"), nm("e"), nm("s")
        i, j = idx()
        vec(mx, "-inf", "max=", f"{x}[{i}, {j}]", i, j)
        i, j = idx()
        b.decl(e, inner, [sm, sn])
        b.loops([(i, sm), (j, sn)], [f"{e}[{i}, {j}] = exp({x}[{i}, {j}] - {cv(f'{mx}[{i}]')})"])
        i, j = idx()
        vec(sv, "0", "+=", f"{e}[{i}, {j}]", i, j)
        i, j = idx()
        if kind == "softmax":
            b.decl(y, rng.choice(DTYPES), [sm, sn], out=True)
            b.loops([(i, sm), (j, sn)], [f"{y}[{i}, {j}] = {e}[{i}, {j}] / {sv}[{i}]"])
        else:
            b.decl(y, rng.choice(DTYPES), [sm], out=True)
            b.loops([(i, sm)], [f"{y}[{i}] = log({sv}[{i}]) + {mx}[{i}]"])

        def formula(env: dict) -> dict:
            xv = env[x]
            mv = rounded(xv.max(1), inner)
            ev = rounded(np.exp(xv - rounded(mv, dt)[:, None]), inner)
            sv_ = rounded(ev.sum(1), inner)
            return {y: ev / sv_[:, None] if kind == "softmax" else np.log(sv_) + mv}
    else:
        mu, d, var, r = nm("mu"), nm("d"), nm("v"), nm("r")
        i, j = idx()
        src = x
        if kind == "layernorm":
            vec(mu, "0", "+=", f"{x}[{i}, {j}] / {sn}", i, j)
            i, j = idx()
            b.decl(d, inner, [sm, sn])
            b.loops([(i, sm), (j, sn)], [f"{d}[{i}, {j}] = {x}[{i}, {j}] - {cv(f'{mu}[{i}]')}"])
            src = d
            i, j = idx()
        vec(var, "0", "+=", f"{src}[{i}, {j}] * {src}[{i}, {j}] / {sn}", i, j)
        i, j = idx()
        b.decl(r, inner, [sm])
        b.loops([(i, sm)], [f"{r}[{i}] = rsqrt({var}[{i}] + {eps})"])
        i, j = idx()
        sd = f"{src}[{i}, {j}]" if src == x else cv(f"{src}[{i}, {j}]")  # the statement computes in dt
        val = f"{sd} * {cv(f'{r}[{i}]')} * {g}[{j}]"
        if beta:
            val += f" + {beta}[{j}]"
        b.decl(y, rng.choice(DTYPES), [sm, sn], out=True)
        b.loops([(i, sm), (j, sn)], [f"{y}[{i}, {j}] = {val}"])

        def formula(env: dict) -> dict:
            xv = env[x]
            dv = xv
            if kind == "layernorm":
                muv = rounded(xv.sum(1) / n, inner)
                dv = rounded(xv - rounded(muv, dt)[:, None], inner)
            vv = rounded((dv * dv).sum(1) / n, inner)
            rv = rounded(rounded(1.0 / np.sqrt(vv + eps), inner), dt)
            out = rounded(dv, dt) * rv[:, None] * env[g][None, :]
            return {y: out + env[beta][None, :] if beta else out}
    return Case("rowchain", b.text(), formula)


def reduce_columns(rng: random.Random, nm: Names) -> Case:
    """Reductions over a leading or a middle dimension: s[j] += A[i, j], s[b, n] += A[b, m, n] / M."""
    middle = rng.random() < 0.5
    dims = [rng.choice([1, 2, 3, 5]), size(rng, 300), size(rng, 300)] if middle else [size(rng, 400), size(rng, 600)]
    syms = [nm(c) for c in ("B", "M", "N")[3 - len(dims):]]
    b = Builder(nm("colsum"))
    b.defaults = list(zip(syms, dims))
    a, dt = nm("A"), rng.choice(DTYPES)
    b.param(a, dt, syms)
    kind = rng.choice(["sum", "sum", "mean", "max", "min"])
    op, init = {"sum": ("+=", "0"), "mean": ("+=", "0"), "max": ("max=", "-inf"), "min": ("min=", "inf")}[kind]
    red = len(dims) - 2  # the reduced dimension: the first of two, the middle of three
    kept = [d for d in range(len(dims)) if d != red]
    s_name = nm("s")
    b.decl(s_name, rng.choice(DTYPES), [syms[d] for d in kept], out=True)
    iv = [nm(c) for c in ("b", "i", "j")[3 - len(dims):]]
    term = f"{a}[{', '.join(iv)}]" + (f" / {syms[red]}" if kind == "mean" else "")
    out_ix = ", ".join(iv[d] for d in kept)
    b.loops([(iv[d], syms[d]) for d in kept],
            [f"{s_name}[{out_ix}] = {init}", f"for {iv[red]} in 0..{syms[red]}:", f"  {s_name}[{out_ix}] {op} {term}"])

    def formula(env: dict) -> dict:
        x = env[a]
        res = {"sum": lambda: x.sum(red), "mean": lambda: x.sum(red) / dims[red], "max": lambda: x.max(red),
               "min": lambda: x.min(red)}[kind]()
        return {s_name: res}
    return Case("colreduce", b.text(), formula)


def permute(rng: random.Random, nm: Names) -> Case:
    """N-D permutes: Y[b, j, i] = X[b, i, j] (a batched transpose), the other orders of three dimensions, and any
    order of four (NCHW -> NHWC, attention's [S, N, H, D] -> [N, H, S, D], cycles)."""
    rank = 3 if rng.random() < 0.6 else 4
    dims = [rng.choice([1, 2, 3, 4, 7]), size(rng, 200), size(rng, 200)] if rank == 3 else \
        [rng.choice([1, 2, 3]), rng.randint(1, 40), size(rng, 100), rng.randint(1, 70)]
    rng.shuffle(dims)
    if rank == 3:
        order = rng.choice([(0, 2, 1), (0, 2, 1), (1, 0, 2), (2, 1, 0), (1, 2, 0), (2, 0, 1)])
    else:
        order = tuple(rng.sample(range(4), 4))
        while order == (0, 1, 2, 3):
            order = tuple(rng.sample(range(4), 4))
    syms = [nm(c) for c in ("B", "M", "N", "Q")[:rank]]
    b = Builder(nm("perm"))
    b.defaults = list(zip(syms, dims))
    x, dt = nm("X"), rng.choice(DTYPES)
    b.param(x, dt, syms)
    y = nm("Y")
    b.decl(y, rng.choice(DTYPES), [syms[d] for d in order], out=True)
    iv = [nm(c) for c in ("b", "i", "j", "k")[:rank]]
    b.loops([(iv[d], syms[d]) for d in order],
            [f"{y}[{', '.join(iv[d] for d in order)}] = {x}[{', '.join(iv)}]"])
    return Case("permute", b.text(), lambda env: {y: np.transpose(env[x], order)})


def movement(rng: random.Random, nm: Names) -> Case:
    """Data movement over [N, C, H, W] (or [H, W]): a shift (`X[.., j + 2]`, or zero-filled `X[.., j - 2] ?? 0`),
    a nearest upsampling (`X[.., i / 2, j / 2]`), a concatenation of two inputs along any dim."""
    kind = rng.choice(["shift", "shift_padded", "upsample", "concat"])
    four = rng.random() < 0.6
    dims = ([rng.choice([1, 2]), size(rng, 200)] if four else []) + [rng.randint(1, 24), rng.randint(1, 40)]
    syms = [nm(x) for x in (("N", "C", "H", "W") if four else ("H", "W"))]
    b = Builder(nm("move"))
    b.defaults = list(zip(syms, dims))
    x, dt = nm("X"), rng.choice(DTYPES)
    b.param(x, dt, syms)
    y = nm("Y")
    iv = [nm(v) for v in (("n", "c", "i", "j") if four else ("i", "j"))]
    axis = rng.randrange(len(dims))
    ext = list(syms)
    src = list(iv)
    if kind == "shift":  # Y is shorter along the axis by the offset
        off = rng.randint(1, 3)
        b.defaults[axis] = (syms[axis], dims[axis] + off)
        ext[axis] = f"{syms[axis]} - {off}"
        src[axis] = f"{iv[axis]} + {off}"
        line = f"{y}[{', '.join(iv)}] = {x}[{', '.join(src)}]"
    elif kind == "shift_padded":  # the same extent, zeros shifted in
        off = rng.choice([-2, -1, 1, 2])
        if dims[axis] <= abs(off):  # the read must touch X
            dims[axis] = abs(off) + 1
            b.defaults[axis] = (syms[axis], dims[axis])
        src[axis] = f"{iv[axis]} + {off}" if off > 0 else f"{iv[axis]} - {-off}"
        line = f"{y}[{', '.join(iv)}] = {x}[{', '.join(src)}] ?? 0"
    elif kind == "upsample":  # the last one or two dims repeated f times
        f = rng.choice([2, 2, 3])
        for d in ([len(dims) - 2, len(dims) - 1] if rng.random() < 0.7 else [len(dims) - 1]):
            ext[d], src[d] = f"{f}*{syms[d]}", f"{iv[d]} / {f}"
        line = f"{y}[{', '.join(iv)}] = {x}[{', '.join(src)}]"
    else:  # concat: Y = [X; Z] along `axis`
        z, extra = nm("Z"), nm("E")
        b.defaults.append((extra, rng.randint(1, 40)))
        zs = list(syms)
        zs[axis] = extra
        b.param(z, dt, zs)
        ext[axis] = f"{syms[axis]} + {extra}"
    b.decl(y, rng.choice(DTYPES), ext, out=True)
    if kind == "concat":
        b.loops(list(zip(iv, syms)), [f"{y}[{', '.join(iv)}] = {x}[{', '.join(iv)}]"])
        iz = [nm(v) for v in (("n", "c", "i", "j") if four else ("i", "j"))]
        dst = list(iz)
        dst[axis] = f"{syms[axis]} + {iz[axis]}"
        b.loops(list(zip(iz, zs)), [f"{y}[{', '.join(dst)}] = {z}[{', '.join(iz)}]"])
    else:
        b.loops(list(zip(iv, ext)), [line])

    def formula(env: dict) -> dict:
        xv = env[x]
        if kind == "shift":
            return {y: np.take(xv, range(off, xv.shape[axis]), axis=axis)}
        if kind == "shift_padded":
            n_ax = xv.shape[axis]
            idx = np.arange(n_ax) + off
            ok = (idx >= 0) & (idx < n_ax)
            out = np.take(xv, np.clip(idx, 0, n_ax - 1), axis=axis)
            shape = [1] * xv.ndim
            shape[axis] = n_ax
            return {y: np.where(ok.reshape(shape), out, 0.0)}
        if kind == "upsample":
            out = xv
            for d in range(xv.ndim):
                if "/" in src[d]:
                    out = np.repeat(out, f, axis=d)
            return {y: out}
        return {y: np.concatenate([xv, env[z]], axis=axis)}
    return Case("movement", b.text(), formula, forms=(kind,))


def batched_matmul(rng: random.Random, nm: Names) -> Case:
    """C[b, i, j] = sum_k A[b, i, k] * B[b, k, j] (operands of one dtype, the result of any)."""
    nb, m, k, n = rng.choice([1, 2, 3, 4]), size(rng, 300), size(rng, 300), size(rng, 300)
    syms = [nm(v) for v in ("Bt", "M", "K", "N")]
    b = Builder(nm("bmm"))
    b.defaults = list(zip(syms, [nb, m, k, n]))
    a_name, b_name, c_name, dt = nm("A"), nm("B"), nm("C"), rng.choice(DTYPES)
    b.param(a_name, dt, [syms[0], syms[1], syms[2]])
    b.param(b_name, dt, [syms[0], syms[2], syms[3]])
    b.decl(c_name, rng.choice(DTYPES), [syms[0], syms[1], syms[3]], out=True)
    bv, iv, jv, kv = nm("b"), nm("i"), nm("j"), nm("k")
    b.loops([(bv, syms[0]), (iv, syms[1]), (jv, syms[3])],
            [f"{c_name}[{bv}, {iv}, {jv}] = 0", f"for {kv} in 0..{syms[2]}:",
             f"  {c_name}[{bv}, {iv}, {jv}] += {a_name}[{bv}, {iv}, {kv}] * {b_name}[{bv}, {kv}, {jv}]"])
    return Case("bmm", b.text(), lambda env: {c_name: np.einsum("bik,bkj->bij", env[a_name], env[b_name])})


def total(rng: random.Random, nm: Names) -> Case:
    """A reduction into one element (a total sum, a dot product, a global max or min; reduce_split's total rewrite)
    and a copy through a reshape index `h * D + d` (heads split and merge; permute_split's reshape copies)."""
    kind = rng.choice(["sum", "dot", "max", "min", "split", "merge"])
    if kind in ("split", "merge"):
        return _reshape_copy(rng, nm, kind)
    rank = rng.choice([1, 2])
    dims = [size(rng, 3000)] if rank == 1 else [size(rng, 300), size(rng, 400)]
    syms = [nm(c) for c in ("M", "N")[:rank]]
    b = Builder(nm("k"))
    b.defaults = list(zip(syms, dims))
    a, a2, dt = nm("A"), nm("B"), rng.choice(DTYPES)
    b.param(a, dt, syms)
    if kind == "dot":
        b.param(a2, dt, syms)
    s_name = nm("s")
    b.decl(s_name, rng.choice(DTYPES), ["1"], out=True)
    op, init = {"sum": ("+=", "0"), "dot": ("+=", "0"), "max": ("max=", "-inf"), "min": ("min=", "inf")}[kind]
    iv = [nm(c) for c in ("i", "j")[:rank]]
    at = ", ".join(iv)
    term = f"{a}[{at}] * {a2}[{at}]" if kind == "dot" else f"{a}[{at}]"
    b.body.append(f"  {s_name}[0] = {init}")
    b.loops(list(zip(iv, syms)), [f"{s_name}[0] {op} {term}"])

    def formula(env: dict) -> dict:
        x = env[a].astype(np.float64)
        red = {"sum": lambda: x.sum(), "dot": lambda: (x * env[a2]).sum(), "max": lambda: x.max(),
               "min": lambda: x.min()}[kind]()
        return {s_name: np.array([red])}
    return Case("total", b.text(), formula)


def _reshape_copy(rng: random.Random, nm: Names, kind: str) -> Case:
    """Y[s, h * D + d] = X[h, s, d] (merge) or Y[h, s, d] = X[s, h * D + d] (split)."""
    sh, ss, sd = nm("H"), nm("S"), nm("D")
    heads, rows, width = rng.randint(1, 12), size(rng, 300), rng.randint(1, 96)
    b = Builder(nm("heads"))
    b.defaults = [(sh, heads), (ss, rows), (sd, width)]
    x, y, dt = nm("X"), nm("Y"), rng.choice(DTYPES)
    h, r, d = nm("h"), nm("s"), nm("d")
    wide = [ss, f"{sh} * {sd}"]
    if kind == "merge":
        b.param(x, dt, [sh, ss, sd])
        b.decl(y, dt, wide, out=True)
        b.loops([(h, sh), (r, ss), (d, sd)], [f"{y}[{r}, {h} * {sd} + {d}] = {x}[{h}, {r}, {d}]"])
        return Case("total", b.text(), lambda env: {y: env[x].transpose(1, 0, 2).reshape(rows, heads * width)})
    b.param(x, dt, wide)
    b.decl(y, dt, [sh, ss, sd], out=True)
    b.loops([(h, sh), (r, ss), (d, sd)], [f"{y}[{h}, {r}, {d}] = {x}[{r}, {h} * {sd} + {d}]"])
    return Case("total", b.text(), lambda env: {y: env[x].reshape(rows, heads, width).transpose(1, 0, 2)})


FAMILIES: dict[str, Callable[[random.Random, Names], Case]] = {
    "eltwise": eltwise,
    "chain": lambda rng, nm: eltwise(rng, nm, chain=True),
    "reduce": reduce_rows,
    "matmul": matmul,
    "conv": conv,
    "pool": pool,
    "transpose": transpose,
    "rowchain": row_chain,
    "colreduce": reduce_columns,
    "permute": permute,
    "movement": movement,
    "bmm": batched_matmul,
    "total": total,
    "block": lambda rng, nm: _blocks().block(rng, nm),
    "epilogue": lambda rng, nm: _epilogues().epilogue(rng, nm),
    "mlp": lambda rng, nm: _mlps().mlp(rng, nm),
    "nest": lambda rng, nm: _nests().nest(rng, nm),
    "operands": lambda rng, nm: _operands().operands(rng, nm),
    "gapped": lambda rng, nm: _operands().gapped(rng, nm),
    "mixed": lambda rng, nm: _mixed().mixed(rng, nm),
    "scaled": lambda rng, nm: _mixed().scaled(rng, nm),
    "vecmat": lambda rng, nm: _mixed().vecmat(rng, nm),
    "summed": lambda rng, nm: _mixed().summed(rng, nm),
    "window": lambda rng, nm: _shapes().window(rng, nm),
    "dwconv": lambda rng, nm: _shapes().dwconv(rng, nm),
    "permute5": lambda rng, nm: _shapes().permute5(rng, nm),
    "masked": lambda rng, nm: _shapes().masked(rng, nm),
    "bmm_bias": lambda rng, nm: _shapes().bmm_bias(rng, nm),
    "tconv": lambda rng, nm: _layers().tconv(rng, nm),
    "axpool": lambda rng, nm: _layers().axpool(rng, nm),
    "bnorm": lambda rng, nm: _layers().bnorm(rng, nm),
    "gram": lambda rng, nm: _layers().gram(rng, nm),
    "pairwise": lambda rng, nm: _rows().pairwise(rng, nm),
    "decode": lambda rng, nm: _rows().decode(rng, nm),
    "accum": lambda rng, nm: _rows().accum(rng, nm),
    "maskmean": lambda rng, nm: _rows().maskmean(rng, nm),
}
WEIGHTS = {"eltwise": 3, "chain": 2, "reduce": 2, "matmul": 3, "conv": 3, "pool": 1, "transpose": 2, "rowchain": 2,
           "colreduce": 1, "permute": 1, "movement": 2, "bmm": 1, "block": 2, "total": 1,
           "epilogue": 2, "mlp": 1, "nest": 1, "operands": 1, "gapped": 1, "mixed": 1, "scaled": 1, "vecmat": 1,
           "summed": 1, "window": 1, "dwconv": 1, "permute5": 1, "masked": 1, "bmm_bias": 1,
           "tconv": 1, "axpool": 1, "bnorm": 1, "gram": 1, "pairwise": 1, "decode": 1, "accum": 1, "maskmean": 1}


def _mlps():
    """gen_mlp.py (two matmuls with a hidden layer between them: the feed-forward block)."""
    from tilec.testing import gen_mlp
    return gen_mlp


def _operands():
    """gen_operands.py (a contraction of two expressions; a reduction whose reduced dimensions have gaps)."""
    from tilec.testing import gen_operands
    return gen_operands


def _mixed():
    """gen_mixed.py (dtypes mixed in one statement, extrema of scaled values, batched vector-matrix products)."""
    from tilec.testing import gen_mixed
    return gen_mixed


def _shapes():
    """gen_shapes.py (strided/dilated/padded pools and convs with remainders, depthwise multipliers, rank-5
    permutes, masked row chains, batched matmuls with a bias)."""
    from tilec.testing import gen_shapes
    return gen_shapes


def _layers():
    """gen_layers.py (transposed convs, pools over any two axes, batch norm at inference, Gram matrices)."""
    from tilec.testing import gen_layers
    return gen_layers


def _rows():
    """gen_rows.py (pairwise distances and cosine matrices, decode attention, continued sums, masked means)."""
    from tilec.testing import gen_rows
    return gen_rows


def _nests():
    """gen_nests.py (several statistics of a row in one loop, a read of a running one, a use in the same row loop)."""
    from tilec.testing import gen_nests
    return gen_nests


def _blocks():
    """gen_blocks.py (network blocks: conv chains, residuals, depthwise and grouped stages) builds on this module."""
    from tilec.testing import gen_blocks
    return gen_blocks


def _epilogues():
    """gen_epilogue.py (a contraction, then an element-wise statement reading it) builds on this module."""
    from tilec.testing import gen_epilogue
    return gen_epilogue


def generate(seed: int, family: str | None = None) -> Case:
    rng = random.Random(seed)
    if family is None:
        fams = list(WEIGHTS)
        family = rng.choices(fams, weights=[WEIGHTS[f] for f in fams])[0]
    case = FAMILIES[family](rng, Names(rng))
    case.seed = seed
    if rng.random() < 0.15:  # comments are part of the language too (a line of its own, the end of a line)
        head, rest = case.text.split("\n", 1)
        case.text = f"# fuzz case {seed}\n{head}  # {family}\n  # sizes\n{rest}"
    return case
