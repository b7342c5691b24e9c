"""The IR verifier's check of a PSUM accumulation chain's start: its first matmul overwrites (NKI 0.6's
accumulate=False), so a later matmul of the chain that adds outside the first one's region adds onto uninitialised
PSUM (l37: the grouped hybrid's clipped first tap). Checked where the views use no loop variable."""
from __future__ import annotations

import pytest

from tilec.compiler.ir import Aff, Alloc, Buf, Dma, Kernel, Loop, Matmul, Sl, Term, View, full, whole
from tilec.compiler.verify import verify
from tilec.errors import InternalError

X = Buf("X", "hbm", "f32", (64, 8))
W = Buf("W", "hbm", "f32", (64, 32))
Y = Buf("Y", "hbm", "f32", (32, 8))
XS, WS = Buf("xs", "sbuf", "f32", (64, 8)), Buf("ws", "sbuf", "f32", (64, 32))
ACC = Buf("acc", "psum", "f32", (32, 8))
LOADS = (Alloc(XS), Dma(whole(XS), whole(X)), Alloc(WS), Dma(whole(WS), whole(W)), Alloc(ACC, zero=True))


def cols(buf: Buf, start: int, n: int) -> View:
    return View(buf, (full(buf.shape[0]), Sl(Aff((), start), n)))


def test_a_chain_adding_inside_its_start_passes() -> None:
    body = LOADS + (Matmul(whole(ACC), whole(WS), whole(XS)), Matmul(cols(ACC, 2, 4), whole(WS), cols(XS, 0, 4)))
    verify(Kernel("k", (X, W), (Y,), body), "test")


def test_a_chain_adding_outside_its_clipped_start_fails() -> None:
    body = LOADS + (Matmul(cols(ACC, 1, 7), whole(WS), cols(XS, 0, 7)),  # column 0 not written
                    Matmul(cols(ACC, 0, 7), whole(WS), cols(XS, 1, 7)))
    with pytest.raises(InternalError, match=r"adds to acc.*outside the region.*uninitialised PSUM"):
        verify(Kernel("k", (X, W), (Y,), body), "test")


def test_a_new_allocation_starts_a_new_chain_and_loop_placed_regions_are_not_judged() -> None:
    again = (Alloc(ACC, zero=True), Matmul(cols(ACC, 0, 4), whole(WS), cols(XS, 0, 4)))
    verify(Kernel("k", (X, W), (Y,), LOADS + (Matmul(whole(ACC), whole(WS), whole(XS)),) + again), "test")
    j = Aff((Term("j", 4),), 0)
    placed = Loop("j", 2, (Matmul(View(ACC, (full(32), Sl(j, 4))), whole(WS), View(XS, (full(64), Sl(j, 4)))),))
    verify(Kernel("k", (X, W), (Y,), LOADS + (placed,)), "test")


def test_a_disjoint_region_starts_a_sum_of_its_own_and_a_straddling_add_fails() -> None:
    """Two sums in one PSUM tile (rules_pool: the taps' last chunk and the whole rows share a bank): a matmul whose
    region no earlier matmul of the chain wrote starts its own (codegen06 makes it overwrite); one adding across
    both regions and the unwritten columns between them fails."""
    two = LOADS + (Matmul(cols(ACC, 0, 3), whole(WS), cols(XS, 0, 3)),
                   Matmul(cols(ACC, 5, 3), whole(WS), cols(XS, 5, 3)),
                   Matmul(cols(ACC, 1, 2), whole(WS), cols(XS, 0, 2)),
                   Matmul(cols(ACC, 5, 3), whole(WS), cols(XS, 0, 3)))
    verify(Kernel("k", (X, W), (Y,), two), "test")
    with pytest.raises(InternalError, match=r"adds to acc.*outside the regions.*uninitialised PSUM"):
        verify(Kernel("k", (X, W), (Y,), two + (Matmul(cols(ACC, 2, 4), whole(WS), cols(XS, 0, 4)),)), "test")


def test_a_started_matmul_overwrites_a_reused_tile_and_begins_its_chain() -> None:
    """ir.Matmul.start (dw17): a PSUM tile allocated once and reused for a second sum; the second sum's first matmul
    overwrites, so it may clip (the later matmuls add inside it), and one adding outside every region written so far
    still fails."""
    loads = LOADS[:-1] + (Alloc(ACC, zero=False),)  # a tile allocated once, its sums overwrite it
    reused = (Matmul(whole(ACC), whole(WS), whole(XS), start=True),  # the first sum
              Matmul(cols(ACC, 0, 4), whole(WS), cols(XS, 0, 4), start=True),  # the second sum starts
              Matmul(cols(ACC, 1, 2), whole(WS), cols(XS, 0, 2)))
    verify(Kernel("k", (X, W), (Y,), loads + reused), "test")
    with pytest.raises(InternalError, match=r"begins a sum in acc, allocated without zeros"):
        verify(Kernel("k", (X, W), (Y,), loads + reused[1:2] + (Matmul(cols(ACC, 4, 4), whole(WS), cols(XS, 0, 4)),
                                                                )), "test")


def test_a_sum_in_a_tile_allocated_without_zeros_must_start() -> None:
    """A PSUM tile allocated without zeros (nl.ndarray): its first matmul must overwrite (NKI 0.1 renders a plain
    matmul `+=`, which would add onto whatever the tile holds)."""
    loads = LOADS[:-1] + (Alloc(ACC, zero=False),)
    with pytest.raises(InternalError, match=r"begins a sum in acc, allocated without zeros: it must start it"):
        verify(Kernel("k", (X, W), (Y,), loads + (Matmul(whole(ACC), whole(WS), whole(XS)),)), "test")
    started = (Matmul(whole(ACC), whole(WS), whole(XS), start=True), Matmul(whole(ACC), whole(WS), whole(XS)))
    verify(Kernel("k", (X, W), (Y,), loads + started), "test")
