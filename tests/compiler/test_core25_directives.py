"""Directives of core25, checked against NumPy at small shapes: column sums whose free tiles do not divide their
columns into a narrower output (each column part evicts into a tile of its own width); a directive over the loops
of a sum a source rewrite moved into a temporary (attention's O -> O_acc) reaches the sum."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import run_in_own_dtypes
from test_core20_directives import matches
from tilec.compiler.api import compile_loaded, read_schedule
from tilec.errors import TilecError
from tilec.lang import api as lang

ROOT = pathlib.Path(__file__).resolve().parents[2]

MEAN = """kernel colmean(A: bf16[{shape}]) -> s
  default {sizes}R = 96, F = 128
  s: bf16[{out}]
  for {outer}j in 0..F:
    s[{idx}j] = 0
    for i in 0..R:
      s[{idx}j] += A[{idx}i, j] / R
  schedule:
{schedule}
"""


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("schedule", ["tile s.j, 21\ntile s.i, 64", "tile s.j, 21", "tile s.j, 100\ntile s.i, 96"])
def test_ragged_column_tiles_of_a_narrow_mean(batched, schedule):
    """128 columns in tiles of 21 (six whole tiles and one of 2): each part's bf16 row is its own tile (the parts
    shared one name, and the verifier refused the last part's 2 columns written into the first part's 21)."""
    text = MEAN.format(sizes="B = 3, " if batched else "", shape="B, R, F" if batched else "R, F", out="B, F" if batched else "F",
                       outer="b in 0..B, " if batched else "", idx="b, " if batched else "",
                       schedule="\n".join("    " + line for line in schedule.splitlines()))
    _, out, x = run_in_own_dtypes(text, seed=25)
    want = x["A"].mean(axis=-2)
    np.testing.assert_allclose(np.asarray(out["s"], np.float64), want, rtol=2.0**-7, atol=2.0**-7)


ATTENTION = (ROOT / "tests/programs/gaps15/attn_inline.tl").read_text().split("  schedule:")[0]


def attention(schedule: str):
    text = ATTENTION.replace("default S = 256", "default S = 128") + "  schedule:\n" + "".join(
        f"    {line}\n" for line in schedule.splitlines())
    return compile_loaded(lang.load(text))


def softmax_pv(x: dict) -> np.ndarray:
    s = x["Q"] @ x["K"].T * 0.125
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True) @ x["V"]


@pytest.mark.parametrize("schedule, acc", [("tile O.d, 32", "tile O_acc.d, 32"), ("tile O.j, 64", "tile O_acc.j, 64"),
                                           ("tile O.d, 32\ntile O_acc.d, 64", "tile O_acc.d, 64")])
def test_directive_on_a_sum_a_rewrite_moved_reaches_the_sum(schedule, acc):
    """attention written inline: the rewrites make O's sum `O_acc += z_terms * V` and O its finish `O_acc / z`;
    `tile O.d, 32` is about the sum the user wrote (it tiled the finish only), the finish's tiles follow it; the
    summed loop j, which the finish lacks, goes to the sum alone; a directive naming O_acc itself wins. explain's
    schedule pastes back."""
    c = attention(schedule)
    text = printed(c)
    assert acc in text.splitlines(), text
    matches(c, softmax_pv, "O")
    assert attention(text).source == c.source


def test_a_directive_set_twice_on_a_moved_sum_is_quoted_as_written():
    with pytest.raises(TilecError) as err:
        attention("tile O.j, 64\ntile O.j, 128")
    assert "`tile O.j, 128` sets again what `tile O.j, 64`" in err.value.message, err.value.render()


def printed(c) -> str:
    return "".join(line + "\n" for line in c.stages["schedule"].splitlines() if line.strip() and
                   not line.startswith("#"))


FINISHED = """kernel fin(P: f32[M, K], V: f32[K, N], z: f32[M]) -> O
  default M = 128, K = 256, N = 128
  O: f32[M, N]
  for i in 0..M, d in 0..N:
    O[i, d] = 0
    for j in 0..K:
      O[i, d] += P[i, j] * V[j, d]
  for i in 0..M, d in 0..N:
    O[i, d] = O[i, d] / z[i]
  schedule:
    tile O.d, 64
"""


def test_directive_on_an_output_finished_in_place_reaches_its_sum():
    """`O += P V` then `O = O / z`: the sum moves into O_acc (inplace_split), the finish is its eviction's epilogue;
    `tile O.d, 64` tiles the sum."""
    c = compile_loaded(lang.load(FINISHED))
    assert "tile O_acc.d, 64" in printed(c).splitlines(), printed(c)
    assert compile_loaded(lang.load(FINISHED.split("  schedule:")[0])).source != c.source
    matches(c, lambda x: (x["P"] @ x["V"]) / x["z"][:, None], "O")


STANDARDIZE = (ROOT / "tests/programs/audit15/column_standardize.tl").read_text()


def test_buffers_of_a_tensor_readers_built_apart_load_sets_them_all():
    """X is read by mu, v and Y, each built alone loading its own tiles of X: `buffers X, 1` single-buffers each
    reader's tiles (it was refused as "sets the tiles of one statement's operand")."""
    sizes = {"M": 300, "N": 200}
    default = compile_loaded(lang.load(STANDARDIZE, sizes))
    c = compile_loaded(lang.load(STANDARDIZE, sizes), read_schedule("buffers X, 1"))
    assert c.source != default.source and printed(c).count("buffers X, 1") == 1, printed(c)
    assert compile_loaded(lang.load(STANDARDIZE, sizes), read_schedule(printed(c))).source == c.source

    def standardize(x: dict) -> np.ndarray:
        mu = x["X"].mean(axis=0)
        return (x["X"] - mu) / np.sqrt(((x["X"] - mu) ** 2).mean(axis=0) + 1e-5)
    matches(c, standardize)


def test_buffers_of_a_tensor_readers_built_apart_load_keeps_each_readers_checks():
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load(STANDARDIZE, {"M": 300, "N": 200}), read_schedule("buffers X, 3"))
    assert "own rotation" in err.value.message and err.value.span is not None and err.value.span.line == 1


@pytest.mark.parametrize("program, sizes, schedule, hint", [
    ("keys_transpose", dict(B=2, H=3, S=200, D=72), "split Y.b, 2", "`split Y.s, N` or `split Y.d, N`"),
    ("keys_transpose", dict(B=2, H=3, S=200, D=72), "unroll Y.b", "`tile Y.s, N` sets its blocks"),
    ("keys_transpose", dict(B=2, H=3, S=200, D=72), "buffers K, 1", "remove the directive"),
    ("channel_max", dict(N=2, C=200, H=9, W=11), "tile Y.n, 64", "`tile Y.c, N` sets the rows summed per matmul"),
])
def test_refusals_name_what_to_write(program, sizes, schedule, hint):
    """Refusals that had no hint (the directive matrix's): each names the directive that applies instead."""
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load(ROOT / f"tests/programs/audit15/{program}.tl", sizes), read_schedule(schedule))
    assert err.value.span is not None and hint in err.value.hint, err.value.render()
