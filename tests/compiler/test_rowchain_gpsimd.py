"""A row chain whose VectorE streams more than the other engines (a cross-entropy per row: its maximum, the product
T * X before the target's sum, that sum) has its tensor_tensors of SBUF tiles on GpSimdE
(rowchain_rewrites.products_on_gpsimd), except on trn1, where VectorE and GpSimdE do not access SBUF in parallel
(Target.vector_gpsimd_split). The result against NumPy."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_matches, inputs_for
from tilec.compiler import ir
from tilec.compiler.api import compile_loaded
from tilec.compiler.pipeline import compile_program
from tilec.lang import api as lang

XENT = pathlib.Path(__file__).parents[1] / "programs" / "gaps15" / "cross_entropy.tl"  # (gaps15's row)
SIZES = {"M": 512, "N": 128}  # four row tiles: the pipelined chain


def _products(kernel: ir.Kernel) -> list[ir.Binary]:
    return [s for s in ir.walk(kernel.body) if isinstance(s, ir.Binary) and s.op == "multiply"]


@pytest.mark.parametrize("target, engine", [("trn2", "gpsimd"), ("trn1", "")])
def test_the_products_move_to_gpsimd_where_the_engines_overlap(target: str, engine: str) -> None:
    prog = lang.load(XENT, SIZES)
    products = _products(compile_program(prog, target=target).kernel)
    assert products and all(s.engine == engine for s in products)
    c = compile_loaded(prog, target=target)
    a = inputs_for(prog)
    x = a["X"].astype(np.float64)
    m = x.max(1)
    want = np.log(np.exp(x - m[:, None]).sum(1)) + m - (x * a["T"]).sum(1)
    assert_matches(prog, "L", c.run(**a)["L"], want)
