"""A strided folded 3x3 fp32 conv's lone taps (r, 0) paired down the rows (conv_vpair): a second band buffer holds
the band's copy 0 and X one row down, made on chip (GpSimdE and VectorE copies, no DMA), so (0, 0) and (1, 0) share
a matmul of 128 contraction rows: 5 matmuls per band instead of 6. Checked on the kernels' text and against a NumPy
float64 conv on the interpreter (several bands, batch 2, an odd height whose last band reads X's bottom halo, two
out-channel tiles, a band of one output row, a last band split in two groups); 16-bit convs (DMA-bound) keep 6."""
from __future__ import annotations

import re

import numpy as np
import pytest

from numpy_refs import conv
from test_conv_fold_columns import PADDED
from tilec.compiler.api import compile_loaded
from tilec.compiler.wrap import unwrap
from tilec.lang import api as lang
from tilec.tolerance import max_error, tolerance

CASES = {  # N, H, W, K
    "bands": (1, 16, 16, 32),
    "batch2": (2, 14, 10, 128),
    "odd_height": (1, 15, 12, 64),
    "two_k_tiles": (1, 10, 8, 129),
    "one_row": (1, 2, 4, 8),
    "split_last_band": (1, 32, 32, 64),  # the last band as two accumulation groups (conv_split)
}


@pytest.fixture(scope="module", params=sorted(CASES))
def compiled(request):
    n, h, w, k = CASES[request.param]
    program = lang.load(PADDED.format(s=2), {"N": n, "H": h, "W": w, "K": k})
    return program, compile_loaded(program, nki="0.6")


def test_lone_taps_paired_down_the_rows(compiled) -> None:
    program, comp = compiled
    src = unwrap(comp.source)
    # one accumulation group per band (K = 129: per out-channel part; conv_split: the last band's two groups)
    groups = len(re.findall(r"Y_acc\w* = nl\.ndarray\(", src))
    assert src.count("nc_matmul(") == 5 * groups
    # the pair's matmul reads the second buffer over 128 rows, last in its band, into the output columns 1..
    pair = re.findall(r"nc_matmul\(dst=Y_acc\w*\[[^\n]*1:\d+\], stationary=Wt_T\[:, 3[,\]][^\n]*"
                      r"moving=X_band_down\[:, ", src)
    assert len(pair) == groups and "stationary=Wt_T[0:64, 4" in src and "Wt_T[0:64, 5" not in src
    assert re.search(r"tensor_copy\(dst=X_band_down\[0:64, [^\n]*engine=nisa\.engine\.gpsimd", src)
    assert re.search(r"tensor_copy\(dst=X_band_down_run\[64:128, 0:\d+\], src=X_band_run\[64:128, "
                     + str(dict(program.sizes)["W"] - 1) + ":", src)
    assert "dma_copy(dst=X_band_down" not in src


def test_paired_kernel_matches_numpy(compiled) -> None:
    program, comp = compiled
    rng = np.random.default_rng(5)
    given = {t.name: rng.random(t.shape, dtype=np.float32) - 0.5 for t in program.inputs}
    x, w = (given[name].astype(np.float64) for name in ("X", "Wt"))
    want = conv(np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)]), w, stride=2)
    got = np.asarray(comp.run(**given)["Y"], np.float64)
    assert got.shape == want.shape
    assert max_error(got, want) <= tolerance("f32", x.shape[1] * 9, float(np.abs(want).max()), None)


def test_16_bit_keeps_six_matmuls() -> None:
    program = lang.load(PADDED.format(s=2).replace("f32[", "bf16["), {"H": 16, "W": 16, "K": 32})
    src = unwrap(compile_loaded(program, nki="0.6").source)
    assert "X_band_down" not in src and src.count("nc_matmul(") == 6 * src.count("X_band = nl.ndarray(")
