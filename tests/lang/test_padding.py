"""Padded reads (`X[i - 1] ?? 0`) and floor division/modulo in sizes and indices, as the reference evaluator defines
them: every program of benchmarks/families/ (issue 13's families) at small sizes against a NumPy formula written
here (np.pad + windows, np.repeat, np.concatenate, ...), the dtypes, the bounds the checker proves or checks, and the
compiler's located rejection of what it does not compile yet."""
from __future__ import annotations

import pathlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilec.errors import TilecError
from tilec.lang import api
from numpy_refs import conv, windows

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAMILIES = ROOT / "benchmarks" / "families"


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(shape, dtype=np.float32) * 2 - 1


def family(name: str, dtype: str = "f32", **sizes: int):
    text = (FAMILIES / f"{name}.tl").read_text()
    return api.load(text if dtype == "f32" else text.replace("f32[", f"{dtype}["), sizes)


def run(name: str, inputs: dict[str, np.ndarray], dtype: str = "f32") -> np.ndarray:
    program = family(name, dtype)
    (out,) = api.evaluate(program, inputs).values()
    return np.asarray(out, dtype=np.float64)



def pad(x: np.ndarray, p: int, value: float = 0.0) -> np.ndarray:
    return np.pad(x, [(0, 0)] * (x.ndim - 2) + [(p, p), (p, p)], constant_values=value)


def close(got: np.ndarray, want: np.ndarray, tol: float = 1e-5) -> None:
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# ---- the families against NumPy ---------------------------------------------------------------------------------


@pytest.mark.parametrize("h, w", [(9, 8), (8, 9), (1, 2)])
def test_resnet_max_pool_pads_with_minus_infinity(h: int, w: int) -> None:
    x = rand(2, 3, h, w)
    want = windows(pad(x, 1, -np.inf), 3, stride=2).max(axis=0)
    close(run("maxpool3x3s2", {"X": x}), want)


def test_average_pool_counting_the_padding() -> None:
    x = rand(2, 3, 6, 5)
    close(run("avgpool3x3s1", {"X": x}), windows(pad(x, 1), 3).astype(np.float64).sum(axis=0) / 9)


def test_average_pool_excluding_the_padding() -> None:
    x = rand(2, 3, 6, 5)
    count = windows(pad(np.ones_like(x), 1), 3).sum(axis=0)  # torch's count_include_pad=False divisor
    close(run("avgpool3x3s1_exclude", {"X": x}), windows(pad(x, 1), 3).astype(np.float64).sum(axis=0) / count)


def test_overlapping_max_pool() -> None:
    x = rand(1, 3, 6, 5)
    close(run("maxpool2x2s1", {"X": x}), windows(x, 2).max(axis=0))


