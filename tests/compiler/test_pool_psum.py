"""A window pool's pass along x read through PSUM (pool_tensor.py, `psum_x_pass`): TensorE copies each chunk of a
band's input rows into a PSUM bank with an identity matmul, VectorE combines from there at 1 cycle per element and
GpSimdE takes the pass along y. Every kernel runs on the NKI interpreter and is compared with NumPy (np.pad with
-inf / 0 and sliding windows, count_include_pad both ways; `test_pool_window.reference`), f32/f16/bf16, several
partition tiles, bands and PSUM chunks, batch > 1."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import assert_matches
from test_pool_window import NP, pool_program, reference
from tilec.compiler import pool_costs, pool_knobs, pool_segments, wrap
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from kernel_numbers import numbered


def run(kind: str, r: int, s: int, pad: int, dtype: str, seed: int = 11, nki: str | None = None, **sizes: int) -> str:
    prog = lang.load(pool_program(kind, r, s, pad, dtype, **sizes))
    compiled = compile_loaded(prog, None, nki=nki)
    x = np.random.default_rng(seed).standard_normal(prog.tensors["X"].shape).astype(NP[dtype])
    got = compiled.run(X=x)["Y"]
    want = reference(x.astype(np.float32), kind, r, s, pad)
    assert np.shape(got) == want.shape
    assert_matches(prog, "Y", got, want)
    return numbered(compiled.source)


@pytest.fixture
def psum_on(monkeypatch):
    monkeypatch.setattr(pool_knobs, "PSUM", "on")


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("kind,r,s,pad", [("avg", 3, 1, 1), ("avgx", 3, 1, 1), ("max", 3, 2, 1), ("max", 2, 1, 0),
                                          ("avg", 2, 2, 1), ("max", 5, 1, 2), ("avgx", 3, 2, 0)])
def test_pass_along_x_from_psum_matches_numpy(psum_on, dtype, kind, r, s, pad):
    """Forced on: N*C = 192 rows (two partition tiles of 96, batch 2), 40 x 30 inputs: each band's rows in two or
    more PSUM chunks of 512 // 30 = 17 rows (the last one ragged)."""
    source = run(kind, r, s, pad, dtype, h=40, w=30, n=2, c=96)
    assert "nisa.nc_matmul(" in source and "buffer=nl.psum" in source


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_several_bands_per_partition_tile(psum_on, dtype):
    """130 rows of 80 columns: several bands per tile (the peeled first and last and the band loop), PSUM chunks of
    6 rows."""
    source = run("avg", 3, 1, 1, dtype, h=130, w=80, n=1, c=128)
    assert source.count("nisa.nc_matmul(") >= 2


def test_off_keeps_both_passes_in_sbuf(monkeypatch):
    monkeypatch.setattr(pool_knobs, "PSUM", "off")
    source = run("avg", 3, 1, 1, "f32", h=28, w=28, n=8, c=128)
    assert "nc_matmul" not in source and "psum" not in source


def test_model_chooses_psum_for_many_tiles_not_for_few():
    """The default: at 8 partition tiles of 28 x 28 the bands' saving outweighs the identity's set-up; at one tile it
    does not (the model's costs, psum_costs and identity_ns)."""
    many = run("avg", 3, 1, 1, "f32", h=28, w=28, n=8, c=128)
    few = run("avg", 3, 1, 1, "f32", h=28, w=28, n=1, c=128)
    assert "nisa.nc_matmul(" in many and "nc_matmul" not in few


def test_costs_prefer_psum_only_when_vector_engine_is_the_slow_one():
    """f32 sums stream 2 cycles per element from SBUF: reading PSUM pays; 16-bit max pools already stream 1 cycle
    per element on VectorE and GpSimdE shares the pass along x, so PSUM does not."""
    sbuf, psum, share = pool_costs.psum_costs("f32", "f32", "f32", 30, 28, 28, 28, 3, 3, 18)
    assert psum < sbuf and 0 <= share <= 1
    sbuf, psum, _ = pool_costs.psum_costs("bf16", "bf16", "bf16", 29, 14, 56, 112, 3, 3, 4)
    assert psum > sbuf


