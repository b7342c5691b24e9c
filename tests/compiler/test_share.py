"""Tile sharing (tilec/compiler/share.py): long rows whose row chain fits SBUF only when tiles of disjoint lives
share space; the sharing rule itself on small level-B bodies."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import EXAMPLES
from tilec.compiler import ir, passes
from tilec.compiler.api import compile_loaded
from tilec.compiler.ir import Act, Alloc, Buf, Dma, Loop, Reshape, whole
from tilec.compiler.schedule import sbuf_budget
from tilec.compiler.share import share_tiles
from tilec.lang import api as lang
from tilec.target import target


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _layernorm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(axis=1, keepdims=True)
    d = x - mu
    return d / np.sqrt((d * d).mean(axis=1, keepdims=True) + 1e-5) * g + b


def _fused(c) -> bool:
    return any(isinstance(s, ir.Loop) and "every op of the chain" in s.note for s in ir.walk(c.result.kernel.body))


@pytest.mark.parametrize("name, sizes, shared", [("softmax", {"M": 200, "N": 16384}, ""),
                                                 ("layernorm", {"M": 160, "N": 8192}, "")])
def test_long_rows_stay_one_fused_pass_and_match_numpy(name: str, sizes: dict, shared: str) -> None:
    """Whole-row, these chains need 16 and 528 bytes per partition more than the budget (op by op, intermediates
    through HBM, they were 3x and 4.6x slower on the model at 1024 or 2048 rows). The layernorm would fit with the
    discarded activation output sharing the centred rows' space, but its loop tiles then cannot have their second
    buffers (the next row tile's): both are chunked with X allocated once before the loop (chunk_cols.py,
    `rotating`; on the model under the "fit" rule, layernorm over rows of 8192 1.86x the floor shared, 1.62x
    chunked)."""
    c = compile_loaded(lang.load(str(EXAMPLES / f"{name}.tl"), sizes))
    assert _fused(c), "the chain was not fused"
    assert passes.peak_usage(c.result.kernel.body)[0] <= sbuf_budget(target("trn2"))
    if shared:
        assert any(isinstance(s, Alloc) and s.buf.name == shared for s in ir.walk(c.result.kernel.body))
    else:
        assert any(isinstance(s, ir.Loop) and s.var == "cc" for s in ir.walk(c.result.kernel.body))
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((sizes["M"], sizes["N"])) * 3 + 1).astype(np.float32)
    if name == "softmax":
        got, want = c.run(X=x)["Y"], _softmax(x.astype(np.float64))
    else:
        g, b = (rng.standard_normal(sizes["N"]).astype(np.float32) for _ in range(2))
        got, want = c.run(X=x, g=g, b=b)["Y"], _layernorm(x.astype(np.float64), g, b)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_a_chain_that_fits_is_left_as_it_is() -> None:
    c = compile_loaded(lang.load(str(EXAMPLES / "layernorm.tl"), {"M": 256, "N": 2048}))
    names = {s.buf.name for s in ir.walk(c.result.kernel.body) if isinstance(s, Alloc)}
    assert {"X_tile", "Y_tile", "discard", "Y_centred"} <= names


def _tile(name: str, free: int = 64, dtype: str = "f32") -> Buf:
    return Buf(name, "sbuf", dtype, (128, free))


HBM = Buf("X", "hbm", "f32", (128, 64))


def _body(*stmts) -> tuple:
    return (Loop("i", 4, tuple(stmts)),)


def _allocs(body: tuple) -> list[str]:
    return [s.buf.name for s in ir.walk(body) if isinstance(s, Alloc)]


def test_disjoint_lives_share_and_the_name_says_so() -> None:
    a, b, c = _tile("A_tile"), _tile("B_tile"), _tile("C_tile")
    body = _body(Alloc(a), Dma(whole(a), whole(HBM)), Alloc(b), Act(whole(b), whole(a), "exp"),
                 Alloc(c), Act(whole(c), whole(b), "exp"), Dma(whole(HBM), whole(c)))
    out = share_tiles(body, 0)
    assert _allocs(out) == ["A_C_tile", "B_tile"]  # C's life starts after A's last read
    last = out[0].body[-1]
    assert isinstance(last, Dma) and last.src.buf.name == "A_C_tile"


def test_a_statement_reading_one_and_writing_the_other_keeps_them_apart() -> None:
    a, b = _tile("A_tile"), _tile("B_tile")
    body = _body(Alloc(a), Dma(whole(a), whole(HBM)), Alloc(b), Act(whole(b), whole(a), "exp"),
                 Dma(whole(HBM), whole(b)))
    assert share_tiles(body, 0) == body


@pytest.mark.parametrize("other", [_tile("B", 32), _tile("B", 64, "bf16"), Buf("B", "sbuf", "f32", (128, 1))])
def test_other_shapes_dtypes_and_columns_never_share(other: Buf) -> None:
    a = _tile("A")
    body = _body(Alloc(a), Dma(whole(a), whole(HBM)), Alloc(other), Dma(whole(other), whole(HBM)))
    assert share_tiles(body, 0) == body


def test_zeroed_and_reshaped_tiles_never_share() -> None:
    a, b, c = _tile("A"), _tile("B"), _tile("C")
    zeroed = _body(Alloc(a), Dma(whole(HBM), whole(a)), Alloc(b, zero=True), Dma(whole(HBM), whole(b)))
    assert share_tiles(zeroed, 0) == zeroed
    reshaped = _body(Alloc(a), Dma(whole(HBM), whole(a)), Alloc(b), Reshape(c, b), Dma(whole(HBM), whole(b)))
    assert share_tiles(reshaped, 0) == reshaped


def test_tiles_of_different_loop_bodies_never_share() -> None:
    a, b = _tile("A"), _tile("B")
    body = (Loop("i", 2, (Alloc(a), Dma(whole(HBM), whole(a)))), Loop("j", 2, (Alloc(b), Dma(whole(HBM), whole(b)))))
    assert share_tiles(body, 0) == body


def test_pairs_merge_shortest_life_first_and_only_until_the_body_fits() -> None:
    a, b, c = _tile("A_tile"), _tile("B_tile"), _tile("C_tile")
    body = _body(Alloc(a), Dma(whole(a), whole(HBM)), Dma(whole(HBM), whole(a)),
                 Alloc(b), Dma(whole(b), whole(HBM)), Dma(whole(HBM), whole(b)),
                 Alloc(c), Dma(whole(c), whole(HBM)), Dma(whole(HBM), whole(c)))
    tile = a.bytes_per_partition()
    assert _allocs(share_tiles(body, 2 * tile)) == ["A_B_tile", "C_tile"]
    assert _allocs(share_tiles(body, 3 * tile)) == ["A_tile", "B_tile", "C_tile"]
    assert _allocs(share_tiles(body, tile)) == ["A_B_C_tile"]
