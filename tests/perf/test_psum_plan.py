"""PSUM tiles placed in the 8 banks (schedule.psum_plan, the default "fit" PSUM rotation rule): a site rotates through
2 banks where banks are free, and a tile placed in a bank another tile used waits for it. Hand-made traces; the
expected placements worked out by hand from the rule in the docstring."""
from __future__ import annotations

import dataclasses

import pytest

from tilec.errors import TilecError
from tilec.perf.api import estimate
from tilec.perf.params import TRN1, TRN2
from tilec.perf.schedule import psum_plan
from tilec.perf.tracebuild import TraceBuilder

BANK = 2048


def loop(sites: int, iterations: int, bank_bytes: int = BANK) -> tuple[TraceBuilder, dict[tuple[int, int], int]]:
    """Each iteration: per site s, a PSUM tile (source line 10 + s) written by one matmul and read once by a copy to
    SBUF (a short-lived tile, as a compiled kernel's per-row accumulators). Returns the builder and
    (iteration, site) -> buffer id."""
    b = TraceBuilder("k")
    w = b.buffer("w", "sbuf", 128, 512)
    o = b.buffer("o", "sbuf", 128, 2048)
    ids = {}
    lines = {}
    for i in range(iterations):
        for s in range(sites):
            p = b.buffer(f"p{s}", "psum", 128, bank_bytes)
            ids[i, s] = p
            lines[p] = 10 + s
            b.compute("tensor", "nc_matmul", reads=[b.at(w)], writes=[b.at(p)], partitions=128, free=512, k=128,
                      m=128, line=10 + s)
            b.compute("vector", "tensor_copy", reads=[b.at(p)], writes=[b.at(o)], partitions=128, free=512,
                      line=20 + s)
    b.trace.allocs[:] = [dataclasses.replace(a, file="k.py", line=lines.get(a.buffer, a.buffer))
                         for a in b.trace.allocs]
    return b, ids


def test_one_site_rotates_through_two_banks_as_before():
    b, ids = loop(1, 6)
    plan = psum_plan(b.trace, 2, 8, BANK)
    assert plan == {ids[i, 0]: (ids[i - 2, 0],) for i in range(2, 6)}
    assert estimate(b.trace, psum_rotation="fit").total_ns == estimate(b.trace, psum_rotation="free").total_ns


def test_four_sites_fit_in_eight_banks_and_keep_their_rotation():
    b, ids = loop(4, 5)
    plan = psum_plan(b.trace, 2, 8, BANK)
    assert plan == {ids[i, s]: (ids[i - 2, s],) for i in range(2, 5) for s in range(4)}


def test_five_sites_share_the_eight_banks_round_robin():
    """Five sites want 10 banks. Iteration 0 takes banks 0-4, iteration 1's first three tiles banks 5-7; from then
    on every bank is kept by its site for the rotation, so each tile takes the bank last touched earliest: the tile
    8 allocations before it (of another site), and waits for it. (In the last two iterations no tile is wanted back
    by a rotation and the order shifts; every tile still waits for one earlier tile.)"""
    b, ids = loop(5, 6)
    order = [ids[i, s] for i in range(6) for s in range(5)]
    plan = psum_plan(b.trace, 2, 8, BANK)
    assert all(plan[order[n]] == (order[n - 8],) for n in range(8, 20))
    assert set(plan) == set(order[8:]) and all(len(p) == 1 for p in plan.values())
    free, fit = (estimate(b.trace, psum_rotation=r) for r in ("free", "fit"))
    assert fit.total_ns >= free.total_ns
    s = fit._schedule
    first_use = {a.buffer: a.first_seq for a in b.trace.allocs}
    last_use = {a.buffer: a.last_seq for a in b.trace.allocs}
    for tile, (before,) in plan.items():
        assert s.start[first_use[tile]] >= s.end[last_use[before]]


