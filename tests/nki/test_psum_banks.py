"""What may live in PSUM, from both NKI versions' docs (v2.26.1 = NKI 0.1, v2.32.0 = NKI 0.6; the citations are in
tilec/compiler/verify.py's docstring and tilec/nki/checks.psum_banks): a PSUM tile is at most one 2 KiB bank per
partition, whatever its dtype; an NKI 0.1 block tensor in PSUM holds one tile per block, so its blocks take banks of
their own (as many as fit whole share one); one instruction cannot read two blocks at once (its operand is one tile,
partition dimension first). Values are checked against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import tilec  # noqa: F401  (installs the neuronxcc shim)
import psum_bank_kernels as pk  # noqa: E402
from nki_testutil import first_line, line_of
from tilec.errors import KernelError
from tilec.nki import api

A = np.random.default_rng(5).random((128, 128), dtype=np.float32)
B = np.random.default_rng(6).random((128, 512), dtype=np.float32)


def test_eight_blocks_fill_the_eight_banks():
    got = api.simulate(pk.block_psum, A, B, blocks=8)
    np.testing.assert_allclose(got, 8 * (A.T @ B), rtol=1e-5)


def test_nine_blocks_of_a_bank_each_overflow_psum():
    with pytest.raises(KernelError) as info:
        api.simulate(pk.block_psum, A, B, blocks=9)
    line = line_of(pk.__file__, "# BLOCKS")
    assert first_line(info.value) == (
        f"{pk.__file__}:{line}: error: PSUM has 8 banks of 2048 bytes per partition; allocating 'acc' would make 9 "
        "PSUM banks (its 9 blocks each a tile of their own) live at once [psum_bank_overflow]")


def test_small_blocks_share_a_bank():
    got = api.simulate(pk.small_blocks_and_tiles, A, B)
    np.testing.assert_allclose(got, 10 * (A.T @ B[:, :256]), rtol=1e-5)


def test_one_instruction_cannot_read_two_blocks():
    with pytest.raises(KernelError) as info:
        api.simulate(pk.across_blocks, A, B)
    assert f":{line_of(pk.__file__, '# ACROSS')}: error:" in first_line(info.value)
    assert "[err_failed_to_infer_tile_from_local_tensor]" in first_line(info.value)


@pytest.mark.parametrize("dtype, cols, ok", [("float32", 512, True), ("float32", 1024, False),
                                             ("bfloat16", 1024, True), ("bfloat16", 2048, False)])
def test_a_psum_tile_is_at_most_one_bank_in_bytes(dtype, cols, ok):
    if ok:
        got = api.simulate(pk.psum_tile, A, dtype_name=dtype, cols=cols)
        assert got.shape == (128, cols) and not np.any(np.asarray(got, dtype=np.float32))
        return
    with pytest.raises(KernelError) as info:
        api.simulate(pk.psum_tile, A, dtype_name=dtype, cols=cols)
    size = cols * (4 if dtype == "float32" else 2)
    assert first_line(info.value) == (
        f"{pk.__file__}:{line_of(pk.__file__, '# TILE')}: error: PSUM tile needs {size} bytes per partition, more "
        "than one 2048-byte PSUM bank [psum_tile_exceeds_bank]")
