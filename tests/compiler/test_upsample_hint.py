"""A nearest-upsample read inside arithmetic (an FPN's `Y = P[.., i / 2, j / 2] + L[..]`) was refused at the `/` with a
hint that spelled out the copy that does compile; that copy is now made by the compiler (permute_split), and following
the hint by hand also matches NumPy. A modulo keeps the plain hint (the reference evaluator)."""
from __future__ import annotations

import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang

FPN = """\
kernel fpn(P: f32[N, C, H, W], L: f32[N, C, 2*H, 2*W]) -> Y
  default N = 2, C = 136, H = 5, W = 7
  Y: f32[N, C, 2*H, 2*W]
  for n in 0..N, c in 0..C, i in 0..2*H, j in 0..2*W:
    Y[n, c, i, j] = P[n, c, i / 2, j / 2] + L[n, c, i, j]
"""


def test_division_in_arithmetic_compiles_as_the_hint_s_copy_then_the_add() -> None:
    """Once refused with a hint naming the copy; since lang15 permute_split.split_shifted_reads writes that copy
    (`P_at[n, c, i, j] = P[n, c, i / 2, j / 2]`) itself."""
    program = lang.load(FPN)
    rng = np.random.default_rng(3)
    p, l = rng.random((2, 136, 5, 7), dtype=np.float32), rng.random((2, 136, 10, 14), dtype=np.float32)
    c = compile_loaded(program)
    assert "P_at" in c.stages["select"]
    np.testing.assert_allclose(c.run(P=p, L=l)["Y"], p.repeat(2, axis=2).repeat(2, axis=3) + l, rtol=1e-6)


def test_following_the_hint_compiles_and_matches_numpy() -> None:
    split = FPN.replace("  Y: f32[N, C, 2*H, 2*W]\n", "  U: f32[N, C, 2*H, 2*W]\n  Y: f32[N, C, 2*H, 2*W]\n").replace(
        "    Y[n, c, i, j] = P[n, c, i / 2, j / 2] + L[n, c, i, j]\n",
        "    U[n, c, i, j] = P[n, c, i / 2, j / 2]\n    Y[n, c, i, j] = U[n, c, i, j] + L[n, c, i, j]\n")
    program = lang.load(split)
    rng = np.random.default_rng(3)
    p, l = rng.random((2, 136, 5, 7), dtype=np.float32), rng.random((2, 136, 10, 14), dtype=np.float32)
    got = compile_loaded(program).run(P=p, L=l)["Y"]
    np.testing.assert_allclose(got, p.repeat(2, axis=2).repeat(2, axis=3) + l, rtol=1e-6)


def test_two_modulos_in_a_read_keep_the_reference_hint_and_say_what_compiles() -> None:
    text = FPN.replace("P[n, c, i / 2, j / 2]", "P[n, c, i % 5, j % 7]")
    with pytest.raises(TilecError, match=r"floor modulo") as info:
        compile_loaded(lang.load(text))
    assert "U[" not in info.value.hint and "--backend ref" in info.value.hint and "`v % m`" in info.value.hint
