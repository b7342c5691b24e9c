"""One store per row-pair band (conv10): a row-pair band holds output row 2i + h of channel k on partition h*K + k,
which is the output seen as [N, K, rows / 2, 2, W] with its phase axis moved before the channels: a permuted HBM
view (ir.View.perm), written by NKI 0.1 as an advanced index over nl.mgrid and by NKI 0.6 as an `.ap()` access
pattern. Checked against an independent NumPy formula (np.pad + one einsum per tap) on the interpreter in both NKI
forms, with batch 1 and 2, odd widths, a single pair of rows and a single column (dimensions the `squeeze` pass
removes from the permuted view), residual adds (the residual band arrives through the same view) and f32/f16/bf16;
and the verifier's and the codegen's refusals of a permuted view anywhere but the HBM side of a DMA."""
from __future__ import annotations

import dataclasses
import re

import pytest

from compiler_helpers import assert_matches, compile_and_run
from test_conv_padded import conv_ref, resnet_ref, rounded
from tilec.compiler import codegen, ir
from tilec.compiler.wrap import unwrap
from tilec.compiler.build_util import a, sl
from tilec.compiler.ir import Buf, Copy, Dma, Kernel, Reshape, View, full, whole
from tilec.compiler.verify import verify
from tilec.errors import InternalError
from kernel_numbers import numbered

SAME = """\
kernel same(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3]) -> Y
  default N = {n}, C = {c}, H = {h}, W = {w}, K = {k}
  Y: {dt}[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = 0
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[k, c, r, s]
"""

RESIDUAL = """\
kernel res(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3], S: {dt}[N, K, H, W]) -> Y
  default N = {n}, C = {c}, H = {h}, W = {w}, K = {k}
  Y: {dt}[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = S[n, k, y, x]
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[k, c, r, s]
"""


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("n, c, h, w, k, split", [
    (1, 64, 20, 13, 64, "split Y.y, 4\n"),  # several bands, peeled edge bands, an odd width
    (2, 48, 14, 9, 32, None),  # batch 2, the default bands
    (1, 64, 2, 7, 32, None),  # one pair of rows: the view's pair axis has extent 1 (squeezed away)
    (2, 48, 8, 1, 64, "split Y.y, 4\n"),  # one column: the view's column axis has extent 1 (squeezed away)
])
def test_row_pairs_store_each_band_once(nki, n, c, h, w, k, split):
    prog, comp, inputs, out = compile_and_run(SAME.format(dt="f32", n=n, c=c, h=h, w=w, k=k), nki, split)
    code = numbered(comp.source)
    # row pairs: both phases per matmul, 2 per tap column; a single column skips the taps reading past X's edges
    assert code.count("nisa.nc_matmul(") % (6 if w > 1 else 2) == 0 and f"({2 * k}, " in code
    stores = code.count("src=Y_band)")
    assert stores == code.count("Y_band = nl.ndarray") and stores >= 1 and "Y_band[0:" not in code
    assert ("nl.mgrid[0:2, " in code) if nki == "0.1" else (".ap(pattern=[[" in code)
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"]))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_residual_band_arrives_in_one_load(nki, dt):
    prog, comp, inputs, out = compile_and_run(RESIDUAL.format(dt=dt, n=2, c=48, h=12, w=11, k=32), nki)
    x = rounded(inputs, dt)
    # row pairs (every dtype): one load of the residual band, one store of the output band
    assert "S_skip = nl.ndarray((64, " in numbered(comp.source)
    assert numbered(comp.source).count("(dst=S_skip") == numbered(comp.source).count("S_skip = nl.ndarray") >= 1
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"]) + x["S"])


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_16_bit_row_pairs_load_whole_rows(nki, dt):
    # the band holds X's own columns (no zero halo columns): each copy loads as one run per partition, and the
    # outer tap columns compute the output columns that read inside X only, after the middle one
    prog, comp, inputs, out = compile_and_run(SAME.format(dt=dt, n=2, c=64, h=12, w=11, k=64), nki)
    code = numbered(comp.source)
    assert re.search(r"X_band = nl\.(zeros|ndarray)\(\(128, \d+, 11\)", code)  # 11 columns: X's own
    assert "Y_acc[:, :, 1:11]" in code and "Y_acc[:, :, 0:10]" in code
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"]))


