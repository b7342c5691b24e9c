"""benchmarks/families' padded 5x5 pools (max and avg with the padding counted, pad 2, stride 1 and 2), the programs
themselves at small sizes, default schedule, on the NKI interpreter against NumPy (np.pad and sliding windows:
test_pool_window.reference), f32/f16/bf16, batch 1 and 2, channel counts under and over one partition tile."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_pool_window import NP, reference
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

FOLDER = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "families"
FAMILIES = {"maxpool5x5s1": ("max", 1), "maxpool5x5s2": ("max", 2), "avgpool5x5s1": ("avg", 1),
            "avgpool5x5s2": ("avg", 2)}


def run_family(name: str, dtype: str, **sizes: int) -> str:
    text = (FOLDER / f"{name}.tl").read_text()
    prog = lang.load(text if dtype == "f32" else text.replace("f32[", f"{dtype}["), sizes)
    compiled = compile_loaded(prog, None)
    x = np.random.default_rng(5).standard_normal(prog.tensors["X"].shape).astype(NP[dtype])
    got = compiled.run(X=x)["Y"]
    kind, stride = FAMILIES[name]
    want = reference(x.astype(np.float32), kind, 5, stride, 2)
    assert np.shape(got) == want.shape
    assert_matches(prog, "Y", got, want)
    return compiled.source


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("sizes", [dict(N=1, C=6, H=11, W=9), dict(N=2, C=96, H=13, W=14),
                                   dict(N=1, C=160, H=20, W=17)])
def test_padded_5x5_family_matches_numpy(name, dtype, sizes):
    """Odd and even sizes (stride 2's last window reads two padded rows or one), few channel rows (blocks of output
    rows on the other partitions), two partition tiles, and a ragged channel count."""
    run_family(name, dtype, **sizes)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_padded_5x5_family_at_its_layer_shape_compiles(name):
    """The benchmark's own shape (192 x 28 x 28 or 64 x 112 x 112) in bf16, checked against NumPy too."""
    run_family(name, "bf16")
