"""Padded reads inside element-wise statements (`Y[i, j] = (X[i - 1, j] ?? 0) + Z[i, j]`, 3-tap stencils): each
read is copied into a tensor of its own first (pad_split.py: the copy rule's boxes), then the element-wise rule
computes the statement. Checked against NumPy (np.pad + slicing), never against tilec."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from compiler_helpers import check_against_reference, inputs_for
from tilec.compiler.api import compile_loaded
from tilec.compiler.pad_split import split_padded_reads
from tilec.errors import TilecError
from tilec.lang import api as lang
from tilec.lang import syntax as sx

NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def _q(x: np.ndarray, dtype: str) -> np.ndarray:
    return np.asarray(x, np.float32).astype(NP[dtype]).astype(np.float32)


def shifted(x: np.ndarray, shifts: tuple[int, ...], fill: float) -> np.ndarray:
    """x[i + s] with `fill` where the index leaves x (np.pad, then the slice that the shift selects)."""
    pad = [(max(0, -s), max(0, s)) for s in shifts]
    p = np.pad(x, pad, constant_values=fill)
    return p[tuple(slice(max(0, -s) + s, max(0, -s) + s + n) for s, n in zip(shifts, x.shape))]


def _idx(vs: list[str], shifts: tuple[int, ...]) -> str:
    return ", ".join(v if s == 0 else f"{v} + {s}" if s > 0 else f"{v} - {-s}" for v, s in zip(vs, shifts))


def _check(src: str, dtype: str, want_fn) -> None:
    c = compile_loaded(lang.load(src))
    copy_rule = "resolve_fill" in c.stages["schedule"] or "rules_copy.row_blocks builds it" in c.stages["schedule"]
    assert copy_rule and "rules.eltwise" in c.stages["schedule"]
    inputs = inputs_for(c.program)
    got = np.asarray(c.run(**inputs)["Y"], np.float32)
    want = _q(want_fn({k: _q(v, dtype) for k, v in inputs.items()}), dtype)
    tol = 1e-6 if dtype == "f32" else 2e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    if dtype == "f32" and not np.isinf(want).any():
        check_against_reference(c)


SHAPES = {  # name: (sizes, shift of the padded read per dimension)
    "1d": ((1000,), (-1,)),
    "1d_ragged": ((333,), (2,)),
    "2d_rows": ((300, 700), (-1, 0)),
    "2d_both": ((260, 130), (3, -2)),
    "3d": ((3, 140, 50), (0, -1, 1)),
}


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("fill", ["0", "1.5", "-inf"])
@pytest.mark.parametrize("case", sorted(SHAPES))
def test_shifted_plus_tensor_matches_np_pad(case: str, fill: str, dtype: str) -> None:
    shape, shifts = SHAPES[case]
    vs = ["a", "b", "c"][:len(shape)]
    sizes = ["A", "B", "C"][:len(shape)]
    dims = ", ".join(sizes)
    loops = ", ".join(f"{v} in 0..{s}" for v, s in zip(vs, sizes))
    src = (f"kernel k(X: {dtype}[{dims}], Z: {dtype}[{dims}]) -> Y\n"
           f"  default {', '.join(f'{s} = {n}' for s, n in zip(sizes, shape))}\n"
           f"  Y: {dtype}[{dims}]\n  for {loops}:\n"
           f"    Y[{', '.join(vs)}] = (X[{_idx(vs, shifts)}] ?? {fill}) + Z[{', '.join(vs)}]\n")
    value = {"-inf": -math.inf}.get(fill, None) or float(fill)
    _check(src, dtype, lambda t: shifted(t["X"], shifts, value) + t["Z"])


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("n", [256, 1000, 129])
def test_three_tap_stencil(n: int, dtype: str) -> None:
    src = (f"kernel k(X: {dtype}[N]) -> Y\n  default N = {n}\n  Y: {dtype}[N]\n  for i in 0..N:\n"
           f"    Y[i] = (X[i - 1] ?? 0) + X[i] + (X[i + 1] ?? 0)\n")
    _check(src, dtype, lambda t: shifted(t["X"], (-1,), 0.0) + t["X"] + shifted(t["X"], (1,), 0.0))


def test_difference_with_a_shifted_copy_under_functions() -> None:
    """Two padded reads of the same tensor in one expression, inside functions: a max of neighbours."""
    src = ("kernel k(X: f32[N, M]) -> Y\n  default N = 200, M = 96\n  Y: f32[N, M]\n  for i in 0..N, j in 0..M:\n"
           "    Y[i, j] = max(X[i, j - 1] ?? -inf, X[i, j + 1] ?? -inf) - X[i, j]\n")
    _check(src, "f32", lambda t: np.maximum(shifted(t["X"], (0, -1), -np.inf), shifted(t["X"], (0, 1), -np.inf))
           - t["X"])


def test_the_rewrite_copies_each_padded_read_first() -> None:
    """The rewritten program: one padded copy per read (its loops in the read's index order), the statement reading
    the copies; a program without such reads is returned as it is."""
    prog = lang.load("kernel k(X: f32[N, M], Z: f32[M, N]) -> Y\n  default N = 8, M = 4\n  Y: f32[N, M]\n"
                     "  for i in 0..N, j in 0..M:\n    Y[i, j] = (X[i - 1, j] ?? 2) * (Z[j + 1, i] ?? 0)\n")
    out = split_padded_reads(prog)
    assert [d.name for d in out.kernel.decls] == ["Y", "X_pad", "Z_pad"]
    assert [t.shape for t in out.tensors.values() if t.kind == "temp"] == [(8, 4), (4, 8)]
    first, second, last = out.kernel.body
    assert isinstance(second, sx.Loop) and second.var == "j" and second.body[0].var == "i"
    st = last.body[0].body[0]
    assert str(st.value.lhs.tensor) == "X_pad" and st.value.lhs.fill is None
    assert str(st.value.rhs.tensor) == "Z_pad" and st.value.rhs.fill is None
    inputs = inputs_for(prog)
    want = (shifted(inputs["X"], (-1, 0), 2.0) * shifted(inputs["Z"], (1, 0), 0.0).T)
    np.testing.assert_allclose(lang.evaluate(out, inputs)["Y"], want, rtol=1e-6)
    plain = lang.load("kernel k(X: f32[N]) -> Y\n  default N = 8\n  Y: f32[N]\n  for i in 0..N:\n    Y[i] = X[i] + 1\n")
    assert split_padded_reads(plain) is plain


def test_a_padded_read_with_a_scaled_index_stays_a_located_rejection() -> None:
    src = ("kernel k(X: f32[N]) -> Y\n  default N = 64\n  Y: f32[N / 2]\n  for i in 0..N / 2:\n"
           "    Y[i] = (X[2*i - 1] ?? 0) + X[2*i]\n")
    with pytest.raises(TilecError) as e:
        compile_loaded(lang.load(src))
    assert "not compiled yet" in str(e.value) and e.value.span is not None and e.value.span.line == 5


def test_a_view_that_would_drop_a_loop_is_an_internal_error(monkeypatch) -> None:
    """A schedule that puts two loops of one tensorized nest into one dimension of a 1-D buffer (the interior box
    as 128 rows x n/128 without a reshaped view) once produced `Y[1:..:8192]`, the free loop silently dropped; it
    is now an internal error at lowering (lower_tiles.view), never a wrong kernel."""
    from tilec.compiler import rules_copy
    from tilec.errors import InternalError
    original = rules_copy._Boxes.schedule

    def rows(self, loops, ext, fill):
        n = ext[loops[-1]]
        if fill or len(loops) > 1 or n % 128:
            return original(self, loops, ext, fill)
        p, f = rules_copy.sub(loops[-1], "_p"), rules_copy.sub(loops[-1], "_f")
        return [rules_copy._prim("split", loops[-1], n // 128, outer=p, inner=f), rules_copy._prim("partition", p),
                rules_copy._prim("tensorize", p)]

    monkeypatch.setattr(rules_copy._Boxes, "schedule", rows)
    monkeypatch.setattr(rules_copy, "flat_rows", lambda *args: None)  # (which does build such a copy as rows)
    src = "kernel k(X: f32[N]) -> Y\n  default N = 1025\n  Y: f32[N]\n  for i in 0..N:\n    Y[i] = X[i - 1] ?? 0\n"
    with pytest.raises(InternalError, match="several loops of one tensorized nest"):
        compile_loaded(lang.load(src))
