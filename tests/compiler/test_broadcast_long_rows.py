"""Element-wise nests broadcasting rows too long to copy to every partition once for the whole nest (rules.eltwise,
WHOLE_ROWS_BYTES): the free tiles go outside the partition tiles, so each tile of a row is broadcast once."""
from __future__ import annotations

import numpy as np
import pytest

from tilec.compiler import ir
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang

PROGRAM = """kernel bcast(X: {dt}[M, N], b: {dt}[N], c: {dt}[M]) -> Y
  Y: {dt}[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = 2*X[i, j] + b[j] - 0.5*c[i]
"""


@pytest.mark.parametrize("dt, m, n", [("f32", 384, 16384), ("f32", 300, 9000), ("bf16", 256, 20480)])
def test_long_broadcast_rows_match_numpy_and_are_broadcast_once_per_free_tile(tmp_path, dt: str, m: int,
                                                                              n: int) -> None:
    path = tmp_path / "bcast.tl"
    path.write_text(PROGRAM.format(dt=dt))
    c = compile_loaded(lang.load(str(path), {"M": m, "N": n}))
    matmuls = [s for s in ir.walk(c.result.kernel.body) if isinstance(s, ir.Matmul)]
    loops = [s for s in ir.walk(c.result.kernel.body) if isinstance(s, ir.Loop)]
    assert loops and loops[0].note.startswith("for j"), "the free tiles are the outer loop"
    assert all(not any(isinstance(x, ir.Matmul) for x in ir.walk(inner.body))
               for inner in loops if inner.note.startswith("for i")), "no broadcast inside the partition tiles"
    assert matmuls
    rng = np.random.default_rng(5)
    x, b, col = (rng.standard_normal(s).astype(np.float32) for s in ((m, n), (n,), (m,)))
    if dt == "bf16":
        import ml_dtypes
        x, b, col = (v.astype(ml_dtypes.bfloat16) for v in (x, b, col))
    got = np.asarray(c.run(X=x, b=b, c=col)["Y"], dtype=np.float64)
    want = 2 * x.astype(np.float64) + b.astype(np.float64)[None, :] - 0.5 * col.astype(np.float64)[:, None]
    tol = 2e-6 if dt == "f32" else 3e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 4)
