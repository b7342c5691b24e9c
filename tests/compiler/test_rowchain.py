"""Fused row chains (build_rowchain.py): what the folding does to the kernel, and that every form it takes computes
what the reference evaluator computes on the interpreter, in both NKI forms and in every dtype.

The folding: an element-wise intermediate that is an affine map of one tile per row (`d = X - mu`) is never a pass
of its own, its readers' activations take the map as scale and bias; a column op runs on the engine that made its
inputs; a chain of VectorE steps against broadcast rows (`* g + b`) goes column chunk by chunk through PSUM."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from compiler_helpers import EXAMPLES, compile_example, inputs_for
from tilec.compiler import ir
from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from tilec.tolerance import check_outputs


def check(c, seed: int = 7) -> None:
    """The project's one tolerance policy (tilec/tolerance.py): output dtype, accumulation length, narrowed
    intermediates."""
    inputs = inputs_for(c.program, seed)
    inputs = {k: (v - 0.5).astype(np.float32) for k, v in inputs.items()}  # signed: the centring must be right
    want = lang.evaluate(c.program, inputs)
    got = c.run(**inputs)
    assert check_outputs(c.program, got, want) == []


def chain_stmts(c) -> list:
    """The statements inside the fused chain's loop over row tiles."""
    for s in ir.walk(c.result.kernel.body):
        if isinstance(s, ir.Loop) and s.var == "pt":
            return list(ir.walk(s.body))
    raise AssertionError("no row-tile loop")


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "softmax"])
@pytest.mark.parametrize("sizes", [None, {"M": 200, "N": 1000}])
def test_normalisations_in_16_bit_dtypes(name: str, dtype: str, sizes) -> None:
    check(compile_example(name, sizes, dtype=dtype))


@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_layernorm_in_both_nki_forms(nki: str) -> None:
    check(compile_loaded(lang.load(str(EXAMPLES / "layernorm.tl"), {"M": 256, "N": 2048}), nki=nki))


def test_layernorm_centring_is_folded_into_the_activations() -> None:
    """Three ScalarE passes over a row tile (the mean; the squares of X - mu with bias -mu; X - mu, centred before
    it is scaled, because `X*r - mu*r` cancels after scaling (see the near-equal-values test)); the scaling by r
    rides on g's broadcast (r turned into a row on TensorE, the stationary of the broadcast: r x g in PSUM); no
    tile of d kept as a tensor; no VectorE column op inside the loop (ScalarE would wait for it behind VectorE's
    work on the previous row tile); the multiply reads its PSUM operand (r x g broadcast by TensorE per chunk).
    Software-pipelined (pair_tiles.py), the loop over pairs of row tiles holds two of each stage; the shift by b
    is on GpSimdE, reading the product from SBUF; each row tile is stored in two halves."""
    c = compile_example("layernorm", {"M": 512, "N": 2048})
    assert "software-pipelined" in c.source
    stmts = chain_stmts(c)
    full = [s for s in stmts if isinstance(s, ir.Act) and s.dst.shape()[1] > 1]
    assert [s.func for s in full] == ["copy", "square", "copy"] * 2
    assert {s.src.buf.name for s in full} == {"X_tile", "X_tile_2"}
    assert not any(isinstance(s, ir.Alloc) and s.buf.name.startswith("d_") for s in stmts)
    assert not any(isinstance(s, (ir.Scalar, ir.Binary)) and s.dst.shape()[1] == 1 for s in stmts)
    turns = [s for s in stmts if isinstance(s, ir.Transpose)]
    assert len(turns) == 2 and all(s.src.buf.name.startswith("r_tile") for s in turns)
    matmuls = [s for s in stmts if isinstance(s, ir.Matmul)]
    assert matmuls and all(s.stationary.buf.name.startswith("r_row") for s in matmuls)
    binaries = [s for s in stmts if isinstance(s, ir.Binary)]
    # two stages B per loop iteration, each over two halves of the columns (each half stored after its steps)
    assert len(binaries) == 8 and {s.engine for s in binaries} == {"", "gpsimd"}
    stores = [s for s in stmts if isinstance(s, ir.Dma) and s.dst.buf.memory == "hbm"]
    assert len(stores) == 4 and {s.src.shape()[1] for s in stores} == {1024}
    assert all("psum" in (s.a.buf.memory, s.b.buf.memory) for s in binaries if not s.engine)
    assert "Y_TILE_F = 512" in c.source and "# tl:23" in c.source
    check(c)


