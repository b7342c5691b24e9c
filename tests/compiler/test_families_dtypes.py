"""Issue 13's "Done when": every program family compiles and matches on the interpreter for fp32, fp16 and bf16, at
sizes where it is not a single tile. Each program of benchmarks/families/ (the families' table) is compiled with its
default schedule in each dtype, at sizes with more than one tile (a dimension over the 128 partitions, several
images, a free size over one PSUM bank, odd edges), run on tilec's NKI interpreter, and compared with a NumPy
formula written here in float64 (np.pad + windows for pools and convolutions, einsum for contractions, np.repeat,
np.concatenate, transpose): never with tilec's own evaluator. Tensors the program stores in a 16-bit dtype are
rounded to it in the formula too (the program's meaning); the tolerance is the project's one policy
(tilec/tolerance.py: accumulation length and narrow intermediates read from the program)."""
from __future__ import annotations

import pathlib
from typing import Callable

import ml_dtypes
import numpy as np
import pytest

from tilec.compiler.api import compile_loaded
from tilec.lang import api as lang
from tilec.tolerance import max_error, program_budget, scale_of, tolerance
from numpy_refs import conv, windows

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAMILIES = ROOT / "benchmarks" / "families"
PROGRAMS = ROOT / "tests" / "programs" / "audit13"
DTYPES = ("f32", "f16", "bf16")
NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
Arrays = dict[str, np.ndarray]



def pad(x: np.ndarray, before: int, after: int | None = None, value: float = 0.0) -> np.ndarray:
    """np.pad of the last two axes."""
    after = before if after is None else after
    return np.pad(x, [(0, 0)] * (x.ndim - 2) + [(before, after)] * 2, constant_values=value)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def avg_exclude(x: np.ndarray, r: int, stride: int, p: int) -> np.ndarray:
    """torch avg_pool2d(x, r, stride, p, count_include_pad=False)."""
    total = windows(pad(x, p), r, stride).sum(axis=0)
    count = windows(pad(np.ones_like(x), p), r, stride).sum(axis=0)
    return total / count