def test_explain_says_when_the_pass_along_x_reads_psum():
    """The schedule record (`explain`) names the PSUM copies when the kernel has them, and only then."""
    for n, expect in ((8, True), (1, False)):
        c = compile_loaded(lang.load(pool_program("avg", 3, 1, 1, "f32", h=28, w=28, n=n, c=128)), None)
        text = c.stages["schedule"]
        assert ("psum(X, rows=18" in text) is expect
        assert ("engine='VectorE from PSUM'" in text) is expect
        assert ("nisa.nc_matmul(" in numbered(c.source)) is expect


FIRST, LAST = "the first channel-row tile from SBUF", "the last channel-row tile, its pass along y"


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("kind,r,s,pad", [("avg", 3, 1, 1), ("avgx", 3, 1, 1), ("max", 3, 2, 1), ("max", 2, 1, 0),
                                          ("avgx", 3, 2, 0)])
def test_peeled_first_and_last_tiles_match_numpy(psum_on, dtype, kind, r, s, pad):
    """Three partition tiles (N*C = 384, batch 3): the first tile from SBUF (both passes shared), the middle one in
    the loop through PSUM, the last with its pass along y shared and its border copies on VectorE; 40 x 30 inputs,
    PSUM chunks of 17 rows."""
    source = run(kind, r, s, pad, dtype, h=40, w=30, n=3, c=128)
    assert FIRST in source and LAST in source and "range(1)" not in source


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
def test_peeled_tiles_with_several_bands_both_dialects(psum_on, nki):
    """Four tiles of 100 rows of 30 columns in bands of 16 (`split S.i, 16`): each peeled tile has its own bands
    (the peeled first and last and the band loop; PSUM chunks of 17 rows); the loop over the two middle tiles
    starts at the second; both NKI dialects."""
    prog = lang.load(pool_program("avg", 3, 1, 1, "bf16", h=100, w=30, n=4, c=128))
    compiled = compile_loaded(prog, lang.parse_schedule("split S.i, 16", "<test>"), nki=nki)
    x = np.random.default_rng(5).standard_normal(prog.tensors["X"].shape).astype(NP["bf16"])
    assert_matches(prog, "Y", compiled.run(X=x)["Y"], reference(x.astype(np.float32), "avg", 3, 1, 1))
    source = numbered(compiled.source)
    assert FIRST in source and LAST in source and "range(2)" in source and source.count("for yb in ") == 3


def test_large_bodies_are_not_peeled(psum_on):
    """Bands of 51 rows of 80 columns: three bodies' buffers would take more than half of SBUF, so the tiles stay
    in one loop (every tile through PSUM)."""
    source = run("avg", 3, 1, 1, "bf16", h=130, w=80, n=4, c=128)
    assert FIRST not in source and "for pb in nl.affine_range(4)" in source


def test_two_tiles_are_not_peeled(psum_on):
    """With fewer than PEEL_TILES tiles every tile goes through PSUM."""
    source = run("avg", 3, 1, 1, "f32", h=28, w=28, n=2, c=128)
    assert FIRST not in source and source.count("nisa.nc_matmul(") == 2