@pytest.mark.parametrize("dtype, tol", [("f32", 1e-5), ("f16", 2.0**-8), ("bf16", 2.0**-5)])
def test_same_convolution_is_numpy_pad_then_conv(dtype: str, tol: float) -> None:
    x, wt = rand(2, 4, 6, 5, seed=1), rand(3, 4, 3, 3, seed=2)
    np_dtype = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}[dtype]
    xr, wr = (a.astype(np_dtype).astype(np.float32) for a in (x, wt))  # inputs are rounded to their dtype
    want = conv(pad(xr, 1), wr)
    got = run("conv3x3same", {"X": x, "Wt": wt}, dtype)
    close(got, want, tol * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("h", [15, 16])
def test_stem_output_size_is_a_floor_division(h: int) -> None:
    x, wt = rand(1, 3, h, 13, seed=3), rand(4, 3, 7, 7, seed=4)
    program = family("stem7x7s2", H=h, W=13, K=4)
    assert program.tensors["Y"].shape == (1, 4, (h - 7) // 2 + 1, 4)
    close(np.asarray(api.evaluate(program, {"X": x, "Wt": wt})["Y"], np.float64), conv(x, wt, stride=2))


def test_depthwise_grouped_and_dilated_convolutions() -> None:
    x, wd = rand(2, 6, 7, 6, seed=5), rand(6, 3, 3, seed=6)
    close(run("depthwise3x3", {"X": x, "Wt": wd}), conv(x, wd.reshape(6, 1, 3, 3), groups=6))
    x, wg = rand(1, 8, 6, 5, seed=7), rand(8, 2, 3, 3, seed=8)  # G = 4 groups of 2 -> 2 channels
    program = family("grouped3x3", G=4, Cg=2, Kg=2)
    close(np.asarray(api.evaluate(program, {"X": x, "Wt": wg})["Y"], np.float64), conv(x, wg, groups=4))
    x, wt = rand(1, 4, 9, 8, seed=9), rand(5, 4, 3, 3, seed=10)
    close(run("dilated3x3", {"X": x, "Wt": wt}), conv(x, wt, dilation=2))


def test_batched_matmul_and_matrix_vector() -> None:
    a, b = rand(3, 5, 7, seed=11), rand(3, 7, 4, seed=12)
    close(run("bmm", {"A": a, "B": b}), np.matmul(a.astype(np.float64), b))
    m, v = rand(6, 9, seed=13), rand(9, seed=14)
    close(run("matvec", {"Wt": m, "v": v}), m.astype(np.float64) @ v)


def test_data_movement() -> None:
    x = rand(2, 3, 4, 5, seed=15)
    close(run("shift", {"X": x}), x[..., 1:])
    close(run("upsample2x", {"X": x}), x.repeat(2, axis=2).repeat(2, axis=3))
    a, b = rand(2, 3, 4, 5, seed=16), rand(2, 2, 4, 5, seed=17)
    close(run("concat", {"A": a, "B": b}), np.concatenate([a, b], axis=1))
    g = rand(2, 8, 7, 7, seed=18)
    close(run("global_avgpool", {"X": g}), g.astype(np.float64).mean(axis=(2, 3)))


def test_conv_chains() -> None:
    x, wt = rand(1, 3, 8, 7, seed=19), rand(4, 3, 3, 3, seed=20)
    close(run("conv_c3", {"X": x, "Wt": wt}), conv(x, wt))
    x, wt, s = rand(1, 4, 6, 5, seed=21), rand(4, 4, 3, 3, seed=22), rand(1, 4, 4, 3, seed=23)
    close(run("conv_residual", {"X": x, "Wt": wt, "S": s}), conv(x, wt) + s)
    x, w1, w2 = rand(1, 4, 8, 7, seed=24), rand(4, 4, 3, 3, seed=25), rand(4, 4, 3, 3, seed=26)
    close(run("conv_relu_conv", {"X": x, "W1": w1, "W2": w2}), conv(np.maximum(conv(x, w1), 0), w2))


def test_resnet_and_mobilenet_blocks() -> None:
    x, w1, b1 = rand(2, 4, 6, 5, seed=40), rand(4, 4, 3, 3, seed=41), rand(4, seed=42)
    w2, b2 = rand(4, 4, 3, 3, seed=43), rand(4, seed=44)
    t = conv(pad(x, 1), w1) + b1[:, None, None]
    want = np.maximum(conv(pad(np.maximum(t, 0), 1), w2) + b2[:, None, None] + x, 0)
    close(run("resnet_block", {"X": x, "W1": w1, "b1": b1, "W2": w2, "b2": b2}), want)
    x, we, wd, wp = rand(2, 3, 6, 5, seed=45), rand(8, 3, seed=46), rand(8, 3, 3, seed=47), rand(3, 8, seed=48)
    relu6 = lambda a: np.minimum(np.maximum(a, 0), 6)  # noqa: E731
    a = np.einsum("nchw,ec->nehw", x.astype(np.float64), we)
    b = conv(pad(relu6(a), 1), wd.reshape(8, 1, 3, 3), groups=8)
    want = x + np.einsum("nehw,ke->nkhw", relu6(b), wp)
    close(run("mobilenet_block", {"X": x, "We": we, "Wd": wd, "Wp": wp}), want)


# ---- meaning of the constructs ----------------------------------------------------------------------------------


def test_padding_constant_is_rounded_to_the_tensor_dtype() -> None:
    text = ("kernel k(X: f16[N]) -> Y\n  default N = 4\n  Y: f32[N]\n  for i in 0..N:\n"
            "    Y[i] = f32(X[i - 1] ?? 0.1)\n")
    out = api.evaluate(api.load(text), {"X": np.arange(4, dtype=np.float32)})["Y"]
    assert out.tolist() == [float(np.float16(0.1)), 0.0, 1.0, 2.0]


def test_floor_division_and_modulo_of_negative_values() -> None:
    """floor semantics (Python's // and %), also where the dividend is negative: index (i - 3) / 2 + 2."""
    text = ("kernel k(X: f32[N]) -> Y, Z\n  default N = 8\n  Y: f32[N]\n  Z: f32[N]\n  for i in 0..N:\n"
            "    Y[i] = X[(i - 3) / 2 + 2]\n    Z[i] = X[(i - 3) % 4]\n")
    x = np.arange(8, dtype=np.float32) * 10
    out = api.evaluate(api.load(text), {"X": x})
    assert out["Y"].tolist() == [x[(i - 3) // 2 + 2] for i in range(8)]
    assert out["Z"].tolist() == [x[(i - 3) % 4] for i in range(8)]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 9), m=st.integers(1, 12), a=st.integers(1, 3), b=st.integers(-3, 3), d=st.integers(1, 4),
       fill=st.sampled_from([0.0, -1.5, 2.0]))
def test_padded_quasi_affine_read_is_the_numpy_gather(n: int, m: int, a: int, b: int, d: int, fill: float) -> None:
    text = (f"kernel k(X: f32[N]) -> Y\n  Y: f32[{m}]\n  for i in 0..{m}:\n"
            f"    Y[i] = X[({a}*i + {b}) / {d}] ?? {fill}\n")
    x = rand(n, seed=n * 13 + m)
    want = [x[(a * i + b) // d] if 0 <= (a * i + b) // d < n else fill for i in range(m)]
    try:
        program = api.load(text, {"N": n})
    except TilecError as err:  # padding wider than X, or never touching it: the checker's bound
        idx = [(a * i + b) // d for i in range(m)]
        assert "padded read never touches" in err.message or "padding too wide" in err.message
        assert max(idx) < 0 or min(idx) >= n or -min(idx) > n or max(idx) - (n - 1) > n
        return
    np.testing.assert_array_equal(api.evaluate(program, {"X": x})["Y"], np.asarray(want, np.float32))


def test_padded_reads_accumulate_inside_taps_loops_and_through_temporaries() -> None:
    """A padded read of an intermediate (the second conv of a padded ResNet block) and of the statement's own
    target's neighbours after a store (a 1-D blur written in place, run sequentially)."""
    text = """\
kernel blur(X: f32[N]) -> Y
  default N = 7
  T: f32[N]
  Y: f32[N]
  for i in 0..N:
    T[i] = 2 * X[i]
  for i in 0..N:
    Y[i] = 0
    for r in 0..3:
      Y[i] += T[i + r - 1] ?? 0
"""
    x = rand(7, seed=30)
    t = np.pad(2 * x.astype(np.float64), 1)
    close(np.asarray(api.evaluate(api.load(text), {"X": x})["Y"], np.float64), t[:-2] + t[1:-1] + t[2:])


# ---- bounds -------------------------------------------------------------------------------------------------------


def test_bounds_are_proven_through_floor_divisions() -> None:
    """The max pool's `Ho = (H + 2*1 - 3) / 2 + 1` is a floor: the stores into Y are still proven in bounds for all
    sizes; only the padded reads of X wait for concrete sizes (their padding is checked then)."""
    from tilec.lang import bounds, checker

    text = (FAMILIES / "maxpool3x3s2.tl").read_text()
    pending = bounds.prove(checker.check(api.parse(text)))
    assert {(site.access.tensor, site.access.fill) for site, _ in pending.sites} == {("X", float("-inf"))}


def test_unpadded_read_beyond_a_floor_size_is_out_of_bounds() -> None:
    text = (FAMILIES / "maxpool3x3s2.tl").read_text().replace(" ?? -inf", "")
    with pytest.raises(TilecError, match=r"out of bounds.*`2\*i \+ p - 1` goes down to -1") as info:
        api.load(text, {"H": 8, "W": 8})
    assert "?? 0" in info.value.hint


# ---- the compiler's rejection -----------------------------------------------------------------------------------


# a padded read the compiler does not compile yet (padded convolutions and the MobileNet block do since issue 13's
# contraction work): a row sum of a shifted, zero-filled row
PADDED_ROW_SUM = """\
kernel padded_row_sum(X: f32[C, H, W]) -> S
  S: f32[C, H]
  for c in 0..C, i in 0..H:
    S[c, i] = 0
    for j in 0..W:
      S[c, i] += X[c, i, j - 1] ?? 0
"""


@pytest.mark.parametrize("name, what", [("padded_row_sum", "zero padding")])
def test_compiler_rejects_with_a_located_error(name: str, what: str, tmp_path: pathlib.Path,
                                               capsys: pytest.CaptureFixture) -> None:
    from tilec_cli import main

    path = tmp_path / f"{name}.tl"
    path.write_text(PADDED_ROW_SUM if name == "padded_row_sum" else (FAMILIES / f"{name}.tl").read_text())
    sizes = ["-DC=4", "-DH=4", "-DW=4"]
    assert main(["compile", str(path), *sizes, "-o", str(tmp_path / "k.py")]) == 1
    err = capsys.readouterr().err
    assert f"{path}:" in err and f"error: {what}" in err and "not compiled yet" in err and "Traceback" not in err
    assert "--backend ref" in err and "^" in err
    assert main(["run", str(path), *sizes, "--backend", "ref"]) == 0


@pytest.mark.parametrize("path", sorted(FAMILIES.glob("*.tl")), ids=lambda p: p.stem)
def test_fmt_keeps_padded_reads_and_floor_divisions(path: pathlib.Path) -> None:
    from tilec.lang.fmt import format_source

    text = path.read_text()
    formatted = format_source(text)
    assert api.parse(formatted) == api.parse(text) and format_source(formatted) == formatted
    if "??" in text:
        assert "??" in formatted


def test_floor_division_indices_proven_in_bounds_for_all_sizes() -> None:
    """`X[n, c, i / 2, j / 2]` over i in 0..2*H is in bounds whatever H: floor(i / 2) <= H - 1 iff i <= 2*H - 1;
    over 0..2*H + 1 it is not, and the checker finds it with concrete sizes."""
    from tilec.lang import bounds, checker

    text = (FAMILIES / "upsample2x.tl").read_text()
    assert bounds.prove(checker.check(api.parse(text))).sites == ()
    wider = text.replace("i in 0..2*H", "i in 0..2*H + 1").replace("f32[N, C, 2*H, 2*W]", "f32[N, C, 2*H + 1, 2*W]")
    assert [(site.access.tensor, dim) for site, dim in bounds.prove(checker.check(api.parse(wider))).sites] == \
        [("X", 2)]
    with pytest.raises(TilecError, match=r"dimension 3 of `X` has size 3, but `i / 2` reaches 3"):
        api.load(wider, {"H": 3})


def test_padding_reports_the_halo_as_numpy_pad_width(capsys: pytest.CaptureFixture) -> None:
    """The halo a compiler must provide instead of a padded copy: np.pad's pad_width, per padded read. ResNet's
    pool on an even image reads one padding row before and none after (stride 2 never reaches row H)."""
    from tilec_cli import main

    ((acc, pad),) = api.padding(family("maxpool3x3s2", H=112, W=111))
    assert acc.tensor == "X" and acc.fill == float("-inf") and pad == ((0, 0), (0, 0), (1, 0), (1, 1))
    ((_, pad),) = api.padding(family("conv3x3same"))
    assert pad == ((0, 0), (0, 0), (1, 1), (1, 1))
    assert api.padding(family("upsample2x")) == []
    assert main(["check", str(FAMILIES / "conv3x3same.tl")]) == 0
    assert "; X padded ((0, 0), (0, 0), (1, 1), (1, 1)) at line 9" in capsys.readouterr().out


def test_division_outside_a_copy_compiles_and_a_sum_divided_is_a_located_rejection() -> None:
    # a copy's `i / 2` read compiles (tests/compiler/test_data_movement.py); in arithmetic it is copied first since
    # lang15 (permute_split.split_shifted_reads); a sum of loop variables divided is not compiled yet
    from tilec.compiler.api import compile_loaded

    text = (FAMILIES / "upsample2x.tl").read_text().replace("= X[n, c, i / 2, j / 2]", "= 2 * X[n, c, i / 2, j / 2]")
    program = api.load(text, {"N": 1, "C": 4, "H": 4, "W": 4})
    x = np.random.default_rng(5).random((1, 4, 4, 4), dtype=np.float32)
    got = compile_loaded(program).run(X=x)["Y"]
    np.testing.assert_array_equal(got, 2 * x.repeat(2, axis=2).repeat(2, axis=3))
    text = text.replace("2 * X[n, c, i / 2, j / 2]", "2 * X[n, c, (i + j) / 4, j / 2]")
    with pytest.raises(TilecError, match="floor division of a loop variable in an index") as info:
        compile_loaded(api.load(text, {"C": 4, "H": 4, "W": 4}))
    assert info.value.span is not None and "--backend ref" in info.value.hint