def test_softmax_keeps_its_shape() -> None:
    """max reduce (VectorE), its negation there, exp with bias and row sum, reciprocal, scale: nothing to fold."""
    stmts = chain_stmts(compile_example("softmax"))
    kinds = [type(s).__name__ for s in stmts if not isinstance(s, (ir.Alloc, ir.Dma))]
    assert kinds == ["Reduce", "Scalar", "Act", "Act", "Act"]


STEPS = """kernel steps(X: f32[M, N], g: f32[N], h: f32[N], b: f32[N]) -> Y
  default M = 256, N = 1536
  m: f32[M]
  Y: f32[M, N]
  for i in 0..M:
    m[i] = 0
    for j in 0..N:
      m[i] += X[i, j] / N
  for i in 0..M, j in 0..N:
    Y[i, j] = (X[i, j] - m[i]) * g[j] * h[j] - b[j] / 2
"""


def test_three_steps_through_psum() -> None:
    """`* g * h - b / 2`: g from its PSUM broadcast, then two steps each reading the previous step's PSUM chunk."""
    c = compile_loaded(lang.load(STEPS))
    binaries = [s for s in chain_stmts(c) if isinstance(s, ir.Binary)]
    assert len(binaries) == 3 and all("psum" in (s.a.buf.memory, s.b.buf.memory) for s in binaries)
    check(c)


@pytest.mark.parametrize("n", [1031, 96])
def test_columns_without_a_chunk(n: int) -> None:
    """N prime (no divisor from 128 to 512: the steps run over the whole tile in SBUF) or below one bank."""
    check(compile_loaded(lang.load(STEPS.replace("N = 1536", f"N = {n}"))))


OUTPUTS = """kernel ln(X: f32[M, N]) -> Y, mu, r, d
  default M = 200, N = 300
  mu: f32[M]
  d: f32[M, N]
  v: f32[M]
  r: f32[M]
  Y: f32[M, N]
  for i in 0..M:
    mu[i] = 0
    for j in 0..N:
      mu[i] += X[i, j] / N
  for i in 0..M, j in 0..N:
    d[i, j] = X[i, j] - mu[i]
  for i in 0..M:
    v[i] = 0
    for j in 0..N:
      v[i] += d[i, j] * d[i, j] / N
  for i in 0..M:
    r[i] = rsqrt(v[i] + 1e-05)
  for i in 0..M, j in 0..N:
    Y[i, j] = -d[i, j] / (2 * r[i]) + max(d[i, j], 0.5 * mu[i])
"""


def test_folded_values_that_are_outputs_are_computed_and_stored() -> None:
    """mu and r (columns) and d (a folded tile) are outputs too; Y divides by a column expression, negates, and
    takes a maximum of a tile and a column."""
    c = compile_loaded(lang.load(OUTPUTS))
    assert "fused row chain" in c.source
    check(c)


CONVERT = """kernel cv(X: f32[M, N]) -> Y
  default M = 256, N = 512
  m: f32[M]
  Y: f32[M, N]
  for i in 0..M:
    m[i] = -inf
    for j in 0..N:
      m[i] max= X[i, j]
  for i in 0..M, j in 0..N:
    Y[i, j] = f32(bf16(X[i, j] - m[i])) * 3
"""


def test_a_conversion_in_a_chain_goes_through_the_expression_compiler() -> None:
    c = compile_loaded(lang.load(CONVERT))
    assert "fused row chain" in c.source and "bfloat16" in c.source
    check(c)


