"""Each fused builder (fusers.FUSERS) names what it built: the compiler's result keeps (kind, members) per fused
part, and the schedule note and `tilec explain` read that kind instead of recognising the part again."""
from __future__ import annotations

import pathlib

import pytest

from tilec.compiler.api import compile_file, explain
from tilec.compiler.fusers import Chain

ROOT = pathlib.Path(__file__).resolve().parents[2]

# one program per fuser, the smallest found among examples/ and tests/programs/ (each compiles in < 0.5 s)
CASES = [
    ("tests/programs/audit13/gmp.tl", Chain("global pool", ("Y",)), "# global pool Y:"),
    ("tests/programs/gaps15/attn_full.tl", Chain("attention head", ("sc", "m", "e", "z", "O_acc", "O")),
     "# attention sc -> m -> e -> z -> O_acc -> O on chip"),
    ("tests/programs/gaps15/diff_adjacent.tl", Chain("halo tiles", ("X_at", "X_at2", "Y")), "# fused X_at, X_at2, Y:"),
    ("tests/programs/audit15/column_standardize.tl", Chain("column chain", ("mu", "v", "Y")),
     "# fused column chain mu, v, Y:"),
    ("examples/softmax.tl", Chain("row chain", ("m", "e", "s", "Y")), "# fused row chain m, e, s, Y:"),
    ("examples/mobilenet_block.tl", Chain("MobileNet block", ("A", "B", "Y")), "# block A -> B -> Y on chip"),
]


@pytest.mark.parametrize("path, chain, note", CASES, ids=[c[1].kind for c in CASES])
def test_the_fuser_names_its_part(path, chain, note):
    c = compile_file(str(ROOT / path))
    assert c.result.chains == (chain,)
    assert note in c.stages["schedule"]
    text = explain(c)
    out = c.result.ops[[o.name for o in c.result.ops].index(chain.members[-1])].out
    for name in chain.members[:-1]:  # the temporaries: placed in the part that the fuser built
        tensor = c.result.ops[[o.name for o in c.result.ops].index(name)].out
        if tensor in c.program.tensors and c.program.tensors[tensor].kind == "temp":
            assert f"fused into the {chain.kind} writing {out}" in text
