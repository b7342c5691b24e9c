"""Level-A IR (tilec/compiler/nest.py): lowered one to one from every example, printed stably, and evaluated on
NumPy to the same values as the reference evaluator (tilec/lang/evaluator.py)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import EXAMPLES, inputs_for, program
from tilec.compiler.nest import lower_nest, print_nest
from tilec.compiler.nest_eval import evaluate_nest
from tilec.lang import api as lang

# small sizes keep the vectorised evaluation of every loop iteration cheap
SIZES = {
    "avgpool": {"C": 128, "H": 8, "W": 8},
    "conv2d": {"N": 1, "C": 128, "H": 6, "W": 7, "K": 128},
    "conv_bias_maxpool": {"N": 1, "C": 128, "H": 6, "W": 8, "K": 128},
    "conv_relu": {"N": 1, "C": 128, "H": 6, "W": 6, "K": 128},
    "linear": {"M": 64, "K": 96, "N": 80},
    "matmul": {"M": 64, "K": 96, "N": 80},
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


@pytest.mark.parametrize("name", ["conv_bias_maxpool", "softmax"])
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
