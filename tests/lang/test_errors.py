"""Every kind of user mistake gives a TilecError with file:line:col, the source line, a caret and a hint; the
messages are compared with golden files (tests/golden/lang/errors/, refreshed with `pytest --update-golden`), and
the CLI prints them without a traceback and exits 1."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tilec.errors import TilecError
from tilec.lang import api
from tilec_cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]

CONV = """\
kernel conv(X: f32[N, C, H, W], Wt: f32[K, C, R, R], b: f32[K]) -> Y
  let Ho = H - R + 1, Wo = W - R + 1
  conv: f32[N, K, Ho, Wo]
  Y: f32[N, K, Ho / 2, Wo / 2]
  for n in 0..N, k in 0..K, y in 0..Ho, x in 0..Wo:
    conv[n, k, y, x] = b[k]
    for c in 0..C, r in 0..R, s in 0..R:
      conv[n, k, y, x] += X[n, c, y + r, x + s] * Wt[k, c, r, s]
  for n in 0..N, k in 0..K, i in 0..Ho / 2, j in 0..Wo / 2:
    Y[n, k, i, j] = -inf
    for p in 0..2, q in 0..2:
      Y[n, k, i, j] max= conv[n, k, 2*i + p, 2*j + q]
"""

ADD = """\
kernel add(A: f32[N], B: f32[N]) -> Z
  Z: f32[N]
  for i in 0..N:
    Z[i] = A[i] + B[i]
