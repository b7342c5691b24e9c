"""Every example compiled for trn1 (`--target trn1`): the builders plan with trn1's record (tilec.target.compiled(),
not the default trn2), the kernel runs on the interpreter under trn1's rules (NeuronCore-v2: no scalar activation
bias, no hwdge, 176 KiB of SBUF, VectorE/GpSimdE serialised) and matches NumPy written here independently."""
from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

from tilec import target as hw
from tilec.compiler.api import compile_file
from tilec.lang import api as lang

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.tl"))
SMALL = {"conv2d": {"N": 1, "H": 12, "W": 12}, "conv_relu": {"N": 1, "H": 12, "W": 12},
         "conv_bias_maxpool": {"N": 1, "H": 12, "W": 12}}  # the interpreter's time; other examples at their defaults


def _f64(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, np.float64) for k, v in inputs.items()}


def _conv(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    """Cross-correlation over explicit sliding windows (torch conv2d, stride 1), zero padding `pad`."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(x, w.shape[2:], axis=(2, 3))
    return np.einsum("ncyxrs,kcrs->nkyx", win, w)


def _pool(x: np.ndarray, how) -> np.ndarray:
    n, k, h, w = x.shape
    return how(x[:, :, :h // 2 * 2, :w // 2 * 2].reshape(n, k, h // 2, 2, w // 2, 2), axis=(3, 5))


def _depthwise_same(a: np.ndarray, wd: np.ndarray) -> np.ndarray:
    p = np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(p, (3, 3), axis=(2, 3))
    return np.einsum("neyxrs,ers->neyx", win, wd)


def _layernorm(X, g, b):
    mu = X.mean(axis=1, keepdims=True)
    return (X - mu) / np.sqrt(((X - mu) ** 2).mean(axis=1, keepdims=True) + 1e-5) * g + b


def _softmax(X):
    e = np.exp(X - X.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


REFERENCE = {  # example -> (its output, NumPy of the float64 inputs)
    "avgpool": ("Y", lambda i: _pool(i["X"], np.mean)),
    "conv2d": ("Y", lambda i: _conv(i["X"], i["Wt"], 0)),
    "conv_bias_maxpool": ("Y", lambda i: _pool(_conv(i["X"], i["Wt"], 0) + i["b"][:, None, None], np.max)),
    "conv_relu": ("Y", lambda i: _pool(np.maximum(_conv(i["X"], i["Wt"], 0) + i["b"][:, None, None], 0), np.max)),
    "layernorm": ("Y", lambda i: _layernorm(i["X"], i["g"], i["b"])),
    "linear": ("Y", lambda i: np.maximum(i["X"] @ i["W"] + i["b"], 0)),
    "matmul": ("C", lambda i: i["A"] @ i["B"]),
    "mobilenet_block": ("Y", lambda i: i["X"] + np.einsum("neyx,ke->nkyx", np.clip(_depthwise_same(
        np.clip(np.einsum("ncyx,ec->neyx", i["X"], i["We"]), 0, 6), i["Wd"]), 0, 6), i["Wp"])),
    "resnet_block": ("Y", lambda i: np.maximum(i["X"] + i["b2"][:, None, None] + _conv(np.maximum(
        _conv(i["X"], i["W1"], 1) + i["b1"][:, None, None], 0), i["W2"], 1), 0)),
    "rmsnorm": ("Y", lambda i: i["X"] / np.sqrt((i["X"] ** 2).mean(axis=1, keepdims=True) + 1e-6) * i["g"]),
    "rowsum": ("s", lambda i: i["A"].sum(axis=1)),
    "softmax": ("Y", lambda i: _softmax(i["X"])),
    "transpose": ("Y", lambda i: i["X"].T),
    "vector_add": ("z", lambda i: i["x"] + i["y"]),
}


def test_every_example_has_a_reference() -> None:
    assert sorted(REFERENCE) == [p.stem for p in EXAMPLES]


@pytest.mark.parametrize("tl", EXAMPLES, ids=lambda p: p.stem)
def test_trn1_kernel_runs_under_trn1_rules_and_matches_numpy(tl: pathlib.Path) -> None:
    c = compile_file(str(tl), SMALL.get(tl.stem), target="trn1")
    assert c.result.target is hw.TRN1
    inputs = lang.random_inputs(c.program, seed=5)
    outs, trace = c.run_traced(**inputs)
    assert trace.target == "trn1"  # the interpreter ran it under trn1's rules
    name, ref = REFERENCE[tl.stem]
    want = ref(_f64(inputs))
    got = np.asarray(outs[name], np.float64)
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max()))
    assert np.abs(got - want).max() <= 1e-4 * scale, tl.stem


def test_no_builder_reads_a_fixed_generation() -> None:
    """The compiler plans for the target it compiles for: no module calls `target()` without a name (the default,
    trn2) or imports a generation's record (TRN1, TRN2); figures every generation shares go through `invariant`,
    the compiled-for target's through `compiled()`."""
    found = []
    for path in sorted((ROOT / "tilec" / "compiler").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "tilec.target":
                found += [f"{path.name}: imports {a.name}" for a in node.names if a.name in ("TRN1", "TRN2")]
            if isinstance(node, ast.Call) and not node.args and not node.keywords and \
                    isinstance(node.func, ast.Name) and node.func.id in ("target", "get_target"):
                found.append(f"{path.name}:{node.lineno}: {node.func.id}()")
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and \
                    isinstance(node.func, ast.Name) and node.func.id == "target_params":
                found.append(f"{path.name}:{node.lineno}: target_params({node.args[0].value!r})")
    assert found == []


def test_a_trn1_kernel_does_not_depend_on_what_was_compiled_before() -> None:
    """The depthwise taps' routes are memoised; the memo is per target, so a trn2 compilation earlier in the process
    leaves a trn1 kernel unchanged (the routes differ between the two: trn1's clocks and serialised engines)."""
    from tilec.compiler import depthwise_layout

    path = str(ROOT / "examples" / "mobilenet_block.tl")
    depthwise_layout._choose_routes.cache_clear()
    alone = compile_file(path, target="trn1").source
    depthwise_layout._choose_routes.cache_clear()
    compile_file(path, target="trn2")
    assert compile_file(path, target="trn1").source == alone
