"""Every example compiles to both forms (NKI 0.6, the default, and 0.1) from one scheduled IR; both run on the
interpreter and match the reference evaluator; the model gives both the same latency; the 0.6 form is plain NKI 0.6
(no neuronxcc anywhere, dst-first calls without dtype=, range loops, no PSUM zeroing), as generated/nki06 holds."""
from __future__ import annotations

import ast
import pathlib
import re

import numpy as np
import pytest

import tilec  # noqa: F401
from tilec.compiler import regen
from tilec.compiler.api import compile_file
from tilec.compiler.wrap import unwrap
from tilec.errors import TilecError
from tilec.lang import api as lang
from tilec.perf.api import estimate
from tilec.tune.evaluate import placeholder_inputs
from kernel_numbers import numbered

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.tl"))
SMALL = {"conv2d": {"N": 1, "H": 20, "W": 20}, "conv_relu": {"N": 1, "H": 20, "W": 20},
         "conv_bias_maxpool": {"N": 1, "H": 20, "W": 20}}  # numerics at the default sizes: see test_same_latency
BATCH_1 = {"conv2d": {"N": 1}, "conv_bias_maxpool": {"N": 1}}  # full-size images, one of the batch of 4


@pytest.mark.parametrize("tl", EXAMPLES, ids=lambda p: p.stem)
def test_both_forms_run_and_match_the_reference(tl):
    shapes = SMALL.get(tl.stem)
    outs = {}
    for nki in ("0.6", "0.1"):
        c = compile_file(str(tl), shapes, nki=nki)
        inputs = lang.random_inputs(c.program, seed=3)
        reference = lang.evaluate(c.program, inputs)
        outs[nki] = c.run(**inputs)
        for name, want in reference.items():
            got = np.asarray(outs[nki][name], np.float64)
            scale = max(1.0, float(np.abs(want).max()))
            assert np.abs(got - want).max() <= 1e-5 * scale, (nki, name)
    for name in outs["0.6"]:
        np.testing.assert_array_equal(outs["0.6"][name], outs["0.1"][name])  # one IR: same instructions, same bits


@pytest.mark.parametrize("tl", EXAMPLES, ids=lambda p: p.stem)
def test_same_model_latency_for_both_forms(tl):
    latency, instrs = {}, {}
    for nki in ("0.6", "0.1"):
        c = compile_file(str(tl), BATCH_1.get(tl.stem), nki=nki)
        _, trace = c.run_traced(numerics=False, **placeholder_inputs(c))
        latency[nki] = estimate(trace).total_us
        instrs[nki] = [(i.engine, i.op) for i in trace.instrs if i.op != "memset" or
                       not all(w.memory == "psum" for w in i.writes)]
    assert latency["0.6"] == latency["0.1"]
    assert instrs["0.6"] == instrs["0.1"]  # the 0.1 form's extra instructions are only its PSUM zeroing


@pytest.mark.parametrize("tl", EXAMPLES, ids=lambda p: p.stem)
def test_06_form_is_plain_nki_06(tl):
    text = (ROOT / "generated" / "nki06" / f"{tl.stem}.py").read_text()
    assert text == compile_file(str(tl)).source  # the default form, checked in
    assert "neuronxcc" not in text and "skip_middle_end" not in text
    tree = ast.parse(text)
    imports = sorted(ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)))
    assert imports == ["import nki", "import nki.isa as nisa", "import nki.language as nl"]
    [kernel] = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert [ast.unparse(d) for d in kernel.decorator_list] == ["nki.jit"]
    calls = [n for n in ast.walk(kernel) if isinstance(n, ast.Call)]
    for call in calls:
        name = ast.unparse(call.func)
        keys = [k.arg for k in call.keywords]
        if name.startswith("nisa."):
            assert "dtype" not in keys and "mask" not in keys and keys[:1] == ["dst"], ast.unparse(call)
        if name == "nisa.nc_matmul":
            assert "accumulate" in keys
        assert name not in ("nl.zeros", "nl.affine_range", "nl.sequential_range", "nl.static_range")
    loops = [ast.unparse(n.iter) for n in ast.walk(kernel) if isinstance(n, ast.For)]
    assert all(re.fullmatch(r"range\([\w ()*/+-]+\)", it) for it in loops), loops  # a count or constants' expression
    assert not any(isinstance(n, ast.AugAssign) for n in ast.walk(kernel))  # no `acc += nc_matmul(...)`
    assert "buffer=nl.shared_hbm" in text and "# tl:" in text