def test_odd_row_count_keeps_one_phase():
    prog, comp, inputs, out = compile_and_run(SAME.format(dt="f32", n=1, c=64, h=15, w=6, k=64), "0.1")
    assert "nl.mgrid" not in comp.source and "Y_band = nl.ndarray((64, 15, 6)" in numbered(comp.source)  # K parts
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"]))


# ---- the IR: a permuted view is only the HBM side of a DMA ---------------------------------------------------------

Y = Buf("Y", "hbm", "f32", (4, 6))
Y3 = Buf("Y3", "hbm", "f32", (2, 2, 6))  # Y's rows as (pair, phase)
T = Buf("T", "sbuf", "f32", (4, 6))


def kernel(*body) -> Kernel:
    return Kernel("k", (), (Y,), (Reshape(Y3, Y), ir.Alloc(T)) + tuple(body))


def rows(perm=(1, 0, 2)) -> View:
    return View(Y3, (full(2), full(2), full(6)), perm)


def test_verifier_accepts_a_permuted_hbm_side_of_a_dma():
    k = kernel(Dma(rows(), whole(T)))
    verify(k, "test")
    assert rows().shape() == (2, 2, 6)
    assert "Y3[:2, :2, :6].permute(1, 0, 2)" in ir.print_ir(k)


@pytest.mark.parametrize("stmt, message", [
    (Dma(rows((0, 0, 2)), whole(T)), "not an order of its 3 sliced axes"),
    (Dma(View(Y3, (a(0), full(2), full(6)), (0, 1, 2)), View(T, (sl(0, 2), full(6)))), "not an order"),
    (Dma(rows(), View(T, (full(4), full(6)), (1, 0))), "only the HBM side of a DMA"),
    (Copy(View(T, (full(4), full(6)), (0, 1)), whole(T)), "only the HBM side of a DMA"),
])
def test_verifier_refuses_other_permuted_views(stmt, message):
    with pytest.raises(InternalError, match=message):
        verify(kernel(stmt), "test")


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_codegen_writes_the_permuted_view_of_a_dma_only(nki):
    text = codegen.emit(kernel(Dma(rows(), whole(T))), "", [], nki=nki)
    if nki == "0.1":
        assert "i0, i1, i2 = nl.mgrid[0:2, 0:2, 0:6]" in text and "dst=Y3[i1, i0, i2]" in text
    else:
        assert "Y3_view = Y3.ap(pattern=[[6, 2], [12, 2], [1, 6]]," in text and "offset=0)" in text
    bad = kernel(Copy(whole(T), dataclasses.replace(whole(T), perm=(0, 1))))
    with pytest.raises(InternalError, match="permuted view of T outside a DMA"):
        codegen.emit(bad, "", [], nki=nki)


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_resnet_block_chain_in_the_06_form(dt):
    # the chain's producer evicts into the paired image (odd rows on the first half: its stationary's halves
    # swapped, 16-bit: gathered in 4 copies), the consumer rounds U on its eviction (bf16: U is a narrow
    # intermediate) and adds X's band, which arrives in one load through the permuted view: the producer's bands
    # (4 rows) are not the consumer's (12), so its copies of X cannot serve (conv_chain.skip_from_bands)
    from test_conv_phases import RESNET

    prog, comp, inputs, out = compile_and_run(RESNET.format(dt=dt), "0.6", "split T.y, 4")
    assert "X_pairs_view = X_pairs.ap(pattern=[[10, 2], [120, 64], [20, 6], [1, 10]]," in numbered(comp.source)
    assert "X_band0" not in numbered(comp.source)
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], resnet_ref(x, dt))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt, c, k", [("bf16", 64, 64), ("f16", 64, 32), ("f32", 48, 64)])
def test_edge_bands_zero_only_the_copies_reaching_outside(nki, dt, c, k):
    # 64 channels per copy (an aligned partition start): the first band's halo row is copy 0's only, so copy 1's load
    # does not wait for a zero copy; the last band zeroes each copy's rows below X. 48 channels: copy
    # 1 cannot be reached on its own (start 48), so each span covers both copies
    prog, comp, inputs, out = compile_and_run(SAME.format(dt=dt, n=2, c=c, h=12, w=7, k=k), nki, "split Y.y, 4\n")
    code = unwrap(numbered(comp.source))
    zeros = [line for line in code.splitlines() if "X_zero_rows[" in line]
    if c == 64:
        assert len(zeros) == 3 and "X_band[0:64, 0]" in zeros[0] and "X_band[64:128, 4]" in zeros[2]
    else:
        assert zeros and all(z.lstrip().startswith(("X_band[:, ", "X_band[0:96, ")) or "dst=X_band[:, " in z
                             or "dst=X_band[0:96, " in z for z in zeros)
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"]))


