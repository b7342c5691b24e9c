"""The documentation's snippets are tested: every ```tl block is a whole program that checks, compiles and runs on
the NKI interpreter at its `default` sizes, matching the reference evaluator (or, if its first line is
`# expect error: TEXT`, fails with a TilecError containing TEXT); every ```python block runs (from the repository
root, in page order, sharing a temporary folder; ```python requires-torch blocks skip without torch);
docs/directives.md shows every directive the compiler knows."""
from __future__ import annotations

import pathlib
import re

import pytest

from tilec.errors import TilecError
from tilec.tolerance import mismatches

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.M | re.S)


def blocks(kind: str) -> list:
    out = []
    for page in DOCS:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) == kind:
                line = text[:m.start()].count("\n") + 2
                marks = [pytest.mark.torch] if "requires-torch" in m.group(2) else []
                out.append(pytest.param(m.group(3), id=f"{page.name}:{line}", marks=marks))
    return out


@pytest.mark.parametrize("source", blocks("tl"))
def test_tl_snippet(source: str) -> None:
    from tilec.compiler.api import compile_loaded
    from tilec.lang import api as lang

    expect = re.match(r"# expect error: (.*)\n", source)
    if expect:
        with pytest.raises(TilecError) as err:
            compile_loaded(lang.check_file(source))
        assert expect.group(1) in err.value.render()
        return
    program = lang.check_file(source)
    compiled = compile_loaded(program)
    inputs = lang.random_inputs(program, seed=1)
    want = lang.evaluate(program, inputs)
    got = compiled.run(**inputs)
    assert mismatches(program, got, want, inputs) == []  # the project's one tolerance (tilec/tolerance.py)


@pytest.mark.parametrize("source", blocks("python"))
def test_python_snippet(source: str, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory,
                        request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("torch"):
        pytest.importorskip("torch")
    # the snippets of one page share a folder, like the commands of one session
    tmp_path = tmp_path_factory.getbasetemp() / "docs-snippets"
    tmp_path.mkdir(exist_ok=True)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("TILEC_TEST_TMP", str(tmp_path))
    exec(compile(source, "<docs snippet>", "exec"), {"__name__": "__docs__"})


def test_every_directive_is_documented() -> None:
    from tilec.compiler.directives import APPLY

    text = (ROOT / "docs" / "directives.md").read_text()
    missing = [name for name in APPLY if f"### `{name}" not in text]
    assert not missing, f"docs/directives.md does not document {missing}"


def test_every_page_is_linked_from_the_index() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    assert all(page.name in index for page in DOCS if page.name != "README.md")
