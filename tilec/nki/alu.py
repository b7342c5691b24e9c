"""ALU operators and activation functions (`nl.add`, `nl.maximum`, `nl.exp`, ...): one table, keyed by name.

Each `Op` is an op code (passed to nisa.tensor_tensor/tensor_scalar/tensor_reduce/activation) and also the callable
`nl.*` function of the same name. Engines compute in fp32, so every implementation takes and returns float32 arrays
(bitvec ops take the integer bits). numpy ufuncs given as op codes (`np.add`, `np.square`) map to the same entries.
"""
from __future__ import annotations

import math

import numpy as np

F32 = np.float32


def _erfc_abs(a: np.ndarray) -> np.ndarray:
    """erfc(a) for a >= 0, Abramowitz & Stegun 7.1.26 (erf's |error| < 1.5e-7), in float64: the form t * P(t) *
    exp(-a^2) keeps its relative accuracy in the tail, where 1 - erf(a) would cancel to 0."""
    t = 1.0 / (1.0 + 0.3275911 * a)
    return t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))) * \
        np.exp(-a * a)


def _erf(x: np.ndarray) -> np.ndarray:
    """erf (below fp32 resolution near 1)."""
    return (np.sign(x) * (1.0 - _erfc_abs(np.abs(x).astype(np.float64)))).astype(F32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(F32)


def _gelu(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + erf(x / sqrt 2)), with 1 + erf(-a) taken as erfc(a): for x = -5.67 the cancelling form gave 0, so
    a quotient by gelu(x) was 0 / 0 where the reference has 0 / -4e-8 (the fuzzer's seed 133005194)."""
    a = np.abs(x.astype(np.float64)) / math.sqrt(2.0)
    tail = _erfc_abs(a)
    return (0.5 * x * np.where(x < 0, tail, 2.0 - tail)).astype(F32)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * (x + 0.044715 * x ** 3)))).astype(F32)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.float32(0), x).astype(F32)


class Op:
    """An NKI operator. `role` says what calling it as `nl.<name>(...)` does: 'binary', 'unary' or 'reduce'."""

    __slots__ = ("name", "role", "binary", "unary", "reduce", "kind")

    def __init__(self, name: str, role: str, binary=None, unary=None, reduce=None, kind: str = "arith") -> None:
        self.name, self.role, self.binary, self.unary, self.reduce, self.kind = name, role, binary, unary, reduce, kind

    def __call__(self, *args: object, **kwargs: object) -> object:
        from tilec.nki import language

        return language.call_op(self, *args, **kwargs)

    def __repr__(self) -> str:
        return f"nl.{self.name}"


def _cmp(fn):
    return lambda a, b: fn(a, b).astype(F32)


_BINARY = {
    "add": (np.add, np.add.reduce), "subtract": (np.subtract, None), "multiply": (np.multiply, np.multiply.reduce),
    "divide": (np.divide, None), "maximum": (np.maximum, np.maximum.reduce),
    "minimum": (np.minimum, np.minimum.reduce), "power": (np.power, None), "mod": (np.mod, None),
    "fmod": (np.fmod, None), "equal": (_cmp(np.equal), None), "not_equal": (_cmp(np.not_equal), None),
    "greater": (_cmp(np.greater), None), "greater_equal": (_cmp(np.greater_equal), None),
    "less": (_cmp(np.less), None), "less_equal": (_cmp(np.less_equal), None),
    "logical_and": (_cmp(np.logical_and), None), "logical_or": (_cmp(np.logical_or), None),
    "logical_xor": (_cmp(np.logical_xor), None),
}
_BITVEC = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
           "left_shift": np.left_shift, "right_shift": np.right_shift}
_UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "reciprocal": np.reciprocal, "abs": np.abs, "negative": np.negative, "sin": np.sin, "cos": np.cos,
    "tan": np.tan, "tanh": np.tanh, "arctan": np.arctan, "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, np.float32(0)), "gelu": _gelu, "gelu_apprx_tanh": _gelu_tanh,
    "silu": lambda x: x * _sigmoid(x), "square": np.square, "sign": np.sign, "softplus": _softplus,
    "mish": lambda x: x * np.tanh(_softplus(x)), "erf": _erf, "floor": np.floor, "ceil": np.ceil,
    "trunc": np.trunc, "identity": lambda x: x, "logical_not": lambda x: np.logical_not(x).astype(F32),
}

OPS: dict[str, Op] = {}
for _name, (_fn, _red) in _BINARY.items():
    OPS[_name] = Op(_name, "binary", binary=_fn, reduce=_red)
for _name, _fn in _BITVEC.items():
    OPS[_name] = Op(_name, "binary", binary=_fn, kind="bitvec")
OPS["invert"] = Op("invert", "unary", unary=np.invert, kind="bitvec")
for _name, _fn in _UNARY.items():
    OPS[_name] = Op(_name, "unary", unary=_fn)
# reductions: nl.max(x, axis) reduces; as an op code it is the binary max
OPS["max"] = Op("max", "reduce", binary=np.maximum, reduce=np.maximum.reduce)
OPS["min"] = Op("min", "reduce", binary=np.minimum, reduce=np.minimum.reduce)
OPS["sum"] = Op("sum", "reduce", binary=np.add, reduce=np.add.reduce)
OPS["prod"] = Op("prod", "reduce", binary=np.multiply, reduce=np.multiply.reduce)
OPS["mean"] = Op("mean", "reduce", binary=None, reduce=lambda a, axis, keepdims=False: np.mean(
    a, axis=axis, keepdims=keepdims, dtype=F32))
OPS["var"] = Op("var", "reduce", binary=None, reduce=lambda a, axis, keepdims=False: np.var(
    a, axis=axis, keepdims=keepdims, dtype=F32))
OPS["all"] = Op("all", "reduce", binary=np.logical_and, reduce=lambda a, axis, keepdims=False: np.all(
    a != 0, axis=axis, keepdims=keepdims).astype(F32))

_UFUNCS = {np.add: "add", np.subtract: "subtract", np.multiply: "multiply", np.divide: "divide",
           np.maximum: "maximum", np.minimum: "minimum", np.power: "power", np.exp: "exp", np.log: "log",
           np.sqrt: "sqrt", np.square: "square", np.tanh: "tanh", np.abs: "abs", np.negative: "negative",
           np.reciprocal: "reciprocal", np.sin: "sin", np.cos: "cos", np.sign: "sign", np.max: "max",
           np.min: "min", np.sum: "sum", np.bitwise_and: "bitwise_and", np.bitwise_or: "bitwise_or",
           np.bitwise_xor: "bitwise_xor", np.equal: "equal", np.greater: "greater", np.less: "less",
           np.greater_equal: "greater_equal", np.less_equal: "less_equal", np.not_equal: "not_equal",
           np.mod: "mod", np.fmod: "fmod", np.arctan: "arctan", np.floor: "floor", np.ceil: "ceil",
           np.left_shift: "left_shift", np.right_shift: "right_shift"}


_ALIASES: dict[int, str] = {}


def alias(fn: object, name: str) -> None:
    """Let an API function double as an op code (nl.copy is the identity activation)."""
    _ALIASES[id(fn)] = name


def lookup(op: object) -> Op | None:
    if isinstance(op, Op):
        return op
    if id(op) in _ALIASES:
        return OPS[_ALIASES[id(op)]]
    try:
        return OPS[_UFUNCS[op]] if op in _UFUNCS else None
    except TypeError:  # unhashable
        return None
