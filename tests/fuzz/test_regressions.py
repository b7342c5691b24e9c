"""Every reproducer the fuzzer ever found (tests/fuzz/regressions/*.tl) asserts its correct outcome, written on its
first line `# expect: match` (the kernel matches the reference evaluator) or `# expect: reject` (a clean TilecError
with file:line:col: a program the compiler does not support), run with the inputs of its `# seed: N` line (the
fuzzer's pair seed; 0 without one), compiled for the generation of its `# target:` line (trn2 without one). Reproducers whose fix is still open are xfail
(strict: the test fails as soon as they pass, so the marker is removed with the fix)."""
from __future__ import annotations

import pathlib
import random
import subprocess
import sys
import warnings

import pytest

from tilec.testing.fuzz import input_seed, input_target
from tilec.testing.oracle import check

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parents[1]
FILES = sorted((HERE / "regressions").glob("*.tl"))
# reproducer -> the bug still open (strict xfail: the reproducer runs, and its passing fails the test)
OPEN: dict[str, str] = {}
TUNE = ("18_", "30_", "m13", "m14", "l41")


def expectation(path: pathlib.Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name}: the first line must say `# expect: match|reject`"
    return first.split()[2]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_reproducer_has_its_correct_outcome(path, request):
    if path.name in OPEN:
        request.applymarker(pytest.mark.xfail(reason=OPEN[path.name], strict=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = path.read_text()
        verdict, _ = check(text, None, seed=input_seed(text), target=input_target(text))
    want = {"match": "ok", "reject": "rejected"}[expectation(path)]
    assert verdict.cls == want, verdict.line()


@pytest.mark.parametrize("path", [p for p in FILES if p.name.startswith(TUNE)], ids=lambda p: p.name)
def test_tuner_space_of_reproducer_builds_and_its_points_compile_or_reject_cleanly(path, tmp_path):
    from tilec.compiler.api import compile_file
    from tilec.errors import TilecError
    from tilec.tune.evaluate import Job
    from tilec.tune.knobs import build_space

    program = tmp_path / path.name
    program.write_text(path.read_text())
    space = build_space(Job.of(str(program), None))
    rng = random.Random(0)
    points = [space.default_point()] + [space.random_point(rng) for _ in range(20)]
    for point in points:
        space.check(point)  # the static checks run on any point of the space without raising
    for point in points[:4]:
        try:
            compile_file(str(program), None, space.render(point))
        except TilecError as err:
            assert err.span is not None, err.render()
    from tilec.tune.api import tune

    result = tune(str(program), budget=4, jobs=1, progress=False, use_cache=False)
    assert result.verified, result


HOSTILE = ("self", "name", "numerics", "nl", "nki", "np", "__import__", "__class__", "ядро", "ﬁ", "x²", "a½")


@pytest.mark.parametrize("ident", HOSTILE)
def test_hostile_identifier_works_through_the_cli_and_the_api(ident, tmp_path):
    other = "fi" if ident == "ﬁ" else "x2" if ident == "x²" else "b"  # the name Python would fold it into
    text = (f"kernel {ident}({ident}: f32[N], {other}: f32[N]) -> Y\n  default N = 130\n  Y: f32[N]\n"
            f"  for i in 0..N:\n    Y[i] = {ident}[i] * 2.0 + {other}[i]\n")
    path = tmp_path / "k.tl"
    path.write_text(text)
    run = subprocess.run([sys.executable, str(ROOT / "tilec_cli.py"), "run", str(path)], capture_output=True,
                         text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "max abs error vs reference 0" in run.stdout
    import numpy as np

    import tilec

    compiled = tilec.compile_file(str(path))
    x, b = np.arange(130, dtype=np.float32), np.ones(130, np.float32)
    out = compiled.run(**{ident: x, other: b})
    np.testing.assert_array_equal(out["Y"], x * 2 + 1)
    out, _ = compiled.run_traced(**{ident: x, other: b})
    np.testing.assert_array_equal(out["Y"], x * 2 + 1)
