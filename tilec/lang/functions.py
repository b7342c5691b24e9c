"""The element-wise functions of the language: one table, keyed by the name a program calls.

    Function = name, arity, NumPy meaning (float32 in, float32 out), NKI spelling, instruction, engine,
               whether it fuses into a PSUM eviction (an activation may read PSUM and write SBUF in one pass)

The checker takes arities from here, the reference evaluator the NumPy meanings, the compiler the instruction and
NKI spelling; the interpreter's own definitions of the same `nl.*` names (tilec/nki/alu.py) are checked against
these meanings by tests/lang/test_function_table.py, so the interpreter stays an independent model of the hardware
rather than a copy of the reference. Adding a function is one row here plus its name in grammar/tilec.lark.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

F32 = np.float32
_erfc = np.vectorize(math.erfc, otypes=[np.float64])
GELU_K = math.sqrt(2.0 / math.pi)  # GELU's tanh form: 0.5 x (1 + tanh(GELU_K (x + 0.044715 x^3)))


@dataclass(frozen=True)
class Function:
    name: str
    arity: int
    numpy: Callable[..., np.ndarray]  # float32 arrays -> float32 array
    nki: str  # the nl.* name: an activation function or an ALU operator
    instr: str  # activation (ScalarE) | tensor_tensor (VectorE, two tensors) | cast (a dtype conversion)
    engine: str
    evicts: bool = False  # an activation that may read the PSUM accumulator directly (fused eviction)

    def __call__(self, *args: np.ndarray | np.floating) -> np.ndarray:
        with np.errstate(all="ignore"):  # inf/nan propagate as on the engines
            return np.asarray(self.numpy(*(np.asarray(a, F32) for a in args)), dtype=F32)


def _f64(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """Evaluate in float64 and round once: the reference is the correctly rounded value."""
    return lambda x: fn(x.astype(np.float64)).astype(F32)


def _act(name: str, fn: Callable[[np.ndarray], np.ndarray]) -> Function:
    return Function(name, 1, fn, name, "activation", "act", evicts=True)


def _cast(name: str) -> Function:
    return Function(name, 1, lambda x: x, "", "cast", "")  # rounding to the dtype is the evaluator's round_to


FUNCTIONS: dict[str, Function] = {f.name: f for f in (
    Function("max", 2, np.maximum, "maximum", "tensor_tensor", "dve"),
    Function("min", 2, np.minimum, "minimum", "tensor_tensor", "dve"),
    _act("relu", lambda x: np.maximum(x, F32(0))),
    _act("exp", _f64(np.exp)),
    _act("log", _f64(np.log)),
    _act("sqrt", _f64(np.sqrt)),
    _act("rsqrt", _f64(lambda x: 1.0 / np.sqrt(x))),
    _act("reciprocal", _f64(lambda x: 1.0 / x)),
    _act("tanh", _f64(np.tanh)),
    _act("sigmoid", _f64(lambda x: 1.0 / (1.0 + np.exp(-x)))),
    # exact (erf) GELU, as nl.gelu: 1 + erf(x / sqrt 2) as erfc(-x / sqrt 2), which does not cancel to 0 for x < -8
    _act("gelu", _f64(lambda x: 0.5 * x * _erfc(-x / math.sqrt(2.0)))),
    _act("abs", np.abs),
    _act("silu", _f64(lambda x: x / (1.0 + np.exp(-x)))),  # x * sigmoid(x) (swish), as nl.silu
    _act("softplus", _f64(lambda x: np.logaddexp(0.0, x))),  # log(1 + exp(x)), as nl.softplus
    _act("mish", _f64(lambda x: x * np.tanh(np.logaddexp(0.0, x)))),  # x * tanh(softplus(x)), as nl.mish
    # GELU's tanh form, as nl.gelu_apprx_tanh (the NKI shared docs' activation table: "Gelu with Tanh Approximation")
    Function("gelu_tanh", 1, _f64(lambda x: 0.5 * x * (1.0 + np.tanh(GELU_K * (x + 0.044715 * x ** 3)))),
             "gelu_apprx_tanh", "activation", "act", evicts=True),
    _cast("f32"), _cast("f16"), _cast("bf16"),
)}

ACTIVATIONS = tuple(name for name, f in FUNCTIONS.items() if f.instr == "activation")
# an accumulating statement's operator -> the ALU op its reduction runs on the engines (tensor_reduce, tensor_tensor)
ACCUMULATE = {"+=": "add", "max=": "maximum", "min=": "minimum"}


def function(name: str) -> Function | None:
    return FUNCTIONS.get(name)
