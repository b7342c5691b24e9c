"""The IR verifier's PSUM count: a tile lives from its allocation to its last use in the body that allocated it (the
NKI allocator frees it there, and the interpreter's capacity check counts it so), so tiles used one after the other
never add up, while tiles all used at the end still do."""
from __future__ import annotations

import pytest

from tilec.compiler.ir import Alloc, Buf, Copy, Dma, Kernel, Loop, Transpose, whole
from tilec.compiler.verify import verify
from tilec.errors import InternalError

X = Buf("X", "hbm", "f32", (128, 128))
Y = Buf("Y", "hbm", "f32", (128, 128))


def _transpose(k: int) -> tuple:
    """Load, transpose through a PSUM tile of its own, copy back: the PSUM tile's last use is the copy."""
    src, tp, dst = Buf(f"s{k}", "sbuf", "f32", (128, 128)), Buf(f"t{k}", "psum", "f32", (128, 128)), \
        Buf(f"d{k}", "sbuf", "f32", (128, 128))
    return (Alloc(src), Dma(whole(src), whole(X)), Alloc(tp), Transpose(whole(tp), whole(src)), Alloc(dst),
            Copy(whole(dst), whole(tp)), Dma(whole(Y), whole(dst)))


def test_psum_tiles_used_one_after_the_other_do_not_add_up() -> None:
    body = tuple(s for k in range(12) for s in _transpose(k))
    verify(Kernel("k", (X,), (Y,), body), "test")


def test_psum_tiles_all_used_at_the_end_still_count() -> None:
    tiles = [Buf(f"t{k}", "psum", "f32", (128, 128)) for k in range(9)]
    src = Buf("s", "sbuf", "f32", (128, 128))
    body = (Alloc(src), Dma(whole(src), whole(X)), *(Alloc(t) for t in tiles),
            *(Transpose(whole(t), whole(src)) for t in tiles))
    with pytest.raises(InternalError, match="9 PSUM tiles live at t8"):
        verify(Kernel("k", (X,), (Y,), body), "test")


def test_a_psum_tile_used_inside_a_later_loop_lives_until_that_loop() -> None:
    tiles = [Buf(f"t{k}", "psum", "f32", (128, 128)) for k in range(9)]
    src = Buf("s", "sbuf", "f32", (128, 128))
    body = (Alloc(src), Dma(whole(src), whole(X)), *(Alloc(t) for t in tiles[:8]),
            Loop("i", 2, tuple(Transpose(whole(t), whole(src)) for t in tiles[:8])), Alloc(tiles[8]),
            Transpose(whole(tiles[8]), whole(src)))
    verify(Kernel("k", (X,), (Y,), body), "test")  # the eight die with the loop, before the ninth
    early = body[:10] + (Alloc(tiles[8]),) + body[10:11]
    with pytest.raises(InternalError, match="9 PSUM tiles live"):
        verify(Kernel("k", (X,), (Y,), early), "test")


def test_a_psum_tile_over_one_bank_fails_and_a_16_bit_one_of_a_whole_bank_passes() -> None:
    """TC#2 (NKI 0.1 and 0.6) and ALLOC's "A PSUM tile cannot cross bank boundaries": the limit is 2 KiB per
    partition, whatever the dtype (NKI 0.6's migration guide allocates a (128, 1024) bf16 PSUM tile)."""
    src = Buf("s", "sbuf", "f32", (128, 128))

    def body(tile: Buf) -> tuple:
        dst = Buf("d", "sbuf", tile.dtype, tile.shape)
        return (Alloc(src), Dma(whole(src), whole(X)), Alloc(tile), Transpose(whole(tile), whole(src)),
                Alloc(dst), Copy(whole(dst), whole(tile)))

    with pytest.raises(InternalError, match="PSUM tile t is 4096 bytes per partition .*cannot cross bank boundaries"):
        verify(Kernel("k", (X,), (Y,), body(Buf("t", "psum", "f32", (128, 1024)))), "test")
    verify(Kernel("k", (X,), (Y,), body(Buf("t", "psum", "f32", (128, 512)))), "test")
    verify(Kernel("k", (X,), (Y,), body(Buf("t", "psum", "bf16", (128, 1024)))), "test")