# name -> (sizes with more than one tile, formula(inputs in float64, round) -> {output: expected})
Formula = Callable[[Arrays, Callable[[np.ndarray], np.ndarray]], Arrays]
CASES: dict[str, tuple[dict[str, int], Formula]] = {
    "maxpool3x3s2": (dict(N=2, C=160, H=21, W=30),
                     lambda a, q: {"Y": windows(pad(a["X"], 1, value=-np.inf), 3, 2).max(axis=0)}),
    "avgpool3x3s1": (dict(N=2, C=160, H=14, W=13),
                     lambda a, q: {"Y": q(windows(pad(a["X"], 1), 3).sum(axis=0)) / 9}),
    "avgpool3x3s1_exclude": (dict(N=2, C=160, H=14, W=13), lambda a, q: {"Y": avg_exclude(a["X"], 3, 1, 1)}),
    "maxpool2x2s1": (dict(N=2, C=160, H=14, W=13), lambda a, q: {"Y": windows(a["X"], 2).max(axis=0)}),
    "conv3x3same": (dict(N=2, C=160, K=144, H=20, W=27), lambda a, q: {"Y": conv(pad(a["X"], 1), a["Wt"])}),
    "stem7x7s2": (dict(N=2, K=136, H=40, W=45), lambda a, q: {"Y": conv(a["X"], a["Wt"], stride=2)}),
    "depthwise3x3": (dict(N=2, C=144, H=22, W=27),
                     lambda a, q: {"Y": conv(a["X"], a["Wt"][:, None], groups=a["X"].shape[1])}),
    "grouped3x3": (dict(N=2, G=40, Cg=4, Kg=4, H=14, W=13),
                   lambda a, q: {"Y": conv(a["X"], a["Wt"], groups=40)}),
    "depthwise_mult3x3": (dict(N=2, C=72, M=2, H=14, W=13),
                          lambda a, q: {"Y": conv(a["X"], a["Wt"][:, None], groups=72)}),
    "grouped_kg1": (dict(N=2, G=144, Cg=4, H=14, W=13), lambda a, q: {"Y": conv(a["X"], a["Wt"], groups=144)}),
    "dilated3x3": (dict(N=2, C=160, K=136, H=24, W=27), lambda a, q: {"Y": conv(a["X"], a["Wt"], dilation=2)}),
    "conv3x3s2": (dict(N=2, C=67, K=129, H=23, W=27), lambda a, q: {"Y": conv(pad(a["X"], 1), a["Wt"], stride=2)}),
    "conv1x1s2": (dict(N=2, C=160, K=129, H=23, W=27),
                  lambda a, q: {"Y": conv(a["X"][..., ::2, ::2], a["Wt"][:, :, None, None])}),
    "depthwise3x3s2": (dict(N=2, C=144, H=23, W=28),
                       lambda a, q: {"Y": conv(pad(a["X"], 1), a["Wt"][:, None], stride=2, groups=a["X"].shape[1])}),
    "conv_odd": (dict(N=2, C=67, K=129, H=14, W=27), lambda a, q: {"Y": conv(pad(a["X"], 1), a["Wt"])}),
    "bmm": (dict(N=3, M=200, K=300, P=520), lambda a, q: {"C": a["A"] @ a["B"]}),
    "bmm_at": (dict(N=3, M=200, K=300, P=520), lambda a, q: {"C": a["A"].transpose(0, 2, 1) @ a["B"]}),
    "bmm_bt": (dict(N=3, M=200, K=300, P=520), lambda a, q: {"C": a["A"] @ a["B"].transpose(0, 2, 1)}),
    "matvec": (dict(M=300, K=700), lambda a, q: {"y": a["Wt"] @ a["v"]}),
    "shift": (dict(N=2, C=160, H=14, W=13), lambda a, q: {"Y": a["X"][..., 1:]}),
    "shift_padded": (dict(N=2, C=160, H=14, W=13),  # Y[i, j] = X[i - 2, j + 1], zero outside
                     lambda a, q: {"Y": np.pad(a["X"], [(0, 0), (0, 0), (2, 0), (0, 1)])[..., :14, 1:]}),
    "pad1": (dict(N=2, C=160, H=14, W=13), lambda a, q: {"P": pad(a["X"], 1)}),
    "upsample2x": (dict(N=2, C=160, H=9, W=11), lambda a, q: {"Y": a["X"].repeat(2, axis=2).repeat(2, axis=3)}),
    "upconv2x2": (dict(N=2, C=136, K=40, H=5, W=7), lambda a, q: {"Y": upconv2x2(a)}),
    "dcgan_up4x4": (dict(N=2, C=136, K=24, H=4, W=5), lambda a, q: {"Y": tconv_padded(a, 4)}),
    "upconv3x3s2": (dict(N=2, C=136, K=64, H=4, W=5), lambda a, q: {"Y": tconv_padded(a, 3)}),
    "concat": (dict(N=2, C1=160, C2=40, H=7, W=9), lambda a, q: {"Y": np.concatenate([a["A"], a["B"]], axis=1)}),
    "heads_permute": (dict(S=200, N=2, H=3, D=40), lambda a, q: {"Y": a["X"].transpose(1, 2, 0, 3)}),
    "global_avgpool": (dict(N=2, C=300), lambda a, q: {"Y": q(a["X"].sum(axis=(2, 3))) / 49}),
    "conv_c3": (dict(N=2, K=136, H=30, W=27), lambda a, q: {"Y": conv(a["X"], a["Wt"])}),
    "conv_residual": (dict(N=2, C=160, K=136, H=18, W=27),
                      lambda a, q: {"Y": q(conv(a["X"], a["Wt"])) + a["S"]}),
    "conv_relu_conv": (dict(N=2, C=136, H=18, W=27),
                       lambda a, q: {"Y": conv(q(relu(q(conv(a["X"], a["W1"])))), a["W2"])}),
    "resnet_block": (dict(N=2, C=136, H=14, W=27), lambda a, q: {"Y": resnet_block(a, q)}),
    "mobilenet_block": (dict(N=2, C=24, E=144, H=14, W=27), lambda a, q: {"Y": mobilenet_block(a, q)}),
    "maxpool5x5s1": (dict(N=2, C=160, H=14, W=13),
                     lambda a, q: {"Y": windows(pad(a["X"], 2, value=-np.inf), 5).max(axis=0)}),
    "maxpool5x5s2": (dict(N=2, C=160, H=21, W=30),
                     lambda a, q: {"Y": windows(pad(a["X"], 2, value=-np.inf), 5, 2).max(axis=0)}),
    "avgpool5x5s1": (dict(N=2, C=160, H=14, W=13),
                     lambda a, q: {"Y": q(windows(pad(a["X"], 2), 5).sum(axis=0)) / 25}),
    "avgpool5x5s2": (dict(N=2, C=160, H=21, W=30),
                     lambda a, q: {"Y": q(windows(pad(a["X"], 2), 5, 2).sum(axis=0)) / 25}),
    # 136 output channels (two tiles of 68): the conv -> pool chain kept on chip by default (pool_chain.py)
    "stem_maxpool": (dict(N=2, K=136, H=40, W=45), lambda a, q: {
        "Y": windows(pad(q(conv(pad(a["X"], 3), a["Wt"], stride=2)), 1, value=-np.inf), 3, 2).max(axis=0)}),
    # channels-last (NHWC) rows: the NCHW formulas on X moved to channels-first and the result moved back
    "maxpool3x3s2_nhwc": (dict(N=2, C=160, H=21, W=30), lambda a, q: {
        "Y": last(windows(pad(first(a["X"]), 1, value=-np.inf), 3, 2).max(axis=0))}),
    "maxpool2x2s2_nhwc": (dict(N=2, C=160, H=14, W=12),
                          lambda a, q: {"Y": last(windows(first(a["X"]), 2, 2).max(axis=0))}),
    "global_avgpool_nhwc": (dict(N=2, C=300), lambda a, q: {"Y": q(a["X"].sum(axis=(1, 2))) / 49}),
    "depthwise3x3_nhwc": (dict(N=2, C=144, H=22, W=27), lambda a, q: {
        "Y": last(conv(first(a["X"]), a["Wt"].transpose(2, 0, 1)[:, None], groups=a["X"].shape[3]))}),
}