"""


def edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# name -> (program, -D sizes)
BAD: dict[str, tuple[str, dict[str, int]]] = {
    # syntax
    "syntax_missing_colon": (edit(ADD, "0..N:", "0..N"), {}),
    "syntax_bad_character": (edit(ADD, "A[i] + B[i]", "A[i] ^ B[i]"), {}),
    "syntax_bad_dedent": (edit(ADD, "    Z[i] = A[i] + B[i]\n", "      Z[i] = A[i]\n     Z[i] = B[i]\n"), {}),
    "syntax_unexpected_indent": (edit(ADD, "  for i", "    for i"), {}),
    "syntax_unclosed_bracket": (edit(ADD, "B[i]\n", "B[i\n"), {}),
    "syntax_missing_outputs": (edit(ADD, " -> Z", ""), {}),
    "syntax_missing_assign_op": (edit(ADD, "Z[i] = A[i]", "Z[i] A[i]"), {}),
    "syntax_bad_dtype": (edit(ADD, "B: f32[N]", "B: f64[N]"), {}),
    "syntax_empty_body": ("kernel k(A: f32[N]) -> Z\n", {}),
    # names and declarations
    "unknown_tensor": (edit(ADD, "B[i]\n", "Bb[i]\n"), {}),
    "unknown_size": (edit(ADD, "Z: f32[N]", "Z: f32[M]"), {}),
    "unknown_name_in_value": (edit(ADD, "A[i] + B[i]", "A[i] + q"), {}),
    "unknown_name_in_index": (edit(ADD, "A[i] +", "A[j] +"), {}),
    "unknown_function": (edit(ADD, "A[i] + B[i]", "expp(A[i])"), {}),
    "call_arity": (edit(ADD, "A[i] + B[i]", "max(A[i])"), {}),
    "duplicate_parameter": (edit(ADD, "B: f32[N]", "A: f32[N]"), {}),
    "decl_shadows_parameter": (edit(ADD, "  Z: f32[N]", "  Z: f32[N]\n  A: f32[N]"), {}),
    "loop_var_shadows_size": (edit(ADD, "for i in 0..N:", "for N in 0..N:"), {}),
    "nested_loop_var_reused": (edit(CONV, "s in 0..R", "n in 0..R"), {}),
    "tensor_without_indices": (edit(ADD, "A[i] + B[i]", "A + B[i]"), {}),
    "output_not_declared": (edit(ADD, "  Z: f32[N]\n", ""), {}),
    "output_is_parameter": (edit(ADD, "-> Z", "-> Z, A"), {}),
    "default_for_let": (edit(CONV, "  let Ho", "  default Ho = 3\n  let Ho"), {}),
    "let_before_use": (edit(CONV, "let Ho = H - R + 1, Wo = W - R + 1", "let Ho = Wo - R + 1, Wo = W - R + 1"), {}),
    # indices
    "wrong_arity": (edit(CONV, "b[k]", "b[k, 0]"), {}),
    "non_affine_product": (edit(CONV, "Wt[k, c, r, s]", "Wt[k, c, r*s, s]"), {}),
    "non_affine_indirect": (edit(ADD, "A[i] + B[i]", "A[i] + B[A[i]]"), {}),
    "non_affine_division": (edit(CONV, "conv[n, k, 2*i + p, 2*j + q]", "conv[n, k, i / p, j]"), {}),
    "index_divided_by_size": (edit(CONV, "conv[n, k, 2*i + p, 2*j + q]", "conv[n, k, (2*i + p) / R, j]"), {}),
    "quasi_affine_store": (edit(CONV, "Y[n, k, i, j] = -inf", "Y[n, k, i, j / 2] = -inf"), {}),
    "quasi_affine_out_of_bounds": (edit(CONV, "conv[n, k, 2*i + p, 2*j + q]", "conv[n, k, 2*i + p, (2*j + q) % 9 + 1]"),
                                   dict(N=1, C=2, H=8, W=8, K=2, R=3)),
    # padded reads
    "padded_read_operand": (edit(ADD, "A[i] + B[i]", "A[i - 1] ?? 0 + B[i]"), {}),
    "padded_read_operand_before": (edit(ADD, "A[i] + B[i]", "B[i] + A[i - 1] ?? 0"), {}),
    "padded_read_without_constant": (edit(ADD, "A[i] + B[i]", "A[i - 1] ?? B[i]"), {}),
    "padded_read_never_touches": (edit(ADD, "A[i] + B[i]", "(A[i + N] ?? 0) + B[i]"), dict(N=8)),
    "padded_read_too_wide": (edit(ADD, "A[i] + B[i]", "(A[3*i - 2] ?? 0) + B[i]"), dict(N=8)),
    "padded_store": (edit(ADD, "Z[i] = A[i]", "Z[i] ?? 0 = A[i]"), {}),
    "loop_bound_uses_loop_var": (edit(CONV, "for p in 0..2", "for p in 0..i"), {}),
    # types and data flow
    "write_to_input": (edit(ADD, "Z[i] = A[i]", "A[i] = A[i]"), {}),
    "read_unwritten_temp": (edit(CONV, "    conv[n, k, y, x] = b[k]\n", "")
                            .replace("+= X[n, c, y + r, x + s]", "= X[n, c, y + r, x + s]")
                            .replace("conv[n, k, y, x] = X", "Y[n, k, 0, 0] = conv[n, k, y, x] * X"), {}),
    "accumulate_before_init": (edit(CONV, "    conv[n, k, y, x] = b[k]\n", ""), {}),
    "output_never_written": (edit(CONV, "-> Y", "-> Y, Z").replace("  Y: f32", "  Z: f32[N]\n  Y: f32"), {}),
    "modulo_on_values": (edit(ADD, "A[i] + B[i]", "A[i] % B[i]"), {}),
    # sizes and bounds
    "out_of_bounds_symbolic": (edit(ADD, "B[i]\n", "B[i + 1]\n"), {}),
    "out_of_bounds_negative": (edit(ADD, "B[i]\n", "B[i - 1]\n"), {}),
    "out_of_bounds_concrete": (edit(CONV, "X[n, c, y + r, x + s]", "X[n, c, y + r, x + s + 1]"),
                               dict(N=1, C=2, H=8, W=8, K=2, R=3)),
    "floor_shape_too_small": (CONV, dict(N=1, C=2, H=3, W=8, K=2, R=3)),
    "size_divided_by_size": (edit(CONV, "Ho / 2, Wo / 2]", "Ho / R, Wo / 2]"), {}),
    "assumption_fails": (edit(CONV, "  let Ho", "  assume C % 128 == 0\n  let Ho"), dict(N=1, C=3, H=8, W=8, K=2, R=3)),
    "nonpositive_dimension": (CONV, dict(N=1, C=2, H=2, W=8, K=2, R=3)),
    "define_unknown_size": (ADD, dict(M=3)),
    "define_let": (CONV, dict(Ho=3)),
    "define_not_positive": (ADD, dict(N=0)),
    # schedules
    "schedule_bad_argument": (ADD + "  schedule:\n    split Z.i, 2 4\n", {}),
    "schedule_missing_argument": (ADD + "  schedule:\n    split Z.i,\n", {}),
    "schedule_first": (edit(ADD, "  Z: f32[N]\n", "  schedule:\n    place Z, sbuf\n  Z: f32[N]\n"), {}),
    "schedule_not_last": (edit(ADD, "  for i", "  schedule:\n    place Z, sbuf\n  for i"), {}),
}


@pytest.fixture
def in_tmp(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_enough_distinct_mistakes() -> None:
    assert len(BAD) >= 25
    assert len({text + repr(sorted(d.items())) for text, d in BAD.values()}) == len(BAD)


@pytest.mark.parametrize("name", sorted(BAD))
def test_error_message(name: str, in_tmp: pathlib.Path, golden) -> None:
    text, defines = BAD[name]
    (in_tmp / f"{name}.tl").write_text(text)
    with pytest.raises(TilecError) as info:
        api.load(f"{name}.tl", defines)
    rendered = info.value.render()
    assert info.value.hint, "every error says what to do"
    golden.check(f"lang/errors/{name}.txt", rendered + "\n")


@pytest.mark.parametrize("name", sorted(BAD))
def test_cli_exits_1_without_traceback(name: str, in_tmp: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    text, defines = BAD[name]
    (in_tmp / f"{name}.tl").write_text(text)
    flags = [f"-D{k}={v}" for k, v in defines.items()]
    assert main(["check", f"{name}.tl", *flags]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error:" in err and "hint:" in err


def test_cli_subprocess_no_traceback(in_tmp: pathlib.Path) -> None:
    """The real entry point, in a fresh interpreter: a bad program, a bad -D, a missing file."""
    (in_tmp / "bad.tl").write_text(BAD["non_affine_product"][0])
    (in_tmp / "add.tl").write_text(ADD)
    (in_tmp / "syntax.tl").write_text(BAD["syntax_missing_colon"][0])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv in (["check", "bad.tl"], ["run", "add.tl", "-D", "N"], ["run", "missing.tl"], ["fmt", "syntax.tl"]):
        proc = subprocess.run([sys.executable, str(ROOT / "tilec_cli.py"), *argv], capture_output=True, text=True,
                              env=env, cwd=in_tmp)
        assert proc.returncode == 1, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr and "error" in proc.stderr, (argv, proc.stderr)


def test_bad_define_option(golden) -> None:
    from tilec_cli import parse_defines

    with pytest.raises(TilecError) as info:
        parse_defines(["C=two"])
    golden.check("lang/errors/bad_define_option.txt", info.value.render() + "\n")


def test_schedule_file_error(golden) -> None:
    with pytest.raises(TilecError) as info:
        api.parse_schedule("split conv.y, 2\ncompute_at conv Y.j\n", "conv.sched")
    golden.check("lang/errors/schedule_file.txt", info.value.render() + "\n")


def test_parse_schedule_file() -> None:
    from tilec.lang import syntax as s

    got = api.parse_schedule("# tiles\nsplit conv.y, 2\n\ntile conv.k, factor=128\nbuffers X, -1\n")
    assert got == (s.Directive("split", (s.Ref(("conv", "y")), 2)),
                   s.Directive("tile", (s.Ref(("conv", "k")), s.KeyArg("factor", 128))),
                   s.Directive("buffers", (s.Ref(("X",)), -1)))


def _add_program() -> api.Program:
    return api.load(ADD)


def test_input_errors(golden) -> None:
    prog = _add_program()
    cases = {
        "input_missing": {"A": np.zeros(3, np.float32)},
        "input_unknown": {"A": np.zeros(3), "B": np.zeros(3), "C": np.zeros(3)},
        "input_rank": {"A": np.zeros((3, 1)), "B": np.zeros(3)},
        "input_sizes_disagree": {"A": np.zeros(3), "B": np.zeros(4)},
    }
    out = []
    for name, inputs in cases.items():
        with pytest.raises(TilecError) as info:
            api.evaluate(prog, inputs)
        out.append(f"== {name}\n{info.value.render()}\n")
    golden.check("lang/errors/inputs.txt", "".join(out))


def test_unknown_sizes_reported() -> None:
    prog = _add_program()
    assert prog.sizes == {} and prog.tensors["Z"].shape is None
    with pytest.raises(TilecError, match="size N of kernel `add` unknown"):
        api.random_inputs(prog)


def test_bounds_proven_from_assumptions() -> None:
    """`assume M >= N` proves X[i] in bounds for every size; without it the access waits for concrete sizes."""
    from tilec.lang import bounds, checker

    text = "kernel k(X: f32[M], B: f32[N]) -> Y\n  assume M >= N\n  Y: f32[N]\n  for i in 0..N:\n    Y[i] = X[i]\n"
    assert bounds.prove(checker.check(api.parse(text))).sites == ()
    unproven = bounds.prove(checker.check(api.parse(text.replace("  assume M >= N\n", ""))))
    assert [(site.access.tensor, dim) for site, dim in unproven.sites] == [("X", 0)]
    with pytest.raises(TilecError, match="assumption `M >= N` does not hold for M = 3, N = 4"):
        api.load(text, {"M": 3, "N": 4})
    with pytest.raises(TilecError, match="dimension 1 of `X` has size 3, but `i` reaches 3"):
        api.load(text.replace("  assume M >= N\n", ""), {"M": 3, "N": 4})


def test_conv_accesses_proven_symbolically() -> None:
    from tilec.lang import bounds, checker

    text = (ROOT / "examples" / "conv_bias_maxpool.tl").read_text()
    pending = bounds.prove(checker.check(api.parse(text)))
    from tilec.lang.fmt import expr

    assert pending.sites == ()  # every index of the conv and the pool is in bounds for all sizes
    assert sorted({expr(d) for d in pending.divisions}) == ["Ho / 2", "Wo / 2"]  # parity needs concrete sizes


def test_division_proven_by_assumption() -> None:
    """avgpool's `assume H % 2 == 0` proves `H / 2` exact for all sizes; without it, sizes must be known."""
    from tilec.lang import bounds, checker

    text = (ROOT / "examples" / "avgpool.tl").read_text()
    assert bounds.prove(checker.check(api.parse(text))).divisions == ()
    weaker = text.replace("assume H % 2 == 0, W % 2 == 0", "assume W % 2 == 0")
    assert len(bounds.prove(checker.check(api.parse(weaker))).divisions) == 2  # H / 2 in the shape and the loop


