"""The schedule `tilec explain` prints pastes back: for every example and every gaps15 / audit15 / user20 / families
program, its directive lines written into the program's `schedule:` section give byte-identical kernels (the source
rewrites run with directives too, and the directives name the rewritten nests). A directive naming a loop a rewrite
replaced is an error at its line naming the loops to write instead."""
from __future__ import annotations

import importlib.util
import pathlib
import sys
from dataclasses import replace

import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.errors import TilecError
from tilec.lang import api as lang

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import families  # noqa: E402  (the families' tiny sizes)


def _module(name: str, path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


audit15 = _module("audit15_programs", pathlib.Path(__file__).with_name("test_audit15_programs.py"))
FOLDERS = ("examples", "tests/programs/gaps15", "tests/programs/audit15", "tests/programs/user20",
           "benchmarks/families")
REFUSED = {"avgpool_flatten_fc", "conv_transpose2x2"}  # user20's programs the compiler still refuses (their tests)
PROGRAMS = [p for folder in FOLDERS for p in sorted((ROOT / folder).glob("*.tl")) if p.stem not in REFUSED]
# cheaper sizes where the programs' own are layer shapes (the families: their --tiny sizes; audit15: its tests'),
# except where the default takes a path only those sizes give (the depthwise kernel, the phased stem -> pool chain)
FAMILIES = {f.program.removesuffix(".tl"): f.tiny for f in families.FAMILIES}
OWN_SIZES = {"depthwise3x3", "depthwise3x3s2", "stem_maxpool"}


def sizes_of(path: pathlib.Path) -> dict[str, int] | None:
    if path.stem in OWN_SIZES:
        return None
    if path.parent.name == "families":
        return FAMILIES.get(path.stem)
    if path.parent.name == "audit15":
        return audit15.CASES[path.stem][0]
    return None
# sizes where a default takes another path than at the programs' own sizes: packed short rows (packed_rows.py), a
# pool's band computed from the row length (named sizes), several images
LARGER = {"tests/programs/user20/bn_nhwc.tl": {"N": 8, "H": 56, "W": 56, "C": 128},
          "benchmarks/families/maxpool3x3s2.tl": {"N": 8}}


def printed(c) -> str:
    """The directive lines of explain's "schedule applied" section (comments are the plans it does not set)."""
    return "".join(line + "\n" for line in c.stages["schedule"].splitlines() if line.strip() and
                   not line.startswith("#"))


def round_trip(path: pathlib.Path, sizes: dict[str, int] | None = None) -> None:
    program = lang.load(path, sizes)
    default = compile_loaded(program)
    text = printed(default)
    if not text:
        return  # nothing to paste (copies, permutes, fixed schedules)
    pasted = replace(program, kernel=replace(program.kernel, schedule=lang.parse_schedule(text, "<explain>")))
    assert compile_loaded(pasted).source == default.source, text


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_printed_schedule_pastes_back(path):
    round_trip(path, sizes_of(path))


@pytest.mark.parametrize("name", sorted(LARGER))
def test_printed_schedule_pastes_back_at_larger_sizes(name):
    round_trip(ROOT / name, LARGER[name])


def test_packed_rows_printed_over_the_packed_loops():
    c = compile_loaded(lang.load(ROOT / "tests/programs/user20/bn_nhwc.tl", LARGER["tests/programs/user20/bn_nhwc.tl"]))
    assert "tile Y.n_r, " in printed(c)  # the rewrite ran: Y[n_o, n_r, c] (k rows of C per partition)


BN = """kernel bn(X: f32[N, H, W, C], g: f32[C], b: f32[C]) -> Y
  default N = 1, H = 32, W = 32, C = 64
  Y: f32[N, H, W, C]
  for n in 0..N, h in 0..H, w in 0..W, c in 0..C:
    Y[n, h, w, c] = X[n, h, w, c] * g[c] + b[c]
  schedule:
"""


def test_directive_on_a_loop_the_rewrite_replaced_is_located(tmp_path):
    path = tmp_path / "bn.tl"
    path.write_text(BN + "    tile Y.h, 64\n")
    with pytest.raises(TilecError) as err:
        compile_loaded(lang.load(path))
    assert err.value.span is not None and err.value.span.line == 7
    assert "split_short_rows" in err.value.message and "n_o, n_r, c" in err.value.message, err.value.message
    assert "n_o, n_r, c" in err.value.hint


def test_directive_on_a_kept_loop_keeps_the_rewrite(tmp_path):
    """One directive no longer loses the rewrite: `tile Y.c, 64` applies to the packed nest (2 rows of 64 a
    partition by default, tiles of 64 elements with it), and the kernel computes X * g + b."""
    path = tmp_path / "bn.tl"
    path.write_text(BN + "    tile Y.c, 64\n")
    c = compile_loaded(lang.load(path))
    assert "g_rep" in c.source and "EltwisePlan(parts=128, free=64)" in c.stages["schedule"]
    rng = np.random.default_rng(0)
    x, g, b = rng.standard_normal((1, 32, 32, 64)), rng.standard_normal(64), rng.standard_normal(64)
    out = c.run(X=x.astype(np.float32), g=g.astype(np.float32), b=b.astype(np.float32))["Y"]
    np.testing.assert_allclose(out, x * g + b, rtol=1e-5, atol=1e-5)