def upconv2x2(a: Arrays) -> np.ndarray:
    """ConvTranspose2d(C, K, 2, stride=2) + bias: output pixel (2h + i, 2w + j) = sum_c X[c, h, w] Wt[c, k, i, j]."""
    t = np.einsum("nchw,ckij->nkhiwj", a["X"], a["Wt"]) + a["b"][None, :, None, None, None, None]
    n, k, h, _, w, _ = t.shape
    return t.reshape(n, k, 2 * h, 2 * w)


def tconv_padded(a: Arrays, R: int) -> np.ndarray:
    """ConvTranspose2d(C, K, R, stride=2, padding=1, output_padding=R % 2) [+ bias]: input pixel (h, w) adds tap
    (r, q) times it at output (2h + r - 1, 2w + q - 1); the output is 2H x 2W."""
    X, W = a["X"], a["Wt"]
    n, _, h, w = X.shape
    full = np.zeros((n, W.shape[1], 2 * h + R, 2 * w + R))
    for r in range(R):
        for q in range(R):
            full[:, :, r:r + 2 * h:2, q:q + 2 * w:2] += np.einsum("nchw,ck->nkhw", X, W[:, :, r, q])
    out = full[:, :, 1:1 + 2 * h, 1:1 + 2 * w]
    return out + a["b"][None, :, None, None] if "b" in a else out


def first(x: np.ndarray) -> np.ndarray:
    """NHWC -> NCHW."""
    return x.transpose(0, 3, 1, 2)


def last(x: np.ndarray) -> np.ndarray:
    """NCHW -> NHWC."""
    return x.transpose(0, 2, 3, 1)


def resnet_block(a: Arrays, q) -> np.ndarray:
    t = q(conv(pad(a["X"], 1), a["W1"]) + a["b1"][:, None, None])
    u = q(conv(pad(relu(t), 1), a["W2"]) + a["b2"][:, None, None])
    return relu(u + a["X"])