REGROUP = """\
kernel same64(X: {dt}[N, C, H, W], Wt: {dt}[K, C, 3, 3], b: {dt}[K]) -> Y
  default N = {n}, C = 64, H = 40, W = 12, K = 64
  Y: {dt}[N, K, H, W]
  for n in 0..N, k in 0..K, y in 0..H, x in 0..W:
    Y[n, k, y, x] = b[k]
    for c in 0..C, r in 0..3, s in 0..3:
      Y[n, k, y, x] += (X[n, c, y + r - 1, x + s - 1] ?? 0) * Wt[k, c, r, s]
"""


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt, n", [("bf16", 1), ("bf16", 2), ("f16", 2)])
def test_odd_bands_regrouped_on_tensor_e_before_their_store(nki, dt, n):
    """16-bit row pairs, 2 bands of 20 rows: band 0 leaves as row pairs (partition h*K + k, rows 2i + h: runs of
    one row), band 1 is regrouped into halves of the band (partition q*K + k: rows 10q .. 10q + 9, one run) and
    stored through Y seen as [N, K, bands, 2, 10, W] (conv_pairs.regroup_store). At batch 1 (the kernel's tail)
    8 selection matmuls move all of it, per phase one for VectorE's pairs and one for ScalarE's, each into a PSUM
    tile of its own, in a loop over the band's halves. At batch 2 (TensorE the bound) only the half of each phase
    that changes partitions goes through TensorE (4 matmuls, each starting its tile; phase 0's K partitions
    up by K, phase 1's down), the other half is copied in place on VectorE."""
    prog, c, inputs, out = compile_and_run(REGROUP.format(dt=dt, n=n), nki)
    src = unwrap(numbered(c.source))
    assert f"Y_halves = Y.reshape(({'2, ' if n == 2 else ''}64, 2, 2, 10, 12))" in src  # (batch 1 squeezed)
    for phase in range(2):
        select = rf"Y_select\[{phase * 64}:{phase * 64 + 64}, " + (f"{phase + 1} - half\\]" if n == 1 else
                                                                   f"{2 * phase}\\]")
        assert len(re.findall(rf"nc_matmul\([^\n]*{select}", src)) == 2
    stays = re.findall(r"Y_rows\[(\d+):\d+, :, (\d)\][^\n]*Y_band\[\1:\d+, (\d+):", src)
    assert sorted(stays) == ([] if n == 1 else [("0", "0", "0"), ("64", "1", "5")])
    assert src.count("Y_pairs") == (2 if nki == "0.1" else 4)  # band 0's store still takes the row-pair view
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], bias=x["b"]))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize("h, schedule, vector",
                         [(40, "", 2), (8, "  schedule:\n    tile Y.y, 2\n    split Y.y, 4\n", 0)])