@pytest.mark.parametrize("taps", ["on", "off"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("r,s,pad", [(3, 1, 1), (2, 2, 1), (5, 1, 2), (3, 2, 0), (2, 1, 0)])
def test_tensor_engine_sums_the_taps_of_16_bit_sums(psum_on, monkeypatch, taps, dtype, r, s, pad):
    """16-bit sums (count_include_pad=True) through PSUM, TensorE summing the pass along x's taps (one accumulating
    identity matmul per tap, strided moving views for stride 2, partial column ranges at the padding) and ScalarE
    evicting with the 1 / count folded in ("on"; a 2x2 window padded on both sides has no tap that every output
    has to start the accumulation, so it keeps the copies), or TensorE copying X for VectorE ("off"): two tiles of
    96 channel rows, 40 x 30 inputs, PSUM chunks of 17 rows or more (Wo columns each)."""
    monkeypatch.setattr(pool_knobs, "TAPS", taps)
    monkeypatch.setattr(pool_knobs, "FULL_ROWS", 0)  # (whole windows on TensorE: test_whole_windows_on_tensor_engine)
    source = run("avg", r, s, pad, dtype, h=40, w=30, n=2, c=96)
    summed = taps == "on" and (r, pad) != (2, 1)  # 2x2 padded on both sides: no tap every output has, copies
    chunks = source.count("buffer=nl.psum")  # one PSUM accumulator per chunk of a band's rows
    assert chunks > 0 and ("X_taps" in source) is summed and ("X_psum" in source) is not summed
    assert source.count("nisa.nc_matmul(") == (r if summed else 1) * chunks  # one matmul per tap, or a copy


@pytest.mark.parametrize("taps", ["on", "off"])
def test_taps_with_peeled_tiles_and_a_sum_without_division(psum_on, monkeypatch, taps):
    """A plain 3x3 sum (no division) of bf16 into bf16 over three tiles: the peeled first tile from SBUF, then
    TensorE's taps."""
    monkeypatch.setattr(pool_knobs, "TAPS", taps)
    text = pool_program("avg", 3, 1, 1, "bf16", h=20, w=24, n=3, c=128).replace(" / 9", "")
    prog = lang.load(text)
    compiled = compile_loaded(prog, None)
    x = np.random.default_rng(2).standard_normal(prog.tensors["X"].shape).astype(NP["bf16"])
    want = reference(x.astype(np.float32), "avg", 3, 1, 1) * 9
    assert_matches(prog, "Y", compiled.run(X=x)["Y"], want)
    assert FIRST in numbered(compiled.source)


def test_model_chooses_taps_for_many_16_bit_tiles_only():
    """The default: a bf16 average at 16 tiles of 28 x 28 sums its taps on TensorE, and at 2 tiles too now that the
    identity is built on chip (model: 21.46 us against 23.33 from SBUF; through HBM, the set-up kept it in SBUF);
    for f32 (TensorE's quarter rate) it does not; count_include_pad=False sums its taps on TensorE too (the
    columns' counts in the evictions, the rows' on VectorE)."""
    def kernel(dtype: str, n: int, kind: str = "avg") -> str:
        return compile_loaded(lang.load(pool_program(kind, 3, 1, 1, dtype, h=28, w=28, n=n, c=128)), None).source
    many = kernel("bf16", 16)
    # three bodies (two tiles per step of the loop, the peeled last tile), each 3 taps x 2 chunks and 3 x 3 taps for
    # the rows TensorE sums whole
    assert many.count("nisa.nc_matmul(") == 3 * (3 * 2 + 3 * 3)
    assert kernel("bf16", 2).count("nisa.nc_matmul(") > 2  # the taps, not the copies (one per chunk)
    assert kernel("f32", 16).count("nisa.nc_matmul(") == 2 * 2  # the copies, one per chunk
    assert kernel("bf16", 16, "avgx").count("nisa.nc_matmul(") == 3 * (3 * 2 + 3 * 3)
    text = compile_loaded(lang.load(pool_program("avg", 3, 1, 1, "bf16", h=28, w=28, n=16, c=128)), None) \
        .stages["schedule"]
    # 5 whole rows: the peeled first tile's SBUF passes hold VectorE and GpSimdE while TensorE starts the taps, so
    # the kernel-long estimate (peeled_whole) moves more rows to TensorE than a band's estimate alone (3)
    assert "copy='TensorE identity matmul, one per tap', whole_rows=5" in text
    assert "scale(0.111111, on=\"ScalarE's evictions\")" in text


def test_16_bit_sums_round_each_output_once(psum_on):
    """A 4x4 average of bf16 through PSUM (TensorE sums the taps along x, the 1/16 folded into the evictions): the
    pass along y keeps its partial sums in fp32 (Y_rows) and only its last combine writes the bf16 band. Writing
    every combine into the band rounded each output three times: seed 34 then missed the tolerance (0.0095 >
    0.0085)."""
    prog = lang.load(pool_program("avg", 4, 1, 0, "bf16", h=22, w=7, n=5, c=100))
    compiled = compile_loaded(prog, None)
    x = np.random.default_rng(34).standard_normal(prog.tensors["X"].shape).astype(NP["bf16"])
    assert_matches(prog, "Y", compiled.run(X=x)["Y"], reference(x.astype(np.float32), "avg", 4, 1, 0))
    assert "X_taps" in numbered(compiled.source)
    assert "dtype=nl.float32" in numbered(compiled.source).split("Y_rows = ")[1].split("\n")[0]  # the partial sums


@pytest.mark.parametrize("nki", [None, "0.1"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("r,s,pad", [(3, 1, 1), (5, 1, 2), (3, 2, 1), (4, 1, 1), (3, 1, 0), (2, 1, 1)])
def test_tensor_engine_sums_the_taps_of_averages_excluding_the_padding(psum_on, monkeypatch, nki, dtype, r, s, pad):
    """count_include_pad=False through TensorE's taps: ScalarE evicts each run of columns with its own count folded
    in (window / its taps inside X), the pass along y completes the rows with fewer taps in fp32 and VectorE writes
    them to the band times window / their taps (tensor_scalar multiply); the interior rows' last combine writes the
    band directly. Two tiles of 96 channel rows, 40 x 30 inputs, both NKI dialects. A 2x2 window padded on both
    sides has no tap that every output has: it keeps the copies."""
    monkeypatch.setattr(pool_knobs, "TAPS", "on")
    source = run("avgx", r, s, pad, dtype, h=40, w=30, n=2, c=96, nki=nki)
    summed = (r, pad) != (2, 1)
    assert ("X_taps" in source) is summed
    if summed and pad:  # border columns' evictions apart, border rows scaled on VectorE
        assert source.count("nisa.activation(") > source.count("buffer=nl.psum")
        assert "nl.multiply" in wrap.unwrap(source)


def test_averages_excluding_the_padding_count_once_per_output(psum_on, monkeypatch):
    """A 3x3 stride-1 average excluding the padding over 5 x 4 bf16 inputs (every row and column is a border or
    next to one) and a 4x4 one over 22 x 7 (no output row has all its window's rows in the interior of a 3-row
    image: the whole pass along y in fp32, then scaled)."""
    monkeypatch.setattr(pool_knobs, "TAPS", "on")
    assert "X_taps" in run("avgx", 3, 1, 1, "bf16", h=5, w=4, n=2, c=70)
    source = wrap.unwrap(run("avgx", 4, 1, 1, "bf16", h=3, w=9, n=1, c=100))
    assert "X_taps" in source and source.count("nl.multiply") == 2  # both output rows scaled from fp32 sums


@pytest.mark.parametrize("nki", [None, "0.1"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("kind", ["avg", "avgx"])
@pytest.mark.parametrize("r,s,pad", [(3, 1, 1), (5, 1, 2), (3, 2, 1), (4, 1, 1), (2, 1, 0)])
def test_whole_windows_on_tensor_engine(psum_on, monkeypatch, nki, dtype, kind, r, s, pad):
    """With TensorE's taps, a block of each band's interior output rows summed whole on TensorE (one accumulating
    matmul per window row and column tap, strided along both axes at stride 2; ScalarE evicts into Y's band with
    the scale and the columns' counts), the pass along y for the rows before and after it; count_include_pad both
    ways, both NKI dialects, 3 whole rows per band, two tiles of 96 channel rows, 40 x 30 inputs."""
    monkeypatch.setattr(pool_knobs, "TAPS", "on")
    monkeypatch.setattr(pool_knobs, "FULL_ROWS", 3)
    monkeypatch.setattr(pool_knobs, "SHARE_BANK", False)
    source = run(kind, r, s, pad, dtype, h=40, w=30, n=2, c=96, nki=nki)
    assert "X_full" in source and "X_taps" in source
    # the whole rows' sums in the bank of each band's last chunk of taps (17 rows of 30 fp32: room for 3 more):
    # the same matmuls, one PSUM tile fewer per band, every sum starting with an overwrite of its own rows
    monkeypatch.setattr(pool_knobs, "SHARE_BANK", True)
    shared = run(kind, r, s, pad, dtype, h=40, w=30, n=2, c=96, nki=nki)
    assert "X_full" not in shared and shared.count("nc_matmul(") == source.count("nc_matmul(")
    assert shared.count("buffer=nl.psum") < source.count("buffer=nl.psum")
    if nki != "0.1":
        assert shared.count("accumulate=False") == source.count("accumulate=False")


@pytest.mark.parametrize("kind", ["avg", "avgx"])
@pytest.mark.parametrize("c", [96, 112])
def test_whole_windows_loop_takes_two_tiles_per_step(psum_on, monkeypatch, kind, c):
    """6 and 7 partition tiles (8 x 96, 8 x 112 channel rows): the peeled first and last, the middle in two halves
    (tiles pb + 1 and pb + 1 + half per step; an odd one left after the loop), every output written once."""
    monkeypatch.setattr(pool_knobs, "TAPS", "on")
    monkeypatch.setattr(pool_knobs, "FULL_ROWS", 3)
    monkeypatch.setattr(pool_knobs, "SHARE_BANK", False)
    source = run(kind, 3, 1, 1, "bf16", h=12, w=10, n=8, c=c)
    assert "per step" in source and source.count("X_full = ") == 3 + (c == 112)
    monkeypatch.setattr(pool_knobs, "SHARE_BANK", True)  # each tile's sums in one PSUM tile (one bank) of its own
    shared = run(kind, 3, 1, 1, "bf16", h=12, w=10, n=8, c=c)
    assert "per step" in shared and "X_full" not in shared and shared.count("X_taps = ") == 3 + (c == 112)


def test_eviction_runs_pair_the_two_ends_of_a_padding_of_one():
    """count_include_pad=False: the evictions' runs of columns with one count; a 3x3 stride-1 window padded by one
    has its two end columns (3 / 2) as one stepped run beside the interior (1); a 5x5 window padded by two keeps
    its five runs; with the padding counted, one run."""
    from tilec.compiler.build_util import a
    from tilec.compiler.ir import Sl
    segs = pool_segments.segments(28, -1, 1, 3, 28)
    assert pool_segments.eviction_runs(segs, 3, True) == [(Sl(a(0), 2, 27), 1.5), (Sl(a(1), 26), 1.0)]
    assert pool_segments.eviction_runs(segs, 3, False) == [(Sl(a(0), 28), 1.0)]
    wide = pool_segments.eviction_runs(pool_segments.segments(28, -2, 1, 5, 28), 5, True)
    assert [(r.start.const, r.size, f) for r, f in wide] == [(0, 1, 5 / 3), (1, 1, 5 / 4), (2, 24, 1.0),
                                                           (26, 1, 5 / 4), (27, 1, 5 / 3)]


def test_first_tile_before_the_taps_scales_its_borders_on_vector_engine(psum_on, monkeypatch):
    """count_include_pad=False, three bf16 tiles through TensorE's taps: the peeled first tile (SBUF form) scales
    its border regions on VectorE (tensor_scalar multiply) and only its interior on ScalarE, whose next
    instructions are the second tile's evictions; the tiles through the taps keep theirs in the evictions."""
    monkeypatch.setattr(pool_knobs, "TAPS", "on")
    source = wrap.unwrap(run("avgx", 3, 1, 1, "bf16", h=20, w=24, n=3, c=128))
    first = source.split("the first channel-row tile")[1].split("for pb in")[0]
    # (three border regions: mirrored rows and columns share an instruction, pool_passes.count_regions)
    assert first.count("nl.multiply") >= 3 and "X_taps" in source


@pytest.mark.parametrize("nki", [None, "0.1"])
@pytest.mark.parametrize("kind", ["avg", "avgx"])
def test_few_tiles_sum_no_whole_rows_under_the_throttle(kind, nki):
    """Two bf16 tiles of 28 x 28 (batch 1 of avgpool3x3s1): TensorE's warm-up throttle (tilec/perf/throttle.py)
    holds its work past the first 1.5 us until 3 us after it began, so whole rows, more TensorE work, end the kernel
    later (model: avg 8.52 -> 8.15 us, exclude pad 9.16 -> 8.52 us without them). The taps stay; the kernel matches
    NumPy. At 16 tiles (a peeled first tile runs beside the hold) the whole rows stay."""
    def compiled(n: int):
        prog = lang.load(pool_program(kind, 3, 1, 1, "bf16", h=28, w=28, n=n, c=128))
        return prog, compile_loaded(prog, None, nki)
    prog, few = compiled(2)
    text = few.stages["schedule"]
    assert "one per tap'" in text and "whole_rows" not in text
    assert "X_full" not in numbered(few.source)
    x = np.random.default_rng(7).standard_normal(prog.tensors["X"].shape).astype(NP["bf16"])
    assert_matches(prog, "Y", few.run(X=x)["Y"], reference(x.astype(np.float32), kind, 3, 1, 1))
    assert "whole_rows=" in compiled(16)[1].stages["schedule"]


def test_throttled_finish_times():
    """TensorE's finish under the throttle as the model applies it: up to 1.5 us of work unheld, then a hold until
    3 us after the start (params.py: start fraction 0.5, ramp 3 us)."""
    assert pool_costs.throttled(1000.0) == 1000.0
    assert pool_costs.throttled(1500.0) == 1500.0
    assert pool_costs.throttled(2000.0) == pytest.approx(3500.0)


def _own_rows_read_back(source: str) -> list[tuple[int, int]]:
    """(rows VectorE wrote into Y_rows, the end of the rows it then read back) for each VectorE combine reading
    Y_rows in a kernel's pass along y."""
    import re
    pairs, wrote = [], 0
    for line in wrap.unwrap(source).splitlines():
        if "nisa.tensor_tensor(" not in line or "engine=nisa.engine.gpsimd" in line:
            continue
        if (m := re.search(r"dst=Y_rows\[:, (\d+):(\d+)\]", line)) and m.group(1) == "0":
            wrote = int(m.group(2))
        elif m := re.search(r"data1=Y_rows\[:, (\d+):(\d+)\]", line):
            pairs.append((wrote, int(m.group(2))))
    return pairs


@pytest.mark.parametrize("rows", [3, 4, 5, 6])
def test_pass_along_y_changes_engines_at_one_row(monkeypatch, rows):
    """bf16 average 3x3 s1 pad 1 over 28 x 28 with TensorE's taps and `rows` whole rows: the pass along y's two
    combines are cut between VectorE and GpSimdE at one row, so VectorE's second combine reads back only rows of
    Y_rows it wrote itself (cut by its own size, at 4 and 6 whole rows it read one row GpSimdE wrote: a wait
    across the engines every tile); values against NumPy."""
    for name, value in (("FULL_ROWS", rows), ("PSUM", "on"), ("TAPS", "on")):
        monkeypatch.setattr(pool_knobs, name, value)
    kw = dict(h=28, w=28, n=8, c=64)
    pairs = _own_rows_read_back(run("avg", 3, 1, 1, "bf16", nki="0.6", **kw))  # (the 0.6 form: dst=)
    assert pairs and all(end <= wrote for wrote, end in pairs)
    monkeypatch.setattr(pool_knobs, "ALIGN_CUTS", False)
    before = _own_rows_read_back(run("avg", 3, 1, 1, "bf16", nki="0.6", **kw))
    assert any(end > wrote for wrote, end in before) == (rows % 2 == 0)


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
@pytest.mark.parametrize("kind,dtype", [("avg", "bf16"), ("avgx", "bf16"), ("avg", "f32"), ("avgx", "f32")])
@pytest.mark.parametrize("h,w", [(40, 30), (17, 23)])
def test_aligned_cuts_match_numpy(psum_on, nki, kind, dtype, h, w):
    """The pass along y with its combines cut at one row, forced through PSUM (f32: TensorE's copies; bf16: the
    taps and the whole rows the costs pick), ragged 17-row chunks at 40 x 30, both dialects, against NumPy."""
    run(kind, 3, 1, 1, dtype, nki=nki, h=h, w=w, n=4, c=96)


@pytest.mark.parametrize("nki", ["0.6", "0.1"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("rows", [2, 5])
def test_border_rows_after_the_whole_rows_are_one_pair(monkeypatch, nki, dtype, rows):
    """count_include_pad=False, 3x3 stride 1 padded by one, TensorE's taps and `rows` whole rows that end one row
    before the last: the pass along y's first and last output rows (2 taps each, times 3 / 2) are summed by one
    stepped instruction into a tile of their own and scaled by one (PAIR_ENDS), not two each; off, two of each.
    Values against NumPy (torch's count_include_pad=False at every border) both ways."""
    import re

    for name, value in (("PSUM", "on"), ("TAPS", "on"), ("FULL_ROWS", rows)):
        monkeypatch.setattr(pool_knobs, name, value)
    kw = dict(h=14, w=12, n=2, c=96, nki=nki)

    def border_scales(source: str) -> list[str]:  # (both dialects: dst= or an assignment)
        return [line for line in wrap.unwrap(source).splitlines()
                if "tensor_scalar(" in line and re.search(r"Y_band\[:, (0|13|0:14:13)\]", line)]
    paired = run("avgx", 3, 1, 1, dtype, **kw)
    assert "Y_ends" in paired and len(border_scales(paired)) == 1
    assert any("Y_band[:, 0:14:13]" in line for line in border_scales(paired))
    monkeypatch.setattr(pool_knobs, "PAIR_ENDS", False)
    apart = run("avgx", 3, 1, 1, dtype, **kw)
    assert "Y_ends" not in apart and len(border_scales(apart)) == 2
