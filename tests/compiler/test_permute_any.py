"""Permutes of any rank (issue 13: data movement): every permutation of 3 and 4 dimensions compiles and moves the
values exactly (np.transpose of the dtype-rounded input), at sizes of several partition tiles; a permute is one
transpose pass, a chain of them through HBM intermediates (select_permute.chain), or HBM -> HBM DMAs when it keeps
its last dimension and the two sides share long runs (select_permute.dma_permute)."""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.compiler.select_permute import dma_runs, one_step, plan
from tilec.lang import api as lang

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
NAMES = "abcde"


def permute_text(shape: tuple[int, ...], perm: tuple[int, ...], dtype: str = "f32") -> str:
    """Y[names in perm order] = X[names]: Y = np.transpose(X, perm)."""
    names = NAMES[:len(shape)]
    sizes = ", ".join(str(n) for n in shape)
    out = ", ".join(str(shape[p]) for p in perm)
    return (f"kernel perm(X: {dtype}[{sizes}]) -> Y\n  Y: {dtype}[{out}]\n"
            f"  for {', '.join(f'{v} in 0..{n}' for v, n in zip(names, shape))}:\n"
            f"    Y[{', '.join(names[p] for p in perm)}] = X[{', '.join(names)}]\n")


def run_exact(shape: tuple[int, ...], perm: tuple[int, ...], dtype: str = "f32"):
    c = compile_loaded(lang.load(permute_text(shape, perm, dtype)))
    x = np.random.default_rng(7).random(shape).astype(np.float32)
    got = np.asarray(c.run(X=x)["Y"], np.float32)
    np.testing.assert_array_equal(got, x.astype(NP[dtype]).astype(np.float32).transpose(perm))  # moves bits: exact
    return c


@pytest.mark.parametrize("perm", [p for p in itertools.permutations(range(3)) if p != (0, 1, 2)])
def test_every_permutation_of_three_dimensions(perm):
    run_exact((136, 3, 130), perm)


@pytest.mark.parametrize("perm", [p for p in itertools.permutations(range(4)) if p != (0, 1, 2, 3)])
def test_every_permutation_of_four_dimensions(perm):
    run_exact((130, 3, 2, 72), perm)


CYCLES = [((64, 16, 7, 28), (1, 2, 0, 3)),  # a 3-cycle keeping the last dimension: two transposes (short runs)
          ((130, 2, 3, 96), (1, 2, 0, 3)),  # the same with 384-byte runs: HBM -> HBM DMAs
          ((2, 130, 4, 3), (2, 0, 1, 3)),  # [a, b, c, d] -> [c, a, b, d] with a short last dimension
          ((3, 140, 2, 136), (3, 1, 0, 2))]  # a 4-cycle moving the last dimension


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape,perm", CYCLES)
def test_cycles_in_every_dtype(shape, perm, dtype):
    run_exact(shape, perm, dtype)


def test_a_chain_goes_through_hbm_intermediates_in_the_source_dtype():
    c = run_exact((64, 16, 7, 28), (1, 2, 0, 3), "bf16")  # 56-byte runs: two transpose passes
    assert "transpose Y -> Y" in c.stages["select"]
    assert "Y_perm = nl.ndarray((64, 28, 16, 7), dtype=nl.bfloat16, buffer=nl.hbm)" in c.source
    assert c.source.count("nisa.nc_transpose(") == 2  # one transpose instruction per step (inside its loops)
    assert "step 2 of 2 (Y = permute of Y_perm)" in c.stages["schedule"]


def test_long_shared_runs_move_by_dma_without_transposes():
    c = run_exact((130, 2, 3, 96), (1, 2, 0, 3))  # 384-byte runs
    assert "copy Y -> Y" in c.stages["select"] and "nc_transpose" not in c.source
    assert "nisa.dma_copy(dst=Y[" in c.source and "src=X[" in c.source


def test_the_search_and_the_choice():
    T = tuple
    assert one_step(T("abc"), T("bca")) == "runs" and one_step(T("abc"), T("cba")) == "pair"
    assert one_step(T("abcd"), T("bcad")) == "dma" and one_step(T("abcd"), T("cadb")) == ""
    heads = dict(s=512, n=1, h=8, d=64)
    assert plan(T("snhd"), T("nhsd"), heads, 4) == [("dma", T("nhsd"))]  # 256-byte runs: one DMA step
    assert dma_runs(T("snhd"), T("nhsd"), heads) == (("n", "h"), ("s", "d"))
    assert dma_runs(T("abcd"), T("dabc"), heads | dict(a=1, b=1, c=1)) is None  # the last dimension moves
    steps = plan(T("abcd"), T("bcad"), dict(a=64, b=32, c=28, d=28), 4)  # 112-byte runs: two transposes
    assert steps is not None and [k for k, _ in steps] == ["runs", "runs"] and steps[-1][1] == T("bcad")
    steps = plan(T("nchw"), T("nwhc"), dict(n=2, c=256, h=28, w=28), 4)  # NCHW -> NWHC
    assert steps is not None and [k for k, _ in steps] == ["runs", "dma"]
    assert plan(T("abc"), T("bca"), dict(a=2, b=3, c=4), 4) == [("runs", T("bca"))]  # always one transpose pass


def test_a_permute_of_five_dimensions():
    run_exact((3, 130, 2, 4, 5), (4, 2, 0, 3, 1))


def test_a_swap_of_runs_is_priced_at_the_models_transpose_rate(monkeypatch):
    """The compute side of a swap of runs comes from the performance model's constants (engine_passes): on trn2 it
    stays under the DMA passes, so the choices above are the DMA's; with fp32 transposes 16 times dearer (a model
    without transpose mode and a slower TensorE) the fp32 step costs more and the 16-bit one does not move."""
    import dataclasses

    from tilec.compiler import select_permute
    from tilec.perf import params
    T = tuple
    ext = dict(b=4, i=512, j=512)
    src, out = T("bij"), T("bji")
    f32, f16 = (select_permute.step_cost("runs", src, out, ext, size) for size in (4, 2))
    assert f32 == f16 == select_permute.TRANSPOSE_COST  # DMA-bound on trn2
    assert select_permute.engine_passes(512, 512, 4) < select_permute.TRANSPOSE_COST
    slow = dataclasses.replace(params.TRN2, transpose_fp32_speedup=params.Param(1 / 8, "16x dearer fp32 transposes"))
    monkeypatch.setitem(params.TARGETS, "trn2", slow)
    assert select_permute.step_cost("runs", src, out, ext, 4) > 2 * f32
    assert select_permute.step_cost("runs", src, out, ext, 2) == f16
