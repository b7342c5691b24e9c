"""Level-A IR (tilec/compiler/nest.py): lowered one to one from every example, printed stably, and evaluated on
NumPy to the same values as the reference evaluator (tilec/lang/evaluator.py)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from compiler_helpers import EXAMPLES, inputs_for, program
from tilec.compiler.nest import Assign, Loop, lower_nest, map_loads, print_nest, verify_nest, walk
from tilec.compiler.nest_eval import evaluate_nest
from tilec.errors import InternalError
from tilec.lang import api as lang

# small sizes keep the vectorised evaluation of every loop iteration cheap
SIZES = {
    "avgpool": {"C": 128, "H": 8, "W": 8},
    "conv2d": {"N": 1, "C": 128, "H": 6, "W": 7, "K": 128},
    "conv_bias_maxpool": {"N": 1, "C": 128, "H": 6, "W": 8, "K": 128},
    "conv_relu": {"N": 1, "C": 128, "H": 6, "W": 6, "K": 128},
    "linear": {"M": 64, "K": 96, "N": 80},
    "matmul": {"M": 64, "K": 96, "N": 80},
    "mobilenet_block": {"C": 8, "E": 24, "H": 6, "W": 5},
    "resnet_block": {"C": 16, "H": 6, "W": 5},
    "transpose": {"M": 96, "N": 160},
    "vector_add": {"L": 1000},
}
NAMES = sorted(p.stem for p in EXAMPLES.glob("*.tl"))


@pytest.mark.parametrize("name", NAMES)
def test_level_a_means_what_the_program_means(name: str) -> None:
    prog = program(name, SIZES.get(name))
    inputs = inputs_for(prog)
    want = lang.evaluate(prog, inputs)
    got = evaluate_nest(lower_nest(prog), inputs)
    for out, value in want.items():
        np.testing.assert_allclose(got[out], value, rtol=2e-5, atol=2e-6 * max(1.0, np.abs(value).max()), err_msg=out)


@pytest.mark.parametrize("name", ["conv_bias_maxpool", "mobilenet_block", "resnet_block", "softmax"])
def test_level_a_printer_golden(name: str, golden) -> None:
    golden.check(f"compiler/nest/{name}.txt", print_nest(lower_nest(program(name, SIZES.get(name)))))


RECURRENCE = """kernel scan(A: f32[N]) -> Y
  default N = 6
  Y: f32[N]
  Y[0] = A[0]
  for i in 0..N - 1:
    Y[i + 1] = Y[i] * 0.5 + A[i + 1]
"""


def test_a_loop_carried_dependence_runs_in_order() -> None:
    prog = lang.load(RECURRENCE)
    inputs = inputs_for(prog)
    np.testing.assert_allclose(evaluate_nest(lower_nest(prog), inputs)["Y"], lang.evaluate(prog, inputs)["Y"],
                               rtol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_every_example_passes_the_level_a_verifier(name: str) -> None:
    verify_nest(lower_nest(program(name, SIZES.get(name))))


SHIFTED = """kernel shifted(X: f32[R, C]) -> Y
  default R = 5, C = 7
  Y: f32[R, C]
  for i in 0..R, j in 0..C:
    Y[i, j] = (X[i - 1, j + 2] ?? FILL) * 2 + relu(X[i + 1, j - 1] ?? FILL)
"""


@pytest.mark.parametrize("fill", ["0", "-inf", "1.5"])
def test_a_padded_read_means_np_pad(fill: str) -> None:
    """Level A evaluates `X[i - 1, j + 2] ?? fill` as np.pad(X, fill) read at the shifted index (and as the reference
    evaluator does), never wrapping around the edge as a plain NumPy index would."""
    prog = lang.load(SHIFTED.replace("FILL", fill))
    x = inputs_for(prog)["X"]
    pad = np.pad(x, 2, constant_values=float(fill))
    with np.errstate(invalid="ignore"):
        want = pad[1:6, 4:11] * 2 + np.maximum(pad[3:8, 1:8], 0)
    got = evaluate_nest(lower_nest(prog), {"X": x})["Y"]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got, lang.evaluate(prog, {"X": x})["Y"], rtol=1e-6)
    assert f"(X[i - 1, j + 2] ?? {fill}) * 2 + relu(X[i + 1, j - 1] ?? {fill})" in print_nest(lower_nest(prog))
    verify_nest(lower_nest(prog))


def test_the_padded_fill_is_rounded_to_the_buffer_dtype() -> None:
    prog = lang.load(SHIFTED.replace("FILL", "0.1").replace("X: f32", "X: bf16"))
    x = inputs_for(prog)["X"]
    got = evaluate_nest(lower_nest(prog), {"X": x})["Y"]
    np.testing.assert_allclose(got, lang.evaluate(prog, {"X": x})["Y"], rtol=1e-6)


def test_the_verifier_rejects_an_unpadded_read_outside_its_buffer() -> None:
    k = lower_nest(lang.load(SHIFTED.replace("FILL", "0")))
    stmt = next(s for s in walk(k.body) if isinstance(s, Assign))
    unpadded = replace(stmt, expr=map_loads(stmt.expr, lambda a: replace(a, fill=None)))
    broken = replace(k, body=_swap(k.body, stmt, unpadded))
    with pytest.raises(InternalError, match=r"X\[i - 1, j \+ 2\] \(tl:5\) reaches -1..3 in dimension 0 of X"):
        verify_nest(broken)


def _swap(body, old, new):
    return tuple(replace(s, body=_swap(s.body, old, new)) if isinstance(s, Loop) else new if s is old else s
                 for s in body)