def test_a_spare_bank_is_taken_before_one_a_site_keeps():
    """Site A (line 10) rotates through 4 tiles; site B's single tile comes between A's tiles 1 and 2, while banks 0
    and 1 hold A's tiles 0 and 1 (both finished, both wanted back) and bank 2 a finished one-off tile C: B takes C's
    bank, and A keeps its rotation."""
    b = TraceBuilder("k")
    w = b.buffer("w", "sbuf", 128, 512)
    o = b.buffer("o", "sbuf", 128, 2048)
    lines = {}

    def tile(line: int) -> int:
        p = b.buffer(f"p{line}", "psum", 128, BANK)
        lines[p] = line
        b.compute("tensor", "nc_matmul", reads=[b.at(w)], writes=[b.at(p)], partitions=128, free=512, k=128, m=128)
        b.compute("vector", "tensor_copy", reads=[b.at(p)], writes=[b.at(o)], partitions=128, free=512)
        return p

    a0, a1 = tile(10), tile(10)
    c = tile(30)
    rest = [tile(40 + n) for n in range(5)]  # one-off tiles filling banks 3-7
    bb = tile(20)
    a2, a3 = tile(10), tile(10)
    b.trace.allocs[:] = [dataclasses.replace(a, file="k.py", line=lines.get(a.buffer, a.buffer))
                         for a in b.trace.allocs]
    plan = psum_plan(b.trace, 2, 8, BANK)
    assert plan[bb] == (c,)
    assert plan[a2] == (a0,) and plan[a3] == (a1,)
    assert all(t not in plan for t in [a0, a1, c, *rest])


def test_a_tile_over_one_bank_takes_several():
    """A PSUM tensor of 2 banks (an NKI 0.1 block tensor's bytes) takes two free banks and waits for both tiles."""
    b, ids = loop(1, 8)  # eight one-bank tiles of one site: banks 0, 1, 0, 1, ...
    plan = psum_plan(b.trace, 2, 2, BANK)  # two banks only
    assert plan == {ids[i, 0]: (ids[i - 2, 0],) for i in range(2, 8)}
    big, ids2 = loop(1, 3, bank_bytes=2 * BANK)
    plan = psum_plan(big.trace, 2, 4, BANK)  # 4 banks: tile 0 in 0-1, tile 1 in 2-3, tile 2 back in 0-1
    assert plan == {ids2[2, 0]: (ids2[0, 0],)}
    plan = psum_plan(big.trace, 1, 2, BANK)  # 2 banks: each tile waits for the one before
    assert plan == {ids2[1, 0]: (ids2[0, 0],), ids2[2, 0]: (ids2[1, 0],)}


def test_the_default_psum_rule_is_fit_and_unknown_rules_are_errors():
    b, _ = loop(6, 4)
    assert estimate(b.trace).total_ns == estimate(b.trace, psum_rotation="fit").total_ns
    with pytest.raises(TilecError, match="unknown PSUM rotation rule 'some'"):
        estimate(b.trace, psum_rotation="some")


def test_the_banks_come_from_the_parameter_table():
    for p in (TRN2, TRN1):
        assert p.psum_bytes_per_partition.value // p.psum_bank_bytes.value == 8
        assert p.psum_bank_bytes.value == 2048


def test_a_compiled_kernel_fits_in_the_eight_banks():
    """mobilenet_block (48 PSUM sites at batch 2): its tiles are placed in 8 banks, each tile's predecessors were
    last touched before it is allocated, and in the schedule its instructions start after theirs ended."""
    import pathlib

    from tilec.compiler.api import compile_file
    from tilec.lang import api as lang
    from tilec.perf.schedule import place_psum

    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "families" / "mobilenet_block.tl"
    c = compile_file(str(path), {"N": 2}, target="trn2")
    _, trace = c.run_traced(numerics=False, **lang.random_inputs(c.program, seed=0))
    plan, used = place_psum(trace, 2, 8, BANK)
    allocs = {a.buffer: a for a in trace.allocs}
    assert len({(a.file, a.line) for a in trace.allocs if a.memory == "psum"}) > 4 and used == 8
    assert all(allocs[p].last_seq < allocs[b].first_seq for b, ps in plan.items() for p in ps)
    s = estimate(trace)._schedule
    touching: dict[int, list[int]] = {}
    for i, ins in enumerate(trace.instrs):
        for acc in ins.reads + ins.writes:
            touching.setdefault(acc.buffer, []).append(i)
    for b, ps in plan.items():
        first = min(s.start[i] for i in touching[b])
        assert all(first >= s.end[i] - 1e-6 for p in ps for i in touching.get(p, ()))
