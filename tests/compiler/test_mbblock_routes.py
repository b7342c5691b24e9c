"""The MobileNet block's depthwise taps split over the engines with every engine's other work as the block builds it
(BlockBuilder.other_work, exact_costs): at 16 bits the expand's and the depthwise's relu6 evictions are VectorE's
(not ScalarE's, as the tally before counted them), and with several images an image's project evictions and
TensorE's residual matmuls are spread over its chunks; at f32 the earlier tally stays (see exact_costs). Checked
against test_conv_mobilenet's NumPy block on the NKI interpreter."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_conv_mobilenet import block_ref, block_text, on_chip
from test_conv_padded import NARROW
from test_mbblock_evict import signed_inputs
from tilec.compiler import build_mbblock as mbb
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang


def test_tally_charges_each_engine_what_it_runs():
    """ScalarE is charged the expand's eviction only at f32; at 16 bits with one image nothing beside the taps,
    with several images a share of the project's ScalarE copies (the residual on TensorE: its matmuls too)."""
    seen = {}
    orig = mbb.BlockBuilder.other_work

    def record(self, rows):
        seen[(self.dtype, self.N)] = orig(self, rows)
        return seen[(self.dtype, self.N)]
    mp = pytest.MonkeyPatch()
    mp.setattr(mbb.BlockBuilder, "other_work", record)
    try:
        for dt, n in (("f32", 1), ("bf16", 1), ("bf16", 2)):
            compile_loaded(lang.load(block_text(dt, n, 16, 96, 14, 14)))
    finally:
        mp.undo()
    assert seen[("f32", 1)][1] > 0  # the expand's eviction, held against ScalarE as before
    assert seen[("bf16", 1)][1] == 0  # both evictions are VectorE's, the project's come after every tap
    pe1, act2, pe2 = seen[("bf16", 1)][0], seen[("bf16", 2)][1], seen[("bf16", 2)][0]
    assert act2 > 0 and pe2 > pe1  # the project's ScalarE copies and TensorE's residual matmuls, shared out


@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_exact_tally_moves_taps_off_tensor_engine(monkeypatch, dt):
    """At 16 bits, two images: TensorE (the residual's matmuls now counted) takes fewer diagonal-matmul taps than
    under the earlier tally, and Y still matches NumPy."""
    prog = lang.load(block_text(dt, 2, 16, 96, 14, 14))
    comp = compile_loaded(prog)
    assert on_chip(comp)
    monkeypatch.setattr(mbb.BlockBuilder, "exact_costs", lambda self: False)
    before = compile_loaded(lang.load(block_text(dt, 2, 16, 96, 14, 14)))
    assert comp.source.count("nc_matmul") < before.source.count("nc_matmul")
    inputs = signed_inputs(prog)
    out = comp.run(**inputs)
    x = {k: v.astype(NARROW[dt]).astype(np.float64) for k, v in inputs.items()}
    assert_matches(prog, "Y", out["Y"], block_ref(x, dt))
