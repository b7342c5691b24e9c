"""Generated kernels: checked in and fresh, valid Python, deterministic, plain NKI 0.1, names sanitised."""
from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

from compiler_helpers import EXAMPLES, ROOT, check_against_reference
from tilec.compiler import regen
from tilec.compiler.api import compile_file, compile_loaded
from tilec.lang import api as lang

GENERATED = ROOT / "generated"


def test_generated_is_fresh():
    assert regen.stale() == [], "generated/ is stale: run `python -m tilec.compiler.regen`"


@pytest.mark.parametrize("path", sorted(GENERATED.glob("*.py")), ids=lambda p: p.stem)
def test_generated_kernel_is_plain_nki(path):
    text = path.read_text()
    tree = ast.parse(text)
    imports = sorted(ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)))
    assert imports == ["import neuronxcc.nki as nki", "import neuronxcc.nki.isa as nisa",
                       "import neuronxcc.nki.language as nl"]
    kernels = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert len(kernels) == 1
    decorators = [ast.unparse(d) for d in kernels[0].decorator_list]
    assert decorators == ["nki.compiler.skip_middle_end_transformations", "nki.jit"]
    assert "buffer=nl.shared_hbm" in text and "# tl:" in text


def test_every_example_is_generated():
    assert sorted(p.stem for p in GENERATED.glob("*.py")) == sorted(p.stem for p in EXAMPLES.glob("*.tl"))


def test_compilation_is_deterministic():
    a = compile_file(str(EXAMPLES / "conv_bias_maxpool.tl"), {"N": 1, "H": 20, "W": 20})
    b = compile_file(str(EXAMPLES / "conv_bias_maxpool.tl"), {"N": 1, "H": 20, "W": 20})
    assert a.source == b.source and a.stages == b.stages


HOSTILE = """\
kernel nl(lambda: f32[L], nisa: f32[L]) -> range
  default L = 512
  range: f32[L]
  for i in 0..L:
    range[i] = lambda[i] * nisa[i] + 2
"""


def test_dsl_names_are_sanitised():
    prog = lang.load(HOSTILE)
    c = compile_loaded(prog)
    ast.parse(c.source)
    assert "def nl_(lambda_, nisa_):" in c.source
    check_against_reference(c)


def test_run_accepts_positional_and_named_inputs():
    c = compile_file(str(EXAMPLES / "vector_add.tl"), {"L": 1024})
    x, y = np.arange(1024, dtype=np.float32), np.ones(1024, np.float32)
    assert np.array_equal(c.run(x, y)["z"], x + 1)
    assert np.array_equal(c.run(x=x, y=y)["z"], x + 1)


def test_public_api_reexport():
    import tilec
    c = tilec.compile_file(str(EXAMPLES / "transpose.tl"), shapes={"M": 128, "N": 256})
    assert c.kernel_name == "transpose" and list(c.stages)[0] == "lower"
    assert isinstance(pathlib.Path, type)