def test_generated_holds_both_forms_and_is_fresh():
    assert sorted(p.stem for p in (ROOT / "generated" / "nki06").glob("*.py")) == [p.stem for p in EXAMPLES]
    assert sorted(p.stem for p in (ROOT / "generated").glob("*.py")) == [p.stem for p in EXAMPLES]
    assert "import neuronxcc.nki as nki" in (ROOT / "generated" / "matmul.py").read_text()
    assert regen.stale() == []


def test_matmul_chain_flags_follow_the_contraction_loops():
    src = compile_file(str(ROOT / "examples" / "conv_bias_maxpool.tl"), {"N": 1, "H": 20, "W": 20}).source
    assert "accumulate=c_t > 0 or r > 0 or s > 0)" in src
    assert re.search(r"conv_acc = nl\.ndarray\(\(128, \d+, 18\), dtype=nl\.float32, buffer=nl\.psum\)", numbered(src))
    linear = compile_file(str(ROOT / "examples" / "linear.tl")).source
    assert "nisa.nc_matmul(dst=b_bcast, stationary=ones_f32, moving=b_row, accumulate=False)" in linear
    assert "nisa.memset(dst=ones_f32, value=0.0)" in linear  # an SBUF start value: 0.6's memset writes dst


def test_dma_transpose_schedule_in_both_forms():
    tl, shapes = str(ROOT / "examples" / "transpose.tl"), {"M": 256, "N": 384}
    latency = {}
    for nki in ("0.6", "0.1"):
        c = compile_file(tl, shapes, schedule="method Y, dma\n", nki=nki)
        inputs = lang.random_inputs(c.program, seed=1)
        outs, trace = c.run_traced(**inputs)
        np.testing.assert_array_equal(outs["Y"], lang.evaluate(c.program, inputs)["Y"])
        latency[nki] = estimate(trace).total_us
    assert latency["0.6"] == latency["0.1"]
    src06 = compile_file(tl, shapes, schedule="method Y, dma\n").source
    assert "nisa.dma_transpose(dst=Y_strip[:, bj2, ai * TILE:ai * TILE + TILE], src=X[" in unwrap(src06)


def test_unknown_nki_version_is_a_user_error():
    with pytest.raises(TilecError, match="unknown NKI version '0.3'"):
        compile_file(str(EXAMPLES[0]), nki="0.3")


def test_cli_compile_defaults_to_06_and_offers_01(capsys):
    from tilec_cli import main

    assert main(["compile", str(ROOT / "examples" / "vector_add.tl")]) == 0
    assert "import nki\n" in capsys.readouterr().out
    assert main(["compile", str(ROOT / "examples" / "vector_add.tl"), "--nki", "0.1"]) == 0
    assert "import neuronxcc.nki as nki" in capsys.readouterr().out


def test_cli_run_and_profile_take_nki(capsys, tmp_path):
    from tilec_cli import main

    for nki in ("0.6", "0.1"):
        assert main(["run", str(ROOT / "examples" / "matmul.tl"), "--nki", nki]) == 0
        assert "max abs error vs reference" in capsys.readouterr().out
    html = tmp_path / "t.html"
    totals = []
    for nki in ("0.6", "0.1"):
        assert main(["profile", str(ROOT / "examples" / "rowsum.tl"), "--nki", nki, "--html", str(html)]) == 0
        totals.append([line for line in capsys.readouterr().out.splitlines() if "total_time" in line])
    assert totals[0] == totals[1] and totals[0]


@pytest.mark.parametrize("stem,shapes", [("conv_bias_maxpool", {"N": 1, "H": 20, "W": 20}),
                                         ("transpose", {"M": 256, "N": 256}), ("linear", None)])
def test_same_latency_across_the_tuners_schedule_space(stem, shapes):
    """Not only the default schedules: legal points of the tuner's space give the same latency in both forms."""
    import random

    from tilec.tune.evaluate import Job, model_outcome
    from tilec.tune.knobs import build_space

    space = build_space(Job.of(str(ROOT / "examples" / f"{stem}.tl"), shapes))
    rng = random.Random(4)
    points = [space.default_point(), *space.experts, *(space.random_point(rng) for _ in range(30))]
    schedules = list(dict.fromkeys(space.render(p) for p in points if space.check(p) is None))[:6]
    assert len(schedules) >= 2
    for schedule in schedules:
        got = {nki: model_outcome(Job.of(str(ROOT / "examples" / f"{stem}.tl"), shapes, nki=nki), schedule)
               for nki in ("0.6", "0.1")}
        assert got["0.6"].ok and got["0.6"].us == got["0.1"].us, (schedule, got)