SUM_OF_A_FUNCTION = """kernel lse(X: f32[M, N]) -> l
  default M = 256, N = 512
  m: f32[M]
  e: f32[M, N]
  s: f32[M]
  l: f32[M]
  for i in 0..M:
    m[i] = -inf
    for j in 0..N:
      m[i] max= X[i, j]
  for i in 0..M, j in 0..N:
    e[i, j] = exp(X[i, j] - m[i])
  for i in 0..M:
    s[i] = 1
    for j in 0..N:
      s[i] += e[i, j] / N
  for i in 0..M:
    l[i] = log(s[i]) + m[i]
"""


def test_a_sum_of_a_function_keeps_its_factor_on_the_column() -> None:
    """The sum rides on the exp that made e (whose values stay unscaled): the column carries the 1 / N and the
    initial 1 to its reader, log's scale and bias."""
    c = compile_loaded(lang.load(SUM_OF_A_FUNCTION))
    acts = [s for s in chain_stmts(c) if isinstance(s, ir.Act)]
    assert [s.func for s in acts] == ["exp", "log", "copy"] and acts[0].total is not None
    assert acts[1].scale == 1 / 512 and acts[1].bias is not None
    check(c)


def test_a_mean_only_subtracted_is_summed_negated() -> None:
    """`d = X - mu` is the only reader of mu: the mean activation sums -X / N (its column is the bias as it is);
    mu as an output of the kernel is stored with its sign restored."""
    text = (EXAMPLES / "layernorm.tl").read_text().replace("-> Y", "-> Y, mu")
    c = compile_loaded(lang.load(text, {"M": 256, "N": 384}))
    first = next(s for s in chain_stmts(c) if isinstance(s, ir.Act))
    assert first.scale == -1 / 384 and first.total is not None and first.total.buf.name == "mu_neg"
    check(c)


def test_layernorm_centres_before_scaling_rows_of_near_equal_values():
    """`(X - mu) * r` folded as `X*r - mu*r` cancels after scaling: on rows of near-equal values r = rsqrt(var +
    eps) is large and the fold lost ~13x the reference's accuracy (fuzz seed 14003150). The chain centres first."""
    program = lang.load(str(EXAMPLES / "layernorm.tl"), {"M": 256, "N": 2})
    rng = np.random.default_rng(3)
    base = rng.uniform(-3, 3, (256, 1))
    x = (base + rng.uniform(-1e-4, 1e-4, (256, 2))).astype(np.float32)  # each row's two values nearly equal
    inputs = {"X": x, "g": rng.uniform(-1, 1, 2).astype(np.float32), "b": rng.uniform(-1, 1, 2).astype(np.float32)}
    got = compile_loaded(program).run(**inputs)
    assert check_outputs(program, got, lang.evaluate(program, inputs)) == []


def test_explain_places_a_chains_temporaries_in_the_chain():
    """`tilec explain` says where each temporary lives: a row chain's (softmax's m, e, s) stay in its row tiles."""
    from tilec.compiler.api import explain

    text = explain(compile_example("softmax"))
    for name in ("m", "e", "s"):
        assert f"{name:<12} never in HBM: fused into the row chain writing Y" in text
    assert "fused into ?" not in text


def test_explain_names_the_chain_that_keeps_a_temporary():
    """A global pool's S and a MobileNet block's A and B are kept by those kernels, not by a row chain."""
    from tilec.compiler.api import compile_file, explain

    root = pathlib.Path(__file__).resolve().parents[2]
    pooled = explain(compile_file(str(root / "benchmarks" / "families" / "global_avgpool.tl"), shapes={"N": 2, "C": 8}))
    assert f"{'S':<12} never in HBM: fused into the global pool writing Y" in pooled
    block = explain(compile_example("mobilenet_block"))
    for name in ("A", "B"):
        assert f"{name:<12} never in HBM: fused into the MobileNet block writing Y" in block
    assert "row chain" not in pooled + block