def mobilenet_block(a: Arrays, q) -> np.ndarray:
    relu6 = lambda v: np.minimum(relu(v), 6.0)  # noqa: E731
    e = q(np.einsum("nchw,ec->nehw", a["X"], a["We"]))
    d = q(conv(pad(relu6(e), 1), a["Wd"][:, None], groups=e.shape[1]))
    return a["X"] + np.einsum("nehw,ke->nkhw", relu6(d), a["Wp"])


def signed_inputs(program, dtype: str, seed: int) -> tuple[Arrays, Arrays]:
    """Inputs in [-0.5, 0.5) (a relu, a max or a clamp sees both signs), exactly representable in `dtype`: (what the
    kernel gets, the same values in float64 for the formula)."""
    rng = np.random.default_rng(seed)
    given = {t.name: (rng.random(t.shape, dtype=np.float32) - 0.5).astype(NP[dtype]) for t in program.inputs}
    return given, {k: v.astype(np.float64) for k, v in given.items()}


def check(program, dtype: str, formula: Formula, seed: int = 13) -> None:
    given, exact = signed_inputs(program, dtype, seed)
    rounding = lambda v: np.asarray(v).astype(NP[dtype]).astype(np.float64)  # noqa: E731  a store in `dtype`
    want = formula(exact, rounding)
    got = compile_loaded(program).run(**given)
    assert set(got) == set(want)
    for name, expected in want.items():
        assert np.isfinite(expected).all()
        assert np.shape(got[name]) == expected.shape, name
        acc_len, inter = program_budget(program).get(name, (1, None))
        tol = tolerance(dtype, acc_len, scale_of(expected), inter)
        err = max_error(np.asarray(got[name], np.float64), rounding(expected))
        assert err <= tol, f"{name} ({dtype}): max |kernel - NumPy| {err:.3g} > tolerance {tol:.3g}"


def load(path: pathlib.Path, dtype: str, sizes: dict[str, int]):
    text = path.read_text()
    return lang.load(text if dtype == "f32" else text.replace("f32[", f"{dtype}["), sizes)


def not_one_tile(program) -> bool:
    """Some tensor has a dimension over the 128 partitions or more elements than one 128 x 512 tile."""
    return any(max(t.shape) > 128 or int(np.prod(t.shape)) > 128 * 512 for t in program.tensors.values())


def test_every_family_of_the_table_has_a_case() -> None:
    assert set(CASES) == {p.stem for p in FAMILIES.glob("*.tl")}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_family_matches_numpy(name: str, dtype: str) -> None:
    sizes, formula = CASES[name]
    program = load(FAMILIES / f"{name}.tl", dtype, sizes)
    assert not_one_tile(program)
    check(program, dtype, formula)


# ---- variations a new user writes (tests/programs/audit13/, default sizes) -------------------------------------------

def _maxpool_p2(a: Arrays, q) -> Arrays:
    return {"Y": windows(pad(a["X"], 2, value=-np.inf), 5, 2).max(axis=0)}


def _pixel_free_permute5d(a: Arrays, q) -> Arrays:
    return {"Y": a["X"].transpose(0, 4, 2, 1, 3)}  # Y[a, e, c, b, d] = X[a, b, c, d, e]


