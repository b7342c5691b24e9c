"""The reference evaluator follows the sequential loop semantics, including the patterns it cannot run "open"
(recurrences, overlapping writes, stores inside reduction loops), and the dtype rules. Each program is compared
with a NumPy formulation written here."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilec.errors import TilecError
from tilec.lang import api


def run(text: str, **inputs: np.ndarray) -> dict[str, np.ndarray]:
    return api.evaluate(api.load(text), inputs)


def vec(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(n, dtype=np.float32) * 2 - 1


def test_prefix_sum_recurrence() -> None:
    out = run("""\
kernel scan(X: f32[N]) -> S
  S: f32[N]
  S[0] = X[0]
  for i in 1..N:
    S[i] = S[i - 1] + X[i]
""", X=vec(50))["S"]
    np.testing.assert_allclose(out, np.cumsum(vec(50).astype(np.float64)), rtol=1e-5, atol=1e-5)


def test_propagation_reads_what_earlier_iterations_wrote() -> None:
    out = run("""\
kernel spread(X: f32[N]) -> A
  A: f32[N]
  for i in 0..N:
    A[i] = X[i]
  for i in 1..N:
    A[i] = A[i - 1]
""", X=vec(20))["A"]
    np.testing.assert_array_equal(out, np.full(20, vec(20)[0], np.float32))


def test_running_value_across_two_statements() -> None:
    out = run("""\
kernel running(X: f32[N]) -> Y
  t: f32[1]
  Y: f32[N]
  t[0] = 0
  for i in 0..N:
    t[0] += X[i]
    Y[i] = t[0]
""", X=vec(30))["Y"]
    np.testing.assert_allclose(out, np.cumsum(vec(30).astype(np.float64)), rtol=1e-5, atol=1e-5)


def test_overlapping_writes_accumulate() -> None:
    x = vec(17)
    out = run("""\
kernel selfconv(X: f32[N]) -> Y
  Y: f32[2*N - 1]
  for i in 0..2*N - 1:
    Y[i] = 0
  for i in 0..N, j in 0..N:
    Y[i + j] += X[i] * X[j]
""", X=x)["Y"]
    np.testing.assert_allclose(out, np.convolve(x.astype(np.float64), x), rtol=1e-5, atol=1e-5)


def test_store_in_reduction_loop_keeps_last_iteration() -> None:
    X = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = run("""\
kernel last(X: f32[M, N]) -> Y
  Y: f32[M]
  for i in 0..M, j in 0..N:
    Y[i] = X[i, j] * 2
""", X=X)["Y"]
    np.testing.assert_array_equal(out, X[:, -1] * 2)


def test_self_update_in_reduction_loop_is_sequential() -> None:
    out = run("""\
kernel twice(X: f32[M, N]) -> Y
  Y: f32[M]
  for i in 0..M:
    Y[i] = X[i, 0]
    for j in 0..N:
      Y[i] = Y[i] * 2
""", X=np.ones((3, 5), np.float32))["Y"]
    np.testing.assert_array_equal(out, np.full(3, 32, np.float32))


def test_reversed_index_and_loop_variable_values() -> None:
    x = vec(9)
    out = run("""\
kernel flip(X: f32[N]) -> Y
  Y: f32[N]
  for i in 0..N:
    Y[i] = X[N - 1 - i] + i
""", X=x)["Y"]
    np.testing.assert_array_equal(out, x[::-1] + np.arange(9, dtype=np.float32))


def test_elementwise_functions() -> None:
    x = vec(64, 5) * 4
    out = run("""\
kernel f(X: f32[N]) -> Y
  Y: f32[N]
  for i in 0..N:
    Y[i] = exp(min(X[i], 0)) / (1 + max(X[i], 0)) - relu(-X[i])
""", X=x)["Y"]
    ref = np.exp(np.minimum(x, 0)) / (1 + np.maximum(x, 0)) - np.maximum(-x, 0)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


def test_reductions_without_products() -> None:
    X = np.random.default_rng(1).random((6, 7), dtype=np.float32) - 0.5
    out = run("""\
kernel red(X: f32[M, N]) -> S, T, U, V
  S: f32[M]
  T: f32[M]
  U: f32[M]
  V: f32[M]
  for i in 0..M:
    S[i] = 0
    T[i] = inf
    U[i] = 0
    V[i] = 0
    for j in 0..N:
      S[i] += relu(X[i, j])
      T[i] min= X[i, j]
      U[i] += X[i, 0]
      V[i] += -X[i, j] * X[i, j] * 2
""", X=X)
    np.testing.assert_allclose(out["S"], np.maximum(X, 0).sum(1), rtol=1e-5)
    np.testing.assert_array_equal(out["T"], X.min(1))
    np.testing.assert_allclose(out["U"], X[:, 0] * 7, rtol=1e-5)
    np.testing.assert_allclose(out["V"], -(X.astype(np.float64) ** 2).sum(1) * 2, rtol=1e-5)


def test_statement_outside_loops() -> None:
    out = run("""\
kernel one(X: f32[N]) -> Y
  Y: f32[2]
  Y[0] = X[0] * 3
  Y[1] = X[N - 1]
""", X=np.arange(4, dtype=np.float32))["Y"]
    np.testing.assert_array_equal(out, [0, 3])


def test_an_output_with_elements_never_stored_is_an_error_at_its_declaration() -> None:
    # on the hardware those elements would hold whatever the memory held: not a zero the evaluator could promise
    text = """\