# Found only with every size known, by `check_file` (`tilec check`) and the evaluator, not by `load`
PARTLY_WRITTEN = {
    "output_partly_written": (edit(ADD, "for i in 0..N:", "for i in 0..N - 1:"), dict(N=8)),
    "output_pool_misses_a_column": (edit(CONV, "j in 0..Wo / 2:", "j in 0..Wo / 2 - 1:"),
                                    dict(N=1, C=2, H=8, W=8, K=2, R=3)),
    # a recurrence: the evaluator runs it iteration by iteration, the coverage check all at once
    "output_recurrence_misses_one": ("kernel cs(A: f32[N]) -> Z\n  Z: f32[N]\n  Z[0] = A[0]\n"
                                     "  for i in 1..N - 1:\n    Z[i] = Z[i - 1] + A[i]\n", dict(N=6)),
}


@pytest.mark.parametrize("name", sorted(PARTLY_WRITTEN))
def test_partly_written_output(name: str, in_tmp: pathlib.Path, golden, capsys: pytest.CaptureFixture) -> None:
    text, defines = PARTLY_WRITTEN[name]
    (in_tmp / f"{name}.tl").write_text(text)
    api.load(f"{name}.tl", defines)  # legal as far as names, types and bounds go
    with pytest.raises(TilecError) as info:
        api.check_file(f"{name}.tl", defines)
    golden.check(f"lang/errors/{name}.txt", info.value.render() + "\n")
    program = api.load(f"{name}.tl", defines)
    with pytest.raises(TilecError) as again:
        api.evaluate(program, api.random_inputs(program))
    assert again.value.render() == info.value.render()  # the evaluator says the same
    assert main(["check", f"{name}.tl", *[f"-D{k}={v}" for k, v in defines.items()]]) == 1
    assert "Traceback" not in capsys.readouterr().err