VARIATIONS: dict[str, Formula] = {
    "maxpool5x5s2p2": _maxpool_p2,
    "avgpool3x3s1p2": lambda a, q: {"Y": windows(pad(a["X"], 2), 3).sum(axis=0) / 9},
    "avgpool3x3s2_excl": lambda a, q: {"Y": avg_exclude(a["X"], 3, 2, 1)},
    "dilated_strided": lambda a, q: {"Y": conv(pad(a["X"], 2), a["Wt"], stride=2, dilation=2)},
    "conv_s2_pad1": lambda a, q: {"Y": conv(pad(a["X"], 1), a["Wt"], stride=2)},
    "conv1x1s2": lambda a, q: {"Y": conv(a["X"][..., ::2, ::2], a["Wt"][:, :, None, None])},
    "conv_hwio": lambda a, q: {"Y": conv(pad(a["X"], 1), a["Wt"].transpose(3, 2, 0, 1))},
    "conv_nhwc": lambda a, q: {"Y": (conv(pad(a["X"].transpose(0, 3, 1, 2), 1), a["Wt"].transpose(3, 2, 0, 1))
                                     + a["b"][:, None, None]).transpose(0, 2, 3, 1)},
    "pw_nhwc": lambda a, q: {"Y": a["X"] @ a["Wt"]},
    "dw_nhwc": lambda a, q: {"Y": conv(pad(a["X"].transpose(0, 3, 1, 2), 1), a["Wt"].transpose(2, 0, 1)[:, None],
                                       groups=a["X"].shape[3]).transpose(0, 2, 3, 1)},
    "conv_odd": lambda a, q: {"Y": conv(pad(a["X"], 1), a["Wt"])},
    "grouped_same": lambda a, q: {"Y": conv(pad(a["X"], 1), a["Wt"], groups=2)},
    "dw_s2_bias_relu6": lambda a, q: {"Y": np.clip(q(conv(pad(a["X"], 1), a["Wt"][:, None], stride=2,
                                                          groups=a["X"].shape[1])) + a["b"][:, None, None], 0, 6)},
    "conv_bias_sep": lambda a, q: {"Y": relu(q(conv(pad(a["X"], 1), a["Wt"])) + a["b"][:, None, None])},
    "conv_clamp": lambda a, q: {"Y": np.clip(q(conv(pad(a["X"], 1), a["Wt"]) + a["b"][:, None, None]), 0, 6)},
    "conv_scale_shift": lambda a, q: {"Y": q(conv(pad(a["X"], 1), a["Wt"])) * a["g"][:, None, None]
                                      + a["b"][:, None, None]},
    "conv_pool_chain": lambda a, q: {"Y": windows(pad(q(relu(conv(pad(a["X"], 1), a["Wt"]))), 1, value=-np.inf),
                                                  3, 2).max(axis=0)},
    "conv_relu_conv_same": lambda a, q: {"Y": conv(pad(q(relu(q(conv(pad(a["X"], 1), a["W1"]))
                                                                 + a["b1"][:, None, None])), 1), a["W2"])},
    "residual_1x1": lambda a, q: {"Y": relu(q(np.einsum("nchw,kc->nkhw", a["X"], a["Wt"])) + a["S"])},
    "matvec_bias_relu": lambda a, q: {"y": relu(a["Wt"] @ a["v"] + a["b"])},
    "vecmat": lambda a, q: {"y": a["v"] @ a["Wt"]},
    "attn_scores": lambda a, q: {"P": np.einsum("nhid,nhjd->nhij", a["Q"], a["Kt"])},
    "gram": lambda a, q: {"G": a["A"] @ a["A"].T},
    "bmm_batch_mid": lambda a, q: {"C": np.einsum("nik,nkj->inj", a["A"], a["B"])},
    "at_b": lambda a, q: {"C": a["A"].T @ a["B"]},
    "gap_hw": lambda a, q: {"Y": a["X"].sum(axis=(2, 3)) / 49},
    "mean_hw": lambda a, q: {"Y": q(a["X"].sum(axis=(2, 3))) / 49},
    "gmp": lambda a, q: {"Y": a["X"].max(axis=(2, 3))},
    "fpn_add": lambda a, q: {"Y": a["P"].repeat(2, axis=2).repeat(2, axis=3) + a["L"]},
    "upsample3x": lambda a, q: {"Y": a["X"].repeat(3, axis=2).repeat(3, axis=3)},
    "crop_center": lambda a, q: {"Y": a["X"][:, :, 2:-2, 3:-3]},
    "concat3": lambda a, q: {"Y": np.concatenate([a["A"], a["B"], a["D"]], axis=1)},
    "permute5d": _pixel_free_permute5d,
    "permute6d": lambda a, q: {"Y": a["X"].transpose(5, 4, 3, 2, 1, 0)},
}


def test_every_variation_program_has_a_formula() -> None:
    assert set(VARIATIONS) == {p.stem for p in PROGRAMS.glob("*.tl")}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(VARIATIONS))
def test_variation_matches_numpy(name: str, dtype: str) -> None:
    program = load(PROGRAMS / f"{name}.tl", dtype, {})
    assert not_one_tile(program)
    check(program, dtype, VARIATIONS[name])