kernel one(X: f32[N]) -> Y
  Y: f32[N, 2]
  for i in 0..N:
    Y[i, 0] = X[i]
"""
    with pytest.raises(TilecError) as err:
        run(text, X=np.ones(4, np.float32))
    assert "output `Y` is only partly written: 4 of its 8 elements are never stored (the first is Y[0, 1])" \
        in err.value.message
    assert err.value.span.line == 2


def test_f16_inputs_round_and_outputs_keep_their_dtype() -> None:
    A = np.random.default_rng(2).random((8, 16), dtype=np.float32)
    B = np.random.default_rng(3).random((16, 4), dtype=np.float32)
    out = run("""\
kernel mm(A: f16[M, K], B: f16[K, N]) -> C, D
  C: f16[M, N]
  D: bf16[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += A[i, k] * B[k, j]
    D[i, j] = f32(C[i, j]) * 1
""", A=A, B=B)
    exact = A.astype(np.float16).astype(np.float64) @ B.astype(np.float16).astype(np.float64)
    assert out["C"].dtype == np.float16 and out["D"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out["C"], exact.astype(np.float32).astype(np.float16))
    np.testing.assert_array_equal(out["D"], out["C"].astype(np.float32).astype(ml_dtypes.bfloat16))


def test_conversion_rounds_mid_expression() -> None:
    x = np.float32([1 + 2**-12, 3.0])
    out = run("""\
kernel r(X: f32[N]) -> Y
  Y: f32[N]
  for i in 0..N:
    Y[i] = X[i] - f32(f16(X[i]))
""", X=x)["Y"]
    np.testing.assert_array_equal(out, x - x.astype(np.float16).astype(np.float32))


def test_deterministic_bytes() -> None:
    prog = api.load("""\
kernel mm(A: f32[M, K], B: f32[K, N]) -> C
  default M = 33, K = 65, N = 17
  C: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = 0
    for k in 0..K:
      C[i, j] += A[i, k] * B[k, j]
""")
    inputs = api.random_inputs(prog, 7)
    assert api.evaluate(prog, inputs)["C"].tobytes() == api.evaluate(prog, inputs)["C"].tobytes()
    assert api.random_inputs(prog, 7)["A"].tobytes() == inputs["A"].tobytes()


@pytest.mark.large
def test_assignment_largest_case_matches_numpy() -> None:
    """conv_bias_maxpool at the assignment's shapes (batch 4, 256->256, 224x224, 3x3, bias, pool 2), inputs uniform
    in [0, 1) as in the assignment's harness, np.allclose at default tolerances in fp32, in under 4 GiB (its time is benchmarks/bench_evaluator.py: no timed tests)."""
    import pathlib
    import resource

    prog = api.load(pathlib.Path(__file__).resolve().parents[2] / "examples" / "conv_bias_maxpool.tl")
    rng = np.random.default_rng(42)  # uniform [0, 1) like the harness's np.random.rand, drawn directly in fp32
    X = rng.random((4, 256, 224, 224), dtype=np.float32)
    Wt = rng.random((256, 256, 3, 3), dtype=np.float32)
    b = rng.random(256, dtype=np.float32)
    Y = api.evaluate(prog, {"X": X, "Wt": Wt, "b": b})["Y"]
    conv = np.zeros((4, 256, 222, 222), np.float32)
    for n in range(4):  # independent reference: per filter tap, one matmul over whole input rows y + r ...
        for r in range(3):
            rows = X[n, :, r:r + 222, :].reshape(256, 222 * 224)
            for s in range(3):  # ... and the tap's column shift s applied to the product's columns
                full = (Wt[:, :, r, s] @ rows).reshape(256, 222, 224)
                conv[n] += full[:, :, s:s + 222]
    conv += b[None, :, None, None]
    ref = conv.reshape(4, 256, 111, 2, 111, 2).max(axis=(3, 5))
    assert Y.shape == (4, 256, 111, 111) and Y.dtype == np.float32
    assert np.allclose(Y, ref)
    # the process's lifetime peak bounds the evaluator's: issue 2 allows 4 GiB (ru_maxrss is in KiB on Linux)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 * 1024 * 1024


@st.composite
def contraction(draw):
    names = "abcde"
    extent = {x: draw(st.integers(1, 4)) for x in names}
    a = tuple(sorted(draw(st.sets(st.sampled_from(names), max_size=4))))
    b = tuple(sorted(draw(st.sets(st.sampled_from(names), max_size=4))))
    out = tuple(x for x in names if x in a + b and draw(st.booleans()))
    return extent, a, b, out


@settings(max_examples=150, deadline=None)
@given(case=contraction(), seed=st.integers(0, 100))
def test_contraction_matches_einsum(case, seed: int) -> None:
    """The matmul form of a two-factor contraction (with its scratch buffers) equals np.einsum in float64."""
    from tilec.lang.contract import Contractor

    extent, a, b, out = case
    rng = np.random.default_rng(seed)
    A = rng.random([extent[x] for x in a], dtype=np.float32)
    B = rng.random([extent[x] for x in b], dtype=np.float32)
    spec = f"{''.join(a)},{''.join(b)}->{''.join(out)}"
    want = np.einsum(spec, A.astype(np.float64), B.astype(np.float64))
    contractor = Contractor()
    for _ in range(2):  # the second call reuses the scratch buffers
        got = contractor.contract((A, B), (a, b), out, extent)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