def test_regroup_evictions_split_by_pairs_between_vector_and_scalar(nki, dt, h, schedule, vector):
    """The regrouped band's two phases are evicted as two disjoint runs of pairs, the first quarter // 2 of
    both phases by VectorE and the rest by ScalarE (bands of 20 rows: 2 + 3 pairs; of 4 rows: the one pair on
    ScalarE alone), each engine from PSUM tiles of its own (on trn2 VectorE and ScalarE must not read one PSUM
    bank together, ARCH3). Numerics against NumPy either way."""
    prog, c, inputs, out = compile_and_run(REGROUP.format(dt=dt, n=1).replace("H = 40", f"H = {h}") + schedule, nki)
    src = unwrap(numbered(c.source))
    assert "Y_halves" in src
    evictions = [ln for ln in src.split("\n") if "Y_rows[" in ln and "Y_phase" in ln]  # (both dialects' forms)
    copies = [ln for ln in evictions if "tensor_copy(" in ln]
    acts = [ln for ln in evictions if "activation(" in ln]
    assert (len(copies), len(acts)) == (vector, 2)
    if vector:
        assert all("Y_rows[:, 0:2, " in ln for ln in copies) and all("Y_rows[:, 2:5, " in ln for ln in acts)
    assert all("_act" not in ln for ln in copies) and all("Y_phase0_act" in ln or "Y_phase1_act" in ln for ln in acts)
    x = rounded(inputs, dt)
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], bias=x["b"]))


def test_regroup_of_one_pair_quarters_at_batch_2():
    """Bands of 4 rows (one pair per half band, ScalarE's alone) at batch 2: one crossing matmul per phase, each
    evicting the K partitions it moved, the half left in place copied; numerics against NumPy."""
    sched = "  schedule:\n    tile Y.y, 2\n    split Y.y, 4\n"
    prog, c, inputs, out = compile_and_run(REGROUP.format(dt="bf16", n=2).replace("H = 40", "H = 8") + sched, "0.6")
    src = unwrap(numbered(c.source))
    assert src.count("stationary=Y_select[0:64, 0]") == src.count("stationary=Y_select[64:128, 2]") == 1
    assert "data=Y_phase0_act[64:128])" in src and "data=Y_phase1_act[0:64])" in src
    x = rounded(inputs, "bf16")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], bias=x["b"]))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_fp32_row_pair_weights_on_three_engines(nki):
    """A lone fp32 row-pair conv gathers its 18 [64 x 64] weight blocks on VectorE, ScalarE and GpSimdE in turn
    and transposes its six pair stationaries two at a time, one eviction on VectorE and one on ScalarE
    (conv_pairs.weights_paired)."""
    prog, c, inputs, out = compile_and_run(REGROUP.format(dt="f32", n=1), nki)
    src = unwrap(numbered(c.source))
    gathers = [ln for ln in src.split("\n") if re.search(r"Wt_taps\[[^\n]*Wt_rows\[", ln)]
    assert len(gathers) == 18
    assert sum("gpsimd" in ln for ln in gathers) == 6 and sum("activation(" in ln for ln in gathers) == 6
    assert re.search(r"for tap_g in (nl\.affine_)?range\(3\)", src)
    evictions = [ln for ln in src.split("\n") if "Wt_T[:, tap_g * 2" in ln and "Wt_tp" in ln]
    assert len(evictions) == 2 and sum("activation(" in ln for ln in evictions) == 1
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], bias=x["b"]))


def test_no_regroup_for_fp32():
    """fp32 row pairs are TensorE-bound (the regroup's matmuls would only add to it): every band keeps the row-pair
    store."""
    prog, c, inputs, out = compile_and_run(REGROUP.format(dt="f32", n=2), "0.6")
    assert "Y_select" not in c.source and "Y_halves" not in c.source and c.source.count("Y_pairs.ap(") == 2
    x = rounded(inputs, "f32")
    assert_matches(prog, "Y", out["Y"], conv_ref(x["X"], x["Wt"], bias=x["b"]))
